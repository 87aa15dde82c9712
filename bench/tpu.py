"""Benchmarks ``tpu_train``, ``tpu_engine``, ``tpu_campaign`` (``--only tpu`` runs all three): the project on one
accelerator chip.

```
tpu_train     tpu.device, tpu.model_build_s, tpu.train_first_step_s, tpu.train_mfu
              Qwen3-0.6B shape (random weights), GRPO steps of 8 × 1024, float32 masters, bfloat16 compute,
              remat ``attention`` (``tpu.train_mfu_remat_full``: the same under ``full``)
tpu_engine    tpu.engine_warmup_s (64 slots, max_seq_len 1024), tpu.engine_roofline_fraction_16 / _64 / _128;
              per slot count the serve split into its prefill (tpu.engine_prefill_share_<slots>) and its decode
              steps (tpu.engine_decode_step_ms_<slots>, tpu.engine_roofline_fraction_decode_<slots>)
tpu_campaign  tpu.campaign_heldout_gain_points, tpu.campaign_wall_s: the tpu_demo preset, colocated
```

Everything runs in this one process, one part after another: a TPU chip can be opened by one process only, and
each part fits one 10-minute command. Without an accelerator each benchmark says so and records nothing
(``BenchSkipped``); ``--quick`` runs the same code at a small size in seconds (what the CPU test runs, through
``measure_train``, ``measure_engine`` and ``measure_campaign``). Nothing imports Prefect or opens a socket.

How the figures are counted:

- MFU: ``(6 · N · tokens + 6 · L · H · d_head · T² · rows) / step time / peak``. N counts every parameter a
  matmul reads (the embedding once, as the tied unembedding; norms left out), 6 · N per token is forward (2)
  plus backward (4). Causal attention: per layer and sequence the forward's QKᵀ and AV are 2 · 2 · H · d_head ·
  T² / 2 multiply-adds counted as flops (causal: half the square), times 3 for forward and backward.
  Rematerialised recomputation is not counted (model flops, not hardware flops). Step time is the median of the
  steady steps after the first. Peak: ``DEVICE_PEAKS`` (v5e: 197 TFLOP/s bfloat16).
- Engine roofline fraction: decode tokens/s per slot over the step rate the chip's memory bandwidth allows when
  every slot is busy: ``(tokens/s ÷ slots) × decode_step_bytes / bandwidth``, ``decode_step_bytes`` the engine's
  own count (``pipelines_lib.engine.roofline``) of what one decode step must read once from HBM: every weight (in
  the engine's dtype; of the embedding only the rows' entries, the unembedding whole) plus the keys and values of
  every slot at the serve's mean context (prompt + half the new tokens). Padding, cache blocks not yet filled,
  sampling and the host's work are not counted: they are what keeps an engine below 1. The bandwidth is the
  published peak: on a TPU v5e even a plain XLA reduction reads below it (docs/TPU_PERF.md), so a fraction has
  a ceiling under 1.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.realsize import QWEN3_0P6B, SMALL
from bench.registry import BenchContext, BenchResult, BenchSkipped, Goal, register_bench


@dataclass(frozen=True, kw_only=True)
class Peak:
    flops: float
    """bfloat16 matmul flop/s of one chip."""
    hbm_bytes_per_s: float
    """HBM bandwidth of one chip."""


DEVICE_PEAKS = {"TPU v5 lite": Peak(flops=197e12, hbm_bytes_per_s=819e9),
                "TPU v5e": Peak(flops=197e12, hbm_bytes_per_s=819e9),
                "TPU v6 lite": Peak(flops=918e12, hbm_bytes_per_s=1640e9),
                "TPU v5": Peak(flops=459e12, hbm_bytes_per_s=2765e9),
                "TPU v4": Peak(flops=275e12, hbm_bytes_per_s=1228e9)}
"""Published per-chip peaks by ``jax.devices()[0].device_kind``."""
FULL = {"hf": QWEN3_0P6B, "rows": 8, "length": 1024, "steady_steps": 3, "remats": ("attention", "full"),
        "slots": (16, 64, 128), "warmup_slots": 64, "max_seq_len": 1024, "block_size": 64, "pool_sequences": 64,
        "prompt": 128, "new_tokens": 128, "serves": 2}
QUICK = {"hf": SMALL, "rows": 2, "length": 64, "steady_steps": 2, "remats": ("attention", "full"),
         "slots": (2, 4, 8), "warmup_slots": 4, "max_seq_len": 128, "block_size": 16, "pool_sequences": 4,
         "prompt": 40, "new_tokens": 8, "serves": 1}
QUICK_CAMPAIGN = ("model.d_model=64", "model.n_layers=2", "model.n_heads=2", "model.n_kv_heads=1",
                  "model.head_dim=32", "model.d_ff=128", "sft.steps=10", "sft.n_demos=64", "sft.optim.total_steps=10",
                  "trainer.max_steps=2", "trainer.batch_groups=2", "trainer.skip_zero_advantage=false",
                  "eval.n_tasks=4", "eval.samples=1", "dataset.n_train=256", "dataset.n_heldout=8",
                  "engine.num_slots=8", "rollout.max_concurrency=8")
"""``tpu_demo`` cut to a campaign of a minute on 2 CPU cores: its model shrunk, two trainer steps."""
SERVE_TIMEOUT_S = 300.0
"""Longest wait for one serve of the engine part (a stuck engine fails the part instead of the command)."""


def accelerator() -> tuple[str, Peak]:
    """The chip's name and peaks; ``BenchSkipped`` on a CPU or a chip without known peaks."""
    import jax

    if jax.default_backend() == "cpu":
        raise BenchSkipped("no accelerator (JAX backend cpu): the tpu benchmarks record nothing here")
    kind = jax.devices()[0].device_kind
    if kind not in DEVICE_PEAKS:
        raise BenchSkipped(f"no published peaks for device kind {kind!r}; add it to bench.tpu.DEVICE_PEAKS")
    return kind, DEVICE_PEAKS[kind]


