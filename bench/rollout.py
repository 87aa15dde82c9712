"""Benchmark ``rollout``: the asynchronous orchestrator vs the synchronous batch mode under tool latency.

One process, one warmed-up ``JaxEngine`` (tiny model, ``CampaignConfig.tiny()`` engine: 16 slots) shared by
every arm, the same arithmetic tasks in the same order, the same per-sample sampling seeds and the same
per-sample tool delays (seeded by group and sample), so arms differ only in how episodes are scheduled:

```
ceiling            async, max_concurrency 256, no tool latency   (ARCHITECTURE §7: every slot kept full)
<profile>/sync     Orchestrator mode="sync", max_concurrency 16  (one batch fills all 16 engine slots;
                                                                  the next starts after its slowest episode)
<profile>/async    Orchestrator mode="async", max_concurrency 256 (new groups start as groups finish)
                   for profile in none, light (U 10-50 ms), heavy (log-normal, median 200 ms, σ 1.5, cap 5 s)
                   on the arithmetic env's calculator, and code: the code env's sandboxed Python tool
                   (a fresh bubblewrap sandbox per call from a warm pool, no added delay)
code-ceiling       async, max_concurrency 256, the code episodes with the tool answering at once
```

**Why every episode calls a tool.** Throughput, not quality, is measured, so the model is the tiny decoder
with random weights (no warm start to pay for). Such a model never writes a well-formed tool call, so the
agent here (``ForcedCallAgent``) treats its first response as a calculator call on the task's expression,
whatever the model wrote, and its second as the final answer. Every episode then has the shape of a solved
arithmetic episode: generate, one real calculator call behind the latency profile, generate, score. The
engine, episode runner, env, tool, orchestrator and shard writer (on a ``memory://`` store) are the real ones.
The code arm forces the same shape with the ``python`` tool: its call runs the task's reference function on
the first hidden test and prints whether it passed (a tiny valid program per task), in ``PythonSandbox``.
Its prompts are longer than arithmetic's (122-145 tokens with the tool schema), so its turns are shorter
(``CODE_NEW_TOKENS``) for two turns and the tool result to fit the 192-token context, and its
``async_over_ceiling`` is over its own ceiling: the same code episodes with the tool answering at once
(``InstantTool``, printing what the program prints).

**Window.** An arm's throughput is N trajectories over the time between the K-th and the (K+N)-th finished
trajectory. Skipping the first K (the same in every arm) leaves out the ramp-up, which would otherwise be
charged to the async arm: its first wave of ``max_concurrency`` first turns queues ahead of every second
turn. A sync window spans whole batches, so it is exact with a few of them. An async window must be long
next to the tail: a short one right after the ramp-up is inflated by second turns whose first turns ran
before it (heavy-profile episodes pile up in flight while the fast ones finish), so async arms count
``async_n`` ≈ 4 × ``max_concurrency`` trajectories. Both arms draw the same task sequence with the same
per-sample seeds and delays; they count different, identically distributed slices of it. After the
(K+N)-th the orchestrator is cancelled (the async arm keeps groups starting until then, so no drain is
timed either). Engine busy fraction is the engine's compute seconds over the same window, from
``JaxEngine.stats()`` at both ends.

**Repetitions.** On a shared machine the CPU share an arm gets drifts over minutes, so all ten arms are
run ``repeats`` times, interleaved, and each figure is the median over repetitions (a ratio: the median of
the per-repetition ratios, each taken between arms run a few seconds apart).

**On CPU** the engine's XLA compute and the episodes' host work (prompt rendering, tool calls, shard
encoding, the scheduler itself) share the same cores, so work overlapped with generation slows the decode
steps down: with zero latency the sync arm's steps are cheaper than the async arm's, and the async gain
there is smaller than slot occupancy alone suggests. On an accelerator the two run on separate hardware.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import re
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from flax import nnx

from bench.plots import figure
from bench.registry import BenchContext, BenchResult, Goal, register_bench
from pipelines_lib.agents import AgentConfig, ToolAgent, run_episode
from pipelines_lib.agents.base import FinalResponse, ToolMessages
from pipelines_lib.config import CampaignConfig
from pipelines_lib.engine.api import SamplingParams
from pipelines_lib.engine.jax_engine import JaxEngine
from pipelines_lib.envs import make_env
from pipelines_lib.envs.arithmetic import ArithmeticEnv
from pipelines_lib.envs.base import Task, Tool, hermes_tool_call
from pipelines_lib.envs.coding import CodeConfig, CodeEnv
from pipelines_lib.envs.tools.latency import LatencyProfile, LatencyTool
from pipelines_lib.envs.tools.sandbox import PythonSandbox
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.tokenizer import ChatTokenizer, open_tokenizer
from pipelines_lib.rollout.collect import worker_tasks
from pipelines_lib.rollout.config import RolloutConfig
from pipelines_lib.rollout.episodes import sample_seed
from pipelines_lib.rollout.orchestrator import EpisodeFn, Orchestrator
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.channel import WriterConfig
from pipelines_lib.trajectory.folder import FolderChannel
from pipelines_lib.trajectory.record import Trajectory

PROFILES: dict[str, LatencyProfile] = {
    "none": LatencyProfile.none(),
    "light": LatencyProfile.light(),
    "heavy": LatencyProfile.heavy(),
}
CODE = "code"
"""The arm on the code env's real sandboxed Python tool (no simulated latency), next to ``PROFILES``."""
PROFILES_NONE = LatencyProfile.none()
GROUP_SIZE = 4
ASYNC_CONCURRENCY = 256
"""16 × the engine's slots, from Little's law: episodes in flight = throughput × time an episode spends in
flight. At the engine's throughput the heavy profile's tool calls (with a tail to 5 s) alone hold dozens of
episodes, and episodes stuck in the tail keep their places: fewer in flight left slots idle, 256 none. Without
latency more in flight costs nothing."""
NEW_TOKENS = (8, 36)
"""Tokens per turn, drawn uniformly per sample (random weights rarely emit a stop id, so this sets the length):
varied like real turns, which also keeps episodes from moving through the engine in lockstep waves. The prompt
(~100 tokens with the tool schema), two turns and the tool result fit the 192-token context."""
CODE_NEW_TOKENS = (6, 16)
"""Tokens per turn in the code arms: the longest code prompt (145) + 2 × 16 + the tool result fit 192."""
QUICK = {"repeats": 1, "skip": 16, "sync_batches": {"none": 2, "light": 2, "heavy": 2, CODE: 2}, "async_n": 64}
FULL = {"repeats": 2, "skip": 96, "sync_batches": {"none": 4, "light": 4, "heavy": 6, CODE: 4}, "async_n": 1024}
"""Repetitions of all arms; trajectories skipped before every arm's window (K, a whole number of sync
batches); sync batches (of ``num_slots`` trajectories) counted in a sync window; trajectories counted in an
async window (the ceiling's too)."""
ARM_TIMEOUT_S = 600.0
EXPRESSION = re.compile(r"\d+(?:[-+*]\d+)+")


