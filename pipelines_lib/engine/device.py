"""The compute half of ``JaxEngine``: the jitted steps, the per-slot decode inputs and the device runner.

How the pieces fit::

    scheduler (jax_engine, event loop)
        DecodeRows: per-slot inputs of the next decode step, kept on the host and changed only where a
                    slot starts, stops or advances (vectorised; nothing is rebuilt per step)
            │ prefill chunks + a snapshot of the rows
            ▼
    DeviceRunner (the engine's worker thread; it alone touches the KV cache)
        dispatch(): prefill chunks, then one decode step; returns at once (JAX dispatch is asynchronous)
        collect():  waits until a dispatched step's tokens and logprobs are on the host
        warmup():   compiles every step variant on the live cache, writing nowhere

The KV cache is paged (``model.decoder``, ``engine.blocks``): each step receives the block table. A
prefill chunk attends over its slot's whole table row; a decode step over the first ``span`` blocks of
every row, ``span`` the smallest of ``EngineConfig.attention_spans`` covering the longest sequence, so
its attention costs what the sequences hold, not the context limit.

The scheduler dispatches step N+1 *before* collecting step N, so the device computes N+1 while the host
records N, admits requests and plans N+2 (as vLLM's async scheduling does). A row that continues feeds
the token step N sampled straight from the device (``from_carry``): its value is not needed on the host
to build N+1. The price is that a request ending on a stop id at step N was also decoded in N+1; that
token is discarded (limits on ``max_new_tokens`` and the context are known in advance, so those rows
stop on time). The extra step only writes the keys/values of the request's final token, past every
prefix a later turn can reuse, so the cache stays consistent.

**Busy time** is the union over steps of [dispatch, results on the host]: the time during which the
device had work the host was waiting for. A step whose results were already on the device when the host
came for them (the host, not the device, was the bottleneck; the device may have idled) is credited
nothing beyond what is already counted, so ``busy_s`` is a lower bound whenever that happens;
``host_bound_steps`` counts those steps.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pipelines_lib.engine.api import SamplingParams
from pipelines_lib.engine.sampling import request_keys, sample
from pipelines_lib.model.decoder import Decoder, KVCache


def _prefill_step(
    graphdef: nnx.GraphDef[Decoder],
    params: dict[Any, Any],
    cache: KVCache,
    table_1n: jax.Array,
    tokens_1t: jax.Array,
    start: jax.Array,
) -> KVCache:
    """Write the keys/values of one prompt chunk of one slot (block table row ``table_1n``) at positions
    ``start + [0, T)``.

    Prefill covers the prompt minus its last token; the decode step feeds that token and samples the
    first completion token, so sampling has one code path.
    """
    model = nnx.merge(graphdef, params)
    positions_1t = start + jnp.arange(tokens_1t.shape[1], dtype=jnp.int32)[None, :]
    return model.hidden(tokens_1t, positions_1t, cache, table_1n)[1]


def _decode_step(
    graphdef: nnx.GraphDef[Decoder],
    params: dict[Any, Any],
    cache: KVCache,
    table_bn: jax.Array,
    carry_b: jax.Array,
    tokens_b: jax.Array,
    from_carry_b: jax.Array,
    positions_b: jax.Array,
    temperature_b: jax.Array,
    top_k_b: jax.Array,
    top_p_b: jax.Array,
    seed_b: jax.Array,
    index_b: jax.Array,
) -> tuple[KVCache, jax.Array, jax.Array]:
    """Feed each slot's newest token at its position and sample completion token ``index_b``, attending
    over the ``table_bn`` blocks of each row.

    The newest token is ``carry_b`` (the previous step's sampled token, still on the device) where
    ``from_carry_b``, else ``tokens_b`` from the host (a row's first step)."""
    model = nnx.merge(graphdef, params)
    fed_b = jnp.where(from_carry_b, carry_b, tokens_b)
    h_b1d, cache = model.hidden(fed_b[:, None], positions_b[:, None], cache, table_bn)
    logits_bv = model.unembed(h_b1d[:, 0])
    token_b, logprob_b = sample(logits_bv, temperature_b, top_k_b, top_p_b, request_keys(seed_b, index_b))
    return cache, token_b, logprob_b


class Steps(NamedTuple):
    prefill: Any
    decode: Any

    def compilations(self) -> int:
        """Compiled variants so far (one per prefill bucket, one per decode attention span, per cache shape)."""
        return self.prefill._cache_size() + self.decode._cache_size()


@functools.cache
def steps_for(graphdef: nnx.GraphDef[Decoder]) -> Steps:
    """Jitted steps with the graph definition closed over (cache donated), memoised per model structure
    so engines over equally shaped models (tests, benchmarks, restarted workers) share compilations.
    Closing over the graphdef instead of passing it as a static argument avoids hashing it per call."""
    return Steps(
        prefill=jax.jit(functools.partial(_prefill_step, graphdef), donate_argnums=1),
        decode=jax.jit(functools.partial(_decode_step, graphdef), donate_argnums=1),
    )


class DecodeRows:
    """Per-slot inputs of the next decode step. A row is active while its slot holds a request that has
    completion tokens left to sample (``index < limit``); every other row feeds a position past the
    cache end, whose write the model drops."""

    def __init__(self, num_slots: int, max_seq_len: int) -> None:
        n = num_slots
        self.idle_position = max_seq_len
        self.token = np.zeros(n, np.int32)
        """The newest token where it is known on the host (a row's first step)."""
        self.from_carry = np.zeros(n, bool)
        """Feed the token the previous step sampled for this row instead (it is still on the device)."""
        self.position = np.full(n, max_seq_len, np.int32)
        self.index = np.zeros(n, np.int32)
        """Completion token the next step samples."""
        self.limit = np.zeros(n, np.int32)
        """Completion tokens the row may sample in all (``max_new_tokens`` or the context, whichever is less)."""
        self.temperature = np.zeros(n, np.float32)
        self.top_k = np.zeros(n, np.int32)
        self.top_p = np.ones(n, np.float32)
        self.seed = np.zeros(n, np.uint32)

    def start(self, slot: int, sequence: list[int], generated: int, sampling: SamplingParams) -> None:
        """Row ``slot`` continues ``sequence`` (prompt + the ``generated`` completion tokens so far)."""
        self.token[slot] = sequence[-1]
        self.from_carry[slot] = False
        self.position[slot] = len(sequence) - 1
        self.index[slot] = generated
        prompt_len = len(sequence) - generated
        self.limit[slot] = min(sampling.max_new_tokens, self.idle_position - prompt_len)
        self.temperature[slot], self.top_k[slot], self.top_p[slot] = sampling.temperature, sampling.top_k, sampling.top_p
        self.seed[slot] = sampling.seed & 0xFFFFFFFF

    def stop(self, slot: int) -> None:
        self.position[slot] = self.idle_position
        self.from_carry[slot] = False

    def active(self) -> np.ndarray:
        return (self.position < self.idle_position) & (self.index < self.limit)

    def take(self, active: np.ndarray) -> tuple[np.ndarray, ...]:
        """Copies of the decode inputs (idle rows past the cache end), then advance the active rows by one
        token, which the device will sample: their next step feeds it from the carry."""
        rows = (
            self.token.copy(),
            self.from_carry & active,
            np.where(active, self.position, self.idle_position).astype(np.int32),
            self.temperature.copy(),
            self.top_k.copy(),
            self.top_p.copy(),
            self.seed.copy(),
            self.index.copy(),
        )
        self.position[active] += 1
        self.index[active] += 1
        self.from_carry[active] = True
        return rows


@dataclass(frozen=True)
class Dispatched:
    """A step on its way: device arrays of sampled tokens and logprobs, and when it was dispatched."""

    token_b: jax.Array
    logprob_b: jax.Array
    at: float


class DeviceRunner:
    """Owns the KV cache and the carried tokens; every method runs in the engine's worker thread."""

    def __init__(self, steps: Steps, cache: KVCache, num_slots: int, device: Any,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.steps = steps
        self.cache = cache
        self._carry_b = jax.device_put(np.zeros(num_slots, np.int32), device)
        self._clock = clock
        self._credited_until = -math.inf

    def dispatch(
        self,
        params: dict[Any, Any],
        prefills: list[tuple[int, np.ndarray, int]],
        rows: tuple[np.ndarray, ...],
        table: np.ndarray,
        span: int,
    ) -> Dispatched:
        """Enqueue the prefill chunks (slot, padded tokens, start), then one decode step over every slot
        attending over the first ``span`` blocks of ``table``."""
        at = self._clock()
        for slot, tokens, start in prefills:
            self.cache = self.steps.prefill(params, self.cache, table[slot : slot + 1], tokens[None, :], np.int32(start))
        self.cache, token_b, logprob_b = self.steps.decode(params, self.cache, table[:, :span], self._carry_b, *rows)
        self._carry_b = token_b
        return Dispatched(token_b, logprob_b, at)

    def warmup(self, params: dict[Any, Any], buckets: tuple[int, ...], spans: tuple[int, ...], width: int) -> None:
        """Compile every prefill bucket and decode span on the live cache (no second cache): every table
        entry is "no block", so nothing is written and requests in flight are untouched."""
        n = len(self._carry_b)
        nowhere = np.full((n, width), self.cache[0].k_nskd.shape[0], np.int32)
        for bucket in buckets:
            self.cache = self.steps.prefill(params, self.cache, nowhere[:1], np.zeros((1, bucket), np.int32), np.int32(0))
        idle = DecodeRows(n, width * self.cache[0].k_nskd.shape[1])
        rows = idle.take(idle.active())
        for span in spans:
            self.cache, *_ = self.steps.decode(params, self.cache, nowhere[:, :span], self._carry_b, *rows)
        jax.block_until_ready(self.cache)

    def collect(self, step: Dispatched) -> tuple[np.ndarray, np.ndarray, float, bool]:
        """(tokens, logprobs, busy seconds to credit, host_bound) of a dispatched step, waiting for it."""
        host_bound = step.token_b.is_ready()
        token_b, logprob_b = np.asarray(step.token_b), np.asarray(step.logprob_b)
        end = self._clock()
        busy = 0.0
        if not host_bound:
            busy = max(0.0, end - max(step.at, self._credited_until))
            self._credited_until = end
        return token_b, logprob_b, busy, host_bound
