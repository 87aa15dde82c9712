"""Typed records: every object in the campaign folder other than a shard, with one writer and one reader each.

```
record              path (storage/layout)                          written by
CampaignManifest    campaign.json                                   campaign.init_campaign, demo, fork
DatasetSuccess      dataset/_SUCCESS                                dataset.prep
ConsumptionLog      train/consumed/<step:08d>.json                  train.trainer (the write-ahead log)
CheckpointMeta      train/checkpoints/<step:08d>[.n]/meta.json      train.checkpoint.save_checkpoint
Publication         weights/v<N:08d>/PUBLISHED.json, and each       publish.publish_weights
                    entry of the weights/LATEST pointer
EvalResult          eval/v<N:08d>.json                              evaluate.evaluate
DoneMarker          train/DONE.json                                 train.trainer
StopRequest         rollout/STOP-<utc>.json                         rollout.collect.request_stop
RunRecord           runs/<key>-<flow_run_id>[-failed-<n>].json      tasks.common.stage_run
AuditRecord         audit/<utc>.json (+ .txt)                       tasks.audit (an ``audit.AuditReport``)
AuditVersionResult  audit/versions/v<N>-<digest>-<newest>.json      audit.campaign (one version folder's result)
```

Each record is a frozen dataclass. Its path comes from ``layout`` in one place: ``PATH`` for an object the
folder holds once, ``path_of(*key)`` for one of many, named by its ``KEY`` fields (a consumption log by ``step``,
an eval result or a publication by ``version``). ``write(store)`` is its only way into the folder (create-only,
so a second writer of the same object gets ``AlreadyExistsError``); ``read(store, *key)`` (or ``at(store, path)``
for a listed path) is the only way out, ``exists(store, *key)`` its done check, and
``from_json`` checks every field's type and the record version, naming the object and the bad field on error
(``RecordError``). Each JSON object carries ``record_version``; a reader refuses versions it does not know.
Listing helpers (``consumption_steps``, ``published_versions``, ``evaluated_versions``, ``run_records``) parse
names through ``layout``, so no other module knows how the folder spells a step or a version.
``with_parents`` opens a fork (``campaign.json`` names a ``parent``) over its parents' history.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self, get_type_hints

from pipelines_lib.storage import layout
from pipelines_lib.storage.forked import ForkStore
from pipelines_lib.storage.store import Store
from pipelines_lib.storage.tailer import GroupSlice, TailCursor, TailEvent
from pipelines_lib.trajectory.record import utc_now_iso


class RecordError(ValueError):
    """A campaign object that does not parse as the record it should be."""


RECORD_VERSION_KEY = "record_version"


def _check(value: Any, tp: Any, where: str) -> Any:
    """``value`` checked against annotation ``tp`` (nested records are built); raises ``RecordError``."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (types.UnionType, typing.Union):
        errors = []
        for option in typing.get_args(tp):
            try:
                return _check(value, option, where)
            except RecordError as e:
                errors.append(str(e))
        raise RecordError(errors[-1])
    if tp is type(None):
        if value is not None:
            raise RecordError(f"{where}: expected null, got {value!r}")
        return None
    if isinstance(tp, type) and issubclass(tp, _Record):
        return tp._from_mapping(value, where)
    if origin is list or origin is tuple:
        if not isinstance(value, list):
            raise RecordError(f"{where}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(tp)[:1]
        return [_check(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise RecordError(f"{where}: expected an object, got {type(value).__name__}")
        _, item = typing.get_args(tp)
        return {k: _check(v, item, f"{where}.{k}") for k, v in value.items()}
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RecordError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is int and isinstance(value, bool) or not isinstance(value, tp):
        raise RecordError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value


def _to_plain(value: Any) -> Any:
    if isinstance(value, _Record):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [_to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    return value


@dataclass(frozen=True, kw_only=True)
class _Record:
    """Fields → JSON and back, with checking. Nested parts (groups of a log) are ``_Record`` too."""

    @classmethod
    def _from_mapping(cls, raw: Any, where: str) -> Self:
        if not isinstance(raw, Mapping):
            raise RecordError(f"{where}: expected a JSON object for a {cls.__name__}, got {type(raw).__name__}")
        hints = get_type_hints(cls)
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name not in raw:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise RecordError(f"{where}: {cls.__name__} has no field {f.name!r}")
                continue
            kwargs[f.name] = _check(raw[f.name], hints[f.name], f"{where}: {cls.__name__}.{f.name}")
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)


@dataclass(frozen=True, kw_only=True)
class Record(_Record):
    """A whole campaign object: versioned, with one path."""

    VERSION: ClassVar[int] = 1
    """The version this code writes."""
    OLDER_VERSIONS: ClassVar[tuple[int, ...]] = ()
    """Earlier versions it still reads: their fields are a subset of this version's (the rest take defaults)."""

    @classmethod
    def from_json(cls, raw: Any, *, where: str) -> Self:
        """The record in parsed JSON ``raw`` read from ``where`` (a URL, for the error message)."""
        if not isinstance(raw, Mapping):
            raise RecordError(f"{where}: expected a JSON object for a {cls.__name__}, got {type(raw).__name__}")
        version = raw.get(RECORD_VERSION_KEY)
        if isinstance(version, bool) or version not in (cls.VERSION, *cls.OLDER_VERSIONS):
            supported = " or ".join(str(v) for v in (*cls.OLDER_VERSIONS, cls.VERSION))
            raise RecordError(f"{where}: {cls.__name__} {RECORD_VERSION_KEY} {version!r} is not the supported "
                              f"{supported}")
        return cls._from_mapping({k: v for k, v in raw.items() if k != RECORD_VERSION_KEY}, where)

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str) -> Self:
        """The record in an object's raw bytes (for readers that fetch many objects at once, like the audit)."""
        try:
            raw = json.loads(data)
        except ValueError as e:
            raise RecordError(f"{where}: not valid JSON for a {cls.__name__}: {e}") from None
        return cls.from_json(raw, where=where)

    def to_json(self) -> dict[str, Any]:
        return {RECORD_VERSION_KEY: self.VERSION, **self.to_dict()}

    PATH: ClassVar[str | None] = None
    """The path of a record the folder holds once; one of which it holds many names its path by ``KEY``."""
    KEY: ClassVar[tuple[str, ...]] = ()
    """The fields that name one object among many (``("step",)``), in the order ``path_of`` takes them."""

    @classmethod
    def path_of(cls, *key: Any) -> str:
        """Where the object named by ``key`` (values of the ``KEY`` fields) lives; a keyed record overrides this
        with its ``layout`` function."""
        if cls.PATH is None or key:
            raise TypeError(f"{cls.__name__}.path_of takes {cls.KEY or 'no key'}, got {key!r}")
        return cls.PATH

    def write(self, store: Store) -> str:
        """Create the object at its path (create-only: a second writer gets ``AlreadyExistsError``); returns it."""
        rel = self.path_of(*(getattr(self, name) for name in self.KEY))
        self._create(store, rel)
        return rel

    @classmethod
    def read(cls, store: Store, *key: Any) -> Self:
        return cls.at(store, cls.path_of(*key))

    @classmethod
    def exists(cls, store: Store, *key: Any) -> bool:
        return store.exists(cls.path_of(*key))

    @classmethod
    def at(cls, store: Store, rel: str) -> Self:
        """The record at ``rel``: a path its writer returned or a listing found (audits, run records)."""
        return cls.from_json(store.read_json(rel), where=store.uri(rel))

    def _create(self, store: Store, rel: str) -> None:
        store.create_json(rel, self.to_json())


# -- campaign.json ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ForkParent(_Record):
    """Where a forked campaign came from: the parent's URL, the step whose state it starts from, and the
    settings it changed. The fork references the parent's history up to there (``with_parents``), never copies it."""

    url: str
    step: int
    version: int
    """The parent's policy version after ``step``: the fork's rollout workers start on it."""
    config_diff: dict[str, Any]
    """Dotted config key → ``{"parent": value, "fork": value}`` for every setting the fork changed."""


@dataclass(frozen=True, kw_only=True)
class CampaignManifest(Record):
    """The campaign's config snapshot, written once when it starts."""

    kind: str = "campaign"
    """``campaign`` (a ``CampaignConfig`` in ``config``) or ``demo`` (the synthetic demo's parameters)."""
    schema_version: str
    code_version: str
    created_at: str
    config: dict[str, Any]
    parent: ForkParent | None = None
    """Set for a fork (``stages.fork``); absent in campaigns started from scratch and in older manifests."""

    PATH: ClassVar[str] = layout.CAMPAIGN_JSON


def fork_chain(store: Store) -> list[tuple[Store, ForkParent]]:
    """A fork's ancestry: ``(campaign, its parent entry)`` from ``store`` up to the first campaign that is no
    fork, nearest first (empty for a campaign that is no fork, or a folder without ``campaign.json``).
    A chain that comes back to a campaign already in it is an error naming the loop."""
    chain: list[tuple[Store, ForkParent]] = []
    seen = [store.uri()]
    while store.exists(CampaignManifest.PATH) and (parent := CampaignManifest.read(store).parent) is not None:
        chain.append((store, parent))
        store = store.other(parent.url)
        if store.uri() in seen:
            raise ValueError(f"{seen[0]}: its fork ancestry loops: {' -> '.join([*seen, store.uri()])}")
        seen.append(store.uri())
    return chain


def with_parents(store: Store) -> Store:
    """The campaign at ``store`` as its stages see it: ``store`` itself, or for a fork a ``ForkStore`` that also
    reads its parent's history up to the fork point (``layout.inherited``), the parent's view being built the
    same way. Only the fork's own folder is ever written through it. Idempotent."""
    if isinstance(store, ForkStore):
        return store
    chain = fork_chain(store)
    if not chain:
        return store
    view = chain[-1][0].other(chain[-1][1].url)
    for fork, parent in reversed(chain):
        view = ForkStore(fork, below=view, inherits=functools.partial(layout.inherited, step=parent.step,
                                                                      version=parent.version))
    return view


# -- dataset/_SUCCESS ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SplitInfo(_Record):
    path: str
    rows: int
    sha256: str


@dataclass(frozen=True, kw_only=True)
class DatasetSuccess(Record):
    """The prep stage's marker: which splits it wrote, their sizes and hashes, and rows it refused."""

    source: str
    seed: int
    splits: dict[str, SplitInfo]
    bad_rows: list[str]

    PATH: ClassVar[str] = layout.DATASET_SUCCESS


# -- train/consumed/<step>.json ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ConsumedGroup(_Record):
    """One whole group a step trained on: rows ``[row_start, row_end)`` of ``shard``."""

    group_id: str
    shard: str
    row_start: int
    row_end: int
    version: int
    """The shard's policy version."""
    staleness: int
    """Trainer version at the step minus ``version`` (ARCHITECTURE §6)."""


@dataclass(frozen=True, kw_only=True)
class DroppedStale(_Record):
    """Groups of ``shard`` the window moved past before they were handed out."""

    shard: str
    groups: list[str]
    reason: str
    unread_groups: int = 0
    """Every group of a shard the tailer never opened, counted from its name (``groups`` is then empty)."""


@dataclass(frozen=True, kw_only=True)
class SkippedShard(_Record):
    """A shard, or some of its groups, the tailer could not use (unreadable, foreign, invalid, not trainable)."""

    shard: str
    reason: str
    groups: list[str] = field(default_factory=list)
    """The groups left out, when the shard was readable enough to name them."""


@dataclass(frozen=True, kw_only=True)
class ZeroAdvantageGroup(_Record):
    """A group whose rewards were all equal: no gradient, so not trained on (``train.advantages``)."""

    group_id: str
    shard: str
    reward: float


@dataclass(frozen=True, kw_only=True)
class ConsumptionLog(Record):
    """What step ``step`` trained on, written before the step's effects (the write-ahead log of exact resume).

    Version 2 carries the tail cursor as a delta from the previous step's (``cursor_delta``), so a log's size
    follows the step, not the campaign; version 1 logs (the whole cursor in ``cursor_after``) still read."""

    step: int
    trainer_version: int
    created_at: str
    groups: list[ConsumedGroup]
    skipped_zero_advantage: list[ZeroAdvantageGroup] = field(default_factory=list)
    dropped_stale: list[DroppedStale] = field(default_factory=list)
    skipped: list[SkippedShard] = field(default_factory=list)
    published_version: int | None = None
    """The version this step publishes, if it does."""
    cursor_delta: str | None = None
    """``TailCursor.delta_json(cursor before the step)`` (None in the synthetic demo, which never resumes)."""
    cursor_after: str | None = None
    """Version 1 only: ``TailCursor.to_json()`` after the step."""
    metrics: dict[str, float] = field(default_factory=dict)
    mean_reward: float | None = None

    VERSION: ClassVar[int] = 2
    OLDER_VERSIONS: ClassVar[tuple[int, ...]] = (1,)

    @classmethod
    def of_step(cls, *, step: int, trainer_version: int, groups: Sequence[GroupSlice], events: Sequence[TailEvent],
                zero_advantage: Sequence[ZeroAdvantageGroup] = (), published_version: int | None = None,
                cursor_delta: str | None = None, metrics: Mapping[str, float] | None = None) -> Self:
        """The log of a step that trained on ``groups`` after the tailer reported ``events``."""
        rewards = [r for g in groups for r in g.table.column("reward").to_pylist()]
        return cls(
            step=step, trainer_version=trainer_version, created_at=utc_now_iso(),
            groups=[ConsumedGroup(group_id=g.group_id, shard=g.shard, row_start=g.row_start, row_end=g.row_end,
                                  version=g.version, staleness=trainer_version - g.version) for g in groups],
            skipped_zero_advantage=list(zero_advantage),
            dropped_stale=[DroppedStale(shard=e.shard, groups=list(e.groups), reason=e.reason,
                                        unread_groups=e.unread_groups)
                           for e in events if e.kind == "dropped_stale"],
            skipped=[SkippedShard(shard=e.shard, reason=e.reason, groups=list(e.groups))
                     for e in events if e.kind == "skipped"],
            published_version=published_version, cursor_delta=cursor_delta, metrics=dict(metrics or {}),
            mean_reward=sum(rewards) / len(rewards) if rewards else None)

    def cursor_after_step(self, before: TailCursor, *, where: str) -> TailCursor:
        """The tail cursor after this step, given the one after the step before (version 1 logs hold it whole)."""
        if self.cursor_after is not None:
            return TailCursor.from_json(self.cursor_after)
        if self.cursor_delta is None:
            raise RecordError(f"{where}: no tail cursor; a trainer cannot resume from this log")
        return before.after(self.cursor_delta)

    @property
    def staleness_max(self) -> int:
        return max((g.staleness for g in self.groups), default=0)

    KEY: ClassVar[tuple[str, ...]] = ("step",)

    @classmethod
    def path_of(cls, step: int) -> str:  # type: ignore[override]
        return layout.consumed_log(step)


def consumption_steps(store: Store) -> list[int]:
    """Steps with a consumption log, ascending."""
    return sorted(s for n in store.list(layout.CONSUMED) if (s := layout.parse_consumed_name(n)) is not None)


def consumption_logs(store: Store) -> list[ConsumptionLog]:
    return [ConsumptionLog.read(store, s) for s in consumption_steps(store)]


# -- train/checkpoints/<step>/meta.json -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CheckpointMeta(Record):
    """What a checkpoint holds besides the Orbax state; its folder is committed by ``COMMITTED`` after it."""

    step: int
    version: int
    """Latest policy version published by the trainer when this checkpoint was taken."""
    cursor: str
    """``TailCursor.to_json()`` after the step's groups."""
    rng: list[int]

    @classmethod
    def path_of(cls, folder: str) -> str:  # type: ignore[override]
        """Inside the checkpoint's folder, which the saver names (a later save of one step gets ``.<n>``)."""
        return layout.checkpoint_meta(folder)

    def write(self, store: Store, folder: str) -> str:  # type: ignore[override]  # the key is not a field
        rel = self.path_of(folder)
        self._create(store, rel)
        return rel


# -- weights/v<N>/PUBLISHED.json and weights/LATEST ------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Publication(Record):
    """A published version: the marker inside its folder, and the same payload as a ``weights/LATEST`` entry."""

    version: int
    path: str
    step: int
    """The trainer step whose parameters these are (0 for the warm start)."""
    published_at: str

    KEY: ClassVar[tuple[str, ...]] = ("version",)

    @classmethod
    def path_of(cls, version: int) -> str:  # type: ignore[override]
        """The commit marker of ``weights/v<N>``, written before ``advance`` moves the pointer."""
        return layout.published_marker(version)

    def advance(self, store: Store) -> bool:
        """Move ``weights/LATEST`` forward to this publication (False if it is already at or past it)."""
        return store.advance_pointer(layout.WEIGHTS_LATEST, self.to_json())

    @classmethod
    def latest(cls, store: Store) -> Self | None:
        """What ``weights/LATEST`` points at, or None before the first publication."""
        raw = store.read_pointer(layout.WEIGHTS_LATEST)
        return None if raw is None else cls.from_json(raw, where=store.uri(layout.WEIGHTS_LATEST))

    @classmethod
    def mirror(cls, store: Store) -> Self:
        """The plain ``weights/LATEST.json`` file (the tool-readable copy of the pointer's newest entry)."""
        return cls.at(store, layout.WEIGHTS_LATEST)

    @classmethod
    def entry(cls, store: Store, version: int) -> Self:
        """The pointer entry that moved ``weights/LATEST`` to ``version``."""
        return cls.at(store, store.pointer_entry(layout.WEIGHTS_LATEST, version))


def published_versions(store: Store) -> list[int]:
    """Versions the ``weights/LATEST`` pointer has named, ascending."""
    return store.pointer_keys(layout.WEIGHTS_LATEST)


# -- eval/v<N>.json ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class EvalResult(Record):
    """Scores of one published version on the held-out split (``evaluate.summarize`` gives the figures)."""

    version: int
    split: str
    temperature: float
    tasks: int
    k: int
    """Sampled attempts per task, besides the greedy one."""
    greedy: dict[str, Any]
    sampled: dict[str, Any] | None = None
    greedy_success_rate: float
    pass_at_k: float | None
    wall_s: float
    generated_tokens: int

    KEY: ClassVar[tuple[str, ...]] = ("version",)

    @classmethod
    def path_of(cls, version: int) -> str:  # type: ignore[override]
        return layout.eval_path(version)


def evaluated_versions(store: Store) -> list[int]:
    return sorted(v for n in store.list(layout.EVAL) if (v := layout.parse_eval_name(n)) is not None)


# -- train/DONE.json --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DoneMarker(Record):
    """The train stage's marker: the trainer reached ``trainer.max_steps``. Rollout workers stop on it."""

    steps: int
    version: int
    groups_consumed: int
    groups_dropped_stale: int
    shards_skipped: int
    groups_skipped: int = 0
    idle_s: float
    busy_s: float
    wall_s: float
    tokens_trained: int
    finished_at: str

    PATH: ClassVar[str] = layout.TRAIN_DONE


# -- rollout/STOP-<utc>.json ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StopRequest(Record):
    """Rollout workers started before ``requested_at`` stop (the campaign asks when its trainer fails for good)."""

    requested_at: str
    """``layout.utc_compact`` time; also the object's name."""
    reason: str

    KEY: ClassVar[tuple[str, ...]] = ("requested_at",)

    @classmethod
    def path_of(cls, requested_at: str) -> str:  # type: ignore[override]
        return layout.stop_marker(requested_at)

    @classmethod
    def times(cls, store: Store) -> list[str]:
        """``requested_at`` of every stop request, oldest first."""
        return sorted(t for n in store.list(layout.ROLLOUT_STOPS) if (t := layout.parse_stop_name(n)))

    @classmethod
    def newer_than(cls, store: Store, since: str) -> bool:
        return any(t > since for t in cls.times(store))


# -- runs/<key>-<flow_run_id>.json ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RunRecord(Record):
    """One stage run inside a Prefect flow run: who ran it where, how it ended, and its manifest or error."""

    key: str
    """``stage``, ``stage-w<i>`` or ``stage-v<N:08d>`` (``tasks.common.stage_key``)."""
    flow_run_id: str
    flow_run_name: str | None
    deployment_id: str | None
    task_run_id: str | None
    host: str
    pid: int
    started_at: str
    state: str
    """``completed`` or ``failed``."""
    finished_at: str
    seconds: float
    attempt: str | None = None
    """``<flow run count>.<task run count>`` of a failed attempt."""
    manifest: dict[str, Any] | None = None
    error: str | None = None

    KEY: ClassVar[tuple[str, ...]] = ("key", "flow_run_id", "attempt")

    @classmethod
    def path_of(cls, key: str, flow_run_id: str, attempt: str | None = None) -> str:  # type: ignore[override]
        """A failed attempt's record is kept beside the run's own (``-failed-<attempt>``)."""
        return layout.run_record(key, flow_run_id, failed_attempt=attempt)


# -- audit/<utc>.json -------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AuditRecord(Record):
    """A kept audit: the verdict, and the whole ``audit.AuditReport`` as plain JSON in ``report``.

    Audits are snapshots of a folder that may still grow, so each is named by its time, not a once-only marker;
    a rendering for people is kept next to it (``.txt``)."""

    audited_at: str
    """ISO time of the audit; the object's name is its compact form."""
    ok: bool
    warnings: list[str]
    report: dict[str, Any]

    KEY: ClassVar[tuple[str, ...]] = ("audited_at",)

    @classmethod
    def path_of(cls, audited_at: str, suffix: str = "json") -> str:  # type: ignore[override]
        return layout.audit_report(layout.utc_compact_of(audited_at), suffix)

    def write(self, store: Store, text: str) -> tuple[str, str]:  # type: ignore[override]
        """The report, then its text rendering; returns both paths."""
        text_path = self.path_of(self.audited_at, "txt")
        json_path = super().write(store)
        store.create(text_path, text.encode())
        return json_path, text_path


@dataclass(frozen=True, kw_only=True)
class AuditVersionResult(Record):
    """What the audit found in one version folder (its work unit, as plain JSON in ``result``), kept so that a
    later incremental audit (``--since``) reuses it while the folder's shards have not changed."""

    version: int
    digest: str
    """Hash of the folder's shard names and the trainer's needs the checks used."""
    newest_version: int | None
    """The newest published version when it was audited (policy versions above it are findings)."""
    result: dict[str, Any]

    KEY: ClassVar[tuple[str, ...]] = ("version", "digest", "newest_version")

    @classmethod
    def path_of(cls, version: int, digest: str, newest_version: int | None) -> str:  # type: ignore[override]
        return layout.audit_version_result(version, digest, newest_version)


def audit_version_results(store: Store) -> dict[tuple[int, str], list[tuple[int | None, str]]]:
    """(version, digest) -> (newest version, path) of every kept per-version audit result."""
    out: dict[tuple[int, str], list[tuple[int | None, str]]] = {}
    for name in store.list(layout.AUDIT_VERSIONS):
        parsed = layout.parse_audit_version_result(name)
        if parsed is not None:
            out.setdefault(parsed[:2], []).append((parsed[2], f"{layout.AUDIT_VERSIONS}/{name}"))
    return out


def run_records(store: Store) -> list[RunRecord]:
    """Every run record in the folder, in name order."""
    return [RunRecord.at(store, f"{layout.RUNS}/{n}") for n in store.list(layout.RUNS) if n.endswith(".json")]


__all__ = [
    "RECORD_VERSION_KEY",
    "AuditRecord",
    "AuditVersionResult",
    "CampaignManifest",
    "CheckpointMeta",
    "ConsumedGroup",
    "ConsumptionLog",
    "DatasetSuccess",
    "DoneMarker",
    "DroppedStale",
    "EvalResult",
    "ForkParent",
    "Publication",
    "Record",
    "RecordError",
    "RunRecord",
    "SkippedShard",
    "SplitInfo",
    "StopRequest",
    "ZeroAdvantageGroup",
    "audit_version_results",
    "consumption_logs",
    "consumption_steps",
    "evaluated_versions",
    "fork_chain",
    "published_versions",
    "run_records",
    "with_parents",
]