class ForcedCallAgent(ToolAgent):
    """A ``ToolAgent`` whose first response is the given tool call (whatever the model wrote) and whose second
    is the final answer: every episode waits on exactly one real tool call."""

    def __init__(self, config: AgentConfig, tokenizer: ChatTokenizer, *, call: str) -> None:
        super().__init__(config, tokenizer)
        self.call = call

    def clear(self) -> None:
        super().clear()
        self.called = False

    async def act(self, response: str, *, tool_timeout_s: float) -> FinalResponse | ToolMessages:
        if self.called:
            return FinalResponse(text=response)
        self.called = True
        return await super().act(self.call, tool_timeout_s=tool_timeout_s)


def forced_call(task: Task) -> str:
    """The call every episode of ``task`` makes: the calculator on an arithmetic task's expression; the python
    tool checking a code task's reference function on its first hidden test (it prints ``True``: a short
    result, so the second turn always fits the context)."""
    if task.env_name == CodeEnv.name:
        args, expected = task.meta["tests"][0]
        return hermes_tool_call("python", {"code": task.answer + f"print(f(*{args!r}) == {expected!r})\n"})
    match = EXPRESSION.search(task.prompt)
    return hermes_tool_call("calculator", {"expression": match.group(0) if match else "1+1"})


class InstantTool(Tool):
    """Stands in for ``inner`` in a ceiling arm: answers at once with a fixed text, running nothing."""

    def __init__(self, inner: Tool, text: str) -> None:
        self.name, self.description, self.parameters = inner.name, inner.description, inner.parameters
        self.text = text

    async def __call__(self, arguments: dict[str, Any]) -> str:
        return self.text


