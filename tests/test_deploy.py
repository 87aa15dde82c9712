"""``rollstream deploy`` against a real Prefect API: work pools created when missing, the deployment and its
schedule registered by ``prefect deploy`` (paused unless ``--arm``ed, and said so), the zombie and heal automations
and the notification of a spent heal budget (or the line saying nobody is notified);
unset ``{{ $VAR }}`` references refused before anything is created, and ``infra/prefect.yaml`` deployed by plain
``prefect deploy`` without its variables arms nothing and runs nothing."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

from prefect import get_client
from prefect.blocks.notifications import CustomWebhookNotificationBlock
from prefect.client.schemas.objects import StateType
from prefect.events.schemas.automations import Posture
from prefect.exceptions import ObjectNotFound
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

from flows.campaign import campaign
from flows.heal import BUDGET_SPENT_EVENT, NOTIFY, ZOMBIES
from flows.runs import WATCH_TAG
from pipelines_lib import cli

ROOT = Path(__file__).resolve().parents[1]


def test_deploy_refuses_unset_variables_naming_them_and_who_uses_them(monkeypatch, capsys) -> None:
    monkeypatch.delenv("ROLLSTREAM_BUCKET", raising=False)
    monkeypatch.delenv("ROLLSTREAM_HOME", raising=False)
    monkeypatch.chdir(ROOT)
    assert cli.main(["deploy"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("rollstream deploy: unresolved variables, set them first: ROLLSTREAM_BUCKET (used by nightly); "
                   "ROLLSTREAM_HOME (used by nightly-local, pull steps, smoke)")
    assert cli.main(["deploy", "--name", "nighty"]) == 2
    assert "no deployment 'nighty'; did you mean 'nightly'?" in capsys.readouterr().err


def test_deploy_creates_the_missing_pool_and_registers_the_local_nightly_with_its_schedule(
        prefect_api: str, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PREFECT_API_URL", prefect_api)  # for the `prefect deploy` child process
    monkeypatch.setenv("ROLLSTREAM_HOME", str(ROOT))
    monkeypatch.delenv("ROLLSTREAM_BUCKET", raising=False)  # the local variant does not need a bucket
    monkeypatch.delenv("ROLLSTREAM_NOTIFY_BLOCK", raising=False)
    monkeypatch.chdir(ROOT)
    assert cli.main(["deploy", "--name", "nightly-local"]) == 0
    out = capsys.readouterr()
    assert "created work pool rollstream-cpu (process" in out.err
    # No block named: the deploy succeeds and says who is told of a spent heal budget (nobody), and how to change it.
    assert ("no notification block: a campaign whose automatic recoveries are spent notifies nobody (only "
            "`rollstream status` shows it); name one with --notify BLOCK or $ROLLSTREAM_NOTIFY_BLOCK") in out.out
    with get_client(sync_client=True) as client:
        pool = client.read_work_pool("rollstream-cpu")
        deployment = client.read_deployment_by_name("rollstream-campaign/nightly-local")
        schedules = client.read_deployment_schedules(deployment.id)
    assert pool.type == "process"
    assert deployment.parameters["campaign_url"] == f"{ROOT}/runs/nightly-{{date}}"
    # Deployed paused, and the deploy says so with the way to arm it.
    assert [s.schedule.cron for s in schedules] == ["0 2 * * *"] and not schedules[0].active
    assert (f"paused rollstream-campaign/nightly-local: 0 2 * * * UTC -> {ROOT}/runs/nightly-{{date}}  "
            "(arm: rollstream deploy --arm nightly-local)") in out.out.splitlines()
    # The run form of the deployment is the typed overrides (flows.params), which the server enforces.
    assert deployment.enforce_parameter_schema
    assert "CampaignConfigOverrides" in deployment.parameter_openapi_schema["definitions"]
    # A second deploy finds the pool and leaves it be.
    assert cli.main(["deploy", "--name", "nightly-local"]) == 0
    assert "created work pool" not in capsys.readouterr().err


def test_deploy_creates_kubernetes_pools_with_the_cluster_job_templates(prefect_api: str, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PREFECT_API_URL", prefect_api)
    monkeypatch.setenv("ROLLSTREAM_HOME", str(ROOT))
    monkeypatch.chdir(ROOT)
    # this session's other deploy tests made it a process pool
    with get_client(sync_client=True) as client, contextlib.suppress(ObjectNotFound):
        client.delete_work_pool("rollstream-cpu")
    try:
        assert cli.main(["deploy", "--name", "audit", "--pool-type", "kubernetes"]) == 0
        assert "created work pool rollstream-cpu (kubernetes" in capsys.readouterr().err
        with get_client(sync_client=True) as client:
            pool = client.read_work_pool("rollstream-cpu")
        template = json.loads((ROOT / "infra" / "kubernetes-cpu-job-template.json").read_text())
        assert pool.type == "kubernetes" and pool.base_job_template == template
    finally:
        with get_client(sync_client=True) as client:
            client.delete_work_pool("rollstream-cpu")  # the process pool is what the other deploy tests expect


def test_deploy_arms_only_the_schedules_it_is_asked_to_and_prints_them_armed(prefect_api: str, monkeypatch,
                                                                              capsys) -> None:
    monkeypatch.setenv("PREFECT_API_URL", prefect_api)
    monkeypatch.setenv("ROLLSTREAM_HOME", str(ROOT))
    monkeypatch.chdir(ROOT)
    assert cli.main(["deploy", "--name", "nightly-local", "--arm", "nightly-local"]) == 0
    assert (f"ARMED  rollstream-campaign/nightly-local: 0 2 * * * UTC -> {ROOT}/runs/nightly-{{date}}"
            in capsys.readouterr().out.splitlines())
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("rollstream-campaign/nightly-local")
        assert [s.active for s in client.read_deployment_schedules(deployment.id)] == [True]
    # Deploying again without --arm pauses it again: the file is what a deploy arms.
    assert cli.main(["deploy", "--name", "nightly-local"]) == 0
    assert "paused rollstream-campaign/nightly-local" in capsys.readouterr().out
    with get_client(sync_client=True) as client:
        assert [s.active for s in client.read_deployment_schedules(deployment.id)] == [False]
    # --arm names a deployed deployment with a schedule, or nothing is deployed.
    assert cli.main(["deploy", "--name", "nightly-local", "--arm", "smoke"]) == 2
    assert "--arm smoke: not a deployment with schedules among those deployed (nightly-local)" in (
        capsys.readouterr().err)


def test_plain_prefect_deploy_without_the_bucket_arms_nothing_and_its_runs_refuse_the_bucketless_url(
        prefect_api: str, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PREFECT_API_URL", prefect_api)
    monkeypatch.setenv("ROLLSTREAM_HOME", str(ROOT))
    monkeypatch.delenv("ROLLSTREAM_BUCKET", raising=False)
    monkeypatch.chdir(ROOT)
    assert cli.main(["deploy", "--name", "audit"]) == 0  # the pools, as `rollstream deploy` makes them
    # The documented equivalent by hand, with the bucket variable unset.
    prefect = Path(sys.executable).with_name("prefect")
    done = subprocess.run([str(prefect), "--no-prompt", "deploy", "--prefect-file", "infra/prefect.yaml",
                           "--name", "nightly"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("rollstream-campaign/nightly")
        schedules = client.read_deployment_schedules(deployment.id)
    url = deployment.parameters["campaign_url"]
    assert url == "gs:///campaigns/nightly-{date}"  # what Prefect makes of the unset variable
    assert [s.active for s in schedules] == [False]  # but nothing runs it by itself
    # And a run of it refuses the URL before it creates or labels anything.
    state = campaign(campaign_url=url, return_state=True)
    assert state.is_failed()
    assert "gs:///campaigns/nightly-" in str(state.message) and "no bucket" in str(state.message)


def test_deploy_refuses_an_unknown_notification_block_before_deploying_anything(prefect_api: str, monkeypatch,
                                                                                  capsys) -> None:
    monkeypatch.setenv("PREFECT_API_URL", prefect_api)
    monkeypatch.setenv("ROLLSTREAM_HOME", str(ROOT))
    monkeypatch.chdir(ROOT)
    assert cli.main(["deploy", "--name", "smoke", "--notify", "slack-webhook/nobody"]) == 2
    err = capsys.readouterr().err
    assert "rollstream deploy: --notify slack-webhook/nobody: no notification block 'slack-webhook/nobody'" in err
    monkeypatch.setenv("ROLLSTREAM_NOTIFY_BLOCK", "pager")  # the variable is the option's default
    assert cli.main(["deploy", "--name", "smoke"]) == 2
    assert "--notify pager: no notification block 'pager'" in capsys.readouterr().err
    with get_client(sync_client=True) as client:
        assert not [d for d in client.read_deployments() if d.name == "smoke"]


def test_deploy_registers_prefects_zombie_detection_the_heal_trigger_and_the_budget_notification(
        prefect_api: str, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PREFECT_API_URL", prefect_api)
    monkeypatch.setenv("ROLLSTREAM_HOME", str(ROOT))
    monkeypatch.chdir(ROOT)
    pager = CustomWebhookNotificationBlock(name="pager", url="http://127.0.0.1:9/pager").save("deploy-pager",
                                                                                              overwrite=True)
    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 30}):  # the deploying process's heartbeat
        assert cli.main(["deploy", "--name", "recover", "--name", "heal", "--notify", "deploy-pager"]) == 0
        out = capsys.readouterr().out
        assert "automation 'rollstream: crash zombie runs'" in out
        assert f"automation {NOTIFY!r}: " in out and "(notification block deploy-pager)" in out
        monkeypatch.setenv("ROLLSTREAM_NOTIFY_BLOCK", "custom-webhook/deploy-pager")
        assert cli.main(["deploy", "--name", "recover", "--name", "heal"]) == 0  # a redeploy replaces, never adds
    with get_client(sync_client=True) as client:
        heal = client.read_deployment_by_name("rollstream-heal/heal")
        zombies = client.read_automations_by_name(ZOMBIES)
        healing = client.read_automations_by_name("rollstream: heal crashed campaigns")
        notifying = client.read_automations_by_name(NOTIFY)
        for automation in notifying:  # the other tests of this session spend budgets without a webhook listening
            client.delete_automation(automation.id)
    assert len(zombies) == 1 and len(healing) == 1 and len(notifying) == 1
    # A spent heal budget (the heal flow's event) sends the named block a notification.
    assert notifying[0].trigger.expect == {BUDGET_SPENT_EVENT}
    [notify] = notifying[0].actions
    assert notify.type == "send-notification" and notify.block_document_id == pager
    zombie, healer = zombies[0].trigger, healing[0].trigger
    # Prefect's heartbeat mechanism, on rollstream's deployment runs only: silent for 3 beats -> Crashed.
    assert zombie.posture == Posture.Proactive and zombie.after == {"prefect.flow-run.heartbeat"}
    assert "prefect.flow-run.heartbeat" in zombie.expect and zombie.within == dt.timedelta(seconds=90)
    assert zombie.match_related.get("prefect.resource.id") == [f"prefect.tag.{WATCH_TAG}"]
    assert zombie.for_each == {"prefect.resource.id"}
    [crash] = zombies[0].actions
    assert crash.type == "change-flow-run-state" and crash.state == StateType.CRASHED
    # A Crashed campaign or recover run starts the heal deployment with the crashed run's id.
    assert healer.posture == Posture.Reactive and healer.expect == {"prefect.flow-run.Crashed"}
    assert healer.match_related.get("prefect.resource.name") == ["rollstream-campaign", "rollstream-recover"]
    [run] = healing[0].actions
    assert run.type == "run-deployment" and run.deployment_id == heal.id
    assert run.parameters == {"flow_run_id": "{{ event.resource.id }}"}
