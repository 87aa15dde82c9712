"""Audit stage: ``audit_campaign`` over the whole folder; the report is kept under ``audit/``.

Each audit is a snapshot of a folder that may still grow, so reports are named by their time
(``audit/<UTC timestamp>.json`` and ``.txt``) instead of being a once-only marker.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from pipelines_lib.audit import audit_campaign
from pipelines_lib.records import AuditRecord
from pipelines_lib.storage.store import Store
from tasks.common import IO_RETRIES, IO_RETRY_DELAYS_S, open_store, retry_transient, stage_key, stage_run


def _audit_and_keep(store: Store) -> dict[str, Any]:
    report = audit_campaign(store, progress=get_run_logger().info)
    kept = AuditRecord(audited_at=report.audited_at, ok=report.ok, warnings=report.warnings,
                       report=report.to_dict())
    json_path, text_path = kept.write(store, report.render_text())
    return {"ok": report.ok, "warnings": report.warnings, "report": json_path, "text": text_path,
            "shards": report.shards, "trajectories": report.trajectories, "groups": report.groups, "violations": sum(report.violation_counts.values()),
            "bad_files": len(report.bad_files), "seconds": report.seconds}


@task(name="audit", retries=IO_RETRIES, retry_delay_seconds=IO_RETRY_DELAYS_S, retry_condition_fn=retry_transient)
def audit(campaign_url: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Audit any campaign folder; needs no ``campaign.json`` (it reports what it finds)."""
    store = open_store(campaign_url, storage_options)
    return stage_run(store, stage_key("audit"), lambda: _audit_and_keep(store))
