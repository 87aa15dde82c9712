"""Warm-start stage: SFT (or the ``init_from`` weights) published as version 0
(``pipelines_lib.stages.warm_start.warm_start``)."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from pipelines_lib.settings import DEFAULTS, Settings
from pipelines_lib.stages.table import stage
from pipelines_lib.stages.warm_start import warm_start as warm_start_weights
from tasks.common import IO_RETRY_DELAYS_S, open_campaign, retry_transient, stage_key, stage_run


@task(name="warm-start", retries=stage("warm_start").retries, retry_delay_seconds=IO_RETRY_DELAYS_S,
      retry_condition_fn=retry_transient)
def warm_start(campaign_url: str, storage_options: dict[str, Any] | None = None,
               settings: Settings = DEFAULTS) -> dict[str, Any]:
    """No-op once ``weights/v00000000`` is published."""
    store, config = open_campaign(campaign_url, storage_options, settings)
    log = get_run_logger()
    return stage_run(store, stage_key("warm_start"), lambda: warm_start_weights(store, config, cache=settings.cache, log=log.info))
