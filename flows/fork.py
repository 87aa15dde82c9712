"""The fork flow: start a new campaign from a step of another under changed settings, then, if asked, run it.

Entry point for a deployment or a notebook: ``fork_flow(campaign_url, step, fork_url, overrides={...})``. The
fork's folder gets only its ``campaign.json`` (the parent's history is referenced, never copied or written);
``run=True`` then runs the recover flow on it: the stages its folder lacks, under the fork's own config. Through
the parent's history it lacks neither the dataset nor the warm start; its rollout workers start on the fork's
version, its trainer resumes from the parent's state and trains on to ``trainer.max_steps``, then evaluation and
the audit run as in any campaign.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from flows import entry
from flows.recover import recover
from tasks.fork import fork


@flow(name="fork")
def fork_flow(campaign_url: str, step: int, fork_url: str, overrides: dict[str, Any] | None = None,
              storage_options: dict[str, Any] | None = None, run: bool = False, poll_s: float = 2.0
              ) -> dict[str, Any]:
    settings = entry(campaign_url, storage_options)
    result = fork(campaign_url, step, fork_url, overrides, storage_options, settings)
    parent = result["parent"]
    get_run_logger().info("%s %s at step %s (version %s) into %s; changed: %s",
                          "forked" if result["created"] else "already forked", parent["url"], parent["step"],
                          parent["version"], result["campaign"], sorted(parent["config_diff"]) or "nothing")
    if run:
        result["run"] = recover(fork_url, storage_options, poll_s=poll_s)
    return result
