"""Replay task: ``stages.replay.replay`` of one logged step. It writes nothing into the campaign (no run record
either); only the optional Parquet dump, into its own folder."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from pipelines_lib.settings import DEFAULTS, Settings
from pipelines_lib.stages.replay import replay
from tasks.common import open_store


# No task retries: the store retries its own IO, and a rerun after a written dump would find it (create-only).
@task(name="replay")
def replay_step(campaign_url: str, step: int, what_if: dict[str, Any] | None = None, dump_url: str | None = None,
                storage_options: dict[str, Any] | None = None, settings: Settings = DEFAULTS) -> dict[str, Any]:
    """Recompute ``step`` (under ``what_if``, when given) and compare it with its consumption log."""
    store = open_store(campaign_url, storage_options, settings)
    dump = open_store(dump_url, storage_options, settings) if dump_url else None
    return replay(store, step, what_if=what_if, dump=dump, log=get_run_logger().info)
