"""Where a rollout worker's weights come from, and the hold that keeps storage from naming a version it lacks.

```
WeightSource   latest() / load(version); optionally watch(wake) and stored()
StoredGate     the orchestrator's writer asks it before committing a finished group: a group that sampled from a
               version the source serves ahead of storage (stored() behind it) waits until storage holds it
```
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, Protocol

from pipelines_lib import telemetry
from pipelines_lib.trajectory.record import Trajectory


class WeightSource(Protocol):
    """Where new weights come from (``weights/LATEST`` in a campaign). Both calls run in a worker thread.

    A source that learns when ``latest`` moves (a trainer in the same process) may also offer ``watch(wake) ->
    unwatch``: it calls ``wake()``, from any thread, after each move until ``unwatch()``, and the orchestrator then
    looks at once instead of at its next poll (``weight_poll_s``).

    A source whose ``latest`` may name a version before storage holds it (a trainer's hand-over in the same process)
    also offers ``stored() -> int | None``, the newest version storage holds, and wakes watchers when either moves:
    the orchestrator commits a group only once ``stored()`` reaches every version the group sampled from."""

    def latest(self) -> int | None: ...

    def load(self, version: int) -> Any: ...


class StoredGate:
    """Holds finished groups until ``weights.stored()`` reaches the newest version each sampled from; passes every
    group of a source without ``stored``. ``moved()`` (on the event loop) says the source moved."""

    def __init__(self, weights: WeightSource | None, *, poll_s: float, hold_timeout_s: float,
                 clock: Callable[[], float]) -> None:
        self._stored_fn: Callable[[], int | None] | None = getattr(weights, "stored", None)
        self._poll_s, self._hold_timeout_s, self._clock = poll_s, hold_timeout_s, clock
        self._moved = asyncio.Event()
        self._stored = -1  # the newest version stored() named so far
        self.held_s = 0.0
        """Seconds groups were held until their version was stored."""

    def moved(self) -> None:
        self._moved.set()

    async def admit(self, group: list[Trajectory], stopping: asyncio.Event) -> bool:
        """Whether ``group`` may be committed, once it may. False: its version was not stored within
        ``hold_timeout_s`` of ``stopping`` being set; storage must never hold a trajectory of a version it does not
        hold (a resume would re-create that version), so the group is dropped."""
        if self._stored_fn is None:
            return True
        newest = max((max(t.policy_version, default=-1) for t in group), default=-1)
        if newest <= self._stored:
            return True
        t0, deadline = self._clock(), None
        with telemetry.span("commit_hold", track="writer", version=newest):
            while True:
                self._moved.clear()  # before the look: a move after it ends the wait below
                version = await asyncio.to_thread(self._stored_fn)
                self._stored = max(self._stored, -1 if version is None else version)
                if self._stored >= newest:
                    self.held_s += self._clock() - t0
                    return True
                if stopping.is_set():
                    deadline = self._clock() + self._hold_timeout_s if deadline is None else deadline
                    if self._clock() >= deadline:
                        return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._moved.wait(), self._poll_s)


__all__ = ["StoredGate", "WeightSource"]
