"""``rollstream demo``: a synthetic campaign written, tailed and audited in a few seconds (no model, no Prefect).

It exercises the real storage path and records end to end, in seconds:

1. ``campaign.json``, then for each policy version ``v``: ``WORKERS`` rollout workers commit synthetic groups
   through the campaign folder's channel (``folder.FolderChannel``);
2. a simulated trainer (no model: it only moves data) tails the shards through the same channel inside the window
   ``[v - ETA, v]``, consumes ``STEPS_PER_VERSION`` batches, writes a consumption log per step and publishes
   ``v + 1`` through the ``weights/LATEST`` pointer. It consumes fewer groups than the workers make, so a
   backlog builds up and the oldest groups fall out of the window: the audit shows them as dropped stale;
3. ``audit_campaign`` reads the folder back with no other state and prints the report.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipelines_lib.audit import AuditReport, audit_campaign
from pipelines_lib.records import CampaignManifest, ConsumptionLog, Publication
from pipelines_lib.stages.campaign import code_version
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.channel import WriterConfig
from pipelines_lib.trajectory.folder import FolderChannel
from pipelines_lib.trajectory.schema import SCHEMA_VERSION
from pipelines_lib.trajectory.synthetic import synthetic_group
from pipelines_lib.trajectory.window import Window
from pipelines_lib.utc import utc_now_iso

VERSIONS = 5
WORKERS = 3
GROUPS_PER_WORKER = 4
GROUP_SIZE = 4
BATCH_GROUPS = 4
STEPS_PER_VERSION = 2
ETA = 1


@dataclass(frozen=True, kw_only=True)
class DemoResult:
    url: str
    report: AuditReport


def default_demo_url(now: dt.datetime | None = None) -> str:
    now = now or dt.datetime.now(dt.UTC)
    return str(Path("runs") / f"demo-{now:%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:4]}")


def _publish(store: Store, version: int, step: int) -> None:
    # No weights: the demo moves the pointer over an empty version folder, so only the lineage is real.
    Publication(version=version, path=layout.weights_dir(version), step=step, published_at=utc_now_iso()).advance(store)


def run_demo(out_url: str | None = None, *, echo: Callable[[str], None] = print) -> DemoResult:
    """Write, tail and audit a synthetic campaign at ``out_url`` (default ``runs/demo-<timestamp>``)."""
    store = Store(out_url or default_demo_url())
    echo(f"demo campaign: {store.url}")
    CampaignManifest(kind="demo", schema_version=SCHEMA_VERSION, code_version=code_version(), created_at=utc_now_iso(),
                     config={"versions": VERSIONS, "workers": WORKERS, "groups_per_worker": GROUPS_PER_WORKER,
                             "group_size": GROUP_SIZE, "batch_groups": BATCH_GROUPS, "eta": ETA}).write(store)
    _publish(store, 0, 0)
    channel = FolderChannel(store)
    writers = [channel.writer(f"w{i}", WriterConfig(max_groups=2)) for i in range(WORKERS)]
    tailer = channel.reader()
    step = 0
    for version in range(VERSIONS):
        for w in writers:
            for g in range(GROUPS_PER_WORKER):
                w.add_group(synthetic_group(prompt_id=f"v{version}-{w.worker_id}-p{g}", group_size=GROUP_SIZE,
                                            worker_id=w.worker_id, policy_version=version, seed=g))
            w.flush()
        for k in range(STEPS_PER_VERSION):
            groups = tailer.next_groups(BATCH_GROUPS, Window(version=version, eta=ETA))
            if not groups:
                break
            step += 1
            publish = version + 1 if k == STEPS_PER_VERSION - 1 else None
            ConsumptionLog.of_step(step=step, trainer_version=version, groups=groups, events=tailer.drain_events(),
                                   published_version=publish).write(store)
            if publish is not None:
                _publish(store, publish, step)
        c = tailer.cursor
        echo(f"version {version}: {sum(len(w.committed) for w in writers)} shards committed; trainer at step {step}, "
             f"{c.groups_consumed} groups consumed, {c.groups_dropped_stale} dropped stale")
    report = audit_campaign(store, progress=echo, progress_every=10)
    echo(report.render_text())
    echo(f"campaign folder: {store.url}")
    return DemoResult(url=store.url, report=report)
