"""The compute half of ``JaxEngine``: the jitted steps, the per-slot decode inputs and the device runner.

How the pieces fit::

    scheduler (engine.scheduler, event loop)
        DecodeRows: per-slot inputs of the next decode call, kept on the host and changed only where a
                    slot starts, stops or advances (vectorised; nothing is rebuilt per call)
            │ prefill chunks + a snapshot of the rows
            ▼
    DeviceRunner (the engine's worker thread; it alone touches the KV cache)
        dispatch(): prefill chunks, then one decode call; returns at once (JAX dispatch is asynchronous)
        collect():  waits until a dispatched call's tokens, logprobs and counts are on the host
        warmup():   compiles every variant on the live cache, writing nowhere

The KV cache is paged (``model.decoder``, ``engine.blocks``): each call receives the block table. A
prompt's first chunk attends over the blocks its bucket covers (``prefill_calls``: the first chunks of the
prompts admitted together run as one batch); a decode call runs the occupied slots only, in the smallest
of ``EngineConfig.row_buckets`` holding them, over the first ``span`` blocks of each row, ``span`` the
smallest of ``EngineConfig.attention_spans`` covering the positions its rows reach, so its cost follows the
slots occupied and the tokens they hold, not ``num_slots × max_seq_len``.

A decode call is a loop of up to ``decode_steps`` steps on the device (``_decode_steps``): each step feeds
the token the step before sampled, a row samples at most its budget (what ``max_new_tokens`` and the context
leave, known on the host) and stops after a stop id; from then on it reads and writes no block. The host gets
``[steps, rows]`` tokens and logprobs and how many each row sampled.

The scheduler dispatches call N+1 *before* collecting call N, so the device computes N+1 while the host
records N, admits requests and plans N+2 (as vLLM's async scheduling does). A row that continues feeds
the token call N sampled last straight from the device (``from_carry``): its value is not needed on the
host to build N+1. A row that stopped on a stop id in N is still in N+1 (the host does not know yet), but
the device does (``alive_b``, carried like the token): it samples and writes nothing there. So no call
writes keys/values past a request's last kept token, and a block released to the prefix cache holds only
what its key says (plus stale entries past it, written before any later owner's, that causality masks).

**Busy time** is the union over calls of [dispatch, results on the host]: the time during which the
device had work the host was waiting for. A call whose results were already on the device when the host
came for them (the host, not the device, was the bottleneck; the device may have idled) is credited
nothing beyond what is already counted, so ``busy_s`` is a lower bound whenever that happens;
``host_bound_steps`` counts those calls.
"""

from __future__ import annotations

import concurrent.futures
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
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.kv_pool import KVCache


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


NO_BLOCK = np.iinfo(np.int32).max
"""A table entry past every pool: what a row that has stopped inside a decode call reads and writes (writes
to it are dropped, see ``model.kv_pool.write_blocks``)."""


class DecodeOut(NamedTuple):
    """What one decode call returns: the cache, the per-slot carry, and per row its sampled tokens."""

    cache: KVCache
    carry_b: jax.Array
    """Per slot, the newest sampled token (the next call's input where ``from_carry``)."""
    alive_b: jax.Array
    """Per slot, False once the row sampled one of its stop ids (later calls feeding it write nothing)."""
    token_kr: jax.Array
    logprob_kr: jax.Array
    count_r: jax.Array
    """Leading entries of ``token_kr[:, r]`` that row ``r`` really sampled."""


