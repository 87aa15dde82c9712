"""Continuous-batching JAX inference engine implementing ``engine.api.Engine``.

How the pieces fit::

    generate() ──► queue ──► scheduler task (asyncio, owns all request state)
                               │ each iteration, at a decode-step boundary:
                               │   install pending swapped weights, admit queued requests into free slots
                               │   while their KV blocks are free, take the next step's inputs from ``DecodeRows``
                               ▼
                  worker thread (one, ``engine.device.DeviceRunner``): dispatch prefill(admitted) + one
                  decode step over the occupied slots, then wait for the *previous* step's tokens
                               │  (jitted, fixed shapes; the KV cache is donated and updated in place)
                               ▼
                  scheduler appends the previous step's tokens, finishes requests, resolves their futures

* **Pipelined steps.** Step N+1 is dispatched before step N's results are collected, so the device
  computes while the host records tokens, admits requests and plans (see ``engine.device``): the
  engine does not idle for a scheduler round trip per token. A request that ends on a stop id at step N
  was also decoded in N+1; that token is discarded. A request whose last token (by ``max_new_tokens``
  or the context) is in flight hands its slot to the next queued request at once, so a known ending
  costs no idle slot-step (in continuous mode).
* **Slots and cache.** ``num_slots`` rows of the decode step over a paged KV cache: a pool of
  ``num_blocks`` blocks per layer and a block table per slot (``engine.blocks``). A request is admitted
  when a slot is free *and* the blocks of its prompt and ``max_new_tokens`` are, and its blocks return to
  the pool when it finishes, so memory follows the tokens held, not ``slots × max_seq_len``. Each decode
  step attends over the smallest power-of-two number of blocks covering its longest sequence. A block
  is reused without clearing it (see ``model.decoder``).
* **No recompilation per request.** Prefill splits each prompt into chunks of the configured buckets
  chosen for its length (``EngineConfig.prefill_chunks``: 288 tokens run as 256 + 32, not padded to 512;
  only the last chunk is padded) and batches the first chunks
  of the prompts admitted together; decode runs only the occupied slots, padded to a row bucket
  (``EngineConfig.row_buckets``), padding rows writing to a position past the cache end, which is dropped.
  Slots, positions and sampling settings are traced arguments, so after ``warmup()`` (one compile per
  row bucket and prefill bucket, per prefill bucket at full width, and per row bucket and decode
  attention span, on the live cache) nothing compiles again; ``stats()["compilations"]`` counts compiled
  variants to prove it.
  The steps are shared by every engine over an equally shaped model, so they compile once per process.
* **The event loop never blocks on compute.** Device calls run in a dedicated worker thread; the
  scheduler awaits them, so tools and agents keep running while the engine computes.
* **Sampling** (``engine.sampling``): per-row temperature / top-k / top-p and a key folded from the
  request seed and token index, so a seeded request samples the same tokens whatever shares its batch.
  ``Completion.logprobs[i]`` is the log-probability of token ``i`` under the distribution it was
  actually drawn from (temperature-scaled, top-k/top-p filtered and renormalised); for greedy requests
  it is the plain ``log_softmax`` of the model's logits.
* **Hot weight swap.** ``swap_weights`` only records the new parameters; the scheduler installs them at
  the next decode-step boundary (the next step it dispatches; the one in flight keeps the old ones).
  In-flight requests continue with the new weights and every token is stamped with the version that
  produced it (``Completion.policy_versions``); note that the KV cache of their earlier tokens was
  computed by the older weights.
* **Prefix reuse** (``EngineConfig.prefix_reuse``, on by default): a finished request's blocks return to
  the pool still holding its keys/values, in a prefix cache keyed by token content (``engine.blocks``), not
  tied to any slot; a later prompt extending them (the next turn of the same conversation, however many
  requests ran in between) shares or adopts them in whatever slot it gets and prefills only what is new.
  Cached blocks are evicted, least recently used first, only when admission needs them. Only keys/values
  computed wholly by the installed weights are cached: swapped weights clear the cache, and a request in
  flight across the swap leaves nothing in it.
* **Static mode** (``EngineConfig.mode = "static"``) uses the same machinery but admits a batch only
  when all slots are free and returns its completions together once the longest one finishes.
* **Finish reasons**: ``stop`` (a stop id was emitted, and is included), ``length`` (max_new_tokens),
  ``context`` (prompt + completion reached ``max_seq_len``; a prompt that already fills it gets an
  empty completion).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from flax import nnx, traverse_util
from jax.sharding import NamedSharding, PartitionSpec

from pipelines_lib.engine.api import Completion, SamplingParams
from pipelines_lib.engine.blocks import BlockPool
from pipelines_lib.engine.config import EngineConfig
from pipelines_lib.engine.device import (
    DecodeRows,
    DeviceRunner,
    Dispatched,
    Prefill,
    prefill_calls,
    steps_for,
)
from pipelines_lib.mesh import logical_spec, make_mesh, place_state
from pipelines_lib.model.decoder import Decoder, init_cache


class EngineClosedError(RuntimeError):
    """The engine was closed (or its scheduler failed) before the request finished."""


@dataclass(eq=False)
class _Request:
    prompt: list[int]
    sampling: SamplingParams
    future: asyncio.Future[Completion]
    submitted_at: float
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    reused: int = 0
    """Leading prompt tokens whose keys/values the prefix cache already held (prefix reuse)."""
    admitted_at: float = 0.0
    admitted_version: int = 0
    """Weights version installed when the request was admitted: the one its prompt was prefilled with."""
    first_token_at: float = 0.0
    finish_reason: str | None = None

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.tokens)


@dataclass
class _Step:
    """One dispatch: the prefill calls of the admitted prompts, then one decode step over ``rows`` attending
    over ``table_rn``; ``slots``/``requests`` are the slots it samples for, ``version`` the weights it runs
    with."""

    params: dict[Any, Any]
    version: int
    prefills: list[Prefill]
    table_rn: np.ndarray
    rows: tuple[np.ndarray, ...]
    slots: list[int]
    requests: list[_Request]


@dataclass
class _InFlight:
    step: _Step
    dispatched: Dispatched


@dataclass
class _Counters:
    busy_s: float = 0.0
    host_bound_steps: int = 0
    decode_steps: int = 0
    active_slot_steps: int = 0
    prefill_calls: int = 0
    prefill_tokens: int = 0
    reused_prefix_tokens: int = 0
    generated_tokens: int = 0
    requests_finished: int = 0


def _pure_params(params: Any) -> dict[Any, Any]:
    if isinstance(params, nnx.Module):
        params = nnx.state(params, nnx.Param)
    if isinstance(params, nnx.State):
        params = nnx.to_pure_dict(params)
    return params


class JaxEngine:
    """Continuous-batching engine over a ``Decoder``; see the module docstring.

    Use as ``async with JaxEngine(model, EngineConfig.tiny()) as engine: await engine.generate(...)``
    (or call ``close()``). The engine binds to the event loop of its first ``generate``.
    """

    def __init__(
        self,
        model: Decoder,
        config: EngineConfig,
        *,
        policy_version: int = 0,
        clock: Callable[[], float] = time.perf_counter,
    ):
        if config.max_seq_len > model.cfg.max_seq_len:
            raise ValueError(
                f"EngineConfig.max_seq_len={config.max_seq_len} exceeds the model's max_seq_len={model.cfg.max_seq_len}"
            )
        self.config = config
        self.model_cfg = model.cfg
        self._graphdef, state = nnx.split(model, nnx.Param)
        # Parameters and cache are committed to the engine's mesh (by the rules table of ``train.mesh``: heads,
        # MLP and vocabulary over ``tensor``): jit keys its cache on committedness and shardings, and weights
        # restored by Orbax arrive committed, so uncommitted initial ones would recompile on swap.
        self.mesh = mesh = make_mesh(config.mesh)
        self._params = nnx.to_pure_dict(place_state(state, mesh))
        self._param_specs = {
            path: (leaf.shape, leaf.dtype) for path, leaf in traverse_util.flatten_dict(self._params).items()
        }
        self._param_shardings = jax.tree.map(lambda leaf: leaf.sharding, self._params)
        self._version = policy_version
        self._latest_version = policy_version
        self._pending_swap: tuple[dict[Any, Any], int] | None = None
        self._swap_lock = threading.Lock()
        self._steps = steps_for(self._graphdef)
        cache = init_cache(model.cfg, config.pool_blocks, config.block_size)
        # Keys and values split over kv heads, like the projections that write them. The spec is written as the
        # steps return it, trailing unsplit dimensions dropped (P(None, None, None, None) comes back as P()):
        # jit keys its cache on the spec, so the cache placed any other way would compile the first warmed-up
        # variant a second time on its first real call.
        spec = logical_spec((None, None, "kv_heads", "head_dim"), cache[0].k_nskd.shape, mesh)
        while spec and spec[-1] is None:
            spec = PartitionSpec(*spec[:-1])
        cache_sharding = NamedSharding(mesh, spec)
        self._runner = DeviceRunner(
            self._steps,
            jax.device_put(cache, cache_sharding),
            config.num_slots,
            NamedSharding(mesh, PartitionSpec()),
            clock,
        )
        self._rows = DecodeRows(config.num_slots, config.max_seq_len)
        self._memory = BlockPool(num_blocks=config.pool_blocks, block_size=config.block_size,
                                 num_slots=config.num_slots, max_seq_len=config.max_seq_len)
        self._slots: list[_Request | None] = [None] * config.num_slots
        self._queue: deque[_Request] = deque()
        self._detached: list[_Request] = []
        """Requests that left their slot to a new one while their last token was in flight."""
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._closed = False
        self._error: BaseException | None = None
        self._clock = clock
        self._counters = _Counters()
        self._window_start = clock()

    # ---- Engine protocol -------------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        """Version of the newest weights handed to the engine (installed at the next step boundary)."""
        return self._latest_version

    @property
    def max_seq_len(self) -> int:
        return self.config.max_seq_len

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Completion:
        """Complete ``prompt_ids`` (conditioning on exactly these ids). Cancelling the await frees the slot."""
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("generate needs at least one prompt token")
        bad = next((t for t in prompt if not 0 <= t < self.model_cfg.vocab_size), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} outside the vocabulary [0, {self.model_cfg.vocab_size})")
        self._ensure_running()
        now = self._clock()
        if len(prompt) >= self.config.max_seq_len:
            return Completion(
                token_ids=[],
                logprobs=[],
                policy_versions=[],
                finish_reason="context",
                timings={"total_s": 0.0},
            )
        assert self._loop is not None and self._wake is not None
        request = _Request(prompt, sampling, self._loop.create_future(), submitted_at=now)
        self._queue.append(request)
        self._wake.set()
        return await request.future

    def swap_weights(self, params: Any, version: int) -> None:
        """Install new weights (a ``Decoder``, its ``nnx.State`` or pure dict of parameters) from the next
        decode-step boundary on. Shapes and dtypes must match; thread-safe; never blocks on compute."""
        pure = _pure_params(params)
        flat = traverse_util.flatten_dict(pure)
        for path, (shape, dtype) in self._param_specs.items():
            if path not in flat:
                raise ValueError(f"swap_weights: missing parameter {'/'.join(map(str, path))}")
            leaf = flat[path]
            if leaf.shape != shape or leaf.dtype != dtype:
                raise ValueError(
                    f"swap_weights: parameter {'/'.join(map(str, path))} is {leaf.dtype}{list(leaf.shape)}, "
                    f"expected {dtype}{list(shape)}"
                )
        extra = sorted(set(flat) - set(self._param_specs), key=str)
        if extra:
            raise ValueError(f"swap_weights: unexpected parameter {'/'.join(map(str, extra[0]))}")
        # Rebuilt in the engine's own structure and layout so the compiled steps accept it as is: weights already
        # on the engine's shardings stay where they are, others move device to device, never through the host.
        pure = jax.device_put(
            traverse_util.unflatten_dict({path: flat[path] for path in self._param_specs}), self._param_shardings
        )
        with self._swap_lock:
            self._pending_swap = (pure, version)
            self._latest_version = version

    # ---- lifecycle -------------------------------------------------------------------------------

    async def warmup(self) -> None:
        """Compile every prefill bucket and decode attention span now, on the engine's own cache (writing
        nothing into it, so in-flight requests are untouched)."""
        self._ensure_running()
        assert self._loop is not None
        await self._loop.run_in_executor(self._executor, self._warmup_sync)

    async def close(self) -> None:
        """Stop the scheduler after the compute step in flight (waiting at most ``close_timeout_s``);
        requests still queued or running fail with ``EngineClosedError``. A scheduler failure has
        already been delivered to the requests, so it is not raised again here."""
        self._closed = True
        if self._task is not None and self._loop is asyncio.get_running_loop():
            assert self._wake is not None
            self._wake.set()
            _, pending = await asyncio.wait([self._task], timeout=self.config.close_timeout_s)
            for task in pending:
                task.cancel()
        self._fail_all(EngineClosedError("engine closed"))
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    async def __aenter__(self) -> JaxEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- measurement -----------------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        """Counters since construction or ``reset_stats()`` (definitions in ARCHITECTURE §7).

        busy_s: time during which a dispatched compute step (prefill + decode) had results the host was
        waiting for, from its dispatch until they were on the host, overlapping steps counted once
        (``engine.device``; a lower bound when host_bound_steps > 0); host_bound_steps: steps whose
        results were already waiting when the host came for them (credited nothing); wall_s: time
        since the window started; active_slot_steps: sum over decode steps of the slots whose sampled
        token was kept (not a token discarded after a stop id); prefill_tokens: prompt tokens computed
        (reused_prefix_tokens were not); slot_occupancy = active_slot_steps / (decode_steps * num_slots);
        tokens_per_s = generated_tokens / wall_s; compilations: compiled variants of this model
        structure's step functions (shared by engines over equal structures, never reset; constant
        after ``warmup()``). Not counters but the KV pool now: free_blocks (no running request holds
        them; cached ones included) and cached_blocks (holding a finished request's keys/values for reuse).
        """
        c = self._counters
        wall = self._clock() - self._window_start
        return {
            "busy_s": c.busy_s,
            "wall_s": wall,
            "busy_fraction": c.busy_s / wall if wall > 0 else 0.0,
            "host_bound_steps": c.host_bound_steps,
            "decode_steps": c.decode_steps,
            "active_slot_steps": c.active_slot_steps,
            "slot_occupancy": c.active_slot_steps / (c.decode_steps * self.config.num_slots)
            if c.decode_steps
            else 0.0,
            "prefill_calls": c.prefill_calls,
            "prefill_tokens": c.prefill_tokens,
            "reused_prefix_tokens": c.reused_prefix_tokens,
            "generated_tokens": c.generated_tokens,
            "tokens_per_s": c.generated_tokens / wall if wall > 0 else 0.0,
            "requests_finished": c.requests_finished,
            "compilations": self._steps.compilations(),
            "free_blocks": self._memory.free_blocks,
            "cached_blocks": self._memory.cached_blocks,
        }

    def reset_stats(self) -> None:
        self._counters = _Counters()
        self._window_start = self._clock()

    # ---- worker thread ---------------------------------------------------------------------------

    def _compute(
        self, step: _Step | None, previous: _InFlight | None
    ) -> tuple[_InFlight | None, tuple[np.ndarray, np.ndarray, float, bool] | None]:
        """Dispatch ``step``, then wait for the results of ``previous`` (tokens, logprobs, busy seconds,
        host-bound); runs in the worker thread only (it alone touches the cache)."""
        inflight = None
        if step is not None:
            inflight = _InFlight(
                step, self._runner.dispatch(step.params, step.prefills, step.table_rn, step.rows)
            )
        return inflight, self._runner.collect(previous.dispatched) if previous is not None else None

    def _warmup_sync(self) -> None:
        self._runner.warmup(self._params, self.config)

    # ---- scheduler (event-loop thread) -----------------------------------------------------------

    def _ensure_running(self) -> None:
        if self._closed:
            raise EngineClosedError("engine closed")
        if self._error is not None:
            raise EngineClosedError(f"engine scheduler failed: {self._error!r}") from self._error
        loop = asyncio.get_running_loop()
        if self._task is not None and self._loop is not loop:
            if not (self._task.done() or self._loop is None or self._loop.is_closed()):
                raise RuntimeError("JaxEngine is already running on another event loop")
            self._task = None
        if self._task is None:
            self._loop = loop
            self._wake = asyncio.Event()
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jax-engine")
            self._task = loop.create_task(self._run(), name="jax-engine-scheduler")

    async def _run(self) -> None:
        assert self._loop is not None and self._wake is not None
        inflight: _InFlight | None = None
        try:
            while not self._closed:
                self._drop_cancelled()
                params, version = self._install_pending_weights()
                step = self._plan(self._admit(), params, version)
                if step is None and inflight is None:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                # Dispatch this step, then collect the previous one: the device computes while we record.
                previous = inflight
                inflight, results = await self._loop.run_in_executor(self._executor, self._compute, step, previous)
                if previous is not None and results is not None:
                    self._record(previous.step, *results)
        except Exception as err:  # delivered to every waiting request and to later generate() calls
            self._error = err
            self._fail_all(EngineClosedError(f"engine scheduler failed: {err!r}"))
        except asyncio.CancelledError:
            self._fail_all(EngineClosedError("engine scheduler cancelled"))
            raise

    def _install_pending_weights(self) -> tuple[dict[Any, Any], int]:
        with self._swap_lock:
            if self._pending_swap is not None:
                self._params, self._version = self._pending_swap
                self._pending_swap = None
                self._memory.clear_cache()  # cached prefixes were computed by the old weights
            return self._params, self._version

    def _drop_cancelled(self) -> None:
        for i, request in enumerate(self._slots):
            if request is not None and request.future.cancelled():
                self._slots[i] = None
                self._rows.stop(i)
                self._memory.release(i)

    def _admit(self) -> list[int]:
        if self.config.mode == "static":
            free = [i for i, r in enumerate(self._slots) if r is None]
            if len(free) < self.config.num_slots:
                return []
        else:
            # A slot whose request has its last token in flight is free for the next step: the request
            # leaves it now (its blocks too: no later step reads them) and is resolved when that token arrives.
            draining = ~self._rows.active()
            for i, request in enumerate(self._slots):
                if request is not None and draining[i] and not request.finish_reason:
                    self._detached.append(request)
                    self._slots[i] = None
                    self._rows.stop(i)
                    # Every token known so far was fed by a dispatched step, so its keys/values are written.
                    self._memory.release(i, self._retained(request, request.prompt + request.tokens))
            free = [i for i, r in enumerate(self._slots) if r is None]
        admitted = []
        now = self._clock()
        # A reused prefix makes the rest of the prompt a prefill call of its own instead of joining the batched
        # first chunks: worth it only when it saves more than a call costs.
        min_reuse = self.config.prefill_call_cost + 1 if self.config.prefix_reuse else None
        while free and self._queue:
            request = self._queue[0]
            if request.future.cancelled():
                self._queue.popleft()
                continue
            slot = free[0]
            positions = min(len(request.prompt) + request.sampling.max_new_tokens, self.config.max_seq_len)
            reused = self._memory.admit(slot, request.prompt, positions, min_reuse=min_reuse)
            if reused is None:
                break  # first come, first served: the head of the queue waits for blocks
            self._queue.popleft()
            free.remove(slot)
            request.reused = reused
            request.admitted_at = now
            request.admitted_version = self._version
            self._slots[slot] = request
            self._rows.start(slot, request.prompt, 0, request.sampling)
            admitted.append(slot)
        return admitted

    def _retained(self, request: _Request, tokens: list[int]) -> list[int]:
        """``tokens`` (whose keys/values the request's blocks hold) if the prefix cache may keep them: only
        keys/values the installed weights computed wholly. A request in flight across a swap (prefilled, or
        partly decoded, by the old weights) finishes after the swap cleared the cache, and reusing its
        keys/values would give the next turn logprobs no version's weights give."""
        reusable = self.config.prefix_reuse and request.admitted_version == self._version
        return tokens if reusable else []

    def _plan(self, admitted: list[int], params: dict[Any, Any], version: int) -> _Step | None:
        """The next dispatch, or None when no slot has tokens left to sample. Rows of requests in flight
        advance without being rebuilt (``DecodeRows``); admitted ones also get their prefill chunks."""
        active = self._rows.active()
        if not active.any():
            return None
        prefills = []
        for slot in admitted:
            request = self._slots[slot]
            assert request is not None
            prefills += [
                (slot, tokens, start) for tokens, start in self._chunks(request.prompt[:-1], request.reused)
            ]
            self._counters.prefill_calls += 1
            self._counters.prefill_tokens += len(request.prompt) - request.reused
            self._counters.reused_prefix_tokens += request.reused
        slots = np.flatnonzero(active)
        # Only occupied slots are decoded, in the smallest row bucket holding them (padding rows feed nothing).
        slot_r = np.full(self.config.rows_for(len(slots)), self.config.num_slots, np.int32)
        slot_r[: len(slots)] = slots
        span = self.config.span_for(int(self._rows.position[active].max()) + 1)
        table = self._memory.table
        table_rn = table[np.minimum(slot_r, self.config.num_slots - 1), :span]
        requests = [self._slots[i] for i in slots]
        return _Step(params, version, prefill_calls(prefills, table, self.config), table_rn, self._rows.take(slot_r),
                     slots.tolist(), requests)  # type: ignore[arg-type]

    def _chunks(self, ids: list[int], first: int) -> list[tuple[np.ndarray, int]]:
        """(tokens padded to a bucket, start position) per prefill call covering ``ids[first:]``
        (``EngineConfig.prefill_chunks``)."""
        chunks = []
        start = first
        for bucket in self.config.prefill_chunks(len(ids) - first):
            piece = ids[start : start + bucket]
            padded = np.zeros(bucket, np.int32)
            padded[: len(piece)] = piece
            chunks.append((padded, start))
            start += len(piece)
        return chunks

    def _record(
        self, step: _Step, token_b: np.ndarray, logprob_b: np.ndarray, busy_s: float, host_bound: bool
    ) -> None:
        now = self._clock()
        c = self._counters
        c.busy_s += busy_s
        c.host_bound_steps += host_bound
        c.decode_steps += 1
        tokens, logprobs = token_b.tolist(), logprob_b.tolist()
        for slot, request in zip(step.slots, step.requests, strict=True):
            # Skip rows whose request was cancelled, or ended on a stop id in the step before (pipelining).
            if request.finish_reason or request.future.done():
                continue
            if not request.tokens:
                request.first_token_at = now
            token = tokens[slot]
            request.tokens.append(token)
            request.logprobs.append(logprobs[slot])
            request.versions.append(step.version)
            c.active_slot_steps += 1
            c.generated_tokens += 1
            if token in request.sampling.stop_ids:
                request.finish_reason = "stop"
            elif len(request.tokens) >= request.sampling.max_new_tokens:
                request.finish_reason = "length"
            elif request.length >= self.config.max_seq_len:
                request.finish_reason = "context"
            if request.finish_reason and self._slots[slot] is request:
                self._rows.stop(slot)
        for request in [r for r in self._detached if r.finish_reason or r.future.done()]:
            self._detached.remove(request)
            self._resolve(request, now)
        occupied = [i for i, r in enumerate(self._slots) if r is not None]
        finished = [i for i in occupied if self._slots[i].finish_reason]  # type: ignore[union-attr]
        if self.config.mode == "static" and len(finished) < len(occupied):
            return  # the batch returns together once its longest request is done
        for i in finished:
            request = self._slots[i]
            assert request is not None
            self._slots[i] = None
            # Every token but the newest has its keys/values in the slot's blocks.
            self._memory.release(i, self._retained(request, (request.prompt + request.tokens)[:-1]))
            self._resolve(request, now)

    def _resolve(self, request: _Request, now: float) -> None:
        if request.finish_reason:
            self._counters.requests_finished += 1
        if not request.future.done():
            request.future.set_result(self._completion(request, now))

    @staticmethod
    def _completion(request: _Request, now: float) -> Completion:
        assert request.finish_reason is not None
        return Completion(
            token_ids=request.tokens,
            logprobs=request.logprobs,
            policy_versions=request.versions,
            finish_reason=request.finish_reason,
            timings={
                "queue_s": request.admitted_at - request.submitted_at,
                "first_token_s": request.first_token_at - request.submitted_at,
                "total_s": now - request.submitted_at,
            },
        )

    def _fail_all(self, error: BaseException) -> None:
        requests = [r for r in self._slots if r is not None] + self._detached + list(self._queue)
        self._slots = [None] * self.config.num_slots
        for i in range(self.config.num_slots):
            self._memory.release(i)
        self._memory.clear_cache()
        self._detached = []
        self._queue.clear()
        for request in requests:
            if not request.future.done():
                request.future.set_exception(error)