def forced_call_episode_fn(engine: JaxEngine, tokenizer: ChatTokenizer, profile: LatencyProfile | None,
                           rc: RolloutConfig, new_tokens_range: tuple[int, int] = NEW_TOKENS,
                           sandbox: PythonSandbox | None = None) -> EpisodeFn:
    """Episodes of ``ForcedCallAgent`` with the profile's delay before every tool call (``None``: the tool
    answers at once with the expected output, a code ceiling); sampling seeds, turn lengths and delays depend
    only on (group, sample), so every arm replays the same episodes. Code episodes share ``sandbox`` (its
    warm pool) when one is given."""

    async def episode(task: Task, group_id: str, sample_idx: int) -> Trajectory:
        env = CodeEnv(sandbox=sandbox) if sandbox is not None and task.env_name == CodeEnv.name \
            else make_env(task.env_name)
        rng = random.Random(sample_seed("latency", group_id, sample_idx))
        if profile is None:
            env.wrap_tools(lambda tool: InstantTool(tool, "True"))
        else:
            env.wrap_tools(lambda tool: LatencyTool(tool, profile, rng=rng))
        new_tokens = random.Random(sample_seed("length", group_id, sample_idx)).randint(*new_tokens_range)
        sampling = SamplingParams(temperature=rc.temperature, max_new_tokens=new_tokens,
                                  seed=sample_seed(group_id, sample_idx))
        agent = ForcedCallAgent(AgentConfig(), tokenizer, call=forced_call(task))
        return await run_episode(
            env=env, task=task, agent=agent, engine=engine, tokenizer=tokenizer,
            sampling=sampling, group_id=group_id, sample_idx=sample_idx, group_size=rc.group_size,
            worker_id="bench", episode_timeout_s=rc.episode_timeout_s, tool_timeout_s=rc.tool_timeout_s,
            max_tokens=rc.max_tokens)

    return episode


@dataclass(frozen=True, kw_only=True)
class ArmResult:
    name: str
    trajectories: int
    window_s: float
    busy_fraction: float
    slot_occupancy: float
    tool_calls_per_trajectory: float
    mean_tool_latency_s: float
    process_cores: float
    """CPU seconds of this process (event loop, XLA's threads) per second of the window."""
    machine_cores: float
    """CPU seconds of the whole machine (this process, the code arms' sandboxes, anything else) per second of it."""

    @property
    def traj_per_hour(self) -> float:
        return self.trajectories / self.window_s * 3600


def machine_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (every core, every process) since boot, from ``/proc/stat``."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


async def measure_window(engine: Any, rc: RolloutConfig, episode_fn: EpisodeFn, tasks: list[Task], *, skip: int,
                         n: int, bench: str, name: str, timeout_s: float,
                         clock: Callable[[], float] = time.perf_counter) -> tuple[list[Trajectory], dict, dict]:
    """Run an orchestrator over ``tasks`` until ``skip + n`` trajectories have finished, then stop it.

    Returns the last ``n`` trajectories and the engine's stats (with ``at``, the clock, and ``cpu_self_s`` /
    ``cpu_machine_s``, CPU seconds so far of this process and of the whole machine) when the ``skip``-th and
    the ``(skip + n)``-th finished: the measurement window, after the warm-up. Shards go to a scratch in-memory
    folder, removed afterwards."""
    total = skip + n
    finished: list[Trajectory] = []
    reached = asyncio.Event()
    marks: list[dict[str, float]] = []

    def mark() -> dict[str, float]:
        own = resource.getrusage(resource.RUSAGE_SELF)
        return {**engine.stats(), "at": clock(), "cpu_self_s": own.ru_utime + own.ru_stime,
                "cpu_machine_s": machine_cpu_s()}

    async def episode(task: Task, group_id: str, sample_idx: int) -> Trajectory:
        trajectory = await episode_fn(task, group_id, sample_idx)
        finished.append(trajectory)
        if len(finished) in (skip, total):
            marks.append(mark())
        if len(finished) == total:
            reached.set()
        return trajectory

    store = Store(f"memory://rollstream-bench-{bench}/{name}")
    orchestrator = Orchestrator(config=rc, engine=engine, episode_fn=episode,
                                tasks=worker_tasks(tasks, worker_index=0, num_workers=1, skip=set()),
                                writer=FolderChannel(store).writer("bench", rc.writer))
    engine.reset_stats()
    if skip == 0:
        marks.append(mark())
    run = asyncio.create_task(orchestrator.run())
    waiter = asyncio.create_task(reached.wait())
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.wait([run, waiter], return_when=asyncio.FIRST_COMPLETED)
        if not reached.is_set():
            run.result()  # a crashed run raises here; otherwise it ended short of the target
            raise RuntimeError(f"{bench} {name}: the orchestrator stopped after {len(finished)} of {total} trajectories")
    finally:
        waiter.cancel()
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        if store.fs.exists(store.uri()):  # nothing is there if the run stopped before its first commit
            store.fs.rm(store.uri(), recursive=True)
    a, b = marks
    return finished[skip:total], a, b


