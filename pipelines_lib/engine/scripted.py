"""``ScriptedEngine``: a real implementation of the ``Engine`` protocol that replays scripted responses.

For fast tests of agents, the episode runner and the rollout orchestrator without a model. It honours the
protocol's contract (stop ids, ``max_new_tokens``, ``max_seq_len``, per-token logprobs and policy versions,
weight swaps), records every prompt it was given (the token-in/token-out test compares them with the
trajectory), and can sleep per call through an injected ``sleep`` to simulate generation latency.

A script entry is either text (encoded with the tokenizer, then the first stop id appended, as a model ending
its turn would) or a list of ids used verbatim (to script non-canonical tokenisations or missing stops). The
script is a sequence consumed in call order, or a function ``(prompt_ids, call_index) -> entry`` for engines
shared by concurrent episodes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pipelines_lib.engine.api import Completion, SamplingParams
from pipelines_lib.model.tokenizer import ChatTokenizer

ScriptEntry = str | Sequence[int]
Script = Sequence[ScriptEntry] | Callable[[list[int], int], ScriptEntry]


def fake_logprob(token_id: int) -> float:
    """Deterministic, token-dependent and <= 0, so tests can check each logprob landed on its token."""
    return -0.125 * (1 + token_id % 8)


class ScriptedEngine:
    """Replays ``script``; ``latency_s`` (a number or ``call_index -> seconds``) is slept via ``sleep``."""

    def __init__(
        self,
        script: Script,
        *,
        tokenizer: ChatTokenizer,
        max_seq_len: int = 4096,
        policy_version: int = 0,
        latency_s: float | Callable[[int], float] = 0.0,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if max_seq_len < 1:
            raise ValueError(f"ScriptedEngine.max_seq_len must be >= 1, got {max_seq_len}")
        self._script = script
        self._tokenizer = tokenizer
        self._max_seq_len = max_seq_len
        self._policy_version = policy_version
        self._latency_s = latency_s
        self._sleep = sleep
        self._clock = clock
        self.prompts: list[list[int]] = []
        """Every prompt given to ``generate``, in call order."""
        self.params: Any = None
        """The params of the last ``swap_weights`` (kept only so tests can see what was installed)."""

    @property
    def policy_version(self) -> int:
        return self._policy_version

    @property
    def max_seq_len(self) -> int:
        return self._max_seq_len

    def swap_weights(self, params: Any, version: int) -> None:
        self.params = params
        self._policy_version = version

    def _entry(self, prompt: list[int], index: int) -> list[int]:
        if callable(self._script):
            entry = self._script(prompt, index)
        elif index < len(self._script):
            entry = self._script[index]
        else:
            raise IndexError(f"ScriptedEngine: script has {len(self._script)} responses, call {index + 1} asked for another")
        if isinstance(entry, str):
            return [*self._tokenizer.encode(entry), self._tokenizer.stop_ids[0]]
        return list(entry)

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Completion:
        prompt = list(prompt_ids)
        index = len(self.prompts)
        self.prompts.append(prompt)
        start = self._clock()
        latency = self._latency_s(index) if callable(self._latency_s) else self._latency_s
        if latency > 0:
            await self._sleep(latency)
        ids = self._entry(prompt, index)
        room = self._max_seq_len - len(prompt)
        out: list[int] = []
        # An entry that runs out without a stop id stands for a model cut off by max_new_tokens ("length").
        finish = "length"
        for token in ids:
            if len(out) >= room:
                finish = "context"
                break
            if len(out) == sampling.max_new_tokens:
                break
            out.append(token)
            if token in sampling.stop_ids:
                finish = "stop"
                break
        version = self._policy_version
        return Completion(
            token_ids=out,
            logprobs=[fake_logprob(t) for t in out],
            policy_versions=[version] * len(out),
            finish_reason=finish,
            timings={"generate_s": self._clock() - start},
        )
