"""Flow runs as Prefect shows them, against a real (ephemeral) Prefect API: tags, per-campaign concurrency limits,
and a recovery taking over its campaign's abandoned run."""

from __future__ import annotations

from prefect import flow, get_client
from prefect.client.schemas.objects import StateType
from prefect.runtime import flow_run
from prefect.states import Running

from flows.campaign import campaign
from flows.runs import abandon_runs, campaign_limit, campaign_tag, label_run


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
