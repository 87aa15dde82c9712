"""Benchmark ``ablation``: staleness η against the off-policy correction, on the ``twostep`` task.

From one warm start of ``CampaignConfig.twostep()`` (same seeds, tasks and eval set), the arms of
``bench/campaign_arms.py`` run in turn, each the real campaign command:

```
sync            η = 0 and one version's batch per version (generate -> train -> publish -> next batch)
eta<k>          rollout.eta = k, the decoupled correction (the default ``tis``: w = min(π_prox/π_behav, C))
eta<k>_nocorr   rollout.eta = k, trainer.step.loss.correction = none (w = 1: stale groups trained as if fresh)
```

**Making staleness happen.** Staleness is counted in versions, and the workers load every new version as soon
as it is published, so a group is stale only by the versions published while it was in flight or waiting to be
trained. Every arm therefore runs with ``heavy`` tool latency (``LatencyProfile.heavy()``: log-normal, median
200 ms, σ 1.5, capped at 5 s; two calls per episode), which keeps episodes in flight for seconds while the
preset's budget (16 groups per worker and version, twice what the trainer consumes per version) lets
generation run ahead of the trainer. Heavy latency is also the premise of asynchrony: the synchronous loop
waits for the slowest call of each batch. Episode and tool deadlines are raised (600 s, 30 s) so that a
machine loaded by other jobs, or the first episodes' compilation, turns no correct episode into a zero-reward
timeout. A version per trainer step (``publish_every = 1``) would let staleness grow twice as fast, but in the one
run tried so (a first-episode timeout at v0 included) the synchronous arm's v2 solved no held-out task (v1:
13 of 16) and its rollouts ran to the token limit, with no step moving any weight by more than 0.7 %; the cause
is not established, so the preset's ``publish_every = 2``, with which ``learning2`` learns, stays.

After each arm's command, every fourth version it published and the last are evaluated (untimed) on the
held-out split, so each arm gets a curve of held-out greedy success against the trainer step that published a
version and against the seconds since its trainer started. Per arm the table gives final success, the trainer's wall clock, the
staleness of trained groups, the share of groups dropped as stale, and the behaviour–proximal mismatch the
trainer logged (mean ``|logp_prox − logp_behav|``, k3 KL, share of tokens the ``tis`` cap bit), averaged
over steps. Headline: ``eta4_gap_pts`` (sync − η = 4 final success, points) and ``eta4_over_sync_wallclock``;
``eta<k>_nocorr_gap_pts`` for the uncorrected arms.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path

from bench.campaign_arms import NO_CORRECTION, PROFILES, run_arm_set
from bench.learning import version_evals
from bench.plots import figure
from bench.registry import BenchContext, BenchResult, Goal, register_bench
from pipelines_lib import records
from pipelines_lib.config import CampaignConfig
from pipelines_lib.configio import to_mapping
from pipelines_lib.records import DoneMarker
from pipelines_lib.storage.store import Store

ARMS = ("sync", "eta4", f"eta4{NO_CORRECTION}", "eta8", f"eta8{NO_CORRECTION}", "eta1", "eta2")
"""The headline arms first: each arm's figures are logged as it ends, so a run cut short still has them."""
QUICK_ARMS = ("sync", "eta4", f"eta4{NO_CORRECTION}")
"""``--quick`` runs the arms of the headline figures only."""
COMMON: dict[str, object] = {"eval.samples": 1, "env.tool_latency": to_mapping(PROFILES["heavy"]),
                             "rollout.episode_timeout_s": 600.0, "rollout.tool_timeout_s": 30.0}
"""Every arm: one sampled eval attempt (only greedy success is reported), heavy tool latency and deadlines no
loaded machine reaches (module docstring: what makes groups stale)."""
FULL: dict[str, object] = {"trainer.max_steps": 30, "eval.n_tasks": 64}
"""30 trainer steps (15 versions, as ``learning2``) and 64 held-out tasks (one task is 1.6 points; at 90 % success
the binomial standard error of one arm's figure is about 4 points). 12 steps were too few: the first versions dip
far below v0 and recover by about step 20 (``learning2``: v0 74 %, v1 22 %, v6 52 %, v10 86 %), and a run of 12
ended every arm below v0 (sync 56 %, η = 4 47 %), comparing recoveries rather than learning. Measured per arm
command at 12 steps on a quiet machine: 1.5-2 minutes for the η arms, 4 for sync; the warm start 3 minutes."""
QUICK: dict[str, object] = {"trainer.max_steps": 4, "eval.n_tasks": 16}
EVAL_EVERY = 4
"""Every fourth published version (and the last) is evaluated for the curves: 5 evaluations per arm, not 16."""
ROW_KEYS = ("final_success", "wall_s", "staleness_mean", "staleness_p95", "staleness_max", "dropped_stale_share",
            "trainer_idle_fraction", "mismatch_mean", "behav_prox_kl_mean", "tis_capped_frac_mean", "load_1min")


def shared_config(*, quick: bool) -> CampaignConfig:
    """The config every arm shares: ``CampaignConfig.twostep()`` with ``COMMON`` and the mode's sizes."""
    return CampaignConfig.twostep().with_overrides({**COMMON, **(QUICK if quick else FULL)})


def mismatch_figures(store: Store) -> dict[str, float]:
    """Step means of the mismatch metrics the trainer logged in ``train/consumed/`` (DESIGN §6)."""
    logs = [log.metrics for log in records.consumption_logs(store)]

    def mean(key: str) -> float:
        return sum(m[key] for m in logs) / len(logs)

    return {"mismatch_mean": mean("prox_behav_logp_abs_diff"), "behav_prox_kl_mean": mean("behav_prox_kl"),
            "tis_capped_frac_mean": mean("correction_frac_tis")}


