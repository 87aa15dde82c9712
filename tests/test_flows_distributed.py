"""The distributed topology on one machine: a real ``prefect server``, process work pools and workers, and
the campaign flow starting every stage as a deployment run in its own process, over a GCS emulator.

Nothing is shared between the stage processes except the campaign folder on the emulator (and Prefect's
API for scheduling): that is the production topology with Kubernetes jobs swapped for local processes.
Everything runs in subprocesses so this test process's own Prefect settings stay untouched.

The emulator is this test's own fake-gcs-server with its request log going to a file: a campaign makes
thousands of requests, and an emulator whose stderr is an undrained pipe stops answering once the pipe
buffer is full.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines_lib.hints import storage_option_args
from pipelines_lib.records import run_records
from pipelines_lib.storage.emulator import gcs_server
from pipelines_lib.storage.store import Store
from tests.conftest import gcs_options

ROOT = Path(__file__).resolve().parents[1]
PREFECT = str(Path(sys.executable).with_name("prefect"))
POOLS = ("rollstream-cpu", "rollstream-accel")
OVERRIDES = {
    "dataset.n_train": 256, "dataset.n_heldout": 8, "sft.steps": 10, "sft.n_demos": 64,
    "trainer.max_steps": 2, "trainer.publish_every": 2, "trainer.checkpoint_every": 2, "trainer.batch_groups": 2,
    "trainer.skip_zero_advantage": False, "eval.n_tasks": 2, "eval.samples": 1,
    "rollout.max_concurrency": 8, "engine.num_slots": 8,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, server: subprocess.Popen, timeout_s: float = 180, what: str = "prefect server") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"{what} exited with {server.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"{what} at {url} not healthy after {timeout_s}s")


@pytest.fixture
def emulator(tmp_path) -> Iterator[str]:
    with gcs_server(tmp_path / "gcs", start_timeout_s=30) as url:
        yield url


@pytest.fixture
def prefect_cluster(tmp_path, emulator: str) -> Iterator[tuple[dict[str, str], Path]]:
    """Server + pools + deployments (from infra/prefect.yaml) + one process worker per pool."""
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    bucket = f"b-{uuid.uuid4().hex[:10]}"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_API_URL": api,
           "PREFECT_SERVER_API_HOST": "127.0.0.1", "PREFECT_SERVER_API_PORT": str(port),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_WORKER_QUERY_SECONDS": "1",
           "PREFECT_WORKER_PREFETCH_SECONDS": "1", "ROLLSTREAM_HOME": str(ROOT), "ROLLSTREAM_BUCKET": bucket,
           "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: list[subprocess.Popen] = []

    def start(name: str, *args: str) -> subprocess.Popen:
        out = open(logs / f"{name}.log", "w")  # noqa: SIM115 - closed with the process at teardown
        procs.append(subprocess.Popen([PREFECT, *args], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT))
        return procs[-1]

    def cli(*args: str) -> None:
        subprocess.run([PREFECT, "--no-prompt", *args], env=env, cwd=ROOT, check=True, capture_output=True,
                       timeout=180)

    try:
        _wait_healthy(f"{api}/health", start("server", "server", "start", "--no-ui"))
        for pool in POOLS:
            cli("work-pool", "create", pool, "--type", "process",
                "--base-job-template", str(ROOT / "infra/process-job-template.json"))
        cli("deploy", "--all", "--prefect-file", "infra/prefect.yaml")
        for pool in POOLS:
            start(f"worker-{pool}", "worker", "start", "--pool", pool, "--type", "process")
        import gcsfs

        gcsfs.GCSFileSystem(**gcs_options(emulator)).mkdir(bucket)
        yield env, logs
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.mark.slow
def test_campaign_starts_every_stage_as_a_deployment_run_in_its_own_process(prefect_cluster, emulator) -> None:
    env, logs = prefect_cluster
    url = f"gs://{env['ROLLSTREAM_BUCKET']}/campaigns/distributed"
    options = gcs_options(emulator)
    args = [sys.executable, "-m", "flows.campaign", url, "--use-deployments", "--workers", "2",
            "--set", "eval.versions=ends", *storage_option_args(options)]
    for key, value in OVERRIDES.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    with open(logs / "campaign.log", "w") as out:  # a file, not a pipe: grandchildren may keep a pipe open
        returncode = subprocess.run(args, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                    timeout=1500).returncode
    tails = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(logs.glob("*.log")))
    assert returncode == 0, tails

    store = Store(url, storage_options=options)
    by_key = {r.key: r for r in run_records(store) if r.state == "completed"}
    stages = ("prep", "warm_start", "collect-w0", "collect-w1", "train", "evaluate-v00000000",
              "evaluate-v00000001", "audit")
    assert set(stages) <= set(by_key)
    # every stage was its own deployment flow run, in its own process; init ran in the campaign flow itself
    assert all(by_key[k].deployment_id for k in stages) and by_key["init"].deployment_id is None
    assert len({by_key[k].flow_run_id for k in stages}) == len(stages)
    assert len({by_key[k].pid for k in (*stages, "init")}) == len(stages) + 1
    # rollout workers and trainer overlapped in time
    spans = {k: (by_key[k].started_at, by_key[k].finished_at) for k in ("collect-w0", "collect-w1", "train")}
    assert max(s for s, _ in spans.values()) < min(f for _, f in spans.values())
    assert by_key["audit"].manifest["ok"] and store.exists("train/DONE.json")
