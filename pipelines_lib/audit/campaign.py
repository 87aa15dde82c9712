"""``audit_campaign``: read a whole campaign folder with no other state and report what is in it.

A folder without ``campaign.json`` is not a campaign (``NotACampaignError``): auditing ``/etc`` must not
say "OK". One listing of the folder drives everything:

- ``trajectories/``: every object must be a shard name that decodes with a supported schema
  (``BadFile`` otherwise; FIFOs, devices and symlinks out of the campaign are ``not_a_file`` and never
  opened); each readable shard is validated row by row (``Finding`` per violation, with shard and row),
  counted per version and worker, and folded into the distributions (``stats``). A trajectory id seen in
  two shards is a ``duplicate_trajectory``.
- what the trainer needs (``trajectory.trainable``), when ``campaign.json`` holds a config: declared sizes
  within its row budget (checked before decoding), group size, row length against the largest bucket, token
  ids in the vocabulary, policy versions not newer than the newest published and matching the version
  folder, contiguous groups, content written under this shard's name (``untrainable_group``,
  ``interleaved_groups``, ``copied_shard``). The trainer's tailer skips exactly these.
- anything whose name carries ``TEMP_MARKER``, anywhere: an orphaned temporary (a warning).
- consumption logs and the ``weights/LATEST`` pointer's entries, read as ``records``: handed to
  ``lineage.reconcile``; one that does not read as its record is a finding, and so is a pointer entry whose name
  and content disagree (``bad_pointer_entry``: readers skip it).
- ``campaign.json`` and the evaluations: reported as found.

Shards are fetched ``read_ahead`` at a time on a thread pool (a GCS audit is bound by request latency) and
processed in name order, so the report does not depend on timing. ``progress`` gets a line every
``progress_every`` shards.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow as pa

from pipelines_lib import records
from pipelines_lib.audit.lineage import CommittedGroup, GroupKey, reconcile
from pipelines_lib.audit.report import AuditReport, BadFile, Counts, Finding
from pipelines_lib.audit.stats import Distribution, shard_figures
from pipelines_lib.records import CampaignManifest, ConsumptionLog, Publication, Record, RecordError
from pipelines_lib.storage import layout
from pipelines_lib.storage.errors import NotAnObjectError, NotFoundError
from pipelines_lib.storage.shards import ShardError, check_declared_sizes, decode_shard, identity_problem
from pipelines_lib.storage.store import TEMP_MARKER, Store, pointer_entry_problem
from pipelines_lib.trajectory.record import utc_now_iso
from pipelines_lib.trajectory.schema import SCHEMA_VERSION_KEY, SchemaVersionError
from pipelines_lib.trajectory.trainable import TrainerNeeds, group_problem, group_runs
from pipelines_lib.trajectory.validate import validate_table

R = TypeVar("R", bound=Record)
_POINTER_ENTRIES = f"{layout.WEIGHTS_LATEST}.d/"


class NotACampaignError(NotFoundError):
    """The folder has no ``campaign.json``."""


Missing = NotFoundError | NotAnObjectError


def _read(store: Store, path: str) -> bytes | Missing:
    # A listed object that is gone or is not a regular object is a finding about it; any other storage error
    # stops the audit.
    try:
        return store.read(path)
    except (NotFoundError, NotAnObjectError) as e:
        return e


def _prefetch(store: Store, paths: Iterable[str], read_ahead: int) -> Iterator[tuple[str, bytes | Missing]]:
    """Objects in ``paths`` order, at most ``read_ahead`` requests in flight (bounded memory)."""
    todo = iter(paths)
    with ThreadPoolExecutor(max_workers=read_ahead, thread_name_prefix="audit-read") as pool:
        window: deque[tuple[str, Future]] = deque((p, pool.submit(_read, store, p))
                                                  for p in itertools.islice(todo, read_ahead))
        while window:
            path, fut = window.popleft()
            nxt = next(todo, None)
            if nxt is not None:
                window.append((nxt, pool.submit(_read, store, nxt)))
            yield path, fut.result()


@dataclass
class _Tally:
    shards: int = 0
    trajectories: int = 0
    groups: int = 0
    bytes: int = 0
    reward_sum: float = 0.0

    def counts(self) -> Counts:
        return Counts(shards=self.shards, trajectories=self.trajectories, groups=self.groups, bytes=self.bytes,
                      reward_mean=self.reward_sum / self.trajectories if self.trajectories else None)


@dataclass
class _Accumulator:
    """Everything gathered shard by shard before the report is frozen."""

    findings: list[Finding] = field(default_factory=list)
    bad_files: list[BadFile] = field(default_factory=list)
    schema_versions: Counter[str] = field(default_factory=Counter)
    by_version: dict[int, _Tally] = field(default_factory=lambda: defaultdict(_Tally))
    by_worker: dict[str, _Tally] = field(default_factory=lambda: defaultdict(_Tally))
    dists: dict[str, Distribution] = field(default_factory=lambda: defaultdict(Distribution))
    statuses: Counter[str] = field(default_factory=Counter)
    tool_calls: Counter[str] = field(default_factory=Counter)
    tool_errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    committed: dict[GroupKey, CommittedGroup] = field(default_factory=dict)
    first_seen: dict[str, tuple[str, int]] = field(default_factory=dict)
    shards: int = 0
    needs: TrainerNeeds | None = None
    newest_version: int | None = None

    def add_shard_object(self, store: Store, path: str, sid: layout.ShardId, data: bytes | Missing) -> None:
        if isinstance(data, NotAnObjectError):
            self.bad_files.append(BadFile(path=path, kind="not_a_file", reason=str(data)))
            return
        if isinstance(data, NotFoundError):
            self.bad_files.append(BadFile(path=path, kind="unreadable", reason=str(data)))
            return
        decoded = self._decode(store.uri(path), path, data)
        if decoded is not None:
            self._add_shard(path, sid, *decoded, len(data))

    def _decode(self, uri: str, path: str, data: bytes) -> tuple[pa.Table, dict] | None:
        try:
            meta = pa.ipc.open_file(pa.BufferReader(data)).schema.metadata or {}
        except (pa.ArrowInvalid, OSError) as e:
            self.bad_files.append(BadFile(path=path, kind="unreadable", reason=f"not an Arrow IPC file ({e})"))
            return None
        raw_version = meta.get(SCHEMA_VERSION_KEY)
        self.schema_versions[raw_version.decode() if raw_version else "none"] += 1
        max_row_tokens = self.needs.max_tokens if self.needs is not None else None
        try:
            check_declared_sizes(data, uri, max_row_tokens=max_row_tokens)
        except ShardError as e:
            self.bad_files.append(BadFile(path=path, kind="oversized", reason=str(e)))
            return None
        try:
            return decode_shard(data, uri, validate=False, max_row_tokens=max_row_tokens)
        except ShardError as e:
            kind = ("foreign_schema" if raw_version is None
                    else "schema_version" if isinstance(e.__cause__, SchemaVersionError) else "unreadable")
            self.bad_files.append(BadFile(path=path, kind=kind, reason=str(e)))
            return None

    def _trainer_findings(self, path: str, sid: layout.ShardId, table: pa.Table, provenance: dict) -> list[Finding]:
        """What the trainer's tailer would skip in this (invariant-valid) shard, as findings."""
        def finding(kind: str, message: str, row: int | None = None) -> Finding:
            return Finding(kind=kind, path=path, row=row, trajectory_id=None, message=message)

        runs, interleaved = group_runs(table)
        copied = identity_problem(path, provenance)
        out = [finding("copied_shard", copied)] if copied else []
        if interleaved:
            return out + [finding("interleaved_groups", interleaved)]
        if self.needs is not None:
            for start, end, _ in runs:
                problem = group_problem(table.slice(start, end - start), self.needs, folder_version=sid.version,
                                        newest_version=self.newest_version)
                if problem:
                    out.append(finding("untrainable_group", problem, start))
        return out

    def _add_shard(self, path: str, sid: layout.ShardId, table: pa.Table, provenance: dict, n_bytes: int) -> None:
        self.shards += 1
        violations = validate_table(table)
        self.findings += [Finding(kind=v.kind, path=path, row=v.row, trajectory_id=v.trajectory_id, message=v.message)
                          for v in violations]
        untrainable = [] if violations else self._trainer_findings(path, sid, table, provenance)
        self.findings += untrainable
        for row, tid in enumerate(table.column("trajectory_id").to_pylist()):
            first = self.first_seen.setdefault(tid, (path, row))
            if first[0] != path:
                self.findings.append(Finding(kind="duplicate_trajectory", path=path, row=row, trajectory_id=tid,
                                             message=f"also committed in {first[0]} row {first[1]}"))
        spans: dict[str, list[int]] = {}
        prompts: dict[str, str] = {}
        for row, (gid, pid) in enumerate(zip(table.column("group_id").to_pylist(),
                                             table.column("prompt_id").to_pylist(), strict=True)):
            spans.setdefault(gid, [row, row])[1] = row
            prompts.setdefault(gid, pid)
        for gid, (first_row, last_row) in spans.items():
            self.committed[(path, gid)] = CommittedGroup(version=sid.version, prompt_id=prompts[gid],
                                                         row_start=first_row, row_end=last_row + 1,
                                                         usable=not violations and not untrainable)
        fig = shard_figures(table)
        for tally in (self.by_version[sid.version], self.by_worker[sid.worker_id]):
            tally.shards += 1
            tally.trajectories += table.num_rows
            tally.groups += len(spans)
            tally.bytes += n_bytes
            tally.reward_sum += float(fig.reward.sum())
        for name in ("reward", "tokens", "generated_tokens", "turns"):
            self.dists[name].add(getattr(fig, name))
        self.statuses.update(fig.statuses)
        self.tool_calls.update(fig.tool_calls)
        self.tool_errors.update(fig.tool_errors)