def _decode_steps(
    graphdef: nnx.GraphDef[Decoder],
    steps: int,
    params: dict[Any, Any],
    cache: KVCache,
    table_rn: jax.Array,
    carry_b: jax.Array,
    alive_b: jax.Array,
    rows: DecodeInputs,
) -> DecodeOut:
    """Run ``steps`` decode steps over the rows (slot ``rows.slot_r``), each feeding the token the step before
    sampled, attending over the ``table_rn`` blocks of the row. Step ``j`` of a row feeds position
    ``position_r + j`` and samples completion token ``index_r + j`` with the key a single step would use
    (``request_keys``), so one call of ``steps`` steps gives the tokens and logprobs of as many single steps.

    The loop ends after ``steps`` steps or once no row samples any more. A row samples at most ``budget_r``
    tokens and stops after one of its stop ids (``stop_rs``, padded with -1): from then on it reads and writes
    no block, so no keys/values land past its last kept token. The first input is the slot's ``carry_b`` entry
    where ``from_carry_r`` (the previous call's last token, still on the device; a row the previous call
    stopped stays stopped through ``alive_b``), else ``tokens_r`` from the host (a row's first call). Padding
    rows (slot ``num_slots``, budget 0) write nothing."""
    model = nnx.merge(graphdef, params)
    carried_r = jnp.take(carry_b, rows.slot_r, mode="clip")
    fed_r = jnp.where(rows.from_carry_r, carried_r, rows.tokens_r)
    alive_r = jnp.where(rows.from_carry_r, jnp.take(alive_b, rows.slot_r, mode="clip"), True)
    token_kr = jnp.zeros((steps, rows.slot_r.shape[0]), jnp.int32)
    logprob_kr = jnp.zeros((steps, rows.slot_r.shape[0]), jnp.float32)

    def live(j: jax.Array, alive_r: jax.Array) -> jax.Array:
        return alive_r & (j < rows.budget_r)

    def more(state: tuple[Any, ...]) -> jax.Array:
        return jnp.any(live(state[0], state[3]))  # a loop every row has left stops early

    def step(state: tuple[Any, ...]) -> tuple[Any, ...]:
        j, cache, fed_r, alive_r, count_r, token_kr, logprob_kr = state
        live_r = live(j, alive_r)
        table_jn = jnp.where(live_r[:, None], table_rn, NO_BLOCK)
        h_r1d, cache = model.hidden(fed_r[:, None], (rows.positions_r + j)[:, None], cache, table_jn)
        token_r, logprob_r = sample(model.unembed(h_r1d[:, 0]), rows.temperature_r, rows.top_k_r, rows.top_p_r,
                                    request_keys(rows.seed_r, rows.index_r + j))
        stopped_r = jnp.any(token_r[:, None] == rows.stop_rs, axis=-1)
        return (j + 1, cache, jnp.where(live_r, token_r, fed_r), alive_r & ~(live_r & stopped_r), count_r + live_r,
                token_kr.at[j].set(token_r), logprob_kr.at[j].set(logprob_r))

    count_r = jnp.zeros(rows.slot_r.shape[0], jnp.int32)
    _, cache, fed_r, alive_r, count_r, token_kr, logprob_kr = jax.lax.while_loop(
        more, step, (jnp.int32(0), cache, fed_r, alive_r, count_r, token_kr, logprob_kr))
    return DecodeOut(cache, carry_b.at[rows.slot_r].set(fed_r, mode="drop"),
                     alive_b.at[rows.slot_r].set(alive_r, mode="drop"), token_kr, logprob_kr, count_r)


class Steps(NamedTuple):
    prefill: Any
    decode: Any

    def compilations(self) -> int:
        """Compiled variants so far (per cache shape: prefill per row bucket and prompt bucket, decode per row
        bucket and attention span; ``EngineConfig.prefill_variants`` and ``decode_variants``)."""
        return self.prefill._cache_size() + self.decode._cache_size()


@functools.cache
def steps_for(graphdef: nnx.GraphDef[Decoder], decode_steps: int) -> Steps:
    """Jitted steps with the graph definition closed over (cache donated), memoised per model structure and
    steps per decode call, so engines over equally shaped models (tests, benchmarks, restarted workers) share
    compilations. Closing over the graphdef instead of passing it as a static argument avoids hashing it per
    call."""
    return Steps(
        prefill=jax.jit(functools.partial(_prefill_step, graphdef), donate_argnums=1),
        decode=jax.jit(functools.partial(_decode_steps, graphdef, decode_steps), donate_argnums=1),
    )


class DecodeInputs(NamedTuple):
    """Per-row inputs of one decode call (``DecodeRows.take``)."""

    slot_r: np.ndarray
    tokens_r: np.ndarray
    from_carry_r: np.ndarray
    positions_r: np.ndarray
    budget_r: np.ndarray
    """Tokens the row may sample in this call (0 for padding rows)."""
    stop_rs: np.ndarray
    temperature_r: np.ndarray
    top_k_r: np.ndarray
    top_p_r: np.ndarray
    seed_r: np.ndarray
    index_r: np.ndarray


