"""The stage table is the one declaration of the stages: flows, launcher, tasks, status and deployments agree."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml
from prefect import Flow

from flows import stages as stage_flows
from flows.campaign import STAGE_ORDER
from flows.launch import DEPLOYMENTS, STAGE_TASKS
from pipelines_lib.config import CampaignConfig
from pipelines_lib.stages.campaign import campaign_status
from pipelines_lib.stages.table import STAGE_NAMES, STAGES, resources_for, stage
from pipelines_lib.storage.store import Store

INFRA = Path(__file__).resolve().parents[1] / "infra"


def test_the_campaign_runs_the_table_in_its_order_and_the_launcher_has_a_task_and_deployment_each() -> None:
    assert STAGE_ORDER == STAGE_NAMES == ("prep", "warm_start", "collect", "train", "evaluate", "audit")
    assert list(STAGE_TASKS) == list(DEPLOYMENTS) == list(STAGE_NAMES)
    for s in STAGES:
        assert STAGE_TASKS[s.name].retries == s.retries, s.name


def test_each_stage_has_one_flow_named_after_it() -> None:
    flows = {f.name for f in vars(stage_flows).values() if isinstance(f, Flow) and f.name.startswith("rollstream-")}
    assert flows == {s.flow_name for s in STAGES}
    assert list(stage_flows.STAGE_FLOWS) == list(STAGE_NAMES)
    assert all(stage_flows.STAGE_FLOWS[s.name].name == s.flow_name for s in STAGES)


def test_infra_prefect_yaml_deploys_each_stage_on_its_pool() -> None:
    spec = yaml.safe_load((INFRA / "prefect.yaml").read_text())
    deployments = {d["name"]: d for d in spec["deployments"]}
    stage_deployments = {s.deployment.split("/")[1]: s for s in STAGES}
    assert set(deployments) == set(stage_deployments) | {"nightly", "nightly-local", "smoke", "recover", "heal"}
    tiny = CampaignConfig.tiny()
    for name, s in stage_deployments.items():
        path, attr = deployments[name]["entrypoint"].split(":")
        flow = getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), attr)
        assert flow.name == s.flow_name
        assert deployments[name]["work_pool"]["name"] == s.pool == resources_for(s.name, tiny).pool


def test_status_todo_is_every_stage_whose_marker_is_missing(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "c"))
    assert campaign_status(store)["todo"] == ["init", *STAGE_NAMES]


def test_an_unknown_stage_is_refused_naming_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown stage 'publish'; valid: \('prep', 'warm_start'"):
        stage("publish")
