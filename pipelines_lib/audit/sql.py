"""SQL over a campaign folder: DuckDB on the campaign's shards, consumption logs and evaluations.

``campaign_tables`` opens the folder (local or ``gs://``) as tables that DuckDB queries in place::

    trajectories   one row per trajectory: every shard column (``version`` is the group's policy version),
                   plus ``shard`` (path in the folder) and ``campaign`` (the campaign id)
    consumed       one row per group a train step used: step, trainer_version, group_id, shard, version, staleness
    dropped        one row per group the trainer dropped or skipped: step, kind (dropped_stale | skipped), shard,
                   group_id (null for a skipped shard, or for a shard dropped unopened that did not read), reason
    evals          one row per ``eval/vN.json``: version, greedy_success_rate, pass@k (as ``pass_at_k``), tasks, k
    skipped_shards shards that did not read or validate: shard, reason (they are left out of ``trajectories``)

A shard that does not read (truncated, foreign, newer major schema) is skipped and listed, never fatal: an
auditor still gets answers from the rest. To know which, every shard is decoded and validated once when the
folder is opened, a batch at a time, and dropped. Without a verdict folder, ``trajectories`` is then a
``pyarrow.dataset`` over the readable shard files, not a table in memory: a query reads the files again, only the
columns it names (projection pushdown), and a filter on ``shard``, ``campaign`` or a shard column reaches the scan
(filter pushdown; ``shard`` and ``campaign`` are each file's partition expression, so a filter on them skips files
unopened). Given a verdict folder (``rollstream sql`` passes one in the user's cache), the rows of each local shard
judged valid are written there as they are checked, in a few large Arrow files (``audit.verdicts``), and
``trajectories`` scans those, memory-mapped: a shard judged valid by an earlier query and unchanged since is
neither decoded nor opened again, so a repeat query over an unchanged campaign reads one file per kept segment
instead of one per shard (``audit.verdicts`` says why a kept verdict cannot hide a changed shard). Memory stays
that of a batch plus DuckDB's working set and the pages of the columns a query reads: the ``sql`` benchmark's
``sql.rss_mb_20k_shards`` (peak RSS of a process opening a 20 k-shard campaign and running a query over every
row, interpreter and libraries included) is a fraction of what reading every shard into one table took on the
same campaign. The other tables are small and built in memory. The rows scanned are the bytes checked: kept rows
are the decoded ones, and shards are create-only; a storage error during the scan fails the query (the check's
reads are retried, the scan's are not).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from pipelines_lib import records
from pipelines_lib.audit.unit import Missing, prefetch
from pipelines_lib.audit.verdicts import SegmentWriter, identity, load_segments, plan_reuse
from pipelines_lib.records import ConsumptionLog, EvalResult
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.codec import DEFAULT_LIMITS, decode_shards
from pipelines_lib.trajectory.schema import MINOR_ADDITIONS, SCHEMA_VERSION_KEY, TRAJECTORY_SCHEMA

CONSUMED_SCHEMA = pa.schema([("step", pa.int64()), ("trainer_version", pa.int64()), ("group_id", pa.string()),
                             ("shard", pa.string()), ("version", pa.int64()), ("staleness", pa.int64())])
DROPPED_SCHEMA = pa.schema([("step", pa.int64()), ("kind", pa.string()), ("shard", pa.string()),
                            ("group_id", pa.string()), ("reason", pa.string())])
EVALS_SCHEMA = pa.schema([("version", pa.int64()), ("greedy_success_rate", pa.float64()), ("pass_at_k", pa.float64()),
                          ("tasks", pa.int64()), ("k", pa.int64())])
SKIPPED_SCHEMA = pa.schema([("shard", pa.string()), ("reason", pa.string())])
TRAJECTORIES_SCHEMA = TRAJECTORY_SCHEMA.append(pa.field("shard", pa.string(), nullable=False)).append(
    pa.field("campaign", pa.string(), nullable=False))
SCAN_BATCH_SHARDS = 256
SCAN_BATCH_BYTES = 64 * 2**20
"""Shards checked together when the folder is opened: ``decode_shards`` validates a batch in one pass (per-call
overheads dominate a small shard), and the batch's file bytes bound what the check holds at once."""
SCAN_READ_AHEAD = 8
"""Objects of a bucket fetched at once while checking (``unit.prefetch``; a local folder is read inline)."""
SCAN_PROGRESS_EVERY = 100
KEPT_SEGMENTS = 8
"""Segments of kept rows per campaign before the next write merges them into one (``audit.verdicts``): a repeat
query scans at most this many files, plus the shards it checks."""
CONNECT_CONFIG = {"autoinstall_known_extensions": False, "autoload_known_extensions": False,
                  "allow_community_extensions": False}
