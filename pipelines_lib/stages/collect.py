"""The collect stage: one rollout worker collecting groups for a campaign until the trainer is done.

``collect`` waits for published weights, opens the configured engine on the latest version
(``engine.backends``; a vLLM server's log ends up in ``telemetry/engine-<worker id>.log``), takes its share of the train split, skips groups this logical worker already committed in earlier runs (``rollout.collect``), and runs
the orchestrator with the campaign's episode factory, refreshing weights as ``weights/LATEST`` moves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipelines_lib import telemetry
from pipelines_lib.config import CampaignConfig
from pipelines_lib.dataset import load_split
from pipelines_lib.engine.backends import open_engine
from pipelines_lib.model.tokenizer import open_tokenizer
from pipelines_lib.publish import CampaignWeights
from pipelines_lib.records import DoneMarker, with_parents
from pipelines_lib.rollout.collect import (
    utc_compact,
    wait_for_weights,
    worker_tasks,
)
from pipelines_lib.rollout.episodes import env_sandbox, make_episode_fn
from pipelines_lib.rollout.orchestrator import Orchestrator
from pipelines_lib.rollout.weights import WeightSource
from pipelines_lib.stages.stopping import request_stop, should_stop
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.folder import FolderChannel


def worker_name(worker_index: int) -> str:
    """The stable name of rollout worker ``worker_index`` (a restart keeps it, so it skips its committed groups)."""
    return f"rollout{worker_index}"


def collect(store: Store, config: CampaignConfig, *, worker: str, worker_index: int, num_workers: int,
            target_groups: int | None = None, weights_timeout_s: float = 600.0, cache: Path | None = None,
            weights: WeightSource | None = None, log: Callable[[str], None] = print, detail: Callable[[str], None] | None = None,
            progress_every: int = 10) -> dict[str, Any]:
    """Run rollout worker ``worker`` (``worker_index`` of ``num_workers``) until the trainer's done marker, a stop
    request, a stop signal to this process (``stages.stopping``) or ``target_groups``; returns its statistics. ``cache`` is the process's cache folder
    (``Settings.cache``). ``weights`` replaces the engine backend's source of new weights (colocated placement:
    the trainer's device memory, ``stages.colocated.DeviceWeights``). ``log`` gets a progress line every ``progress_every`` shards, ``detail`` (if given) one
    line per shard: a campaign commits hundreds of shards, too many lines for a terminal by default."""
    if not 0 <= worker_index < num_workers:
        raise ValueError(f"worker_index must be in [0, {num_workers}), got {worker_index}")
    layout.check_worker_id(worker)
    if "." in worker:
        raise ValueError(f"worker name may not contain '.', got {worker!r} (it separates the start nonce)")
    store = with_parents(store)  # a fork's workers read its parent's dataset and starting version
    wait_for_weights(store, weights_timeout_s)
    if DoneMarker.exists(store):
        return {"worker": worker, "groups_committed": 0, "stop_reason": "trainer already done"}
    started = utc_compact()
    worker_id = f"{worker}.{time.time_ns() // 1000:x}"
    tokenizer = open_tokenizer(config.tokenizer, cache=cache)
    channel = FolderChannel(store)
    skip = channel.committed_groups(worker)
    tasks = worker_tasks(load_split(store, "train"), worker_index=worker_index, num_workers=num_workers, skip=skip)
    rc = config.rollout if target_groups is None else dataclasses.replace(config.rollout, target_groups=target_groups)
    commits = shards = 0

    def on_commit(info) -> None:
        nonlocal commits, shards
        commits, shards = commits + info.n_groups, shards + 1
        if detail is not None:
            detail(f"rollout {worker_id}: committed {info.path} ({info.n_groups} groups, {commits} so far)")
        if shards % progress_every == 0:
            log(f"rollout {worker_id}: {shards} shards committed ({commits} groups)")

    async def run(scratch: Path) -> Any:
        opened, published = open_engine(store, CampaignWeights(store).latest(), config.engine, scratch, log)
        async with opened as engine, env_sandbox(config.env) as sandbox:
            orchestrator = Orchestrator(
                config=rc, engine=engine,
                episode_fn=make_episode_fn(rc, config.agent, engine=engine, tokenizer=tokenizer, worker_id=worker_id,
                                           env=config.env, tool_latency=config.env.tool_latency, sandbox=sandbox,
                                           seed_salt=f"rollout.{config.seed}"),
                tasks=tasks, writer=channel.writer(worker_id, rc.writer),
                weights=published if weights is None else weights, should_stop=lambda: should_stop(store, since=started),
                on_commit=on_commit, refund_zero_advantage=config.trainer.skip_zero_advantage)
            stats = await orchestrator.run()
            return stats, engine.stats()

    with tempfile.TemporaryDirectory(prefix=f"rollstream-{worker}-") as tmp, \
            telemetry.recording(store, f"rollout-{worker}"):
        scratch = Path(tmp)
        try:
            stats, engine_stats = asyncio.run(run(scratch))
        finally:
            server_log = scratch / "vllm-server.log"
            if server_log.exists():
                store.create(f"telemetry/engine-{worker_id}.log", server_log.read_bytes())
    log(f"rollout {worker_id}: stopped ({stats.stop_reason}); {stats.groups_committed} groups, "
        f"statuses {dict(stats.statuses)}"
        + (f"; {stats.groups_unstored} finished groups dropped: the version they sampled from was not stored within "
           f"rollout.hold_timeout_s={rc.hold_timeout_s:g}s of the stop" if stats.groups_unstored else ""))
    return {"worker": worker, "worker_id": worker_id, "skipped_done_groups": len(skip), **stats.to_dict(),
            "engine": engine_stats if isinstance(engine_stats, dict) else getattr(engine_stats, "__dict__", {})}


__all__ = ["collect", "request_stop", "worker_name"]
