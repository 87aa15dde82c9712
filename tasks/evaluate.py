"""Evaluate stage: score one published version on the held-out split (``pipelines_lib.stages.evaluate.evaluate``)."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from pipelines_lib.settings import DEFAULTS, Settings
from pipelines_lib.stages.evaluate import evaluate
from pipelines_lib.stages.table import stage
from tasks.common import IO_RETRY_DELAYS_S, open_campaign, retry_transient, stage_key, stage_run


@task(name="evaluate", retries=stage("evaluate").retries, retry_delay_seconds=IO_RETRY_DELAYS_S, retry_condition_fn=retry_transient,
      task_run_name="evaluate-v{version}")
def evaluate_version(campaign_url: str, version: int, storage_options: dict[str, Any] | None = None,
                     settings: Settings = DEFAULTS) -> dict[str, Any]:
    """No-op when ``eval/v<version>.json`` exists."""
    store, config = open_campaign(campaign_url, storage_options, settings)
    log = get_run_logger()
    return stage_run(store, stage_key("evaluate", version=version),
                     lambda: evaluate(store, config, version=version, cache=settings.cache, log=log.info).to_dict())
