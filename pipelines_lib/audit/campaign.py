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
- for a fork (``campaign.json`` names a ``parent``): the folder is read over its parent's history up to the fork
  point (``records.with_parents``: the parent's shards up to the fork's version, its consumption logs up to the
  step, its publications), read-only, so lineage walks back from the fork's versions through the parent's
  shards; the ``ancestry`` lists the parents, nearest first, each with its versions up to its fork point.

Each version folder is one work unit: its shards are fetched ``read_ahead`` at a time on a thread pool (a GCS
audit is bound by request latency) and processed in name order, in this process or on one of ``jobs`` worker
processes (decoding is CPU-bound: threads do not help under the GIL). A unit's result is small and bounded:
counts, value -> count distributions (``stats.Distribution``), findings, the committed groups lineage needs and
a 64-bit hash per trajectory id, so duplicates across folders are found at 8 bytes an id. Results merge in
version order, so the report does not depend on timing or on ``jobs``. ``progress`` gets a line every
``progress_every`` shards.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import itertools
import json
import multiprocessing
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from pipelines_lib import records
from pipelines_lib.audit.lineage import CommittedGroup, GroupKey, reconcile
from pipelines_lib.audit.report import Ancestor, AuditReport, BadFile, Counts, Finding, Lineage
from pipelines_lib.audit.stats import Distribution, shard_figures
from pipelines_lib.records import (
    AuditVersionResult,
    CampaignManifest,
    ConsumptionLog,
    ForkParent,
    Publication,
    Record,
    RecordError,
)
from pipelines_lib.storage import layout
from pipelines_lib.storage.errors import AlreadyExistsError, NotAnObjectError, NotFoundError
from pipelines_lib.storage.shards import ShardError, check_declared_sizes, decode_shard, identity_problem
from pipelines_lib.storage.store import TEMP_MARKER, Store, pointer_entry_problem
from pipelines_lib.trajectory.record import utc_now_iso
from pipelines_lib.trajectory.schema import SCHEMA_VERSION_KEY, SchemaVersionError
from pipelines_lib.trajectory.trainable import TrainerNeeds, clean_groups, group_problem, group_runs
from pipelines_lib.trajectory.validate import Violation, validate_tables

R = TypeVar("R", bound=Record)
BATCH_SHARDS = 64
"""Decoded shards checked together (``validate_tables``, ``shard_figures``): bounds a work unit's memory."""
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


