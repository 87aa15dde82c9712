"""Collect stage: one rollout worker (``rollout.collect``) until the trainer's done marker or a target.

Worker ``i`` of ``n`` owns tasks ``i, i+n, ...`` and is named ``rollout<i>``: the name is stable across
restarts, so a restarted worker skips the groups its earlier lives committed (the library appends a
per-start nonce to shard names).
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from pipelines_lib.settings import DEFAULTS, Settings
from pipelines_lib.stages.collect import collect, worker_name
from pipelines_lib.stages.table import stage
from tasks.common import IO_RETRY_DELAYS_S, open_campaign, retry_transient, stage_key, stage_run


@task(name="collect", retries=stage("collect").retries, retry_delay_seconds=IO_RETRY_DELAYS_S, retry_condition_fn=retry_transient,
      task_run_name="collect-w{worker_index}")
def collect_rollouts(campaign_url: str, worker_index: int, num_workers: int, target_groups: int | None = None,
                     storage_options: dict[str, Any] | None = None, settings: Settings = DEFAULTS
                     ) -> dict[str, Any]:
    """A retry resumes: groups already committed by this worker are skipped. One line per shard is logged at
    DEBUG (``rollstream run -v`` shows it)."""
    store, config = open_campaign(campaign_url, storage_options, settings)
    log = get_run_logger()
    return stage_run(store, stage_key("collect", worker_index=worker_index), lambda: collect(
        store, config, worker=worker_name(worker_index), worker_index=worker_index, num_workers=num_workers,
        target_groups=target_groups, cache=settings.cache, log=log.info, detail=log.debug))
