"""What a campaign shows in the Prefect UI, built from the campaign folder's own records.

- ``eval-<campaign>-v<N>``: a table artifact per evaluated version (every numeric field of ``eval/vN.json``).
- ``curve-<campaign>``: a markdown artifact with the learning curve as an embedded PNG (a ``data:image/png``
  URI: both Prefect 3 UIs render those in markdown images, so nothing has to be hosted) and the numbers
  under it, for tools that do not render images.
- ``audit-<campaign>``: the audit verdict and its text report (markdown).
- ``progress-<campaign>-train``: a progress artifact moved by ``flows.monitor`` while the trainer runs.
- ``telemetry-<campaign>``: a table of the run's headline signals from ``telemetry/`` (throughput, engine busy
  fraction, staleness, trainer idle time, weight swaps, peak memory); ``rollstream metrics URL`` has them all.

The row/figure builders are pure; ``publish_*`` are the only functions that call Prefect.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from pipelines_lib.audit.curve import curve_metric, learning_curve_png, numeric_fields, read_curves
from pipelines_lib.storage.store import Store

HEADLINES: tuple[tuple[str, str, str], ...] = (
    ("trajectories/s (mean of intervals)", "gauge.rollout.trajectories_per_s", "mean"),
    ("engine busy fraction (mean)", "gauge.rollout.engine_busy_fraction", "mean"),
    ("engine active slots (mean)", "gauge.rollout.engine_active_slots", "mean"),
    ("prompt tokens from the prefix cache (mean share)", "gauge.rollout.engine_prefix_reuse", "mean"),
    ("episodes in flight (max)", "gauge.rollout.episodes_in_flight", "max"),
    ("episode s (p95)", "span.rollout.episode", "p95_s"),
    ("tool call s (p95, calculator)", "span.rollout.tool_call.calculator", "p95_s"),
    ("weight swaps", "span.rollout.weight_swap", "count"),
    ("weight swap pause s (total)", "span.rollout.weight_swap", "total_s"),
    ("backpressure wait s (total)", "span.rollout.backpressure_wait", "total_s"),
    ("train steps", "span.trainer.train_step", "count"),
    ("trainer data wait s (total)", "span.trainer.data_wait", "total_s"),
    ("groups dropped as stale (last)", "gauge.trainer.dropped_stale_groups", "last"),
    ("peak RSS MB (rollout)", "gauge.rollout.rss_mb", "max"),
    ("peak RSS MB (trainer)", "gauge.trainer.rss_mb", "max"),
)
"""(label, ``telemetry.trace.summarize`` key, field) rows of the headline table; absent signals are left out."""

def campaign_slug(campaign_url: str) -> str:
    """Artifact keys allow lowercase letters, digits and dashes only: the campaign folder's last name."""
    name = campaign_url.rstrip("/").rsplit("/", 1)[-1]
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "campaign"


def eval_rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"metric": k, "value": round(v, 6)} for k, v in numeric_fields(result).items()]


def publish_eval_table(campaign_url: str, version: int, result: Mapping[str, Any]) -> None:
    create_table_artifact(eval_rows(result), key=f"eval-{campaign_slug(campaign_url)}-v{version}",
                          description=f"Evaluation of published version {version} ({campaign_url})")


def publish_learning_curve(campaign_url: str, store: Store, steps: int) -> str:
    """Returns the markdown it published."""
    train, evals = read_curves(store, steps)
    metric = curve_metric([r for _, _, r in evals])
    png = learning_curve_png(train, [(s, numeric_fields(r)[metric]) for _, s, r in evals] if metric else [], metric)
    lines = [f"# Learning curve: {campaign_url}", "",
             f"![learning curve](data:image/png;base64,{base64.b64encode(png).decode()})", "",
             f"| version | step | {metric or 'eval'} |", "|---|---|---|"]
    lines += [f"| {v} | {s} | {numeric_fields(r)[metric]:.4f} |" if metric else f"| {v} | {s} | - |"
              for v, s, r in evals]
    if train:
        lines += ["", f"train batch mean reward: first step {train[0][1]:.3f}, last step {train[-1][1]:.3f} "
                  f"({len(train)} steps)"]
    markdown = "\n".join(lines)
    create_markdown_artifact(markdown, key=f"curve-{campaign_slug(campaign_url)}",
                             description="Train reward per step and eval metric per published version")
    return markdown


def audit_markdown(campaign_url: str, summary: Mapping[str, Any], text: str) -> str:
    verdict = "OK" if summary["ok"] else "FAILED"
    head = (f"# Audit: {verdict}\n\n{campaign_url}: {summary['shards']} shards, {summary['trajectories']} "
            f"trajectories, {summary['groups']} groups; {summary['violations']} violations, "
            f"{summary['bad_files']} bad files. Report: `{summary['report']}`.\n")
    warnings = "".join(f"\n> warning: {w}\n" for w in summary.get("warnings", []))
    return f"{head}{warnings}\n```\n{text}\n```\n"


def publish_audit(campaign_url: str, store: Store, summary: Mapping[str, Any]) -> None:
    text = store.read(summary["text"]).decode()
    create_markdown_artifact(audit_markdown(campaign_url, summary, text), key=f"audit-{campaign_slug(campaign_url)}",
                             description="Audit of the campaign folder")


def telemetry_rows(summary: Mapping[str, Mapping[str, float]]) -> list[dict[str, Any]]:
    """The ``HEADLINES`` found in a ``summarize`` result, plus a row per failure status and staleness count."""
    rows = [{"signal": label, "value": round(float(summary[key][fld]), 4)}
            for label, key, fld in HEADLINES if key in summary and fld in summary[key]]
    rows += [{"signal": key.removeprefix("count.").replace(".", " "), "value": value["total"]}
             for key, value in sorted(summary.items())
             if key.startswith(("count.rollout.status.", "count.trainer.staleness."))]
    return rows


def publish_telemetry(campaign_url: str, store: Store) -> list[dict[str, Any]]:
    """Returns the rows it published (none when the folder has no telemetry)."""
    from pipelines_lib.telemetry.trace import read_records, summarize

    rows = telemetry_rows(summarize(read_records(store)))
    if rows:
        create_table_artifact(rows, key=f"telemetry-{campaign_slug(campaign_url)}",
                              description=f"Headline telemetry of {campaign_url} (rollstream metrics has every signal)")
    return rows
