"""What a campaign shows in the Prefect UI, built from the campaign folder's own records.

- ``eval-<campaign>-v<N>``: a table artifact per evaluated version (every numeric field of ``eval/vN.json``).
- ``curve-<campaign>``: a markdown artifact with the learning curve as an embedded PNG (a ``data:image/png``
  URI: both Prefect 3 UIs render those in markdown images, so nothing has to be hosted) and the numbers
  under it, for tools that do not render images.
- ``audit-<campaign>``: the audit verdict and its text report (markdown).
- ``progress-<campaign>-train``: a progress artifact moved by ``flows.monitor`` while the trainer runs.
- ``telemetry-<campaign>``: a table of the run's headline signals from ``telemetry/`` (throughput, engine busy
  fraction, staleness, trainer idle time, weight swaps, peak memory); ``rollstream metrics URL`` has them all.

The rows and markdown come from ``pipelines_lib.stages.report``; ``publish_*`` call Prefect with them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from pipelines_lib.stages.report import (
    audit_markdown,
    campaign_telemetry_rows,
    eval_rows,
    learning_curve_markdown,
)
from pipelines_lib.storage.store import Store


def campaign_slug(campaign_url: str) -> str:
    """Artifact keys allow lowercase letters, digits and dashes only: the campaign folder's last name."""
    name = campaign_url.rstrip("/").rsplit("/", 1)[-1]
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "campaign"


def publish_eval_table(campaign_url: str, version: int, result: Mapping[str, Any]) -> None:
    create_table_artifact(eval_rows(result), key=f"eval-{campaign_slug(campaign_url)}-v{version}",
                          description=f"Evaluation of published version {version} ({campaign_url})")


def publish_learning_curve(campaign_url: str, store: Store, steps: int) -> str:
    """Returns the markdown it published."""
    markdown = learning_curve_markdown(campaign_url, store, steps)
    create_markdown_artifact(markdown, key=f"curve-{campaign_slug(campaign_url)}",
                             description="Train reward per step and eval metric per published version")
    return markdown


def publish_audit(campaign_url: str, store: Store, summary: Mapping[str, Any]) -> None:
    text = store.read(summary["text"]).decode()
    create_markdown_artifact(audit_markdown(campaign_url, summary, text), key=f"audit-{campaign_slug(campaign_url)}",
                             description="Audit of the campaign folder")


def publish_telemetry(campaign_url: str, store: Store) -> list[dict[str, Any]]:
    """Returns the rows it published (none when the folder has no telemetry)."""
    rows = campaign_telemetry_rows(store)
    if rows:
        create_table_artifact(rows, key=f"telemetry-{campaign_slug(campaign_url)}",
                              description=f"Headline telemetry of {campaign_url} (rollstream metrics has every signal)")
    return rows
