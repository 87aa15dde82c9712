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
campaign            a whole tiny campaign on ``engine.kind: vllm`` (``run_vllm_campaign``): warm start, a rollout
                    worker serving from a vLLM server it launches, the streaming trainer publishing after each
                    of its two steps (so the worker reloads its server twice), then the audit
```

The campaign's proof of the reloads is the trainer's own mismatch metric: the tokens it consumed were sampled by
the server, and their recorded logprobs agree with the trainer's on the same version only if the server was
really serving that version. ``tests/test_vllm_campaign.py`` runs the same campaign (marked slow: most of its time is
the server's start-up).

Both engines get the tiny preset's 16 decode slots (vLLM ``--max-num-seqs 16``), so the ratio compares engines,
not batch sizes. Throughput counts N trajectories after the first K (ramp-up left out), as in ``bench.rollout``.
The vLLM server runs on the same two cores as the orchestrator, like the JAX engine does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.registry import BenchContext, BenchResult, Goal, register_bench
from bench.rollout import GROUP_SIZE, NEW_TOKENS, PROFILES, forced_call_episode_fn, measure_window
from pipelines_lib import records
from pipelines_lib.audit import audit_campaign
from pipelines_lib.audit.sql import scan_trajectories
from pipelines_lib.config import CampaignConfig
from pipelines_lib.dataset import prep
from pipelines_lib.engine.jax_engine import JaxEngine
from pipelines_lib.engine.vllm_engine import VllmEngine
from pipelines_lib.envs.arithmetic import ArithmeticEnv
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.hf_export import save_hf_checkpoint
from pipelines_lib.model.tokenizer import load_tokenizer, tokenizer_dir
from pipelines_lib.rollout.config import RolloutConfig
from pipelines_lib.stages.campaign import init_campaign
from pipelines_lib.stages.collect import collect
from pipelines_lib.stages.train import train
from pipelines_lib.stages.warm_start import warm_start
from pipelines_lib.storage.store import Store
from pipelines_lib.train.step import logprobs_fn
from pipelines_lib.trajectory.channel import WriterConfig
from pipelines_lib.trajectory.record import Trajectory

EAGER = ("--enforce-eager",)
"""Servers of tests and of the campaign part skip torch.compile: it would spend about a minute of a 2-core
machine's start-up compiling a model this small (the serving path, its numerics and the reload endpoints are the
same in eager mode)."""
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
             "weight-sync pause and its logprob mismatch against the trainer; a whole tiny campaign on vLLM.",
    method=__doc__.split("\n\n", 1)[1].strip() if __doc__ else "",
    goals=(Goal(key="engine.vllm.campaign_versions_sampled", op=">=", value=2,
                why="the worker reloaded its server and sampled the trainer's published weights"),
           Goal(key="engine.vllm.campaign_fresh_mismatch_p99", op="<=", value=1e-3,
                why="the server served the version its tokens are stamped with"),
           Goal(key="engine.vllm.campaign_audit_ok", op=">=", value=1, why="the campaign's data is consistent")),
    prefixes=("engine.vllm.", "engine.jax_over_vllm."))
def bench_vllm(ctx: BenchContext) -> BenchResult:
    figures, rows = asyncio.run(_run(ctx))
    ctx.progress("bench vllm: a tiny campaign on engine.kind vllm")
    campaign = run_vllm_campaign(Store(str(ctx.scratch / "campaign")), vllm_campaign_config())
    figures |= {"engine.vllm.campaign_published_version": campaign["published_version"],
                "engine.vllm.campaign_versions_sampled": len(campaign["versions_sampled"]),
                "engine.vllm.campaign_fresh_mismatch_p99": max(campaign["fresh_mismatch_p99"], default=float("nan")),
                "engine.vllm.campaign_audit_ok": float(campaign["audit_ok"])}
    return BenchResult(figures=figures, rows=rows,
                       notes=f"Both engines: {SLOTS} decode slots, {CONCURRENCY} episodes in flight; "
                             f"{'quick' if ctx.quick else 'full'} sizes {QUICK if ctx.quick else FULL}. "
                             f"Campaign: versions sampled {campaign['versions_sampled']}, the largest per-step p99 "
                             f"of |trainer − sampler| logp over fresh groups "
                             f"{max(campaign['fresh_mismatch_p99'], default=float('nan')):.2e}.")


def vllm_campaign_config(**vllm: object) -> CampaignConfig:
    """The tiny preset on ``engine.kind: vllm`` (eager server; ``vllm`` overrides ``engine.vllm`` fields), with
    untied embeddings (the tied case is what the throughput arms serve), two trainer steps each published."""
    return CampaignConfig.tiny().with_overrides({
        "model.tie_embeddings": False,
        "engine.kind": "vllm",
        "engine.vllm.max_num_seqs": 16, "engine.vllm.extra_args": list(EAGER),
        **{f"engine.vllm.{k}": v for k, v in vllm.items()},
        "sft.steps": 20, "sft.n_demos": 64,
        "dataset.n_train": 64,
        "rollout.group_size": 4, "rollout.max_concurrency": 16,
        # A 20-step warm start rarely solves a task: groups whose rewards are all zero still train (zero
        # advantage, but the mismatch metric is over their tokens all the same).
        "trainer.skip_zero_advantage": False, "rollout.max_groups_per_version": 2,
        # Two steps, each published: the fewest that make the worker reload its server twice.
        "trainer.max_steps": 2, "trainer.batch_groups": 2, "trainer.publish_every": 1, "trainer.checkpoint_every": 2,
        "rollout.eta": 1,
    })


def run_vllm_campaign(store: Store, config: CampaignConfig) -> dict[str, Any]:
    """Init, prep and warm start ``store``, then one rollout worker (a thread, its own vLLM server) beside the
    trainer until it is done. Returns the published version, the versions stamped on sampled tokens, the
    trainer's per-step p99 mismatch over steps that trained only fresh groups (trainer and sampler on the same
    weights), and whether the audit is clean."""
    init_campaign(store, config)
    prep(store, config.dataset, env=config.env)
    warm_start(store, config, log=lambda _: None)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            collect(store, config, worker="w0", worker_index=0, num_workers=1, log=lambda _: None)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(e)

    thread = threading.Thread(target=worker, name="rollout-w0")
    thread.start()
    try:
        train(store, config, log=lambda _: None)
    finally:
        thread.join(600)
    if errors:
        raise RuntimeError("the vLLM campaign's rollout worker failed") from errors[0]
    table = scan_trajectories(store).dataset.to_table(columns=["policy_version"])
    versions = {v for row in table.column("policy_version").to_pylist() for v in row if v >= 0}
    fresh = [log.metrics["prox_behav_logp_abs_diff_p99"] for log in records.consumption_logs(store)
             if all(g.staleness == 0 for g in log.groups)]
    latest = records.Publication.latest(store)
    return {"published_version": latest.version if latest else None,
            "versions_sampled": sorted(versions), "fresh_mismatch_p99": fresh, "audit_ok": audit_campaign(store).ok}


__all__ = ["bench_vllm"]
