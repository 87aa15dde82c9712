"""What a rollout worker needs from the campaign folder besides the channel: its share of tasks (minus the groups
the channel says it committed, ``Channel.committed_groups``), when weights exist, and when to stop. The collect
stage (``pipelines_lib.stages.collect``, which names the workers and writes stop requests) runs the orchestrator over
these.

Group ids are ``<task_id>.e<epoch>``: deterministic, so a restarted worker knows what it has done (task i
belongs to worker ``i % num_workers``); the shard-name worker id is ``<worker>.<start-nonce>``, unique per
process start, so a restarted worker never collides with its previous life's names.
"""

from __future__ import annotations

import datetime as dt
import itertools
import time
from collections.abc import Callable, Iterator

from pipelines_lib.envs.base import Task
from pipelines_lib.records import DoneMarker, Publication, StopRequest
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store


def worker_tasks(tasks: list[Task], *, worker_index: int, num_workers: int, skip: set[str],
                 epochs: int | None = None) -> Iterator[tuple[Task, str]]:
    """This worker's share of ``tasks``, epoch after epoch, minus groups already done."""
    share = tasks[worker_index::num_workers]
    if not share:
        raise ValueError(f"worker {worker_index} of {num_workers} has no tasks ({len(tasks)} in the split)")
    for epoch in itertools.count() if epochs is None else range(epochs):
        for task in share:
            gid = f"{task.task_id}.e{epoch}"
            if gid not in skip:
                yield task, gid


def utc_compact(when: dt.datetime | None = None) -> str:
    return (when or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%S%fZ")


def stop_requested(store: Store, *, since: str) -> bool:
    """The trainer is done, or a stop marker newer than ``since`` (a ``utc_compact`` time) exists."""
    return DoneMarker.exists(store) or StopRequest.newer_than(store, since)


def wait_for_weights(store: Store, timeout_s: float, sleep: Callable[[float], None] = time.sleep) -> int:
    deadline = time.monotonic() + timeout_s
    while (latest := Publication.latest(store)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{store.uri(layout.WEIGHTS_LATEST)}: no published weights after {timeout_s:.0f}s "
                               "(has the warm-start stage run?)")
        sleep(1.0)
    return latest.version