"""What the connection starts with: no extension is fetched or loaded behind a query's back."""
READ_ONLY = (
    # No progress bar: DuckDB draws it on stdout once a query runs for 2 s, into ``rollstream sql --json``.
    "SET enable_progress_bar = false",
    "SET enable_external_access = false",
    "SET lock_configuration = true",
)
"""Run after the tables are registered (registering needs neither): no file, database, network or extension for
the query, and no ``SET`` that turns it back on."""
LAST_ADDITION = max(MINOR_ADDITIONS.values())
"""A shard of this minor or newer holds every column in its file; an older one's reader derives some."""


@dataclass(frozen=True, kw_only=True)
class CampaignTables:
    """The campaign as named tables (see the module docstring for their columns): ``trajectories`` a lazy
    ``pyarrow.dataset``, the others Arrow tables."""

    tables: dict[str, pa.Table | ds.Dataset]

    @property
    def skipped(self) -> list[tuple[str, str]]:
        t = self.tables["skipped_shards"]
        return list(zip(t.column("shard").to_pylist(), t.column("reason").to_pylist(), strict=True))

    def query(self, sql: str) -> pa.Table:
        """Run ``sql`` in a fresh in-memory DuckDB that sees every table by name and nothing else: once the tables
        are registered, external access is switched off and the configuration locked (``READ_ONLY``), so a query
        cannot read or write a file (``COPY ... TO``, ``read_csv``, ``ATTACH``, ``EXPORT``) or install or load an
        extension; such a query raises ``QueryRefused``."""
        import duckdb  # imported here: only ``rollstream sql`` and the viewer pay for it

        con = duckdb.connect(":memory:", config=dict(CONNECT_CONFIG))
        try:
            for name, table in self.tables.items():
                con.register(name, table)
            for statement in READ_ONLY:
                con.execute(statement)
            try:
                return con.sql(sql).to_arrow_table()
            except duckdb.PermissionException as e:
                raise QueryRefused(f"refused: a query over a campaign reads only its tables ({', '.join(self.tables)})"
                                   f"; files, ATTACH, COPY and extensions are off: {e}") from e
        finally:
            con.close()


class QueryRefused(ValueError):
    """A query asked for something outside the campaign's tables (a file, a database, an extension)."""


def shard_paths(store: Store) -> list[str]:
    """Every shard name in the campaign folder, in version, worker, seq order."""
    out: list[tuple[layout.ShardId, str]] = []  # each name parsed once: a repeat query pays this per shard
    for folder in store.list(layout.TRAJECTORIES):
        if layout.parse_version_dir(folder) is None:
            continue
        for n in store.list(f"{layout.TRAJECTORIES}/{folder}"):
            if (shard := layout.parse_shard_path(p := f"{layout.TRAJECTORIES}/{folder}/{n}")) is not None:
                out.append((shard, p))
    return [p for _, p in sorted(out, key=lambda parsed: parsed[0])]


@dataclass(frozen=True, kw_only=True)
class ScannedShards:
    """What ``scan_trajectories`` found: the readable shards as one lazy dataset, the others, and the groups of
    the shards it was asked to list."""

    dataset: ds.Dataset
    """``TRAJECTORIES_SCHEMA``; scanning it reads the shard files again, only the columns and shards asked for."""
    skipped: list[tuple[str, str]]
    """(shard, reason) of each shard that did not read or validate."""
    groups_of: dict[str, list[str]]
    """Group ids of each shard named in ``list_groups``, in row order."""


class _WholeObjects(pafs.FSSpecHandler):
    """A bucket under pyarrow, each object fetched in one request when the scan opens it: a request costs more
    than a shard's bytes, and gcsfs's default (adaptive prefetching) leaves a background task per file behind."""

    def open_input_file(self, path: str) -> pa.PythonFile:
        return pa.PythonFile(self.fs.open(path, mode="rb", cache_type="all"), mode="r")


def _filesystem(store: Store) -> pafs.FileSystem:
    if store.local_path() is not None:
        return pafs.LocalFileSystem()
    return pafs.PyFileSystem(_WholeObjects(store.fs))


def _decoded(store: Store, batch: list[tuple[str, bytes | Missing]]) -> Iterator[tuple[str, pa.Table | Exception]]:
    """``(path, decoded table or why not)`` of each shard of ``batch``, decoded and validated together."""
    readable = [(path, data) for path, data in batch if isinstance(data, bytes)]
    decoded = iter(decode_shards([(data, store.uri(path)) for path, data in readable]))
    for path, data in batch:
        got = next(decoded) if isinstance(data, bytes) else data
        yield path, got if isinstance(got, Exception) else got[0]