def _records(store: Store, paths: list[str], cls: type[R], read_ahead: int, kind: str,
             findings: list[Finding]) -> list[tuple[str, R]]:
    """Records ``cls`` at ``paths`` (in order); unreadable or invalid ones become findings of ``kind``."""
    out = []
    for path, data in _prefetch(store, paths, read_ahead):
        try:
            if isinstance(data, NotFoundError | NotAnObjectError):
                raise RecordError(str(data))
            out.append((path, cls.from_bytes(data, where=path)))
        except RecordError as e:
            findings.append(Finding(kind=kind, path=path, row=None, trajectory_id=None, message=str(e)))
    return out


def _campaign(store: Store, findings: list[Finding]) -> dict[str, Any] | None:
    parsed = _records(store, [layout.CAMPAIGN_JSON], CampaignManifest, 1, "bad_campaign_json", findings)
    return parsed[0][1].to_dict() if parsed else None


def _pointer_entries(store: Store, paths: list[str], read_ahead: int, findings: list[Finding]) -> list[Publication]:
    """The valid entries of the ``weights/LATEST`` pointer among ``paths``; any other object there (a stray name,
    content that disagrees with its name, a non-record) is a ``bad_pointer_entry`` finding: readers skip it."""
    entries = []
    for path, data in _prefetch(store, paths, read_ahead):
        try:
            if isinstance(data, NotFoundError | NotAnObjectError):
                raise RecordError(str(data))
            entry = Publication.from_bytes(data, where=path)
            problem = pointer_entry_problem(path.rsplit("/", 1)[-1], entry.to_dict())
            if problem is not None:
                raise RecordError(problem)
            entries.append(entry)
        except RecordError as e:
            findings.append(Finding(kind="bad_pointer_entry", path=path, row=None, trajectory_id=None,
                                    message=f"{e} (readers skip it)"))
    return entries


