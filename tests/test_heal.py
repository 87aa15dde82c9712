"""Self-healing campaigns against a real (ephemeral) Prefect API: the heal flow, run for a crashed campaign run,
starts the recover deployment on the campaign's own folder, once per crash, until the campaign's retry budget is
spent; then it starts nothing, fails loudly, emits an event, and ``rollstream status`` says so."""

from __future__ import annotations

import time

import pytest
from prefect import get_client
from prefect.events.filters import EventFilter, EventNameFilter
from prefect.states import Crashed

from flows.campaign import campaign, expand_campaign_url
from flows.heal import BUDGET_SPENT_EVENT, heal
from pipelines_lib.records import HealAttempt, heal_attempts
from pipelines_lib.stages.campaign import campaign_status, claim_heal_attempt, render_status
from pipelines_lib.storage.store import Store


def test_heal_claims_are_numbered_create_only_and_the_budget_counts_recoveries(tmp_path) -> None:
    store = Store(str(tmp_path / "exp7"))
    claims = [claim_heal_attempt(store, max_attempts=2, crashed_flow_run_id=f"run{i}",
                                 crashed_flow_run_name=f"exp7-campaign-{i}", healer_flow_run_id=f"heal{i}")
              for i in range(3)]
    assert [(c.attempt, c.outcome) for c in claims] == [(1, "recover"), (2, "recover"), (3, "budget spent")]
    assert heal_attempts(store) == claims
    # A healer that counted before another claimed still gets its own number (create-only, no overwrite).
    HealAttempt(attempt=5, crashed_flow_run_id="x", crashed_flow_run_name="x", healer_flow_run_id="x",
                at="2026-01-01T00:00:00+00:00", outcome="budget spent", max_attempts=2).write(store)
    assert claim_heal_attempt(store, max_attempts=2, crashed_flow_run_id="y", crashed_flow_run_name="y",
                              healer_flow_run_id="y").attempt == 6
    status = campaign_status(store)["heal"]
    assert status["recoveries"] == 2 and status["budget_spent_at"] == claims[2].at
    assert "automatic recovery: BUDGET SPENT" in render_status(campaign_status(store), recover="rollstream recover")
    with pytest.raises(ValueError, match="HealAttempt.outcome must be one of"):
        HealAttempt(attempt=7, crashed_flow_run_id="z", crashed_flow_run_name="z", healer_flow_run_id="z",
                    at="2026-01-01T00:00:00+00:00", outcome="maybe", max_attempts=2)


def test_a_crashed_nightly_run_is_recovered_in_its_own_folder_until_the_budget_is_spent(prefect_api: str,
                                                                                       tmp_path) -> None:
    with get_client(sync_client=True) as client:
        recover_id = client.create_deployment(flow_id=client.create_flow_from_name("rollstream-recover"),
                                              name="recover", entrypoint="flows/recover.py:recover")
        crashed = client.create_flow_run(campaign, name="nightly-campaign", state=Crashed(message="worker gone"),
                                         parameters={"campaign_url": f"{tmp_path}/nightly-{{date}}",
                                                     "use_deployments": True})
        crashed = client.read_flow_run(crashed.id)
    folder = expand_campaign_url(f"{tmp_path}/nightly-{{date}}", crashed.expected_start_time)
    assert "{date}" not in folder

    first = heal(flow_run_id=str(crashed.id), max_attempts=1)
    assert first["campaign_url"] == folder and first["attempt"] == 1
    with get_client(sync_client=True) as client:
        recovery = client.read_flow_run(first["recover_flow_run_id"])
    assert recovery.deployment_id == recover_id
    assert recovery.parameters == {"campaign_url": folder, "storage_options": None, "use_deployments": True}

    again = heal(flow_run_id=f"prefect.flow-run.{crashed.id}", max_attempts=1, return_state=True)  # as triggered
    assert again.is_failed() and "crashed after 1 automatic recoveries" in again.message
    with get_client(sync_client=True) as client:
        assert sum(r.deployment_id == recover_id for r in client.read_flow_runs()) == 1  # the 2nd crash: nothing
        deadline = time.monotonic() + 60  # the server stores events a moment after they arrive
        while not (events := client.read_events(
                filter=EventFilter(event=EventNameFilter(name=[BUDGET_SPENT_EVENT])), limit=50).events):
            assert time.monotonic() < deadline, f"no {BUDGET_SPENT_EVENT} event stored within 60 s"
            time.sleep(1)
    assert [e.resource.get("prefect.resource.name") for e in events] == [folder]
    status = campaign_status(Store(folder))
    assert status["heal"]["recoveries"] == 1 and status["heal"]["budget_spent_at"]
    assert status["heal"]["last_crashed_run"] == "nightly-campaign"
