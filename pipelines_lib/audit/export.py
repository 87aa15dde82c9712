"""Export committed, valid shards as one Parquet dataset for warehouse tools (BigQuery, DuckDB, Spark).

The dataset is partitioned by policy version, hive style: ``out/version=<N>/data.parquet`` holds every row of
version folder N's shards that read and validate (in shard-name order), without the ``version`` column, which is
the partition key (``pyarrow.dataset.dataset(out, partitioning="hive")`` and the warehouses read it back from
the path); shards that do not validate, or whose rows are of another version than their folder, are left out and
listed in the result. The file's
key-value metadata ``rollstream.export`` records the shards listed when it was written, so a rerun is cheap
and safe: the same listing means the file is ``unchanged`` (nothing is read); a version that gained shards
since is reported ``stale`` and left alone, because exports are create-only like everything else: export a
still-growing campaign into a new folder. Rows carry the shard columns plus ``campaign`` (the campaign id), so
exports of several campaigns can be queried together. A file of that name that is not such an export (anything
else someone left in the folder) is reported ``foreign`` and left alone too. Each run ends with one line on what it did (``summary``: new shards and rows, what
was already exported) and the dataset card beside the files (``audit.card``: the columns' meanings, counts per
version, lineage, the audit's verdict, the config hash). ``timings``' start and finish, ISO-8601 text in a shard,
are Arrow timestamps (UTC, microseconds) in the export; a shard whose times do not parse is skipped with that reason.

Each version's file is streamed: shards are fetched ``read_ahead`` at a time (``unit.prefetch``), decoded
and validated ``BATCH_SHARDS`` at a time (``codec.decode_shards``), and their rows go out in row groups of up to
``ROW_GROUP_ROWS`` rows as they are read, so a version costs one pass and memory for one row group plus the
compressed file. Versions are independent work units, exported on
``jobs`` worker processes (spawned) when there are several.

A group is exported once: a shard whose content was written under another name (a copy, see
``codec.identity_problem``) is skipped with that reason, and so is a shard repeating a group id already
exported from the same version.

Why not ``pyarrow.dataset.write_dataset`` with hive partitioning (checked on pyarrow 26.0.1): it writes each
partition's file in place through the filesystem, so a killed export leaves a partial ``version=N/part-0.parquet``
that readers take as data (here the file is built first and committed by ``Store.create``: a temporary and a link
locally, ``ifGenerationMatch=0`` on GCS); its only create-only mode (``existing_data_behavior="error"``) refuses
the whole folder once any file is in it, and ``overwrite_or_ignore`` rewrites an existing partition file silently,
so the per-version ``unchanged``/``stale``/``foreign`` rerun above is not expressible; and it takes one schema's
metadata for every file, not each version's list of source shards. The partitioning it would give is only the
folder name ``version=N``; this writer's cost a shard is recorded as ``storage_scale.export_ms_per_shard_20k``
in bench/results.json, and the tests read its output back with ``pyarrow.dataset`` and DuckDB's ``read_parquet``
(``hive_partitioning``).
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines_lib import records
from pipelines_lib.audit.card import write_card
from pipelines_lib.audit.unit import prefetch
from pipelines_lib.storage import layout
from pipelines_lib.storage.destination import refuse_inside
from pipelines_lib.storage.errors import AlreadyExistsError, NotAnObjectError, StorageError
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.codec import DEFAULT_LIMITS, ShardError, decode_shards, identity_problem
from pipelines_lib.trajectory.schema import (
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    TIMINGS_TYPE,
    TRAJECTORY_SCHEMA,
)

EXPORT_META_KEY = b"rollstream.export"
PARTITION_KEY = "version"
TIMESTAMPS = ("started_at", "finished_at")
"""``timings`` fields that shards keep as ISO-8601 text (``trajectory.schema``) and the export as Arrow timestamps."""
_TIMINGS = pa.struct([pa.field(f.name, pa.timestamp("us", tz="UTC"), nullable=False) if f.name in TIMESTAMPS else f
                      for f in TIMINGS_TYPE])
EXPORT_SCHEMA = pa.schema(
    [pa.field("timings", _TIMINGS, nullable=False, metadata={
        b"doc": b"seconds spent per phase; start and finish as UTC timestamps (microseconds)"})
     if f.name == "timings" else f for f in TRAJECTORY_SCHEMA if f.name != PARTITION_KEY]
    + [pa.field("campaign", pa.string(), nullable=False,
                metadata={b"doc": b"campaign id: the name of the campaign folder the row was written into"})],
    metadata=TRAJECTORY_SCHEMA.metadata)
"""The shard columns but the partition key (with ``timings``' start and finish as timestamps), and the campaign
id; each field's ``doc`` metadata says what it means (the dataset card lists them)."""
BATCH_SHARDS = 64
"""Shards decoded and validated together (``decode_shards``)."""
ROW_GROUP_ROWS = 2**16
"""Rows per Parquet row group at most; small shards are gathered into one (a row group per tiny shard makes
the file's metadata, and its writing, cost more than its rows)."""
EXPORT_STATUSES = ("written", "unchanged", "stale", "empty", "foreign")
"""``written`` now; ``unchanged``: an earlier export of the same shards exists; ``stale``: an earlier export
exists but the version has other shards now (left as it was); ``empty``: no valid shard, no file;
``foreign``: a file that is not an export of ours has the name (left as it was)."""


@dataclass(frozen=True, kw_only=True)
class ExportedVersion:
    version: int
    path: str
    """Relative to the output folder."""
    status: str
    """One of ``EXPORT_STATUSES``."""
    rows: int
    shards: int
    """Shards whose rows are in the file (``written`` now, or by an earlier export: ``unchanged``, ``stale``)."""
    skipped: tuple[tuple[str, str], ...]
    """(shard, reason) of shards left out because they do not read or validate."""

    def __post_init__(self) -> None:
        if self.status not in EXPORT_STATUSES:
            raise ValueError(f"ExportedVersion.status must be one of {EXPORT_STATUSES}, got {self.status!r}")


def parquet_name(version: int) -> str:
    """A version's file in the dataset: its hive partition folder."""
    return f"{PARTITION_KEY}={version}/data.parquet"


def _listed_shards(store: Store, version: int) -> list[str]:
    folder = layout.version_dir(version)
    return [f"{folder}/{n}" for n in store.list(folder) if layout.parse_shard_path(f"{folder}/{n}") is not None]


def _recorded(out: Store, name: str) -> tuple[list[str], int, int] | None:
    """(shards listed, rows, shards exported) of an earlier export; None when the file is not an export of ours."""
    try:
        meta = pq.read_metadata(io.BytesIO(out.read(name)))
        recorded = json.loads((meta.metadata or {})[EXPORT_META_KEY])
        listed, skipped = recorded["source_shards"], recorded["skipped"]
    except (NotAnObjectError, pa.ArrowException, OSError, KeyError, TypeError, ValueError):
        return None
    if not isinstance(listed, list) or not isinstance(skipped, list):
        return None
    return [str(s) for s in listed], meta.num_rows, len(listed) - len(skipped)


def _export_version(store: Store, out: Store, version: int, read_ahead: int = 8) -> ExportedVersion:
    name = parquet_name(version)
    listed = _listed_shards(store, version)
    if out.exists(name):
        recorded = _recorded(out, name)
        if recorded is None:
            return ExportedVersion(version=version, path=name, status="foreign", rows=0, shards=0, skipped=())
        shards_then, rows, exported = recorded
        return ExportedVersion(version=version, path=name, status="unchanged" if shards_then == listed else "stale",
                               rows=rows, shards=exported, skipped=())
    sink = io.BytesIO()
    skipped: list[tuple[str, str]] = []
    exported_groups: set[str] = set()
    rows = shards = 0
    campaign = layout.campaign_id(store.url)
    pending: list[pa.Table] = []
    with pq.ParquetWriter(sink, EXPORT_SCHEMA, compression="zstd") as writer:
        objects = prefetch(store, listed, read_ahead, max_bytes=DEFAULT_LIMITS.max_file_bytes)
        while batch := list(itertools.islice(objects, BATCH_SHARDS)):
            fetched = [(path, data) for path, data in batch if not isinstance(data, StorageError)]
            skipped += [(path, str(data)) for path, data in batch if isinstance(data, StorageError)]
            for (path, _), decoded in zip(fetched, decode_shards([(d, store.uri(p)) for p, d in fetched]), strict=True):
                if isinstance(decoded, ShardError):
                    skipped.append((path, str(decoded)))
                    continue
                table, provenance = decoded
                groups = set(table.column("group_id").to_pylist())
                problem = identity_problem(path, provenance, groups=len(groups)) or (
                    f"group(s) {sorted(groups & exported_groups)[:3]} already exported from another shard"
                    if groups & exported_groups else None) or (
                    f"rows of version(s) {sorted(others)}, filed under {layout.version_dir(version)}"
                    if (others := set(table.column(PARTITION_KEY).to_pylist()) - {version}) else None)
                if problem is not None:
                    skipped.append((path, f"{store.uri(path)}: {problem}"))
                    continue
                try:
                    exported = (table.drop_columns([PARTITION_KEY])
                                .append_column(EXPORT_SCHEMA.field("campaign"),
                                               pa.array([campaign] * table.num_rows, pa.string()))
                                .cast(EXPORT_SCHEMA))
                except pa.ArrowException as e:  # a start or finish that is no ISO-8601 time
                    skipped.append((path, f"{store.uri(path)}: timings are not ISO-8601 times: {e}"))
                    continue
                exported_groups |= groups
                pending.append(exported)
                rows += table.num_rows
                shards += 1
                if sum(t.num_rows for t in pending) >= ROW_GROUP_ROWS:
                    writer.write_table(pa.concat_tables(pending), row_group_size=ROW_GROUP_ROWS)
                    pending = []
        if pending:
            writer.write_table(pa.concat_tables(pending), row_group_size=ROW_GROUP_ROWS)
        writer.add_key_value_metadata({
            SCHEMA_VERSION_KEY: SCHEMA_VERSION.encode(),
            EXPORT_META_KEY: json.dumps({"campaign": store.url, "version": version, "source_shards": listed,
                                         "skipped": [s for s, _ in skipped]}).encode(),
        })
    if shards == 0:
        return ExportedVersion(version=version, path=name, status="empty", rows=0, shards=0, skipped=tuple(skipped))
    try:
        out.create(name, sink.getvalue())
    except AlreadyExistsError:
        # A concurrent export won the name; judge its file like any earlier one.
        return _export_version(store, out, version, read_ahead)
    return ExportedVersion(version=version, path=name, status="written", rows=rows, shards=shards,
                           skipped=tuple(skipped))


def _export_in_worker(url: str, options: dict[str, Any], out_url: str, out_options: dict[str, Any], version: int,
                      read_ahead: int) -> ExportedVersion:
    return _export_version(records.with_parents(Store(url, storage_options=options)),
                           Store(out_url, storage_options=out_options), version, read_ahead)


def _exported(store: Store, out: Store, versions: list[int], jobs: int, read_ahead: int) -> Iterator[ExportedVersion]:
    if jobs == 1 or len(versions) < 2:
        yield from (_export_version(store, out, v, read_ahead) for v in versions)
        return
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        n = len(versions)
        yield from pool.map(_export_in_worker, [store.url] * n, [dict(store.storage_options)] * n, [out.url] * n,
                            [dict(out.storage_options)] * n, versions, [read_ahead] * n)


def export_parquet(store: Store, out: Store, *, progress: Callable[[str], None] | None = None, jobs: int = 1,
                   read_ahead: int = 8) -> list[ExportedVersion]:
    """Export every version folder of the campaign at ``store`` into the folder ``out``, ``jobs`` versions at a
    time on worker processes (results in version order). A fork is exported over its parents' history (the
    parent's versions up to the fork point, as its trainer saw them)."""
    if jobs < 1 or read_ahead < 1:
        raise ValueError(f"export_parquet: jobs and read_ahead must be >= 1, got {jobs}, {read_ahead}")
    refuse_inside(out.url, records.read_folders(store), what="the export folder")
    store = records.with_parents(store)
    versions = sorted(v for n in store.list(layout.TRAJECTORIES) if (v := layout.parse_version_dir(n)) is not None)
    results = []
    for version, result in zip(versions, _exported(store, out, versions, jobs, read_ahead), strict=True):
        results.append(result)
        if progress is not None:
            done = "written" if result.status == "written" else f"{result.status}, already exported"
            progress(f"export {store.uri(layout.version_dir(version))} -> {out.uri(result.path)}: {done}: "
                     f"{result.rows} rows from {result.shards} shards, {len(result.skipped)} skipped")
    card = write_card(store, out, [dataclasses.asdict(r) for r in results], EXPORT_SCHEMA,
                      partition=TRAJECTORY_SCHEMA.field(PARTITION_KEY))
    if progress is not None:
        progress(f"{summary(results)}; card {out.uri(card)}")
    return results


def summary(results: list[ExportedVersion]) -> str:
    """One line on what an export run did: new shards and rows, what was already exported, what was left."""
    def count(status: str) -> tuple[int, int, int]:
        chosen = [r for r in results if r.status == status]
        return len(chosen), sum(r.shards for r in chosen), sum(r.rows for r in chosen)

    (written, new, rows), (same, old, _), (stale, behind, _) = count("written"), count("unchanged"), count("stale")
    parts = [f"{new} new shards ({rows} rows) in {written} versions",
             f"{old} already exported in {same} unchanged versions"]
    if stale:
        parts.append(f"{stale} versions stale ({behind} shards exported earlier; the campaign has more since: "
                     "export into a new folder)")
    parts += [f"{n} versions {status}" for status in ("empty", "foreign")
              if (n := sum(r.status == status for r in results))]
    return "; ".join(parts)
