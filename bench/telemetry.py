"""Benchmark ``telemetry``: what recording spans costs an episode, and one span on its own.

Two arms run the same episodes in one event loop: ``run_episode`` on the arithmetic env with the tool agent, a
``ScriptedEngine`` without latency that calls the calculator and then answers (so an episode records
``episode``, ``env_reset``, two ``generate``, one ``tool_call.calculator`` and ``reward``), and the calculator
without added latency. The whole repetition runs inside ``telemetry.recording`` on a local campaign folder (RSS
sampler thread included); each task runs once with the recorder (``on``) and once in an empty context (``off``),
alternating episode by episode. ``on`` is also charged its records' share of flushing to JSONL, at the cost per
record measured on files of the recorder's size (in a run the sampler thread flushes, off the episodes' path).

With nothing to wait for, an episode here is pure host work (prompt rendering, parsing, the tool), a few
milliseconds, so the fraction is an upper bound: a real episode waits tens to hundreds of milliseconds on
generation and tools for the same number of spans. Episode times are compared at their 10th percentile over all
repetitions: on a machine shared with other work most of the spread is the process being descheduled, which a
low quantile leaves out.
"""

from __future__ import annotations

import asyncio
import contextvars
import statistics
import time

from bench.registry import BenchContext, BenchResult, Goal, register_bench
from pipelines_lib import telemetry
from pipelines_lib.agents import AgentConfig, make_agent, run_episode
from pipelines_lib.engine.api import SamplingParams
from pipelines_lib.engine.scripted import ScriptedEngine
from pipelines_lib.envs import make_env
from pipelines_lib.envs.arithmetic import ArithmeticEnv
from pipelines_lib.envs.base import Task
from pipelines_lib.model.tokenizer import ChatTokenizer, ensure_default_tokenizer, load_tokenizer
from pipelines_lib.storage.store import Store

QUICK = {"episodes": 150, "repeats": 3, "spans": 20_000}
FULL = {"episodes": 600, "repeats": 7, "spans": 100_000}


async def _episode(task: Task, index: int, tok: ChatTokenizer) -> None:
    env = make_env("arithmetic")
    demo = env.demonstration(task)  # system, user, tool call, tool result, answer
    engine = ScriptedEngine([demo[2]["content"], demo[4]["content"]], tokenizer=tok)
    traj = await run_episode(env=env, task=task, agent=make_agent(AgentConfig(kind="tool"), tok), engine=engine,
                             tokenizer=tok, sampling=SamplingParams(max_new_tokens=64), group_id=f"g{index}",
                             sample_idx=0, group_size=1, worker_id="bench", episode_timeout_s=10.0,
                             tool_timeout_s=5.0, max_tokens=1024)
    if traj.status != "ok":
        raise RuntimeError(f"bench telemetry: scripted episode ended {traj.status}, expected ok")


async def _paired(tasks: list[Task], tok: ChatTokenizer) -> tuple[list[float], list[float]]:
    """Seconds of each episode without and with the active recorder, each task run once per arm.

    The arms alternate episode by episode (order swapped every pair), so drift in the CPU share this process
    gets on a shared machine falls on both alike. Both run as tasks; the ``off`` one in an empty context,
    where no recorder is active."""
    spent: dict[bool, list[float]] = {False: [], True: []}
    for i, task in enumerate(tasks):
        for recorded in (True, False) if i % 2 else (False, True):
            context = contextvars.copy_context() if recorded else contextvars.Context()
            start = time.perf_counter()
            await asyncio.create_task(_episode(task, i, tok), context=context)
            spent[recorded].append(time.perf_counter() - start)
    return spent[False], spent[True]


def _fast(times: list[float]) -> float:
    """The 10th percentile: on a shared machine slower episodes are mostly ones descheduled by other work."""
    return statistics.quantiles(times, n=10, method="inclusive")[0]  # never below the fastest