def _needs(campaign: dict[str, Any] | None, findings: list[Finding]) -> TrainerNeeds | None:
    """The trainer's needs from the config snapshot (``CampaignConfig.to_dict()``: its rollout, trainer and model
    sections); None (trainer checks skipped) for a folder that is not a training campaign (the synthetic demo) or
    records no config."""
    config = (campaign or {}).get("config")
    if not config or campaign.get("kind") != "campaign":
        return None
    try:
        return TrainerNeeds(group_size=int(config["rollout"]["group_size"]),
                            max_tokens=int(config["trainer"]["seq_buckets"][-1]),
                            vocab_size=int(config["model"]["vocab_size"]))
    except (TypeError, ValueError, KeyError, IndexError) as e:
        findings.append(Finding(kind="bad_campaign_json", path=layout.CAMPAIGN_JSON, row=None, trajectory_id=None,
                                message=f"config does not load, trainer checks skipped: {e}"))
        return None


def audit_campaign(store: Store, *, progress: Callable[[str], None] | None = None, progress_every: int = 100,
                   read_ahead: int = 8, max_listed: int = 1000,
                   clock: Callable[[], float] = time.monotonic) -> AuditReport:
    """Audit the campaign at ``store``. Raises ``NotACampaignError`` when it has no ``campaign.json``."""
    if progress_every < 1 or read_ahead < 1:
        raise ValueError(f"progress_every and read_ahead must be >= 1, got {progress_every}, {read_ahead}")
    start = clock()
    if not store.exists(layout.CAMPAIGN_JSON):
        raise NotACampaignError("audit", store.url, f"not a campaign (no {layout.CAMPAIGN_JSON})")
    files = store.walk("")
    if progress is not None:
        progress(f"audit {store.url}: {len(files)} objects listed ({clock() - start:.1f} s)")
    temporaries = [f for f in files if TEMP_MARKER in f.rsplit("/", 1)[-1]]
    visible = [f for f in files if TEMP_MARKER not in f.rsplit("/", 1)[-1]]
    under_traj = [f for f in visible if f.startswith(layout.TRAJECTORIES + "/")]
    shards = sorted((sid, f) for f in under_traj if (sid := layout.parse_shard_path(f)) is not None)

    acc = _Accumulator()
    campaign = _campaign(store, acc.findings)
    acc.needs = _needs(campaign, acc.findings)
    # Pointer entries first: the newest published version bounds the policy versions a shard may carry.
    entries = _pointer_entries(store, [f for f in visible if f.startswith(_POINTER_ENTRIES)], read_ahead,
                               acc.findings)
    acc.newest_version = max((e.version for e in entries), default=None)

    acc.bad_files += [BadFile(path=f, kind="foreign_name", reason="not a shard name "
                              "(trajectories/v<version:08d>/<worker>-<seq:08d>.arrow)")
                      for f in under_traj if layout.parse_shard_path(f) is None]
    fetched = _prefetch(store, [f for _, f in shards], read_ahead)
    for i, ((sid, _), (path, data)) in enumerate(zip(shards, fetched, strict=True), 1):
        acc.add_shard_object(store, path, sid, data)
        if progress is not None and (i % progress_every == 0 or i == len(shards)):
            progress(f"audit {store.url}: {i}/{len(shards)} shards read ({clock() - start:.1f} s)")

    findings = acc.findings
    consumed = [f for f in visible if f.startswith(layout.CONSUMED + "/")]
    log_paths = [f for f in consumed if layout.parse_consumed_name(f.rsplit("/", 1)[-1]) is not None]
    findings += [Finding(kind="bad_consumption_log", path=f, row=None, trajectory_id=None,
                         message="not a consumption log name (train/consumed/<step:08d>.json)")
                 for f in consumed if f not in log_paths]
    logs = _records(store, log_paths, ConsumptionLog, read_ahead, "bad_consumption_log", findings)
    lineage, lineage_findings = reconcile(acc.committed, logs, entries)
    findings += lineage_findings

    dists = {name: acc.dists[name].summary() for name in ("reward", "tokens", "generated_tokens", "turns")}
    tool_errors: dict[str, dict[str, int]] = defaultdict(dict)
    for (tool, kind), n in sorted(acc.tool_errors.items()):
        tool_errors[tool][kind] = n
    return AuditReport(
        url=store.url,
        audited_at=utc_now_iso(),
        seconds=clock() - start,
        files=len(files),
        shards=acc.shards,
        trajectories=sum(t.trajectories for t in acc.by_version.values()),
        groups=len(acc.committed),
        by_version={v: t.counts() for v, t in sorted(acc.by_version.items())},
        by_worker={w: t.counts() for w, t in sorted(acc.by_worker.items())},
        schema_versions=dict(sorted(acc.schema_versions.items())),
        violation_counts=dict(sorted(Counter(f.kind for f in findings).items())),
        violations=tuple(findings[:max_listed]),
        bad_files=tuple(sorted(acc.bad_files, key=lambda b: b.path)),
        orphaned_temporaries=tuple(temporaries),
        statuses=dict(sorted(acc.statuses.items())),
        tool_calls=dict(sorted(acc.tool_calls.items())),
        tool_errors=dict(tool_errors),
        lineage=lineage,
        campaign=campaign,
        evals=tuple(layout.eval_path(v) for v in records.evaluated_versions(store)),
        **dists,
    )
