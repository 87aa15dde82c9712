"""Benchmark ``engine``: continuous vs static batching in the JAX engine, on an agent-like and a uniform mix.

A thin registration over ``bench.engine_runs`` (which documents the runs and the request mixes): this module
picks the sizes and mixes, prefixes the figures (headline keys ``engine.*`` on the agent mix, the uniform
mix under ``engine.uniform_*``), turns them into table rows and draws the plot.
"""

from __future__ import annotations

from pathlib import Path

from flax import nnx

from bench.engine_runs import LengthMix, measure_continuous_vs_static, mixed_requests
from bench.plots import barh
from bench.registry import BenchContext, BenchResult, Goal, register_bench
from pipelines_lib.engine.config import EngineConfig
from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder

ENGINE = EngineConfig(num_slots=8, max_seq_len=256, prefill_buckets=(16, 32, 64))
"""8 slots, the `EngineConfig` default; 16 would widen the gap further (the longest of 16 budgets is
longer: `LengthMix.agent().static_steps_factor(16)` ≈ 3.2 against 2.85) at twice the CPU per decode step. KV cache 256 holds the longest
agent turn (48 + 200); buckets up to 64 hold every prompt (≤ 48) in one prefill call, so continuous
admission never pays for chunking."""
AGENT = LengthMix.agent()
"""The headline mix: skewed like agent turns (see ``LengthMix.agent``)."""
UNIFORM = LengthMix.uniform()
"""The unskewed comparison, reported under ``engine.uniform_*``."""
QUICK = {"n_requests": 16, "repeats": 1}
FULL = {"n_requests": 96, "repeats": 3}
"""96 requests = 12 static batches: enough that the continuous run's tail (its last long answers decoding
with few slots busy) is a small part of it."""
SEED = 0


def _plot(path: Path, rows: list[dict]) -> None:
    colors = {"continuous": "tab:blue", "static": "tab:gray", "ceiling (all slots full)": "tab:green"}
    barh(path, [f"{r['mix']}: {r['run']}" for r in rows], [r["tokens/s"] for r in rows],
         colors=[colors[r["run"]] for r in rows], xlabel="generated tokens/s (best of repetitions)",
         title=f"JaxEngine, tiny model, {ENGINE.num_slots} slots", figsize=(6.5, 3.0))


@register_bench(
    "engine",
    title="Continuous vs static batching in the JAX engine",
    measures="Generated tokens/s of `JaxEngine` in continuous mode (requests join and leave slots between decode "
             "steps) over static mode (a batch is admitted only when every slot is free, prefills together, "
             "decodes until its longest request finishes and returns together), on the same requests with "
             "agent-like skewed completion lengths (headline) and with uniform ones (`engine.uniform_*`); and "
             "the ceiling: tokens/s with every slot busy for the whole window (ARCHITECTURE §7).",
    method=f"`bench.engine_runs.measure_continuous_vs_static`: tiny model (random init, `ModelConfig.tiny()`), "
           f"{ENGINE.num_slots} slots, KV cache {ENGINE.max_seq_len}, prefill buckets {ENGINE.prefill_buckets} "
           "(every prompt prefills in one call). Agent mix (`LengthMix.agent()`): "
           f"{AGENT.describe()}: about three tool calls per final answer, as in the multi-turn envs; the shares "
           "are exact (shuffled), the lengths uniform within each kind. Uniform mix: "
           f"{UNIFORM.describe()}. Temperature 1, no stop ids (every completion runs to its budget), per-request "
           "seeds (the same tokens in both modes), all requests submitted at once. Ceiling: equal requests of the "
           "agent set's longest prompt and completion, in whole waves of one per slot, at least as many tokens "
           "as the set. Each engine is warmed up (every prefill bucket and the decode step compiled) before its "
           "stats are reset, so no compilation is timed. The runs are interleaved per repetition and the best "
           "tokens/s of each is kept (the least disturbed run on a shared machine). "
           "`static_over_continuous_steps` (decode steps static needs per continuous step) is the timing-free "
           "part of the comparison. The tokens/s ratio is it times static's wall time per decode step over "
           "continuous's (`*_ms_per_step`, prefill calls included): the same prefill calls spread over fewer "
           "continuous steps pull it below the step ratio, and machine noise moves it either way.",
    goals=(Goal(key="engine.continuous_over_static", op=">=", value=2.0,
                why="continuous batching should not wait for the longest request of a batch"),),
)
def bench_engine(ctx: BenchContext) -> BenchResult:
    size = QUICK if ctx.quick else FULL
    n, repeats = size["n_requests"], size["repeats"]
    model = Decoder(ModelConfig.tiny(), rngs=nnx.Rngs(SEED))
    vocab = model.cfg.vocab_size
    ctx.progress(f"engine: agent and uniform mixes, {n} requests each, {repeats} repetition(s)")
    sets = {"agent": mixed_requests(n, AGENT, vocab_size=vocab, seed=SEED),
            "uniform": mixed_requests(n, UNIFORM, vocab_size=vocab, seed=SEED)}
    measured = measure_continuous_vs_static(sets, model, engine_config=ENGINE, repeats=repeats, ceiling_of="agent")
    agent, uniform = measured["agent"], measured["uniform"]
    figures = {f"engine.{k}": v for k, v in agent.items()}
    figures |= {f"engine.uniform_{k}": v for k, v in uniform.items() if k != "n_requests"}
    figures["engine.num_slots"] = ENGINE.num_slots
    rows = [
        {"mix": mix, "run": run, "tokens/s": f[f"{run}_tokens_per_s"], "decode steps": f[f"{run}_decode_steps"],
         "ms/step": f[f"{run}_ms_per_step"], "slot occupancy": f[f"{run}_slot_occupancy"]}
        for mix, f in (("agent", agent), ("uniform", uniform)) for run in ("continuous", "static")
    ]
    rows.insert(2, {"mix": "agent", "run": "ceiling (all slots full)", "tokens/s": agent["ceiling_tokens_per_s"],
                    "decode steps": agent["ceiling_decode_steps"], "ms/step": agent["ceiling_ms_per_step"],
                    "slot occupancy": 1.0})
    plot = "engine_throughput.png"
    _plot(ctx.plot_dir / plot, rows)
    slots = ENGINE.num_slots
    agent_factor, uniform_factor = AGENT.static_steps_factor(slots), UNIFORM.static_steps_factor(slots)
    notes = (f"{n} requests per mix, {int(agent['generated_tokens'])} (agent) and "
             f"{int(uniform['generated_tokens'])} (uniform) generated tokens per run, {repeats} repetition(s). "
             "The ceiling row's occupancy is 1 by construction (equal requests, one per slot at a time). "
             f"Decode-step ratio expected for many requests (`LengthMix.static_steps_factor`: the longest of "
             f"{slots} budgets over the mean budget): agent {agent_factor:.2f}, uniform {uniform_factor:.2f}; "
             f"measured on these {n}: agent {agent['static_over_continuous_steps']:.2f}, uniform "
             f"{uniform['static_over_continuous_steps']:.2f} (below the expectation by the continuous run's tail, "
             "its last long answers decoding with few slots busy, and any step a freed slot waits for its next "
             f"request). Uniform lengths cannot show a 2× gap: {uniform_factor:.2f} even with perfect packing. "
             f"With agent turns almost every batch of {slots} holds a long answer, so static decodes for about "
             "an answer's length per batch while the mean budget is far shorter.")
    return BenchResult(figures=figures, rows=rows, plots=[plot], notes=notes)