def _checked(store: Store, paths: list[str]) -> Iterator[tuple[str, pa.Table | Exception]]:
    """``_decoded`` of every shard, ``SCAN_BATCH_SHARDS`` or ``SCAN_BATCH_BYTES`` of files at a time."""
    batch: list[tuple[str, bytes | Missing]] = []
    size = 0
    for path, data in prefetch(store, paths, SCAN_READ_AHEAD, max_bytes=DEFAULT_LIMITS.max_file_bytes):
        batch.append((path, data))
        size += len(data) if isinstance(data, bytes) else 0
        if len(batch) >= SCAN_BATCH_SHARDS or size >= SCAN_BATCH_BYTES:
            yield from _decoded(store, batch)
            batch, size = [], 0
    yield from _decoded(store, batch)


def _minor(table: pa.Table) -> int:
    """The minor schema version a decoded shard was written with (``check_schema`` accepted it)."""
    return int(table.schema.metadata[SCHEMA_VERSION_KEY].split(b".")[1])


def _rows(table: pa.Table, shard: str, campaign: str) -> pa.Table:
    """A decoded shard's rows as ``trajectories`` holds them (cast only when its columns differ: a cast per shard
    costs more than decoding it)."""
    n = table.num_rows
    rows = (table.append_column(TRAJECTORIES_SCHEMA.field("shard"), pa.array([shard] * n, pa.string()))
            .append_column(TRAJECTORIES_SCHEMA.field("campaign"), pa.array([campaign] * n, pa.string())))
    return (rows.replace_schema_metadata(TRAJECTORIES_SCHEMA.metadata) if rows.schema.equals(TRAJECTORIES_SCHEMA)
            else rows.cast(TRAJECTORIES_SCHEMA))


def _groups_of(dataset: ds.Dataset, shards: Collection[str]) -> dict[str, list[str]]:
    """Group ids of each of ``shards`` in ``dataset``, in row order."""
    if not shards:
        return {}
    rows = dataset.to_table(columns=["shard", "group_id"], filter=ds.field("shard").isin(list(shards)))
    out: dict[str, dict[str, None]] = {}
    for shard, group in zip(rows.column("shard").to_pylist(), rows.column("group_id").to_pylist(), strict=True):
        out.setdefault(shard, {})[group] = None
    return {shard: list(groups) for shard, groups in out.items()}


def scan_trajectories(store: Store, *, progress: Callable[[str], None] | None = None,
                      list_groups: Collection[str] = (), verdicts: Path | None = None) -> ScannedShards:
    """Check every shard (``decode_shards``, a batch at a time, then dropped) and return the readable ones as a
    dataset over their files. A shard of an older minor (lacking a column its reader derives) is held in memory:
    only its decoded form has every column. With ``verdicts`` (a folder of the user's cache), the rows of each shard
    judged valid are kept there, and a shard judged valid by an earlier scan and unchanged since is neither decoded
    nor opened again: the dataset scans its kept rows (``audit.verdicts``)."""
    campaign = layout.campaign_id(store.url)
    skipped: list[tuple[str, str]] = []
    files: dict[Store, list[tuple[str, str]]] = {}  # holder -> (its path of the file, shard), in shard order
    tables: list[pa.Table] = []  # rows not scanned from a shard file: kept segments, older minors decoded
    paths = shard_paths(store)
    ids = {p: identity(store.holder(p), p) for p in paths} if verdicts is not None else {}
    reuse = plan_reuse(load_segments(verdicts, store.url, TRAJECTORIES_SCHEMA) if verdicts is not None else [], ids,
                       max_segments=KEPT_SEGMENTS)
    kept = {p for s in reuse.whole for p in s.shards} | reuse.carried.keys()
    unjudged = [p for p in paths if p not in kept]
    if progress is not None and kept:
        progress(f"{len(kept)} of {len(paths)} shards unchanged since judged valid; checking {len(unjudged)}")
    with contextlib.ExitStack() as stack:
        writer = (stack.enter_context(SegmentWriter(verdicts, store.url, TRAJECTORIES_SCHEMA))
                  if verdicts is not None and reuse.changed else None)
        if writer is not None:
            writer.carry(reuse.carried)
        for done, (path, table) in enumerate(_checked(store, unjudged), 1):
            if progress is not None and done % SCAN_PROGRESS_EVERY == 0:
                progress(f"read {done}/{len(unjudged)} shards")
            if isinstance(table, Exception):
                skipped.append((path, str(table)))
                if progress is not None:
                    progress(f"skipped {path}: {table}")
            elif writer is not None and (ident := ids.get(path)) is not None:
                writer.add(path, ident, _rows(table, path, campaign))
            elif _minor(table) >= LAST_ADDITION:  # the file has every column
                holder = store.holder(path)
                files.setdefault(holder, []).append((holder.object_path(path), path))
            else:
                tables.append(_rows(table, path, campaign))
        new = writer.commit(reuse.whole) if writer is not None else None
    tables += [s.rows for s in reuse.whole] + ([new.rows] if new is not None else [])
    shard_field, same_campaign = ds.field("shard"), ds.field("campaign") == campaign
    parts = [ds.FileSystemDataset.from_paths(
        [file for file, _ in shards], schema=TRAJECTORIES_SCHEMA, format=ds.IpcFileFormat(),
        filesystem=_filesystem(holder),
        # Each file's shard and campaign as its partition expression: the scan fills both columns in, and a
        # filter on them skips the other files unopened.
        partitions=[(shard_field == shard) & same_campaign for _, shard in shards])
        for holder, shards in files.items()]
    if tables or not parts:
        parts.append(ds.dataset(pa.concat_tables(tables) if tables else TRAJECTORIES_SCHEMA.empty_table()))
    dataset = ds.dataset(parts) if len(parts) > 1 else parts[0]
    return ScannedShards(dataset=dataset, skipped=skipped, groups_of=_groups_of(dataset, list_groups))


