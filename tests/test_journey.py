"""The README's user journey, as a user types it, on the smoke preset against a real local Prefect server:

run -> status -> sql -> view -> audit; a second campaign SIGKILLed between checkpoints -> recover (which marks the
dead run Crashed); deploy (work pools created, the local nightly's schedule registered) -> a process worker ->
a deployment run that completes.

Marked ``slow`` (two smoke campaigns, a recovery, a server and a worker: several minutes on 2 cores). The default
suite covers the same pieces one by one: ``tests/test_campaign_smoke.py`` (run, recover after SIGKILL, the
abandoned run marked Crashed, quiet logs), ``tests/test_commands.py`` (status, exit codes), ``tests/test_sql_view.py``
and ``tests/test_view_browser.py`` (sql, view), ``tests/test_deploy.py`` (deploy, pools, schedule).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_flows_distributed import PREFECT, _free_port, _wait_healthy

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A `prefect server start` on a free port; yields the environment the user's shell would have."""
    port = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"),
           "PREFECT_API_URL": f"http://127.0.0.1:{port}/api", "PREFECT_SERVER_API_HOST": "127.0.0.1",
           "PREFECT_SERVER_API_PORT": str(port), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "1",
           "ROLLSTREAM_HOME": str(ROOT), "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "JAX_PLATFORMS": "cpu"}
    env.pop("ROLLSTREAM_BUCKET", None)
    with open(tmp_path / "server.log", "w") as log:
        proc = subprocess.Popen([PREFECT, "server", "start", "--no-ui"], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_healthy(f"{env['PREFECT_API_URL']}/health", proc)
            yield env
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def _rollstream(env: dict[str, str], *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "pipelines_lib.cli", *args], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_the_readme_journey_on_the_smoke_preset(server: dict[str, str], tmp_path: Path) -> None:
    env, url = server, str(tmp_path / "journey")
    ran = _rollstream(env, "run", url, "--preset", "smoke")
    assert ran.returncode == 0 and "audit OK" in ran.stdout, ran.stdout[-2000:] + ran.stderr[-2000:]
    status = _rollstream(env, "status", url)
    assert status.returncode == 0 and status.stdout.strip().endswith("to do: nothing"), status.stdout
    sql = _rollstream(env, "sql", url, "SELECT version, count(*) AS n FROM trajectories GROUP BY 1 ORDER BY 1",
                      "--json")
    assert sql.returncode == 0 and [r["version"] for r in json.loads(sql.stdout)][0] == 0
    view = _rollstream(env, "view", url)
    assert view.returncode == 0 and view.stdout.strip().endswith("report.html")
    audit = _rollstream(env, "audit", url)
    assert audit.returncode == 0 and "verdict: OK" in audit.stdout

    killed = str(tmp_path / "killed")
    proc = subprocess.Popen([sys.executable, "-m", "pipelines_lib.cli", "run", killed, "--preset", "smoke"], env=env,
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:  # type: ignore[union-attr]
        if "trainer: step 3/4 " in line:
            break
    proc.kill()
    proc.communicate(timeout=120)
    recovered = _rollstream(env, "recover", killed)
    assert recovered.returncode == 0 and "took over killed-campaign" in recovered.stdout, recovered.stdout

    deployed = _rollstream(env, "deploy", "--name", "nightly-local", "--name", "audit")
    assert deployed.returncode == 0, deployed.stderr[-3000:]
    with open(tmp_path / "worker.log", "w") as log:
        worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", "rollstream-cpu", "--type", "process"],
                                  env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            run = subprocess.run([PREFECT, "--no-prompt", "deployment", "run", "rollstream-audit/audit", "--param",
                                  f"campaign_url={url}", "--watch"], env=env, cwd=ROOT, capture_output=True,
                                 text=True, timeout=900)
        finally:
            worker.terminate()
            worker.wait(timeout=60)
    assert run.returncode == 0 and "Completed" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
    schedules = subprocess.run([PREFECT, "deployment", "inspect", "rollstream-campaign/nightly-local"], env=env,
                               cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "0 2 * * *" in schedules.stdout, schedules.stdout
