"""Audit stage: ``audit_campaign`` over the whole folder; the report is kept under ``audit/``.

Each audit is a snapshot of a folder that may still grow, so reports are named by their time
(``audit/<UTC timestamp>.json`` and ``.txt``) instead of being a once-only marker.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from prefect import get_run_logger, task

from pipelines_lib.audit import audit_campaign
from pipelines_lib.settings import DEFAULTS, Settings
from pipelines_lib.storage.store import Store
from tasks.common import IO_RETRIES, IO_RETRY_DELAYS_S, open_store, retry_transient, stage_key, stage_run


def _audit_and_keep(store: Store) -> dict[str, Any]:
    report = audit_campaign(store, progress=get_run_logger().info)
    stamp = dt.datetime.fromisoformat(report.audited_at).strftime("%Y%m%dT%H%M%S.%fZ")
    store.create(f"audit/{stamp}.json", report.to_json().encode())
    store.create(f"audit/{stamp}.txt", report.render_text().encode())
    return {"ok": report.ok, "warnings": report.warnings, "report": f"audit/{stamp}.json",
            "text": f"audit/{stamp}.txt", "shards": report.shards, "trajectories": report.trajectories,
            "groups": report.groups, "violations": sum(report.violation_counts.values()),
            "bad_files": len(report.bad_files), "seconds": report.seconds}


@task(name="audit", retries=IO_RETRIES, retry_delay_seconds=IO_RETRY_DELAYS_S, retry_condition_fn=retry_transient)
def audit(campaign_url: str, storage_options: dict[str, Any] | None = None,
          settings: Settings = DEFAULTS) -> dict[str, Any]:
    """Audit any campaign folder; needs no ``campaign.json`` (it reports what it finds)."""
    store = open_store(campaign_url, storage_options, settings)
    return stage_run(store, stage_key("audit"), lambda: _audit_and_keep(store))
