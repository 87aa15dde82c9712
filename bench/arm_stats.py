"""Pure figures of an ablation made of (arm, seed) runs: time to a target, curves on a common grid, the claims.

Every function takes what the runs recorded (plain numbers, no folders), so the bookkeeping a partial, resumed
ablation depends on is tested without running a campaign:

```
runs[seed][arm] = {"final_success": 0.62, "wall_s": 140.0, "curve": [[step, seconds, success], ...], ...}
time_to_target(curve, target)          first seconds at which an evaluated version reached target, or None
on_grid(curves, grid, axis)            each run's success as a step function of seconds or steps, on one grid
ablation_figures(runs, arms)           per arm over seeds; paired claims with 95 % intervals, open ones marked
arm_rows(runs, arms, figures)          the table of a result: one row per arm
```

Both ablations, the CPU's (``bench/ablation.py``) and the chip's (``bench/tpu_ablation.py``), report through here,
each under its own prefix. **Per arm** over the seeds that ran it: final success in points (mean, min, spread,
interval), each seed's final success, the mean of every other figure its runs recorded, time to target. **Paired
by seed with sync**, for every other arm: ``<arm>_gap_pts`` (sync − arm, points) and ``<arm>_over_sync_wallclock``
(the trainer's wall clock over sync's). **Claims**, keyed by letter (``claim.<letter>.supported``): (a) η = 4 ends
within ``WITHIN_PTS`` of sync, (b) η = 4's time-to-target ratio is at most ``RATIO_GOAL``, (c), (d) ... each
uncorrected arm ends below its corrected one (``eta<k>_correction_gain_pts``: corrected − uncorrected).

**Time to target.** The target is ``TARGET_SHARE`` of sync's mean final success over its seeds (one number for
every arm and seed). A version counts from the moment it was published (its curve point's seconds since the
trainer started). A run that never reaches the target has no time; its ratio to sync is censored at its own
wall clock (it took at least that long), and a claim about the ratio is never supported while any paired seed
is censored. A seed whose sync run never reached the target, or reached it at v0 (time 0: the target asks
nothing of training), cannot anchor a ratio and is left out of it.

**Stalled runs.** A run whose trainer stopped before its last step, waiting for groups it could learn from (its
record holds ``stalled``: a collapsed policy), is an outcome of its arm: it counts everywhere with what it reached
(its last published version's success, its curve, its wall clock until it stopped), and ``<arm>.stalled`` counts
such runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from string import ascii_lowercase
from typing import Any

from bench.campaign_arms import NO_CORRECTION
from bench.seeds import Claim, OverSeeds

TARGET_SHARE = 0.9
"""Time to target: the first time an arm reaches this share of sync's mean final success."""
WITHIN_PTS = 3.0
"""Claim (a): η = 4 with the correction ends within this many points of sync (whole interval)."""
RATIO_GOAL = 0.5
"""Claim (b): η = 4 reaches the target in at most this share of sync's time (whole interval)."""

Curve = Sequence[Sequence[float]]
"""``[[trainer step, seconds since the trainer started, held-out greedy success], ...]`` per evaluated version."""


def choose_arms(requested: Sequence[str] | None, *, name: str, arms: Sequence[str], quick_arms: Sequence[str],
                quick: bool) -> tuple[str, ...]:
    """The arms a run of benchmark ``name`` takes: ``requested`` (``--arms``) plus sync, which every claim compares
    with, in ``arms`` order; by default all of ``arms`` (``quick_arms`` when quick). An unknown arm is refused."""
    if not requested:
        return tuple(quick_arms if quick else arms)
    unknown = sorted(set(requested) - set(arms))
    if unknown:
        raise ValueError(f"unknown {name} arm(s) {', '.join(unknown)}; the arms are {', '.join(arms)}")
    return tuple(a for a in arms if a in {"sync", *requested})


def time_to_target(curve: Curve, target: float) -> float | None:
    """Seconds since the trainer started at which the first version with success >= ``target`` was published;
    None when none did."""
    reached = [seconds for _, seconds, success in curve if success >= target]
    return min(reached) if reached else None


