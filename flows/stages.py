"""One flow per stage, each deployable and runnable alone (``infra/prefect.yaml`` deploys them).

Every stage flow reads the campaign's config from ``campaign.json``, so its parameters are only where the
campaign is and which part of the stage to run. The accelerator stages (warm start, collect, train) hold a
``gpu:<slot>:<campaign>`` global concurrency limit of 1 while they run (``flows.runs.campaign_limit`` creates it):
a campaign and its recovery never run two trainers, two campaigns never wait for each other. A SIGTERM or SIGINT to
a stage run's process (a worker cancelling it, a pod eviction, Ctrl-C on ``rollstream stage``) stops that stage at
its next safe point and ends the run Cancelled (``until_stopped``).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, ParamSpec

from prefect import flow, get_run_logger
from prefect.client.schemas.objects import State
from prefect.concurrency.sync import concurrency
from prefect.runtime import flow_run

from flows import artifacts, entry
from flows.runs import campaign_limit, campaign_name, label_run, stopped
from pipelines_lib.records import Publication
from pipelines_lib.settings import Settings
from pipelines_lib.stages.stopping import Stopped, stop_on_signals
from pipelines_lib.stages.table import resources_for, stage
from tasks.audit import audit
from tasks.collect_rollouts import collect_rollouts
from tasks.common import open_campaign, open_store, stage_key
from tasks.evaluate import evaluate_version
from tasks.prep import prep_dataset
from tasks.train import train
from tasks.warm_start import warm_start


def run_name(stage: str) -> Callable[[], str]:
    """Flow-run names from the campaign and the stage: ``<campaign>-collect-w1``, ``<campaign>-evaluate-v00000002``."""
    def name() -> str:
        params = flow_run.parameters
        key = stage_key(stage, worker_index=params.get("worker_index") if stage == "collect" else None,
                        version=params.get("version"))
        return f"{campaign_name(params['campaign_url'])}-{key}"
    return name


P = ParamSpec("P")


def _slot(stage: str, campaign_url: str, storage_options: dict[str, Any] | None, settings: Settings,
          worker_index: int = 0) -> str:
    """The ``gpu:<slot>:<campaign>`` concurrency limit an accelerator stage holds while it runs (``runs``)."""
    _, config = open_campaign(campaign_url, storage_options, settings)
    return campaign_limit(str(resources_for(stage, config, worker_index=worker_index).concurrency_key), campaign_url)


def until_stopped(body: Callable[P, dict[str, Any]]) -> Callable[P, dict[str, Any] | State]:
    """A stage flow's body under a polite stop (``stages.stopping``): a signal to this process ends the stage at
    its next safe point and the run Cancelled. Only this process's stage stops: the campaign's other stage runs
    (other workers, the trainer) go on."""
    @functools.wraps(body)
    def run(*args: P.args, **kwargs: P.kwargs) -> dict[str, Any] | State:
        with stop_on_signals() as stop:
            result = body(*args, **kwargs)
        return result if stop.signum is None else stopped(Stopped(stop.signum))
    return run


@flow(name=stage("prep").flow_name, flow_run_name=run_name("prep"))
@until_stopped
def prep_flow(campaign_url: str, storage_options: dict[str, Any] | None = None,
              source_storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    settings = entry(campaign_url, storage_options)
    label_run(campaign_url, "prep")
    return prep_dataset(campaign_url, storage_options, source_storage_options, settings)


@flow(name=stage("warm_start").flow_name, flow_run_name=run_name("warm_start"))
@until_stopped
def warm_start_flow(campaign_url: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    settings = entry(campaign_url, storage_options)
    label_run(campaign_url, "warm_start")
    with concurrency(_slot("warm_start", campaign_url, storage_options, settings), occupy=1):
        return warm_start(campaign_url, storage_options, settings)


@flow(name=stage("collect").flow_name, flow_run_name=run_name("collect"))
@until_stopped
def collect_flow(campaign_url: str, worker_index: int = 0, num_workers: int = 1, target_groups: int | None = None,
                 storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    settings = entry(campaign_url, storage_options)
    label_run(campaign_url, "collect")
    with concurrency(_slot("collect", campaign_url, storage_options, settings, worker_index), occupy=1):
        return collect_rollouts(campaign_url, worker_index, num_workers, target_groups, storage_options, settings)


@flow(name=stage("train").flow_name, flow_run_name=run_name("train"))
@until_stopped
def train_flow(campaign_url: str, max_steps: int | None = None, storage_options: dict[str, Any] | None = None
               ) -> dict[str, Any]:
    settings = entry(campaign_url, storage_options)
    label_run(campaign_url, "train")
    with concurrency(_slot("train", campaign_url, storage_options, settings), occupy=1):
        return train(campaign_url, max_steps, storage_options, settings)


@flow(name=stage("evaluate").flow_name, flow_run_name=run_name("evaluate"))
@until_stopped
def evaluate_flow(campaign_url: str, version: int | None = None, storage_options: dict[str, Any] | None = None
                  ) -> dict[str, Any]:
    """``version`` defaults to the latest published one."""
    settings = entry(campaign_url, storage_options)
    label_run(campaign_url, "evaluate")
    if version is None:
        latest = Publication.latest(open_store(campaign_url, storage_options, settings))
        if latest is None:
            raise ValueError(f"{campaign_url}: nothing published yet to evaluate")
        version = latest.version
    result = evaluate_version(campaign_url, version, storage_options, settings)
    artifacts.publish_eval_table(campaign_url, version, result)
    return result


@flow(name=stage("audit").flow_name, flow_run_name=run_name("audit"))
@until_stopped
def audit_flow(campaign_url: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    settings = entry(campaign_url, storage_options)
    label_run(campaign_url, "audit")
    summary = audit(campaign_url, storage_options, settings)
    artifacts.publish_audit(campaign_url, open_store(campaign_url, storage_options, settings), summary)
    get_run_logger().info("audit %s: %s shards, %s violations (%s)", "OK" if summary["ok"] else "FAILED",
                          summary["shards"], summary["violations"], summary["report"])
    return summary


STAGE_FLOWS = {"prep": prep_flow, "warm_start": warm_start_flow, "collect": collect_flow, "train": train_flow,
               "evaluate": evaluate_flow, "audit": audit_flow}
"""Stage -> its flow; the keys are the stage table's names (``tests/test_stage_table.py``)."""


if __name__ == "__main__":  # the same command line as `rollstream stage`
    from pipelines_lib.cli import main

    sys.exit(main(["stage", *sys.argv[1:]]))
