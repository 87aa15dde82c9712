"""Simulated tool latency: a wrapper that sleeps a sampled delay before calling the inner tool.

Real agentic workloads wait on slow tools (search APIs, sandboxes); the async orchestrator's
advantage over synchronous batching shows only when tool latency is realistic. A
:class:`LatencyProfile` describes the delay distribution; :class:`LatencyTool` draws from it with an
injected ``random.Random`` (reproducible) and an injected ``sleep`` (tests pass a recorder and never
sleep for real).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from pipelines_lib.configio import no_limit
from pipelines_lib.envs.base import Tool


@dataclass(frozen=True, kw_only=True)
class LatencyProfile:
    """Distribution of one tool call's added delay, in seconds."""

    kind: Literal["fixed", "uniform", "lognormal"] = "fixed"
    """``fixed``: always ``value_s``; ``uniform``: U(lo_s, hi_s); ``lognormal``: median ``value_s``,
    log-space std ``sigma``, truncated at ``cap_s`` (heavy tails without unbounded waits)."""
    value_s: float = 0.0
    """Fixed delay, or the lognormal median."""
    lo_s: float = 0.0
    """Lower bound of the uniform profile (seconds)."""
    hi_s: float = 0.0
    """Upper bound of the uniform profile (seconds)."""
    sigma: float = 0.0
    """Log-space standard deviation of the lognormal profile."""
    cap_s: float = no_limit(math.inf)
    """No single delay exceeds this (seconds)."""

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "uniform", "lognormal"):
            raise ValueError(f"kind must be fixed, uniform or lognormal, got {self.kind!r}")
        if self.value_s < 0:
            raise ValueError(f"value_s must be >= 0, got {self.value_s}")
        if self.kind == "uniform" and not 0 <= self.lo_s <= self.hi_s:
            raise ValueError(f"uniform needs 0 <= lo_s <= hi_s, got lo_s={self.lo_s}, hi_s={self.hi_s}")
        if self.kind == "lognormal" and (self.value_s <= 0 or self.sigma < 0):
            raise ValueError(f"lognormal needs value_s > 0 and sigma >= 0, got {self.value_s}, {self.sigma}")
        if self.cap_s < 0:
            raise ValueError(f"cap_s must be >= 0, got {self.cap_s}")

    @classmethod
    def none(cls) -> LatencyProfile:
        return cls(kind="fixed", value_s=0.0)

    @classmethod
    def fixed(cls, seconds: float) -> LatencyProfile:
        return cls(kind="fixed", value_s=seconds)

    @classmethod
    def uniform(cls, lo_s: float, hi_s: float) -> LatencyProfile:
        return cls(kind="uniform", lo_s=lo_s, hi_s=hi_s)

    @classmethod
    def lognormal(cls, median_s: float, sigma: float, cap_s: float) -> LatencyProfile:
        return cls(kind="lognormal", value_s=median_s, sigma=sigma, cap_s=cap_s)

    @classmethod
    def light(cls) -> LatencyProfile:
        """A fast local service: U(10 ms, 50 ms)."""
        return cls.uniform(0.010, 0.050)

    @classmethod
    def heavy(cls) -> LatencyProfile:
        """A slow remote API: lognormal, median 200 ms, sigma 1.5, capped at 5 s."""
        return cls.lognormal(0.200, 1.5, 5.0)

    def sample(self, rng: random.Random) -> float:
        """One delay in seconds."""
        if self.kind == "fixed":
            return self.value_s
        if self.kind == "uniform":
            return rng.uniform(self.lo_s, self.hi_s)
        return min(self.value_s * math.exp(self.sigma * rng.gauss(0.0, 1.0)), self.cap_s)


class LatencyTool(Tool):
    """``inner`` with a sampled delay before each call; same name, description and schema."""

    def __init__(
        self,
        inner: Tool,
        profile: LatencyProfile,
        *,
        rng: random.Random,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.inner = inner
        self.profile = profile
        self.rng = rng
        self.sleep = sleep
        self.name = inner.name
        self.description = inner.description
        self.parameters = inner.parameters

    async def __call__(self, arguments: dict[str, Any]) -> str:
        delay = self.profile.sample(self.rng)
        if delay > 0:
            await self.sleep(delay)
        return await self.inner(arguments)


def with_latency(
    tools: dict[str, Tool],
    profile: LatencyProfile,
    *,
    rng: random.Random,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> dict[str, Tool]:
    """Wrap every tool of an env's ``tools()`` dict, sharing one RNG stream."""
    return {name: LatencyTool(t, profile, rng=rng, sleep=sleep) for name, t in tools.items()}
