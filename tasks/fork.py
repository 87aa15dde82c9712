"""Fork task: ``stages.fork.fork_campaign``, a new campaign whose ``campaign.json`` references its parent's history
up to a step. It writes only that object, into the new folder; the parent is only read (no run record there)."""

from __future__ import annotations

from typing import Any

from prefect import task

from pipelines_lib.settings import DEFAULTS, Settings
from pipelines_lib.stages.fork import fork_campaign
from tasks.common import open_store


# No task retries: the store retries its own IO, and a rerun finds the fork's campaign.json (a no-op).
@task(name="fork")
def fork(campaign_url: str, step: int, fork_url: str, overrides: dict[str, Any] | None = None,
         storage_options: dict[str, Any] | None = None, settings: Settings = DEFAULTS) -> dict[str, Any]:
    """Fork ``campaign_url`` at ``step`` into ``fork_url`` with the dotted-key ``overrides``."""
    parent = open_store(campaign_url, storage_options, settings)
    return fork_campaign(parent, step, open_store(fork_url, storage_options, settings), overrides or {})
