"""Self-healing campaigns against a real (ephemeral) Prefect API: the heal flow, run for a crashed campaign run,
starts the recover deployment on the campaign's own folder, once per crash, until the campaign's retry budget is
spent; then it starts nothing, fails loudly, emits an event, ``rollstream status`` says so, and the operator's
notification block is told (the ephemeral server runs Prefect's triggers and actions services)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prefect import get_client
from prefect.blocks.notifications import CustomWebhookNotificationBlock, SlackWebhook
from prefect.blocks.system import Secret
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from prefect.events.schemas.automations import Posture
from prefect.states import Crashed

from flows.artifacts import campaign_slug
from flows.campaign import campaign, expand_campaign_url
from flows.heal import (
    BUDGET_SPENT_EVENT,
    NOTIFY,
    budget_spent_automation,
    heal,
    notification_block,
    register_budget_notification,
)
from pipelines_lib.hints import hint_command
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
    assert recovery.name == f"{Path(folder).name}-recover"  # as the recover flow names itself, not a random name
    assert recovery.parameters == {"campaign_url": folder, "storage_options": None, "use_deployments": True}

    again = heal(flow_run_id=f"prefect.flow-run.{crashed.id}", max_attempts=1, return_state=True)  # as triggered
    assert again.is_failed() and "crashed after 1 automatic recoveries" in again.message
    with get_client(sync_client=True) as client:
        assert sum(r.deployment_id == recover_id for r in client.read_flow_runs()) == 1  # the 2nd crash: nothing
        deadline = time.monotonic() + 60  # the server stores events a moment after they arrive
        while not (events := client.read_events(filter=EventFilter(  # this campaign's: other tests spend budgets too
                event=EventNameFilter(name=[BUDGET_SPENT_EVENT]),
                resource=EventResourceFilter(id=[f"rollstream.campaign.{campaign_slug(folder)}"])), limit=50).events):
            assert time.monotonic() < deadline, f"no {BUDGET_SPENT_EVENT} event stored within 60 s"
            time.sleep(1)
    assert [e.resource.get("prefect.resource.name") for e in events] == [folder]
    status = campaign_status(Store(folder))
    assert status["heal"]["recoveries"] == 1 and status["heal"]["budget_spent_at"]
    assert status["heal"]["last_crashed_run"] == "nightly-campaign"


def test_the_budget_spent_automation_notifies_the_named_block_once_per_spent_budget() -> None:
    block_id = uuid.uuid4()
    automation = budget_spent_automation(block_id)
    trigger = automation.trigger
    assert automation.name == NOTIFY
    assert trigger.expect == {BUDGET_SPENT_EVENT} and trigger.posture == Posture.Reactive and trigger.threshold == 1
    assert trigger.match.get("prefect.resource.id") == ["rollstream.campaign.*"]
    [notify] = automation.actions
    assert notify.type == "send-notification" and notify.block_document_id == block_id
    for key in ("campaign_url", "crashed_flow_run_name", "attempts", "recover_command", "status_command"):
        assert f"event.payload.{key}" in notify.body


def _webhook_block(name: str, url: str) -> uuid.UUID:
    return CustomWebhookNotificationBlock(name=name, url=url, json_data={"subject": "{{subject}}", "body": "{{body}}"}
                                          ).save(name, overwrite=True)


def test_notify_registration_replaces_the_older_one_and_no_block_removes_it(prefect_api: str) -> None:
    first = _webhook_block("ops-first", "http://127.0.0.1:9/first")
    second = _webhook_block("ops-second", "http://127.0.0.1:9/second")
    try:
        assert register_budget_notification("custom-webhook/ops-first").actions[0].block_document_id == first
        assert register_budget_notification("ops-second").actions[0].block_document_id == second  # a bare name too
        with get_client(sync_client=True) as client:
            [stored] = client.read_automations_by_name(NOTIFY)
        assert stored.trigger.expect == {BUDGET_SPENT_EVENT} and stored.actions[0].block_document_id == second
    finally:
        assert register_budget_notification(None) is None
    with get_client(sync_client=True) as client:
        assert client.read_automations_by_name(NOTIFY) == []


def test_an_unknown_or_non_notifying_block_is_refused_naming_it(prefect_api: str) -> None:
    with pytest.raises(ValueError, match="no notification block 'nobody-here' on this Prefect API; create one"):
        notification_block("nobody-here")
    Secret(value="s3cret").save("ops-token", overwrite=True)
    with pytest.raises(ValueError, match=r"block 'ops-token' \(secret/ops-token\) cannot send notifications"):
        register_budget_notification("ops-token")
    webhook = _webhook_block("ops-twin", "http://127.0.0.1:9/twin")
    slack = SlackWebhook(url="https://hooks.slack.com/services/T0/B0/x").save("ops-twin", overwrite=True)
    with pytest.raises(ValueError, match="'ops-twin' is ambiguous: custom-webhook/ops-twin, slack-webhook/ops-twin"):
        notification_block("ops-twin")
    assert (notification_block("custom-webhook/ops-twin"), notification_block("slack-webhook/ops-twin")) == (
        webhook, slack)


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict]]]:
    """A local HTTP endpoint recording the JSON bodies POSTed to it: what a Slack or custom webhook would get."""
    received: list[dict] = []

    class Record(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Record)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    finally:
        server.shutdown()


def test_a_spent_budget_posts_the_campaign_and_the_recover_command_to_the_operators_webhook(
        prefect_api: str, webhook: tuple[str, list[dict]], tmp_path) -> None:
    url, received = webhook
    _webhook_block("ops-pager", url)
    folder = f"{tmp_path}/exp9"
    with get_client(sync_client=True) as client:
        crashed = client.create_flow_run(campaign, name="exp9-campaign", state=Crashed(message="worker gone"),
                                         parameters={"campaign_url": folder})
    register_budget_notification("custom-webhook/ops-pager")
    try:
        state = heal(flow_run_id=str(crashed.id), max_attempts=0, return_state=True)
        assert state.is_failed()
        deadline = time.monotonic() + 60  # event -> triggers service -> actions service -> the block's POST
        while not received:
            assert time.monotonic() < deadline, "no notification POSTed within 60 s of the budget-spent event"
            time.sleep(0.5)
    finally:
        register_budget_notification(None)  # later budgets spent in this session notify nobody
    [posted] = received
    assert posted["subject"] == f"rollstream: {folder} crashed again; automatic recovery stopped"
    assert f"Campaign {folder} crashed (flow run exp9-campaign, {crashed.id}) after 0 automatic" in posted["body"]
    # The commands as every hint prints them: the running rollstream by absolute path, the campaign's options.
    assert posted["body"].endswith(f"What happened: {hint_command(['status', folder])}\n"
                                   f"Once the cause is fixed: {hint_command(['recover', folder])}")
