"""Scoring published weights on the held-out split: the same engine, agent, env and episode loop as rollouts.

```
evaluate(store, config, version=N)                         the stage: eval/v<N:08d>.json, create-only
  └─ evaluate_model(model, tokenizer, tasks, config)        in memory (the benchmark calls this)
       JaxEngine(model, config.engine)
       per task: 1 greedy episode + k sampled ones           k = config.eval.samples, temperature config.eval.temperature
       run_episode(make_env, make_agent, ...) under a semaphore of config.eval.max_concurrency
       └─ summarize(...)                                     pure: success, pass@k, rewards, turns, tools, statuses,
                                                             format_rate (envs with a ``format`` reward part)
```

A task is *solved* by an episode that ends ``ok`` with reward >= ``SUCCESS_REWARD`` (the built-in envs give 1.0 for a
correct answer). pass@k uses the unbiased estimator of Chen et al. (2021) over the k sampled episodes; with n = k
it is the share of tasks any sample solved, and pass@1 is the mean per-sample success. Tool latency profiles are
not applied: evaluation measures the policy, not the emulated services. Sampled episodes are seeded from the
campaign seed and the task id, so a rerun of the same version gives the same numbers.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from pipelines_lib.agents import make_agent, run_episode
from pipelines_lib.config import CampaignConfig
from pipelines_lib.dataset import load_split
from pipelines_lib.engine import JaxEngine, SamplingParams
from pipelines_lib.envs import Task, make_env
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.tokenizer import ChatTokenizer
from pipelines_lib.publish import load_published
from pipelines_lib.rollout.episodes import campaign_tokenizer, env_sandbox
from pipelines_lib.storage.errors import AlreadyExistsError
from pipelines_lib.storage.layout import eval_path
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.record import Trajectory

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
    out["pass@k"] = out["sampled"][f"pass@{k}"] if k else None
    return out


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:4], "big")


async def evaluate_model_async(model: Decoder, tokenizer: ChatTokenizer, tasks: Sequence[Task],
                               config: CampaignConfig) -> dict[str, Any]:
    """``evaluate_model`` for callers already inside an event loop."""
    k, rollout = config.eval.samples, config.rollout
    semaphore = asyncio.Semaphore(config.eval.max_concurrency)
    started = time.perf_counter()
    async with JaxEngine(model, config.engine) as engine, env_sandbox(config) as sandbox:

        async def episode(task: Task, idx: int) -> Trajectory:
            sampling = SamplingParams(
                temperature=0.0 if idx == 0 else config.eval.temperature, top_p=rollout.top_p, top_k=rollout.top_k,
                max_new_tokens=rollout.max_new_tokens, seed=_seed(config.seed, task.task_id, idx))
            async with semaphore:
                return await run_episode(
                    env=make_env(task.env_name, sandbox=sandbox), task=task, agent=make_agent(config.agent, tokenizer),
                    engine=engine, tokenizer=tokenizer, sampling=sampling, group_id=f"eval/{task.task_id}",
                    sample_idx=idx, group_size=k + 1, worker_id="eval",
                    episode_timeout_s=rollout.episode_timeout_s, tool_timeout_s=rollout.tool_timeout_s,
                    max_tokens=rollout.max_tokens, failure_reward=rollout.failure_reward)

        runs = await asyncio.gather(*(asyncio.gather(*(episode(t, i) for i in range(k + 1))) for t in tasks))
        engine_stats = engine.stats()
    return {
        **summarize([r[0] for r in runs], [r[1:] for r in runs]),
        "wall_s": time.perf_counter() - started,
        "generated_tokens": engine_stats["generated_tokens"],
    }


def evaluate_model(model: Decoder, tokenizer: ChatTokenizer, tasks: Sequence[Task],
                   config: CampaignConfig) -> dict[str, Any]:
    """Run every task greedily once and ``config.eval.samples`` times sampled; the metrics of ``summarize``."""
    return asyncio.run(evaluate_model_async(model, tokenizer, tasks, config))


def evaluate(store: Store, config: CampaignConfig, *, version: int) -> dict[str, Any]:
    """Score published ``version`` on the first ``config.eval.n_tasks`` held-out tasks; writes ``eval/v<N>.json``.

    A no-op returning the stored results when that file exists.
    """
    path = eval_path(version)
    if store.exists(path):
        return store.read_json(path)
    model, _ = load_published(store, version)
    tokenizer = campaign_tokenizer(config)
    tasks = load_split(store, HELDOUT)[: config.eval.n_tasks]
    results = {"version": version, "split": HELDOUT, "temperature": config.eval.temperature,
               **evaluate_model(model, tokenizer, tasks, config)}
    try:
        store.create_json(path, results)
    except AlreadyExistsError:
        return store.read_json(path)  # a concurrent evaluation of the same version committed first
    return results


__all__ = ["SUCCESS_REWARD", "evaluate", "evaluate_model", "evaluate_model_async", "pass_at_k", "solved",
           "summarize"]
