"""Engine throughput: continuous vs static batching on request sets of chosen lengths, and the ceiling.

Request sets come from a ``LengthMix``: prompt lengths uniform in a range, and completion budgets
(``max_new_tokens``) from a mixture of turn kinds, each an exact share of the requests with its own
uniform range, shuffled together (``mixed_requests``). Sampling has no stop ids, so every completion
runs to its budget and the schedule, hence the decode-step count, depends on the budgets alone.

* ``LengthMix.agent()``: the turns of a tool-using agent, skewed: three short tool calls for every long
  final answer (see its docstring for the numbers and why).
* ``LengthMix.uniform()``: budgets uniform on one range, the unskewed comparison.

``measure_continuous_vs_static`` runs request sets on engines with the same model, slots and
buckets, each warmed up first (no compilation inside the measured window), submitting every request at
once (zero tool latency):

* ``continuous`` / ``static``: each set in each ``EngineConfig.mode``; tokens/s = generated tokens /
  wall time until the last completion.
* ceiling (ARCHITECTURE §7, for one set): equal requests, all of the set's longest prompt and completion, in
  whole waves of ``num_slots`` and at least as many tokens as the set, so every slot is busy at every
  decode step; the engine's tokens/s with all slots full.

``static_over_continuous_steps`` (decode steps static needs per continuous step) is the timing-free
part of the comparison: it depends only on the schedule, not on machine noise. The tokens/s ratio is
it times static's wall time per decode step over continuous's (``*_ms_per_step``, prefill calls
included): both modes make the same prefill calls, spread over fewer steps in continuous mode, which
pulls the ratio below the step ratio; a larger gap either way is machine noise. Each measurement is
repeated ``repeats`` times, all runs interleaved, and the best tokens/s of each kept: on a shared
machine the best run is the one least disturbed by other processes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from flax import nnx

from pipelines_lib.engine.api import SamplingParams
from pipelines_lib.engine.config import EngineConfig
from pipelines_lib.engine.jax_engine import JaxEngine
from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder

Request = tuple[list[int], SamplingParams]


def _check_range(name: str, lo_hi: tuple[int, int]) -> None:
    lo, hi = lo_hi
    if not 1 <= lo <= hi:
        raise ValueError(f"{name} must be an inclusive range 1 <= lo <= hi, got {lo_hi}")


@dataclass(frozen=True, kw_only=True)
class TurnKind:
    """One kind of turn in a ``LengthMix``: a share of the requests and their completion budgets."""

    name: str
    share: float
    """Fraction of the requests of this kind (the shares of a mix sum to 1)."""
    new_tokens: tuple[int, int]
    """Inclusive range ``max_new_tokens`` is drawn uniformly from."""

    def __post_init__(self) -> None:
        if not 0.0 < self.share <= 1.0:
            raise ValueError(f"TurnKind {self.name!r}: share must be in (0, 1], got {self.share}")
        _check_range(f"TurnKind {self.name!r}: new_tokens", self.new_tokens)


@dataclass(frozen=True, kw_only=True)
class LengthMix:
    """Prompt lengths and completion budgets of a benchmark request set."""

    prompt_lens: tuple[int, int] = (4, 48)
    """Inclusive range prompt lengths are drawn uniformly from."""
    turns: tuple[TurnKind, ...]
    """The kinds of turn. In a set of ``n`` requests the first ``k`` kinds together make exactly
    ``round(n * (their summed shares))`` requests, so the mix is as stated rather than as a binomial
    draw happens to fall; the kinds are then shuffled together."""

    def __post_init__(self) -> None:
        _check_range("LengthMix.prompt_lens", self.prompt_lens)
        if not self.turns:
            raise ValueError("LengthMix.turns must not be empty")
        total = sum(t.share for t in self.turns)
        if not math.isclose(total, 1.0):
            raise ValueError(f"LengthMix.turns shares must sum to 1, got {total}")

    @classmethod
    def agent(cls) -> LengthMix:
        """Turns of a tool-using agent: 3/4 tool calls of 10–30 tokens, 1/4 final answers of 150–200.

        Why these numbers: an agent episode is a few tool calls then one answer (``multihop`` needs
        2–3 ``search`` calls, ``coding`` allows 4 turns), so about one turn in four is long. A tool
        call is a function name plus a few JSON arguments (10–30 tokens); a final answer with its
        reasoning runs to 150 tokens and more, capped at 200 so that prompt (up to 48) plus
        completion stays inside a 256-token KV cache. Chosen from this shape, not fitted to a result.
        """
        return cls(turns=(TurnKind(name="tool call", share=0.75, new_tokens=(10, 30)),
                          TurnKind(name="answer", share=0.25, new_tokens=(150, 200))))

    @classmethod
    def uniform(cls) -> LengthMix:
        """Budgets uniform on 4–96 tokens (mean 50): the unskewed comparison."""
        return cls(turns=(TurnKind(name="any", share=1.0, new_tokens=(4, 96)),))

    def static_steps_factor(self, num_slots: int) -> float:
        """E[longest of ``num_slots`` budgets] / E[budget], budgets drawn i.i.d. from the mix.

        A static batch of ``num_slots`` decodes for its longest budget; a perfectly packed continuous
        schedule spends the mean budget per request per slot. So this is the static-over-continuous
        decode-step ratio for many requests; with few requests the continuous run's tail (too few
        requests left to fill the slots) brings the measured ratio below it. With the CDF ``F`` of
        one budget, E[longest] = Σ_{x≥0} (1 − F(x)^num_slots).
        """
        top = max(t.new_tokens[1] for t in self.turns)
        pmf = np.zeros(top + 1)
        for t in self.turns:
            lo, hi = t.new_tokens
            pmf[lo : hi + 1] += t.share / (hi - lo + 1)
        cdf = np.cumsum(pmf)
        longest = float(np.sum(1.0 - cdf[:top] ** num_slots))
        return longest / float(np.dot(np.arange(top + 1), pmf))

    def describe(self) -> str:
        """One line for benchmark text, e.g. ``prompts 4–48; 75% tool call 10–30, 25% answer 150–200``."""
        turns = ", ".join(f"{t.share:.0%} {t.name} {t.new_tokens[0]}–{t.new_tokens[1]}" for t in self.turns)
        return f"prompts {self.prompt_lens[0]}–{self.prompt_lens[1]} tokens; completions {turns} tokens"


def mixed_requests(n: int, mix: LengthMix, *, vocab_size: int, seed: int) -> list[Request]:
    """``n`` seeded sampling requests (temperature 1, request ``i`` seeded ``i``) drawn from ``mix``."""
    rng = np.random.default_rng(seed)
    bounds = [round(n * c) for c in np.cumsum([t.share for t in mix.turns])]
    kinds = [k for k, (lo, hi) in enumerate(zip([0, *bounds[:-1]], bounds, strict=True)) for _ in range(hi - lo)]
    requests = []
    for i, k in enumerate(rng.permutation(kinds)):
        prompt_len = int(rng.integers(mix.prompt_lens[0], mix.prompt_lens[1] + 1))
        prompt = rng.integers(1, vocab_size, prompt_len).tolist()
        lo, hi = mix.turns[k].new_tokens
        sampling = SamplingParams(temperature=1.0, max_new_tokens=int(rng.integers(lo, hi + 1)), seed=i)
        requests.append((prompt, sampling))
    return requests


async def _throughput(model: Decoder, config: EngineConfig, requests: Sequence[Request]) -> dict[str, float]:
    async with JaxEngine(model, config) as engine:
        await engine.warmup()
        engine.reset_stats()
        await asyncio.gather(*[engine.generate(prompt, sampling) for prompt, sampling in requests])
        return engine.stats()


def _ceiling_requests(requests: Sequence[Request], num_slots: int) -> list[Request]:
    longest_prompt = max((p for p, _ in requests), key=len)
    longest_new = max(s.max_new_tokens for _, s in requests)
    waves = math.ceil(sum(s.max_new_tokens for _, s in requests) / (num_slots * longest_new))
    return [
        (longest_prompt, SamplingParams(temperature=1.0, max_new_tokens=longest_new, seed=i))
        for i in range(waves * num_slots)
    ]


def _check_fits(name: str, requests: Sequence[Request], max_seq_len: int) -> None:
    for i, (prompt, sampling) in enumerate(requests):
        if len(prompt) + sampling.max_new_tokens > max_seq_len:
            # It would stop early with finish reason "context", silently changing the request mix.
            raise ValueError(f"request set {name!r}, request {i}: prompt {len(prompt)} + max_new_tokens "
                             f"{sampling.max_new_tokens} exceeds EngineConfig.max_seq_len={max_seq_len}")


def _figures(cont: dict[str, float], static: dict[str, float], n_requests: int) -> dict[str, float]:
    return {
        "continuous_tokens_per_s": cont["tokens_per_s"],
        "static_tokens_per_s": static["tokens_per_s"],
        "continuous_over_static": cont["tokens_per_s"] / static["tokens_per_s"],
        "continuous_decode_steps": cont["decode_steps"],
        "static_decode_steps": static["decode_steps"],
        "static_over_continuous_steps": static["decode_steps"] / cont["decode_steps"],
        "continuous_ms_per_step": 1e3 * cont["wall_s"] / cont["decode_steps"],
        "static_ms_per_step": 1e3 * static["wall_s"] / static["decode_steps"],
        "continuous_slot_occupancy": cont["slot_occupancy"],
        "static_slot_occupancy": static["slot_occupancy"],
        "continuous_busy_fraction": cont["busy_fraction"],
        "generated_tokens": cont["generated_tokens"],
        "n_requests": n_requests,
    }


def measure_continuous_vs_static(
    request_sets: Mapping[str, Sequence[Request]],
    model: Decoder | None = None,
    *,
    engine_config: EngineConfig | None = None,
    repeats: int = 3,
    ceiling_of: str | None = None,
) -> dict[str, dict[str, float]]:
    """Run the measurements (blocking; call from sync code); flat figures per request set name.

    Every set runs in both modes; with ``ceiling_of`` naming a set, the ceiling built from it runs too
    and its four figures join that set's. Each repetition runs everything once, in turn, so every run
    sees the same machine conditions in the long run. Defaults: the tiny model (random init) and
    ``EngineConfig.tiny()``.
    """
    config = engine_config if engine_config is not None else EngineConfig.tiny()
    if ceiling_of is not None and ceiling_of not in request_sets:
        raise ValueError(f"ceiling_of={ceiling_of!r} is not a request set; choose one of {sorted(request_sets)}")
    runs: dict[tuple[str, str], tuple[EngineConfig, Sequence[Request]]] = {}
    for name, requests in request_sets.items():
        _check_fits(name, requests, config.max_seq_len)
        for mode in ("continuous", "static"):
            runs[name, mode] = (dataclasses.replace(config, mode=mode), requests)
    if ceiling_of is not None:
        runs[ceiling_of, "ceiling"] = (dataclasses.replace(config, mode="continuous"),
                                       _ceiling_requests(request_sets[ceiling_of], config.num_slots))
    model = model if model is not None else Decoder(ModelConfig.tiny(), rngs=nnx.Rngs(0))

    async def run_all() -> dict[tuple[str, str], dict[str, float]]:
        best: dict[tuple[str, str], dict[str, float]] = {}
        for _ in range(repeats):
            for key, (cfg, requests) in runs.items():
                stats = await _throughput(model, cfg, requests)
                if key not in best or stats["tokens_per_s"] > best[key]["tokens_per_s"]:
                    best[key] = stats
        return best

    best = asyncio.run(run_all())
    figures = {name: _figures(best[name, "continuous"], best[name, "static"], len(requests))
               for name, requests in request_sets.items()}
    if ceiling_of is not None:
        ceiling, f = best[ceiling_of, "ceiling"], figures[ceiling_of]
        f["ceiling_tokens_per_s"] = ceiling["tokens_per_s"]
        f["ceiling_decode_steps"] = ceiling["decode_steps"]
        f["ceiling_ms_per_step"] = 1e3 * ceiling["wall_s"] / ceiling["decode_steps"]
        f["continuous_over_ceiling"] = f["continuous_tokens_per_s"] / ceiling["tokens_per_s"]
    return figures
