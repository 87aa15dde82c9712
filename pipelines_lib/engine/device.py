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
prompt's first chunk attends over the blocks its bucket covers (``prefill_calls``: the first chunks of the
prompts admitted together run as one batch); a decode step runs the occupied slots only, in the smallest
of ``EngineConfig.row_buckets`` holding them, over the first ``span`` blocks of each row, ``span`` the
smallest of ``EngineConfig.attention_spans`` covering the longest sequence, so its cost follows the slots
occupied and the tokens they hold, not ``num_slots × max_seq_len``.

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
from pipelines_lib.engine.config import EngineConfig
from pipelines_lib.engine.sampling import request_keys, sample
from pipelines_lib.model.decoder import Decoder, KVCache


def _prefill_step(
    graphdef: nnx.GraphDef[Decoder],
    params: dict[Any, Any],
    cache: KVCache,
    table_rn: jax.Array,
    tokens_rt: jax.Array,
    start_r: jax.Array,
) -> KVCache:
    """Write the keys/values of one prompt chunk per row (block table row ``table_rn``) at positions
    ``start_r + [0, T)``; padding rows name no block, so they write nothing.

    Prefill covers the prompt minus its last token; the decode step feeds that token and samples the
    first completion token, so sampling has one code path.
    """
    model = nnx.merge(graphdef, params)
    positions_rt = start_r[:, None] + jnp.arange(tokens_rt.shape[1], dtype=jnp.int32)[None, :]
    return model.hidden(tokens_rt, positions_rt, cache, table_rn)[1]


def _decode_step(
    graphdef: nnx.GraphDef[Decoder],
    params: dict[Any, Any],
    cache: KVCache,
    table_rn: jax.Array,
    carry_b: jax.Array,
    slot_r: jax.Array,
    tokens_r: jax.Array,
    from_carry_r: jax.Array,
    positions_r: jax.Array,
    temperature_r: jax.Array,
    top_k_r: jax.Array,
    top_p_r: jax.Array,
    seed_r: jax.Array,
    index_r: jax.Array,
) -> tuple[KVCache, jax.Array, jax.Array]:
    """Feed the newest token of each row (slot ``slot_r``) at its position and sample completion token
    ``index_r``, attending over the ``table_rn`` blocks of the row; returns the cache and, per slot, the
    sampled token (the new carry) and its logprob. Padding rows (slot ``num_slots``) write nothing.

    The newest token is the slot's ``carry_b`` entry (the previous step's sampled token, still on the
    device) where ``from_carry_r``, else ``tokens_r`` from the host (a row's first step)."""
    model = nnx.merge(graphdef, params)
    fed_r = jnp.where(from_carry_r, jnp.take(carry_b, slot_r, mode="clip"), tokens_r)
    h_r1d, cache = model.hidden(fed_r[:, None], positions_r[:, None], cache, table_rn)
    logits_rv = model.unembed(h_r1d[:, 0])
    token_r, logprob_r = sample(logits_rv, temperature_r, top_k_r, top_p_r, request_keys(seed_r, index_r))
    logprob_b = jnp.zeros(carry_b.shape, jnp.float32).at[slot_r].set(logprob_r, mode="drop")
    return cache, carry_b.at[slot_r].set(token_r, mode="drop"), logprob_b


class Steps(NamedTuple):
    prefill: Any
    decode: Any

    def compilations(self) -> int:
        """Compiled variants so far (per cache shape: prefill per row bucket and prompt bucket, decode per row
        bucket and attention span)."""
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

    def take(self, slot_r: np.ndarray) -> tuple[np.ndarray, ...]:
        """Decode inputs of the rows ``slot_r`` (active slots, then padding entries ``num_slots`` that feed
        a position past the cache end), then advance those slots by one token, which the device will
        sample: their next step feeds it from the carry."""
        n = len(self.token)
        real_r = slot_r < n
        s_r = np.minimum(slot_r, n - 1)
        rows = (
            slot_r.astype(np.int32),
            self.token[s_r],
            self.from_carry[s_r] & real_r,
            np.where(real_r, self.position[s_r], self.idle_position).astype(np.int32),
            self.temperature[s_r],
            self.top_k[s_r],
            self.top_p[s_r],
            self.seed[s_r],
            self.index[s_r],
        )
        slots = slot_r[real_r]
        self.position[slots] += 1
        self.index[slots] += 1
        self.from_carry[slots] = True
        return rows


