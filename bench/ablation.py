"""Benchmark ``ablation``: staleness η against the off-policy correction, on the ``twostep`` task.

From one warm start of the ``twostep`` recipe (same seeds, tasks and eval set), the arms of
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
run tried so the synchronous arm's v2 solved no held-out task and its rollouts ran to the token limit, with no step
moving any weight by more than a fraction of a percent; the cause is not established, so the preset's ``publish_every = 2``, with which ``learning2`` learns, stays.

After each arm's command, every fourth version it published and the last are evaluated (untimed) on the
held-out split, so each arm gets a curve of held-out greedy success against the trainer step that published a
version and against the seconds since its trainer started. Per arm the table gives final success, the trainer's wall clock, the
staleness of trained groups, the share of groups dropped as stale, and the behaviour–proximal mismatch the
trainer logged (mean ``|logp_prox − logp_behav|``, k3 KL, share of tokens the ``tis`` cap bit), averaged
over steps. The whole set of arms runs once per seed (``--seeds``, default 3), each seed from its own warm start.
Every figure over seeds, time to target and every claim come from ``bench.arm_stats`` (``ablation_figures``, the
chip ablation's too): per arm final success over seeds with a 95 % interval, paired by seed each arm's gap to sync
and wall-clock ratio, and the claims ((a) η = 4 within 3 points of sync, (b) η = 4 at the target in half sync's
time, (c), (d) each uncorrected arm below its corrected one) on the interval of the paired per-seed difference.
Headline: ``eta4_gap_pts`` (sync − η = 4 final success, points, mean over seeds) with ``eta4_gap_pts_ci_high``, and
``eta4_over_sync_wallclock``; ``eta<k>_nocorr_gap_pts`` (sync − uncorrected) and ``eta<k>_correction_gain_pts``
(corrected − uncorrected) for the uncorrected arms.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import statistics
from collections.abc import Sequence
from typing import Any

from bench.ablation_plots import plot_curves, plot_seeds
from bench.arm_stats import TARGET_SHARE, WITHIN_PTS, ablation_figures, arm_rows, choose_arms
from bench.campaign_arms import NO_CORRECTION, PROFILES, run_arm_set
from bench.learning import version_evals
from bench.registry import BenchContext, BenchResult, Goal, register_bench
from bench.seeds import seed_overrides
from pipelines_lib import records
from pipelines_lib.config import CampaignConfig
from pipelines_lib.configio import to_mapping
from pipelines_lib.records import DoneMarker
from pipelines_lib.storage.store import Store

NAME = "ablation"
ARMS = ("sync", "eta4", f"eta4{NO_CORRECTION}", "eta8", f"eta8{NO_CORRECTION}", "eta1", "eta2")
"""The headline arms first: each arm's figures are logged as it ends, so a run cut short still has them."""
QUICK_ARMS = ("sync", "eta4", f"eta4{NO_CORRECTION}")
"""``--quick`` runs the arms of the headline figures only."""


def chosen_arms(arms: Sequence[str] | None, *, quick: bool) -> tuple[str, ...]:
    """The arms a run takes (``bench.arm_stats.choose_arms`` over this benchmark's arms)."""
    return choose_arms(arms, name=NAME, arms=ARMS, quick_arms=QUICK_ARMS, quick=quick)


COMMON: dict[str, object] = {"eval.samples": 1, "env.tool_latency": to_mapping(PROFILES["heavy"]),
                             "rollout.episode_timeout_s": 600.0, "rollout.tool_timeout_s": 30.0}
"""Every arm: one sampled eval attempt (only greedy success is reported), heavy tool latency and deadlines no
loaded machine reaches (module docstring: what makes groups stale)."""
FULL: dict[str, object] = {"trainer.max_steps": 30, "eval.n_tasks": 64}
"""30 trainer steps (15 versions, as ``learning2``) and 64 held-out tasks (one task is 1.6 points; at 90 % success
the binomial standard error of one arm's figure is about 4 points). 12 steps were too few: in ``learning2`` the first
versions dip far below v0 and recover by about step 20, and a run of 12 ended every arm below v0, comparing
recoveries rather than learning. Each arm's command time is recorded (``ablation.<arm>.command_s``)."""
QUICK: dict[str, object] = {"trainer.max_steps": 4, "eval.n_tasks": 16}
EVAL_EVERY = 4
"""Every fourth published version (and the last) is evaluated for the curves: 5 evaluations per arm, not 16."""
ROW_KEYS = ("time_to_target_s", "never_reached", "wall_s", "staleness_mean", "staleness_p95", "staleness_max",
            "dropped_stale_share", "trainer_idle_fraction", "mismatch_mean", "behav_prox_kl_mean",
            "tis_capped_frac_mean", "load_1min")
"""The table's columns after the arm, its seeds and its final success (means over seeds)."""


DEFAULT_SEEDS = 3
"""Seeds of a full run: each arm runs once per seed, from that seed's warm start (``--quick``: 1)."""


def shared_config(*, quick: bool, seed: int = 0) -> CampaignConfig:
    """The config every arm of ``seed`` shares: the ``twostep`` recipe with ``COMMON``, the mode's sizes and
    the seed (``bench.seeds.seed_overrides``)."""
    return CampaignConfig.preset("twostep").with_overrides(
        {**COMMON, **(QUICK if quick else FULL), **seed_overrides(seed)})


def mismatch_figures(store: Store) -> dict[str, float]:
    """Step means of the mismatch metrics the trainer logged in ``train/consumed/`` (DESIGN §6); none before a
    first step."""
    logs = [log.metrics for log in records.consumption_logs(store)]
    if not logs:
        return {}

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


