"""Benchmark ``sql``: peak memory and seconds of a ``rollstream sql`` query against the number of shards.

The campaign is the ``storage_scale`` one (``bench.storage_scale.build_campaign``: ``ShardWriter`` shards of one
group of 4 trajectories over 20 versions, generation not timed). A child process opens the folder with
``audit.sql.campaign_tables`` (keeping shard verdicts in a fresh folder, as ``rollstream sql`` does in the user's
cache) and runs the first auditor query of docs/COMMANDS.md (success rate per policy version); the child times that and reports
its peak resident set, interpreter and libraries included: what a user running the query pays. A second child
repeats the query over the unchanged campaign: ``sql.s_first_*`` is the first query (every shard decoded and
validated, and its rows kept), ``sql.s_*`` the repeat (only the verdicts' identities compared, and the kept rows
scanned instead of the shard files, ``audit.verdicts``); the peak memory is the first query's. The peak is the child's ``VmHWM`` (``/proc/self/status``), not ``ru_maxrss``: Linux carries the peak of the
address space a process had before ``exec`` into its ``ru_maxrss``, and ``subprocess`` starts children with
``vfork``, so a child's ``ru_maxrss`` (``os.wait4``, or ``getrusage`` in the child) is at least this benchmark
process's own peak (a bare interpreter started by a process holding hundreds of megabytes reports about as
much in ``ru_maxrss``, and its own few megabytes in ``VmHWM``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.registry import BenchContext, BenchResult, Goal, register_bench
from bench.storage_scale import build_campaign, label

FULL_SIZES = (1_000, 20_000)
QUICK_SIZES = (100, 1_000)
QUERY = ("SELECT version, count(*) AS trajectories, avg(CASE WHEN reward > 0 THEN 1 ELSE 0 END) AS success_rate "
         "FROM trajectories GROUP BY 1 ORDER BY 1")
"""The first auditor question of docs/COMMANDS.md: two of the shard's columns, every row."""
CHILD = """
import json, sys, time
from pathlib import Path
from pipelines_lib.audit.sql import campaign_tables
from pipelines_lib.storage.store import Store
start = time.perf_counter()
rows = campaign_tables(Store(sys.argv[1]), verdicts=Path(sys.argv[3])).query(sys.argv[2]).to_pylist()
seconds = time.perf_counter() - start
with open("/proc/self/status") as f:
    peak_kib = int(next(line for line in f if line.startswith("VmHWM:")).split()[1])
print(json.dumps({"s": seconds, "rss_mb": peak_kib / 1024, "trajectories": sum(r["trajectories"] for r in rows)}))
"""
"""What the child runs: imports are not timed, opening the folder and the query are."""


def run_query(folder: Path, verdicts: Path) -> tuple[float, float, int]:
    """(seconds, peak RSS in MB, trajectories counted) of ``QUERY`` over ``folder`` in a fresh process keeping
    shard verdicts in ``verdicts``."""
    proc = subprocess.run([sys.executable, "-c", CHILD, str(folder), QUERY, str(verdicts)], stdout=subprocess.PIPE,
                          timeout=1800,
                          env={**os.environ, "PYTHONPATH": os.getcwd(), "JAX_PLATFORMS": "cpu"}, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"bench sql: the query over {folder} exited {proc.returncode}")
    got = json.loads(proc.stdout)
    return got["s"], got["rss_mb"], got["trajectories"]


def measure(ctx: BenchContext, n_shards: int) -> dict[str, float]:
    folder = ctx.scratch / f"campaign-{label(n_shards)}"
    build_campaign(folder, n_shards)
    ctx.progress(f"bench sql: {n_shards} shards written")
    verdicts = ctx.scratch / f"verdicts-{label(n_shards)}"
    first_s, rss_mb, trajectories = run_query(folder, verdicts)
    repeat_s, _, again = run_query(folder, verdicts)
    if trajectories != n_shards * 4 or again != trajectories:
        raise RuntimeError(f"bench sql: the queries counted {trajectories} and {again} trajectories in {n_shards} "
                           "shards of 4")
    ctx.progress(f"bench sql: {n_shards} shards queried in {first_s:.1f} s (peak {rss_mb:.0f} MB), "
                 f"again in {repeat_s:.1f} s")
    return {"shards": n_shards, "s_first": first_s, "s": repeat_s, "rss_mb": rss_mb}


@register_bench(
    "sql",
    title="SQL over a campaign: peak memory and time of a first and a repeat query against the number of shards",
    measures="Peak resident memory and seconds of a `rollstream sql` query (success rate per version: two "
             "columns of every trajectory) over a campaign of 1 k and 20 k shards, first (every shard checked) and "
             "repeated over the unchanged campaign (kept shard verdicts and rows).",
    method="A synthetic campaign per size (the `storage_scale` one: `ShardWriter`, one group of 4 trajectories per "
           "shard, 20 versions; generation not timed). A child process runs `campaign_tables(store).query(...)`: "
           "seconds from opening the folder to the rows (imports not timed), and its peak RSS (`VmHWM`, interpreter and "
           "libraries included; not `ru_maxrss`, which Linux starts at the parent's peak for a vforked child). A "
           "second child repeats it with the verdicts and rows the first kept. Quick mode: 100 and 1 k shards.",
    goals=(Goal(key="sql.rss_mb_20k_shards", op="<=", value=500, why="memory bounded: shards scanned lazily"),
           Goal(key="sql.s_20k_shards", op="<=", value=5, why="a repeat query checks only new shards and scans the rows it kept")),
)
def bench_sql(ctx: BenchContext) -> BenchResult:
    sizes = QUICK_SIZES if ctx.quick else FULL_SIZES
    rows = [measure(ctx, n) for n in sizes]
    figures = {f"sql.{key}_{label(int(row['shards']))}_shards": float(value)
               for row in rows for key, value in row.items() if key != "shards"}
    notes = (f"Sizes {', '.join(label(n) for n in sizes)} shards of 4 trajectories of at most 32 generated tokens; "
             f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}.")
    return BenchResult(figures=figures, labels={"sql.device": "cpu"},
                       rows=[{k: round(v, 3) for k, v in r.items()} for r in rows], notes=notes)
