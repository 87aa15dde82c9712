"""The recover flow: finish a campaign whose run died, running only what its folder says is missing.

``campaign_status(store)`` reads markers and pointers only; its ``todo`` lists the stages to run, in
order. Each stage then continues rather than restarts: the trainer restores its last checkpoint and
replays its logged steps, rollout workers skip the groups they already committed, evaluation fills the
versions without ``eval/vN.json``. The config is the campaign's own (``campaign.json``), so a recovery can
never silently change the experiment.

Entry point: ``python -m flows.recover URL [--storage-options JSON] [--use-deployments]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from prefect import flow, get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner

from flows import entry
from flows.campaign import STAGE_ORDER, EvalChoice, run_stages
from flows.launch import Launcher
from pipelines_lib.stages.campaign import campaign_status
from tasks.common import open_campaign


def recovery_plan(status: dict[str, Any]) -> list[str]:
    """The stages to run, in campaign order; a campaign without ``campaign.json`` cannot be recovered."""
    if "init" in status["todo"]:
        raise ValueError("no campaign.json: nothing to recover; start the campaign with flows.campaign")
    return [s for s in STAGE_ORDER if s in status["todo"]]


@flow(name="rollstream-recover", task_runner=ThreadPoolTaskRunner(max_workers=64))
def recover(campaign_url: str, storage_options: dict[str, Any] | None = None, use_deployments: bool = False,
            evaluate: EvalChoice = "all", poll_s: float = 5.0) -> dict[str, Any]:
    """Run the stages the campaign folder lacks; returns the status before and the manifests of what ran."""
    log = get_run_logger()
    settings = entry(campaign_url, storage_options)
    status = campaign_status(settings.store(campaign_url, storage_options))
    plan = recovery_plan(status)
    log.info("recover %s: train at step %s (checkpoint %s), versions %s, %s shards; running %s", campaign_url,
             status["train_steps"], status["latest_checkpoint"], status["published_versions"], status["shards"],
             plan)
    _, config = open_campaign(campaign_url, storage_options, settings)
    launcher = Launcher(campaign_url=campaign_url, config=config, storage_options=storage_options, settings=settings,
                        use_deployments=use_deployments)
    return {"status": status, "plan": plan, **run_stages(launcher, plan, evaluate=evaluate, poll_s=poll_s)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flows.recover", description=__doc__.split("\n\n")[0])
    p.add_argument("campaign_url")
    p.add_argument("--storage-options", type=json.loads, help="JSON object of fsspec options")
    p.add_argument("--use-deployments", action="store_true")
    p.add_argument("--evaluate", choices=["all", "ends"], default="all")
    args = p.parse_args(argv)
    result = recover(args.campaign_url, storage_options=args.storage_options, use_deployments=args.use_deployments,
                     evaluate=args.evaluate)
    print(f"recovered {args.campaign_url}: ran {result['plan']}; audit "
          f"{'OK' if result.get('audit', {}).get('ok') else 'FAILED'}")
    return 0 if result.get("audit", {}).get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
