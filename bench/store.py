"""Benchmark ``store``: shard store write/read throughput next to raw pyarrow IPC on the same local folder.

Each repetition runs every variant once, side by side, on the same synthetic groups, into a fresh folder;
figures are medians over repetitions. Throughput counts the table's in-memory Arrow bytes
(``Table.nbytes``), the same numerator for every variant, so MB/s ratios are time ratios.

Variants:
- ``store write``: ``ShardWriter.add_group`` for every group, then ``flush()``: record-to-Arrow conversion,
  LZ4 IPC encoding, create-only commit (temporary file, fsync, link, directory fsync). The rollout worker's
  real path.
- ``store encode+create``: ``encode_shard`` + ``Store.create`` of the already-built table: the byte path
  alone, to separate conversion cost from storage cost.
- ``pyarrow write``: the same table written with ``pa.ipc.new_file`` (same compression) to a file in the
  same folder, then fsync: what a careful hand-written writer does. It starts from the built table, so
  ``write_over_pyarrow`` charges the store alone for turning Python objects into Arrow.
- ``pyarrow write from records``: the same records as plain row dicts through ``Table.from_pylist`` (same
  schema), then the ``pyarrow write`` path: the hand-written writer starting where the store starts. A reported
  reference (``write_over_pyarrow_records``), without a goal.
- ``store read`` / ``store read+validate``: ``read_shard(validate=False/True)``: the tailer's path.
- ``pyarrow read``: ``pa.ipc.open_file(path).read_all()`` of the pyarrow-written file.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from bench.plots import barh
from bench.registry import BenchContext, BenchResult, Goal, register_bench
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.channel import WriterConfig
from pipelines_lib.trajectory.codec import COMPRESSION, encode_shard, read_shard
from pipelines_lib.trajectory.folder import FolderChannel
from pipelines_lib.trajectory.record import Trajectory, group_min_version, to_table
from pipelines_lib.trajectory.schema import TRAJECTORY_SCHEMA
from pipelines_lib.trajectory.synthetic import synthetic_group

QUICK = {"groups": 32, "group_size": 8, "max_len": 2048, "repeats": 3}
FULL = {"groups": 128, "group_size": 8, "max_len": 2048, "repeats": 5}
READ_CALLS = 5


def _timed(fn: Callable[[], object], calls: int = 1) -> float:
    """Seconds per call, over ``calls`` back-to-back calls (reads are quick: several calls average out
    scheduler noise on a shared machine; writes need a fresh name per call, so they run once)."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def _pyarrow_write(path: Path, table: pa.Table) -> None:
    options = pa.ipc.IpcWriteOptions(compression=COMPRESSION)
    with open(path, "wb") as f:
        with pa.ipc.new_file(f, table.schema, options=options) as writer:
            writer.write_table(table)
        f.flush()
        os.fsync(f.fileno())


def _table_from_pylist(records: list[Trajectory]) -> pa.Table:
    """The records as the plain row dicts ``Table.from_pylist`` takes, converted by pyarrow's row path."""
    by_group: dict[str, list[Trajectory]] = {}
    for t in records:
        by_group.setdefault(t.group_id, []).append(t)
    version = {gid: group_min_version(g) for gid, g in by_group.items()}
    rows = [{**vars(t), "trajectory_id": t.trajectory_id, "turns": [vars(turn) for turn in t.turns],
             "reward_parts": list(t.reward_parts.items()), "timings": vars(t.timings), "version": version[t.group_id]}
            for t in records]
    return pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA)


def _pyarrow_write_records(path: Path, records: list[Trajectory]) -> None:
    _pyarrow_write(path, _table_from_pylist(records))


def _pyarrow_read(path: Path) -> pa.Table:
    return pa.ipc.open_file(str(path)).read_all()


def _encode_create(store: Store, table: pa.Table) -> None:
    store.create("shard.arrow", encode_shard(table, {"bench": True}))


def _store_write(store: Store, groups: list[list[Trajectory]]) -> None:
    writer = FolderChannel(store).writer(
        "bench", WriterConfig(max_groups=len(groups) + 1, max_bytes=2**62, max_age_s=1e9))
    for g in groups:
        writer.add_group(g)
    [_info] = writer.flush()


def _plot(path: Path, rows: list[dict]) -> None:
    barh(path, [r["variant"] for r in rows], [r["MB/s"] for r in rows],
         colors=["tab:blue" if r["variant"].startswith("store") else "tab:gray" for r in rows],
         xlabel="MB/s (in-memory Arrow bytes; median)", title="shard store vs raw pyarrow IPC, local folder",
         figsize=(7, 3.2))


