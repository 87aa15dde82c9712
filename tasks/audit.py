"""Audit stage task: ``stages.audit.audit`` over any campaign folder (it needs no ``campaign.json``)."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from pipelines_lib.settings import DEFAULTS, Settings
from pipelines_lib.stages.audit import audit as audit_stage
from pipelines_lib.stages.table import stage
from tasks.common import IO_RETRY_DELAYS_S, open_store, retry_transient, stage_key, stage_run


@task(name="audit", retries=stage("audit").retries, retry_delay_seconds=IO_RETRY_DELAYS_S,
      retry_condition_fn=retry_transient)
def audit(campaign_url: str, storage_options: dict[str, Any] | None = None,
          settings: Settings = DEFAULTS) -> dict[str, Any]:
    """Audit the folder (it needs no ``campaign.json``) and keep the report under ``audit/``; returns the verdict
    and where the report is."""
    store = open_store(campaign_url, storage_options, settings)
    return stage_run(store, stage_key("audit"), lambda: audit_stage(store, progress=get_run_logger().info))
