"""Scoring a policy on held-out tasks: the same engine, agent, env and episode factory as rollouts.

```
stages.evaluate.evaluate(store, config, version=N)         the stage: eval/v<N:08d>.json (records.EvalResult);
  │                                                         opens engine.kind's backend (engine.backends) on cfg.mesh
  └─ evaluate_model(engine, tokenizer, tasks, cfg, ...)     any engine not yet entered (tests pass a JaxEngine)
       per task: 1 greedy episode + k sampled ones           k = cfg.samples, temperature cfg.temperature
       rollout.episodes.make_episode_fn(...) under a semaphore of cfg.max_concurrency
       └─ summarize(...)                                     pure: success, pass@k, rewards, turns, tools, statuses,
                                                             format_rate (envs with a ``format`` reward part)
```

A task is *solved* by an episode that ends ``ok`` with reward >= ``SUCCESS_REWARD`` (the built-in envs give 1.0 for a
correct answer). pass@k uses the unbiased estimator of Chen et al. (2021) over the k sampled episodes; with n = k
it is the share of tasks any sample solved, and pass@1 is the mean per-sample success. Tool latency profiles are
not applied: evaluation measures the policy, not the emulated services. Episodes are seeded by ``sample_seed``
from the campaign seed, the task id and the attempt, so a rerun of the same version gives the same numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pipelines_lib.agents.base import AgentConfig
from pipelines_lib.engine.api import Engine
from pipelines_lib.envs import Task
from pipelines_lib.envs.spec import EnvSpec
from pipelines_lib.mesh import MeshConfig
from pipelines_lib.model.tokenizer import ChatTokenizer
from pipelines_lib.rollout.config import MAX_CONCURRENCY, RolloutConfig
from pipelines_lib.rollout.episodes import env_sandbox, make_episode_fn
from pipelines_lib.trajectory.record import Trajectory


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """Held-out evaluation of published versions: one greedy attempt per task and ``samples`` sampled ones."""

    n_tasks: int = 64
    """Held-out tasks scored per version (the first n of the split)."""
    samples: int = 4
    """k of pass@k: sampled attempts per task, besides the greedy one."""
    temperature: float = 1.0
    """Temperature of the sampled attempts (the greedy attempt uses 0)."""
    max_concurrency: int = 32
    """Episodes evaluated at once."""
    mesh: MeshConfig = field(default_factory=MeshConfig)
    """Devices the evaluation engine serves on (its parameters and KV cache split over ``tensor``); default one."""
    versions: Literal["all", "ends"] = "all"
    """Which published versions the campaign evaluates: ``all``, or ``ends`` (version 0 and the last one)."""

    def __post_init__(self) -> None:
        if self.n_tasks < 1 or self.samples < 1 or not 1 <= self.max_concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"EvalConfig n_tasks/samples must be >= 1 and max_concurrency in [1, {MAX_CONCURRENCY}], "
                             f"got {self.n_tasks}/{self.samples}/{self.max_concurrency}")
        if not self.temperature >= 0:
            raise ValueError(f"EvalConfig.temperature must be >= 0, got {self.temperature}")


SUCCESS_REWARD = 1.0
HELDOUT = "heldout"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task from ``n`` samples of which ``c`` are correct (Chen et al. 2021, eq. 1):
    ``1 - C(n - c, k) / C(n, k)``, the chance that k samples drawn without replacement include a correct one."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def solved(t: Trajectory) -> bool:
    return t.status == "ok" and t.reward >= SUCCESS_REWARD


def _episode_stats(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    n = len(trajectories)
    failures = Counter(turn.error for t in trajectories for turn in t.turns if turn.error is not None)
    # Envs that score the answer's form report a ``format`` part; an episode without one never answered.
    formats = {"format_rate": sum(t.reward_parts.get("format", 0.0) for t in trajectories) / n} if any(
        "format" in t.reward_parts for t in trajectories) else {}
    return {
        **formats,
        "episodes": n,
        "success_rate": sum(map(solved, trajectories)) / n,
        "mean_reward": sum(t.reward for t in trajectories) / n,
        "avg_turns": sum(sum(turn.role == "assistant" for turn in t.turns) for t in trajectories) / n,
        "tool_use_rate": sum(any(turn.role == "tool" for turn in t.turns) for t in trajectories) / n,
        "avg_tokens": sum(len(t.tokens) for t in trajectories) / n,
        "statuses": dict(sorted(Counter(t.status for t in trajectories).items())),
        "failure_kinds": dict(sorted(failures.items())),
    }


def summarize(greedy: Sequence[Trajectory], sampled: Sequence[Sequence[Trajectory]]) -> dict[str, Any]:
    """Metrics of one greedy episode per task (``greedy[i]``) and k sampled ones (``sampled[i]``)."""
    if len(greedy) != len(sampled) or not greedy:
        raise ValueError(f"summarize needs one greedy episode and a sample list per task, got {len(greedy)} "
                         f"and {len(sampled)}")
    k = len(sampled[0])
    out: dict[str, Any] = {"tasks": len(greedy), "k": k, "greedy": _episode_stats(greedy)}
    if k:
        flat = [t for per_task in sampled for t in per_task]
        correct = [sum(map(solved, per_task)) for per_task in sampled]
        out["sampled"] = {
            **_episode_stats(flat),
            "pass@1": sum(pass_at_k(k, c, 1) for c in correct) / len(correct),
            f"pass@{k}": sum(pass_at_k(k, c, k) for c in correct) / len(correct),
        }
    out["greedy_success_rate"] = out["greedy"]["success_rate"]
    out["pass_at_k"] = out["sampled"][f"pass@{k}"] if k else None
    return out


async def evaluate_model_async(engine: contextlib.AbstractAsyncContextManager[Engine], tokenizer: ChatTokenizer,
                               tasks: Sequence[Task], cfg: EvalConfig, *, rollout: RolloutConfig, agent: AgentConfig,
                               seed: int, env: EnvSpec | None = None) -> dict[str, Any]:
    """``evaluate_model`` for callers already inside an event loop."""
    k = cfg.samples
    semaphore = asyncio.Semaphore(cfg.max_concurrency)
    started = time.perf_counter()
    async with engine as served, env_sandbox(env) as sandbox:
        episodes = [make_episode_fn(rollout, agent, engine=served, tokenizer=tokenizer, worker_id="eval", env=env,
                                    temperature=temperature, group_size=k + 1, seed_salt=f"eval.{seed}",
                                    sandbox=sandbox)
                    for temperature in (0.0, cfg.temperature)]

        async def episode(task: Task, idx: int) -> Trajectory:
            async with semaphore:
                return await episodes[min(idx, 1)](task, f"{HELDOUT}.{task.task_id}", idx)

        runs = await asyncio.gather(*(asyncio.gather(*(episode(t, i) for i in range(k + 1))) for t in tasks))
        engine_stats = served.stats()
    return {
        **summarize([r[0] for r in runs], [r[1:] for r in runs]),
        "wall_s": time.perf_counter() - started,
        "generated_tokens": engine_stats["generated_tokens"],
    }


def evaluate_model(engine: contextlib.AbstractAsyncContextManager[Engine], tokenizer: ChatTokenizer,
                   tasks: Sequence[Task], cfg: EvalConfig, *, rollout: RolloutConfig, agent: AgentConfig, seed: int,
                   env: EnvSpec | None = None) -> dict[str, Any]:
    """Run every task greedily once and ``cfg.samples`` times sampled, with ``rollout``'s budgets and the
    ``agent`` on ``engine`` (entered here); the metrics of ``summarize``. ``seed`` salts every sample's seed;
    episodes run the campaign's env (``env``: its options; a code env runs model code in its configured sandbox)."""
    return asyncio.run(evaluate_model_async(engine, tokenizer, tasks, cfg, rollout=rollout, agent=agent, seed=seed,
                                            env=env))


__all__ = ["HELDOUT", "SUCCESS_REWARD", "EvalConfig", "evaluate_model", "evaluate_model_async", "pass_at_k",
           "solved", "summarize"]
