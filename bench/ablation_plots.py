"""The ablations' pictures: success curves with bands over seeds and each seed's curves (``bench/ablation.py``,
``bench/tpu_ablation.py``), and the chip's timeline drawn from a saved Perfetto trace of one campaign
(``bench/tpu_ablation.py``)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.arm_stats import on_grid
from bench.campaign_arms import NO_CORRECTION
from bench.plots import figure
from pipelines_lib.storage.store import Store


def plot_curves(path: Path, runs: Mapping[int, Mapping[str, Mapping[str, Any]]], arms: Sequence[str], *,
                title: str) -> None:
    """Success against wall clock and against steps per arm: the mean over seeds and a band from the lowest to
    the highest seed, each seed's curve a step function of its evaluated versions (dashed: without the
    correction); ``title`` names the task and the machine."""
    with figure(path, figsize=(11, 4), dpi=100, ncols=2, sharey=True) as (fig, (by_step, by_wall)):
        for axis, ax in ((0, by_step), (1, by_wall)):
            for arm in arms:
                curves = [runs[s][arm]["curve"] for s in sorted(runs) if arm in runs[s]]
                if not curves:
                    continue
                end = max(p[axis] for c in curves for p in c)
                grid = [end * i / 100 for i in range(101)]
                ys = [on_grid(c, grid, axis=axis) for c in curves]
                mean = [100 * sum(col) / len(col) for col in zip(*ys, strict=True)]
                style = "--" if arm.endswith(NO_CORRECTION) else "-"
                (line,) = ax.plot(grid, mean, style, label=f"{arm} (n={len(curves)})")
                ax.fill_between(grid, [100 * min(col) for col in zip(*ys, strict=True)],
                                [100 * max(col) for col in zip(*ys, strict=True)], color=line.get_color(), alpha=0.15)
        by_step.set_xlabel("trainer step")
        by_step.set_ylabel("held-out greedy success, %")
        by_step.set_ylim(0, 100)
        by_wall.set_xlabel("seconds since the trainer started")
        by_wall.legend(fontsize=8)
        fig.suptitle(f"{title}: sync vs async η (dashed: without the correction); mean over seeds, band from the "
                     "lowest to the highest seed", fontsize=10)


def plot_seeds(path: Path, runs: Mapping[int, Mapping[str, Mapping[str, Any]]], arms: Sequence[str], *,
               title: str, target: float | None = None) -> None:
    """One panel per seed: each arm's held-out success at its evaluated versions against the seconds since its
    trainer started (a step function, a marker per version), and the time-to-target line (``target``, a success
    rate): where the band of ``plot_curves`` hides which seeds an arm falls behind on, and how."""
    seeds = sorted(runs)
    present = [arm for arm in arms if any(arm in runs[seed] for seed in seeds)]  # coloured as plot_curves colours them
    with figure(path, figsize=(2.6 * len(seeds) + 0.8, 3.2), dpi=100, ncols=len(seeds), sharey=True,
                squeeze=False) as (fig, axes):
        drawn: dict[str, Any] = {}  # each arm's line as last drawn, for the legend
        for ax, seed in zip(axes[0], seeds, strict=True):
            for colour, arm in enumerate(present):
                if arm not in runs[seed]:
                    continue
                curve = runs[seed][arm]["curve"]
                drawn[arm] = ax.step([p[1] for p in curve], [100 * p[2] for p in curve], where="post", marker="o",
                                     markersize=3, color=f"C{colour}",
                                     linestyle="--" if arm.endswith(NO_CORRECTION) else "-")[0]
            if target is not None:
                ax.axhline(100 * target, color="grey", linewidth=0.8, linestyle=":")
            ax.set_title(f"seed {seed}", fontsize=9)
            ax.set_xlabel("seconds since the trainer started", fontsize=8)
        axes[0][0].set_ylabel("held-out greedy success, %")
        axes[0][0].set_ylim(0, 100)
        # One entry per arm drawn anywhere: the last seed's panel may lack an arm another seed has.
        axes[0][-1].legend([drawn[arm] for arm in present], present, fontsize=7)
        fig.suptitle(f"{title}: each seed's curve per arm (dotted: the time-to-target line)", fontsize=10)


def trace_spans(path: Path) -> list[tuple[str, str, str, float, float]]:
    """(process, track, name, start s, duration s) of every span of a saved trace (``save_trace``), the start counted
    from the trainer's first span (its first wait for data: the trainer's start)."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"].split(" #")[0] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    spans = [(processes[e["pid"]], threads[(e["pid"], e["tid"])], e["name"], e["ts"] / 1e6, e["dur"] / 1e6)
             for e in events if e["ph"] == "X"]
    t0 = min(start for process, _, _, start, _ in spans if process.startswith("trainer"))
    return [(process, track, name, start - t0, dur) for process, track, name, start, dur in spans]


TIMELINE_LANES = {
    "chip: engine (rollout)": lambda process, track, name: track == "chip" and process.startswith("rollout"),
    "chip: train step": lambda process, track, name: track == "chip" and process.startswith("trainer"),
    "trainer: waits for data": lambda process, track, name: name == "data_wait",
    "rollout: tool calls": lambda process, track, name: name.startswith("tool_call"),
}
"""The timeline's rows: which spans of a trace each one draws."""


def plot_timeline(path: Path, traces: Mapping[str, Path], *, seconds: float = 40.0) -> None:
    """The first ``seconds`` of each saved trace's trainer window, one panel per trace: when the chip ran the
    engine's calls and the train steps, when the trainer waited for groups, and the tool calls in flight."""
    with figure(path, figsize=(11, 1.9 * len(traces) + 0.6), dpi=100, nrows=len(traces), sharex=True) as (fig, axes):
        axes = list(axes) if len(traces) > 1 else [axes]
        for ax, (name, trace) in zip(axes, traces.items(), strict=True):
            spans = trace_spans(trace)
            for y, (label, wanted) in enumerate(TIMELINE_LANES.items()):
                bars = [(start, dur) for process, track, span, start, dur in spans
                        if wanted(process, track, span) and start < seconds and start + dur > 0]
                ax.broken_barh(bars, (y - 0.4, 0.8), color=f"C{y}", alpha=0.35 if "tool" in label else 0.9)
            ax.set_yticks(range(len(TIMELINE_LANES)), list(TIMELINE_LANES))
            ax.set_xlim(0, seconds)
            ax.set_title(name, fontsize=9)
        axes[-1].set_xlabel("seconds since the trainer started")
        fig.suptitle("one chip, heavy tool latency: what the chip does while tools wait", fontsize=10)


def save_trace(path: Path, store: Store) -> None:
    """The campaign's telemetry as a gzipped Perfetto/Chrome JSON trace (``rollstream trace``'s format)."""
    from pipelines_lib.telemetry.trace import read_records, to_chrome_trace

    path.write_bytes(gzip.compress(json.dumps(to_chrome_trace(read_records(store))).encode(), mtime=0))
