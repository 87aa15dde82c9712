"""Benchmark ``storage_scale``: how the store's readers grow with the number of shards in a campaign.

A synthetic but valid campaign of N shards is written through the project's own ``ShardWriter`` (8 writers,
20 policy versions, one group of 4 trajectories per shard, the version's worth of shards per writer in seq
order), then measured the way a long campaign uses it:

- ``audit``: ``rollstream audit`` of the folder in a child process (``--jobs`` one per CPU: that many worker
  processes decode, the audit's own process lists and merges); wall time and
  CPU time (user + system, all processes) per shard, and the peak memory of its whole process tree:
  ``audit_rss_mb`` sums each process's resident set (sampled every 20 ms), so pages the processes share (the
  interpreter, NumPy's and Arrow's libraries, mapped by each worker alike) count once per process;
  ``audit_pss_mb`` sums their proportional set sizes (sampled every 100 ms: reading it costs more), which splits
  each shared page among the processes mapping it: what the tree adds to the machine. CPU time is the figure to
  compare across runs on a shared machine.
- ``export``: ``export_parquet`` of the folder into a fresh one (one worker process per CPU); wall and CPU time
  per shard.
- the tailer, with the trainer's needs and η = 2: a simulated trainer drains each window ``[V-2, V]`` for
  V = 0..19 (8 groups a call). Then ``cursor_bytes`` is the size of its serialised cursor,
  ``cursor_delta_bytes`` the mean size of what one step's consumption log carries of it, ``tail_poll_ms`` the
  median of 50 idle polls of the last window (nothing new), and ``window_drain_s`` the time a tailer starting at
  the last window (a cursor retired below version 17) takes to hand out that whole window (``window_drain_cpu_s``:
  the CPU time it took, the figure to compare on a loaded machine).

Generation is not timed. The campaign is encoded through ``ShardWriter`` into an in-memory store and its bytes
copied to the local folder without an fsync per object: a fsync'd create costs milliseconds here, which would make
a 20 k-shard campaign take minutes to build and measure nothing the readers do.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

from bench.registry import BenchContext, BenchResult, Goal, register_bench
from pipelines_lib.audit.export import export_parquet
from pipelines_lib.records import CampaignManifest
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.channel import GroupSource, WriterConfig
from pipelines_lib.trajectory.cursor import TailCursor
from pipelines_lib.trajectory.folder import FolderChannel
from pipelines_lib.trajectory.schema import SCHEMA_VERSION
from pipelines_lib.trajectory.synthetic import synthetic_group
from pipelines_lib.trajectory.trainable import TrainerNeeds
from pipelines_lib.trajectory.window import Window
from pipelines_lib.utc import utc_now_iso

FULL_SIZES = (1_000, 5_000, 20_000)
QUICK_SIZES = (100, 300, 1_000)
VERSIONS = 20
ETA = 2
WRITERS = 8
GROUP_SIZE = 4
MAX_LEN = 32
BATCH_GROUPS = 8
IDLE_POLLS = 50
NEEDS = TrainerNeeds(group_size=GROUP_SIZE, max_tokens=64, vocab_size=512)


def label(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def build_campaign(root: Path, n_shards: int) -> Store:
    """A campaign of ``n_shards`` one-group shards over ``VERSIONS`` versions, written by ``ShardWriter``."""
    memory = Store(f"memory://storage-scale-{uuid.uuid4().hex[:8]}/{root.name}")
    writers = [FolderChannel(memory).writer(f"w{i}.{uuid.uuid4().hex[:6]}", WriterConfig(max_groups=1))
               for i in range(WRITERS)]
    per_version = n_shards // VERSIONS
    for version in range(VERSIONS):
        for j in range(per_version):
            writer = writers[j % WRITERS]
            writer.add_group(synthetic_group(prompt_id=f"p{version}.{j}", group_size=GROUP_SIZE,
                                             worker_id=writer.worker_id, policy_version=version, seed=j,
                                             max_len=MAX_LEN))
    for path in memory.walk(""):
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(memory.read(path))
    store = Store(str(root))
    config = {"rollout": {"group_size": GROUP_SIZE, "eta": ETA}, "trainer": {"seq_buckets": [NEEDS.max_tokens]},
              "model": {"vocab_size": NEEDS.vocab_size}}
    CampaignManifest(kind="campaign", schema_version=SCHEMA_VERSION, code_version="bench",
                     created_at=utc_now_iso(), config=config).write(store)
    return store


def _cpu_s() -> float:
    """User + system CPU seconds of this process and its waited-for children (and theirs)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def _peak_memory_run(cmd: list[str]) -> tuple[float, float, float, int]:
    """(wall seconds, peak MB of the process tree's summed RSS, peak MB of its summed PSS, exit code) of ``cmd``."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": os.getcwd(), "JAX_PLATFORMS": "cpu"})
    root = psutil.Process(proc.pid)
    peak = peak_pss = samples = 0
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree))
            if samples % 5 == 0:
                peak_pss = max(peak_pss, sum(p.memory_full_info().pss for p in tree))
        except psutil.Error:
            pass  # a process of the tree ended between listing and sampling
        samples += 1
        time.sleep(0.02)
    return time.perf_counter() - start, peak / 2**20, peak_pss / 2**20, proc.returncode


def _drain(tailer: GroupSource, window: Window) -> tuple[int, int]:
    """Hand out everything in ``window``; returns (calls, groups)."""
    calls = groups = 0
    while True:
        got = tailer.next_groups(BATCH_GROUPS, window)
        calls += 1
        groups += len(got)
        tailer.drain_events()
        if not got:
            return calls, groups


def measure_tailer(store: Store) -> dict[str, float]:
    tailer = FolderChannel(store).reader(needs=NEEDS)
    deltas: list[int] = []
    for version in range(VERSIONS):
        before = tailer.cursor.copy()
        while tailer.next_groups(BATCH_GROUPS, Window(version=version, eta=ETA)):
            tailer.drain_events()
            deltas.append(len(tailer.cursor.delta_json(before)))
            before = tailer.cursor.copy()
    last = Window(version=VERSIONS - 1, eta=ETA)
    polls = []
    for _ in range(IDLE_POLLS):
        start = time.perf_counter()
        tailer.next_groups(BATCH_GROUPS, last)
        polls.append(time.perf_counter() - start)
    fresh = FolderChannel(store).reader(cursor=TailCursor(retired_below=last.start), needs=NEEDS)
    start, cpu = time.perf_counter(), time.process_time()
    calls, groups = _drain(fresh, last)
    drain_s, drain_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    return {"cursor_bytes": len(tailer.cursor.to_json()), "cursor_delta_bytes": statistics.mean(deltas),
            "tail_poll_ms": statistics.median(polls) * 1e3, "window_drain_s": drain_s,
            "window_drain_cpu_s": drain_cpu_s,
            "window_drain_calls": calls, "window_groups": groups}


def measure(ctx: BenchContext, n_shards: int) -> dict[str, float]:
    folder = ctx.scratch / f"campaign-{label(n_shards)}"
    store = build_campaign(folder, n_shards)
    ctx.progress(f"bench storage_scale: {n_shards} shards written")
    cpu = _cpu_s()
    audit_s, audit_mb, audit_pss_mb, rc = _peak_memory_run([sys.executable, "-m", "pipelines_lib.cli", "audit", str(folder)])
    audit_cpu_s = _cpu_s() - cpu
    if rc not in (0, 1):
        raise RuntimeError(f"bench storage_scale: rollstream audit {folder} exited {rc}")
    start, cpu = time.perf_counter(), _cpu_s()
    results = export_parquet(store, Store(str(ctx.scratch / f"export-{label(n_shards)}")), jobs=os.cpu_count() or 1)
    export_s, export_cpu_s = time.perf_counter() - start, _cpu_s() - cpu
    exported = sum(r.shards for r in results)
    if exported != n_shards // VERSIONS * VERSIONS:
        raise RuntimeError(f"bench storage_scale: exported {exported} of {n_shards} shards")
    ctx.progress(f"bench storage_scale: {n_shards} shards audited ({audit_s:.1f} s) and exported ({export_s:.1f} s)")
    return {"shards": n_shards, "audit_ms_per_shard": audit_s / n_shards * 1e3,
            "audit_cpu_ms_per_shard": audit_cpu_s / n_shards * 1e3, "audit_rss_mb": audit_mb,
            "audit_pss_mb": audit_pss_mb,
            "export_ms_per_shard": export_s / n_shards * 1e3, "export_cpu_ms_per_shard": export_cpu_s / n_shards * 1e3,
            **measure_tailer(store)}


@register_bench(
    "storage_scale",
    title="The store at campaign scale: audit, export, tailer and cursor against the number of shards",
    measures="How the audit, the Parquet export, the trainer's tailer and its cursor grow with the number of "
             "shards in a campaign (1 k, 5 k and 20 k shards over 20 versions, η = 2): time per shard, peak memory, "
             "cursor size, idle poll time and the time to empty one window.",
    method="A synthetic campaign per size, written through `ShardWriter` (8 writers, one group of 4 trajectories "
           "per shard; generation not timed). `rollstream audit` runs in a child process (wall time; peak RSS of "
           "its process tree summed over its processes, sampled every 20 ms; peak summed PSS, which counts a page "
           "the processes share once, every 100 ms; CPU time of all its processes); `export_parquet` (one worker "
           "per CPU) writes into a fresh folder. A "
           "simulated trainer drains each window [V-2, V] for V = 0..19, 8 groups a call; then the cursor's "
           "serialised size, the mean per-step cursor delta a consumption log carries, the median of 50 idle polls "
           "and the time a tailer starting at the last window takes to empty it. Quick mode: 100, 300 and 1 k shards.",
    goals=(Goal(key="storage_scale.audit_ms_per_shard", op="<=", value=0.5, why="a 1 M-shard audit in minutes"),
           Goal(key="storage_scale.audit_rss_mb_20k", op="<=", value=200, why="flat in N beyond a constant"),
           Goal(key="storage_scale.cursor_bytes_20k", op="<=", value=4096, why="bounded by writers x versions"),
           Goal(key="storage_scale.tail_poll_ms_20k", op="<=", value=1.0, why="a poll costs what is new"),
           Goal(key="storage_scale.window_drain_s_20k", op="<=", value=1.0, why="emptying a window is linear"),
           Goal(key="storage_scale.export_ms_per_shard", op="<=", value=1.0, why="streamed, not built in memory")),
)
def bench_storage_scale(ctx: BenchContext) -> BenchResult:
    sizes = QUICK_SIZES if ctx.quick else FULL_SIZES
    rows = [measure(ctx, n) for n in sizes]
    figures: dict[str, float] = {}
    for row in rows:
        for key, value in row.items():
            if key != "shards":
                figures[f"storage_scale.{key}_{label(int(row['shards']))}"] = float(value)
    figures["storage_scale.audit_ms_per_shard"] = rows[-1]["audit_ms_per_shard"]
    figures["storage_scale.export_ms_per_shard"] = rows[-1]["export_ms_per_shard"]
    notes = (f"Sizes {', '.join(label(n) for n in sizes)} shards; {WRITERS} writers, {VERSIONS} versions, "
             f"{GROUP_SIZE} trajectories of at most {MAX_LEN} generated tokens per shard; "
             f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}.")
    return BenchResult(figures=figures, rows=[{k: round(v, 3) for k, v in r.items()} for r in rows], notes=notes)
