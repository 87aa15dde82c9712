"""Continuous-batching JAX inference engine implementing ``engine.api.Engine``.

How the pieces fit::

    generate() ──► queue ──► scheduler task (asyncio; request state in ``engine.scheduler.Scheduler``)
                               │ each iteration, at a decode-call boundary:
                               │   install pending swapped weights, admit queued requests into free slots
                               │   while their KV blocks are free, take the next call's inputs from ``DecodeRows``
                               ▼
                  worker thread (one, ``engine.device.DeviceRunner``): dispatch prefill(admitted) + one
                  decode call of up to ``decode_steps`` steps over the occupied slots, then wait for the
                  *previous* call's tokens
                               │  (jitted, fixed shapes; the KV cache is donated and updated in place)
                               ▼
                  scheduler appends the previous call's tokens, finishes requests, resolves their futures

* **Several steps per call.** A decode call runs up to ``EngineConfig.decode_steps`` steps in a loop on the
  device, each feeding the token the step before sampled, with stop ids, ``max_new_tokens`` and the context
  checked inside the loop: the host's fixed cost per call is spread over that many tokens. The tokens and
  logprobs are those of as many single steps (each step's sampling key depends only on the request's seed
  and token index). A row that stops inside a call writes no more keys/values.
* **Pipelined calls.** Call N+1 is dispatched before call N's results are collected, so the device
  computes while the host records tokens, admits requests and plans (see ``engine.device``). A request
  that ends on a stop id in call N is carried into N+1 as a row that samples nothing (the device knows it
  stopped). A request whose last token (by ``max_new_tokens`` or the context) is in flight hands its slot
  to the next queued request at once, so a known ending costs no idle slot-step (in continuous mode).
* **Slots and cache.** ``num_slots`` rows of the decode call over a paged KV cache: a pool of
  ``num_blocks`` blocks per layer and a block table per slot (``engine.blocks``). A request is admitted
  when a slot is free *and* the blocks of its prompt and ``max_new_tokens`` are, and its blocks return to
  the pool when it finishes, so memory follows the tokens held, not ``slots × max_seq_len``. Each decode
  call attends over the smallest of ``EngineConfig.attention_spans`` covering the positions its rows reach.
  A block is reused without clearing it (see ``model.decoder``).
* **Few compiled variants, none per request.** Prefill splits each prompt into chunks of the configured
  buckets chosen for its length (``EngineConfig.prefill_chunks``: 288 tokens run as 256 + 32, not padded to
  512; only the last chunk is padded) and batches the first chunks of the prompts admitted together;
  decode runs only the occupied slots, padded to a row bucket (``EngineConfig.row_buckets``). Slots,
  positions and sampling settings are traced arguments, so after ``warmup()`` (``EngineConfig.
  prefill_variants`` + ``decode_variants`` compilations, on the live cache) nothing compiles again;
  ``stats()["compilations"]`` counts compiled variants to prove it. The steps are shared by every engine
  over an equally shaped model, so they compile once per process (and, with JAX's persistent compilation
  cache, which every entry point turns on, once per machine).
* **The event loop never blocks on compute.** Device calls run in a dedicated worker thread; the
  scheduler awaits them, so tools and agents keep running while the engine computes.
* **Sampling** (``engine.sampling``): per-row temperature / top-k / top-p and a key folded from the
  request seed and token index, so a seeded request samples the same tokens whatever shares its batch.
  ``Completion.logprobs[i]`` is the log-probability of token ``i`` under the distribution it was
  actually drawn from (temperature-scaled, top-k/top-p filtered and renormalised); for greedy requests
  it is the plain ``log_softmax`` of the model's logits.
* **Hot weight swap.** ``swap_weights`` only records the new parameters; the scheduler installs them at
  the next decode-call boundary (the next call it dispatches; the one in flight keeps the old ones).
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
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
from flax import nnx, traverse_util
from jax.sharding import NamedSharding, PartitionSpec

from pipelines_lib import telemetry
from pipelines_lib.engine.api import Completion, SamplingParams
from pipelines_lib.engine.config import EngineConfig
from pipelines_lib.engine.device import Collected, DeviceRunner, Dispatched, steps_for
from pipelines_lib.engine.scheduler import Call, Counters, Request, Scheduler
from pipelines_lib.mesh import logical_spec, make_mesh, place_state
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.kv_pool import init_cache

WARMUP_COMPILE_THREADS = 4
"""Most variants ``warmup()`` compiles at once (one per host core at most): compile time, not the device, bounds
a warm-up, and XLA compiles one program on about one core. Half of the eight threads the TPU runtime of the JAX
we pin compiles on: in a colocated campaign the trainer compiles its step while the engine warms up, and a
process whose compilations filled that pool (eight warm-up threads and the trainer) stopped making progress
there; on its own the engine warms up as fast with eight."""


class EngineClosedError(RuntimeError):
    """The engine was closed (or its scheduler failed) before the request finished."""


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
        # Parameters and cache are committed to the engine's mesh (by the rules table of ``pipelines_lib.mesh``: heads,
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
        platform = mesh.devices.flat[0].platform
        self.decode_steps = config.steps_per_call(platform)
        """Decode steps per device call (``EngineConfig.decode_steps`` resolved for this engine's devices)."""
        self._steps = steps_for(self._graphdef, self.decode_steps)
        cache = init_cache(model.cfg, config.pool_blocks, config.block_size)
        self._runner = DeviceRunner(
            self._steps,
            jax.tree.map(lambda leaf: jax.device_put(leaf, _cache_sharding(leaf, mesh)), cache),
            config.num_slots,
            NamedSharding(mesh, PartitionSpec()),
            clock,
        )
        self._scheduler = Scheduler(config, self.decode_steps)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._closed = False
        self._error: BaseException | None = None
        self._clock = clock
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
        if len(sampling.stop_ids) > self.config.max_stop_ids:
            raise ValueError(f"{len(sampling.stop_ids)} stop ids exceed EngineConfig.max_stop_ids="
                             f"{self.config.max_stop_ids}")
        assert self._loop is not None and self._wake is not None
        request = Request(prompt, sampling, self._loop.create_future(), submitted_at=now)
        self._scheduler.queue.append(request)
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
        """Compile every prefill and decode variant now (``WARMUP_COMPILE_THREADS`` at a time), on the engine's
        own cache (writing nothing into it, so in-flight requests are untouched)."""
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
        self._scheduler.fail_all(EngineClosedError("engine closed"))
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    async def __aenter__(self) -> JaxEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- measurement -----------------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        """Counters since construction or ``reset_stats()`` (definitions in ARCHITECTURE §7).

        dispatches: decode calls (each up to ``decode_steps`` steps, with the prefill calls of the requests
        admitted before it); decode_steps: steps the device ran (a call runs until its longest row is done);
        busy_s: time during which a dispatched call (prefill + decode) had results the host was waiting for,
        from its dispatch until they were on the host, overlapping calls counted once (``engine.device``; a
        lower bound when host_bound_steps > 0); host_bound_steps: calls whose results were already waiting
        when the host came for them (credited nothing); wall_s: time since the window started;
        active_slot_steps: sum over decode steps of the slots whose sampled token was kept (a row that
        stopped, or whose request ended on a stop id in the call before, keeps none); prefill_tokens: prompt
        tokens computed (reused_prefix_tokens were not); slot_occupancy = active_slot_steps / (decode_steps *
        num_slots); tokens_per_s = generated_tokens / wall_s; compilations: compiled variants of this model
        structure's step functions (shared by engines over equal structures, never reset; constant after
        ``warmup()``). Not counters but the KV pool now: free_blocks (no running request holds them; cached
        ones included) and cached_blocks (holding a finished request's keys/values for reuse).
        """
        c = self._scheduler.counters
        wall = self._clock() - self._window_start
        return {
            "busy_s": c.busy_s,
            "wall_s": wall,
            "busy_fraction": c.busy_s / wall if wall > 0 else 0.0,
            "dispatches": c.dispatches,
            "host_bound_steps": c.host_bound_calls,
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
            "free_blocks": self._scheduler.memory.free_blocks,
            "cached_blocks": self._scheduler.memory.cached_blocks,
        }

    def reset_stats(self) -> None:
        self._scheduler.counters = Counters()
        self._window_start = self._clock()

    # ---- worker thread ---------------------------------------------------------------------------

    def _compute(
        self, call: Call | None, previous: tuple[Call, Dispatched] | None
    ) -> tuple[tuple[Call, Dispatched] | None, Collected | None]:
        """Dispatch ``call``, then wait for the results of ``previous``; runs in the worker thread only (it
        alone touches the cache)."""
        inflight = None
        if call is not None:
            inflight = (call, self._runner.dispatch(call.params, call.prefills, call.table_rn, call.rows))
        return inflight, self._runner.collect(previous[1]) if previous is not None else None

    def _warmup_sync(self) -> None:
        threads = min(WARMUP_COMPILE_THREADS, os.cpu_count() or 1)
        self._runner.warmup(self._params, self.config, self.decode_steps, threads=threads)

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
        scheduler = self._scheduler
        inflight: tuple[Call, Dispatched] | None = None
        chip = telemetry.BusySpans(self._clock)  # the chip track of whatever recorder the first caller had active
        try:
            while not self._closed:
                scheduler.drop_cancelled()
                params, version = self._install_pending_weights()
                call = scheduler.plan(scheduler.admit(version, self._clock()), params, version)
                if call is None and inflight is None:
                    chip.flush()
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                # Dispatch this call, then collect the previous one: the device computes while we record.
                previous = inflight
                inflight, results = await self._loop.run_in_executor(self._executor, self._compute, call, previous)
                if previous is not None and results is not None:
                    scheduler.record(previous[0], results, self._version, self._clock())
                    if results.busy_s > 0:
                        chip.add(results.busy_from, results.busy_from + results.busy_s)
            chip.flush()
        except Exception as err:  # delivered to every waiting request and to later generate() calls
            self._error = err
            scheduler.fail_all(EngineClosedError(f"engine scheduler failed: {err!r}"))
        except asyncio.CancelledError:
            scheduler.fail_all(EngineClosedError("engine scheduler cancelled"))
            raise

    def _install_pending_weights(self) -> tuple[dict[Any, Any], int]:
        with self._swap_lock:
            if self._pending_swap is not None:
                self._params, self._version = self._pending_swap
                self._pending_swap = None
                self._scheduler.memory.clear_cache()  # cached prefixes were computed by the old weights
            return self._params, self._version


def _cache_sharding(leaf: jax.Array, mesh: jax.sharding.Mesh) -> NamedSharding:
    """Keys and values split over kv heads (their two last axes are kv heads and head dim, whatever the
    cache's layout), like the projections that write them. The spec is written as the steps return it,
    trailing unsplit dimensions dropped (P(None, None, None, None) comes back as P()): jit keys its cache on
    the spec, so the cache placed any other way would compile the first warmed-up variant a second time on
    its first real call."""
    spec = logical_spec((None,) * (leaf.ndim - 2) + ("kv_heads", "head_dim"), leaf.shape, mesh)
    while spec and spec[-1] is None:
        spec = PartitionSpec(*spec[:-1])
    return NamedSharding(mesh, spec)