class DecodeRows:
    """Per-slot inputs of the next decode call. A row is active while its slot holds a request that has
    completion tokens left to sample (``index < limit``); every other row samples nothing and writes no block."""

    def __init__(self, num_slots: int, max_seq_len: int, max_stop_ids: int) -> None:
        n = num_slots
        self.idle_position = max_seq_len
        self.token = np.zeros(n, np.int32)
        """The newest token where it is known on the host (a row's first call)."""
        self.from_carry = np.zeros(n, bool)
        """Feed the token the previous call sampled last for this row instead (it is still on the device)."""
        self.position = np.full(n, max_seq_len, np.int32)
        self.index = np.zeros(n, np.int32)
        """Completion token the next call samples first."""
        self.limit = np.zeros(n, np.int32)
        """Completion tokens the row may sample in all (``max_new_tokens`` or the context, whichever is less)."""
        self.stops = np.full((n, max_stop_ids), -1, np.int32)
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
        self.stops[slot] = -1
        self.stops[slot, : len(sampling.stop_ids)] = sampling.stop_ids
        self.temperature[slot], self.top_k[slot], self.top_p[slot] = sampling.temperature, sampling.top_k, sampling.top_p
        self.seed[slot] = sampling.seed & 0xFFFFFFFF

    def stop(self, slot: int) -> None:
        self.position[slot] = self.idle_position
        self.from_carry[slot] = False

    def active(self) -> np.ndarray:
        return (self.position < self.idle_position) & (self.index < self.limit)

    def take(self, slot_r: np.ndarray, steps: int) -> DecodeInputs:
        """Inputs of the rows ``slot_r`` (active slots, then padding entries ``num_slots``) for a call of
        ``steps`` steps, then advance those slots by the tokens the device will sample for them (their
        budget; a stop id may end a row sooner): their next call feeds the last one from the carry."""
        n = len(self.token)
        real_r = slot_r < n
        s_r = np.minimum(slot_r, n - 1)
        budget_r = np.where(real_r, np.minimum(steps, self.limit[s_r] - self.index[s_r]), 0).astype(np.int32)
        rows = DecodeInputs(
            slot_r=slot_r.astype(np.int32),
            tokens_r=self.token[s_r],
            from_carry_r=self.from_carry[s_r] & real_r,
            positions_r=np.where(real_r, self.position[s_r], self.idle_position).astype(np.int32),
            budget_r=budget_r,
            stop_rs=self.stops[s_r],
            temperature_r=self.temperature[s_r],
            top_k_r=self.top_k[s_r],
            top_p_r=self.top_p[s_r],
            seed_r=self.seed[s_r],
            index_r=self.index[s_r],
        )
        slots = slot_r[real_r]
        self.position[slots] += budget_r[real_r]
        self.index[slots] += budget_r[real_r]
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
    """Group prefill chunks (slot, padded tokens, start) into calls of few compiled shapes (one per prompt
    bucket and row bucket).

    Chunks starting at position 0 (a new prompt, or its first piece) are batched per bucket, padded to a row
    bucket, and several rows attend over the blocks their bucket covers (``span_for(bucket)``), so short
    prompts never attend over the context limit. A single row attends over its slot's whole table row, as a
    chunk starting later (after a reused prefix, or a long prompt's next piece) must: both run as the same
    program, and one row's extra reads are cheap. Later chunks run alone, after every first chunk (a slot's
    chunks stay in order). Padding rows name no block and write nothing.
    """
    calls = []
    no_block = config.pool_blocks
    firsts: dict[int, list[tuple[int, np.ndarray]]] = {}
    for slot, tokens, start in chunks:
        if start == 0:
            firsts.setdefault(len(tokens), []).append((slot, tokens))
    for bucket, group in sorted(firsts.items()):
        rows = config.rows_for(len(group))
        span = config.blocks_per_sequence if rows == 1 else config.span_for(bucket)
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
    """A decode call on its way: device arrays of its sampled tokens, logprobs and counts, and when it was
    dispatched."""

    token_kr: jax.Array
    logprob_kr: jax.Array
    count_r: jax.Array
    at: float


