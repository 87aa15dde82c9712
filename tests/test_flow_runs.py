"""Flow runs as Prefect shows them, against a real (ephemeral) Prefect API: tags, per-campaign concurrency limits
(created per slot, deleted once the campaign is finished), and a recovery taking over its campaign's abandoned run
(but never a deployment run, which Prefect's heartbeats watch)."""

from __future__ import annotations

import re
from pathlib import Path

from prefect import flow, get_client
from prefect.client.schemas.objects import StateType
from prefect.runtime import flow_run
from prefect.states import Running

from flows.campaign import campaign, expand_campaign_url
from flows.runs import (
    WATCH_TAG,
    abandon_runs,
    campaign_limit,
    campaign_limit_names,
    campaign_tag,
    label_run,
    release_campaign_limits,
)
from pipelines_lib.config import CampaignConfig


@flow(name="rollstream-recover")
def _recovering(campaign_url: str) -> dict:
    label_run(campaign_url, "recover")
    return {"me": str(flow_run.id), "abandoned": abandon_runs(campaign_url)}


def test_a_recovery_marks_its_campaigns_running_run_crashed_naming_itself(prefect_api: str) -> None:
    url = "gs://bucket/campaigns/exp7"
    with get_client(sync_client=True) as client:
        dead = client.create_flow_run(campaign, name="exp7-campaign", tags=[campaign_tag(url)], state=Running())
        other = client.create_flow_run(campaign, name="exp8-campaign", tags=["campaign:exp8"], state=Running())
    result = _recovering(url)
    assert result["abandoned"] == [{"id": str(dead.id), "name": "exp7-campaign"}]
    with get_client(sync_client=True) as client:
        crashed, untouched = client.read_flow_run(dead.id), client.read_flow_run(other.id)
        me = client.read_flow_run(result["me"])
    assert crashed.state.type == StateType.CRASHED and result["me"] in crashed.state.message
    assert untouched.state.type == StateType.RUNNING  # another campaign's run is left alone
    assert {"campaign:exp7", "stage:recover"} <= set(me.tags)


def test_each_campaign_gets_its_own_slot_limit_of_one_created_once(prefect_api: str) -> None:
    assert campaign_limit("gpu:trainer", "runs/exp7") == "gpu:trainer:exp7"
    assert campaign_limit("gpu:trainer", "/elsewhere/exp7") == "gpu:trainer:exp7"  # the same campaign name: one slot
    assert campaign_limit("gpu:trainer", "runs/exp8") == "gpu:trainer:exp8"
    with get_client(sync_client=True) as client:
        limits = {lim.name: lim.limit for lim in client.read_global_concurrency_limits(limit=100)}
    assert limits["gpu:trainer:exp7"] == 1 and limits["gpu:trainer:exp8"] == 1


def test_a_recovery_leaves_a_running_deployment_run_to_its_heartbeats_and_says_so(prefect_api: str) -> None:
    url = "gs://bucket/campaigns/exp9"
    with get_client(sync_client=True) as client:
        watched = client.create_flow_run(campaign, name="exp9-campaign", tags=[campaign_tag(url), WATCH_TAG],
                                         state=Running())
    state = _recovering(url, return_state=True)
    assert state.is_failed() and f"exp9-campaign ({watched.id})" in state.message
    assert "heartbeats stop" in state.message
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(watched.id).state.type == StateType.RUNNING


def test_a_finished_campaigns_slot_limits_are_deleted_and_no_other_campaigns(prefect_api: str) -> None:
    config = CampaignConfig.preset("smoke")
    names = campaign_limit_names("runs/done7", config)
    assert names == sorted(["gpu:trainer:done7"] + [f"gpu:rollout{i}:done7" for i in range(config.workers)])
    for name in names:
        campaign_limit(name.rsplit(":", 1)[0], "runs/done7")
    campaign_limit("gpu:trainer", "runs/other7")
    assert release_campaign_limits("runs/done7", config) == names
    with get_client(sync_client=True) as client:
        left = {lim.name for lim in client.read_global_concurrency_limits(limit=200)}
    assert not left & set(names) and "gpu:trainer:other7" in left
    assert release_campaign_limits("runs/done7", config) == []  # a second release finds nothing, and says so


def test_a_scheduled_campaign_run_is_named_and_tagged_after_the_folder_its_url_expanded_to(prefect_api, tmp_path) -> None:
    template = f"{tmp_path}/Smoke-{{datetime}}"
    state = campaign(campaign_url=template, config_path=str(tmp_path / "missing.yaml"), return_state=True)
    assert state.is_failed()  # after the run got its name and tags: the config is read in its body
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
    folder = Path(expand_campaign_url(template, run.expected_start_time)).name
    assert re.fullmatch(r"Smoke-\d{8}T\d{4}", folder)
    assert run.name == f"{folder}-campaign"
    assert {f"campaign:{folder}", "stage:campaign"} <= set(run.tags)