def prefetch(store: Store, paths: Iterable[str], read_ahead: int) -> Iterator[tuple[str, bytes | Missing]]:
    """Objects in ``paths`` order, at most ``read_ahead`` requests in flight (bounded memory). A local folder is
    read inline: there is no request latency to hide, and handing each file over from a thread costs more."""
    if store.local_path() is not None:
        yield from ((path, _read(store, path)) for path in paths)
        return
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
class _IdIndex:
    """64-bit hashes of trajectory ids, each with the version folder that committed it first: sorted arrays at 12
    bytes an id (a dict of Python ints costs ~100), so a whole campaign's ids stay small in the merging process."""

    hashes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    folder_of: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint32))
    """Index into ``folders`` of each hash's first folder."""
    folders: list[str] = field(default_factory=list)

    def add(self, hashes: np.ndarray, folder: str) -> list[str]:
        """Fold in the distinct ``hashes`` of ``folder``; returns the first folder of each one another folder
        already committed."""
        pos = np.searchsorted(self.hashes, hashes)
        known = np.zeros(len(hashes), bool)
        inside = pos < len(self.hashes)
        known[inside] = self.hashes[pos[inside]] == hashes[inside]
        firsts = [self.folders[i] for i in self.folder_of[pos[known]].tolist()]
        if folder not in self.folders:
            self.folders.append(folder)
        new = hashes[~known]
        merged = np.concatenate([self.hashes, new])
        order = np.argsort(merged, kind="stable")
        self.hashes = merged[order]
        self.folder_of = np.concatenate([self.folder_of, np.full(len(new), self.folders.index(folder), np.uint32)])[order]
        return [first for first in firsts if first != folder]


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
    """Trajectory id -> (shard, row) within one work unit (a version folder)."""
    unit_ids: list[int] = field(default_factory=list)
    """64-bit hash of each trajectory id of this work unit (one version folder, ``unit_folder``): ``merge`` finds
    duplicates across work units by them (``ids``)."""
    unit_folder: str = ""
    ids: _IdIndex = field(default_factory=_IdIndex)
    """The hashes of every work unit merged so far."""
    shards: int = 0
    needs: TrainerNeeds | None = None
    newest_version: int | None = None

    def to_plain(self) -> dict[str, Any]:
        """One work unit's result as JSON (``AuditVersionResult.result``); ``from_plain`` reads it back."""
        hashes = np.unique(np.array(self.unit_ids, np.uint64))
        return {
            "findings": [dataclasses.asdict(f) for f in self.findings],
            "bad_files": [dataclasses.asdict(b) for b in self.bad_files],
            "schema_versions": dict(self.schema_versions),
            "by_version": {str(v): dataclasses.asdict(t) for v, t in self.by_version.items()},
            "by_worker": {w: dataclasses.asdict(t) for w, t in self.by_worker.items()},
            "dists": {name: sorted(d.counts.items()) for name, d in self.dists.items()},
            "statuses": dict(self.statuses),
            "tool_calls": dict(self.tool_calls),
            "tool_errors": [[tool, kind, n] for (tool, kind), n in sorted(self.tool_errors.items())],
            "committed": [[shard, gid, c.version, c.prompt_id, c.row_start, c.row_end, c.usable]
                          for (shard, gid), c in self.committed.items()],
            "id_hashes": base64.b64encode(hashes.tobytes()).decode(),
            "id_folder": self.unit_folder,
            "shards": self.shards,
        }

    @classmethod
    def from_plain(cls, raw: dict[str, Any]) -> _Accumulator:
        acc = cls(findings=[Finding(**f) for f in raw["findings"]],
                  bad_files=[BadFile(**b) for b in raw["bad_files"]],
                  schema_versions=Counter(raw["schema_versions"]), statuses=Counter(raw["statuses"]),
                  tool_calls=Counter(raw["tool_calls"]),
                  tool_errors=Counter({(tool, kind): n for tool, kind, n in raw["tool_errors"]}),
                  committed={(shard, gid): CommittedGroup(version=v, prompt_id=pid, row_start=a, row_end=b, usable=ok)
                             for shard, gid, v, pid, a, b, ok in raw["committed"]},
                  shards=raw["shards"])
        for mine, theirs in ((acc.by_version, {int(v): t for v, t in raw["by_version"].items()}),
                             (acc.by_worker, raw["by_worker"])):
            mine.update({k: _Tally(**t) for k, t in theirs.items()})
        for name, pairs in raw["dists"].items():
            acc.dists[name].counts.update({float(v): int(c) for v, c in pairs})
        acc.unit_ids = np.frombuffer(base64.b64decode(raw["id_hashes"]), np.uint64).tolist()
        acc.unit_folder = raw["id_folder"]
        return acc

    def merge(self, unit: _Accumulator) -> None:
        """Fold in the result of another work unit (a later version folder)."""
        self.findings += unit.findings
        self.bad_files += unit.bad_files
        self.schema_versions.update(unit.schema_versions)
        for mine, theirs in ((self.by_version, unit.by_version), (self.by_worker, unit.by_worker)):
            for key, t in theirs.items():
                m = mine[key]
                m.shards, m.trajectories, m.groups = m.shards + t.shards, m.trajectories + t.trajectories, m.groups + t.groups
                m.bytes, m.reward_sum = m.bytes + t.bytes, m.reward_sum + t.reward_sum
        for name, dist in unit.dists.items():
            self.dists[name].merge(dist)
        self.statuses.update(unit.statuses)
        self.tool_calls.update(unit.tool_calls)
        self.tool_errors.update(unit.tool_errors)
        self.committed.update(unit.committed)
        if unit.unit_ids:
            self.findings += [Finding(kind="duplicate_trajectory", path=unit.unit_folder, row=None, trajectory_id=None,
                                      message=f"a trajectory id of this folder is also committed in {first}")
                              for first in self.ids.add(np.unique(np.array(unit.unit_ids, np.uint64)), unit.unit_folder)]
        self.shards += unit.shards

    def add_shard_objects(self, store: Store, shards: Iterable[tuple[str, layout.ShardId, bytes | Missing]]) -> None:
        """Fold in ``(path, shard id, fetched object)`` in order, ``BATCH_SHARDS`` decoded shards at a time."""
        batch: list[tuple[str, layout.ShardId, pa.Table, dict, int]] = []
        for path, sid, data in shards:
            if isinstance(data, NotAnObjectError):
                self.bad_files.append(BadFile(path=path, kind="not_a_file", reason=str(data)))
            elif isinstance(data, NotFoundError):
                self.bad_files.append(BadFile(path=path, kind="unreadable", reason=str(data)))
            elif (decoded := self._decode(store.uri(path), path, data)) is not None:
                batch.append((path, sid, *decoded, len(data)))
            if len(batch) == BATCH_SHARDS:
                self._add_batch(batch)
                batch = []
        if batch:
            self._add_batch(batch)

    def _add_batch(self, batch: list[tuple[str, layout.ShardId, pa.Table, dict, int]]) -> None:
        """Shards checked and summarised together: per-call overheads dominate a small shard's checks."""
        tables = [table for _, _, table, _, _ in batch]
        whole = pa.concat_tables(tables).combine_chunks()
        fig = shard_figures(whole)
        shard_of_row = np.repeat(np.arange(len(tables)), [t.num_rows for t in tables])
        reward_sums = np.bincount(shard_of_row, weights=fig.reward, minlength=len(tables))
        runs = [group_runs(table) for table in tables]
        clean = self._clean_groups(whole, [sid for _, sid, *_ in batch], tables, runs)
        for (path, sid, table, provenance, n_bytes), violations, reward_sum, shard_runs, shard_clean in zip(
                batch, validate_tables(tables), reward_sums.tolist(), runs, clean, strict=True):
            self._add_shard(path, sid, table, provenance, n_bytes, violations, reward_sum, shard_runs, shard_clean)
        for name in ("reward", "tokens", "generated_tokens", "turns"):
            self.dists[name].add(getattr(fig, name))
        self.statuses.update(fig.statuses)
        self.tool_calls.update(fig.tool_calls)
        self.tool_errors.update(fig.tool_errors)

    def _decode(self, uri: str, path: str, data: bytes) -> tuple[pa.Table, dict] | None:
        max_row_tokens = self.needs.max_tokens if self.needs is not None else None
        try:
            # The common case decodes once; the schema is opened on its own only to classify a failure.
            decoded = decode_shard(data, uri, validate=False, max_row_tokens=max_row_tokens)
            failure = None
        except ShardError as e:
            decoded, failure = None, e
        try:
            meta = (decoded[0].schema if decoded else pa.ipc.open_file(pa.BufferReader(data)).schema).metadata or {}
        except (pa.ArrowInvalid, OSError) as e:
            self.bad_files.append(BadFile(path=path, kind="unreadable", reason=f"not an Arrow IPC file ({e})"))
            return None
        raw_version = meta.get(SCHEMA_VERSION_KEY)
        self.schema_versions[raw_version.decode() if raw_version else "none"] += 1
        if failure is None:
            return decoded
        try:
            check_declared_sizes(data, uri, max_row_tokens=max_row_tokens)
        except ShardError as e:
            self.bad_files.append(BadFile(path=path, kind="oversized", reason=str(e)))
            return None
        kind = ("foreign_schema" if raw_version is None
                else "schema_version" if isinstance(failure.__cause__, SchemaVersionError) else "unreadable")
        self.bad_files.append(BadFile(path=path, kind=kind, reason=str(failure)))
        return None

    def _clean_groups(self, whole: pa.Table, sids: list[layout.ShardId], tables: list[pa.Table],
                      runs: list[tuple[list[tuple[int, int, str]], str | None]]) -> list[list[bool]]:
        """Per shard, per group: surely no ``untrainable_group`` (``trainable.clean_groups`` over the whole batch);
        the per-group check runs, for its reason, only on the others."""
        if self.needs is None:
            return [[True] * len(shard_runs) for shard_runs, _ in runs]
        offsets = np.cumsum([0] + [t.num_rows for t in tables])
        bounds = [(offset + s, offset + e) for offset, (shard_runs, _) in zip(offsets[:-1].tolist(), runs, strict=True)
                  for s, e, _ in shard_runs]
        versions = [sid.version for sid, (shard_runs, _) in zip(sids, runs, strict=True) for _ in shard_runs]
        clean = clean_groups(whole, np.array(bounds, np.int64).reshape(-1, 2), self.needs,
                             folder_version_g=np.array(versions, np.int64), newest_version=self.newest_version,
                             infra=False).tolist()
        out, at = [], 0
        for shard_runs, _ in runs:
            out.append(clean[at:at + len(shard_runs)])
            at += len(shard_runs)
        return out

    def _trainer_findings(self, path: str, sid: layout.ShardId, table: pa.Table, provenance: dict,
                          runs: list[tuple[int, int, str]], interleaved: str | None,
                          clean: list[bool]) -> list[Finding]:
        """What the trainer's tailer would skip in this (invariant-valid) shard, as findings (``clean``: the groups
        ``_clean_groups`` cleared)."""
        def finding(kind: str, message: str, row: int | None = None) -> Finding:
            return Finding(kind=kind, path=path, row=row, trajectory_id=None, message=message)

        copied = identity_problem(path, provenance, groups=len(runs))
        out = [finding("copied_shard", copied)] if copied else []
        if interleaved:
            return out + [finding("interleaved_groups", interleaved)]
        if self.needs is not None:
            for (start, end, _), ok in zip(runs, clean, strict=True):
                if ok:
                    continue
                problem = group_problem(table.slice(start, end - start), self.needs, folder_version=sid.version,
                                        newest_version=self.newest_version)
                if problem:
                    out.append(finding("untrainable_group", problem, start))
        return out

    def _add_shard(self, path: str, sid: layout.ShardId, table: pa.Table, provenance: dict, n_bytes: int,
                   violations: list[Violation], reward_sum: float,
                   runs: tuple[list[tuple[int, int, str]], str | None], clean: list[bool]) -> None:
        self.shards += 1
        self.findings += [Finding(kind=v.kind, path=path, row=v.row, trajectory_id=v.trajectory_id, message=v.message)
                          for v in violations]
        untrainable = [] if violations else self._trainer_findings(path, sid, table, provenance, *runs, clean)
        self.findings += untrainable
        self.unit_folder = self.unit_folder or layout.version_dir(sid.version)  # a work unit is one version folder
        for row, tid in enumerate(table.column("trajectory_id").to_pylist()):
            self.unit_ids.append(_id_hash(tid))
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
        for tally in (self.by_version[sid.version], self.by_worker[sid.worker_id]):
            tally.shards += 1
            tally.trajectories += table.num_rows
            tally.groups += len(spans)
            tally.bytes += n_bytes
            tally.reward_sum += reward_sum