async def run_arm(engine: JaxEngine, tokenizer: ChatTokenizer, tasks: list[Task], *, name: str,
                  mode: Literal["async", "sync"], max_concurrency: int, profile: LatencyProfile | None, skip: int,
                  n_trajectories: int, new_tokens_range: tuple[int, int] = NEW_TOKENS,
                  sandbox: PythonSandbox | None = None, clock: Callable[[], float] = time.perf_counter) -> ArmResult:
    """Run the orchestrator until ``skip + n_trajectories`` have finished and measure the last
    ``n_trajectories`` (see the module docstring), then stop it."""
    total = skip + n_trajectories
    rc = RolloutConfig(group_size=GROUP_SIZE, max_concurrency=max_concurrency, mode=mode,
                       max_new_tokens=new_tokens_range[1], max_tokens=engine.max_seq_len,
                       target_groups=-(-total // GROUP_SIZE) if mode == "sync" else None,
                       writer=WriterConfig(max_groups=4, max_age_s=2.0))
    inner = forced_call_episode_fn(engine, tokenizer, profile, rc, new_tokens_range, sandbox)
    counted, a, b = await measure_window(engine, rc, inner, tasks, skip=skip, n=n_trajectories,
                                         bench="rollout", name=name, timeout_s=ARM_TIMEOUT_S, clock=clock)
    # Let the engine drop the cancelled requests before the next arm resets its counters.
    await asyncio.sleep(0.2)
    tool_turns = [t for tr in counted for t in tr.turns if t.role == "tool"]
    steps, window_s = b["decode_steps"] - a["decode_steps"], b["at"] - a["at"]
    return ArmResult(
        name=name, trajectories=n_trajectories, window_s=window_s,
        busy_fraction=(b["busy_s"] - a["busy_s"]) / (b["wall_s"] - a["wall_s"]),
        slot_occupancy=(b["active_slot_steps"] - a["active_slot_steps"]) / (steps * engine.config.num_slots),
        tool_calls_per_trajectory=len(tool_turns) / len(counted),
        mean_tool_latency_s=sum(t.latency_s or 0.0 for t in tool_turns) / max(1, len(tool_turns)),
        process_cores=(b["cpu_self_s"] - a["cpu_self_s"]) / window_s,
        machine_cores=(b["cpu_machine_s"] - a["cpu_machine_s"]) / window_s)


async def _run_all(quick: bool, progress: Callable[[str], None]) -> tuple[list[dict[str, ArmResult]], int]:
    """Every repetition runs the ceiling, then sync and async per profile, on one engine; returns the
    repetitions (arm name -> result) and K."""
    config = CampaignConfig.tiny()
    tokenizer = open_tokenizer(config.tokenizer)
    model = Decoder(config.model, rngs=nnx.Rngs(config.seed))
    size = QUICK if quick else FULL
    slots, skip = config.engine.num_slots, size["skip"]
    tasks = ArithmeticEnv.generate_tasks(seed=config.seed, n=64, split="train")
    code_tasks = CodeEnv.generate_tasks(seed=config.seed, n=64, split="train")
    # (tasks, latency profile, turn lengths) per arm family; the code arm's tool is slow by itself.
    families = {name: (tasks, profile, NEW_TOKENS) for name, profile in PROFILES.items()}
    families[CODE] = (code_tasks, PROFILES_NONE, CODE_NEW_TOKENS)
    reps: list[dict[str, ArmResult]] = []
    sandbox_config = dataclasses.replace(CodeConfig().sandbox, warm_pool=slots)
    async with JaxEngine(model, config.engine) as engine, PythonSandbox(sandbox_config) as sandbox:
        await engine.warmup()
        for rep in range(size["repeats"]):
            arms = {"ceiling": await run_arm(engine, tokenizer, tasks, name="ceiling", mode="async",
                                             max_concurrency=ASYNC_CONCURRENCY, profile=PROFILES_NONE,
                                             skip=skip, n_trajectories=size["async_n"])}
            arms[f"{CODE}-ceiling"] = await run_arm(
                engine, tokenizer, code_tasks, name=f"{CODE}-ceiling", mode="async", max_concurrency=ASYNC_CONCURRENCY,
                profile=None, skip=skip, n_trajectories=size["async_n"], new_tokens_range=CODE_NEW_TOKENS)
            for family, (family_tasks, profile, new_tokens) in families.items():
                for mode, concurrency in (("sync", slots), ("async", ASYNC_CONCURRENCY)):
                    name = f"{family}-{mode}"
                    arms[name] = await run_arm(engine, tokenizer, family_tasks, name=name, mode=mode,
                                               max_concurrency=concurrency, profile=profile, skip=skip,
                                               n_trajectories=size["sync_batches"][family] * slots
                                               if mode == "sync" else size["async_n"], new_tokens_range=new_tokens,
                                               sandbox=sandbox)
            reps.append(arms)
            progress(f"bench rollout: repetition {rep + 1}/{size['repeats']}: " + ", ".join(
                f"{name} {arm.traj_per_hour:.0f}/h" for name, arm in arms.items()))
    return reps, skip


CALL_OVERHEAD_PROGRAM = "print(sum(range(10)))"
CALL_OVERHEAD_N = {"quick": 10, "full": 40}


async def sandbox_call_ms(n: int) -> dict[str, float]:
    """Median milliseconds of one call running a trivial program, one call at a time, in: the warm pool (the
    default inside ``async with``), a cold bubblewrap sandbox per call, and a plain child process with only the
    audit hook (``isolation="none"``: the mechanism the sandbox had before OS isolation)."""
    base = CodeConfig().sandbox
    arms = {"warm_pool": (dataclasses.replace(base, warm_pool=1), True),
            "cold_bwrap": (base, False),
            "unisolated": (dataclasses.replace(base, isolation="none"), False)}
    out: dict[str, float] = {}
    for name, (cfg, pooled) in arms.items():
        sandbox = PythonSandbox(cfg)
        times = []
        async with contextlib.AsyncExitStack() as stack:
            if pooled:
                await stack.enter_async_context(sandbox)
            for _ in range(n):
                if pooled:  # a call arriving when a worker is ready: what the pool buys when calls are spaced
                    await asyncio.sleep(0.2)
                start = time.perf_counter()
                result = await sandbox.run(CALL_OVERHEAD_PROGRAM)
                times.append(time.perf_counter() - start)
                if result.stdout != "45\n":
                    raise RuntimeError(f"sandbox call overhead ({name}): unexpected result {result}")
        out[name] = statistics.median(times) * 1000
    return out


def _plot(path: Path, rows: list[dict[str, Any]]) -> None:
    import numpy as np

    by_arm = {r["arm"]: r for r in rows}
    names = [*PROFILES, CODE]
    x = np.arange(len(names))
    with figure(path, figsize=(7, 3.8)) as (_, ax):
        for offset, mode, color in ((-0.2, "sync", "tab:gray"), (0.2, "async", "tab:blue")):
            ax.bar(x + offset, [by_arm[f"{p}-{mode}"]["trajectories/h"] for p in names], width=0.4, label=mode,
                   color=color)
        ax.hlines(by_arm["ceiling"]["trajectories/h"], -0.5, len(PROFILES) - 0.5, color="tab:green", linestyle="--",
                  label="ceiling (no latency, slots full)")
        ax.hlines(by_arm[f"{CODE}-ceiling"]["trajectories/h"], len(PROFILES) - 0.5, len(PROFILES) + 0.5,
                  color="tab:olive", linestyle="--", label="code ceiling (instant tool; shorter turns)")
        ax.set_xticks(x, [f"latency: {p}" for p in PROFILES] + ["code: sandboxed python"], fontsize=8)
        ax.set_ylabel("trajectories / hour (median)")
        ax.set_title("rollout throughput: async orchestrator vs sync batches")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=4)


