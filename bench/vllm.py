"""Benchmark ``vllm``: the built-in ``JaxEngine`` against a vLLM server on the same model and agentic workload.

```
for engine in jax, vllm (CPU build, launched from .venv-vllm on 127.0.0.1):
    for profile in none, light, heavy:   async orchestrator, max_concurrency 64, multi-turn forced-call
                                         arithmetic episodes of bench.rollout (generate, calculator behind the
                                         latency profile, generate, score), same seeds and delays in every arm
vllm: weight sync   reload between two exported versions; gate-closed seconds per sync (drain, /pause,
                    reload through the worker extension, prefix-cache reset, /resume)
vllm: mismatch      mean |sampler logp - trainer logp| over the generated tokens of the none arm's
                    trajectories (trainer: ``train.step.logprobs_fn`` on the same weights)
```

Both engines get the tiny preset's 16 decode slots (vLLM ``--max-num-seqs 16``), so the ratio compares engines,
not batch sizes. Throughput counts N trajectories after the first K (ramp-up left out), as in ``bench.rollout``.
The vLLM server runs on the same two cores as the orchestrator, like the JAX engine does.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.registry import BenchContext, BenchResult, register_bench
from bench.rollout import GROUP_SIZE, NEW_TOKENS, PROFILES, forced_call_episode_fn, measure_window
from pipelines_lib.config import CampaignConfig
from pipelines_lib.engine.jax_engine import JaxEngine
from pipelines_lib.engine.vllm_engine import VllmEngine
from pipelines_lib.envs.arithmetic import ArithmeticEnv
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.hf_export import save_hf_checkpoint
from pipelines_lib.model.tokenizer import load_tokenizer, tokenizer_dir
from pipelines_lib.rollout.orchestrator import RolloutConfig
from pipelines_lib.storage.shards import WriterConfig
from pipelines_lib.train.step import logprobs_fn
from pipelines_lib.trajectory.record import Trajectory

CONCURRENCY = 64
SLOTS = 16
QUICK = {"skip": 16, "n": 64, "syncs": 3}
FULL = {"skip": 64, "n": 256, "syncs": 10}


async def _arm(engine: Any, tokenizer: Any, tasks: list, profile: Any, *, skip: int, n: int,
               name: str) -> tuple[float, list[Trajectory], dict[str, float]]:
    """Trajectories/hour over the window from the skip-th to the (skip+n)-th finished trajectory."""
    rc = RolloutConfig(group_size=GROUP_SIZE, max_concurrency=CONCURRENCY, max_new_tokens=NEW_TOKENS[1],
                       max_tokens=engine.max_seq_len, writer=WriterConfig(max_groups=4, max_age_s=2.0))
    inner = forced_call_episode_fn(engine, tokenizer, profile, rc)
    counted, a, b = await measure_window(engine, rc, inner, tasks, skip=skip, n=n, bench="vllm", name=name,
                                         timeout_s=1200)
    await asyncio.sleep(0.5)  # let cancelled requests leave the engine before the next arm
    window_s = b["at"] - a["at"]
    busy = (b["busy_s"] - a["busy_s"]) / window_s
    tokens_per_s = (b["generated_tokens"] - a["generated_tokens"]) / window_s if "generated_tokens" in a else 0.0
    return n / window_s * 3600, counted, {"busy_fraction": busy, "tokens_per_s": tokens_per_s}


def _mismatch(model: Decoder, trajectories: list[Trajectory]) -> float:
    """Mean |recorded logp - trainer logp| over the generated tokens."""
    diffs = []
    for t in trajectories:
        tokens = jnp.asarray([t.tokens])
        trainer = np.asarray(logprobs_fn(model, tokens, jnp.arange(len(t.tokens))[None]))[0]
        mask = np.asarray(t.loss_mask) > 0
        diffs.append(np.abs(np.asarray(t.logprobs)[mask] - trainer[mask]))
    return float(np.concatenate(diffs).mean())


async def _run(ctx: BenchContext) -> tuple[dict[str, float], list[dict[str, Any]]]:
    size = QUICK if ctx.quick else FULL
    config = CampaignConfig.tiny()
    tok_dir = tokenizer_dir(config.tokenizer)
    tokenizer = load_tokenizer(tok_dir)
    models = [Decoder(config.model, rngs=nnx.Rngs(seed)) for seed in (0, 1)]
    folders = [save_hf_checkpoint(m, ctx.scratch / f"v{i}", tokenizer_dir=tok_dir) for i, m in enumerate(models)]
    tasks = ArithmeticEnv.generate_tasks(seed=config.seed, n=64, split="train")
    engine_config = dataclasses.replace(config.engine, num_slots=SLOTS)
    figures: dict[str, float] = {}
    rows: list[dict[str, Any]] = []
    per_hour: dict[tuple[str, str], float] = {}
    async with JaxEngine(models[0], engine_config) as jax_engine:
        await jax_engine.warmup()
        for profile_name, profile in PROFILES.items():
            rate, _, info = await _arm(jax_engine, tokenizer, tasks, profile, name=f"jax-{profile_name}", **_sz(size))
            per_hour["jax", profile_name] = rate
            rows.append({"engine": "jax", "profile": profile_name, "traj_per_hour": round(rate),
                         "tokens_per_s": round(info["tokens_per_s"], 1), "busy": round(info["busy_fraction"], 3)})
            ctx.progress(f"bench vllm: jax {profile_name} {rate:.0f}/h")
    vllm_config = dataclasses.replace(config.engine.vllm, max_num_seqs=SLOTS)
    async with VllmEngine(vllm_config, model_dir=folders[0], policy_version=0, max_seq_len=config.engine.max_seq_len,
                          log_path=ctx.scratch / "vllm-server.log", log=ctx.progress) as vllm:
        mismatch_trajectories: list[Trajectory] = []
        for profile_name, profile in PROFILES.items():
            rate, counted, info = await _arm(vllm, tokenizer, tasks, profile, name=f"vllm-{profile_name}",
                                             **_sz(size))
            per_hour["vllm", profile_name] = rate
            if profile_name == "none":
                mismatch_trajectories = counted
            rows.append({"engine": "vllm", "profile": profile_name, "traj_per_hour": round(rate),
                         "tokens_per_s": round(info["tokens_per_s"], 1), "busy": round(info["busy_fraction"], 3)})
            ctx.progress(f"bench vllm: vllm {profile_name} {rate:.0f}/h")
        vllm.reset_stats()
        for i in range(size["syncs"]):
            await vllm.swap_weights(folders[(i + 1) % 2], i + 1)
        sync = vllm.stats()
    for profile_name in PROFILES:
        figures[f"engine.vllm.traj_per_hour.{profile_name}"] = per_hour["vllm", profile_name]
        figures[f"engine.jax_over_vllm.{profile_name}"] = per_hour["jax", profile_name] / per_hour["vllm", profile_name]
    figures["engine.vllm.weight_sync_s"] = sync["weight_sync_s"] / sync["weight_syncs"]
    figures["engine.vllm.weight_sync_max_s"] = sync["weight_sync_max_s"]
    figures["engine.vllm.mismatch_logp_mean"] = _mismatch(models[0], mismatch_trajectories)
    return figures, rows


def _sz(size: dict[str, int]) -> dict[str, int]:
    return {"skip": size["skip"], "n": size["n"]}


@register_bench(
    "vllm", title="JaxEngine vs vLLM on one agentic workload",
    measures="Trajectories/hour, tokens/s and engine busy of the built-in JAX engine and of a vLLM (CPU) server "
             "on the same tiny model and multi-turn workload under three tool-latency profiles; vLLM's "
             "weight-sync pause and its logprob mismatch against the trainer.",
    method=__doc__.split("\n\n", 1)[1].strip() if __doc__ else "",
    prefixes=("engine.vllm.", "engine.jax_over_vllm."))
def bench_vllm(ctx: BenchContext) -> BenchResult:
    figures, rows = asyncio.run(_run(ctx))
    return BenchResult(figures=figures, rows=rows,
                       notes=f"Both engines: {SLOTS} decode slots, {CONCURRENCY} episodes in flight; "
                             f"{'quick' if ctx.quick else 'full'} sizes {QUICK if ctx.quick else FULL}.")


__all__ = ["bench_vllm"]
