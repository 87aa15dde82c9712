"""Whole campaigns through the fault proxy: parts 3 and 4 of the storage drill (``storage_faults`` runs them).

``run_fault_campaign`` runs ``python -m flows.campaign`` unchanged on a fresh bucket through the proxy: gcsfs gets
the proxy as ``endpoint_url``, Orbax's tensorstore and etils clients get it through ``TENSORSTORE_GCS_HTTP_URL`` /
``STORAGE_EMULATOR_HOST`` (``_stage_env``), so the server is reachable only through the proxy; then the folder is
audited straight from the server. ``run_outage_campaign`` runs the stages as library calls in one process with a
short retry budget, opens a full outage once the trainer has logged step 1, requires every failed stage to name op
and URL (a process still running ``hang_after_s`` into the outage is a hang: stacks taken with py-spy, then
killed), and finishes the campaign with ``python -m flows.recover`` through the healthy proxy.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drills.faultproxy import FaultPlan, FaultProxy
from pipelines_lib.hints import storage_option_args
from pipelines_lib.records import ConsumptionLog
from pipelines_lib.storage.errors import StorageError
from pipelines_lib.storage.retry import RetryPolicy
from pipelines_lib.storage.store import Store

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGN_OVERRIDES: dict[str, Any] = {
    "workers": 1, "dataset.n_train": 64, "dataset.n_heldout": 8, "sft.steps": 4, "sft.n_demos": 16,
    "trainer.max_steps": 2, "trainer.publish_every": 1, "trainer.checkpoint_every": 1, "trainer.batch_groups": 2,
    # a 4-step warm start rarely solves a task: zero-advantage groups must still train, or the trainer starves
    "trainer.skip_zero_advantage": False, "trainer.data_timeout_s": 300.0,
    "eval.n_tasks": 4, "eval.samples": 1, "rollout.max_concurrency": 8, "engine.num_slots": 8,
}
"""The smallest campaign that runs every stage: 4 SFT steps, 2 trainer steps (each checkpointed through Orbax and
published), one rollout worker, 4 held-out tasks."""
REQUESTS_TIMEOUT_S = 4.0
"""Per-request timeout given to gcsfs: a stalled request becomes a timeout the store retries. Generous, so that
on a loaded 2-core machine an ordinary request never reaches it (a quarter of it did)."""
OUTAGE_RETRY = RetryPolicy(attempts=4, base_delay_s=0.1, max_delay_s=0.5, deadline_s=8.0)
"""The store's retry budget in the outage drill's stages: an outage longer than this fails the stage."""
OUTAGE_ORBAX_DEADLINE_S = 30.0
"""Orbax's deadline in the outage drill's stages (``ROLLSTREAM_ORBAX_DEADLINE_S``; 600 s by default): a tiny
model's save takes seconds, and a trainer caught in a save by the outage must fail well within ``hang_after_s``."""
_RETRY_LINE = re.compile(r"storage retry (?P<op>\S+) ")


def drill_storage_options(endpoint: str) -> dict[str, Any]:
    """gcsfs options for a GCS-API server at ``endpoint`` (a stalled request times out after REQUESTS_TIMEOUT_S)."""
    return {"endpoint_url": endpoint, "token": "anon", "project": "rollstream-drill",
            "requests_timeout": REQUESTS_TIMEOUT_S}


def _new_campaign_url(emulator_url: str) -> str:
    import gcsfs

    bucket = f"drill-{uuid.uuid4().hex[:10]}"
    gcsfs.GCSFileSystem(**drill_storage_options(emulator_url)).mkdir(bucket)  # straight to the server: no faults
    return f"gs://{bucket}/campaigns/faults"


