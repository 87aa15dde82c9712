"""``rollstream deploy`` against a real Prefect API: work pools created when missing, the deployment and its
schedule registered by ``prefect deploy``; unset ``{{ $VAR }}`` references refused before anything is created."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from prefect import get_client
from prefect.exceptions import ObjectNotFound

from pipelines_lib import cli

ROOT = Path(__file__).resolve().parents[1]


def test_deploy_refuses_unset_variables_naming_them_and_who_uses_them(monkeypatch, capsys) -> None:
    monkeypatch.delenv("ROLLSTREAM_BUCKET", raising=False)
    monkeypatch.delenv("ROLLSTREAM_HOME", raising=False)
    monkeypatch.chdir(ROOT)
    assert cli.main(["deploy"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("rollstream deploy: unresolved variables, set them first: ROLLSTREAM_BUCKET (used by nightly); "
                   "ROLLSTREAM_HOME (used by nightly-local, pull steps)")
    assert cli.main(["deploy", "--name", "nighty"]) == 2
    assert "no deployment 'nighty'; did you mean 'nightly'?" in capsys.readouterr().err


def test_deploy_creates_the_missing_pool_and_registers_the_local_nightly_with_its_schedule(
        prefect_api: str, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PREFECT_API_URL", prefect_api)  # for the `prefect deploy` child process
    monkeypatch.setenv("ROLLSTREAM_HOME", str(ROOT))
    monkeypatch.delenv("ROLLSTREAM_BUCKET", raising=False)  # the local variant does not need a bucket
    monkeypatch.chdir(ROOT)
    assert cli.main(["deploy", "--name", "nightly-local"]) == 0
    assert "created work pool rollstream-cpu (process" in capsys.readouterr().err
    with get_client(sync_client=True) as client:
        pool = client.read_work_pool("rollstream-cpu")
        deployment = client.read_deployment_by_name("rollstream-campaign/nightly-local")
        schedules = client.read_deployment_schedules(deployment.id)
    assert pool.type == "process"
    assert deployment.parameters["campaign_url"] == f"{ROOT}/runs/nightly-{{date}}"
    assert [s.schedule.cron for s in schedules] == ["0 2 * * *"] and schedules[0].active
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
