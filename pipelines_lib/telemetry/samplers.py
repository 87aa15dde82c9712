"""Interval gauges from cumulative counters: engine activity and rollout throughput.

The engine's ``stats()`` counts since its window started (busy seconds, decode steps, slot-steps, tokens);
averages over the whole run hide a stall. ``ThroughputGauges.sample`` is called by a poller (the rollout
orchestrator's stop poller, about once a second) and records what changed since the previous call:

- ``engine_active_slots`` = Δactive_slot_steps / Δdecode_steps: slots generating, averaged over the interval's
  decode steps;
- ``engine_busy_fraction`` = min(1, Δbusy_s / Δwall_s): share of the interval spent in compute calls. The
  engine credits a call's seconds when it returns, so an interval in which a long call (the first compilation)
  ends would read above 1; it is capped, and the intervals the call spanned read low;
- ``engine_prefix_reuse`` = Δreused_prefix_tokens / (Δreused_prefix_tokens + Δprefill_tokens): the share of
  the interval's admitted prompt tokens whose keys/values came from the prefix cache (absent when none were
  admitted);
- ``engine_tokens_per_s`` = Δgenerated_tokens / Δt and ``trajectories_per_s`` = Δtrajectories / Δt.

An engine without ``stats()`` (the scripted one) gives only ``trajectories_per_s``; an interval in which the
engine's stats window was reset (``reset_stats``) gives nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pipelines_lib import telemetry


def interval_gauges(before: dict[str, float], after: dict[str, float], dt_s: float) -> dict[str, float]:
    """The gauges above from two samples of cumulative counters taken ``dt_s`` seconds apart."""
    out: dict[str, float] = {}
    if dt_s <= 0 or after.get("wall_s", 0.0) < before.get("wall_s", 0.0):  # the engine's window was reset
        return out
    if "trajectories" in after:
        out["trajectories_per_s"] = (after["trajectories"] - before["trajectories"]) / dt_s
    if "generated_tokens" in after:
        out["engine_tokens_per_s"] = (after["generated_tokens"] - before["generated_tokens"]) / dt_s
    if "decode_steps" in after:
        steps = after["decode_steps"] - before["decode_steps"]
        out["engine_active_slots"] = (after["active_slot_steps"] - before["active_slot_steps"]) / steps if steps else 0.0
    if "reused_prefix_tokens" in after:
        reused = after["reused_prefix_tokens"] - before["reused_prefix_tokens"]
        prompt = reused + after["prefill_tokens"] - before["prefill_tokens"]
        if prompt > 0:
            out["engine_prefix_reuse"] = reused / prompt
    if "busy_s" in after:
        wall = after["wall_s"] - before["wall_s"]
        if wall > 0:
            out["engine_busy_fraction"] = min(1.0, (after["busy_s"] - before["busy_s"]) / wall)
    return out


class ThroughputGauges:
    """Samples ``engine.stats()`` plus the caller's trajectory count; records the interval gauges."""

    def __init__(self, engine: Any, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.clock = clock
        self._last: tuple[float, dict[str, float]] | None = None

    def sample(self, *, trajectories: int) -> dict[str, float]:
        """Record (and return) the gauges since the previous call; the first call only takes a baseline."""
        if telemetry.active() is None:
            return {}
        stats = getattr(self.engine, "stats", None)
        counters: dict[str, float] = {"trajectories": float(trajectories)}
        if callable(stats):
            counters |= {k: float(v) for k, v in stats().items()}
        t = self.clock()
        gauges: dict[str, float] = {}
        if self._last is not None:
            before_t, before = self._last
            gauges = interval_gauges(before, counters, t - before_t)
        self._last = (t, counters)
        for name, value in gauges.items():
            telemetry.gauge(name, value)
        return gauges
