"""Benchmark ``tpu_ablation``: the synchronous loop against asynchronous η on one accelerator chip, at equal
quality, over seeds, resumable across commands and sessions.

```
per seed s (5 by default; --seeds N or A..B)
  warm start    the tpu_ablation recipe's SFT, colocated, into <scratch>/seed<s>/base (v0)
  arms          sync, eta1, eta2, eta4, eta4_nocorr: run_colocated(init_from=base) with heavy tool latency,
                each in its own folder; then every second published version and the last evaluated on the
                held-out split (untimed, without tool latency: the score does not depend on it)
profiles        none and light tool latency: sync and eta4 of seed 0 again (throughput across latency; scored
                at v0 and the last version only, as the campaign itself scores them)
ledger          bench/tpu_ablation_runs.json: each finished (arm, seed) and (profile, arm), keyed by the recipe's
                fingerprint; a later command runs only what the ledger lacks; a run a command started and never
                finished stays on record as interrupted; a copy written elsewhere (a device's checkout) comes
                back with ``python -m bench.tpu_ablation merge COPY`` (``Ledger.merge``)
```

The arms are those of ``bench/campaign_arms.py`` (``arm_overrides``): ``sync`` is the on-policy loop made from
admission (η = 0, one version's batch per version: generate, train, publish, generate on the new weights), ``eta<k>``
lets groups start up to k versions ahead with the decoupled correction, ``eta4_nocorr`` trains them as if fresh.
Everything runs colocated in this one process (a chip admits one), one arm after another: XLA's persistent
compilation cache (``JAX_COMPILATION_CACHE_DIR``) and the process's own jit caches are shared by the arms of one
command, and each command opens with a short campaign that is thrown away (``run_colocated_warmup``), so no
arm's wall clock pays for compilation: otherwise the first arm of a command (sync) would, and time to target
would favour whichever arm ran later.

**What is measured per run** (``run_arm``): final held-out greedy success (the last version), its curve (success
per version against the trainer step that published it and the seconds since the trainer started), the trainer's
wall clock (``train/DONE.json``) and the command's (compilation and the in-run evaluation of v0 and the last
version included), staleness and dropped share of trained groups, the behaviour–proximal mismatch, trajectories and
useful samples per hour of the trainer's wall clock, the chip busy fraction (``telemetry.trace.chip_busy`` over the
trainer's window: the union of the engine's and the trainer's device spans) and the host idle share (the share of
the trainer's wall clock its loop waited for groups, ``idle_s / wall_s``), and the XLA compilations inside the
trainer's window (``compiles``, ``compile_s``, the functions: none when the warm-up compiled every program).
Per behaviour version, its episodes (``episodes_by_version``: count, mean reward, length, logprob per generated
token, statuses; the last version's first two decoded): what the policy was doing, version by version. A trainer
that waits ``STALL_S`` for a group it can learn from ends its arm: the run is recorded as **stalled**, with what it
reached (its published versions scored).

**Claims** (``bench/arm_stats.py``): (a) η = 4 ends within 3 points of sync, (b) η = 4 reaches 90 % of sync's mean
final success in at most half sync's time, (c) corrected against uncorrected, each on the 95 % interval of the
paired per-seed differences; a claim with fewer than two paired seeds is listed as open. ``--budget-s`` bounds a
command: no run starts that the longest run so far says would not finish in what is left; what ran is recorded.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.ablation import mismatch_figures
from bench.ablation_plots import plot_curves, plot_seeds, plot_timeline, save_trace
from bench.arm_stats import RATIO_GOAL, WITHIN_PTS, ablation_figures, arm_rows, choose_arms, paired_figures
from bench.campaign_arms import NO_CORRECTION, arm_figures, arm_overrides
from bench.registry import BenchContext, BenchResult, BenchSkipped, Budget, Goal, register_bench
from bench.seeds import OverSeeds, seed_overrides
from harness.results import write_atomically
from pipelines_lib import records
from pipelines_lib.config import CampaignConfig
from pipelines_lib.configio import to_mapping
from pipelines_lib.envs.tools.latency import LatencyProfile
from pipelines_lib.records import DoneMarker, EvalResult, Publication
from pipelines_lib.storage.store import Store
from pipelines_lib.utc import utc_now_iso

if TYPE_CHECKING:
    from pipelines_lib.model.tokenizer import ChatTokenizer

NAME = "tpu_ablation"
ARMS = ("sync", "eta1", "eta2", "eta4", f"eta4{NO_CORRECTION}")
"""Every arm of a seed, sync first (every claim compares with it), then the headline η = 4 pair."""
HEADLINE_ARMS = ("sync", "eta4", f"eta4{NO_CORRECTION}")
"""The arms every claim compares: run over all seeds before ``eta1`` and ``eta2``."""
QUICK_ARMS = ("sync", "eta4")
PROFILE_ARMS = ("sync", "eta4")
"""The arms run again under the ``none`` and ``light`` latency profiles (seed 0) for throughput."""
TIMELINE_ARMS = ("sync", "eta4")
"""The arms whose telemetry is kept as a Perfetto trace (``bench/tpu_trace_heavy_seed<s>_<arm>.json.gz``, both of
one seed) and drawn as the chip's timeline."""
PROFILES = {"none": LatencyProfile.none(), "light": LatencyProfile.light(), "heavy": LatencyProfile.heavy()}
DEFAULT_SEEDS = 5
WARMUP_STEPS = 2
"""Trainer steps of the compile warm-up that opens each command (one publication, so the handover compiles)."""
EVAL_EVERY = 2
"""Versions evaluated for the curves: every second one and the last (an evaluation opens an engine: seconds each)."""
LEDGER = Path("bench/tpu_ablation_runs.json")
STALL_S = 90.0
"""Every arm's ``trainer.data_timeout_s``: a trainer that waits this long for a group it can learn from (a collapsed
policy's groups all score alike) ends its arm, recorded as stalled (``run_arm``). About four times the longest wait
of a sync step on the chip (~25 s for a wave of heavy-latency episodes). It decides only when a stalled arm ends,
so it is the runner's, not the recipe's, and leaves the ledger's fingerprint alone."""
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
"""The event JAX's monitoring records around each XLA compilation, tagged with the function's name."""
PLOTS = ("tpu_ablation_curves.png", "tpu_ablation_seeds.png", "tpu_chip_timeline.png")
"""The pictures the benchmark draws, as BENCHMARKS.md shows them."""
SAMPLE_CHARS = 400
"""Characters kept of each sample episode a run records (``episodes_by_version``)."""
QUICK: dict[str, Any] = {
    "model.d_model": 64, "model.n_layers": 2, "model.n_heads": 2, "model.n_kv_heads": 1, "model.head_dim": 32,
    "model.d_ff": 128, "sft.steps": 10, "sft.n_demos": 64, "sft.optim.total_steps": 10, "trainer.max_steps": 2,
    "trainer.batch_groups": 2, "trainer.skip_zero_advantage": False, "rollout.group_size": 2,
    "rollout.max_groups_per_version": 4, "eval.n_tasks": 4, "dataset.n_train": 128, "dataset.n_heldout": 8,
    "engine.num_slots": 8, "rollout.max_concurrency": 8, "engine.prefill_buckets": [64, 256],
}
"""A smoke run on 2 CPU cores: a small model, two trainer steps, every group trained (a weak policy's groups are
mostly unrewarded); the success figures are noise."""


