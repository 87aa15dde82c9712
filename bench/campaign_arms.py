"""Benchmarks ``bench`` and ``bench_light``: the synchronous on-policy loop vs streaming GRPO at η = 0, 1, 2, end
to end, with heavy and with light tool latency.

Every arm is the real campaign command (``python -m flows.campaign``, as in ``make demo``) in a subprocess, on
one config file written once (the embedded preset ``CampaignConfig.tiny()`` with ``COMMON``, the mode's sizes and
the benchmark's ``env.tool_latency``: arms started minutes apart must not pick up an edited preset), starting
from the same version 0:

```
base       warm_start() once, in this process, into <scratch>/base (SFT: publishes v0)
arm        python -m flows.campaign <scratch>/<arm> --config <scratch>/arms.yaml
             --set init_from=<scratch>/base --set <the arm's rollout keys> --set eval.versions=ends --runner RUNNER
arms       bench: sync, eta0, eta1, eta2 with heavy tool latency; bench_light: sync, eta2 with light
  sync     rollout.eta=0, rollout.max_groups_per_version=⌈batch_groups·publish_every / workers⌉,
           rollout.backpressure_max_wait_s=SYNC_TOPUP_WAIT_S: the classic loop, generate one version's
           batch → train on it → publish → generate the next batch on the new weights
  eta<k>   rollout.eta=k (k = 0, 1, 2), the preset's backpressure budget: groups start whenever slots free up
read back  train/consumed/*.json, train/DONE.json, telemetry/*.jsonl, eval/v*.json of the arm's folder
```

**Why the sync arm is not ``rollout.mode=sync``.** The orchestrator's sync mode makes *rollout* lockstep
(a batch starts after the slowest episode of the previous one) and refreshes weights between batches without
waiting for a new version, so with η = 0 a worker keeps generating on the old weights while the trainer
trains, and the trainer drops those groups as stale: not an on-policy loop. The on-policy loop is built
from admission instead: η = 0 holds every group until the worker runs the newest version, and a per-version
budget of exactly one version's worth of groups (``batch_groups × publish_every``, split across the workers)
holds the next batch until the trainer has consumed this one and published. A finished group whose rewards are
all equal gives its place in the budget back (the orchestrator's refund) and the trainer skips it (the preset's
``skip_zero_advantage``), so the budget counts exactly the groups the trainer trains on: a batch short of useful
groups is topped up at once, as a synchronous loop that filters its batch would do, and never waits for
``backpressure_max_wait_s``. ``max_concurrency`` (32) holds a
worker's whole share, so a batch starts at once, like a synchronous batch. With the preset's ``publish_every``
of 2, one generated batch feeds two trainer steps (two minibatches per rollout batch, as PPO-style loops do).

**Latency profiles.** The issue's premise is tools whose latency varies wildly: a synchronous batch waits for
its slowest trajectory, an asynchronous loop trains meanwhile. So the headline (``bench``) runs with ``heavy``
(``LatencyProfile.heavy()``: log-normal, median 200 ms, σ 1.5, capped at 5 s: the slowest of a version's 64
calls is near the cap, and every top-up of a batch short of useful groups waits for its own slowest call), and
``bench_light`` runs sync and η = 2 again with ``light`` (``LatencyProfile.light()``, U(10, 50) ms, the preset's),
where there is little latency to hide: with heavy latency sync's trainer is latency-bound and idles most of the
time, so η = 2's advantage over it is far larger than under light latency (``bench.eta2_over_sync_wallclock``,
``bench_light.eta2_over_sync_wallclock``), and moves with the other jobs' load on a shared machine.

**Placement.** ``RUNNER`` is the campaign's ``--runner``: ``threads`` (stages are threads of one process: one
GIL, one XLA runtime) or ``processes`` (a process per stage, each with its own XLA runtime), the same in every
arm. Under heavy latency the two gave about the same trainer wall clock and engine busy fraction; processes add
start-up per arm (three interpreters importing JAX and compiling) outside the trainer's window. On 2 cores the
trainer and the engines share the CPU either way: within one run, a train step beside running engines is slower
than one beside idle engines (the sync arm has both kinds). The async arms' engines run during nearly every
step, so their ``train_step_s`` (median step) is the slower kind; between arms, which run minutes apart, the load
of other jobs on a shared machine moves step times as much (``load_1min`` per arm says how loaded it was).

**Figures per arm.** Throughputs are per hour of the trainer's wall clock (``train/DONE.json``: trainer start
to its last step; Prefect start-up, evaluation and audit are the same in every arm and are left out of
``wall_s``, they are in ``command_s``). ``traj_per_hour``: trajectories the workers finished (the status
counts of their telemetry), ``useful_samples_per_hour``: trajectories of trained groups with unequal rewards
(with the preset's ``skip_zero_advantage`` that is every trained group),
``engine_busy``: mean of the workers' ``engine_busy_fraction`` interval gauges, ``train_step_s``: median
``train_step`` span after the first (which compiles), ``load_1min``: the machine's 1-minute load average when
the arm ended (the arm itself accounts for about 2-3 of it), ``trainer_idle_fraction``:
``idle_s / wall_s`` of ``train/DONE.json`` (time waiting for data), ``weight_sync_pause_s``: mean
``weight_swap`` span (a worker loading a published version and handing it to the engine, which keeps
decoding meanwhile), next to ``admission_wait_s`` (total seconds workers held group starts for fresher
weights: η), ``backpressure_wait_s`` (total seconds they held them because this version's budget was spent: in
the sync arm, the generator waiting for the trainer) and ``publish_s`` (mean trainer ``publish`` span);
staleness over the trained groups (p95 by nearest rank), ``dropped_stale_share``: groups dropped as stale
over all groups the trainer read, ``peak_rss_mb``: largest ``rss_mb`` sample (with ``threads`` the stages' one
process's peak), ``final_success``: held-out greedy success of the last published
version. Headline: ``eta2_success_gap_pts`` = sync − η=2 final success in points,
``eta2_over_sync_wallclock`` = η=2 ``wall_s`` / sync ``wall_s`` (the goals are on ``bench``'s, heavy latency).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.plots import figure
from bench.registry import BenchContext, BenchResult, Goal, register_bench
from pipelines_lib import records
from pipelines_lib.config import CampaignConfig
from pipelines_lib.configio import to_mapping
from pipelines_lib.envs.tools.latency import LatencyProfile
from pipelines_lib.records import ConsumedGroup, ConsumptionLog, DoneMarker, EvalResult
from pipelines_lib.storage.store import Store
from pipelines_lib.telemetry.trace import read_records, summarize
from pipelines_lib.trajectory.codec import read_shard

ARMS = ("sync", "eta0", "eta1", "eta2")
COMMON: dict[str, Any] = {"eval.samples": 1}
"""Every arm: one sampled eval attempt, since only greedy success is reported."""
FULL: dict[str, Any] = {"dataset.n_heldout": 256, "eval.n_tasks": 256, "trainer.max_steps": 30,
                        "trainer.checkpoint_every": 5, "sft.error_rate": 0.6}
"""256 held-out tasks: one task is 0.4 points, so the 3-point goal is about 8 tasks, not 2. The trainer steps and
flawed share of the warm start these arms were measured with (``tiny()`` before its demo went to 60 steps and
70 %), so that their recorded figures stay what this method gives."""
QUICK: dict[str, Any] = {"trainer.max_steps": 4, "eval.n_tasks": 16}
PROFILES: dict[str, LatencyProfile] = {"heavy": LatencyProfile.heavy(), "light": LatencyProfile.light()}
"""Tool-latency profiles the arms run under (``env.tool_latency``)."""
LIGHT_ARMS = ("sync", "eta2")
"""``bench_light`` runs only the two arms of the headline ratio (about half of ``bench``'s time)."""
RUNNER = "threads"
"""The campaign's ``--runner`` in every arm (module docstring, Placement)."""
SYNC_TOPUP_WAIT_S = 600.0
"""The sync budget's top-up wait: never reached while every group is usable (it would mean a worker lost)."""
ARM_TIMEOUT_S = 1800.0
NO_CORRECTION = "_nocorr"
"""Suffix of an arm trained without off-policy correction (``trainer.step.loss.correction=none``)."""


def arm_overrides(arm: str, config: CampaignConfig) -> dict[str, Any]:
    """The rollout keys that make ``arm`` (module docstring), given the config every arm shares."""
    if arm == "sync":
        per_version = config.trainer.batch_groups * config.trainer.publish_every
        return {"rollout.eta": 0, "rollout.max_groups_per_version": -(-per_version // config.workers),
                "rollout.backpressure_max_wait_s": SYNC_TOPUP_WAIT_S}
    if arm.startswith("eta") and arm[3:].isdigit():
        return {"rollout.eta": int(arm[3:])}
    if arm.startswith("eta") and arm.endswith(NO_CORRECTION) and arm[3:-len(NO_CORRECTION)].isdigit():
        return {"rollout.eta": int(arm[3:-len(NO_CORRECTION)]), "trainer.step.loss.correction": "none"}
    raise ValueError(f"unknown arm {arm!r}; valid: sync, eta<k>, eta<k>{NO_CORRECTION}")


def shared_config(sizes: Mapping[str, Any], profile: str) -> CampaignConfig:
    """The config every arm of ``profile`` shares: the preset read now, ``COMMON``, ``sizes``, the profile."""
    if profile not in PROFILES:
        raise ValueError(f"unknown latency profile {profile!r}; valid: {sorted(PROFILES)}")
    return CampaignConfig.tiny().with_overrides({**COMMON, **sizes, "env.tool_latency": to_mapping(PROFILES[profile])})


def median_step_s(records: Sequence[Mapping[str, Any]]) -> float | None:
    """Median of the trainer's ``train_step`` spans after the first (it compiles); None with fewer than two."""
    steps = sorted((r["ts_us"], r["dur_us"] / 1e6) for r in records
                   if r["type"] == "span" and r["name"] == "train_step" and r["process"].startswith("trainer"))
    return statistics.median(d for _, d in steps[1:]) if len(steps) > 1 else None


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The q-quantile by nearest rank: the ⌈q·n⌉-th smallest value."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def consumption_figures(logs: Sequence[ConsumptionLog],
                        rewards_of: Callable[[ConsumedGroup], Sequence[float]]) -> dict[str, float]:
    """Figures of the trainer's consumption logs (one per step, in step order); ``rewards_of(group entry)``
    gives a trained group's rewards (read from its shard rows). Before a first step (a trainer that stalled at once)
    staleness and the dropped share have no value and are left out."""
    trained = [g for log in logs for g in log.groups]
    staleness = [g.staleness for g in trained]
    useful = [g for g in trained if len(set(rewards_of(g))) > 1]
    dropped = sum(len(e.groups) + e.unread_groups for log in logs for e in log.dropped_stale)
    skipped = sum(len(log.skipped_zero_advantage) for log in logs)
    out: dict[str, float] = {
        "steps": len(logs),
        "groups_trained": len(trained),
        "useful_groups": len(useful),
        "useful_samples": sum(len(rewards_of(g)) for g in useful),
        "dropped_stale_groups": dropped,
    }
    if trained:
        out |= {"staleness_mean": sum(staleness) / len(staleness), "staleness_p95": nearest_rank(staleness, 0.95),
                "staleness_max": max(staleness), "dropped_stale_share": dropped / (len(trained) + skipped + dropped)}
    return out


def telemetry_figures(summary: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Figures of ``telemetry.trace.summarize`` over a campaign's records. A span that never happened has no
    mean, so ``weight_sync_pause_s``/``publish_s`` are left out then (not zero)."""
    out = {
        "trajectories": sum(v["total"] for k, v in summary.items() if k.startswith("count.rollout.status.")),
        "admission_wait_s": summary.get("span.rollout.admission_wait", {}).get("total_s", 0.0),
        "backpressure_wait_s": summary.get("span.rollout.backpressure_wait", {}).get("total_s", 0.0),
        "peak_rss_mb": max(v["max"] for k, v in summary.items() if k.endswith(".rss_mb")),
    }
    if "gauge.rollout.engine_busy_fraction" in summary:
        out["engine_busy"] = summary["gauge.rollout.engine_busy_fraction"]["mean"]
    if "span.rollout.weight_swap" in summary:
        out["weight_sync_pause_s"] = summary["span.rollout.weight_swap"]["mean_s"]
        out["weight_swaps"] = summary["span.rollout.weight_swap"]["count"]
    if "span.trainer.publish" in summary:
        out["publish_s"] = summary["span.trainer.publish"]["mean_s"]
    return out


def _iso_s(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


def arm_figures(store: Store, *, done: DoneMarker | None = None) -> tuple[dict[str, float], list[tuple[float, float]]]:
    """Every figure of one finished arm's campaign folder, and its reward curve: (seconds since the trainer
    started, mean reward of the step's batch) per step. ``done`` is what the trainer did (default: its done marker;
    a stalled trainer's ``DataTimeoutError.progress``)."""
    logs = records.consumption_logs(store)
    tables: dict[str, Any] = {}

    def rewards_of(g: ConsumedGroup) -> list[float]:
        if g.shard not in tables:
            tables[g.shard] = read_shard(store, g.shard, validate=False)[0]
        part = tables[g.shard].slice(g.row_start, g.row_end - g.row_start)
        return part.column("reward").to_pylist()

    done = done or DoneMarker.read(store)
    wall = done.wall_s
    evals = {v: EvalResult.read(store, v) for v in records.evaluated_versions(store)}
    c = consumption_figures(logs, rewards_of)
    spans = read_records(store)
    t = telemetry_figures(summarize(spans))
    step_s = median_step_s(spans)
    figures = {
        **c, **t,
        **({"train_step_s": step_s} if step_s is not None else {}),
        "wall_s": wall,
        "traj_per_hour": t["trajectories"] / wall * 3600,
        "useful_samples_per_hour": c["useful_samples"] / wall * 3600,
        "trainer_idle_fraction": done.idle_s / wall,
        "v0_success": evals[min(evals)].greedy_success_rate,
        "final_success": evals[max(evals)].greedy_success_rate,
        "final_version": max(evals),
        "failed_stage_runs": sum(r.state == "failed" for r in records.run_records(store)),
    }
    started = _iso_s(done.finished_at) - wall
    curve = [(_iso_s(log.created_at) - started, log.mean_reward) for log in logs if log.mean_reward is not None]
    return figures, curve


def _run_arm(url: str, config_path: Path, overrides: Mapping[str, Any], progress: Callable[[str], None]) -> float:
    """Run one arm's campaign command; returns its wall clock."""
    cmd = [sys.executable, "-m", "flows.campaign", url, "--config", str(config_path),
           "--set", "eval.versions=ends", "--runner", RUNNER]
    for key, value in overrides.items():
        cmd += ["--set", f"{key}={json.dumps(value)}"]
    progress(f"bench: python -m flows.campaign {' '.join(cmd[3:])}")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1],
                          timeout=ARM_TIMEOUT_S)
    # Exit 1 is a campaign that ran and found a problem: an audit with violations (its figures are still worth
    # reading) or a stage that failed (a trainer that never finished has none: no DONE marker).
    finished = DoneMarker.exists(Store(url))
    if proc.returncode not in (0, 1) or not finished:
        why = f"exit {proc.returncode}" + ("" if finished else f", its trainer did not finish (no {DoneMarker.PATH})")
        raise RuntimeError(f"campaign {url} failed ({why}); its output ends:\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")
    return time.monotonic() - t0