def _model(size: dict[str, Any], dtype: str) -> Any:
    from pipelines_lib.mesh import MeshConfig, create_sharded, make_mesh
    from pipelines_lib.model.config import ModelConfig
    from pipelines_lib.model.decoder import Decoder

    cfg = dataclasses.replace(ModelConfig.from_hf_config(size["hf"], max_seq_len=size["max_seq_len"]), dtype=dtype)
    return create_sharded(lambda rngs: Decoder(cfg, rngs=rngs), make_mesh(MeshConfig()))


def matmul_params(model: Any) -> int:
    """Parameters a forward pass multiplies by: all of them but the norms' scales."""
    import jax
    from flax import nnx

    norms = sum(leaf.size for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param))
                if "norm" in jax.tree_util.keystr(path))
    return sum(leaf.size for leaf in jax.tree.leaves(nnx.state(model, nnx.Param))) - norms


def train_flops(model: Any, rows: int, length: int) -> float:
    """Model flops of one training step over ``rows`` × ``length`` tokens (module docstring)."""
    cfg = model.cfg
    attention = 6 * cfg.n_layers * cfg.n_heads * cfg.head_dim * length * length * rows
    return 6 * matmul_params(model) * rows * length + attention


def measure_train(size: dict[str, Any], peak: Peak) -> dict[str, float]:
    """Build the model (timed), then for each of ``remats`` (remat policies, the first one the headline figures')
    one GRPO step with compilation and ``steady_steps`` more: ``train_mfu_remat_<policy>`` for each, side by side
    on the same model and batch."""
    import numpy as np

    from bench.realsize import _batch, _uniform_tokens
    from pipelines_lib.mesh import MeshConfig, make_mesh
    from pipelines_lib.train.optim import OptimConfig, make_nnx_optimizer
    from pipelines_lib.train.step import Precision, StepConfig, train_step

    t0 = time.perf_counter()
    model = _model({**size, "max_seq_len": size["length"]}, "float32")
    build_s = time.perf_counter() - t0
    optimizer = make_nnx_optimizer(model, OptimConfig(), make_mesh(MeshConfig()))
    batch = _batch(_uniform_tokens(size["rows"], size["length"], model.cfg.vocab_size))
    flops = train_flops(model, size["rows"], size["length"])
    out: dict[str, float] = {"model_build_s": build_s}
    for remat in size["remats"]:
        cfg = StepConfig(remat=remat, precision=Precision(params="float32", compute="bfloat16"))
        times = []
        for _ in range(1 + size["steady_steps"]):
            t0 = time.perf_counter()
            float(train_step(model, optimizer, batch, cfg=cfg)["loss"])
            times.append(time.perf_counter() - t0)
        step_s = statistics.median(times[1:])
        out[f"train_mfu_remat_{remat}"] = float(np.float64(flops) / step_s / peak.flops)
        if remat == size["remats"][0]:
            out.update(train_first_step_s=times[0], train_step_s=step_s,
                       train_tokens_per_s=size["rows"] * size["length"] / step_s,
                       train_mfu=out[f"train_mfu_remat_{remat}"])
    del model, optimizer
    gc.collect()
    return out


