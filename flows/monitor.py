"""Progress of a running trainer, read from the campaign folder (so it works for in-process stages and for
deployment runs on other machines alike): a terminal line per new step and a Prefect progress artifact.

Each poll costs O(new steps): it probes ``train/consumed/<step+1>.json`` until one is missing, instead of
listing a folder that grows with the campaign.

A poll whose storage reads fail (after the store's own retries) is logged and tried again at the next poll: a
monitor is no reason to end a campaign whose stages ride out the same fault. Only ``max_failed_polls`` failed
polls in a row raise the last ``StorageError`` (it names op and URL); the campaign then stops its stages.
"""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID

from prefect.artifacts import create_progress_artifact, update_progress_artifact

from pipelines_lib.records import ConsumptionLog
from pipelines_lib.storage.errors import StorageError
from pipelines_lib.storage.store import Store


class TrainProgress:
    MAX_FAILED_POLLS = 12
    """Failed polls in a row before the monitor gives up: about a minute at the campaign's 5 s poll, on top of
    the store's own retry budget in each poll."""

    def __init__(self, store: Store, *, max_steps: int, log: Callable[[str], None], key: str | None = None,
                 warn: Callable[[str], None] | None = None, max_failed_polls: int = MAX_FAILED_POLLS) -> None:
        if max_failed_polls < 1:
            raise ValueError(f"TrainProgress: max_failed_polls must be >= 1, got {max_failed_polls}")
        self.store = store
        self.max_steps = max_steps
        self.log = log
        self.warn = warn or log
        self.key = key
        self.max_failed_polls = max_failed_polls
        self.step = 0
        self.last: ConsumptionLog | None = None
        self.failed_polls = 0
        """Polls in a row whose storage reads failed (0 after any poll that read the folder)."""
        self._artifact: UUID | None = None

    @property
    def percent(self) -> float:
        return round(100.0 * min(self.step, self.max_steps) / self.max_steps, 1)

    def poll(self) -> int:
        """Read new consumption logs; returns how many steps appeared since the last poll (0 if the read failed).

        Raises the ``StorageError`` of the ``max_failed_polls``-th failed poll in a row."""
        try:
            step = self.step
            while ConsumptionLog.exists(self.store, step + 1):
                step += 1
            last = ConsumptionLog.read(self.store, step) if step > self.step else None
        except StorageError as e:
            self.failed_polls += 1
            if self.failed_polls >= self.max_failed_polls:
                e.add_note(f"progress monitor: {self.failed_polls} polls in a row failed; giving up")
                raise
            self.warn(f"progress: poll failed ({self.failed_polls} in a row, giving up at {self.max_failed_polls}), "
                      f"retrying at the next poll: {e}")
            return 0
        self.failed_polls = 0
        if last is None:
            return 0
        new, self.step, self.last = step - self.step, step, last
        published = last.published_version
        reward = "-" if last.mean_reward is None else f"{last.mean_reward:.3f}"
        self.log(f"progress: step {self.step}/{self.max_steps} ({self.percent:.0f}%), batch reward "
                 f"{reward}, staleness <= {last.staleness_max}"
                 + (f", published v{published}" if published is not None else ""))
        self._publish()
        return new

    def _publish(self) -> None:
        if self._artifact is None:
            self._artifact = create_progress_artifact(self.percent, key=self.key,
                                                      description=f"trainer steps of {self.max_steps}")
        else:
            update_progress_artifact(self._artifact, self.percent)
