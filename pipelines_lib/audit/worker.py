"""One version folder's audit, the work unit of ``campaign.audit_campaign``: its shards decoded, validated and
summarised into a small JSON result (``audit_unit``).

Run as ``python -m pipelines_lib.audit.worker`` it is a worker process of the audit: it reads units from stdin, one
JSON object a line (``unit.Unit.to_plain``), and answers each with one JSON line on stdout, ``{"result": ...}``
or ``{"error": ...}`` (``{"storage": [op, url, detail]}`` too when storage failed), then reads the next. It reads
the next unit only once it has answered the last, so the parent writes a unit only to a worker that is idle and
neither side waits on a full pipe. Anything else it prints goes to stderr.

The result is bounded: counts, value -> count distributions, findings, the committed groups lineage needs, and the
64-bit hash of each trajectory id (the merging process finds duplicates across folders by them).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import sys
import traceback
from _blake2 import blake2b  # hashlib's BLAKE2 itself; importing hashlib loads OpenSSL too (megabytes)
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines_lib import records
from pipelines_lib.audit.report import BadFile, Finding
from pipelines_lib.audit.unit import Gathered, Missing, Unit, prefetch
from pipelines_lib.storage import layout
from pipelines_lib.storage.errors import NotAnObjectError, StorageError, TooLargeError
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.codec import ShardError, check_declared_sizes, decode_shard, identity_problem
from pipelines_lib.trajectory.needs import limits_of
from pipelines_lib.trajectory.schema import SCHEMA_VERSION_KEY, SchemaVersionError
from pipelines_lib.trajectory.trainable import TrainerNeeds, clean_groups, group_problem, group_runs
from pipelines_lib.trajectory.validate import Violation, validate_tables

BATCH_SHARDS = 64
"""Decoded shards checked together (``validate_tables``, ``shard_figures``): bounds a work unit's memory."""


@dataclass(frozen=True, kw_only=True)
class ShardFigures:
    """One value per trajectory (row order) plus counters, for one shard."""

    reward: np.ndarray
    tokens: np.ndarray
    """Sequence length (prompt, generated, tool and env tokens)."""
    generated_tokens: np.ndarray
    """Tokens under the loss mask: what the policy generated."""
    turns: np.ndarray
    statuses: Counter[str]
    tool_calls: Counter[str]
    """Tool turns by tool name."""
    tool_errors: Counter[tuple[str, str]]
    """(tool name, error kind) of tool turns that record an error."""


def _per_row_sum(col: pa.ChunkedArray, n_rows: int) -> np.ndarray:
    arr = col.combine_chunks()
    values = pc.list_flatten(arr).to_numpy(zero_copy_only=False).astype(np.float64)
    parents = pc.list_parent_indices(arr).to_numpy(zero_copy_only=False)
    return np.bincount(parents, weights=values, minlength=n_rows)


def _lengths(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int64)


def shard_figures(table: pa.Table) -> ShardFigures:
    n = table.num_rows
    turns = table.column("turns").combine_chunks()
    flat_turns = pc.list_flatten(turns)
    is_tool = pc.equal(flat_turns.field("role"), "tool")
    tool_names = pc.filter(flat_turns.field("tool_name"), is_tool).to_pylist()
    errors = pc.filter(flat_turns.field("error"), is_tool).to_pylist()
    return ShardFigures(
        reward=table.column("reward").to_numpy().astype(np.float64),
        tokens=_lengths(table.column("tokens")),
        generated_tokens=_per_row_sum(table.column("loss_mask"), n).astype(np.int64),
        turns=_lengths(turns),
        statuses=Counter(table.column("status").fill_null("(null)").to_pylist()),  # a null is a null_value finding
        tool_calls=Counter(name or "?" for name in tool_names),
        tool_errors=Counter((name or "?", err) for name, err in zip(tool_names, errors, strict=True) if err),
    )


def _version_label(raw: bytes | None) -> str:
    """The schema-version metadata as the report shows it: any bytes, as text when they are printable text, else
    as their Python literal (a report line must not carry control bytes; ``check_schema`` refuses such shards)."""
    if not raw:
        return "none"
    text = raw.decode(errors="replace")
    return text if text.isprintable() and "\ufffd" not in text else repr(raw)


def _id_hash(trajectory_id: str) -> int:
    return int.from_bytes(blake2b(trajectory_id.encode(), digest_size=8).digest(), "little")