def shared_config(*, quick: bool, seed: int, profile: str = "heavy") -> CampaignConfig:
    """The config every arm of ``seed`` shares: the ``tpu_ablation`` recipe (``QUICK`` over it), the seed and the
    latency profile."""
    return CampaignConfig.build(preset=NAME, overrides={
        **(QUICK if quick else {}), **seed_overrides(seed), "env.tool_latency": to_mapping(PROFILES[profile])})


def config_fingerprint(config: CampaignConfig) -> str:
    """A short hash of what ``config`` sets. Empty mappings and lists and None are left out, so a config field
    added later with an empty default (nothing set) leaves the fingerprint of the runs recorded before it alone."""
    def settled(value: Any) -> Any:
        if isinstance(value, dict):  # settled first: a mapping holding only empty ones is empty too
            return {k: v for k, v in ((k, settled(v)) for k, v in value.items()) if v not in (None, {}, [])}
        return [settled(v) for v in value] if isinstance(value, list) else value

    text = json.dumps(settled(config.to_dict()), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint(*, quick: bool) -> str:
    """What a recorded run was measured with: the shared config of seed 0 (a changed recipe starts a new ledger)."""
    return config_fingerprint(shared_config(quick=quick, seed=0))


@dataclasses.dataclass
class Ledger:
    """The finished runs: ``runs[seed][arm]`` (heavy latency) and ``profiles[profile][arm]`` (seed 0); ``running``,
    the run under way (saved before it starts); ``interrupted``, every run a command started and never finished
    (killed at its limit, or failed): a later command runs it again, and the attempt stays on record beside it; and
    ``repeats``, runs finished again by a command that started from an older copy of the ledger (``merge``): the
    first to finish counts, whatever either scored, and the repeat stays on record beside it."""

    path: Path
    fingerprint: str
    device: str
    runs: dict[int, dict[str, dict[str, Any]]] = dataclasses.field(default_factory=dict)
    profiles: dict[str, dict[str, dict[str, Any]]] = dataclasses.field(default_factory=dict)
    interrupted: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    running: dict[str, Any] | None = None
    repeats: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @classmethod
    def load(cls, path: Path, *, fingerprint: str, device: str, log: Callable[[str], None]) -> Ledger:
        """The ledger at ``path`` if it was measured with this recipe on this device; else an empty one (the old
        file is kept beside it, named by its fingerprint)."""
        fresh = cls(path, fingerprint, device)
        if not path.exists():
            return fresh
        data = json.loads(path.read_text())
        if data.get("fingerprint") != fingerprint or data.get("device") != device:
            old = path.with_name(f"{path.stem}-{data.get('fingerprint', 'unknown')}.json")
            log(f"{NAME}: {path} was measured with recipe {data.get('fingerprint')} on {data.get('device')!r}, not "
                f"{fingerprint} on {device!r}: kept as {old}, starting a new ledger")
            path.rename(old)
            return fresh
        interrupted = data.get("interrupted", [])
        if data.get("running"):  # the command that started it ended before it finished
            interrupted.append({**data["running"], "ended": "its command ended first (killed at its limit, or failed)"})
        return cls(path, fingerprint, device, {int(s): arms for s, arms in data["runs"].items()}, data["profiles"],
                   interrupted, repeats=data.get("repeats", []))

    def merge(self, other: Ledger) -> list[str]:
        """Adds what ``other`` (a copy of this ledger that a command wrote elsewhere) holds and this one lacks: its
        runs, interrupted attempts and repeats. A run both hold, finished at different times, was run twice: the
        one that finished first counts (the other was run only because its command did not know of it) and the
        later goes to ``repeats``. Returns a line per change."""
        if (other.fingerprint, other.device) != (self.fingerprint, self.device):
            raise ValueError(f"{other.path} was measured with recipe {other.fingerprint} on {other.device!r}, "
                             f"{self.path} with {self.fingerprint} on {self.device!r}: not one ablation")
        changes: list[str] = []
        tables = [(f"seed {seed}", self.runs.setdefault(seed, {}), arms, {"seed": seed, "profile": "heavy"})
                  for seed, arms in other.runs.items()]
        tables += [(f"{profile} latency", self.profiles.setdefault(profile, {}), arms, {"seed": 0, "profile": profile})
                   for profile, arms in other.profiles.items()]
        for where, mine, theirs, key in tables:
            for arm, run in theirs.items():
                kept = mine.get(arm)
                if kept is None:
                    mine[arm] = run
                    changes.append(f"{where} {arm}: added (final {run['final_success']:.1%})")
                elif kept["finished_at"] != run["finished_at"]:
                    first, later = sorted((kept, run), key=lambda r: r["finished_at"])
                    if (repeat := {**key, "arm": arm, "run": later}) in self.repeats:
                        continue  # merged before
                    mine[arm] = first
                    self.repeats.append(repeat)
                    changes.append(f"{where} {arm}: run twice; the first to finish counts ({first['finished_at']}, "
                                   f"final {first['final_success']:.1%}), the repeat is kept beside it "
                                   f"({later['finished_at']}, final {later['final_success']:.1%})")
        for name in ("interrupted", "repeats"):
            mine_list: list[dict[str, Any]] = getattr(self, name)
            for entry in getattr(other, name):
                if entry not in mine_list:
                    mine_list.append(entry)
                    changes.append(f"{name}: seed {entry['seed']} {entry['arm']} ({entry['profile']} latency)")
        self.runs = {seed: arms for seed, arms in sorted(self.runs.items()) if arms}
        self.profiles = {profile: arms for profile, arms in self.profiles.items() if arms}
        return changes

    def save(self) -> None:
        data = {"fingerprint": self.fingerprint, "device": self.device, "runs": self.runs, "profiles": self.profiles,
                "interrupted": self.interrupted, "repeats": self.repeats, "running": self.running}
        # A command killed mid-write leaves the previous ledger whole.
        write_atomically(self.path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def chosen_arms(arms: Sequence[str] | None, *, quick: bool) -> tuple[str, ...]:
    """The arms a run takes (``bench.arm_stats.choose_arms`` over this benchmark's arms)."""
    return choose_arms(arms, name=NAME, arms=ARMS, quick_arms=QUICK_ARMS, quick=quick)


def run_arm(scratch: Path, base: Store, shared: CampaignConfig, arm: str, *, profile: str, curve: bool = True,
            log: Callable[[str], None]) -> tuple[dict[str, Any], Store]:
    """One arm from the warm start at ``base``, in ``scratch/<arm>-<profile>``: its figures and its folder. Without
    ``curve`` only the versions the campaign itself scored (v0 and the last) make its curve: a run measured for its
    throughput alone spares the chip the other evaluations (seconds each)."""
    from pipelines_lib.model.tokenizer import open_tokenizer
    from pipelines_lib.stages.colocated import run_colocated
    from pipelines_lib.stages.evaluate import evaluate
    from pipelines_lib.telemetry.trace import chip_busy, read_records
    from pipelines_lib.train.trainer import DataTimeoutError

    config = shared.with_overrides({"init_from": base.url, "trainer.data_timeout_s": STALL_S,
                                    **arm_overrides(arm, shared)})
    store = Store(str(scratch / f"{arm}-{profile}"))
    t0 = time.monotonic()
    stalled: str | None = None
    with compilations() as compiled:
        try:
            run_colocated(store, config, cache=scratch / "cache", log=log)
            done = DoneMarker.read(store)
        except DataTimeoutError as e:  # an outcome of the arm, recorded as it ended: its published versions scored
            if e.progress is None:
                raise
            done, stalled = e.progress, str(e)
            log(f"{NAME}: {arm} stalled after step {done.steps} (v{done.version}): {stalled}")
    command_s = time.monotonic() - t0
    quiet = dataclasses.replace(config, env=dataclasses.replace(config.env, tool_latency=LatencyProfile.none()))
    published = records.published_versions(store)
    for version in [v for v in published if v % EVAL_EVERY == 0 or v == published[-1]] if curve else []:
        evaluate(store, quiet, version=version, cache=scratch / "cache", log=log)
    figures, _ = arm_figures(store, done=done)
    end = dt.datetime.fromisoformat(done.finished_at).timestamp()
    start = end - done.wall_s
    curve = []
    for version in records.evaluated_versions(store):
        published = Publication.entry(store, version)
        seconds = max(0.0, dt.datetime.fromisoformat(published.published_at).timestamp() - start)
        curve.append([published.step, round(seconds if version else 0.0, 3),
                      EvalResult.read(store, version).greedy_success_rate])
    spans = read_records(store)
    out = {k: figures[k] for k in ("final_success", "v0_success", "wall_s", "steps", "staleness_mean",
                                   "staleness_max", "dropped_stale_share", "traj_per_hour", "useful_samples_per_hour",
                                   "trajectories", "useful_samples") if k in figures}
    out |= mismatch_figures(store) | {
        "command_s": round(command_s, 2), "curve": sorted(curve),
        "chip_busy": round(chip_busy(spans, int(start * 1e6), int(end * 1e6), processes=("rollout", "trainer")), 4),
        "host_idle_share": round(done.idle_s / done.wall_s, 4),
        "finished_at": done.finished_at,
        # every evaluation of the arm's versions, engine starts included: the campaign's own (v0 and the last, inside
        # command_s) and the curve's, after it
        "eval_s": round(sum(r["dur_us"] for r in spans if r.get("type") == "span"
                            and r.get("name") == "stage.evaluate") / 1e6, 2),
    }
    # Compilations inside the trainer's window cost the arm wall clock: none once the warm-up compiled everything.
    inside = [(fun, max(a, start), min(b, end)) for fun, a, b in compiled if a < end and b > start]
    out |= {"compiles": len(inside), "compile_s": round(sum(b - a for _, a, b in inside), 3)}
    if inside:
        out["compiled"] = dict(collections.Counter(fun for fun, _, _ in inside).most_common(5))
    # Every run, not only a stalled one: a policy that collapses and recovers (or plateaus) shows it here too.
    out["episodes_by_version"] = episodes_by_version(store, open_tokenizer(config.tokenizer, cache=scratch / "cache"))
    if stalled is not None:
        out["stalled"] = stalled
    out["run_s"] = round(time.monotonic() - t0, 2)  # what the run took of its command: what the budget plans with
    return out, store


@contextlib.contextmanager
def compilations() -> Iterator[list[tuple[str, float, float]]]:
    """Every XLA compilation in this process while inside (a load from the persistent cache included), as
    ``(function, start, end)`` in seconds since the epoch, heard through JAX's monitoring events."""
    import jax

    seen: list[tuple[str, float, float]] = []

    def heard(event: str, start: float, end: float, **tags: str | int) -> None:
        if event == COMPILE_EVENT:
            seen.append((str(tags.get("fun_name", "?")), start, end))

    jax.monitoring.register_event_time_span_listener(heard)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_time_span_listener(heard)


def episodes_by_version(store: Store, tokenizer: ChatTokenizer, *, samples: int = 2) -> dict[str, dict[str, Any]]:
    """Per behaviour version of the campaign's shards (each holds one): episodes, their mean reward, length in tokens
    and behaviour logprob per generated token (how sure the sampling policy was), and their statuses; the last
    version also gives the decoded text after the prompt of its first ``samples`` episodes (``SAMPLE_CHARS`` each).
    What an arm's policy was doing, version by version: a stalled arm's when it stopped producing anything to learn
    from, a collapsing one's on its way down."""
    import numpy as np
    import pyarrow.compute as pc

    from pipelines_lib.audit.sql import shard_paths
    from pipelines_lib.trajectory.codec import read_shard

    # A tally over the shards rather than a query of `rollstream sql`: the chip's machine has no DuckDB
    # (scripts/tpu_setup.sh), and this runs there.
    tally: dict[int, dict[str, Any]] = {}
    last: list[dict[str, Any]] = []
    for path in shard_paths(store):  # in version order: the last shards hold the last version
        table = read_shard(store, path, validate=False)[0]
        if not table.num_rows:
            continue
        version = table.column("version")[0].as_py()
        if last and last[0]["version"] != version:
            last = []  # a later version's shards: its samples replace the earlier one's
        last += table.select(["version", "tokens", "prompt_len"]).slice(0, samples - len(last)).to_pylist()
        generated = pc.list_flatten(table.column("loss_mask")).to_numpy(zero_copy_only=False).astype(bool)
        logprobs = pc.list_flatten(table.column("logprobs")).to_numpy(zero_copy_only=False)
        entry = tally.setdefault(version, {"episodes": 0, "reward": 0.0, "tokens": 0, "generated": 0,
                                           "logprob": 0.0, "statuses": {}})
        entry["episodes"] += table.num_rows
        entry["reward"] += pc.sum(table.column("reward")).as_py()
        entry["tokens"] += pc.sum(pc.list_value_length(table.column("tokens"))).as_py()
        entry["generated"] += int(generated.sum())
        entry["logprob"] += float(np.sum(logprobs[generated]))
        for status in table.column("status").to_pylist():
            entry["statuses"][status] = entry["statuses"].get(status, 0) + 1
    out = {f"v{v}": {"episodes": e["episodes"], "reward_mean": round(e["reward"] / e["episodes"], 4),
                     "tokens_mean": round(e["tokens"] / e["episodes"], 1),
                     "logprob_per_token": round(e["logprob"] / max(e["generated"], 1), 4), "statuses": e["statuses"]}
           for v, e in sorted(tally.items())}
    if last:
        out[f"v{last[-1]['version']}"]["sample"] = [
            tokenizer.decode(r["tokens"][r["prompt_len"]:])[:SAMPLE_CHARS] for r in last[:samples]]
    return out


def run_colocated_warmup(scratch: Path, base: Store, shared: CampaignConfig, *, log: Callable[[str], None]) -> Store:
    """A short campaign of ``shared`` from ``base``, thrown away: it compiles what every arm runs (the train step,
    the engine's variants, publication, evaluation), so that no arm's wall clock, the first one's included, pays
    for compilation. The programs are the same in every arm: η, the budget and the correction change no shape."""
    from pipelines_lib.stages.colocated import run_colocated

    store = Store(str(scratch / "compile-warmup"))
    config = shared.with_overrides({"init_from": base.url, "trainer.max_steps": WARMUP_STEPS,
                                    "env.tool_latency": to_mapping(LatencyProfile.none())})
    run_colocated(store, config, cache=scratch / "cache", log=log)
    return store


def _warm_start(scratch: Path, shared: CampaignConfig, log: Callable[[str], None]) -> Store:
    from pipelines_lib.stages.warm_start import warm_start

    base = Store(str(scratch / "base"))
    warm_start(base, shared, cache=scratch / "cache", log=log)
    return base


def run_ledger(ctx: BenchContext, ledger: Ledger, arms: Sequence[str], seeds: Sequence[int],
               *, on_timeline: Callable[[int, str, Store], None] | None = None,
               timeline_seed: int | None = None) -> list[str]:
    """Run every (seed, arm) and (profile, arm) the ledger lacks, saving it after each; returns what was left out
    for the budget. ``on_timeline(seed, arm, store)`` sees ``timeline_seed``'s sync and η = 4 folders while they
    exist.

    The budget check estimates a run by what that arm took before (its longest ``run_cost`` in the ledger, else
    the longest run of this command) plus the seed's warm start when it is not made yet (the longest of this
    command), so a command cut short still runs the short arms that fit."""
    budget = Budget(ctx.budget_s)
    longest = {"run": 0.0, "warm start": 0.0}
    skipped: list[str] = []

    def estimate(arm: str, profile: str) -> float:
        done = [run_cost(runs[arm]) for runs in (ledger.runs.values() if profile == main
                                                 else [ledger.profiles.get(profile, {})]) if arm in runs]
        return max(done, default=longest["run"])

    def affordable(what: str, cost: float) -> bool:
        if not budget.affords(cost):
            skipped.append(what)
            return False
        return True

    def timed(kind: str, fn: Callable[[], Any]) -> Any:
        t0 = time.monotonic()
        result = fn()
        longest[kind] = max(longest[kind], time.monotonic() - t0)
        return result

    # Quick mode (a CPU smoke run) without tool latency: under heavy latency its sync arm alone waits a minute.
    main = "none" if ctx.quick else "heavy"
    # The claims' arms over every seed first, then the others: a command cut short by its budget leaves pairs.
    jobs = [(seed, main, arm) for group in (HEADLINE_ARMS, ARMS) for seed in seeds for arm in arms
            if arm in group and (group is HEADLINE_ARMS or arm not in HEADLINE_ARMS)]
    if not ctx.quick:
        jobs += [(0, profile, arm) for profile in ("none", "light") for arm in PROFILE_ARMS]
    compiled: list[Store] = []
    bases: dict[int, Store] = {}  # a seed's warm start, shared by its profiles (tool latency plays no part in SFT)
    for seed, profile, arm in jobs:
        done = ledger.runs.get(seed, {}) if profile == main else ledger.profiles.get(profile, {})
        label = f"seed {seed} {arm}" + ("" if profile == main else f" ({profile} latency)")
        if arm in done:
            continue
        if not affordable(label, estimate(arm, profile) + (0.0 if seed in bases else longest["warm start"])):
            continue
        shared = shared_config(quick=ctx.quick, seed=seed, profile=profile)
        scratch = ctx.scratch / f"seed{seed}"
        if seed not in bases:
            ctx.progress(f"{NAME}: seed {seed}: warm start")
            bases[seed] = timed("warm start", lambda shared=shared, scratch=scratch: _warm_start(
                scratch, shared, ctx.progress))
        if not compiled and not ctx.quick:  # a quick run's timings mean nothing: it skips the warm-up
            ctx.progress(f"{NAME}: compiling (a {WARMUP_STEPS}-step campaign, not recorded)")
            compiled.append(timed("run", lambda shared=shared, scratch=scratch, base=bases[seed]: run_colocated_warmup(
                scratch, base, shared, log=ctx.progress)))
        ctx.progress(f"{NAME}: {label}")
        ledger.running = {"seed": seed, "arm": arm, "profile": profile, "started_at": utc_now_iso()}
        ledger.save()
        figures, store = timed("run", lambda shared=shared, scratch=scratch, arm=arm, base=bases[seed], profile=profile:
                               run_arm(scratch, base, shared, arm, profile=profile, curve=profile == main,
                                       log=ctx.progress))
        if on_timeline is not None and seed == timeline_seed and profile == main and arm in TIMELINE_ARMS:
            on_timeline(seed, arm, store)
        done[arm] = figures
        ledger.running = None
        if profile == main:
            ledger.runs[seed] = done
        else:
            ledger.profiles[profile] = done
        ledger.save()
        ctx.progress(f"{NAME}: {label}: final {figures['final_success']:.1%}, trainer {figures['wall_s']:.0f} s, "
                     f"command {figures['command_s']:.0f} s, chip busy {figures['chip_busy']:.2f}")
    return skipped


def run_cost(run: dict[str, Any]) -> float:
    """What a recorded run took of its command, evaluations after the campaign included: ``run_s``, or, for a run
    recorded without it, ``command_s`` (which stops at the campaign's end) plus every evaluation's ``eval_s`` (which
    counts the campaign's own twice: an estimate on the safe side)."""
    return run["run_s"] if "run_s" in run else run["command_s"] + run.get("eval_s", 0.0)


def stalled_arms(arms: dict[str, dict[str, Any]]) -> list[str]:
    """The arms of one seed (or profile) whose trainer stalled (``run_arm``)."""
    return [arm for arm, run in arms.items() if "stalled" in run]


def throughput_figures(ledger: Ledger) -> dict[str, float]:
    """``tpu.rollout.<profile>.*``: per latency profile, sync's and η = 4's trajectories and useful samples per
    hour, chip busy and host idle share (means over the seeds measured), and async over sync in useful samples and
    in trajectories per hour: the mean of the per-seed ratios with its interval where more than one seed pairs the
    two arms. Heavy latency reads the ablation's runs (every seed); none and light the profile runs (seed 0). A
    stalled run is left out: its last ninety seconds are a collapsed policy's episodes, which measure the policy,
    not the pipeline's throughput (its success counts in the claims; the notes name it)."""
    out: dict[str, float] = {}
    by_profile = {**{p: {0: arms} for p, arms in ledger.profiles.items()}, "heavy": ledger.runs}
    for profile, runs in by_profile.items():
        for arm in PROFILE_ARMS:
            seeds = [s for s in sorted(runs) if arm in runs[s] and arm not in stalled_arms(runs[s])]
            if not seeds:
                continue
            tag = "sync" if arm == "sync" else "async"
            for key in ("traj_per_hour", "useful_samples_per_hour", "chip_busy", "host_idle_share", "wall_s"):
                out[f"tpu.rollout.{profile}.{key}_{tag}"] = round(statistics.fmean(runs[s][arm][key] for s in seeds), 4)
        pairs = [runs[s] for s in sorted(runs)
                 if all(a in runs[s] and a not in stalled_arms(runs[s]) for a in PROFILE_ARMS)]
        for suffix, key in (("", "useful_samples_per_hour"), ("_trajectories", "traj_per_hour")):
            ratios = tuple(arms["eta4"][key] / arms["sync"][key] for arms in pairs if arms["sync"][key] > 0)
            if ratios:  # a sync run with no useful sample has no ratio to speak of
                out |= paired_figures(OverSeeds(ratios), f"tpu.rollout.{profile}.async_over_sync{suffix}")
    return out


def v0_figures(ledger: Ledger) -> dict[str, float]:
    """``tpu.ablation.v0_pts*``: the warm start's held-out success per seed (every arm of a seed starts from it),
    over seeds; its spread says how robust the recipe's warm start is."""
    v0 = tuple(100 * next(iter(arms.values()))["v0_success"] for _, arms in sorted(ledger.runs.items()) if arms)
    return OverSeeds(v0).figures("tpu.ablation.v0_pts") if v0 else {}


def per_seed(ledger: Ledger) -> str:
    """Each seed's v0 and final success per arm, one clause per seed (what the means and intervals summarise)."""
    def clause(seed: int, arms: dict[str, dict[str, Any]]) -> str:
        v0 = 100 * next(iter(arms.values()))["v0_success"]
        finals = ", ".join(f"{arm} {100 * arms[arm]['final_success']:.1f}"
                           + (f" (stalled after step {arms[arm]['steps']})" if arm in stalled_arms(arms) else "")
                           for arm in ARMS if arm in arms)
        return f"seed {seed}: {v0:.1f} -> {finals}"
    return "; ".join(clause(seed, arms) for seed, arms in sorted(ledger.runs.items()) if arms) or "none yet"


def stall_notes(ledger: Ledger) -> str:
    """The stalled runs, each with the reward, length and sampling logprob of the episodes its last two behaviour
    versions made."""
    def clause(seed: int, arm: str, run: dict[str, Any]) -> str:
        last = list(run["episodes_by_version"].items())[-2:]
        return f"seed {seed} {arm} after step {run['steps']} (" + "; ".join(
            f"{v}: {e['episodes']} episodes, reward {e['reward_mean']:.2f}, {e['tokens_mean']:.0f} tokens, "
            f"logprob {e['logprob_per_token']:.2f} a token"
            for v, e in last) + ")"
    clauses = [clause(seed, arm, arms[arm]) for seed, arms in sorted(ledger.runs.items()) for arm in stalled_arms(arms)]
    return (f"Stalled (the trainer waited {STALL_S:g} s for a group to learn from; counted in the claims with what "
            f"they reached, left out of throughput): {', '.join(clauses)}. ") if clauses else ""


def interrupted_notes(ledger: Ledger) -> str:
    """The runs commands started and never finished, each with when and why (a rerun is what the figures hold)."""
    clauses = [f"seed {a['seed']} {a['arm']} ({a['profile']} latency), started {a['started_at']}: {a['ended']}"
               for a in ledger.interrupted]
    return (f"Interrupted before they finished (run again by a later command; the attempt is not in the figures): {'; '.join(clauses)}. "
            if clauses else "")


def repeat_notes(ledger: Ledger) -> str:
    """The runs measured twice (``Ledger.merge``), each repeat with what it reached."""
    def clause(entry: dict[str, Any]) -> str:
        run = entry["run"]
        stalled = f", stalled after step {run['steps']}" if "stalled" in run else ""
        return (f"seed {entry['seed']} {entry['arm']} ({entry['profile']} latency), finished {run['finished_at']}: "
                f"final {100 * run['final_success']:.1f}{stalled}")
    clauses = [clause(entry) for entry in ledger.repeats]
    return (f"Run again by a command that started from an older copy of the ledger (the first to finish is in the "
            f"figures, whatever either scored; the repeat is not): {'; '.join(clauses)}. " if clauses else "")


def ablation(ctx: BenchContext, *, device: str, ledger_path: Path, run: bool = True) -> BenchResult:
    """Run what the ledger lacks for ``ctx``'s seeds and arms (``run``), then every figure from the whole ledger."""
    arms = chosen_arms(ctx.arms, quick=ctx.quick)
    seeds = ctx.seed_list(1 if ctx.quick else DEFAULT_SEEDS)
    ledger = Ledger.load(ledger_path, fingerprint=fingerprint(quick=ctx.quick), device=device, log=ctx.progress)

    def trace(seed: int, arm: str) -> Path:
        return ctx.plot_dir / f"tpu_trace_heavy_seed{seed}_{arm}.json.gz"

    def paired(seed: int) -> bool:
        return all(trace(seed, arm).exists() and arm in ledger.runs.get(seed, {}) for arm in TIMELINE_ARMS)

    # The timeline compares arms of one seed: the first seed with a saved pair, else the first whose timeline arms
    # this command runs or has traces of (a trace is kept while its arm's folder exists).
    timeline_seed = min((s for s in ledger.runs if paired(s)), default=None)
    if timeline_seed is None:
        timeline_seed = next((s for s in seeds if all(a in arms for a in TIMELINE_ARMS) and all(
            trace(s, a).exists() or a not in ledger.runs.get(s, {}) for a in TIMELINE_ARMS)), None)

    def keep(seed: int, arm: str, store: Store) -> None:
        save_trace(trace(seed, arm), store)

    skipped = run_ledger(ctx, ledger, arms, seeds, on_timeline=keep, timeline_seed=timeline_seed) if run else []
    shown = min((s for s in ledger.runs if paired(s)), default=None)
    if shown is not None:
        for stale in ctx.plot_dir.glob("tpu_trace_heavy_seed*_*.json.gz"):  # a pair of another seed supersedes
            if stale not in {trace(shown, arm) for arm in TIMELINE_ARMS}:
                stale.unlink()
    shown_seeds = [shown] if shown is not None else sorted(ledger.runs)
    saved = {f"seed {seed} {arm}: chip busy {ledger.runs[seed][arm]['chip_busy']:.0%} of the trainer's wall clock":
             trace(seed, arm) for seed in shown_seeds for arm in TIMELINE_ARMS
             if trace(seed, arm).exists() and arm in ledger.runs[seed]}
    if saved:  # the traces, saved by whichever command ran each arm
        plot_timeline(ctx.plot_dir / "tpu_chip_timeline.png", saved)
    figures, claims, open_ = ablation_figures(ledger.runs, ARMS, prefix="tpu.ablation.")
    figures |= throughput_figures(ledger) | v0_figures(ledger)
    plot_curves(ctx.plot_dir / "tpu_ablation_curves.png", ledger.runs, ARMS,
                title="twostep on one chip, heavy tool latency")
    plot_seeds(ctx.plot_dir / "tpu_ablation_seeds.png", ledger.runs, ARMS, title="twostep on one chip, heavy latency",
               target=figures.get("tpu.ablation.target_success"))
    rows = arm_rows(ledger.runs, ARMS, figures, prefix="tpu.ablation.", keys=(
        "time_to_target_s", "never_reached", "stalled", "wall_s", "command_s", "eval_s", "compile_s", "staleness_mean",
        "dropped_stale_share", "mismatch_mean", "chip_busy"))
    notes = ("" if run else f"Rendered from the ledger on a machine without an accelerator: every figure was "
             f"measured on {device}. ") + ("Claims (paired by seed; supported only when the whole 95 % interval satisfies them): "
             + ("; ".join(c.render() for c in claims) or "none judged yet") + ". "
             + (f"Open: {'; '.join(open_)}. " if open_ else "")
             + (f"Left for a later command (budget): {', '.join(skipped)}. " if skipped else "")
             + f"Per seed, v0 -> final held-out success in points per arm: {per_seed(ledger)}. "
             + stall_notes(ledger) + interrupted_notes(ledger) + repeat_notes(ledger)
             + f"Target: {figures.get('tpu.ablation.target_success', float('nan')):.1%} held-out greedy success "
             f"(0.9 × sync's mean final). Ledger {ledger_path} (recipe {ledger.fingerprint}, {device}).")
    return BenchResult(figures=figures, rows=rows, notes=notes, labels={"tpu.ablation.device": device},
                       plots=[p for p in PLOTS if (ctx.plot_dir / p).exists()])


@register_bench(
    NAME,
    title="Sync against async at equal quality on one accelerator chip, over seeds, with intervals",
    measures="Per arm (sync, η = 1, 2, 4 with the decoupled correction, η = 4 without), over seeds from each "
             "seed's warm start: final held-out greedy success, the wall clock to reach 90 % of sync's mean final "
             "success, staleness, dropped share, mismatch and the chip busy fraction; claims on paired per-seed "
             "differences. Throughput (trajectories and useful samples per hour, chip busy, host idle) of sync and "
             "η = 4 under no, light and heavy tool latency.",
    method="`bench/tpu_ablation.py` (module docstring), in this one process, colocated: the `tpu_ablation` "
           "recipe (`recipes/tpu_ablation.yaml`: twostep on `tpu_demo`'s model), heavy tool latency for the "
           "ablation; every second published version and the last evaluated after its arm (untimed, no tool "
           "latency; the latency profiles' runs, for throughput, only v0 and the last). Results accumulate in "
           "`bench/tpu_ablation_runs.json` per (arm, seed) across commands (`--seeds A..B`, `--arms`, "
           "`--budget-s`); figures are computed from the whole ledger. Async over sync: η = 4's useful samples "
           "per hour of the trainer's wall clock over sync's. Skipped without an accelerator; the CPU test runs `ablation` at `QUICK` sizes.",
    goals=(Goal(key="tpu.ablation.eta4_gap_pts_ci_high", op="<=", value=WITHIN_PTS,
                why="η = 4 with correction within 3 points of sync, whole interval"),
           Goal(key="tpu.ablation.eta4_time_to_target_ratio_ci_high", op="<=", value=RATIO_GOAL,
                why="η = 4 reaches the target in half sync's time, whole interval"),
           Goal(key="tpu.ablation.sync_final_pts_mean", op=">=", value=50.0, why="a task that learns"),
           Goal(key="tpu.ablation.sync_final_pts_mean", op="<=", value=90.0, why="a task that does not saturate"),
           Goal(key="tpu.ablation.v0_pts_spread", op="<=", value=10.0, why="a warm start robust over seeds"),
           Goal(key="tpu.rollout.heavy.async_over_sync", op=">=", value=3.0, why="asynchrony hides tool latency"),
           Goal(key="tpu.rollout.heavy.chip_busy_async", op=">=", value=0.9, why="the chip is kept busy")),
    prefixes=("tpu.ablation.", "tpu.rollout."),
)
def bench_tpu_ablation(ctx: BenchContext) -> BenchResult:
    from bench.tpu import accelerator

    # A quick run's ledger lives and dies with its scratch folder: smoke figures never mix with the chip's runs.
    ledger = ctx.scratch / "ledger.json" if ctx.quick else ctx.plot_dir.parent / LEDGER
    try:
        kind, _ = accelerator()
    except BenchSkipped:  # no chip here: the figures of the chip's ledger, if there is one, are rendered again
        if ctx.quick or not ledger.exists():
            raise
        recorded = json.loads(ledger.read_text())
        if recorded.get("fingerprint") != fingerprint(quick=False):
            raise BenchSkipped(f"{ledger} was measured with another recipe; nothing to render here") from None
        if not recorded["runs"]:
            raise BenchSkipped(f"{ledger} holds no run of this recipe yet; nothing to render here") from None
        ctx.progress(f"{NAME}: no accelerator here: the figures of {ledger} ({recorded['device']}), nothing run")
        return ablation(ctx, device=recorded["device"], ledger_path=ledger, run=False)
    return ablation(ctx, device=kind, ledger_path=ledger)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.tpu_ablation merge COPY [--into LEDGER]``: bring a copy of the ledger that a command wrote
    elsewhere (e.g. ``scripts/tpu_bench.sh``'s DEST on a device's machine) into this checkout's."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench.tpu_ablation", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    merge = commands.add_parser("merge", help="add a ledger copy's runs to this checkout's ledger")
    merge.add_argument("copy", type=Path, help="the copy, e.g. DEST/tpu_ablation_runs.json")
    merge.add_argument("--into", type=Path, default=LEDGER, help=f"the ledger to merge into (default {LEDGER})")
    args = parser.parse_args(argv)
    if not args.copy.is_file():
        parser.error(f"no ledger at {args.copy}")

    def recipe(path: Path) -> dict[str, Any]:
        data = json.loads(path.read_text())
        key = {"fingerprint": data.get("fingerprint"), "device": data.get("device")}
        if None in key.values():
            parser.error(f"{path} is not a {NAME} ledger: it names no fingerprint or device")
        return key

    other = Ledger.load(args.copy, **recipe(args.copy), log=print)
    # Loaded under its own recipe, so that a ledger of another one is refused below, not set aside as stale.
    mine = (Ledger.load(args.into, **recipe(args.into), log=print) if args.into.exists()
            else Ledger(args.into, other.fingerprint, other.device))
    try:
        changes = mine.merge(other)
    except ValueError as err:
        parser.error(str(err))
    for line in changes:
        print(f"{args.into}: {line}")
    mine.save()
    print(f"{args.into}: {len(changes)} change(s) from {args.copy}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