@register_bench(
    "ablation",
    title="Staleness ablation: sync vs η = 1, 2, 4, 8 with and without the off-policy correction (twostep), over seeds",
    measures="Held-out greedy success against trainer steps and wall clock for the synchronous loop, async η = 1, "
             "2, 4, 8 with the decoupled correction and η = 4, 8 without it, per seed from that seed's warm start; per "
             "arm final success over seeds (mean, min, spread, 95 % t interval), time to target, trainer wall clock, "
             "staleness, dropped share and the behaviour–proximal mismatch; each claim judged on the interval of its "
             "paired per-seed difference.",
    method="Arms of `bench/campaign_arms.py` (`python -m flows.campaign --runner threads`, one config file per seed: "
           "the `twostep` recipe (`recipes/twostep.yaml`) with one sampled eval attempt, heavy tool latency and raised episode and tool "
           "deadlines, seed N setting `seed`, `dataset.seed`, `sft.seed` and `trainer.seed`), each `init_from` its "
           "seed's SFT warm start (the preset's 200 steps); every fourth published version and the last evaluated "
           "after its arm's command (untimed); curves: mean over seeds, band from the lowest to the highest. Figures, "
           "time to target (90 % of sync's mean final success) and claims from `bench/arm_stats.py`, as "
           "`tpu_ablation`'s. Uncorrected arms set "
           "`trainer.step.loss.correction=none`. Full: `--seeds` (default 3) seeds, 30 trainer steps (15 versions), "
           "64 held-out tasks; `--quick`: one seed, sync, η = 4 and η = 4 uncorrected, 4 trainer steps, 16 held-out "
           "tasks (a smoke run: the success figures are noise). A claim is stated as supported only when the whole "
           "95 % interval of the mean paired difference satisfies it (with one seed, none is).",
    goals=(Goal(key="ablation.eta4_gap_pts_ci_high", op="<=", value=WITHIN_PTS,
                why="η = 4 with correction within 3 points of sync, over the whole interval"),
           Goal(key="ablation.eta4_over_sync_wallclock", op="<=", value=0.5, why="in at most half its wall clock")),
)
def ablation(ctx: BenchContext) -> BenchResult:
    arm_names = chosen_arms(ctx.arms, quick=ctx.quick)
    runs: dict[int, dict[str, dict[str, Any]]] = {}
    warm_s = []
    for seed in ctx.seed_list(1 if ctx.quick else DEFAULT_SEEDS):
        seed_ctx = dataclasses.replace(ctx, scratch=ctx.scratch / f"seed{seed}")
        seed_ctx.scratch.mkdir()
        run = run_arm_set(seed_ctx, f"ablation seed {seed}", shared_config(quick=ctx.quick, seed=seed), arm_names)
        runs[seed] = {}
        for arm, url in run.urls.items():
            store = Store(url)
            runs[seed][arm] = {**run.arms[arm], **mismatch_figures(store), "curve": success_curve(ctx, store)}
        warm_s.append(run.warm_s)
    figures, judged, open_ = ablation_figures(runs, arm_names, prefix="ablation.")
    figures["ablation.warm_start_s"] = statistics.fmean(warm_s)
    plot_curves(ctx.plot_dir / "ablation_curves.png", runs, arm_names, title="twostep on the CPU, heavy tool latency")
    plot_seeds(ctx.plot_dir / "ablation_seeds.png", runs, arm_names, title="twostep on the CPU, heavy tool latency",
               target=figures.get("ablation.target_success"))
    rows = arm_rows(runs, arm_names, figures, prefix="ablation.", keys=ROW_KEYS)
    shared = shared_config(quick=ctx.quick)
    sizes: dict[str, object] = {**COMMON, **(QUICK if ctx.quick else FULL)}
    notes = ("Claims (paired by seed; supported only when the whole 95 % interval satisfies them): "
             + ("; ".join(c.render() for c in judged) or "none judged") + ". "
             + (f"Open: {'; '.join(open_)}. " if open_ else "")
             + f"Target: {figures.get('ablation.target_success', float('nan')):.1%} held-out greedy success "
             f"({TARGET_SHARE:g} × sync's mean final). Every arm: the `twostep` recipe with "
             + ", ".join(f"{k}={v}" for k, v in sizes.items() if k != "env.tool_latency")
             + f", heavy tool latency (`env.tool_latency` = {sizes['env.tool_latency']}), `init_from` its seed's warm "
             f"start (mean {statistics.fmean(warm_s):.0f} s). Seeds: {len(runs)}; table values other than final "
             f"success are means over seeds. Trainer steps per arm: {int(runs[min(runs)]['sync']['steps'])}; held-out "
             f"tasks per evaluation: {shared.eval.n_tasks} (one task = {100 / shared.eval.n_tasks:.1f} points); curves: "
             f"every {EVAL_EVERY}th version and the last. wall_s is the trainer's (DONE marker); load_1min the "
             "machine's load average when the arm ended. Mismatch columns are step means of the trainer's "
             "consumption-log metrics: mean |logp_prox − logp_behav| over loss tokens, k3 KL(π_behav ‖ π_prox), and "
             "the share of tokens whose `tis` weight hit its cap (logged in every arm, applied only in the corrected "
             "ones). " + ("Quick mode: a smoke run, the success figures are noise." if ctx.quick else ""))
    return BenchResult(figures=figures, rows=rows, plots=["ablation_curves.png", "ablation_seeds.png"],
                       notes=notes.strip())
