"""The engine contract shared by the real JAX engine, scripted test engines and the agents.

Token-in, token-out: ``generate`` conditions on exactly the ids it is given and returns the ids it
sampled, one logprob and one policy version per sampled token. Text never crosses this boundary.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

FINISH_REASONS = ("stop", "length", "context")


class EngineUnavailableError(RuntimeError):
    """The engine could not serve a request (its server died, timed out or is restarting).

    An infrastructure failure of one request, not a bug: the episode runner records it as status
    ``engine_error``, and an engine that supervises a server restarts it."""


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How one request is sampled. ``temperature == 0`` means greedy."""

    temperature: float = 1.0
    top_k: int = 0
    """Keep only the k most likely tokens; 0 disables the filter."""
    top_p: float = 1.0
    """Nucleus sampling mass; 1.0 disables the filter."""
    max_new_tokens: int = 64
    stop_ids: tuple[int, ...] = ()
    """Generation ends after emitting any of these ids (the stop id is included in the output)."""
    seed: int = 0
    """Per-request seed: the same seed gives the same tokens whatever else is in the batch."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, kw_only=True)
class Completion:
    """What the engine produced for one request."""

    token_ids: list[int]
    logprobs: list[float]
    """Logprob of each sampled token under the distribution it was sampled from."""
    policy_versions: list[int]
    """Version of the weights that produced each token (a swap mid-request shows up here)."""
    finish_reason: str
    """``stop`` (a stop id), ``length`` (max_new_tokens) or ``context`` (the KV cache is full)."""
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def policy_version(self) -> int:
        """Version of the first generated token (-1 for an empty completion)."""
        return self.policy_versions[0] if self.policy_versions else -1


@runtime_checkable
class Engine(Protocol):
    """What agents and the orchestrator need from an inference engine."""

    @property
    def policy_version(self) -> int: ...

    @property
    def max_seq_len(self) -> int: ...

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Completion: ...

    def swap_weights(self, params: Any, version: int) -> Awaitable[None] | None:
        """Install new weights. The in-process engine takes them at its next decode-step boundary and returns
        None; an engine that reloads a server returns an awaitable that completes once the new weights serve
        (callers await it before they count the swap as done)."""
        ...