@dataclass(kw_only=True)
class UnitAudit(Gathered):
    """Everything gathered shard by shard in one version folder (``folder``)."""

    folder: str
    needs: TrainerNeeds | None
    newest_version: int | None
    committed: list[tuple[str, str, int, str, int, int, bool]] = field(default_factory=list)
    """(shard, group id, version, prompt id, first row, end row, usable) of each committed group."""
    first_seen: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Trajectory id -> (shard, row) within this folder."""
    ids: list[int] = field(default_factory=list)
    """64-bit hash of each trajectory id of this folder."""
    shards: int = 0

    def to_plain(self) -> dict[str, Any]:
        """The unit's result as JSON (``AuditVersionResult.result``; ``campaign`` merges it)."""
        hashes = np.unique(np.array(self.ids, np.uint64))
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
            "committed": [list(row) for row in self.committed],
            "id_hashes": base64.b64encode(hashes.tobytes()).decode(),
            "id_folder": self.folder,
            "shards": self.shards,
        }

    def add_shard_objects(self, store: Store, shards: Iterable[tuple[str, layout.ShardId, bytes | Missing]]) -> None:
        """Fold in ``(path, shard id, fetched object)`` in order, ``BATCH_SHARDS`` decoded shards at a time."""
        batch: list[tuple[str, layout.ShardId, pa.Table, dict, int]] = []
        for path, sid, data in shards:
            if isinstance(data, TooLargeError):
                self.bad_files.append(BadFile(path=path, kind="oversized", reason=str(data)))
            elif isinstance(data, NotAnObjectError):
                self.bad_files.append(BadFile(path=path, kind="not_a_file", reason=str(data)))
            elif isinstance(data, StorageError):
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
        limits = limits_of(self.needs)
        try:
            # The common case decodes once; the schema is opened on its own only to classify a failure.
            decoded = decode_shard(data, uri, validate=False, limits=limits)
            failure = None
        except ShardError as e:
            decoded, failure = None, e
        try:
            meta = (decoded[0].schema if decoded else pa.ipc.open_file(pa.BufferReader(data)).schema).metadata or {}
        except (pa.ArrowInvalid, OSError) as e:
            self.bad_files.append(BadFile(path=path, kind="unreadable", reason=f"not an Arrow IPC file ({e})"))
            return None
        raw_version = meta.get(SCHEMA_VERSION_KEY)
        self.schema_versions[_version_label(raw_version)] += 1
        if failure is None:
            return decoded
        try:
            check_declared_sizes(data, uri, limits=limits)
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
        for row, tid in enumerate(table.column("trajectory_id").to_pylist()):
            if tid is None:  # a null_value finding already names the row
                continue
            self.ids.append(_id_hash(tid))
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
            self.committed.append((path, gid, sid.version, prompts[gid], first_row, last_row + 1,
                                   not violations and not untrainable))
        for tally in (self.by_version[sid.version], self.by_worker[sid.worker_id]):
            tally.shards += 1
            tally.trajectories += table.num_rows
            tally.groups += len(spans)
            tally.bytes += n_bytes
            tally.reward_sum += reward_sum




def audit_unit(unit: Unit, store: Store | None = None,
               on_shard: Callable[[int], None] = lambda n: None) -> dict[str, Any]:
    """The result of one version folder (``UnitAudit.to_plain``); ``store`` is the caller's, or one opened here in a
    worker process. ``on_shard(1)`` follows each shard."""
    if store is None:
        store = Store(unit.url, storage_options=unit.storage_options)
        store = records.with_parents(store) if unit.over_parents else store
    acc = UnitAudit(folder=unit.folder, needs=unit.needs, newest_version=unit.newest_version)

    def fetched() -> Iterator[tuple[str, layout.ShardId, bytes | Missing]]:
        for path, data in prefetch(store, unit.shards, unit.read_ahead, max_bytes=limits_of(unit.needs).max_file_bytes):
            sid = layout.parse_shard_path(path)
            if sid is None:
                raise ValueError(f"audit unit {unit.folder}: {path} is not a shard name")
            yield path, sid, data
            on_shard(1)

    acc.add_shard_objects(store, fetched())
    return acc.to_plain()


def _answer(line: bytes) -> dict[str, Any]:
    try:
        return {"result": audit_unit(Unit.from_plain(json.loads(line)))}
    except StorageError as e:
        return {"error": str(e), "storage": [e.op, e.url, str(e).removeprefix(f"storage {e.op} {e.url}: ")]}
    except Exception as e:  # noqa: BLE001 - reported to the parent, which stops the audit naming the unit
        traceback.print_exc(file=sys.stderr)
        return {"error": f"{type(e).__name__}: {e}"}


def main() -> None:
    """The worker loop: one unit a line on stdin, one answer a line on stdout, until stdin closes."""
    for line in sys.stdin.buffer:
        sys.stdout.write(json.dumps(_answer(line), separators=(",", ":")) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
