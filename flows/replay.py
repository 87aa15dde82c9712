"""The replay flow: recompute one logged training step of a campaign, as run or under a what-if.

Entry point for a deployment or a notebook: ``replay_flow(campaign_url, step, what_if={...})``. It reads the
campaign only; the verdict goes to the run's log and its return value.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from flows import entry
from tasks.replay import replay_step


@flow(name="replay")
def replay_flow(campaign_url: str, step: int, what_if: dict[str, Any] | None = None, dump_url: str | None = None,
                storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    settings = entry(campaign_url, storage_options)
    result = replay_step(campaign_url, step, what_if, dump_url, storage_options, settings)
    get_run_logger().info("replay of step %s: loss %r (logged %r), grad_norm %r (logged %r)%s", step,
                          result["loss"]["recomputed"], result["loss"]["logged"], result["grad_norm"]["recomputed"],
                          result["grad_norm"]["logged"],
                          f", what-if {result['what_if']}" if what_if else
                          f", {'identical' if result['identical'] else 'DIFFERENT'}")
    return result
