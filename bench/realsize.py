"""Benchmark ``realsize``: a Qwen3-0.6B-shaped model (random weights) trained and served on one CPU device.

```
parent (this process, holds no model)      one subprocess per part, so each part's peak RSS is its own
  train       float32 GRPO step, rows × length, with per-layer rematerialisation (the configuration to run at
              this size); XLA's memory analysis of the compiled step (aliased bytes over parameter +
              optimiser bytes), peak RSS, seconds per step
  no_remat    the same step keeping every activation: peak RSS and seconds per step
  growth      the step without remat on rows × growth_length, `growth_steps` steps with RSS and live JAX array
              bytes after each (a leak grows the live bytes, allocator drift only the RSS)
  bf16        one SGD step (lr 1: the update is the gradient) in float32 and one with bfloat16 compute on
              float32 masters, from the same weights on the same Zipf-token, on-policy batch: relative error
              of the update, split into what rounding the weights to bfloat16 costs and what the arithmetic adds
  engine      JaxEngine at 16 slots, then at 4, on the same short requests (a paged cache sized for what
              they hold): tokens/s of each, and RSS sampled every 5 ms during the 16-slot warmup over the
              RSS once it has served (steady); then one decode step's weight matmuls alone at 16 and at 4
              rows, the same ratio for the part of a step every engine must do
```

The engine part is also a benchmark of its own, ``realsize_engine`` (the ``realsize.engine_*`` and
``realsize.warmup_*`` figures), so it can be measured without the minutes of the train parts.

Each train part's process returns the compiler's freed heap to the OS after compiling, as the trainer's does
(``pipelines_lib.heap``): without it the compile's freed heap (gigabytes) stays resident under the step's peak.

The model is built by the project's own code: ``ModelConfig.from_hf_config`` of Qwen3-0.6B's published
``config.json`` values (596,049,920 parameters) and a random ``Decoder`` init, compiled as one program
(``mesh.create_sharded``, the way to build a model this size) rather than run as hundreds of eager draws.
Nothing is downloaded.
``--quick`` runs the same parts on a small model in seconds. A part that fails does not stop the others: the
benchmark records what they measured, then raises ``PartialResult``. A part's subprocess runs ``python -m
bench.realsize PART ARGS_JSON`` and prints one JSON line of figures.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.registry import BenchContext, BenchResult, Goal, PartialResult, register_bench
from pipelines_lib.model.config import QWEN3_0P6B

SMALL = {**QWEN3_0P6B, "vocab_size": 2048, "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 384}
"""The ``--quick`` model: the same architecture, every dimension shrunk."""
FULL = {"hf": QWEN3_0P6B, "rows": 4, "length": 256, "growth_steps": 20, "growth_length": 32, "bf16_rows": 2, "bf16_length": 64,
        "requests": 32, "prompt": 24, "new_tokens": 32, "max_seq_len": 1024, "num_blocks": 128}
QUICK = {"hf": SMALL, "rows": 4, "length": 64, "growth_steps": 20, "growth_length": 32, "bf16_rows": 2, "bf16_length": 32,
         "requests": 16, "prompt": 12, "new_tokens": 8, "max_seq_len": 256, "num_blocks": 48}
SERVES = 3
"""Serves of the engine part's requests per slot count; the fastest is reported."""
MIN_AVAILABLE_GIB = 14.0
"""The full size's step without remat peaks just below this (``realsize.no_remat_peak_gib``): refuse to start on a machine with less available."""
GIB = 2**30


def _rss_gib() -> float:
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / 2**20


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _available_gib() -> float:
    with open("/proc/meminfo") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    return kb / 2**20


def _one_device():  # noqa: ANN202 - JAX is imported in the part's own process only
    from pipelines_lib.mesh import MeshConfig, make_mesh

    return make_mesh(MeshConfig())


def _model(args: dict[str, Any], dtype: str = "float32"):
    from pipelines_lib.mesh import create_sharded
    from pipelines_lib.model.config import ModelConfig
    from pipelines_lib.model.decoder import Decoder

    cfg = ModelConfig.from_dict({**ModelConfig.from_hf_config(args["hf"], max_seq_len=args["max_seq_len"]).to_dict(),
                                 "dtype": dtype})
    return create_sharded(lambda rngs: Decoder(cfg, rngs=rngs), _one_device())