def on_grid(curve: Curve, grid: Sequence[float], *, axis: int) -> list[float]:
    """The run's success at each grid point as a step function of ``axis`` (0: trainer steps, 1: seconds): the
    success of the last version published at or before the point (the first version's before it)."""
    points = sorted((p[axis], p[2]) for p in curve)
    out = []
    for x in grid:
        before = [s for at, s in points if at <= x]
        out.append(before[-1] if before else points[0][1])
    return out


def paired_figures(values: OverSeeds, key: str) -> dict[str, float]:
    """``OverSeeds.figures`` of a paired comparison, without an interval while one seed gives none (a goal on the
    interval then reads as not measured, not as met by a single value)."""
    figures = values.figures(key)
    if len(values.values) < 2:
        figures = {k: v for k, v in figures.items() if not k.endswith(("_ci_low", "_ci_high"))}
    return figures


def paired(runs: Mapping[int, Mapping[str, Any]], a: str, b: str) -> list[int]:
    """Seeds that have both arms, in order."""
    return sorted(s for s, arms in runs.items() if a in arms and b in arms)


def ablation_figures(runs: Mapping[int, Mapping[str, Mapping[str, Any]]], arms: Sequence[str], *,
                     prefix: str) -> tuple[dict[str, float], list[Claim], list[str]]:
    """Figures over seeds (keys under ``prefix``), the claims judged so far, and what is still open (module
    docstring: which figures and claims)."""
    figures: dict[str, float] = {f"{prefix}seeds": float(len(runs))}
    open_: list[str] = []
    sync_final = [100 * runs[s]["sync"]["final_success"] for s in sorted(runs) if "sync" in runs[s]]
    if not sync_final:
        return figures, [], ["no sync run yet: nothing can be judged"]
    figures |= OverSeeds(tuple(sync_final)).figures(f"{prefix}sync_final_pts") | {
        f"{prefix}sync_final_pts_mean": round(statistics.fmean(sync_final), 2)}
    target = TARGET_SHARE * statistics.fmean(sync_final) / 100
    figures[f"{prefix}target_success"] = round(target, 4)
    ttt: dict[str, dict[int, float | None]] = {}
    for arm in arms:
        seeds = [s for s in sorted(runs) if arm in runs[s]]
        if not seeds:
            open_.append(f"arm {arm}: no run yet")
            continue
        figures |= arm_figures_over_seeds({s: runs[s][arm] for s in seeds}, prefix=f"{prefix}{arm}.")
        figures |= {f"{prefix}seed{s}.{arm}.final_success": float(runs[s][arm]["final_success"]) for s in seeds}
        ttt[arm] = {s: time_to_target(runs[s][arm]["curve"], target) for s in seeds}
        reached = [t for t in ttt[arm].values() if t is not None]
        figures[f"{prefix}{arm}.never_reached"] = float(len(seeds) - len(reached))
        figures[f"{prefix}{arm}.stalled"] = float(sum("stalled" in runs[s][arm] for s in seeds))
        if reached:
            figures[f"{prefix}{arm}.time_to_target_s"] = round(statistics.fmean(reached), 2)
    for arm in arms:
        if arm != "sync" and (seeds := paired(runs, "sync", arm)):
            figures |= paired_figures(OverSeeds(tuple(100 * (runs[s]["sync"]["final_success"] - runs[s][arm][
                "final_success"]) for s in seeds)), f"{prefix}{arm}_gap_pts")
            figures[f"{prefix}{arm}_over_sync_wallclock"] = round(statistics.fmean(
                runs[s][arm]["wall_s"] / runs[s]["sync"]["wall_s"] for s in seeds), 4)
    claims: list[Claim] = []
    gap_seeds = paired(runs, "sync", "eta4")
    if gap_seeds:
        claims.append(Claim.within(f"(a) η = 4 with the correction ends within {WITHIN_PTS:g} points of sync",
                                   [100 * runs[s]["sync"]["final_success"] for s in gap_seeds],
                                   [100 * runs[s]["eta4"]["final_success"] for s in gap_seeds], WITHIN_PTS))
    ratio_seeds = [s for s in gap_seeds if (ttt["sync"][s] or 0.0) > 0.0]
    if ratio_seeds:
        censored = [s for s in ratio_seeds if ttt["eta4"][s] is None]
        ratios = tuple((ttt["eta4"][s] if ttt["eta4"][s] is not None else runs[s]["eta4"]["wall_s"]) / ttt["sync"][s]
                       for s in ratio_seeds)
        diff = OverSeeds(ratios)
        figures |= paired_figures(diff, f"{prefix}eta4_time_to_target_ratio")
        figures[f"{prefix}eta4_time_to_target_censored"] = float(len(censored))
        supported = len(ratios) > 1 and not censored and diff.interval()[1] <= RATIO_GOAL
        text = f"(b) η = 4 reaches the target in at most {RATIO_GOAL:g} of sync's time"
        if censored:
            text += f" (seeds {censored}: η = 4 never reached it; ratio censored at its wall clock)"
        claims.append(Claim(text, diff, supported, unit="×", measure="ratio"))
    if len(gap_seeds) > len(ratio_seeds):
        open_.append(f"seeds {sorted(set(gap_seeds) - set(ratio_seeds))}: sync never reached the target (or its v0 "
                     f"did), no ratio")
    judged = {"(a)": gap_seeds, "(b)": ratio_seeds}
    corrected = [a for a in arms if f"{a}{NO_CORRECTION}" in arms]
    for letter, arm in zip(ascii_lowercase[2:], corrected, strict=False):
        name, eta = f"({letter})", arm.removeprefix("eta")
        judged[name] = seeds = paired(runs, arm, f"{arm}{NO_CORRECTION}")
        if seeds:
            claim = Claim.worse(f"{name} η = {eta} without the correction ends below η = {eta} with it",
                                [100 * runs[s][arm]["final_success"] for s in seeds],
                                [100 * runs[s][f"{arm}{NO_CORRECTION}"]["final_success"] for s in seeds])
            figures |= paired_figures(claim.differences, f"{prefix}{arm}_correction_gain_pts")
            claims.append(claim)
    for name, seeds in judged.items():
        if len(seeds) < 2:
            open_.append(f"claim {name}: {len(seeds)} paired seed(s), an interval needs 2 or more")
    for claim in claims:  # keyed by the claim's letter: "(a) ..." -> claim.a.supported
        figures[f"{prefix}claim.{claim.text[1]}.supported"] = float(claim.supported)
    return figures, claims, open_