def _span_batch_s(n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        with telemetry.span("generate", track="slot-000", turn=i):
            pass
    return time.perf_counter() - start


def _per_span_us(recorder: telemetry.Recorder | None, spans: int) -> tuple[float, float]:
    """µs per span, and per record of flushing them (0 without a recorder): the fast decile of batches of
    the recorder's default file size (the flush cost includes one fsync'd create per file)."""
    batch = telemetry.Recorder.FLUSH_EVERY
    spent, flushed = [], []
    for _ in range(max(2, spans // batch)):
        spent.append(_span_batch_s(batch) / batch)
        if recorder is not None:
            start = time.perf_counter()
            recorder.flush()
            flushed.append((time.perf_counter() - start) / batch)
    return _fast(spent) * 1e6, _fast(flushed) * 1e6 if flushed else 0.0


@register_bench(
    "telemetry",
    title="Telemetry overhead",
    measures="What recording costs an episode: in µs (`episode_cost_us`: its records × (span + flush cost)) and "
             "as the slowdown of episodes that never wait (`overhead_fraction` = on/off − 1, an upper bound); "
             "and the cost of one span with no recorder, with one (kept in memory), and of flushing it to JSONL.",
    method="Scripted arithmetic episodes (tool call, then answer; no engine or tool latency) through `run_episode`, "
           "each task run with the recorder active (`on`, charged its records' share of the flush to JSONL) and without (`off`), the "
           "arms alternating episode by episode so that CPU-share drift falls on both; the arms' episode times "
           "are compared at their 10th percentile (descheduling by other work is the spread). Per-span costs: "
           "batches of 5000 `span`s (the recorder's file size) with no recorder and with one, then the flush of "
           "each batch to one JSONL file, per record; the fast decile of the batches.",
    goals=(Goal(key="telemetry.episode_cost_us", op="<=", value=200,
                why="negligible overhead: under 2 % of an episode that generates or calls a tool for "
                    "10 ms (tiny-model CPU episodes take seconds); an absolute cost, steady on a shared machine "
                    "where the measured ratio of two arms is not"),),
)
def bench_telemetry(ctx: BenchContext) -> BenchResult:
    size = QUICK if ctx.quick else FULL
    tok = load_tokenizer(ensure_default_tokenizer())
    tasks = ArithmeticEnv.generate_tasks(seed=0, n=size["episodes"], split="train")
    asyncio.run(_paired(tasks[:5], tok))  # warm imports and caches out of the first repetition
    span_off_us, _ = _per_span_us(None, size["spans"])
    # Flushed by hand after each batch, never by the ``add`` that fills the buffer (that would time it as a span).
    with telemetry.recording(Store(str(ctx.scratch / "spans")), "bench", sample_every_s=None,
                             flush_every=2**62) as recorder:
        span_on_us, flush_us = _per_span_us(recorder, size["spans"])
    off: list[float] = []
    on: list[float] = []
    spans = records = 0.0
    for rep in range(size["repeats"]):
        with telemetry.recording(Store(str(ctx.scratch / f"rep{rep}")), "rollout-bench") as recorder:
            t_off, t_on = asyncio.run(_paired(tasks, tok))
            records = len(recorder.records) / len(t_on)
            spans = sum(r["type"] == "span" for r in recorder.records)
        off += t_off
        # The recorded arm pays for writing its records as the recorder does: files of flush_every records.
        on += [t + records * flush_us / 1e6 for t in t_on]
        ctx.progress(f"bench telemetry: repetition {rep + 1}/{size['repeats']} done")

    episode_ms = _fast(off) * 1e3
    per_episode = spans / size["episodes"]
    figures = {
        "telemetry.overhead_fraction": _fast(on) / _fast(off) - 1,
        "telemetry.episode_ms": episode_ms,
        "telemetry.spans_per_episode": per_episode,
        "telemetry.span_off_us": span_off_us,
        "telemetry.span_us": span_on_us,
        "telemetry.span_flush_us": flush_us,
        "telemetry.records_per_episode": records,
        "telemetry.episode_cost_us": records * (span_on_us + flush_us),
        "telemetry.modelled_overhead_fraction": records * (span_on_us + flush_us) / (episode_ms * 1e3),
    }
    rows = [{"arm": arm, "episode ms (p10)": _fast(t) * 1e3, "episode ms (median)": statistics.median(t) * 1e3}
            for arm, t in (("off", off), ("on", on))]
    notes = (f"{size['episodes']} episodes per arm and repetition, {size['repeats']} repetitions, {per_episode:g} spans per episode; "
             f"per-span costs over {size['spans']} spans. `episode_cost_us` = records per episode (spans, and RSS "
             "gauges) × (span + flush cost per record); `modelled_overhead_fraction` = that / the episode time "
             "here: the same bound as `overhead_fraction` without the noise of two timed arms.")
    return BenchResult(figures=figures, rows=rows, notes=notes)

