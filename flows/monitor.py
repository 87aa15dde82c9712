"""Progress of a running trainer, read from the campaign folder (so it works for in-process stages and for
deployment runs on other machines alike): a terminal line per new step and a Prefect progress artifact.

Each poll costs O(new steps): it probes ``train/consumed/<step+1>.json`` until one is missing, instead of
listing a folder that grows with the campaign.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from prefect.artifacts import create_progress_artifact, update_progress_artifact

from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store


class TrainProgress:
    def __init__(self, store: Store, *, max_steps: int, log: Callable[[str], None], key: str | None = None) -> None:
        self.store = store
        self.max_steps = max_steps
        self.log = log
        self.key = key
        self.step = 0
        self.last: dict[str, Any] | None = None
        self._artifact: UUID | None = None

    @property
    def percent(self) -> float:
        return round(100.0 * min(self.step, self.max_steps) / self.max_steps, 1)

    def poll(self) -> int:
        """Read new consumption logs; returns how many steps appeared since the last poll."""
        new = 0
        while self.store.exists(layout.consumed_log(self.step + 1)):
            self.step += 1
            new += 1
        if new:
            self.last = self.store.read_json(layout.consumed_log(self.step))
            staleness = max((g["staleness"] for g in self.last["groups"]), default=0)
            published = self.last.get("published_version")
            self.log(f"progress: step {self.step}/{self.max_steps} ({self.percent:.0f}%), batch reward "
                     f"{self.last['mean_reward']:.3f}, staleness <= {staleness}"
                     + (f", published v{published}" if published is not None else ""))
            self._publish()
        return new

    def _publish(self) -> None:
        if self._artifact is None:
            self._artifact = create_progress_artifact(self.percent, key=self.key,
                                                      description=f"trainer steps of {self.max_steps}")
        else:
            update_progress_artifact(self._artifact, self.percent)