def _log_rows(logs: list[ConsumptionLog], groups_of: dict[str, list[str]]) -> tuple[list[dict], list[dict]]:
    """Rows of ``consumed`` and ``dropped``; a shard dropped unopened names no group, so its groups are the ones
    the shard holds (``groups_of``)."""
    consumed, dropped = [], []
    for log in logs:
        consumed += [{"step": log.step, "trainer_version": log.trainer_version, "group_id": g.group_id,
                      "shard": g.shard, "version": g.version, "staleness": g.staleness} for g in log.groups]
        for d in log.dropped_stale:
            dropped += [{"step": log.step, "kind": "dropped_stale", "shard": d.shard, "group_id": gid,
                         "reason": d.reason}
                        for gid in (d.groups or groups_of.get(d.shard) or [None])]
        for s in log.skipped:
            dropped += [{"step": log.step, "kind": "skipped", "shard": s.shard, "group_id": gid, "reason": s.reason}
                        for gid in (s.groups or [None])]
    return consumed, dropped


def _eval_row(result: EvalResult) -> dict:
    return {"version": result.version, "greedy_success_rate": result.greedy_success_rate,
            "pass_at_k": result.pass_at_k, "tasks": result.tasks, "k": result.k}


def campaign_tables(store: Store, *, progress: Callable[[str], None] | None = None,
                    verdicts: Path | None = None) -> CampaignTables:
    """Read the campaign at ``store`` (a fork over its parents' history) into the tables ``rollstream sql`` and the
    viewer query; ``verdicts``: the folder where shard verdicts are kept between calls (``scan_trajectories``)."""
    store = records.with_parents(store)
    logs = records.consumption_logs(store)
    scanned = scan_trajectories(store, progress=progress, verdicts=verdicts,
                                list_groups={d.shard for log in logs for d in log.dropped_stale if not d.groups})
    consumed, dropped = _log_rows(logs, scanned.groups_of)
    evals = [_eval_row(EvalResult.read(store, v)) for v in records.evaluated_versions(store)]
    return CampaignTables(tables={
        "trajectories": scanned.dataset,
        "consumed": pa.Table.from_pylist(consumed, schema=CONSUMED_SCHEMA),
        "dropped": pa.Table.from_pylist(dropped, schema=DROPPED_SCHEMA),
        "evals": pa.Table.from_pylist(sorted(evals, key=lambda r: r["version"]), schema=EVALS_SCHEMA),
        "skipped_shards": pa.Table.from_pylist([{"shard": s, "reason": r} for s, r in scanned.skipped],
                                             schema=SKIPPED_SCHEMA),
    })


def render_text(table: pa.Table, *, max_rows: int = 200) -> str:
    """An aligned text table of the first ``max_rows`` rows (floats to 4 significant digits)."""
    def cell(v: Any) -> str:
        return "NULL" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)

    rows = [[cell(v) for v in r.values()] for r in table.slice(0, max_rows).to_pylist()]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(table.column_names)]
    lines = ["  ".join(n.ljust(w) for n, w in zip(table.column_names, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    if table.num_rows > max_rows:
        lines.append(f"... {table.num_rows - max_rows} more rows")
    return "\n".join(line.rstrip() for line in lines)