@register_bench(
    "rollout",
    title="Asynchronous vs synchronous rollout under tool latency",
    measures="Trajectories/hour of the asynchronous orchestrator over the synchronous batch mode (same engine "
             "slots, prompts, group size, seeds and latency profile, in one run), the engine busy fraction of the "
             "async arm, and the async arm's throughput over the ceiling (same engine, zero tool latency, every "
             "slot kept full), for tool latency none / light (uniform 10–50 ms) / heavy (log-normal, median "
             "200 ms, σ 1.5, capped at 5 s), and for a real slow tool: the code env's sandboxed Python.",
    method="Tiny decoder with random weights on the arithmetic env (and the code env); every episode is generate, one "
           "real calculator call behind the latency profile, generate, score (the agent turns the first response "
           "into the call whatever the model wrote: throughput, not quality, is measured); each turn generates "
           f"{NEW_TOKENS[0]}–{NEW_TOKENS[1]} tokens, drawn per sample. One warmed-up "
           "`JaxEngine` in continuous mode with 16 slots serves every arm (no compilation timed); prompts, "
           "sampling seeds and tool delays are the same in every arm. Sync: `RolloutConfig(mode='sync', "
           "max_concurrency=16)`, batches of 4 groups × 4 samples fill all 16 slots. Async: `mode='async', "
           f"max_concurrency={ASYNC_CONCURRENCY}`. Ceiling: async, {ASYNC_CONCURRENCY} in flight, no tool latency. "
           "Each arm skips its first K finished trajectories (ramp-up) and counts the next N (sync: whole "
           "batches; async: about 4 × max_concurrency, so the window is long next to the 5 s tail): "
           "throughput = N / time from the K-th to the (K+N)-th; busy fraction = engine compute seconds / that window. Groups are committed by the real "
           "the folder channel's writer to a `memory://` store. Busy time is the union of the engine's compute steps from "
           "dispatch until their results are on the host (steps are pipelined; a step found already finished "
           "when the host came for it is credited nothing, so it is a lower bound). Code arm: the code env, "
           "the forced call is the python tool running the task's reference function on one test input in "
           "the real sandbox (bubblewrap, one fresh sandbox per call, taken from a warm pool of 16 started "
           f"workers shared by the arm's episodes), no added delay; turns of {CODE_NEW_TOKENS[0]}–"
           f"{CODE_NEW_TOKENS[1]} tokens (longer prompts); its ceiling (`code-ceiling`) is the same episodes "
           "with the tool answering at once. Per-call overhead (`rollout.code.call_ms_*`, median of "
           f"{CALL_OVERHEAD_N['full']} sequential calls of a trivial program, {CALL_OVERHEAD_N['quick']} in quick "
           "mode): from the warm pool (a worker ready), a cold bubblewrap sandbox per call, and the "
           "unisolated child process with only the audit hook (the sandbox's earlier mechanism). CPU cores "
           "(table, and `rollout.code.*_cores`): CPU seconds per second of the window, of the benchmark's "
           "process (`getrusage`: event loop and XLA's threads) and of the whole machine (`/proc/stat`: the "
           "difference is the sandboxes, which run in PID namespaces whose CPU no parent's accounting sees, "
           "plus anything else running).",
    goals=(Goal(key="rollout.heavy.async_over_sync", op=">=", value=3.0,
                why="async rollout should hide slow tools"),
           Goal(key="rollout.heavy.async_busy_fraction", op=">=", value=0.9,
                why="the engine should never wait on tools"),
           Goal(key="rollout.heavy.async_over_ceiling", op=">=", value=0.85,
                why="tool latency should cost little throughput"),
           Goal(key="rollout.code.async_over_sync", op=">=", value=1.5,
                why="async rollout should pay off on the isolated code sandbox too")),
)
def bench_rollout(ctx: BenchContext) -> BenchResult:
    reps, skip = asyncio.run(_run_all(ctx.quick, ctx.progress))
    call_ms = asyncio.run(sandbox_call_ms(CALL_OVERHEAD_N["quick" if ctx.quick else "full"]))

    def med(fn: Callable[[dict[str, ArmResult]], float]) -> float:
        return statistics.median(fn(rep) for rep in reps)

    def ceiling_of(family: str) -> str:
        return f"{CODE}-ceiling" if family.startswith(CODE) else "ceiling"

    def ratio(a: str, b: str) -> Callable[[dict[str, ArmResult]], float]:
        return lambda rep: rep[a].traj_per_hour / rep[b].traj_per_hour

    first = reps[0]
    figures: dict[str, float] = {
        "rollout.ceiling_traj_per_hour": med(lambda rep: rep["ceiling"].traj_per_hour),
        "rollout.ceiling_slot_occupancy": med(lambda rep: rep["ceiling"].slot_occupancy),
        "rollout.ceiling_busy_fraction": med(lambda rep: rep["ceiling"].busy_fraction),
        "rollout.code.ceiling_traj_per_hour": med(lambda rep: rep[f"{CODE}-ceiling"].traj_per_hour),
        **{f"rollout.code.call_ms_{name}": ms for name, ms in call_ms.items()},
        "rollout.async_max_concurrency": ASYNC_CONCURRENCY,
        "rollout.repeats": len(reps),
    }
    for p in [*PROFILES, CODE]:
        figures |= {
            f"rollout.{p}.async_over_sync": med(ratio(f"{p}-async", f"{p}-sync")),
            f"rollout.{p}.async_busy_fraction": med(lambda rep, p=p: rep[f"{p}-async"].busy_fraction),
            f"rollout.{p}.async_over_ceiling": med(ratio(f"{p}-async", ceiling_of(p))),
            f"rollout.{p}.sync_busy_fraction": med(lambda rep, p=p: rep[f"{p}-sync"].busy_fraction),
            f"rollout.{p}.async_traj_per_hour": med(lambda rep, p=p: rep[f"{p}-async"].traj_per_hour),
            f"rollout.{p}.sync_traj_per_hour": med(lambda rep, p=p: rep[f"{p}-sync"].traj_per_hour),
        }
    # On a shared CPU the code arms' sandboxes compete with the engine: the cores used by this process (engine,
    # episodes) and by the machine (the difference: the sandboxes, and anything else running).
    for mode in ("sync", "async"):
        figures[f"rollout.code.{mode}_process_cores"] = med(lambda rep, m=mode: rep[f"{CODE}-{m}"].process_cores)
        figures[f"rollout.code.{mode}_machine_cores"] = med(lambda rep, m=mode: rep[f"{CODE}-{m}"].machine_cores)
    rows = [{
        "arm": name, "N": arm.trajectories, "window s": med(lambda rep, n=name: rep[n].window_s),
        "trajectories/h": med(lambda rep, n=name: rep[n].traj_per_hour),
        "engine busy": med(lambda rep, n=name: rep[n].busy_fraction),
        "slot occupancy": med(lambda rep, n=name: rep[n].slot_occupancy),
        "of ceiling": med(ratio(name, ceiling_of(name))),
        "tool calls/traj": arm.tool_calls_per_trajectory, "tool s": arm.mean_tool_latency_s,
        "CPU cores: process": med(lambda rep, n=name: rep[n].process_cores),
        "CPU cores: machine": med(lambda rep, n=name: rep[n].machine_cores),
    } for name, arm in first.items()]
    plot = "rollout_throughput.png"
    _plot(ctx.plot_dir / plot, rows)
    per_rep = "; ".join(f"{p} " + ", ".join(f"{ratio(f'{p}-async', f'{p}-sync')(rep):.2f}" for rep in reps)
                        for p in [*PROFILES, CODE])
    notes = (f"{len(reps)} repetition(s) of all ten arms, interleaved; every figure and cell is the median over "
             f"repetitions (ratios: median of per-repetition ratios). K = {skip} trajectories skipped per arm, N "
             "in the table. async_over_sync per repetition: " + per_rep + ". `tool s` is the mean recorded "
             "tool-call latency of the counted trajectories (first repetition; the same episodes in both arms of "
             "a profile).")
    return BenchResult(figures=figures, rows=rows, plots=[plot], notes=notes)
