"""Init stage: write ``campaign.json`` (the config snapshot) once; the same config again is a no-op."""

from __future__ import annotations

from typing import Any

from prefect import task

from pipelines_lib.config import CampaignConfig
from pipelines_lib.settings import DEFAULTS, Settings
from pipelines_lib.stages.campaign import init_campaign as init_campaign_folder
from tasks.common import IO_RETRIES, IO_RETRY_DELAYS_S, open_store, retry_transient, stage_key, stage_run


@task(name="init", retries=IO_RETRIES, retry_delay_seconds=IO_RETRY_DELAYS_S, retry_condition_fn=retry_transient)
def init_campaign(campaign_url: str, config: dict[str, Any], storage_options: dict[str, Any] | None = None,
                  settings: Settings = DEFAULTS) -> dict[str, Any]:
    """``config`` is a full ``CampaignConfig`` mapping (``to_dict()``); a different one than the folder's fails."""
    store = open_store(campaign_url, storage_options, settings)
    cfg = CampaignConfig.from_mapping(config)
    return stage_run(store, stage_key("init"), lambda: init_campaign_folder(store, cfg))