def arm_figures_over_seeds(runs: Mapping[int, Mapping[str, Any]], *, prefix: str) -> dict[str, float]:
    """One arm's runs by seed: how many, final success in points over them (``final_pts``: mean, min, spread,
    interval) and the mean of every other number they recorded (over the runs that have it)."""
    figures = OverSeeds(tuple(100 * run["final_success"] for run in runs.values())).figures(f"{prefix}final_pts")
    figures[f"{prefix}seeds"] = float(len(runs))
    numbers = sorted({k for run in runs.values() for k, v in run.items()
                      if isinstance(v, int | float) and not isinstance(v, bool)})
    for key in numbers:
        figures[f"{prefix}{key}"] = round(statistics.fmean(float(run[key]) for run in runs.values() if key in run), 4)
    return figures


def arm_rows(runs: Mapping[int, Mapping[str, Mapping[str, Any]]], arms: Sequence[str], figures: Mapping[str, float],
             *, prefix: str, keys: Sequence[str]) -> list[dict[str, object]]:
    """The result's table: one row per arm that ran, with its seeds, its final success over them and the figures
    ``keys`` names (``n/a`` where the arm has none)."""
    rows: list[dict[str, object]] = []
    for arm in arms:
        seeds = [s for s in sorted(runs) if arm in runs[s]]
        if seeds:
            final = OverSeeds(tuple(100 * runs[s][arm]["final_success"] for s in seeds))
            rows.append({"arm": arm, "seeds": ",".join(map(str, seeds)), "final success, pts": final.text(),
                         **{k: figures.get(f"{prefix}{arm}.{k}", "n/a") for k in keys}})
    return rows


__all__ = ["RATIO_GOAL", "TARGET_SHARE", "WITHIN_PTS", "ablation_figures", "arm_figures_over_seeds",
           "arm_rows", "choose_arms", "on_grid", "paired", "time_to_target"]