def _stage_env(proxy_url: str, scratch: Path) -> dict[str, str]:
    """The environment of a stage process: Orbax's two GCS clients pointed at the proxy too, Prefect's own home."""
    return {"JAX_COMPILATION_CACHE_DIR": str(ROOT / "build" / "jax-cache"),  # compiled once across the drill's runs
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.5",
            **os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"), "PYTHONUNBUFFERED": "1",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false", "PREFECT_HOME": str(scratch / "prefect"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1",
            # tensorstore (Orbax's array writes) and etils' gcsfs (Orbax's metadata) ignore gcsfs's options
            "TENSORSTORE_GCS_HTTP_URL": proxy_url, "STORAGE_EMULATOR_HOST": proxy_url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "anon",
            # tensorstore sets no request timeout: without a low-speed watchdog a stalled request waits for TCP
            "TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS": "20", "TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES": "1"}


@dataclass(frozen=True, kw_only=True)
class StageProcess:
    """One stage process the drill started: how it ended and what it printed."""

    argv: tuple[str, ...]
    exit_code: int | None
    """None: still running at the drill's deadline (a hang), then killed."""
    seconds: float
    output: str

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


def _run_process(argv: list[str], *, env: dict[str, str], log_path: Path, timeout_s: float,
                 until: Callable[[subprocess.Popen[bytes]], None] | None = None) -> StageProcess:
    """Run ``argv`` in its own process group (Prefect's API server is a grandchild); kill the group at the deadline.

    ``until`` (optional) is polled every 0.5 s while the process runs; it gets the process and may act on it."""
    start = time.monotonic()
    with open(log_path, "w") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        code: int | None = None
        try:
            while (code := proc.poll()) is None and time.monotonic() - start < timeout_s:
                if until is not None:
                    until(proc)
                time.sleep(0.5)
        finally:
            if code is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    return StageProcess(argv=tuple(argv), exit_code=code, seconds=round(time.monotonic() - start, 1),
                        output=log_path.read_text(errors="replace"))


@dataclass(frozen=True, kw_only=True)
class CampaignResult:
    url: str
    exit_code: int | None
    """``python -m flows.campaign``'s exit code (0: every stage finished and its own audit passed)."""
    audit_ok: bool
    """An audit of the folder straight from the server (not through the proxy) after the run."""
    audit_summary: str
    train_steps: int
    published_versions: list[int]
    evaluated_versions: list[int]
    shards: int
    store_retries: dict[str, int]
    """``Store`` retries by operation, counted from the stages' ``storage retry`` log lines."""
    requests: int
    clients: dict[str, int]
    """Requests by client library (User-Agent): gcsfs (``python``), tensorstore (Orbax's arrays), ..."""
    faults: dict[str, int]
    seconds: float
    output_tail: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.audit_ok and self.train_steps >= 1

    @property
    def fault_rate(self) -> float:
        return sum(self.faults.values()) / max(1, self.requests)


def _audit(emulator_url: str, url: str) -> tuple[bool, str, dict[str, Any]]:
    from pipelines_lib.audit import audit_campaign
    from pipelines_lib.stages.campaign import campaign_status

    store = Store(url, storage_options=drill_storage_options(emulator_url))
    try:
        report = audit_campaign(store)
    except StorageError as e:  # nothing to audit: the run died before writing its campaign
        return False, str(e), campaign_status(store)
    summary = (f"{report.shards} shards, {report.groups} groups, {sum(report.violation_counts.values())} violations, "
               f"{len(report.bad_files)} bad files")
    return report.ok, summary, campaign_status(store)


def _retries(output: str) -> dict[str, int]:
    return dict(Counter(m["op"] for m in _RETRY_LINE.finditer(output)))


def run_fault_campaign(emulator_url: str, scratch: Path, *, plan: FaultPlan | None = None,
                       overrides: dict[str, Any] | None = None, timeout_s: float = 900.0) -> CampaignResult:
    """``python -m flows.campaign`` on a fresh bucket through a ``FaultProxy``, unchanged; then an audit."""
    plan = plan or FaultPlan(rate=0.05, seed=1)
    url = _new_campaign_url(emulator_url)
    sets = [a for k, v in {**CAMPAIGN_OVERRIDES, **(overrides or {})}.items() for a in ("--set", f"{k}={v}")]
    with FaultProxy(emulator_url, plan) as proxy:
        options = drill_storage_options(proxy.url)
        run = _run_process([sys.executable, "-m", "flows.campaign", url, *storage_option_args(options),
                            "--set", "eval.versions=ends", *sets],
                           env=_stage_env(proxy.url, scratch), log_path=scratch / "campaign.log", timeout_s=timeout_s)
        requests, clients, faults = proxy.requests, dict(proxy.clients), dict(proxy.faults)
    audit_ok, summary, status = _audit(emulator_url, url)
    return CampaignResult(
        url=url, exit_code=run.exit_code, audit_ok=audit_ok, audit_summary=summary, train_steps=status["train_steps"],
        published_versions=status["published_versions"], evaluated_versions=status["evaluated_versions"],
        shards=status["shards"], store_retries=_retries(run.output), requests=requests, clients=clients, faults=faults,
        seconds=run.seconds, output_tail=run.tail())


_STAGES_SCRIPT = """
import json, os, sys, threading
from pipelines_lib.stages.campaign import init_campaign
from pipelines_lib.config import CampaignConfig
from pipelines_lib.dataset import prep
from pipelines_lib.stages.collect import collect
from pipelines_lib.settings import Settings
from pipelines_lib.storage.retry import RetryPolicy
from pipelines_lib.storage.store import Store
from pipelines_lib.stages.warm_start import warm_start
from pipelines_lib.stages.train import train

url, options, retry, overrides = sys.argv[1], *map(json.loads, sys.argv[2:5])
settings = Settings.from_env(os.environ)  # a stage process is an entry point: ROLLSTREAM_ORBAX_DEADLINE_S
store = Store(url, storage_options=options, retry=RetryPolicy(**retry), external_deadline_s=settings.orbax_deadline_s)
config = CampaignConfig.tiny().with_overrides(overrides)
failed = []

def stage(name, fn):
    try:
        fn()
        print(f"stage {name} done", flush=True)
    except Exception as e:
        print(f"stage {name} failed: {type(e).__name__}: {e}", flush=True)
        failed.append(name)

stage("prep", lambda: (init_campaign(store, config), prep(store, config.dataset, env=config.env)))
stage("warm_start", lambda: warm_start(store, config, cache=settings.cache, log=print))
worker = threading.Thread(target=stage, args=("collect", lambda: collect(
    store, config, worker="rollout0", worker_index=0, num_workers=1, cache=settings.cache, log=print)), daemon=True)
worker.start()
stage("train", lambda: train(store, config, log=print))
worker.join(float(sys.argv[5]))
print("stage collect still running" if worker.is_alive() else "", flush=True)
sys.stdout.flush()
import os; os._exit(1 if failed or worker.is_alive() else 0)
"""


def _python_stacks(pid: int) -> str:
    """The pipeline frames of each thread of process ``pid`` (py-spy, when installed), innermost first."""
    spy = Path(sys.executable).parent / "py-spy"
    if not spy.exists():
        return "(py-spy not installed: no stacks)"
    try:
        dump = subprocess.run([str(spy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60).stdout
    except subprocess.TimeoutExpired:
        return "(py-spy dump timed out)"
    threads = []
    for block in dump.split("\nThread ")[1:]:
        frames = [f.strip() for f in block.splitlines()[1:]]
        inner = [f for f in frames if "checkpointer" in f][:2]  # Orbax's innermost frames, then ours
        ours = [f for f in frames if "pipelines_lib/" in f][:3]
        if ours or inner:
            threads.append(" <- ".join(inner + ours))
    return "; ".join(threads)


_STAGE_FAILED = re.compile(r"^stage (?P<stage>\w+) failed: (?P<error>.*)$", re.MULTILINE)


@dataclass(frozen=True, kw_only=True)
class CampaignOutageResult:
    url: str
    stage_errors: dict[str, str]
    """Stage -> the error it failed with during the outage."""
    names_op_and_url: bool
    """Every failed stage's error is a ``storage <op> gs://<campaign>/...`` error."""
    hung: bool
    """The stages' process was still running ``hang_after_s`` into the outage (killed)."""
    hung_in: str
    """Where a hung process's threads were (py-spy's dump, innermost pipeline frames), empty if it did not hang."""
    outage_s: float
    """From opening the outage to the stages' process ending (the outage closed then)."""
    recover_exit_code: int | None
    recover_plan: str
    recovered: bool
    """``flows.recover`` finished the campaign once storage was back: exit 0, trainer done, audit clean."""
    audit_summary: str
    requests: int
    faults: dict[str, int]
    seconds: float
    output_tail: str

    @property
    def ok(self) -> bool:
        return bool(self.stage_errors) and self.names_op_and_url and not self.hung and self.recovered


def run_outage_campaign(emulator_url: str, scratch: Path, *, retry: RetryPolicy = OUTAGE_RETRY,
                        orbax_deadline_s: float = OUTAGE_ORBAX_DEADLINE_S, overrides: dict[str, Any] | None = None,
                        hang_after_s: float = 180.0, timeout_s: float = 900.0) -> CampaignOutageResult:
    """Prep, warm start, then a rollout worker and the trainer through a ``FaultProxy``; a full outage (stalled
    requests) opens once the trainer has logged step 1 and stays open until the stages' process ends. Then
    ``python -m flows.recover`` finishes the campaign through the healthy proxy, and the folder is audited.

    The stages run as library calls in one process, with ``retry`` as the store's budget and ``orbax_deadline_s``
    as Orbax's, because the flows' stage tasks add minutes of task-level retries (``tasks.common.IO_RETRY_DELAYS_S``)
    on top."""
    start = time.monotonic()
    config = {**CAMPAIGN_OVERRIDES, "trainer.max_steps": 3, **(overrides or {})}
    url = _new_campaign_url(emulator_url)
    direct = Store(url, storage_options=drill_storage_options(emulator_url))
    opened: list[float] = []
    waiting: list[str] = []

    with FaultProxy(emulator_url, FaultPlan(rate=0.0, outage_kind="stall", stall_s=30.0)) as proxy:
        env = _stage_env(proxy.url, scratch)

        def outage_after_step_1(proc: subprocess.Popen[bytes]) -> None:
            if not opened and ConsumptionLog.exists(direct, 1):
                proxy.outage(True)
                opened.append(time.monotonic())
            elif opened and time.monotonic() - opened[0] > hang_after_s:
                waiting.append(_python_stacks(proc.pid))  # what the hung stages were waiting for
                os.killpg(proc.pid, signal.SIGKILL)

        retry_json = json.dumps({k: getattr(retry, k) for k in ("attempts", "base_delay_s", "max_delay_s",
                                                                 "deadline_s")})
        stages = _run_process([sys.executable, "-c", _STAGES_SCRIPT, url, json.dumps(drill_storage_options(proxy.url)),
                               retry_json, json.dumps(config), "60"],
                              env={**env, "ROLLSTREAM_ORBAX_DEADLINE_S": str(orbax_deadline_s)},
                              log_path=scratch / "outage.log",
                              timeout_s=timeout_s, until=outage_after_step_1)
        outage_s = round(time.monotonic() - opened[0], 1) if opened else 0.0
        proxy.outage(False)
        hung = stages.exit_code in (None, -signal.SIGKILL)
        errors = {m["stage"]: m["error"] for m in _STAGE_FAILED.finditer(stages.output)}
        prefix = re.compile(rf"^StorageError: storage \w+(?: \w+)? {re.escape(url)}/\S*: ")  # op: "save checkpoint"
        recover = _run_process([sys.executable, "-m", "flows.recover", url,
                                *storage_option_args(drill_storage_options(proxy.url))],
                               env=env, log_path=scratch / "recover.log", timeout_s=timeout_s)
        requests, faults = proxy.requests, dict(proxy.faults)
    audit_ok, summary, status = _audit(emulator_url, url)
    plan = re.search(r"recovered \S+: ran (\[.*?\])", recover.output)
    return CampaignOutageResult(
        url=url, stage_errors=errors, names_op_and_url=bool(errors) and all(prefix.match(e) for e in errors.values()),
        hung=hung, hung_in=waiting[0] if waiting else "", outage_s=outage_s, recover_exit_code=recover.exit_code, recover_plan=plan[1] if plan else "",
        recovered=recover.exit_code == 0 and audit_ok and status["train_done"]
        and status["train_steps"] == config["trainer.max_steps"],
        audit_summary=summary, requests=requests, faults=faults, seconds=round(time.monotonic() - start, 1),
        output_tail=stages.tail() + "\n--- recover ---\n" + recover.tail())


__all__ = ["CAMPAIGN_OVERRIDES", "OUTAGE_ORBAX_DEADLINE_S", "OUTAGE_RETRY", "REQUESTS_TIMEOUT_S", "CampaignOutageResult",
           "CampaignResult", "StageProcess", "drill_storage_options", "run_fault_campaign", "run_outage_campaign"]