ENGINE_COUNTERS = ("busy_fraction", "host_bound_steps", "dispatches", "decode_steps", "prefill_calls",
                   "slot_occupancy")
"""The engine's own counters (``JaxEngine.stats``) recorded per slot count beside its speed: what a serve that falls
short of the roofline spent its wall clock on (the device idle, calls whose results waited for the host, prefill
split into more calls, rows idle in a call)."""


def measure_engine(size: dict[str, Any], peak: Peak) -> dict[str, float]:
    """Warm-up at ``warmup_slots`` (timed, compiling first), then for each slot count the best of ``serves`` serves of
    ``slots`` requests, all admitted at once, against the bandwidth roofline. The KV pool holds ``pool_sequences``
    sequences of ``max_seq_len`` (every slot's up to that many slots; beyond, fewer positions a slot than
    ``max_seq_len``, still more than a serve's request needs)."""
    from pipelines_lib.engine import EngineConfig, JaxEngine, SamplingParams
    from pipelines_lib.engine.roofline import decode_step_bytes

    model = _model(size, "bfloat16")
    out: dict[str, float] = {}
    first = size["warmup_slots"]  # compiled from nothing: the warm-up a campaign at these slots pays
    for slots in sorted(size["slots"], key=lambda n: (n != first, -n)):
        pool = min(slots, size["pool_sequences"]) * size["max_seq_len"] // size["block_size"]
        engine = JaxEngine(model, EngineConfig(num_slots=slots, max_seq_len=size["max_seq_len"],
                                               block_size=size["block_size"], num_blocks=pool,
                                               prefill_buckets=(size["prompt"],)))

        async def serve(engine: JaxEngine = engine, slots: int = slots) -> tuple[float, dict[str, float],
                                                                                dict[str, float]]:
            async def once(rep: int, new_tokens: int) -> dict[str, float]:
                engine.reset_stats()  # prompts differ by rep: no serve finds another's in the prefix cache
                requests = [engine.generate([(7 * i + 3 * k) % 1000 + 1 for i in range(size["prompt"])],
                                            SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=k))
                            for k in range(rep * slots, (rep + 1) * slots)]
                await asyncio.wait_for(asyncio.gather(*requests), SERVE_TIMEOUT_S)
                return engine.stats()

            t0 = time.perf_counter()
            await asyncio.wait_for(engine.warmup(), SERVE_TIMEOUT_S * 2)
            warmup_s = time.perf_counter() - t0
            best: dict[str, float] = {}
            for rep in range(size["serves"]):
                stats = await once(rep, size["new_tokens"])
                if stats["tokens_per_s"] > best.get("tokens_per_s", 0.0):
                    best = stats
            # The serve cut to one new token, on prompts of its own: its prefill (the same compiled programs),
            # what the serve spends before its decode steps.
            prefill = await once(size["serves"], 1)
            await engine.close()
            return warmup_s, best, prefill

        warmup_s, stats, prefill = asyncio.run(serve())
        if slots == first:
            out["engine_warmup_s"] = warmup_s
        out |= {f"engine_{name}_{slots}": float(stats[name]) for name in ENGINE_COUNTERS}
        mean_context = size["prompt"] + size["new_tokens"] // 2
        roofline_step_s = decode_step_bytes(model.cfg, slots, mean_context) / peak.hbm_bytes_per_s
        out[f"engine_tokens_per_s_{slots}"] = stats["tokens_per_s"]
        out[f"engine_roofline_fraction_{slots}"] = stats["tokens_per_s"] / slots * roofline_step_s
        out[f"engine_roofline_step_ms_{slots}"] = 1000 * roofline_step_s
        # The serve's wall clock split: its prefill, and its decode steps after it (the serve less the prefill's
        # serve, over the steps that one did not run) against the roofline's step.
        decode_step_s = (stats["wall_s"] - prefill["wall_s"]) / (size["new_tokens"] - 1)
        out[f"engine_prefill_share_{slots}"] = prefill["wall_s"] / stats["wall_s"]
        out[f"engine_decode_step_ms_{slots}"] = 1000 * decode_step_s
        out[f"engine_roofline_fraction_decode_{slots}"] = roofline_step_s / decode_step_s
        del engine
        gc.collect()
    return out


