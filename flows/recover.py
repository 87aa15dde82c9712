"""The recover flow: finish a campaign whose run died, running only what its folder says is missing.

``campaign_status(store)`` reads markers and pointers only; its ``todo`` lists the stages to run, in
order. Each stage then continues rather than restarts: the trainer restores its last checkpoint and
replays its logged steps, rollout workers skip the groups they already committed, evaluation fills the
versions without ``eval/vN.json``. The config is the campaign's own (``campaign.json``), so a recovery can
never silently change the experiment.

Command line: ``rollstream recover URL [-o key=value ...] [--use-deployments]`` (``python -m flows.recover``
is the same command).
"""

from __future__ import annotations

import sys
from typing import Any

from prefect import flow, get_run_logger
from prefect.client.schemas.objects import State
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from flows import entry
from flows.campaign import STAGE_ORDER, ended, run_stages
from flows.launch import Launcher, StageRunCrashed
from flows.runs import abandon_runs, campaign_name, label_run
from pipelines_lib.stages.campaign import campaign_status
from pipelines_lib.stages.stopping import Stopped, stop_on_signals
from tasks.common import open_campaign


def recovery_plan(status: dict[str, Any]) -> list[str]:
    """The stages to run, in campaign order; a campaign without ``campaign.json`` cannot be recovered."""
    if "init" in status["todo"]:
        raise ValueError("no campaign.json: nothing to recover; start the campaign with `rollstream run`")
    return [s for s in STAGE_ORDER if s in status["todo"]]


def recover_run_name(campaign_url: str) -> str:
    """``<campaign>-recover``: a recover run named after the campaign folder it works on (the heal flow names the
    run it starts so, before a worker picks it up)."""
    return f"{campaign_name(campaign_url)}-recover"


def run_name() -> str:
    return recover_run_name(flow_run.parameters["campaign_url"])


@flow(name="rollstream-recover", flow_run_name=run_name, task_runner=ThreadPoolTaskRunner(max_workers=64))
def recover(campaign_url: str, storage_options: dict[str, Any] | None = None, use_deployments: bool = False,
            poll_s: float = 5.0) -> dict[str, Any] | State:
    """Run the stages the campaign folder lacks; returns the status before, the runs it took over (marked Crashed)
    and the manifests of what ran."""
    log = get_run_logger()
    settings = entry(campaign_url, storage_options)
    with stop_on_signals(campaign=settings.store(campaign_url, storage_options)):
        label_run(campaign_url, "recover")
        abandoned = abandon_runs(campaign_url)
        status = campaign_status(settings.store(campaign_url, storage_options))
        plan = recovery_plan(status)
        log.info("recover %s: train at step %s (checkpoint %s), versions %s, %s shards; running %s", campaign_url,
                 status["train_steps"], status["latest_checkpoint"], status["published_versions"], status["shards"],
                 plan)
        _, config = open_campaign(campaign_url, storage_options, settings)
        launcher = Launcher(campaign_url=campaign_url, config=config, storage_options=storage_options,
                            settings=settings, use_deployments=use_deployments)
        try:
            return {"status": status, "plan": plan, "abandoned": abandoned, **run_stages(launcher, plan, poll_s=poll_s)}
        except (StageRunCrashed, Stopped) as e:
            return ended(e)


if __name__ == "__main__":  # the same command line as `rollstream recover`
    from pipelines_lib.cli import main

    sys.exit(main(["recover", *sys.argv[1:]]))