def _batch(tokens_bt: list[list[int]], behav_logp_bt: list[list[float]] | None = None):
    """A GRPO batch over ``tokens_bt``: the first quarter of each row is prompt, advantages standard normal,
    behaviour log-probs uniform in [-5, -0.5] unless given."""
    import numpy as np

    from pipelines_lib.train.batch import build_train_batch

    rng = np.random.default_rng(0)
    rows, length = len(tokens_bt), len(tokens_bt[0])
    masks = [[0] * (length // 4) + [1] * (length - length // 4)] * rows
    behav = behav_logp_bt or (-rng.uniform(0.5, 5.0, size=(rows, length))).tolist()
    return build_train_batch(tokens_bt, masks, behav, rng.normal(size=rows).tolist(), seq_buckets=(length,))


def _uniform_tokens(rows: int, length: int, vocab: int) -> list[list[int]]:
    import numpy as np

    return np.random.default_rng(0).integers(1, vocab, size=(rows, length)).tolist()


def _zipf_tokens(rows: int, length: int, vocab: int) -> list[list[int]]:
    """Ids drawn by Zipf's law, P(id k) ∝ 1/k, as natural text's token frequencies fall with their rank."""
    import numpy as np

    ranks = np.arange(1, vocab)
    return np.random.default_rng(0).choice(ranks, size=(rows, length), p=(1 / ranks) / np.sum(1 / ranks)).tolist()


def part_train(args: dict[str, Any]) -> dict[str, float]:
    import jax
    from flax import nnx

    from pipelines_lib.heap import trim_heap_after_compiles
    from pipelines_lib.train.optim import OptimConfig, make_nnx_optimizer
    from pipelines_lib.train.step import StepConfig, train_step

    trim_heap_after_compiles()  # as the trainer and SFT do
    model = _model(args)
    optimizer = make_nnx_optimizer(model, OptimConfig(), _one_device())
    batch = _batch(_uniform_tokens(args["rows"], args["length"], model.cfg.vocab_size))
    cfg = StepConfig(remat=args["remat"])
    times, rss, live = [], [], []
    for _ in range(1 + args["steps"]):
        t0 = time.perf_counter()
        float(train_step(model, optimizer, batch, cfg=cfg)["loss"])
        times.append(time.perf_counter() - t0)
        rss.append(_rss_gib())
        live.append(sum(x.nbytes for x in jax.live_arrays()) / GIB)
    # The peak is read before XLA's memory analysis, which a trainer never asks for: at the full size it leaves
    # freed heap resident, which would sit under the steps' peak if asked for first.
    peak_gib = _peak_rss_gib()
    memory = train_step.lower(model, optimizer, batch, cfg=cfg).compile().memory_analysis()  # from jit's cache
    state_bytes = sum(x.nbytes for x in jax.tree.leaves((nnx.state(model), nnx.state(optimizer))))
    return {
        "peak_gib": peak_gib,
        "aliased_fraction": memory.alias_size_in_bytes / state_bytes,
        "xla_step_gib": (memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes
                         - memory.alias_size_in_bytes) / GIB,
        "state_gib": state_bytes / GIB,
        "first_step_s": times[0],
        "step_s": statistics.median(times[1:]) if len(times) > 1 else times[0],
        "rss_growth_gib": rss[-1] - rss[0],
        "live_growth_gib": live[-1] - live[0],
    }


def part_bf16(args: dict[str, Any]) -> dict[str, float]:
    """Relative errors of one SGD step's update (lr 1: the update is the gradient), global L2 over every
    parameter, ``‖Δ − Δ_ref‖ / ‖Δ_ref‖``, on a Zipf-token batch with on-policy behaviour log-probs:

    - ``update_rel_error``: bfloat16 compute on float32 masters against the all-float32 step;
    - ``weight_rounding_rel_error``: the all-float32 step from the weights rounded to bfloat16 against the
      all-float32 step, the share of the above that no bfloat16 forward can avoid (it sees those weights);
    - ``arithmetic_rel_error``: bfloat16 compute against the float32 step from the same rounded weights,
      the share bfloat16 arithmetic adds.
    """
    import dataclasses

    import jax
    import numpy as np
    import optax
    from flax import nnx

    from pipelines_lib.train.step import Precision, StepConfig, logprobs_fn, train_step

    model = _model(args)
    tokens = _zipf_tokens(args["bf16_rows"], args["bf16_length"], model.cfg.vocab_size)
    probe = _batch(tokens)
    # On-policy, as GRPO's first update on fresh samples: the behaviour log-probs are the model's own.
    batch = _batch(tokens, np.asarray(logprobs_fn(model, probe.tokens_bt, probe.positions_bt)).tolist())
    structure = jax.tree.structure(nnx.state(model, nnx.Param))
    w0 = [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]

    def start(w: np.ndarray, rounded: bool) -> np.ndarray:
        return np.asarray(jax.numpy.asarray(w).astype("bfloat16").astype("float32")) if rounded else w

    def update(compute: str, rounded: bool) -> list[np.ndarray]:
        nnx.update(model, jax.tree.unflatten(structure, [jax.device_put(start(w, rounded), jax.devices()[0])
                                                         for w in w0]))
        cfg = dataclasses.replace(StepConfig(), precision=Precision(params="float32", compute=compute))
        train_step(model, nnx.Optimizer(model, optax.sgd(1.0), wrt=nnx.Param), batch, cfg=cfg)
        return [np.asarray(x) - start(w, rounded) for x, w in zip(jax.tree.leaves(nnx.state(model, nnx.Param)), w0,
                                                                  strict=True)]

    def rel(delta: list[np.ndarray], ref: list[np.ndarray]) -> float:
        err = sum(float(np.sum((d.astype(np.float64) - r) ** 2)) for d, r in zip(delta, ref, strict=True))
        return (err / sum(float(np.sum(r.astype(np.float64) ** 2)) for r in ref)) ** 0.5

    # One stored update at a time besides w0: at 0.6 B parameters each is gigabytes.
    ref = update("float32", rounded=False)
    out = {"update_rel_error": rel(update("bfloat16", rounded=False), ref)}
    rounded_ref = update("float32", rounded=True)
    out["weight_rounding_rel_error"] = rel(rounded_ref, ref)
    del ref
    out["arithmetic_rel_error"] = rel(update("bfloat16", rounded=True), rounded_ref)
    return out


def part_engine(args: dict[str, Any]) -> dict[str, float]:
    from pipelines_lib.engine import EngineConfig, JaxEngine, SamplingParams

    model = _model(args)
    out: dict[str, float] = {}
    for slots in (16, 4):  # 16 first: its warmup runs in a process that has served nothing yet
        config = EngineConfig(num_slots=slots, max_seq_len=args["max_seq_len"], prefill_buckets=(16, 32),
                              block_size=16, num_blocks=args["num_blocks"])
        engine = JaxEngine(model, config)
        peak = [_rss_gib()]
        done = threading.Event()

        def sample(peak: list[float] = peak, done: threading.Event = done) -> None:
            while not done.wait(0.005):
                peak[0] = max(peak[0], _rss_gib())

        async def serve(engine: JaxEngine = engine, done: threading.Event = done) -> dict[str, float]:
            sampler = threading.Thread(target=sample)
            sampler.start()
            await engine.warmup()
            done.set()
            sampler.join()
            # Best of a few serves: one serve lasts well under a second at the quick size, where a single
            # preemption on a shared machine would decide the figure. Each serve's prompts start with tokens of
            # their own, so no serve reuses a prefix another one left.
            serves = []
            for rep in range(args.get("serves", SERVES)):
                engine.reset_stats()
                await asyncio.gather(*[
                    engine.generate([(7 * i + 3 * k) % 1000 + 1 for i in range(args["prompt"])],
                                    SamplingParams(temperature=1.0, max_new_tokens=args["new_tokens"], seed=k))
                    for k in range(rep * args["requests"], (rep + 1) * args["requests"])])
                serves.append(engine.stats())
            await engine.close()
            return max(serves, key=lambda served: served["tokens_per_s"])

        stats = asyncio.run(serve())
        out[f"tokens_per_s_{slots}"] = stats["tokens_per_s"]
        out[f"ms_per_step_{slots}"] = 1000 * stats["wall_s"] / stats["decode_steps"]
        if slots == 16:
            out["warmup_peak_gib"], out["steady_gib"] = peak[0], _rss_gib()
    for rows in (16, 4):
        out[f"matmul_ms_{rows}"] = 1000 * _weight_matmul_s(model, rows)
    return out


def _weight_matmul_s(model: Any, rows: int, repeats: int = 5) -> float:
    """Seconds (best of ``repeats``, after one untimed call) of the weight matmuls of one decode step over
    ``rows`` tokens and nothing else: every linear layer's kernel and the unembedding, each multiplied once by
    a ``rows``-row input. No attention, cache, norm or sampling: ``4 × t(4) / t(16)`` is the 16-over-4-slot
    ratio of a step that cost only its matmuls. Work per row (attention over the cache, sampling) pulls an
    engine's ratio below it; a fixed cost per step pushes it above."""
    import jax
    from flax import nnx

    lm_head = getattr(model, "lm_head", None)  # counted once, as the unembedding
    linear = [module.kernel[...] for _, module in nnx.iter_modules(model)
              if isinstance(module, nnx.Linear) and module is not lm_head]
    w_vd = model.unembedding_vd()
    # Random inputs passed in, so the compiler cannot fold a product; summing every product keeps each one live.
    xs = [jax.random.normal(jax.random.key(i), (rows, w.shape[0]), w.dtype) for i, w in enumerate(linear)]
    x_d = jax.random.normal(jax.random.key(len(xs)), (rows, w_vd.shape[1]), w_vd.dtype)

    @jax.jit
    def matmuls(xs: list[jax.Array], linear: list[jax.Array], x_d: jax.Array, w_vd: jax.Array) -> jax.Array:
        return sum((x @ w).sum() for x, w in zip(xs, linear, strict=True)) + (x_d @ w_vd.T).sum()

    matmuls(xs, linear, x_d, w_vd).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        matmuls(xs, linear, x_d, w_vd).block_until_ready()
        times.append(time.perf_counter() - start)
    return min(times)


PARTS = {"train": part_train, "bf16": part_bf16, "engine": part_engine}

CPU_SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
"""Set for the parts' processes: XLA's CPU scheduler that orders for concurrency starts independent work early and
keeps its outputs alive meanwhile; in the float32 GRPO step at this size the compiled step's peak is lower with it
off. Not a project default: on the tiny CPU runs it would trade speed nobody measured for memory nobody
lacks, and accelerator backends ignore it."""


def _run_part(part: str, args: dict[str, Any], ctx: BenchContext) -> dict[str, float]:
    ctx.progress(f"realsize: {part} {json.dumps({k: v for k, v in args.items() if k != 'hf'})}")
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {CPU_SCHEDULER_FLAG}".strip()}
    done = subprocess.run([sys.executable, "-m", "bench.realsize", part, json.dumps(args)],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=3600, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"realsize part {part!r} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@register_bench(
    "realsize",
    title="A Qwen3-0.6B-shaped model on one CPU device",
    measures="Memory and speed of the train step and the engine at a real model size: peak RSS of a float32 GRPO "
             "step with per-layer remat (the configuration to run at this size) and how much of the parameter + "
             "Adam state XLA aliases (donation), the same step without remat, RSS growth over 20 steps, and the "
             "update error of bfloat16 compute on float32 master weights (the engine at this size: "
             "`realsize_engine`).",
    method="`bench/realsize.py`: random `Decoder` from Qwen3-0.6B's config values (596 M parameters, float32), built "
           "by one compiled initialisation (`mesh.create_sharded`), each part in its own subprocess, with XLA's "
           "concurrency-optimised CPU scheduler off (`CPU_SCHEDULER_FLAG`) and "
           "the compiler's freed heap returned to the OS after each compile, as in the trainer "
           "(`pipelines_lib.heap`). Train: batch 4 × 256 (GRPO, AdamW) with `StepConfig.remat` (trainer.step.remat: "
           "full), the configuration to run at this size (without it the step's activations alone push the "
           "peak past the goal: `no_remat_*`), XLA memory analysis of the compiled step, peak RSS (`ru_maxrss`, "
           "model init and compilation included), 2 steps; no remat: the same step keeping every activation; "
           "growth (no remat): 21 steps at 4 × 32 (20 of 4 × 256 take minutes on two cores), RSS and live JAX "
           "array bytes after the first and the last. bf16: one SGD step "
           "(lr 1, so the update Δ is the gradient) at 2 × 64 in float32 and with `Precision(compute='bfloat16')` "
           "from the same weights, ‖Δ_bf16 − Δ_f32‖ / ‖Δ_f32‖ (L2 over all parameters); the batch's ids follow "
           "Zipf's law (P(k) ∝ 1/k, as text's tokens do, not uniform over the vocabulary) and its behaviour "
           "log-probs are the model's own (on-policy, importance ratio 1, as GRPO's first update on fresh "
           "samples). Split into `bf16_weight_rounding_rel_error` (the float32 step from the weights rounded "
           "to bfloat16, which any bfloat16 forward sees, against the float32 step) and "
           "`bf16_arithmetic_rel_error` (bfloat16 compute against the float32 step from those rounded weights).",
    goals=(
        Goal(key="realsize.train_peak_gib", op="<=", value=10.0, why="≈ 9 GiB of state; donation keeps one copy"),
        Goal(key="realsize.train_aliased_fraction", op=">=", value=0.9,
             why="parameters and optimiser state updated in place"),
        Goal(key="realsize.train_rss_growth_gib_20_steps", op="<=", value=0.2, why="flat memory over a run"),
        Goal(key="realsize.bf16_update_rel_error", op="<=", value=1e-2,
             why="bfloat16 compute must not change what a step learns"),
    ),
)
def bench_realsize(ctx: BenchContext) -> BenchResult:
    size = QUICK if ctx.quick else FULL
    if not ctx.quick and _available_gib() < MIN_AVAILABLE_GIB:
        raise RuntimeError(f"realsize needs {MIN_AVAILABLE_GIB} GiB available, the machine has "
                           f"{_available_gib():.1f} (run --quick, or wait)")
    runs = {  # in running order: name -> (part, its arguments)
        "train": ("train", {**size, "remat": "full", "steps": 1}),
        "no_remat": ("train", {**size, "remat": "none", "steps": 1}),
        # 20 steps of the full batch take minutes on two cores; memory over steps is watched on shorter rows.
        "growth": ("train", {**size, "length": size["growth_length"], "remat": "none", "steps": size["growth_steps"]}),
        "bf16": ("bf16", size),
    }
    out: dict[str, dict[str, float]] = {}
    failed: dict[str, Exception] = {}
    for name, (part, args) in runs.items():
        try:
            out[name] = _run_part(part, args, ctx)
        except (RuntimeError, subprocess.TimeoutExpired) as err:  # the other parts still measure; raised below
            failed[name] = err
    figures: dict[str, float] = {}
    rows: list[dict[str, Any]] = []
    notes = [f"{'quick: small model' if ctx.quick else 'Qwen3-0.6B shape'}; train batch {size['rows']} × {size['length']}"]
    if train := out.get("train"):
        figures |= {"realsize.train_peak_gib": train["peak_gib"],
                    "realsize.train_aliased_fraction": train["aliased_fraction"],
                    "realsize.train_xla_step_gib": train["xla_step_gib"],
                    "realsize.train_state_gib": train["state_gib"],
                    "realsize.train_step_s": train["step_s"]}
        rows.append({"run": "train step (remat)", "peak RSS GiB": train["peak_gib"],
                     "XLA step GiB": train["xla_step_gib"], "s/step": train["step_s"]})
        notes.append(f"parameter + optimiser state {train['state_gib']:.2f} GiB")
    if growth := out.get("growth"):
        figures |= {"realsize.train_rss_growth_gib_20_steps": growth["rss_growth_gib"],
                    "realsize.train_live_bytes_growth_gib_20_steps": growth["live_growth_gib"]}
    if no_remat := out.get("no_remat"):
        figures |= {"realsize.no_remat_peak_gib": no_remat["peak_gib"],
                    "realsize.no_remat_xla_step_gib": no_remat["xla_step_gib"],
                    "realsize.no_remat_step_s": no_remat["step_s"]}
        rows.append({"run": "train step, no remat", "peak RSS GiB": no_remat["peak_gib"],
                     "XLA step GiB": no_remat["xla_step_gib"], "s/step": no_remat["step_s"]})
    if bf16 := out.get("bf16"):
        figures |= {"realsize.bf16_update_rel_error": bf16["update_rel_error"],
                    "realsize.bf16_weight_rounding_rel_error": bf16["weight_rounding_rel_error"],
                    "realsize.bf16_arithmetic_rel_error": bf16["arithmetic_rel_error"]}
        notes.append(f"bf16 update error {bf16['update_rel_error']:.2%}, of which rounding the weights alone "
                     f"{bf16['weight_rounding_rel_error']:.2%} and bfloat16 arithmetic on rounded weights "
                     f"{bf16['arithmetic_rel_error']:.2%}")
    notes += [f"part {name} FAILED: {str(err).splitlines()[0]}" for name, err in failed.items()]
    result = BenchResult(figures=figures, rows=rows, notes="; ".join(notes) + ".")
    if failed:
        raise PartialResult(result, f"realsize parts {sorted(failed)} failed") from next(iter(failed.values()))
    return result


@register_bench(
    "realsize_engine",
    title="The engine serving a Qwen3-0.6B-shaped model on one CPU device",
    measures="JaxEngine tokens/s at 16 over 4 slots on short requests (attention and KV cache follow the tokens "
             "held, so more slots pay), and the memory peak of its warmup over its steady memory.",
    method="`bench/realsize.py` part `engine`, in its own subprocess: random `Decoder` from Qwen3-0.6B's config "
           "values (596 M parameters, float32); 32 requests (prompt 24, 32 new tokens, temperature 1), "
           "`max_seq_len` 1024, a pool of 128 blocks of 16, prefill buckets 16 and 32, at 16 then 4 slots, "
           "warmed up before timing, the fastest of 3 serves of fresh requests (`--quick`: the small model, 16 requests of prompt 12 and 8 new tokens, a "
           "pool of 48 blocks); warmup peak is the RSS sampled every 5 ms during the 16-slot `warmup()` over "
           "the RSS after serving. Beside it, for reference (`realsize.engine_matmul_16_over_4`, not a goal): one "
           "decode step's weight matmuls alone (every linear kernel and the unembedding times a 16- or 4-row random "
           "input, no attention, cache or sampling; best of 5) as 4 × t(4) / t(16), the ratio of a step that cost "
           "only its matmuls on this machine; work per row (attention, sampling) pulls an engine below it, a fixed "
           "cost per step above.",
    goals=(
        Goal(key="realsize.engine_16_over_4_slots", op=">=", value=2.5,
             why="attention and cache follow the tokens held, so more slots pay"),
        Goal(key="realsize.warmup_peak_over_steady", op="<=", value=1.1, why="warmup allocates no second cache"),
    ),
    prefixes=("realsize.engine_", "realsize.warmup_"),
)
def bench_realsize_engine(ctx: BenchContext) -> BenchResult:
    engine = _run_part("engine", QUICK if ctx.quick else FULL, ctx)
    figures = {
        "realsize.engine_tokens_per_s_16": engine["tokens_per_s_16"],
        "realsize.engine_tokens_per_s_4": engine["tokens_per_s_4"],
        "realsize.engine_16_over_4_slots": engine["tokens_per_s_16"] / engine["tokens_per_s_4"],
        "realsize.warmup_peak_over_steady": engine["warmup_peak_gib"] / engine["steady_gib"],
        "realsize.engine_matmul_16_over_4": 4 * engine["matmul_ms_4"] / engine["matmul_ms_16"],
    }
    rows = [{"slots": slots, "tokens/s": engine[f"tokens_per_s_{slots}"], "ms/step": engine[f"ms_per_step_{slots}"],
             "weight matmuls ms": engine[f"matmul_ms_{slots}"]} for slots in (16, 4)]
    notes = (f"{'quick: small model' if ctx.quick else 'Qwen3-0.6B shape'}; warmup peak "
             f"{engine['warmup_peak_gib']:.2f} GiB, steady {engine['steady_gib']:.2f} GiB.")
    return BenchResult(figures=figures, rows=rows, notes=notes)


if __name__ == "__main__":
    print(json.dumps(PARTS[sys.argv[1]](json.loads(sys.argv[2]))), flush=True)
