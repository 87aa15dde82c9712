"""Colocated campaign: prep, warm start, rollouts || trainer and evaluation in this one process
(``stages.colocated.run_colocated``), for a device only one process may hold."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from pipelines_lib.settings import DEFAULTS, Settings
from pipelines_lib.stages.colocated import run_colocated
from tasks.common import IO_RETRIES, IO_RETRY_DELAYS_S, open_campaign, retry_transient, stage_key, stage_run


@task(name="colocated", retries=IO_RETRIES, retry_delay_seconds=IO_RETRY_DELAYS_S, retry_condition_fn=retry_transient)
def colocated_campaign(campaign_url: str, storage_options: dict[str, Any] | None = None,
                       settings: Settings = DEFAULTS) -> dict[str, Any]:
    """A retry continues: every stage inside is idempotent. The audit is left to the flow's audit task."""
    store, config = open_campaign(campaign_url, storage_options, settings)
    log = get_run_logger()
    return stage_run(store, stage_key("colocated"), lambda: run_colocated(
        store, config, cache=settings.cache, log=log.info, with_audit=False))