def success_curve(ctx: BenchContext, store: Store) -> list[tuple[int, float, float]]:
    """(trainer step, seconds since the trainer started, held-out greedy success) per published version."""
    done = DoneMarker.read(store)
    started = dt.datetime.fromisoformat(done.finished_at).timestamp() - done.wall_s
    evals = version_evals(ctx, store, every=EVAL_EVERY)
    return [(int(e["step"]), max(0.0, e["published_at"] - started), e["greedy"]) for _, e in sorted(evals.items())]


def plot_curves(path: Path, curves: Mapping[str, list[tuple[int, float, float]]]) -> None:
    with figure(path, figsize=(11, 4), dpi=100, ncols=2, sharey=True) as (fig, (by_step, by_wall)):
        for arm, curve in curves.items():
            style = "--" if arm.endswith(NO_CORRECTION) else "-"
            by_step.plot([s for s, _, _ in curve], [100 * y for _, _, y in curve], "o" + style, label=arm, markersize=3)
            by_wall.plot([w for _, w, _ in curve], [100 * y for _, _, y in curve], "o" + style, label=arm, markersize=3)
        by_step.set_xlabel("trainer step")
        by_step.set_ylabel("held-out greedy success, %")
        by_step.set_ylim(0, 100)
        by_step.set_title("vs trainer steps")
        by_wall.set_xlabel("seconds since the trainer started")
        by_wall.set_title("vs wall clock")
        by_wall.legend(fontsize=8)
        fig.suptitle("twostep: sync vs async η with the decoupled correction (solid) and without (dashed)")


@register_bench(
    "ablation",
    title="Staleness ablation: sync vs η = 1, 2, 4, 8 with and without the off-policy correction (twostep)",
    measures="Held-out greedy success against trainer steps and wall clock for the synchronous loop, async η = 1, "
             "2, 4, 8 with the decoupled correction and η = 4, 8 without it, from one warm start; per arm final "
             "success, trainer wall clock, staleness, dropped share and the behaviour–proximal mismatch.",
    method="Arms of `bench/campaign_arms.py` (`python -m flows.campaign --runner threads`, one config file: "
           "`CampaignConfig.twostep()` with one sampled eval attempt, heavy tool latency and raised episode and tool "
           "deadlines), each `init_from` one SFT warm start made once (the preset's 200 steps); every "
           "fourth published version and the last evaluated after its arm's command (untimed). Uncorrected arms set "
           "`trainer.step.loss.correction=none`. Full: 30 trainer steps (15 versions), 64 held-out tasks; `--quick`: "
           "sync, η = 4 and η = 4 uncorrected, 4 trainer steps, 16 held-out tasks (a smoke run: the success figures "
           "are noise).",
    goals=(Goal(key="ablation.eta4_gap_pts", op="<=", value=3.0, why="η = 4 with correction within 3 points of sync"),
           Goal(key="ablation.eta4_over_sync_wallclock", op="<=", value=0.5, why="in at most half its wall clock")),
)
def ablation(ctx: BenchContext) -> BenchResult:
    shared = shared_config(quick=ctx.quick)
    arm_names = QUICK_ARMS if ctx.quick else ARMS
    run = run_arm_set(ctx, "ablation", shared, arm_names)
    curves = {}
    for arm, url in run.urls.items():
        store = Store(url)
        run.arms[arm] |= mismatch_figures(store)
        curves[arm] = success_curve(ctx, store)
    arms = run.arms
    sync = arms["sync"]
    figures = {f"ablation.{arm}.{k}": float(v) for arm, f in arms.items() for k, v in f.items()}
    figures |= {f"ablation.{arm}_gap_pts": round(100 * (sync["final_success"] - f["final_success"]), 2)
                for arm, f in arms.items() if arm != "sync"}
    figures |= {f"ablation.{arm}_over_sync_wallclock": f["wall_s"] / sync["wall_s"]
                for arm, f in arms.items() if arm != "sync"}
    figures["ablation.warm_start_s"] = run.warm_s
    plot_curves(ctx.plot_dir / "ablation_curves.png", curves)
    rows = [{"arm": arm, **{k: f.get(k, "n/a") for k in ROW_KEYS}} for arm, f in arms.items()]
    sizes: dict[str, object] = {**COMMON, **(QUICK if ctx.quick else FULL)}
    notes = ("Every arm: `CampaignConfig.twostep()` with "
             + ", ".join(f"{k}={v}" for k, v in sizes.items() if k != "env.tool_latency")
             + f", heavy tool latency (`env.tool_latency` = {sizes['env.tool_latency']}), `init_from` one warm start "
             f"({run.warm_s:.0f} s). Trainer steps per arm: {int(sync['steps'])}; held-out tasks per evaluation: "
             f"{shared.eval.n_tasks} (one task = {100 / shared.eval.n_tasks:.1f} points); curves: every "
             f"{EVAL_EVERY}th version and the last. v0 success {sync['v0_success']:.1%}. wall_s is the "
             "trainer's (DONE marker); load_1min the machine's load average when the arm ended. Mismatch columns are step means of the trainer's consumption-log metrics: "
             "mean |logp_prox − logp_behav| over loss tokens, k3 KL(π_behav ‖ π_prox), and the share of tokens "
             "whose `tis` weight hit its cap (logged in every arm, applied only in the corrected ones). "
             + ("Quick mode: a smoke run, the success figures are noise." if ctx.quick else ""))
    return BenchResult(figures=figures, rows=rows, plots=["ablation_curves.png"], notes=notes.strip())