@register_bench(
    "store",
    title="Shard store throughput vs raw pyarrow IPC",
    measures="Write and read throughput (MB/s and trajectories/s) of the shard store, next to a raw pyarrow "
             "IPC write/read of the same table on the same local folder. `write_over_pyarrow` and "
             "`read_over_pyarrow` are store throughput / raw throughput; `write_over_pyarrow_records` compares the "
             "store's write with pyarrow converting the same Python records itself (`Table.from_pylist`).",
    method="Synthetic groups (`synthetic_group`, 4 turns per trajectory). Each repetition runs every variant once, "
           "side by side, into a fresh folder; figures are medians (each unvalidated read sample averages 5 back-to-back reads). `store write` is `ShardWriter.add_group` + "
           "`flush` from trajectory records (conversion, LZ4 encoding, create-only commit with fsync); "
           "`store encode+create` starts from the built table; `pyarrow write` writes the same table with the same "
           "compression and fsyncs; `pyarrow write from records` first builds that table from the same records "
           "with `Table.from_pylist` (row dicts), a reference without a goal (`write_over_pyarrow_records`). "
           "`store read` is `read_shard(validate=False)` (the headline read ratio), "
           "`store read+validate` adds the row-by-row invariant check; `pyarrow read` reads the raw file. "
           "MB = in-memory Arrow bytes of the table, the same for every variant.",
    goals=(Goal(key="store.write_over_pyarrow", op=">=", value=0.8, why="the store should cost little over raw pyarrow"),
           Goal(key="store.read_over_pyarrow", op=">=", value=0.8, why="the store should cost little over raw pyarrow")),
)
def bench_store(ctx: BenchContext) -> BenchResult:
    size = QUICK if ctx.quick else FULL
    groups = [synthetic_group(prompt_id=f"p{i}", group_size=size["group_size"], worker_id="bench", policy_version=0,
                              seed=i, max_len=size["max_len"]) for i in range(size["groups"])]
    records = [t for g in groups for t in g]
    table = to_table(records)
    if not _table_from_pylist(records).equals(table):
        raise AssertionError("bench store: Table.from_pylist and to_table disagree; the write arms are not comparable")
    mb, n = table.nbytes / 1e6, table.num_rows
    times: dict[str, list[float]] = {k: [] for k in (
        "store write", "store encode+create", "pyarrow write", "pyarrow write from records", "store read",
        "store read+validate", "pyarrow read")}
    shard_bytes = raw_bytes = 0
    for rep in range(size["repeats"]):
        folder = ctx.scratch / f"rep{rep}"
        store = Store(str(folder / "writer"))
        byte_store = Store(str(folder / "bytes"))
        raw_path = folder / "raw.arrow"
        times["store write"].append(_timed(partial(_store_write, store, groups)))
        times["store encode+create"].append(_timed(partial(_encode_create, byte_store, table)))
        times["pyarrow write"].append(_timed(partial(_pyarrow_write, raw_path, table)))
        times["pyarrow write from records"].append(
            _timed(partial(_pyarrow_write_records, folder / "raw_from_records.arrow", records)))
        [shard] = store.walk("trajectories")
        times["store read"].append(_timed(partial(read_shard, store, shard, validate=False), READ_CALLS))
        times["store read+validate"].append(_timed(partial(read_shard, store, shard)))
        times["pyarrow read"].append(_timed(partial(_pyarrow_read, raw_path), READ_CALLS))
        shard_bytes, raw_bytes = store.size(shard), raw_path.stat().st_size
        ctx.progress(f"bench store: repetition {rep + 1}/{size['repeats']} done")

    med = {k: statistics.median(v) for k, v in times.items()}
    rows = [{"variant": k, "median s": t, "MB/s": mb / t, "trajectories/s": n / t} for k, t in med.items()]
    plot = "store_throughput.png"
    _plot(ctx.plot_dir / plot, rows)
    figures = {
        "store.write_over_pyarrow": med["pyarrow write"] / med["store write"],
        "store.write_over_pyarrow_records": med["pyarrow write from records"] / med["store write"],
        "store.encode_create_over_pyarrow": med["pyarrow write"] / med["store encode+create"],
        "store.read_over_pyarrow": med["pyarrow read"] / med["store read"],
        "store.read_validated_over_pyarrow": med["pyarrow read"] / med["store read+validate"],
        "store.write_mb_s": mb / med["store write"],
        "store.write_traj_s": n / med["store write"],
        "store.read_mb_s": mb / med["store read"],
        "store.read_traj_s": n / med["store read"],
        "store.read_validated_mb_s": mb / med["store read+validate"],
        "store.pyarrow_write_mb_s": mb / med["pyarrow write"],
        "store.pyarrow_records_write_mb_s": mb / med["pyarrow write from records"],
        "store.pyarrow_read_mb_s": mb / med["pyarrow read"],
        "store.table_mb": mb,
        "store.shard_mb": shard_bytes / 1e6,
    }
    notes = (f"Sizes: {size['groups']} groups x {size['group_size']} trajectories ({n} rows, "
             f"{pc.sum(pc.list_value_length(table.column('tokens'))).as_py()} tokens), {mb:.2f} MB in memory, "
             f"shard file {shard_bytes / 1e6:.2f} MB (pyarrow file {raw_bytes / 1e6:.2f} MB), "
             f"{size['repeats']} repetitions.")
    return BenchResult(figures=figures, rows=rows, plots=[plot], notes=notes)
