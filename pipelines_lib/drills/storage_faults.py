"""Storage faults through a real network path: a store workload behind ``FaultProxy`` in front of a GCS-API server.

``run_fault_workload`` drives one ``Store`` (gcsfs → proxy → emulator) through many creates, reads and lists in
a few threads, then a ``ShardWriter`` → ``ShardTailer`` round trip of synthetic groups, and accounts for every
object and group: written, read back, and read back *once*. Faults are absorbed at two layers: gcsfs retries
HTTP 429/5xx and broken connections itself (about 1-2 s of backoff per fault), and requests that stall past
``requests_timeout`` surface as timeouts that ``Store``'s own ``RetryPolicy`` retries (counted in
``store.retries``).

A lost reply to a create (the ``reset`` fault after the server committed the object) makes the retried
create find the object already there: ``Store.create`` raises ``AlreadyExistsError`` for the writer's own
object. The shard writer handles this by comparing bytes; the workload does the same for its plain objects
and counts such cases as ``lost_reply_conflicts`` (see RELIABILITY.md).

``outage_drill`` starts a full outage and checks that an operation fails with a ``StorageError`` naming the
operation and the URL within a bound instead of hanging.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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


def run_fault_drill(emulator_url: str, *, rate: float = 0.05, seed: int = 1, quick: bool = False) -> dict[str, Any]:
    """The whole storage drill against a GCS-API server at ``emulator_url``: workload, then an outage.

    Seed 1 draws every fault kind within the first hundred requests (resets included)."""
    plan = FaultPlan(rate=rate, seed=seed)
    with FaultProxy(emulator_url, plan) as proxy:
        store = proxied_store(proxy.url)
        work = run_fault_workload(store, proxy, n_objects=30 if quick else 120, n_groups=6 if quick else 24)
        outage = outage_drill(proxied_store(proxy.url, retry=RetryPolicy(attempts=4, base_delay_s=0.05,
                                                                             max_delay_s=0.2, deadline_s=6.0)), proxy)
    return {"workload": work, "outage": outage}


__all__ = ["DRILL_RETRY", "OutageResult", "WorkloadResult", "outage_drill", "proxied_store", "run_fault_drill",
           "run_fault_workload"]
