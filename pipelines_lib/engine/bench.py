"""Engine throughput: continuous vs static batching on one mixed-length request set, and the ceiling.

All three runs use the same model, slots and buckets, are warmed up first (no compilation inside the
measured window), and submit every request at once (zero tool latency):

* ``continuous`` / ``static``: the same mixed request set (prompt lengths and ``max_new_tokens`` drawn
  uniformly) in each ``EngineConfig.mode``; tokens/s = generated tokens / wall time until the last
  completion.
* ceiling (DESIGN §7): as many requests, all of the longest prompt and completion lengths, so every
  slot stays busy for the whole window; the engine's tokens/s with all slots full.

``engine.static_over_continuous_steps`` (decode steps static needs per continuous step) is the
timing-free part of the comparison: it depends only on the schedule, not on machine noise.

Each measurement is repeated ``repeats`` times, the three modes interleaved, and the best tokens/s of
each kept: on a shared machine the best run is the one least disturbed by other processes.
"""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
from flax import nnx

from pipelines_lib.engine.api import SamplingParams
from pipelines_lib.engine.config import EngineConfig
from pipelines_lib.engine.jax_engine import JaxEngine
from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder

Request = tuple[list[int], SamplingParams]


def mixed_requests(
    n: int, *, vocab_size: int, prompt_lens: tuple[int, int], new_tokens: tuple[int, int], seed: int
) -> list[Request]:
    """``n`` seeded sampling requests with lengths drawn uniformly from the inclusive ranges."""
    rng = np.random.default_rng(seed)
    requests = []
    for i in range(n):
        prompt = rng.integers(1, vocab_size, int(rng.integers(prompt_lens[0], prompt_lens[1] + 1))).tolist()
        max_new = int(rng.integers(new_tokens[0], new_tokens[1] + 1))
        requests.append((prompt, SamplingParams(temperature=1.0, max_new_tokens=max_new, seed=i)))
    return requests


async def _throughput(model: Decoder, config: EngineConfig, requests: list[Request]) -> dict[str, float]:
    async with JaxEngine(model, config) as engine:
        await engine.warmup()
        engine.reset_stats()
        await asyncio.gather(*[engine.generate(prompt, sampling) for prompt, sampling in requests])
        return engine.stats()


def measure_continuous_vs_static(
    model: Decoder | None = None,
    *,
    engine_config: EngineConfig | None = None,
    n_requests: int = 32,
    prompt_lens: tuple[int, int] = (4, 48),
    new_tokens: tuple[int, int] = (4, 64),
    seed: int = 0,
    repeats: int = 3,
) -> dict[str, float]:
    """Run the three measurements (blocking; call from sync code) and return flat metrics.

    Defaults: the tiny model (random init) and ``EngineConfig.tiny()``.
    """
    model = model if model is not None else Decoder(ModelConfig.tiny(), rngs=nnx.Rngs(seed))
    config = engine_config if engine_config is not None else EngineConfig.tiny()
    requests = mixed_requests(
        n_requests, vocab_size=model.cfg.vocab_size, prompt_lens=prompt_lens, new_tokens=new_tokens, seed=seed
    )
    longest = max(len(p) for p, _ in requests)
    full = [
        (requests[0][0][:1] * longest, SamplingParams(temperature=1.0, max_new_tokens=new_tokens[1], seed=i))
        for i in range(n_requests)
    ]

    async def run_all() -> tuple[dict[str, float], ...]:
        runs: list[tuple[dict[str, float], ...]] = []
        for _ in range(repeats):
            cont = await _throughput(model, dataclasses.replace(config, mode="continuous"), requests)
            static = await _throughput(model, dataclasses.replace(config, mode="static"), requests)
            ceiling = await _throughput(model, dataclasses.replace(config, mode="continuous"), full)
            runs.append((cont, static, ceiling))
        return tuple(max((r[i] for r in runs), key=lambda s: s["tokens_per_s"]) for i in range(3))

    cont, static, ceiling = asyncio.run(run_all())
    return {
        "engine.continuous_tokens_per_s": cont["tokens_per_s"],
        "engine.static_tokens_per_s": static["tokens_per_s"],
        "engine.continuous_over_static": cont["tokens_per_s"] / static["tokens_per_s"],
        "engine.ceiling_tokens_per_s": ceiling["tokens_per_s"],
        "engine.continuous_over_ceiling": cont["tokens_per_s"] / ceiling["tokens_per_s"],
        "engine.static_over_continuous_steps": static["decode_steps"] / cont["decode_steps"],
        "engine.continuous_slot_occupancy": cont["slot_occupancy"],
        "engine.static_slot_occupancy": static["slot_occupancy"],
        "engine.continuous_busy_fraction": cont["busy_fraction"],
        "engine.generated_tokens": cont["generated_tokens"],
        "engine.num_slots": config.num_slots,
        "engine.n_requests": n_requests,
    }
