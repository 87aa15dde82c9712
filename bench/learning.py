"""Benchmark ``learning``: does warm start + streaming GRPO improve held-out success, and how fast?

Runs the real campaign entry point (``python -m flows.campaign``, the same command as ``make demo``) in a
subprocess on ``make demo``'s preset (``pipelines_lib.config.DEMO_PRESET``), then reads the campaign folder:
``eval/v*.json`` for held-out success of version 0 (after the SFT warm start) and of the last published version,
and ``train/consumed/*.json`` for the learning curve (mean reward of the groups each step trained on). Wall clock
counts the whole command, Prefect start-up and compilation included: it is what a user waits for. The command evaluates v0 and the last
version (``eval.versions=ends``, as ``make demo`` does); the versions in between are evaluated afterwards, outside
the timed window, for the learning curve.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.plots import figure
from bench.registry import BenchContext, BenchResult, Goal, register_bench
from bench.seeds import OverSeeds, seed_args
from pipelines_lib import records
from pipelines_lib.config import DEMO_PRESET
from pipelines_lib.records import EvalResult, Publication
from pipelines_lib.stages.campaign import load_campaign_config
from pipelines_lib.stages.evaluate import evaluate
from pipelines_lib.storage.store import Store

QUICK_OVERRIDES = ["sft.steps=40", "sft.optim.total_steps=40", "trainer.max_steps=4", "eval.n_tasks=16",
                   "trainer.skip_zero_advantage=false"]


def run_campaign(ctx: BenchContext, url: str, args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> float:
    """``python -m flows.campaign URL --set eval.versions=ends ARGS`` (``rollstream run``) in a subprocess (with ``env``
    when given, e.g. fake devices); returns its wall clock.

    Exit code 1 (the audit found problems) still leaves figures worth reading."""
    cmd = [sys.executable, "-m", "flows.campaign", url, "--set", "eval.versions=ends", *args]
    ctx.progress(f"{url}: {' '.join(cmd[1:])}")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1], env=env)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"campaign command failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return time.monotonic() - t0


def version_evals(ctx: BenchContext, store: Store, *, every: int = 1) -> dict[int, dict[str, float]]:
    """Held-out figures of every ``every``-th published version and the last, evaluating (untimed) the ones the
    campaign did not.

    Per version: ``step`` (trainer step that published it), ``greedy`` (greedy success), ``pass_at_k``,
    ``format`` (share of greedy answers well-formed; envs with a ``format`` reward part) and ``published_at``
    (seconds since the epoch)."""
    config = load_campaign_config(store)
    out = {}
    published = records.published_versions(store)
    for version in [v for v in published if v % every == 0 or v == published[-1]]:
        ctx.progress(f"{store.url}: evaluating v{version} (untimed)")
        evaluate(store, config, version=version)  # a no-op for the versions the campaign evaluated
        report, publication = EvalResult.read(store, version), Publication.entry(store, version)
        out[version] = {"step": publication.step, "greedy": report.greedy_success_rate,
                        "pass_at_k": report.pass_at_k or 0.0,
                        "published_at": dt.datetime.fromisoformat(publication.published_at).timestamp(),
                        **({"format": report.greedy["format_rate"]} if "format_rate" in report.greedy else {})}
    return out


def reward_curve(store: Store) -> tuple[list[int], list[float]]:
    """Trainer step and mean reward of the groups it trained on, per step (``train/consumed/*.json``)."""
    logs = [log for log in records.consumption_logs(store) if log.mean_reward is not None]
    return [log.step for log in logs], [float(log.mean_reward) for log in logs]


def plot_learning(path: Path, steps: list[int], rewards: list[float], evals: dict[int, dict[str, float]],
                  title: str) -> None:
    with figure(path, figsize=(6, 3.5), dpi=100) as (_, ax):
        ax.plot(steps, rewards, ".-", label="batch mean reward (train groups)")
        if evals:
            ax.plot([e["step"] for e in evals.values()], [e["greedy"] for e in evals.values()], "o-",
                    label="held-out greedy success")
        ax.set_xlabel("trainer step")
        ax.set_ylim(0, 1)
        ax.legend(loc="lower right")
        ax.set_title(title)


@dataclass(frozen=True, kw_only=True)
class LearningRun:
    """A timed campaign command and what its folder says afterwards (``learning_run``)."""

    wall_s: float
    evals: dict[int, dict[str, float]]
    """``version_evals`` of every published version."""
    steps: int
    """Trainer steps with a mean reward (the reward curve's length)."""
    rows: list[dict[str, str | int]]
    """``version_rows``, for the benchmark's table."""

    def figures(self, bench: str) -> dict[str, float]:
        """The figures every learning benchmark reports, under its name: the gain of the last version over v0 in
        points, the wall clock, and greedy success and pass@k of both."""
        first, last = self.evals[min(self.evals)], self.evals[max(self.evals)]
        return {f"{bench}.heldout_gain_pts": round((last["greedy"] - first["greedy"]) * 100, 2),
                f"{bench}.wallclock_s": round(self.wall_s, 1),
                f"{bench}.v0_success": first["greedy"], f"{bench}.final_success": last["greedy"],
                f"{bench}.v0_pass_at_k": first["pass_at_k"], f"{bench}.final_pass_at_k": last["pass_at_k"]}

    @property
    def summary(self) -> str:
        return json.dumps({"steps": self.steps, "wall_s": round(self.wall_s, 1)})


def learning_run(ctx: BenchContext, args: Sequence[str], *, plot: str, title: str) -> LearningRun:
    """``run_campaign`` into a fresh folder, every version evaluated, the reward and success curves plotted."""
    url = str(ctx.scratch / "campaign")
    wall = run_campaign(ctx, url, args)
    store = Store(url)
    evals = version_evals(ctx, store)
    steps, rewards = reward_curve(store)
    plot_learning(ctx.plot_dir / plot, steps, rewards, evals, title)
    return LearningRun(wall_s=wall, evals=evals, steps=len(steps),
                       rows=version_rows(evals, load_campaign_config(store).eval.samples))


def version_rows(evals: dict[int, dict[str, float]], k: int) -> list[dict[str, str | int]]:
    """One table row per version: trainer step, greedy success, pass@k (and well-formed share when known)."""
    return [{"version": v, "trainer step": int(e["step"]), "held-out greedy success": f"{e['greedy']:.1%}",
             f"pass@{k} (sampled)": f"{e['pass_at_k']:.1%}",
             **({"greedy answers well-formed": f"{e['format']:.1%}"} if "format" in e else {})}
            for v, e in sorted(evals.items())]


DEFAULT_SEEDS = 5
"""Seeds of a full run: the figure a user can expect is every seed's, not the best one's (``--quick``: 2)."""


@dataclass(frozen=True, kw_only=True)
class SeedRun:
    """One seed's campaign command: its wall clock, the held-out figures of the versions evaluated, the reward
    curve."""

    seed: int
    wall_s: float
    evals: dict[int, dict[str, float]]
    steps: list[int]
    rewards: list[float]

    @property
    def first(self) -> dict[str, float]:
        return self.evals[min(self.evals)]

    @property
    def last(self) -> dict[str, float]:
        return self.evals[max(self.evals)]

    @property
    def gain_pts(self) -> float:
        return (self.last["greedy"] - self.first["greedy"]) * 100

    def row(self, k: int) -> dict[str, str | int]:
        return {"seed": self.seed, "v0 greedy": f"{self.first['greedy']:.1%}",
                "last greedy": f"{self.last['greedy']:.1%}", "gain (pts)": f"{self.gain_pts:+.1f}",
                f"v0 pass@{k}": f"{self.first['pass_at_k']:.1%}", f"last pass@{k}": f"{self.last['pass_at_k']:.1%}",
                "trainer steps": len(self.steps), "wall clock (s)": f"{self.wall_s:.0f}"}


def seed_run(ctx: BenchContext, seed: int, args: Sequence[str]) -> SeedRun:
    """The campaign command of ``seed`` (``bench.seeds.seed_args``) into a fresh folder, read back: v0 and the last
    version, which the command evaluated, and the reward curve."""
    url = str(ctx.scratch / f"seed{seed}")
    wall = run_campaign(ctx, url, [*args, *seed_args(seed)])
    store = Store(url)
    evals = version_evals(ctx, store, every=sys.maxsize)  # no version but v0 is a multiple: v0 and the last
    steps, rewards = reward_curve(store)
    run = SeedRun(seed=seed, wall_s=wall, evals=evals, steps=steps, rewards=rewards)
    ctx.progress(f"learning seed {seed}: v0 {run.first['greedy']:.1%} -> {run.last['greedy']:.1%} "
                 f"({run.gain_pts:+.1f} pts) in {wall:.0f} s")
    return run


def plot_seeds(path: Path, runs: Sequence[SeedRun], title: str) -> None:
    with figure(path, figsize=(6.5, 3.8), dpi=100) as (_, ax):
        for i, run in enumerate(runs):
            color = f"C{i % 10}"
            ax.plot(run.steps, run.rewards, "-", color=color, alpha=0.45, linewidth=1)
            ax.plot([e["step"] for e in run.evals.values()], [e["greedy"] for e in run.evals.values()], "o",
                    color=color, label=f"seed {run.seed} held-out greedy", markersize=4)
        ax.set_xlabel("trainer step")
        ax.set_ylim(0, 1)
        ax.legend(loc="lower right", fontsize=7)
        ax.set_title(title, fontsize=9)


def seed_figures(runs: Sequence[SeedRun]) -> dict[str, float]:
    """Per seed and over seeds: the gain (mean, min, spread, 95 % interval), the endings, the wall clock (the
    longest: what a user may wait)."""
    figures: dict[str, float] = {"learning.seeds": float(len(runs))}
    for run in runs:
        figures |= {f"learning.seed{run.seed}.heldout_gain_pts": round(run.gain_pts, 2),
                    f"learning.seed{run.seed}.v0_success": run.first["greedy"],
                    f"learning.seed{run.seed}.final_success": run.last["greedy"],
                    f"learning.seed{run.seed}.wallclock_s": round(run.wall_s, 1)}
    figures |= OverSeeds(tuple(r.gain_pts for r in runs)).figures("learning.heldout_gain_pts")
    for key, values in {"v0_success": [r.first["greedy"] for r in runs],
                        "final_success": [r.last["greedy"] for r in runs],
                        "v0_pass_at_k": [r.first["pass_at_k"] for r in runs],
                        "final_pass_at_k": [r.last["pass_at_k"] for r in runs]}.items():
        figures[f"learning.{key}"] = round(statistics.fmean(values), 4)
    figures["learning.final_success_min"] = min(r.last["greedy"] for r in runs)
    figures["learning.wallclock_s"] = round(max(r.wall_s for r in runs), 1)
    figures["learning.wallclock_s_mean"] = round(statistics.fmean(r.wall_s for r in runs), 1)
    return figures


@register_bench(
    "learning",
    title="Learning: held-out success before and after streaming GRPO, over seeds",
    measures="Per seed, held-out greedy success of the warm-started policy (v0) and of the last published version, "
             "the gain in points, pass@k of the sampled attempts next to it (the preset's v0 answers greedily in the "
             "wrong format but samples the right one: `CampaignConfig.tiny()`'s comment) and the wall clock of the "
             "whole campaign command; over seeds, the gain's mean, minimum, spread (max − min) and 95 % t interval.",
    method=f"`python -m flows.campaign --preset {DEMO_PRESET} --set eval.versions=ends` (the `make demo` command: "
           f"`recipes/{DEMO_PRESET}.yaml`, the embedded task on a 3.3M-parameter decoder: arithmetic with a calculator under "
           "light tool latency, 2 rollout workers and the trainer as threads of one process, Prefect's ephemeral API; "
           "`--preset NAME` runs another preset, recorded as `learning.preset`), once per seed "
           "(`--seeds`, default 5; seed N sets `seed`, `dataset.seed`, `sft.seed` and `trainer.seed` to N), one "
           "after the other; results read back from each campaign folder. Wall clock: the campaign command, the "
           "longest over seeds. The curve: each seed's train batch mean reward per step and its held-out success at v0 "
           "and the last version. `--quick` shrinks SFT and training to a smoke run of 2 seeds whose gain is not meaningful.",
    goals=(Goal(key="learning.heldout_gain_pts_min", op=">=", value=85.0, why="+85 points over v0 for every seed"),
           Goal(key="learning.heldout_gain_pts_spread", op="<=", value=10.0, why="seeds end within 10 points"),
           Goal(key="learning.wallclock_s", op="<=", value=600.0, why="within 10 minutes on 2 cores, every seed")),
)
def learning(ctx: BenchContext) -> BenchResult:
    preset = ctx.preset or DEMO_PRESET
    args = ["--preset", preset, *(a for item in (QUICK_OVERRIDES if ctx.quick else []) for a in ("--set", item))]
    runs = [seed_run(ctx, seed, args) for seed in ctx.seed_list(2 if ctx.quick else DEFAULT_SEEDS)]
    plot_seeds(ctx.plot_dir / "learning_curve.png", runs,
               "per seed: train batch mean reward (lines), held-out greedy at v0 and last (dots)")
    k = load_campaign_config(Store(str(ctx.scratch / "seed0"))).eval.samples
    gains = OverSeeds(tuple(r.gain_pts for r in runs))
    return BenchResult(figures=seed_figures(runs), rows=[r.row(k) for r in runs], plots=["learning_curve.png"],
                       notes=f"Preset {preset}. Gain over {len(runs)} seeds: {gains.text(' pts')}. quick={ctx.quick}",
                       labels={"learning.preset": preset})
