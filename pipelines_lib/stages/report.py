"""What a campaign's records say, as rows and markdown a dashboard shows (the campaign flow's Prefect artifacts,
``flows.artifacts``, publishes them): pure reads of the campaign folder, no Prefect.

```
eval_rows(result)                         every numeric field of an EvalResult, one row each
learning_curve_markdown(url, store, n)    the learning curve PNG (embedded) and its numbers
audit_markdown(url, summary, text)        the audit verdict and its text report
campaign_telemetry_rows(store)            the HEADLINES of telemetry/, plus failure statuses and staleness counts
```
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from pipelines_lib.audit.curve import curve_metric, learning_curve_png, numeric_fields, read_curves
from pipelines_lib.storage.store import Store
from pipelines_lib.telemetry.trace import read_records, summarize

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

def eval_rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"metric": k, "value": round(v, 6)} for k, v in numeric_fields(result).items()]


def learning_curve_markdown(campaign_url: str, store: Store, steps: int) -> str:
    """The learning curve of ``steps`` trainer steps as markdown: the PNG embedded as a ``data:image/png`` URI, the
    eval metric per published version under it, the train batch reward at the first and last step."""
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
    return "\n".join(lines)


def audit_markdown(campaign_url: str, summary: Mapping[str, Any], text: str) -> str:
    verdict = "OK" if summary["ok"] else "FAILED"
    head = (f"# Audit: {verdict}\n\n{campaign_url}: {summary['shards']} shards, {summary['trajectories']} "
            f"trajectories, {summary['groups']} groups; {summary['violations']} violations, "
            f"{summary['bad_files']} bad files. Report: `{summary['report']}`.\n")
    warnings = "".join(f"\n> warning: {w}\n" for w in summary.get("warnings", []))
    return f"{head}{warnings}\n```\n{text}\n```\n"


def telemetry_rows(summary: Mapping[str, Mapping[str, float]]) -> list[dict[str, Any]]:
    """The ``HEADLINES`` found in a ``summarize`` result, plus a row per failure status and staleness count."""
    rows = [{"signal": label, "value": round(float(summary[key][fld]), 4)}
            for label, key, fld in HEADLINES if key in summary and fld in summary[key]]
    rows += [{"signal": key.removeprefix("count.").replace(".", " "), "value": value["total"]}
             for key, value in sorted(summary.items())
             if key.startswith(("count.rollout.status.", "count.trainer.staleness."))]
    return rows


def campaign_telemetry_rows(store: Store) -> list[dict[str, Any]]:
    """``telemetry_rows`` of the campaign's telemetry files (none when it has none)."""
    return telemetry_rows(summarize(read_records(store)))
