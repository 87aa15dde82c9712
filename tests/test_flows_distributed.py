"""The distributed topology on one machine: a real ``prefect server``, process work pools and workers, and
the campaign flow starting every stage as a deployment run in its own process, over a GCS emulator; and the
same campaign healing itself after its workers are SIGKILLed mid-train, with nobody typing anything.

Nothing is shared between the stage processes except the campaign folder on the emulator (and Prefect's
API for scheduling): that is the production topology with Kubernetes jobs swapped for local processes.
Everything runs in subprocesses so this test process's own Prefect settings stay untouched.

The emulator is this test's own fake-gcs-server with its request log going to a file: a campaign makes
thousands of requests, and an emulator whose stderr is an undrained pipe stops answering once the pipe
buffer is full.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipelines_lib.hints import storage_option_args
from pipelines_lib.records import heal_attempts, run_records
from pipelines_lib.stages.campaign import campaign_status
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


@dataclass
class Cluster:
    env: dict[str, str]
    logs: Path
    workers: Callable[[], list[subprocess.Popen]]
    """Start one process worker per pool, each in a session of its own."""
    started: list[subprocess.Popen]
    """The workers ``workers`` started last."""


@pytest.fixture
def prefect_cluster(tmp_path, emulator: str) -> Iterator[Cluster]:
    """Server + pools + `rollstream deploy` of infra/prefect.yaml + one process worker per pool; heartbeats every
    30 s (the zombie automation crashes a run silent for 90 s)."""
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    bucket = f"b-{uuid.uuid4().hex[:10]}"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_API_URL": api,
           "PREFECT_SERVER_API_HOST": "127.0.0.1", "PREFECT_SERVER_API_PORT": str(port),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_WORKER_QUERY_SECONDS": "1",
           "PREFECT_WORKER_PREFETCH_SECONDS": "1", "ROLLSTREAM_HOME": str(ROOT), "ROLLSTREAM_BUCKET": bucket,
           "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
           "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: list[subprocess.Popen] = []

    def start(name: str, *args: str) -> subprocess.Popen:
        out = open(logs / f"{name}.log", "a")  # noqa: SIM115 - closed with the process at teardown
        procs.append(subprocess.Popen([PREFECT, *args], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True))
        return procs[-1]

    started: list[subprocess.Popen] = []

    def workers() -> list[subprocess.Popen]:
        started[:] = [start(f"worker-{pool}", "worker", "start", "--pool", pool, "--type", "process")
                      for pool in POOLS]
        return started

    def cli(*args: str) -> None:
        subprocess.run([PREFECT, "--no-prompt", *args], env=env, cwd=ROOT, check=True, capture_output=True,
                       timeout=180)

    try:
        _wait_healthy(f"{api}/health", start("server", "server", "start", "--no-ui"))
        for pool in POOLS:
            cli("work-pool", "create", pool, "--type", "process",
                "--base-job-template", str(ROOT / "infra/process-job-template.json"))
        # `rollstream deploy`: the deployments, the heal trigger and the zombie automation
        subprocess.run([sys.executable, "-m", "pipelines_lib.cli", "deploy"], env=env, cwd=ROOT, check=True,
                       capture_output=True, timeout=600)
        workers()
        import gcsfs

        gcsfs.GCSFileSystem(**gcs_options(emulator)).mkdir(bucket)
        yield Cluster(env=env, logs=logs, workers=workers, started=started)
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
    env, logs = prefect_cluster.env, prefect_cluster.logs
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


def _nested(dotted: dict[str, object]) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for key, value in dotted.items():
        section, name = key.split(".", 1)
        out.setdefault(section, {})[name] = value
    return out


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (a flow run gets a session of its own, so its worker's group misses it)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    out, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        out += children
        frontier = children
    return out


def _wait(what: str, done: Callable[[], bool], timeout_s: float, logs: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(logs.glob("*.log")))
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s\n{tails}")
        time.sleep(5)


@pytest.mark.slow
def test_workers_sigkilled_mid_train_end_in_a_finished_audited_campaign_with_nobody_typing(prefect_cluster,
                                                                                          emulator) -> None:
    env, logs = prefect_cluster.env, prefect_cluster.logs
    url = f"gs://{env['ROLLSTREAM_BUCKET']}/campaigns/healing"
    options = gcs_options(emulator)
    overrides = _nested({**OVERRIDES, "trainer.max_steps": 4, "eval.versions": "ends"})
    params = {"campaign_url": url, "storage_options": options, "preset": "tiny", "workers": 2,
              "overrides": overrides}
    # The nightly as its schedule would start it: a deployment run of the campaign flow (the smoke deployment,
    # whose parameters this run replaces), every stage a deployment run.
    subprocess.run([PREFECT, "--no-prompt", "deployment", "run", "rollstream-campaign/smoke", "--params",
                    json.dumps(params)], env=env, cwd=ROOT, check=True, capture_output=True, timeout=120)
    store = Store(url, storage_options=options)
    _wait("the trainer's first step", lambda: store.exists("train/consumed/00000001.json"), 900, logs)
    # The machine goes: both workers and every flow run they started (campaign, trainer, rollout workers).
    tree = [pid for worker in prefect_cluster.started for pid in (worker.pid, *_descendants(worker.pid))]
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not campaign_status(store)["train_done"]
    prefect_cluster.workers()  # a new machine: the pools have workers again; nobody runs anything by hand
    _wait("the healed campaign's audit", lambda: "audit" not in campaign_status(store)["todo"], 1500, logs)

    status = campaign_status(store)
    assert status["todo"] == [] and status["train_done"] and status["train_steps"] == 4
    [attempt] = heal_attempts(store)
    assert attempt.outcome == "recover" and attempt.crashed_flow_run_name == "healing-campaign"
    audits = [r for r in run_records(store) if r.key == "audit" and r.state == "completed"]
    assert audits and audits[-1].manifest["ok"]