def _plot(path: Path, arms: Mapping[str, Mapping[str, float]], curves: Mapping[str, list[tuple[float, float]]],
          profile: str) -> None:
    with figure(path, figsize=(10, 3.8), dpi=100, ncols=2) as (_, (left, right)):
        for arm, curve in curves.items():
            left.plot([x for x, _ in curve], [y for _, y in curve], ".-", label=arm)
        left.set_xlabel("seconds since the trainer started")
        left.set_ylabel("batch mean reward")
        left.set_ylim(0, 1)
        left.legend(fontsize=8)
        left.set_title(f"training reward vs wall clock ({profile} tool latency)")
        for arm, f in arms.items():
            right.plot(f["wall_s"], 100 * f["final_success"], "o")
            right.annotate(arm, (f["wall_s"], 100 * f["final_success"]), textcoords="offset points", xytext=(5, 3))
        v0 = next(iter(arms.values()))["v0_success"]
        right.axhline(100 * v0, color="grey", linestyle=":", label=f"v0 {100 * v0:.1f}%")
        right.set_xlabel("trainer wall clock, s (same number of steps)")
        right.set_ylabel("held-out greedy success, %")
        right.set_ylim(0, 100)
        right.legend(fontsize=8)
        right.set_title("final success vs wall clock")


