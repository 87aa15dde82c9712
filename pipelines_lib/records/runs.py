"""Records of stage runs: ``RunRecord`` (``runs/``, one per stage run inside a flow run, listed by
``run_records``), ``StopRequest`` (``rollout/STOP-<utc>.json``, which stops the rollout workers started
before it) and ``HealAttempt`` (``heal/<n>.json``, one per automatic recovery after a crash, listed by
``heal_attempts``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pipelines_lib.records.base import Record, RecordError
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store

# -- rollout/STOP-<utc>.json ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StopRequest(Record):
    """Rollout workers and trainers started before ``requested_at`` stop (the campaign asks when its trainer fails for
    good, or when a signal stops its run: ``stages.stopping``)."""

    requested_at: str
    """``layout.utc_compact`` time; also the object's name."""
    reason: str

    KEY: ClassVar[tuple[str, ...]] = ("requested_at",)

    @classmethod
    def path_of(cls, requested_at: str) -> str:  # type: ignore[override]
        return layout.stop_marker(requested_at)

    @classmethod
    def times(cls, store: Store) -> list[str]:
        """``requested_at`` of every stop request, oldest first."""
        return sorted(t for n in store.list(layout.ROLLOUT_STOPS) if (t := layout.parse_stop_name(n)))

    @classmethod
    def newer_than(cls, store: Store, since: str) -> bool:
        return any(t > since for t in cls.times(store))


# -- runs/<key>-<flow_run_id>.json ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RunRecord(Record):
    """One stage run inside a Prefect flow run: who ran it where, how it ended, and its manifest or error."""

    key: str
    """``stage``, ``stage-w<i>`` or ``stage-v<N:08d>`` (``tasks.common.stage_key``)."""
    flow_run_id: str
    flow_run_name: str | None
    deployment_id: str | None
    task_run_id: str | None
    host: str
    pid: int
    started_at: str
    state: str
    """``completed`` or ``failed``."""
    finished_at: str
    seconds: float
    attempt: str | None = None
    """``<flow run count>.<task run count>`` of a failed attempt."""
    manifest: dict[str, Any] | None = None
    error: str | None = None

    KEY: ClassVar[tuple[str, ...]] = ("key", "flow_run_id", "attempt")

    @classmethod
    def path_of(cls, key: str, flow_run_id: str, attempt: str | None = None) -> str:  # type: ignore[override]
        """A failed attempt's record is kept beside the run's own (``-failed-<attempt>``)."""
        return layout.run_record(key, flow_run_id, failed_attempt=attempt)


def run_records(store: Store) -> list[RunRecord]:
    """Every run record in the folder, in name order."""
    return [RunRecord.at(store, f"{layout.RUNS}/{n}") for n in store.list(layout.RUNS) if n.endswith(".json")]


# -- heal/<attempt:04d>.json ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class HealAttempt(Record):
    """One crash of the campaign's orchestrating flow run, answered automatically: a recovery started, or none
    because the campaign's retry budget was spent. Create-only: two answers to crashes never share a number."""

    attempt: int
    crashed_flow_run_id: str
    crashed_flow_run_name: str
    healer_flow_run_id: str
    at: str
    outcome: str
    """``recover`` (a recovery was started) or ``budget spent`` (``max_attempts`` recoveries were started before)."""
    max_attempts: int

    KEY: ClassVar[tuple[str, ...]] = ("attempt",)
    OUTCOMES: ClassVar[tuple[str, ...]] = ("recover", "budget spent")

    def __post_init__(self) -> None:
        if self.outcome not in self.OUTCOMES:
            raise RecordError(f"HealAttempt.outcome must be one of {self.OUTCOMES}, got {self.outcome!r}")

    @classmethod
    def path_of(cls, attempt: int) -> str:  # type: ignore[override]
        return layout.heal_attempt(attempt)


def heal_attempts(store: Store) -> list[HealAttempt]:
    """Every heal record of the campaign, oldest first."""
    numbers = sorted(n for name in store.list(layout.HEAL) if (n := layout.parse_heal_name(name)) is not None)
    return [HealAttempt.read(store, n) for n in numbers]
