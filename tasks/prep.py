"""Prep stage task: the dataset splits under ``dataset/`` (``pipelines_lib.stages.prep``)."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from pipelines_lib.settings import DEFAULTS, Settings
from pipelines_lib.stages.prep import prep
from pipelines_lib.stages.table import stage
from tasks.common import IO_RETRY_DELAYS_S, open_campaign, retry_transient, stage_key, stage_run


@task(name="prep", retries=stage("prep").retries, retry_delay_seconds=IO_RETRY_DELAYS_S, retry_condition_fn=retry_transient)
def prep_dataset(campaign_url: str, storage_options: dict[str, Any] | None = None,
                 source_storage_options: dict[str, Any] | None = None, settings: Settings = DEFAULTS
                 ) -> dict[str, Any]:
    """``source_storage_options`` open the source file when it is a URL (e.g. another bucket)."""
    store, config = open_campaign(campaign_url, storage_options, settings)
    manifest = stage_run(store, stage_key("prep"),
                         lambda: prep(store, config, source_storage_options=source_storage_options))
    splits = ", ".join(f"{name} {s['rows']} rows" for name, s in manifest["splits"].items())
    get_run_logger().info("prep: %s (%s bad rows)", splits, len(manifest["bad_rows"]))
    return manifest
