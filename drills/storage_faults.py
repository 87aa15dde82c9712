"""Storage faults through a real network path: ``FaultProxy`` in front of a GCS-API server, four parts.

``run_fault_drill`` runs them in order; ``fault_figures`` turns the results into ``reliability.*`` figures and
``render_fault_section`` into RELIABILITY.md's section (``drills/runner.py`` and ``drills/report.py`` call them).

1. ``workload``: ``run_fault_workload`` drives one ``Store`` (gcsfs → proxy → emulator) through many creates, reads
   and lists in a few threads, then a ``ShardWriter`` → ``ShardTailer`` round trip of synthetic groups, and
   accounts for every object and group: written, read back, and read back *once*. Faults are absorbed at two
   layers: gcsfs retries HTTP 429/5xx and broken connections itself (seconds of backoff per fault), and
   requests that stall past ``requests_timeout`` surface as timeouts that ``Store``'s own ``RetryPolicy`` retries
   (counted in ``store.retries``). A lost reply to a create (the ``reset`` fault after the server committed the
   object) makes the retried create find our own bytes there, which ``Store.create`` treats as success.
2. ``outage``: ``outage_drill`` stalls every request (held longer than any timeout: a black hole) and checks that
   one operation of a store opened with the settings every user gets (``Settings()``) fails with a
   ``StorageError`` naming the operation and the URL, and how long that takes.
3. ``campaign`` and 4. ``campaign_outage``: a whole campaign through the proxy at 5 % faults, and stages failing
   in an outage then ``flows.recover`` finishing the campaign (``drills/fault_campaign.py``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drills.fault_campaign import (
    drill_storage_options,
    run_fault_campaign,
    run_outage_campaign,
)
from drills.faultproxy import FaultPlan, FaultProxy
from pipelines_lib.settings import DEFAULTS
from pipelines_lib.storage.errors import AlreadyExistsError, StorageError
from pipelines_lib.storage.retry import RetryPolicy
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.channel import WriterConfig
from pipelines_lib.trajectory.folder import FolderChannel
from pipelines_lib.trajectory.synthetic import synthetic_group
from pipelines_lib.trajectory.window import Window

DRILL_RETRY = RetryPolicy(attempts=8, base_delay_s=0.05, max_delay_s=0.5, deadline_s=60.0)
OUTAGE_STALL_S = 300.0
"""How long the outage holds a request: past every default timeout, so what ends the wait is the client's own."""


def proxied_store(proxy_url: str, *, retry: RetryPolicy = DRILL_RETRY, user_defaults: bool = False) -> Store:
    """A fresh bucket on the emulator behind the proxy, and a campaign ``Store`` in it: with the drill's short
    request timeout and ``retry``, or (``user_defaults``) exactly as ``Settings()`` opens it for every user."""
    import gcsfs

    options = drill_storage_options(proxy_url)
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
    url = f"gs://{bucket}/campaigns/drill"
    if user_defaults:
        return DEFAULTS.store(url, {k: v for k, v in options.items() if k != "requests_timeout"})
    return Store(url, storage_options=options, retry=retry)


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

    writer = FolderChannel(store).writer("fault.0", WriterConfig(max_groups=3))
    for i in range(n_groups):
        writer.add_group(synthetic_group(prompt_id=f"p{i:03d}", group_size=2, worker_id="fault.0", policy_version=0,
                                         seed=i, max_len=24))
    writer.flush()
    committed = [g for info in writer.committed for g in info.group_ids]
    tailer = FolderChannel(store).reader()
    got = [g.group_id for g in tailer.next_groups(10 * n_groups + 1, Window(version=0, eta=0))]
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
    if "workload" in parts:
        with FaultProxy(emulator_url, plan) as proxy:
            out["workload"] = run_fault_workload(proxied_store(proxy.url), proxy, n_objects=30 if quick else 120,
                                                 n_groups=6 if quick else 24)
            progress(f"faults: workload ok={out['workload'].ok} in {out['workload'].seconds} s")
    if "outage" in parts:
        with FaultProxy(emulator_url, FaultPlan(rate=0.0, stall_s=OUTAGE_STALL_S)) as proxy:
            out["outage"] = outage_drill(proxied_store(proxy.url, user_defaults=True), proxy)
            progress(f"faults: outage failed after {out['outage'].seconds} s")
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
    "reliability.outage_fail_s": "Seconds from the start of a full outage (requests held unanswered) to one read's "
                                 "StorageError, with the settings every user gets (`Settings()`: 30 s per request, "
                                 "no retry after 60 s).",
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


__all__ = ["DRILL_RETRY", "FAULT_FAILURES", "FAULT_MEASURED", "FAULT_PARTS", "OutageResult", "WorkloadResult",
           "fault_figures", "outage_drill", "proxied_store", "render_fault_section", "run_fault_drill",
           "run_fault_workload"]