class Prefill(NamedTuple):
    """One batched prefill call: a prompt chunk per row, its start position and block table row."""

    table_rn: np.ndarray
    tokens_rt: np.ndarray
    start_r: np.ndarray


def prefill_calls(
    chunks: list[tuple[int, np.ndarray, int]], table: np.ndarray, config: EngineConfig
) -> list[Prefill]:
    """Group prefill chunks (slot, padded tokens, start) into calls of few compiled shapes.

    Chunks starting at position 0 (a new prompt, or its first piece) are batched per bucket, padded to a row
    bucket, and attend over the blocks their bucket covers (``span_for(bucket)``), so a short prompt never
    attends over the context limit. A chunk starting later (after a reused prefix, or a long prompt's next
    piece) runs alone over its slot's whole table row, after every first chunk (a slot's chunks stay in order).
    Padding rows name no block and write nothing.
    """
    calls = []
    no_block = config.pool_blocks
    firsts: dict[int, list[tuple[int, np.ndarray]]] = {}
    for slot, tokens, start in chunks:
        if start == 0:
            firsts.setdefault(len(tokens), []).append((slot, tokens))
    for bucket, group in sorted(firsts.items()):
        rows, span = config.rows_for(len(group)), config.span_for(bucket)
        table_rn = np.full((rows, span), no_block, np.int32)
        tokens_rt = np.zeros((rows, bucket), np.int32)
        for r, (slot, tokens) in enumerate(group):
            table_rn[r], tokens_rt[r] = table[slot, :span], tokens
        calls.append(Prefill(table_rn, tokens_rt, np.zeros(rows, np.int32)))
    calls += [Prefill(table[[slot]], tokens[None, :], np.array([start], np.int32))
              for slot, tokens, start in chunks if start > 0]
    return calls


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
        self, params: dict[Any, Any], prefills: list[Prefill], table_rn: np.ndarray, rows: tuple[np.ndarray, ...]
    ) -> Dispatched:
        """Enqueue the prefill calls, then one decode step over ``rows`` (``DecodeRows.take``) attending
        over ``table_rn``."""
        at = self._clock()
        for call in prefills:
            self.cache = self.steps.prefill(params, self.cache, *call)
        self.cache, self._carry_b, logprob_b = self.steps.decode(params, self.cache, table_rn, self._carry_b, *rows)
        return Dispatched(self._carry_b, logprob_b, at)

    def warmup(self, params: dict[Any, Any], config: EngineConfig) -> None:
        """Compile every prefill and decode variant on the live cache (no second cache): every table entry
        is "no block" and every decode row padding, so nothing is written and requests in flight are
        untouched."""
        n, width, no_block = config.num_slots, config.blocks_per_sequence, config.pool_blocks
        nowhere = np.full((n, width), no_block, np.int32)
        for bucket in config.prefill_buckets:
            shapes = [(rows, config.span_for(bucket)) for rows in config.row_buckets] + [(1, width)]
            for rows, span in shapes:
                self.cache = self.steps.prefill(params, self.cache, nowhere[:rows, :span],
                                                np.zeros((rows, bucket), np.int32), np.zeros(rows, np.int32))
        idle = DecodeRows(n, config.max_seq_len)
        for rows in config.row_buckets:
            decode_rows = idle.take(np.full(rows, n))
            for span in config.attention_spans:
                self.cache, *_ = self.steps.decode(params, self.cache, nowhere[:rows, :span], self._carry_b,
                                                   *decode_rows)
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
