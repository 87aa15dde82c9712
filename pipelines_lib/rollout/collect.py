"""The rollout stage: one worker process collecting groups for a campaign until the trainer is done.

``collect`` waits for published weights, loads the latest version into a ``JaxEngine``, takes its share of
the train split (task i belongs to worker ``i % num_workers``), skips groups this logical worker already
committed in earlier runs, and runs the orchestrator. Group ids are ``<task_id>.e<epoch>``: deterministic,
so a restarted worker knows what it has done; the shard-name worker id is ``<worker>.<start-nonce>``, unique
per process start, so a restarted worker never collides with its previous life's names.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

from pipelines_lib import telemetry
from pipelines_lib.config import CampaignConfig
from pipelines_lib.dataset import load_split
from pipelines_lib.engine import JaxEngine
from pipelines_lib.envs.base import Task
from pipelines_lib.publish import CampaignWeights, load_published
from pipelines_lib.records import DoneMarker, Publication, StopRequest
from pipelines_lib.rollout.episodes import campaign_tokenizer, make_episode_fn
from pipelines_lib.rollout.orchestrator import Orchestrator
from pipelines_lib.storage import layout
from pipelines_lib.storage.shards import ShardWriter, read_shard
from pipelines_lib.storage.store import Store


def committed_groups(store: Store, worker: str) -> set[str]:
    """Group ids already committed by any run of logical worker ``worker``."""
    done: set[str] = set()
    for vdir in store.list(layout.TRAJECTORIES):
        for name in store.list(f"{layout.TRAJECTORIES}/{vdir}"):
            if name.startswith(f"{worker}."):
                table, _ = read_shard(store, f"{layout.TRAJECTORIES}/{vdir}/{name}", validate=False)
                done.update(table.column("group_id").to_pylist())
    return done


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


def request_stop(store: Store, reason: str) -> str:
    """Ask every rollout worker running now to stop (workers started later are not affected)."""
    return StopRequest(requested_at=utc_compact(), reason=reason).write(store)


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


def collect(store: Store, config: CampaignConfig, *, worker: str, worker_index: int, num_workers: int,
            target_groups: int | None = None, weights_timeout_s: float = 600.0,
            log: Callable[[str], None] = print) -> dict[str, Any]:
    """The collect stage (docs/STAGES.md)."""
    if not 0 <= worker_index < num_workers:
        raise ValueError(f"worker_index must be in [0, {num_workers}), got {worker_index}")
    layout.check_worker_id(worker)
    if "." in worker:
        raise ValueError(f"worker name may not contain '.', got {worker!r} (it separates the start nonce)")
    wait_for_weights(store, weights_timeout_s)
    if store.exists(layout.TRAIN_DONE):
        return {"worker": worker, "groups_committed": 0, "stop_reason": "trainer already done"}
    started = utc_compact()
    worker_id = f"{worker}.{time.time_ns() // 1000:x}"
    tokenizer = campaign_tokenizer(config)
    model, version = load_published(store)
    skip = committed_groups(store, worker)
    tasks = worker_tasks(load_split(store, "train"), worker_index=worker_index, num_workers=num_workers, skip=skip)
    rc = config.rollout if target_groups is None else dataclasses.replace(config.rollout, target_groups=target_groups)
    commits = 0

    def on_commit(info) -> None:
        nonlocal commits
        commits += info.n_groups
        log(f"rollout {worker_id}: committed {info.path} ({info.n_groups} groups, {commits} so far)")

    async def run() -> Any:
        async with JaxEngine(model, config.engine, policy_version=version) as engine:
            orchestrator = Orchestrator(
                config=rc, engine=engine,
                episode_fn=make_episode_fn(config, engine=engine, tokenizer=tokenizer, worker_id=worker_id),
                tasks=tasks, writer=ShardWriter(store, worker_id=worker_id, config=rc.writer),
                weights=CampaignWeights(store), should_stop=lambda: stop_requested(store, since=started),
                on_commit=on_commit)
            stats = await orchestrator.run()
            return stats, engine.stats()

    with telemetry.recording(store, f"rollout-{worker}"):
        stats, engine_stats = asyncio.run(run())
    log(f"rollout {worker_id}: stopped ({stats.stop_reason}); {stats.groups_committed} groups, "
        f"statuses {dict(stats.statuses)}")
    return {"worker": worker, "worker_id": worker_id, "skipped_done_groups": len(skip), **stats.to_dict(),
            "engine": engine_stats if isinstance(engine_stats, dict) else getattr(engine_stats, "__dict__", {})}
