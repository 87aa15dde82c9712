"""Train stage: the streaming GRPO trainer (``pipelines_lib.stages.train.train``) up to ``max_steps`` and its done
marker.

A retry is a resume, not a redo: the trainer restores its newest checkpoint, replays the logged steps after
it and continues with the same cursor. So the retries below cost at most ``checkpoint_every`` steps each.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from pipelines_lib.settings import DEFAULTS, Settings
from pipelines_lib.stages.table import stage
from pipelines_lib.stages.train import train as train_policy
from tasks.common import IO_RETRY_DELAYS_S, open_campaign, retry_transient, stage_key, stage_run


@task(name="train", retries=stage("train").retries, retry_delay_seconds=IO_RETRY_DELAYS_S,
      retry_condition_fn=retry_transient)
def train(campaign_url: str, max_steps: int | None = None, storage_options: dict[str, Any] | None = None,
          settings: Settings = DEFAULTS) -> dict[str, Any]:
    """``max_steps`` stops early (a partial run to resume later); the default is ``trainer.max_steps``."""
    store, config = open_campaign(campaign_url, storage_options, settings)
    log = get_run_logger()
    return stage_run(store, stage_key("train"),
                     lambda: train_policy(store, config, max_steps=max_steps, cache=settings.cache, log=log.info))
