"""Records of the train stage: the consumption log of each step (``ConsumptionLog``, the write-ahead record
exact resume rests on, with its ``ConsumedGroup``, ``ZeroAdvantageGroup``, ``DroppedStale`` and ``SkippedShard``
parts), a checkpoint's ``meta.json`` (``CheckpointMeta``) and the stage's ``train/DONE.json`` (``DoneMarker``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Self

from pipelines_lib.records.base import Record, RecordError, _Record
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.cursor import TailCursor, TailEvent
from pipelines_lib.trajectory.window import staleness
from pipelines_lib.utc import utc_now_iso

if TYPE_CHECKING:  # the reader brings Arrow: the audit reads consumption logs in a process that never decodes
    from pipelines_lib.trajectory.channel import GroupSlice

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
    digest: str | None = None
    """``trajectory.trainable.group_digest`` of the rows when they were trained on: a replay of the step refuses
    rows that hash otherwise. None: unknown (a log written before digests were recorded, or by a tool); such a
    group is replayed with the trainable checks only."""


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
                                  version=g.version, staleness=staleness(trainer_version, g.version),
                                  digest=g.digest) for g in groups],
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


def committed_checkpoints(store: Store) -> list[str]:
    """Committed checkpoint folders, oldest first (names other than ``<step:08d>[.<attempt>]`` are ignored)."""
    out = []
    for name in store.list(layout.CHECKPOINTS):
        folder = f"{layout.CHECKPOINTS}/{name}"
        if layout.checkpoint_step(name) is not None and store.exists(layout.checkpoint_committed(folder)):
            out.append(folder)
    return sorted(out, key=lambda f: layout.checkpoint_step(f) or 0)


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
