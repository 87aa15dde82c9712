"""The audit stage: ``audit_campaign`` over the whole folder, kept as an ``AuditRecord`` under ``audit/``.

Each audit is a snapshot of a folder that may still grow, so reports are named by their time
(``audit/<UTC timestamp>.json`` and ``.txt``) instead of being a once-only marker. It needs no
``campaign.json``: it reports what it finds. ``recovery_refusal`` (over ``damaged_records``) is what every recover
command checks first, the Prefect one and the built-in one alike, and ``audit_report`` what it answers on a finished
campaign, without keeping anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipelines_lib import telemetry
from pipelines_lib.audit import AuditReport, audit_campaign
from pipelines_lib.audit.report import Finding
from pipelines_lib.audit.state import state_findings
from pipelines_lib.records import AuditRecord, with_parents
from pipelines_lib.stages.campaign import config_problem
from pipelines_lib.storage.store import Store


def audit(store: Store, *, progress: Callable[[str], None] | None = None, since: int | None = None) -> dict[str, Any]:
    """Audit and keep the report (and each version folder's result, for a later incremental audit from ``since``);
    returns the verdict, where the report is and its headline counts."""
    with telemetry.recording(store, "audit", sample_every_s=None), telemetry.span("stage.audit", track="stage"):
        report = audit_campaign(store, progress=progress, since=since, keep=True, config_check=config_problem)
    kept = AuditRecord(audited_at=report.audited_at, ok=report.ok, warnings=report.warnings,
                       report=report.to_dict())
    json_path, text_path = kept.write(store, report.render_text())
    return {"ok": report.ok, "warnings": report.warnings, "report": json_path, "text": text_path,
            "shards": report.shards, "trajectories": report.trajectories, "groups": report.groups,
            "violations": sum(report.violation_counts.values()), "bad_files": len(report.bad_files),
            "seconds": report.seconds}


def damaged_records(store: Store) -> list[Finding]:
    """The damaged records a restarted stage would read (``audit.state.state_findings``, over the campaign's parents
    too): a recover refuses these before it writes anything."""
    return state_findings(with_parents(store), config_problem)


def recovery_refusal(store: Store, status: dict[str, Any]) -> str | None:
    """Why a recover must not start on the campaign whose ``campaign_status`` is ``status``, checked before it writes
    anything: there is no ``campaign.json``, or a record a restarted stage reads is damaged (it would stop that stage
    midway); None when it may start."""
    if "init" in status["todo"]:
        return "no campaign.json: nothing to recover; start it with `rollstream run` (or `run-colocated`)"
    if damaged := damaged_records(store):
        return (f"not recovered: {len(damaged)} damaged record(s) a restart reads, the first {damaged[0]} "
                "(`rollstream audit` lists them)")
    return None


def audit_report(store: Store, *, jobs: int | None = None) -> AuditReport:
    """The audit's verdict on the campaign, nothing kept (a command's answer on a finished campaign)."""
    return audit_campaign(store, jobs=jobs, config_check=config_problem)


__all__ = ["audit", "audit_report", "damaged_records", "recovery_refusal"]
