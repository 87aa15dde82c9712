"""The learning curve of a campaign, from its own records: train batch mean reward per step (consumption logs)
and the eval metric of each published version at the step it was published (``eval/vN.json``).

``read_curves`` reads the numbers, ``learning_curve_png`` draws them; the Prefect artifact, ``rollstream
view`` and the PNG it writes into the campaign folder all use these two.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

from pipelines_lib import records
from pipelines_lib.records import ConsumptionLog, EvalResult, Publication
from pipelines_lib.storage.store import Store

CURVE_METRICS = ("greedy_success_rate", "sampled.pass@1", "greedy.mean_reward")
"""Eval fields a learning curve plots, first found wins."""


def numeric_fields(result: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Every number in a (nested) result, by dotted name; booleans and lists are left out."""
    out: dict[str, float] = {}
    for k, v in result.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(numeric_fields(v, f"{name}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[name] = float(v)
    return out


def curve_metric(results: list[Mapping[str, Any]]) -> str | None:
    fields = numeric_fields(results[0]) if results else {}
    return next((m for m in CURVE_METRICS if m in fields), None)


def learning_curve_png(train: list[tuple[int, float]], evals: list[tuple[int, float]], metric: str | None) -> bytes:
    """Train mean reward per step, and the eval metric of each version at the step it was published."""
    import matplotlib

    matplotlib.use("Agg")  # no display in workers; set before pyplot is imported
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    if train:
        ax.plot(*zip(*train, strict=True), color="tab:blue", alpha=0.7, label="train batch mean reward")
    if evals and metric:
        ax.plot(*zip(*evals, strict=True), "o-", color="tab:orange", label=f"eval {metric}")
    ax.set_xlabel("trainer step")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # a campaign with no train step and no eval yet draws empty axes
        ax.legend(loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def read_curves(store: Store, steps: int) -> tuple[list[tuple[int, float]], list[tuple[int, int, dict]]]:
    """(step, train mean reward) from the consumption logs; (version, step, eval result) of evaluated versions."""
    train = []
    for step in range(1, steps + 1):
        if not ConsumptionLog.exists(store, step):
            break
        reward = ConsumptionLog.read(store, step).mean_reward
        if reward is not None:
            train.append((step, reward))
    return train, eval_points(store)


def eval_points(store: Store) -> list[tuple[int, int, dict]]:
    """(version, step it was published at, its ``EvalResult`` as a dict) of every evaluated published version."""
    return [(version, Publication.entry(store, version).step, EvalResult.read(store, version).to_dict())
            for version in records.published_versions(store) if EvalResult.exists(store, version)]