class Collected(NamedTuple):
    """A decode call's results on the host, and what it adds to the busy time (see the module docstring)."""

    token_kr: np.ndarray
    logprob_kr: np.ndarray
    count_r: np.ndarray
    busy_s: float
    host_bound: bool
    busy_from: float
    """Where the credited busy interval starts, on the runner's clock (it ends ``busy_s`` later)."""


class DeviceRunner:
    """Owns the KV cache and the per-slot carry; every method runs in the engine's worker thread."""

    def __init__(self, steps: Steps, cache: KVCache, num_slots: int, device: Any,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.steps = steps
        self.cache = cache
        self._carry_b = jax.device_put(np.zeros(num_slots, np.int32), device)
        self._alive_b = jax.device_put(np.ones(num_slots, bool), device)
        self._clock = clock
        self._credited_until = -math.inf

    def dispatch(self, params: dict[Any, Any], prefills: list[Prefill], table_rn: np.ndarray,
                 rows: DecodeInputs) -> Dispatched:
        """Enqueue the prefill calls, then one decode call over ``rows`` attending over ``table_rn``."""
        at = self._clock()
        for call in prefills:
            self.cache = self.steps.prefill(params, self.cache, *call)
        out = self.steps.decode(params, self.cache, table_rn, self._carry_b, self._alive_b, rows)
        self.cache, self._carry_b, self._alive_b = out.cache, out.carry_b, out.alive_b
        return Dispatched(out.token_kr, out.logprob_kr, out.count_r, at)

    def warmup(self, params: dict[Any, Any], config: EngineConfig, decode_steps: int, *, threads: int = 1) -> None:
        """Compile every prefill and decode variant on the live cache (no second cache): every table entry
        is "no block" and every decode row padding, so nothing is written and requests in flight are
        untouched.

        ``threads > 1`` first compiles the variants side by side (ahead of time; XLA compiles outside the GIL),
        and the calls then find them compiled: jit keeps what ``lower(...).compile()`` made for the same
        arguments, so a call neither traces nor compiles again."""
        variants = self._variants(config, decode_steps)
        if threads > 1:
            with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="jax-engine-compile") as pool:
                list(pool.map(lambda v: v[0].lower(params, self.cache, *v[1]).compile(), variants))
        for step, args in variants:
            out = step(params, self.cache, *args)
            self.cache = out.cache if isinstance(out, DecodeOut) else out
        jax.block_until_ready(self.cache)

    def _variants(self, config: EngineConfig, decode_steps: int) -> list[tuple[Any, tuple[Any, ...]]]:
        """(jitted step, its arguments after params and cache) of each variant, writing nowhere (padding decode
        rows leave the carry as it is, so the calls' new carries need not be kept)."""
        n, no_block = config.num_slots, config.pool_blocks
        nowhere = np.full((n, config.blocks_per_sequence), no_block, np.int32)
        variants: list[tuple[Any, tuple[Any, ...]]] = []
        for bucket in config.prefill_buckets:
            for rows in config.row_buckets:
                span = config.blocks_per_sequence if rows == 1 else config.span_for(bucket)
                variants.append((self.steps.prefill, (nowhere[:rows, :span], np.zeros((rows, bucket), np.int32),
                                                      np.zeros(rows, np.int32))))
        idle = DecodeRows(n, config.max_seq_len, config.max_stop_ids)
        for rows in config.row_buckets:
            decode_rows = idle.take(np.full(rows, n), decode_steps)
            variants += [(self.steps.decode, (nowhere[:rows, :span], self._carry_b, self._alive_b, decode_rows))
                         for span in config.attention_spans]
        return variants

    def collect(self, call: Dispatched) -> Collected:
        """A dispatched decode call's results, waiting for them."""
        host_bound = call.token_kr.is_ready()
        token_kr, logprob_kr, count_r = np.asarray(call.token_kr), np.asarray(call.logprob_kr), np.asarray(call.count_r)
        end = self._clock()
        busy, busy_from = 0.0, end
        if not host_bound:
            busy_from = min(end, max(call.at, self._credited_until))
            busy = end - busy_from
            self._credited_until = end
        return Collected(token_kr, logprob_kr, count_r, busy, host_bound, busy_from)