def measure_campaign(scratch: Path, *, quick: bool, log: Callable[[str], None] = print) -> dict[str, float]:
    """The ``tpu_demo`` preset (``QUICK_CAMPAIGN`` over it when ``quick``), colocated in this process, in a fresh
    folder: its wall clock (compilation included) and the held-out greedy success of its last version over v0's."""
    from pipelines_lib.config import CampaignConfig
    from pipelines_lib.configio import parse_overrides
    from pipelines_lib.records import EvalResult, evaluated_versions
    from pipelines_lib.stages.colocated import run_colocated
    from pipelines_lib.storage.store import Store

    config = CampaignConfig.build(preset="tpu_demo", overrides=parse_overrides(QUICK_CAMPAIGN) if quick else None)
    store = Store(str(scratch / "tpu_demo"))
    out = run_colocated(store, config, cache=scratch / "cache", log=log)
    if not out["audit"]["ok"]:
        raise RuntimeError(f"the tpu_demo campaign's audit failed: {out['audit']['report']}")
    greedy = {v: EvalResult.read(store, v).greedy_success_rate for v in evaluated_versions(store)}
    first, last = min(greedy), max(greedy)
    return {"campaign_wall_s": out["wall_s"], "campaign_heldout_gain_points": 100 * (greedy[last] - greedy[first]),
            "campaign_v0_greedy": greedy[first], "campaign_last_greedy": greedy[last], "campaign_last_version": last}


def _figures(measured: dict[str, float]) -> dict[str, float]:
    return {f"tpu.{k}": v for k, v in measured.items()}


@register_bench(
    "tpu_train",
    title="Building and training a Qwen3-0.6B-shaped model on one accelerator chip",
    measures="Seconds to build the model's random weights on the chip, the first GRPO step (compilation "
             "included) and the model-flops utilisation of the steps after it.",
    method="`bench/tpu.py` `measure_train`, in this process: `ModelConfig.from_hf_config` of Qwen3-0.6B's values, "
           "`pipelines_lib.mesh.create_sharded` of a random `Decoder` (timed, float32), AdamW, batch 8 × 1024 of uniform "
           "ids, `StepConfig(remat='attention', precision=float32 masters / bfloat16 compute)` (attention `auto`: the "
           "Pallas splash-attention kernel on one chip), 1 + 3 steps; then the same with `remat='full'` on the same "
           "model and batch (`tpu.train_mfu_remat_full`); MFU as the "
           "module docstring counts it (6·N·tokens + causal attention, median steady step, the chip's peak). "
           "`--quick`: the small model at 2 × 64. Skipped without an accelerator.",
    goals=(Goal(key="tpu.model_build_s", op="<=", value=15.0, why="a user waits for it every start"),
           Goal(key="tpu.train_first_step_s", op="<=", value=30.0, why="compilation is paid every start"),
           Goal(key="tpu.train_mfu", op=">=", value=0.45, why="what the chip is for")),
    prefixes=("tpu.device", "tpu.model_", "tpu.train_"),
)
def bench_tpu_train(ctx: BenchContext) -> BenchResult:
    kind, peak = accelerator()
    measured = measure_train(QUICK if ctx.quick else FULL, peak)
    return BenchResult(figures=_figures(measured), labels={"tpu.device": kind},
                       notes=f"{kind}; {'quick: small model' if ctx.quick else 'Qwen3-0.6B shape, 8 × 1024'}.")