def _id_hash(trajectory_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(trajectory_id.encode(), digest_size=8).digest(), "little")


@dataclass(frozen=True, kw_only=True)
class _Unit:
    """One version folder's shards, audited on their own (in a worker process when ``jobs`` > 1)."""

    version: int
    url: str
    storage_options: dict[str, Any]
    shards: list[tuple[layout.ShardId, str]]
    needs: TrainerNeeds | None
    newest_version: int | None
    read_ahead: int

    @property
    def digest(self) -> str:
        """What the unit's result depends on besides the newest published version: its shards (create-only, so
        their names) and the trainer's needs."""
        needs = None if self.needs is None else dataclasses.asdict(self.needs)
        text = json.dumps([[f for _, f in self.shards], needs], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _audit_unit(unit: _Unit, store: Store | None = None,
                on_shard: Callable[[int], None] = lambda n: None) -> _Accumulator:
    """The accumulator of one version folder; ``store`` is the caller's, or one opened here in a worker."""
    store = store or records.with_parents(Store(unit.url, storage_options=unit.storage_options))
    acc = _Accumulator(needs=unit.needs, newest_version=unit.newest_version)
    fetched = prefetch(store, [f for _, f in unit.shards], unit.read_ahead)

    def counted() -> Iterator[tuple[str, layout.ShardId, bytes | Missing]]:
        for (sid, _), (path, data) in zip(unit.shards, fetched, strict=True):
            yield path, sid, data
            on_shard(1)

    acc.add_shard_objects(store, counted())
    acc.first_seen.clear()  # duplicates across units go by unit_ids; the worker's result stays small
    return acc


def _audit_units(store: Store, units: list[_Unit], jobs: int,
                 on_shards: Callable[[int], None]) -> Iterator[_Accumulator]:
    """Results of ``units`` in order: in this process, or here and on ``jobs - 1`` worker processes (spawned: no
    JAX, no threads inherited). Every ``jobs``-th unit is audited here while the workers audit the others, so
    ``jobs`` processes decode and none waits idle holding memory; at most ``2 * jobs`` results wait to be merged
    (bounded memory). ``on_shards(n)`` follows progress: per shard in this process, per unit from workers."""
    if jobs == 1 or len(units) < 2:
        yield from (_audit_unit(u, store, on_shards) for u in units)
        return
    with ProcessPoolExecutor(max_workers=jobs - 1, mp_context=multiprocessing.get_context("spawn")) as pool:
        def start(i: int, unit: _Unit) -> Future | None:
            return None if i % jobs == 0 else pool.submit(_audit_unit, unit)

        todo = enumerate(units)
        window: deque[tuple[_Unit, Future | None]] = deque((u, start(i, u)) for i, u in itertools.islice(todo, 2 * jobs))
        while window:
            unit, fut = window.popleft()
            nxt = next(todo, None)
            if nxt is not None:
                window.append((nxt[1], start(*nxt)))
            if fut is None:
                yield _audit_unit(unit, store, on_shards)
                continue
            result = fut.result()
            on_shards(len(unit.shards))
            yield result


def _reusable(store: Store, kept: list[tuple[int | None, str]], newest: int | None) -> _Accumulator | None:
    """A kept result of the same shards that still holds: audited with the same newest published version, or an
    older one when it found no untrainable group (a newer pointer only allows more policy versions)."""
    for then, path in kept:
        try:
            record = AuditVersionResult.at(store, path)
        except RecordError:
            continue  # a damaged kept result is only a cache miss
        same = then == newest
        older_and_clean = (then is not None and newest is not None and then < newest
                           and not any(f["kind"] == "untrainable_group" for f in record.result["findings"]))
        if same or older_and_clean:
            return _Accumulator.from_plain(record.result)
    return None


def _keep(store: Store, unit: _Unit, result: _Accumulator) -> None:
    record = AuditVersionResult(version=unit.version, digest=unit.digest, newest_version=unit.newest_version,
                                result=result.to_plain())
    with contextlib.suppress(AlreadyExistsError):  # an earlier audit of the same shards kept it (create-only)
        record.write(store)


def _records(store: Store, paths: list[str], cls: type[R], read_ahead: int, kind: str,
             findings: list[Finding]) -> list[tuple[str, R]]:
    """Records ``cls`` at ``paths`` (in order); unreadable or invalid ones become findings of ``kind``."""
    out = []
    for path, data in prefetch(store, paths, read_ahead):
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
    for path, data in prefetch(store, paths, read_ahead):
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


def _ancestry(chain: list[tuple[Store, ForkParent]], lineage: Lineage | None) -> tuple[Ancestor, ...]:
    """A fork's parents, nearest first, each with the versions up to its fork point: the campaign's own lineage
    already runs through them (a fork is audited over its parents' history, ``records.with_parents``)."""
    published = lineage.published if lineage is not None else ()
    return tuple(Ancestor(url=p.url, step=p.step, version=p.version,
                          published=tuple(v for v in published if v.version <= p.version)) for _, p in chain)


def audit_campaign(store: Store, *, progress: Callable[[str], None] | None = None, progress_every: int = 100,
                   read_ahead: int = 8, max_listed: int = 1000, jobs: int = 1, since: int | None = None,
                   keep: bool = False, clock: Callable[[], float] = time.monotonic) -> AuditReport:
    """Audit the campaign at ``store``, one version folder per work unit on ``jobs`` processes. Raises
    ``NotACampaignError`` when it has no ``campaign.json``.

    ``keep`` writes each folder's result under ``audit/versions/`` (``AuditVersionResult``); with ``since``,
    folders below that version reuse a kept result of the same shards instead of being read again."""
    if progress_every < 1 or read_ahead < 1 or jobs < 1:
        raise ValueError(f"progress_every, read_ahead and jobs must be >= 1, got {progress_every}, {read_ahead}, "
                         f"{jobs}")
    start = clock()
    if not store.exists(layout.CAMPAIGN_JSON):
        raise NotACampaignError("audit", store.url, f"not a campaign (no {layout.CAMPAIGN_JSON})")
    acc = _Accumulator()
    try:
        chain = records.fork_chain(store)
        store = records.with_parents(store)
    except RecordError:
        chain = []  # a campaign.json that does not read: ``_campaign`` reports it below
    except ValueError as e:
        chain = []
        acc.findings.append(Finding(kind="fork_cycle", path=layout.CAMPAIGN_JSON, row=None, trajectory_id=None,
                                    message=str(e)))
    files = store.walk("")
    if progress is not None:
        progress(f"audit {store.url}: {len(files)} objects listed ({clock() - start:.1f} s)")
    temporaries = [f for f in files if TEMP_MARKER in f.rsplit("/", 1)[-1]]
    visible = [f for f in files if TEMP_MARKER not in f.rsplit("/", 1)[-1]]
    under_traj = [f for f in visible if f.startswith(layout.TRAJECTORIES + "/")]
    shards = sorted((sid, f) for f in under_traj if (sid := layout.parse_shard_path(f)) is not None)

    campaign = _campaign(store, acc.findings)
    acc.needs = _needs(campaign, acc.findings)
    # Pointer entries first: the newest published version bounds the policy versions a shard may carry.
    entries = _pointer_entries(store, [f for f in visible if f.startswith(_POINTER_ENTRIES)], read_ahead,
                               acc.findings)
    acc.newest_version = max((e.version for e in entries), default=None)

    acc.bad_files += [BadFile(path=f, kind="foreign_name", reason="not a shard name "
                              "(trajectories/v<version:08d>/<worker>-<seq:08d>[-<groups>].arrow)")
                      for f in under_traj if layout.parse_shard_path(f) is None]
    by_folder: dict[int, list[tuple[layout.ShardId, str]]] = defaultdict(list)
    for sid, f in shards:
        by_folder[sid.version].append((sid, f))
    units = [_Unit(version=version, url=store.url, storage_options=dict(store.fs.storage_options),
                   shards=folder_shards, needs=acc.needs, newest_version=acc.newest_version, read_ahead=read_ahead)
             for version, folder_shards in sorted(by_folder.items())]
    done = 0

    def on_shards(n: int) -> None:
        nonlocal done
        before, done = done, done + n
        if progress is not None and (done // progress_every > before // progress_every or done == len(shards)):
            progress(f"audit {store.url}: {done}/{len(shards)} shards read ({clock() - start:.1f} s)")

    kept = records.audit_version_results(store) if since is not None else {}
    reused = {u.version: r for u in units if since is not None and u.version < since
              and (r := _reusable(store, kept.get((u.version, u.digest), []), acc.newest_version)) is not None}
    todo = [u for u in units if u.version not in reused]
    computed = _audit_units(store, todo, jobs, on_shards)
    for unit in units:  # in version order, whichever way each result came
        if unit.version in reused:
            acc.merge(reused[unit.version])
            on_shards(len(unit.shards))
            continue
        result = next(computed)
        if keep:
            _keep(store, unit, result)
        acc.merge(result)
    if progress is not None and since is not None:
        progress(f"audit {store.url}: reused the kept results of {len(reused)} version folder(s) below {since}")

    findings = acc.findings
    consumed = [f for f in visible if f.startswith(layout.CONSUMED + "/")]
    log_paths = [f for f in consumed if layout.parse_consumed_name(f.rsplit("/", 1)[-1]) is not None]
    findings += [Finding(kind="bad_consumption_log", path=f, row=None, trajectory_id=None,
                         message="not a consumption log name (train/consumed/<step:08d>.json)")
                 for f in consumed if f not in log_paths]
    logs = _records(store, log_paths, ConsumptionLog, read_ahead, "bad_consumption_log", findings)
    lineage, lineage_findings = reconcile(acc.committed, logs, entries)
    findings += lineage_findings
    ancestry = _ancestry(chain, lineage)

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
        ancestry=ancestry,
        **dists,
    )