ROW_KEYS = ("wall_s", "traj_per_hour", "useful_samples_per_hour", "engine_busy", "trainer_idle_fraction",
            "train_step_s", "load_1min", "weight_sync_pause_s", "admission_wait_s", "backpressure_wait_s",
            "staleness_mean", "staleness_p95", "staleness_max", "dropped_stale_share", "peak_rss_mb", "v0_success",
            "final_success")


def headline_figures(name: str, arms: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """The goal figures of benchmark ``name``: sync − η = 2 final success in points, η = 2 over sync wall clock."""
    sync, eta2 = arms["sync"], arms["eta2"]
    return {f"{name}.eta2_success_gap_pts": round(100 * (sync["final_success"] - eta2["final_success"]), 2),
            f"{name}.eta2_over_sync_wallclock": eta2["wall_s"] / sync["wall_s"]}


@dataclass(frozen=True, kw_only=True)
class ArmSet:
    """What ``run_arm_set`` ran: per arm its figures, reward curve, overrides and campaign URL."""

    arms: dict[str, dict[str, float]]
    curves: dict[str, list[tuple[float, float]]]
    configs: dict[str, dict[str, Any]]
    urls: dict[str, str]
    warm_s: float


def run_arm_set(ctx: BenchContext, name: str, shared: CampaignConfig, arm_names: Sequence[str]) -> ArmSet:
    """One warm start of ``shared``, then each arm's campaign command in turn from it (module docstring)."""
    from pipelines_lib.stages.warm_start import warm_start

    config_path = ctx.scratch / "arms.yaml"
    config_path.write_text(yaml.safe_dump(shared.to_dict()))
    base = ctx.scratch / "base"
    ctx.progress(f"{name}: warm start into {base}")
    t0 = time.monotonic()
    # The preset's warm start in quick mode too: a shorter one solves no task, and a trainer that skips
    # zero-advantage groups would then wait for data that never comes.
    warm_start(Store(str(base)), shared, log=ctx.progress)
    warm_s = time.monotonic() - t0
    arms: dict[str, dict[str, float]] = {}
    curves: dict[str, list[tuple[float, float]]] = {}
    configs: dict[str, dict[str, Any]] = {}
    urls: dict[str, str] = {}
    for arm in arm_names:
        configs[arm] = {"init_from": str(base), **arm_overrides(arm, shared)}
        urls[arm] = str(ctx.scratch / arm)
        command_s = _run_arm(urls[arm], config_path, configs[arm], ctx.progress)
        arms[arm], curves[arm] = arm_figures(Store(urls[arm]))
        arms[arm]["command_s"] = command_s
        arms[arm]["load_1min"] = os.getloadavg()[0]
        ctx.progress(f"{name} {arm}: " + ", ".join(f"{k}={arms[arm][k]:.4g}" for k in ROW_KEYS if k in arms[arm]))
    steps = {arm: int(f["steps"]) for arm, f in arms.items()}
    if len(set(steps.values())) != 1:
        raise RuntimeError(f"arms trained different numbers of steps {steps}: their figures are not comparable")
    return ArmSet(arms=arms, curves=curves, configs=configs, urls=urls, warm_s=warm_s)


def run_arms(ctx: BenchContext, name: str, profile: str, arm_names: Sequence[str]) -> BenchResult:
    """Benchmark ``name``: one warm start, then ``arm_names`` in turn under tool-latency ``profile``."""
    sizes = QUICK if ctx.quick else FULL
    shared = shared_config(sizes, profile)
    run = run_arm_set(ctx, name, shared, arm_names)
    arms, curves, configs, warm_s = run.arms, run.curves, run.configs, run.warm_s
    figures = {**headline_figures(name, arms), f"{name}.warm_start_s": warm_s}
    figures |= {f"{name}.{arm}.{k}": float(v) for arm, f in arms.items() for k, v in f.items()}
    rows = [{"arm": arm, **{k: f.get(k, "n/a") for k in ROW_KEYS}} for arm, f in arms.items()]
    plot = f"campaign_arms_{profile}.png"
    _plot(ctx.plot_dir / plot, arms, curves, profile)
    failed = {arm: int(f["failed_stage_runs"]) for arm, f in arms.items() if f["failed_stage_runs"]}
    shared_keys = ", ".join(f"{k}={v}" for k, v in {**COMMON, **sizes}.items())
    notes = (f"Tool latency: **{profile}** (`env.tool_latency` = {to_mapping(PROFILES[profile])}). Every arm: "
             f"`CampaignConfig.tiny()` with {shared_keys}, `init_from` this run's warm start, `--runner {RUNNER}`; "
             "per arm: "
             + "; ".join(f"{arm}: " + ", ".join(f"{k}={v}" for k, v in c.items() if k != "init_from")
                         for arm, c in configs.items())
             + f". Trainer steps per arm: {int(arms['sync']['steps'])}; wall_s is the trainer's (DONE marker), the "
             "whole command's is `command_s`. train_step_s is the median train step after the first (which "
             "compiles): on 2 shared cores a step beside running engines is slower (compare engine_busy), and so is "
             "one on a machine loaded by other jobs (load_1min: load average when the arm ended, the arm's own "
             "stages included). weight_sync_pause_s is the mean "
             "`weight_swap` span of the workers (load + hand-over; the engine keeps decoding meanwhile); what workers "
             "waited for fresher weights is `admission_wait_s` (total over workers; η bound) and "
             "`backpressure_wait_s` (total; version budget spent: in the sync arm the generator waiting for the "
             "trainer), the trainer's publish time `publish_s` (mean). "
             + ("Quick mode: 4 trainer steps, 16 held-out tasks: the success figures and "
                "their gap are noise, not a result. " if ctx.quick else "")
             + (f"Stage runs that failed and were retried by Prefect: {failed}." if failed else ""))
    return BenchResult(figures=figures, rows=rows, plots=[plot], notes=notes.strip())


ARMS_METHOD = (f"Runs of the real campaign command (`python -m flows.campaign --runner {RUNNER}`, "
               "Prefect's ephemeral API) on `CampaignConfig.tiny()`, each `init_from` one SFT warm start made once, "
               "same seeds, tasks, eval set and trainer (one config file for all). Sync: η = 0 and a per-version "
               "budget of one version's batch of useful groups (generate → train → publish → next batch; module "
               "docstring of `bench/campaign_arms.py`); η = k: `rollout.eta=k`, groups start as slots "
               "free up. Figures are read back from each campaign folder (consumption logs, DONE marker, telemetry, "
               "eval); throughput is per hour of the trainer's wall clock. Full: the preset's trainer steps, 256 held-out "
               "tasks; `--quick`: 4 trainer steps, 16 held-out tasks (a smoke run: its learning figures mean "
               "nothing).")
ARMS_MEASURES = ("Per arm, over the same number of trainer steps from the same warm-started v0: trajectories and "
                 "useful training samples (groups with unequal rewards) per hour, engine busy and trainer idle "
                 "fractions, median train step, weight-sync pause, staleness of trained groups (mean, p95, max), "
                 "share of groups dropped as stale, peak memory, held-out greedy success of the last version")


@register_bench(
    "bench",
    title="End to end: synchronous on-policy loop vs streaming GRPO at η = 0, 1, 2 (heavy tool latency)",
    measures=ARMS_MEASURES + "; and whether η = 2 gets within 3 points of the synchronous loop's success in at "
             "most 60 % of its wall clock when tool latency varies wildly (the premise: a synchronous batch "
             "waits for its slowest trajectory).",
    method="Tool latency **heavy** (`LatencyProfile.heavy()`: log-normal, median 200 ms, σ 1.5, capped at 5 s) in "
           "every arm. " + ARMS_METHOD,
    goals=(Goal(key="bench.eta2_success_gap_pts", op="<=", value=3.0,
                why="η = 2 within 3 points of the synchronous loop (heavy tool latency)"),
           Goal(key="bench.eta2_over_sync_wallclock", op="<=", value=0.6,
                why="in at most 60 % of its wall clock (heavy tool latency)")),
)
def bench_campaign_arms(ctx: BenchContext) -> BenchResult:
    return run_arms(ctx, "bench", "heavy", ARMS)


@register_bench(
    "bench_light",
    title="End to end: synchronous on-policy loop vs streaming GRPO at η = 2 (light tool latency)",
    measures=ARMS_MEASURES + "; for the sync and η = 2 arms of `bench`, with fast tools: how much of the "
             "asynchronous loop's lead comes from hiding tool latency.",
    method="Tool latency **light** (`LatencyProfile.light()`: U(10 ms, 50 ms), the preset's) in both arms. "
           + ARMS_METHOD,
)
def bench_campaign_arms_light(ctx: BenchContext) -> BenchResult:
    return run_arms(ctx, "bench_light", "light", LIGHT_ARMS)