@register_bench(
    "tpu_engine",
    title="The engine serving a Qwen3-0.6B-shaped model on one accelerator chip",
    measures="Seconds to warm the engine up at 64 slots and max_seq_len 1024, and its decode speed at 16, 64 and "
             "128 busy slots as a fraction of what the chip's memory bandwidth allows, with the engine's counters "
             "(device busy fraction, host-bound calls, calls, steps, prefill calls, slot occupancy) beside it.",
    method="`bench/tpu.py` `measure_engine`, in this process: the model in bfloat16 (`create_sharded`), "
           "`JaxEngine` at 64, 128 then 16 slots, max_seq_len 1024, a KV pool of 64 sequences of 1024 (every "
           "slot's at 16 and 64 slots; at 128, 512 positions a slot, twice a request's 256), cache blocks of 64 "
           "positions (`engine.block_size`; the default 16 measured 0.547 / 0.392 against 0.563 / 0.450 when "
           "gathering), decode attention by the paged "
           "kernel (the model has 8 kv heads), one prefill bucket of 128; `warmup()` timed at 64 "
           "slots; then the best of 2 serves of one request per slot (prompt 128, 128 new tokens, no stop ids), and "
           "one serve of new prompts cut to one new token (its prefill: `engine_prefill_share_<slots>` of the "
           "serve's wall clock; the rest over the 127 steps after it, `engine_decode_step_ms_<slots>`, against "
           "the roofline's step: `engine_roofline_fraction_decode_<slots>`); "
           "roofline fraction as the module docstring counts it (weights + KV at the mean context per step over "
           "the HBM bandwidth). `--quick`: the small model at 4, 8 and 2 slots. Skipped without an accelerator.",
    goals=(Goal(key="tpu.engine_warmup_s", op="<=", value=60.0, why="compilation is paid every start"),
           Goal(key="tpu.engine_roofline_fraction_16", op=">=", value=0.8, why="decode is bandwidth-bound"),
           Goal(key="tpu.engine_roofline_fraction_64", op=">=", value=0.8, why="decode is bandwidth-bound"),
           Goal(key="tpu.engine_roofline_fraction_128", op=">=", value=0.6,
                why="many slots keep what few slots reach")),
    prefixes=("tpu.engine_",),
)
def bench_tpu_engine(ctx: BenchContext) -> BenchResult:
    kind, peak = accelerator()
    measured = measure_engine(QUICK if ctx.quick else FULL, peak)
    return BenchResult(figures=_figures(measured), labels={"tpu.engine_device": kind},
                       notes=f"{kind}; {'quick: small model' if ctx.quick else 'Qwen3-0.6B shape, bfloat16'}.")


@register_bench(
    "tpu_campaign",
    title="A learning campaign colocated on one accelerator chip",
    measures="Held-out greedy success gained by SFT warm start + streaming GRPO on the arithmetic task with a "
             "25M-parameter model, everything in one process on the chip, and the campaign's wall clock.",
    method="`bench/tpu.py` `measure_campaign`: `run_colocated` of the `tpu_demo` preset in a fresh folder, in this "
           "process (prep, SFT, rollouts || trainer, evaluation of v0 and the last version, audit); wall clock of "
           "the whole, compilation included; gain = (last version's greedy success − v0's) × 100. `--quick`: the "
           "preset cut to a minute (`QUICK_CAMPAIGN`). Skipped without an accelerator.",
    goals=(Goal(key="tpu.campaign_heldout_gain_points", op=">=", value=50.0, why="the campaign learns"),
           Goal(key="tpu.campaign_wall_s", op="<=", value=540.0, why="one 10-minute device command")),
    prefixes=("tpu.campaign_",),
)
def bench_tpu_campaign(ctx: BenchContext) -> BenchResult:
    kind, _ = accelerator()
    measured = measure_campaign(ctx.scratch, quick=ctx.quick, log=ctx.progress)
    return BenchResult(figures=_figures(measured), labels={"tpu.campaign_device": kind},
                       notes=f"{kind}; v0 greedy {measured['campaign_v0_greedy']:.1%} -> "
                             f"v{measured['campaign_last_version']:.0f} {measured['campaign_last_greedy']:.1%}.")
