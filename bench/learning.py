"""Benchmark ``learning``: does warm start + streaming GRPO improve held-out success, and how fast?

Runs the real campaign entry point (``python -m flows.campaign``, the same command as ``make demo``) in a
subprocess on the embedded defaults, then reads the campaign folder: ``eval/v*.json`` for held-out success
of version 0 (after the SFT warm start) and of the last published version, and ``train/consumed/*.json`` for
the learning curve (mean reward of the groups each step trained on). Wall clock counts the whole command,
Prefect start-up and compilation included: it is what a user waits for. The command evaluates v0 and the last
version (``eval.versions=ends``, as ``make demo`` does); the versions in between are evaluated afterwards, outside
the timed window, for the learning curve.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from bench.registry import BenchContext, BenchResult, Goal, register_bench
from pipelines_lib import records
from pipelines_lib.records import EvalResult, Publication
from pipelines_lib.stages.campaign import load_campaign_config
from pipelines_lib.stages.evaluate import evaluate
from pipelines_lib.storage.store import Store

QUICK_OVERRIDES = ["sft.steps=40", "sft.optim.total_steps=40", "trainer.max_steps=4", "eval.n_tasks=16",
                   "trainer.skip_zero_advantage=false"]


def _plot(path: Path, steps: list[int], rewards: list[float], evals: dict[int, tuple[int, float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, rewards, ".-", label="batch mean reward (train groups)")
    if evals:
        xs = [s for s, _ in evals.values()]
        ax.plot(xs, [v for _, v in evals.values()], "o-", label="held-out greedy success")
    ax.set_xlabel("trainer step")
    ax.set_ylim(0, 1)
    ax.legend(loc="lower right")
    ax.set_title("warm start + streaming GRPO (tiny model, arithmetic + calculator)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@register_bench(
    "learning",
    title="Learning: held-out success before and after streaming GRPO",
    measures="Held-out greedy success of the warm-started policy (v0) and of the last published version, the "
             "gain in points, and the wall clock of the whole campaign command; pass@k of the sampled attempts next "
             "to it (the preset's v0 answers greedily in the wrong format, but samples the right one: "
             "`CampaignConfig.tiny()`'s comment).",
    method="`python -m flows.campaign` on the embedded defaults (`CampaignConfig.tiny()`: tiny decoder, "
           "arithmetic with a calculator under light tool latency, 2 rollout workers and the trainer as threads of "
           "one process, Prefect's ephemeral API); results read back from the campaign folder. `--quick` shrinks "
           "SFT and training to a smoke run whose gain is not meaningful. Wall clock: the campaign command as `make demo` "
           "runs it (v0 and the last version evaluated); the other versions are evaluated after it, untimed, for the "
           "curve.",
    goals=(Goal(key="learning.heldout_gain_pts", op=">=", value=25.0, why="issue 5: +25 points over v0"),
           Goal(key="learning.wallclock_s", op="<=", value=600.0, why="within 10 minutes on 2 cores")),
)
def learning(ctx: BenchContext) -> BenchResult:
    url = str(ctx.scratch / "campaign")
    cmd = [sys.executable, "-m", "flows.campaign", url, "--set", "eval.versions=ends"]
    for item in QUICK_OVERRIDES if ctx.quick else []:
        cmd += ["--set", item]
    ctx.progress(f"learning: {' '.join(cmd[1:])}")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    wall = time.monotonic() - t0
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"campaign command failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    store = Store(url)
    config = load_campaign_config(store)
    for version in records.published_versions(store):
        ctx.progress(f"learning: evaluating v{version} for the curve (untimed)")
        evaluate(store, config, version=version)  # a no-op for the versions the campaign evaluated
    evals, pass_at_k = {}, {}
    for version in records.evaluated_versions(store):
        report = EvalResult.read(store, version)
        evals[version] = (Publication.entry(store, version).step, report.greedy_success_rate)
        pass_at_k[version] = report.pass_at_k or 0.0
    steps, rewards = [], []
    for log in records.consumption_logs(store):
        if log.mean_reward is not None:
            steps.append(log.step)
            rewards.append(log.mean_reward)
    first, last = min(evals), max(evals)
    gain = (evals[last][1] - evals[first][1]) * 100
    _plot(ctx.plot_dir / "learning_curve.png", steps, rewards, evals)
    rows = [{"version": v, "trainer step": s, "held-out greedy success": f"{x:.1%}",
             f"pass@{config.eval.samples} (sampled)": f"{pass_at_k[v]:.1%}"} for v, (s, x) in sorted(evals.items())]
    summary = json.dumps({"steps": len(steps), "wall_s": round(wall, 1)})
    return BenchResult(
        figures={"learning.heldout_gain_pts": round(gain, 2), "learning.wallclock_s": round(wall, 1),
                 "learning.v0_success": evals[first][1], "learning.final_success": evals[last][1],
                 "learning.v0_pass_at_k": pass_at_k[first], "learning.final_pass_at_k": pass_at_k[last]},
        rows=rows, plots=["learning_curve.png"], notes=f"run: {summary}; quick={ctx.quick}")
