"""``audit_campaign``: read a whole campaign folder with no other state and report what is in it.

One listing of the folder drives everything:

- ``trajectories/``: every object must be a shard name that decodes with a supported schema
  (``BadFile`` otherwise); each readable shard is validated row by row (``Finding`` per violation, with shard
  and row), counted per version and worker, and folded into the distributions (``stats``). A trajectory id
  seen in two shards is a ``duplicate_trajectory``.
- anything whose name carries ``TEMP_MARKER``, anywhere: an orphaned temporary (a warning).
- consumption logs and the ``weights/LATEST`` pointer's entries, read as ``records``: handed to
  ``lineage.reconcile``; one that does not read as its record is a finding.
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
from typing import TypeVar

import pyarrow as pa

from pipelines_lib import records
from pipelines_lib.audit.lineage import CommittedGroup, GroupKey, reconcile
from pipelines_lib.audit.report import AuditReport, BadFile, Counts, Finding
from pipelines_lib.audit.stats import Distribution, shard_figures
from pipelines_lib.records import CampaignManifest, ConsumptionLog, Publication, Record, RecordError
from pipelines_lib.storage import layout
from pipelines_lib.storage.errors import NotFoundError
from pipelines_lib.storage.shards import ShardError, decode_shard
from pipelines_lib.storage.store import TEMP_MARKER, Store
from pipelines_lib.trajectory.record import utc_now_iso
from pipelines_lib.trajectory.schema import SCHEMA_VERSION_KEY, SchemaVersionError
from pipelines_lib.trajectory.validate import validate_table

R = TypeVar("R", bound=Record)


def _read(store: Store, path: str) -> bytes | NotFoundError:
    # A listed object that is gone is a finding about that object; any other storage error stops the audit.
    try:
        return store.read(path)
    except NotFoundError as e:
        return e


def _prefetch(store: Store, paths: Iterable[str], read_ahead: int) -> Iterator[tuple[str, bytes | NotFoundError]]:
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

    def add_shard_object(self, store: Store, path: str, sid: layout.ShardId, data: bytes | NotFoundError) -> None:
        if isinstance(data, NotFoundError):
            self.bad_files.append(BadFile(path=path, kind="unreadable", reason=str(data)))
            return
        table = self._decode(store.uri(path), path, data)
        if table is not None:
            self._add_shard(path, sid, table, len(data))

    def _decode(self, uri: str, path: str, data: bytes) -> pa.Table | None:
        try:
            meta = pa.ipc.open_file(pa.BufferReader(data)).schema.metadata or {}
        except (pa.ArrowInvalid, OSError) as e:
            self.bad_files.append(BadFile(path=path, kind="unreadable", reason=f"not an Arrow IPC file ({e})"))
            return None
        raw_version = meta.get(SCHEMA_VERSION_KEY)
        self.schema_versions[raw_version.decode() if raw_version else "none"] += 1
        try:
            return decode_shard(data, uri, validate=False)[0]
        except ShardError as e:
            kind = ("foreign_schema" if raw_version is None
                    else "schema_version" if isinstance(e.__cause__, SchemaVersionError) else "unreadable")
            self.bad_files.append(BadFile(path=path, kind=kind, reason=str(e)))
            return None

    def _add_shard(self, path: str, sid: layout.ShardId, table: pa.Table, n_bytes: int) -> None:
        self.shards += 1
        violations = validate_table(table)
        self.findings += [Finding(kind=v.kind, path=path, row=v.row, trajectory_id=v.trajectory_id, message=v.message)
                          for v in violations]
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
                                                         usable=not violations)
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
            if isinstance(data, NotFoundError):
                raise RecordError(str(data))
            out.append((path, cls.from_bytes(data, where=path)))
        except RecordError as e:
            findings.append(Finding(kind=kind, path=path, row=None, trajectory_id=None, message=str(e)))
    return out


def audit_campaign(store: Store, *, progress: Callable[[str], None] | None = None, progress_every: int = 100,
                   read_ahead: int = 8, max_listed: int = 1000,
                   clock: Callable[[], float] = time.monotonic) -> AuditReport:
    """Audit the campaign at ``store``. Raises ``NotFoundError`` when nothing is there at all."""
    if progress_every < 1 or read_ahead < 1:
        raise ValueError(f"progress_every and read_ahead must be >= 1, got {progress_every}, {read_ahead}")
    start = clock()
    files = store.walk("")
    if not files:
        raise NotFoundError("audit", store.url, "no campaign here (the folder is empty or missing)")
    if progress is not None:
        progress(f"audit {store.url}: {len(files)} objects listed ({clock() - start:.1f} s)")
    temporaries = [f for f in files if TEMP_MARKER in f.rsplit("/", 1)[-1]]
    visible = [f for f in files if TEMP_MARKER not in f.rsplit("/", 1)[-1]]
    under_traj = [f for f in visible if f.startswith(layout.TRAJECTORIES + "/")]
    shards = sorted((sid, f) for f in under_traj if (sid := layout.parse_shard_path(f)) is not None)

    acc = _Accumulator()
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
    entries = [p for _, p in _records(store, [store.pointer_entry(layout.WEIGHTS_LATEST, v)
                                              for v in records.published_versions(store)],
                                      Publication, read_ahead, "bad_pointer_entry", findings)]
    lineage, lineage_findings = reconcile(acc.committed, logs, entries)
    findings += lineage_findings

    campaign = None
    if layout.CAMPAIGN_JSON in visible:
        parsed = _records(store, [layout.CAMPAIGN_JSON], CampaignManifest, 1, "bad_campaign_json", findings)
        campaign = parsed[0][1].to_dict() if parsed else None

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
