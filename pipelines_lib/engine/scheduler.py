"""Request bookkeeping of ``JaxEngine``: which request holds which slot, what the next decode call computes,
and what its tokens mean for each request. Runs on the engine's event-loop thread only; touches no device.

How the pieces fit::

    JaxEngine._run (event loop)         Scheduler                          engine.device
        drop_cancelled() ─────────────► free the slots of cancelled requests
        admit(version) ───────────────► queued requests into free slots ──► BlockPool (engine.blocks)
        plan(admitted, params, ...) ──► Call: prefill chunks + the rows ──► DecodeRows.take
        (DeviceRunner dispatches it, then collects the call before)
        record(call, collected) ──────► append each row's tokens, finish requests, resolve their futures

A request's last tokens may still be in flight when the host plans the next call: its slot then goes to the
next queued request at once (``admit``), and the request waits in ``detached`` until those tokens arrive.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipelines_lib.engine.api import Completion, SamplingParams
from pipelines_lib.engine.blocks import BlockPool
from pipelines_lib.engine.config import EngineConfig
from pipelines_lib.engine.device import Collected, DecodeInputs, DecodeRows, Prefill, prefill_calls


@dataclass(eq=False)
class Request:
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

    def completion(self, now: float) -> Completion:
        assert self.finish_reason is not None
        return Completion(
            token_ids=self.tokens,
            logprobs=self.logprobs,
            policy_versions=self.versions,
            finish_reason=self.finish_reason,
            timings={
                "queue_s": self.admitted_at - self.submitted_at,
                "first_token_s": self.first_token_at - self.submitted_at,
                "total_s": now - self.submitted_at,
            },
        )


@dataclass
class Call:
    """One dispatch: the prefill calls of the admitted prompts, then one decode call over ``rows`` attending
    over ``table_rn``; row ``r < len(requests)`` samples for ``requests[r]``; ``version`` is the weights it
    runs with."""

    params: dict[Any, Any]
    version: int
    prefills: list[Prefill]
    table_rn: np.ndarray
    rows: DecodeInputs
    requests: list[Request]


@dataclass
class Counters:
    busy_s: float = 0.0
    host_bound_calls: int = 0
    dispatches: int = 0
    decode_steps: int = 0
    active_slot_steps: int = 0
    prefill_calls: int = 0
    prefill_tokens: int = 0
    reused_prefix_tokens: int = 0
    generated_tokens: int = 0
    requests_finished: int = 0


class Scheduler:
    """Slots, the queue and the KV pool's bookkeeping; see the module docstring."""

    def __init__(self, config: EngineConfig, decode_steps: int) -> None:
        self.config = config
        self.decode_steps = decode_steps
        self.rows = DecodeRows(config.num_slots, config.max_seq_len, config.max_stop_ids)
        self.memory = BlockPool(num_blocks=config.pool_blocks, block_size=config.block_size,
                                num_slots=config.num_slots, max_seq_len=config.max_seq_len)
        self.slots: list[Request | None] = [None] * config.num_slots
        self.queue: deque[Request] = deque()
        self.detached: list[Request] = []
        """Requests that left their slot to a new one while their last tokens were in flight."""
        self.counters = Counters()

    def drop_cancelled(self) -> None:
        for i, request in enumerate(self.slots):
            if request is not None and request.future.cancelled():
                self.slots[i] = None
                self.rows.stop(i)
                self.memory.release(i)

    def admit(self, version: int, now: float) -> list[int]:
        """Move queued requests into free slots while their blocks are free; the slots admitted."""
        if self.config.mode == "static":
            if any(r is not None for r in self.slots):
                return []
        else:
            self._detach_draining(version)
        free = [i for i, r in enumerate(self.slots) if r is None]
        admitted = []
        # A reused prefix makes the rest of the prompt a prefill call of its own instead of joining the batched
        # first chunks: worth it only when it saves more than a call costs.
        min_reuse = self.config.prefill_call_cost + 1 if self.config.prefix_reuse else None
        while free and self.queue:
            request = self.queue[0]
            if request.future.cancelled():
                self.queue.popleft()
                continue
            slot = free[0]
            positions = min(len(request.prompt) + request.sampling.max_new_tokens, self.config.max_seq_len)
            reused = self.memory.admit(slot, request.prompt, positions, min_reuse=min_reuse)
            if reused is None:
                break  # first come, first served: the head of the queue waits for blocks
            self.queue.popleft()
            free.remove(slot)
            request.reused, request.admitted_at, request.admitted_version = reused, now, version
            self.slots[slot] = request
            self.rows.start(slot, request.prompt, 0, request.sampling)
            admitted.append(slot)
        return admitted

    def _detach_draining(self, version: int) -> None:
        """A slot whose request has its last token in flight is free for the next call: the request leaves it
        now (its blocks too: no later call reads them) and is resolved when that token arrives."""
        draining = ~self.rows.active()
        for i, request in enumerate(self.slots):
            if request is not None and draining[i] and not request.finish_reason:
                self.detached.append(request)
                self.slots[i] = None
                self.rows.stop(i)
                # Every token known so far was fed by a dispatched call, so its keys/values are written; the
                # calls in flight write only past them, before anything dispatched later.
                self.memory.release(i, self._retained(request, request.prompt + request.tokens, version))

    def _retained(self, request: Request, tokens: list[int], version: int) -> list[int]:
        """``tokens`` (whose keys/values the request's blocks hold) if the prefix cache may keep them: only
        keys/values the installed weights computed wholly. A request in flight across a swap (prefilled, or
        partly decoded, by the old weights) finishes after the swap cleared the cache, and reusing its
        keys/values would give the next turn logprobs no version's weights give."""
        reusable = self.config.prefix_reuse and request.admitted_version == version
        return tokens if reusable else []

    def plan(self, admitted: list[int], params: dict[Any, Any], version: int) -> Call | None:
        """The next dispatch, or None when no slot has tokens left to sample. Rows of requests in flight
        advance without being rebuilt (``DecodeRows``); admitted ones also get their prefill chunks."""
        active = self.rows.active()
        if not active.any():
            return None
        prefills = []
        c = self.counters
        for slot in admitted:
            request = self.slots[slot]
            assert request is not None
            prefills += [(slot, tokens, start) for tokens, start in self._chunks(request.prompt[:-1], request.reused)]
            c.prefill_calls += 1
            c.prefill_tokens += len(request.prompt) - request.reused
            c.reused_prefix_tokens += request.reused
        slots = np.flatnonzero(active)
        # Only occupied slots are decoded, in the smallest row bucket holding them (padding rows feed nothing).
        slot_r = np.full(self.config.rows_for(len(slots)), self.config.num_slots, np.int32)
        slot_r[: len(slots)] = slots
        rows = self.rows.take(slot_r, self.decode_steps)
        # The call attends over the positions its rows reach by its last step (padding rows reach none).
        span = self.config.span_for(int((rows.positions_r + rows.budget_r)[: len(slots)].max()))
        table = self.memory.table
        table_rn = table[np.minimum(slot_r, self.config.num_slots - 1), :span]
        requests = [self.slots[i] for i in slots]
        calls = prefill_calls(prefills, table, self.config)
        return Call(params, version, calls, table_rn, rows, requests)  # type: ignore[arg-type]

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

    def record(self, call: Call, out: Collected, version: int, now: float) -> None:
        """Append each row's sampled tokens to its request, finish and resolve the requests that ended."""
        c = self.counters
        c.busy_s += out.busy_s
        c.host_bound_calls += out.host_bound
        c.dispatches += 1
        c.decode_steps += int(out.count_r.max(initial=0))  # the loop ran until its longest row was done
        tokens_rk, logprobs_rk = out.token_kr.T.tolist(), out.logprob_kr.T.tolist()
        for r, request in enumerate(call.requests):
            # Skip rows whose request was cancelled, or ended on a stop id in the call before (pipelining).
            if request.finish_reason or request.future.done():
                continue
            for token, logprob in zip(tokens_rk[r][: out.count_r[r]], logprobs_rk[r], strict=False):
                self._append(request, token, logprob, call.version, now)
                if request.finish_reason:
                    break
            slot = int(call.rows.slot_r[r])
            if request.finish_reason and self.slots[slot] is request:
                self.rows.stop(slot)
        for request in [r for r in self.detached if r.finish_reason or r.future.done()]:
            self.detached.remove(request)
            self._resolve(request, now)
        occupied = [i for i, r in enumerate(self.slots) if r is not None]
        finished = [i for i in occupied if self.slots[i].finish_reason]  # type: ignore[union-attr]
        if self.config.mode == "static" and len(finished) < len(occupied):
            return  # the batch returns together once its longest request is done
        for i in finished:
            request = self.slots[i]
            assert request is not None
            self.slots[i] = None
            # Every token but the newest has its keys/values in the slot's blocks (a row stopped inside a call
            # writes nothing after its last token).
            self.memory.release(i, self._retained(request, (request.prompt + request.tokens)[:-1], version))
            self._resolve(request, now)

    def _append(self, request: Request, token: int, logprob: float, version: int, now: float) -> None:
        if not request.tokens:
            request.first_token_at = now
        request.tokens.append(token)
        request.logprobs.append(logprob)
        request.versions.append(version)
        self.counters.active_slot_steps += 1
        self.counters.generated_tokens += 1
        if token in request.sampling.stop_ids:
            request.finish_reason = "stop"
        elif len(request.tokens) >= request.sampling.max_new_tokens:
            request.finish_reason = "length"
        elif request.length >= self.config.max_seq_len:
            request.finish_reason = "context"

    def _resolve(self, request: Request, now: float) -> None:
        if request.finish_reason:
            self.counters.requests_finished += 1
        if not request.future.done():
            request.future.set_result(request.completion(now))

    def fail_all(self, error: BaseException) -> None:
        requests = [r for r in self.slots if r is not None] + self.detached + list(self.queue)
        self.slots = [None] * self.config.num_slots
        for i in range(self.config.num_slots):
            self.memory.release(i)
        self.memory.clear_cache()
        self.detached = []
        self.queue.clear()
        for request in requests:
            if not request.future.done():
                request.future.set_exception(error)
