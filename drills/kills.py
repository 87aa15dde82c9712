"""Process-kill drills: SIGKILL a stage's process at random moments, restart it, and account for every group.

Each drill runs its stage as a subprocess under ``drills/supervisor.py``'s ``KillDrill`` (kills at seeded random
moments after a progress line, optionally armed by a storage probe; resume gaps from the timestamped output):

- ``trainer_kill_drill``: the streaming trainer on fixed pre-written shards. Afterwards the final parameters
  must be bit-identical to an uninterrupted run on a copy of the same campaign, and no group may appear in two
  consumption logs (``trained_twice``). After every kill ``check_publication`` loads what readers of
  ``weights/`` can see: each version LATEST names (its entries and its mirror) and each marked
  ``weights/v<N>/`` must load. With ``at_publish=True`` the kills are armed by ``publish_in_flight`` (the
  trainer is also the publisher), so they land inside the publication sequence: Orbax save, marker, pointer.
- ``rollout_kill_drill``: ``collect`` with a target group count per start (a restart skips committed groups).
  Afterwards: **lost** = groups of shards whose commit a process acknowledged (its ``committed`` log line) that
  are no longer readable; **duplicated** = group ids committed more than once by the logical worker (its
  restarts skip committed groups, so any repeat is a bug); **partial visible** = non-hidden objects that fail
  to read (a killed writer may only leave hidden temporaries, counted separately as ``orphans``).
- ``evaluator_kill_drill``: ``evaluate`` of a version the trainer published. After every kill
  ``eval/v<N>.json`` must be absent or complete; the result of the start that finishes must equal an
  uninterrupted evaluation of the same version on a copy.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drills.supervisor import KillDrill, KillRecord, partial_visible, resume_gaps
from harness.fixtures import consumed_group_ids, final_params, seed_trainer_campaign, small_trainer_config
from pipelines_lib.records import (
    DoneMarker,
    EvalResult,
    Publication,
    RecordError,
    published_versions,
)
from pipelines_lib.storage import layout
from pipelines_lib.storage.errors import StorageError
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.codec import ShardError, read_shard

# -- publication (the trainer is the publisher) --------------------------------------------------------------

_WEIGHTS = posixpath.dirname(layout.WEIGHTS_LATEST)


def _weights_folders(store: Store) -> list[int]:
    return sorted(v for name in store.list(_WEIGHTS) if (v := layout.parse_version_dir(name)) is not None)


def publish_in_flight(store: Store) -> bool:
    """A publication has begun and not finished: the newest ``weights/v<N>/`` has no ``PUBLISHED.json`` yet, or
    LATEST (its newest entry or its mirror ``LATEST.json``) is behind it. The ``arm`` probe of publish kills."""
    folders = _weights_folders(store)
    if not folders:
        return False
    newest = folders[-1]
    if not Publication.exists(store, newest):
        return True
    latest = Publication.latest(store)
    return latest is None or latest.version < newest or Publication.mirror(store).version < newest


def check_publication(store: Store, loaded: set[int]) -> dict[str, Any]:
    """What readers of ``weights/`` can see (after a kill, the killed process gone), and where the kill landed.

    - ``unloadable``: versions named by LATEST (any of its entries, or its mirror) or carrying a marker that do
      not load the way readers load them (``CampaignWeights.load_model``, which requires the marker). Must stay
      empty: LATEST always names a complete version, and no visible version is partial.
    - ``unmarked``: folders without a marker, a killed publication's leftovers. Readers never load them; the
      restarted trainer replays that step and publishes the version again (removing the leftover first).
    - ``landed``: ``save`` (the newest folder is unmarked: Orbax save or model config), ``pointer`` (marked,
      LATEST not moved yet), ``mirror`` (LATEST's entry written, its mirror not yet), ``outside`` (no
      publication was in flight).

    ``loaded`` holds versions already verified and grows with each call: a marked version is never rewritten.
    """
    from pipelines_lib.publish import CampaignWeights

    folders = _weights_folders(store)
    marked = [v for v in folders if Publication.exists(store, v)]
    named = published_versions(store)
    mirror = Publication.mirror(store).version
    weights = CampaignWeights(store)
    unloadable: list[str] = []
    for version in sorted({*marked, *named, mirror} - loaded):
        try:
            weights.load_model(version)
        except Exception as e:  # the failure is the drill's finding, reported with the others
            unloadable.append(f"v{version}: {type(e).__name__}: {e}"[:300])
        else:
            loaded.add(version)
    latest = max(named, default=None)
    newest = folders[-1] if folders else None
    landed = ("outside" if newest is None else "save" if newest not in marked else "pointer" if latest != newest
              else "mirror" if mirror != latest else "outside")
    return {"latest": latest, "mirror": mirror, "marked": len(marked),
            "unmarked": sorted(set(folders) - set(marked)), "unloadable": unloadable, "landed": landed}


# -- trainer ----------------------------------------------------------------------------------------------

_TRAIN_SCRIPT = """
import sys
from pipelines_lib.stages.campaign import load_campaign_config
from pipelines_lib.storage.store import Store
from pipelines_lib.stages.train import train
store = Store(sys.argv[1])
train(store, load_campaign_config(store), log=lambda s: print(s, flush=True))
"""


@dataclass(frozen=True, kw_only=True)
class TrainerDrillResult:
    kills: int
    at_publish: bool
    starts: int
    steps: int
    groups_trained: int
    trained_twice: int
    bit_identical: bool
    partial_visible: int
    orphans: int
    landed: tuple[str, ...]
    """``check_publication``'s ``landed`` after each kill: where in a publication it came."""
    unloadable: int
    """Versions LATEST named or marked that did not load, over the checks after every kill and at the end."""
    leftovers_at_end: int
    """Unmarked weights folders after the run (a publication no restart finished)."""
    resume_gaps_s: tuple[float, ...]
    seconds: float


def trainer_kill_drill(root: Path, *, kills: int, seed: int = 0, max_steps: int | None = None,
                       at_publish: bool = False, log: Callable[[str], None] = lambda s: None) -> TrainerDrillResult:
    """Reference run in this process, then the killed run in subprocesses; compare.

    ``at_publish``: arm each kill when ``publish_in_flight`` holds and kill within 0.05 s (shorter than a publication of
    the drill model on CPU), instead of 0-0.8 s after a step line.
    """
    from pipelines_lib.stages.train import train

    start = time.monotonic()
    steps = max_steps or 3 * kills + 6  # room for every kill before the run ends (a publish every 2 steps)
    config = small_trainer_config(steps)
    n_groups = 2 * steps
    reference = seed_trainer_campaign(str(root / "reference"), config, n_groups)
    train(reference, config, log=lambda s: None)
    killed = seed_trainer_campaign(str(root / "killed"), config, n_groups)
    loaded: set[int] = set()
    drill = KillDrill(argv=lambda: [sys.executable, "-c", _TRAIN_SCRIPT, killed.url],
                      ready=re.compile(r"^trainer: step \d+/"), done=lambda: DoneMarker.exists(killed),
                      kills=kills, seed=seed, max_delay_s=0.05 if at_publish else 0.8,
                      arm=(lambda: publish_in_flight(killed)) if at_publish else None,
                      inspect=lambda: check_publication(killed, loaded), log=log)
    records = drill.run()
    final = check_publication(killed, loaded)
    groups = consumed_group_ids(killed)
    bad, orphans, _ = partial_visible(killed)
    return TrainerDrillResult(
        kills=len(records), at_publish=at_publish, starts=drill.starts,
        steps=DoneMarker.read(killed).steps, groups_trained=len(groups),
        trained_twice=len(groups) - len(set(groups)), bit_identical=final_params(killed) == final_params(reference),
        partial_visible=bad, orphans=orphans, landed=tuple(r.found["landed"] for r in records),
        unloadable=sum(len(r.found["unloadable"]) for r in records) + len(final["unloadable"]),
        leftovers_at_end=len(final["unmarked"]), resume_gaps_s=tuple(resume_gaps(records)),
        seconds=round(time.monotonic() - start, 1))


# -- rollout worker ---------------------------------------------------------------------------------------

_COLLECT_SCRIPT = """
import sys
from pipelines_lib.stages.campaign import load_campaign_config
from pipelines_lib.stages.collect import collect
from pipelines_lib.storage.store import Store
store = Store(sys.argv[1])
collect(store, load_campaign_config(store), worker="w", worker_index=0, num_workers=1,
        target_groups=int(sys.argv[2]), log=lambda s: print(s, flush=True), detail=lambda s: print(s, flush=True))
"""
_COMMITTED = re.compile(r"^rollout (?P<wid>\S+): committed (?P<path>\S+) \((?P<n>\d+) groups")


def drill_rollout_config() -> Any:
    """The tiny campaign with a shard per 2 groups, so kills land between, during and after commits. No trainer
    runs in this drill, so the per-version backpressure is off (it would wait for a version that never comes)."""
    from pipelines_lib.config import CampaignConfig
    from pipelines_lib.trajectory.channel import WriterConfig

    base = CampaignConfig.tiny()
    return dataclasses.replace(base, rollout=dataclasses.replace(
        base.rollout, max_concurrency=8, max_groups_per_version=None, writer=WriterConfig(max_groups=2, max_age_s=1.0)))


def _worker_groups(store: Store, worker: str) -> tuple[list[str], dict[str, list[str]]]:
    """Every group id in this logical worker's shards (with repeats), and shard path -> its group ids."""
    ids: list[str] = []
    by_shard: dict[str, list[str]] = {}
    for vdir in store.list(layout.TRAJECTORIES):
        for name in store.list(f"{layout.TRAJECTORIES}/{vdir}"):
            if name.startswith(f"{worker}."):
                path = f"{layout.TRAJECTORIES}/{vdir}/{name}"
                try:
                    table, _ = read_shard(store, path)
                except ShardError:
                    continue  # counted by partial_visible
                by_shard[path] = table.column("group_id").unique().to_pylist()
                ids.extend(by_shard[path])
    return ids, by_shard


@dataclass(frozen=True, kw_only=True)
class RolloutDrillResult:
    kills: int
    starts: int
    groups_committed: int
    acknowledged_groups: int
    lost: int
    duplicated: int
    partial_visible: int
    orphans: int
    resume_gaps_s: tuple[float, ...]
    seconds: float


def rollout_kill_drill(root: Path, *, kills: int, seed: int = 0, groups_per_start: int = 8,
                       log: Callable[[str], None] = lambda s: None) -> RolloutDrillResult:
    """A tiny campaign (random-init v0), then ``collect`` killed and restarted ``kills`` times."""
    from flax import nnx

    from pipelines_lib.dataset import prep
    from pipelines_lib.model.decoder import Decoder
    from pipelines_lib.publish import publish_weights
    from pipelines_lib.stages.campaign import init_campaign

    start = time.monotonic()
    config = drill_rollout_config()
    store = Store(str(root / "rollout"))
    init_campaign(store, config)
    prep(store, config.dataset, env=config.env)
    publish_weights(store, Decoder(config.model, rngs=nnx.Rngs(0)), version=0, step=0)
    # Every start asks for groups_per_start new groups (a restart skips what earlier starts committed), so a
    # start that is to be killed is still running when its kill comes; the drill ends with the first start
    # after the last kill that finishes on its own.
    drill = KillDrill(argv=lambda: [sys.executable, "-c", _COLLECT_SCRIPT, store.url, str(groups_per_start)],
                      ready=_COMMITTED, done=lambda: drill.completed, kills=kills, seed=seed, max_delay_s=1.0, log=log)
    records = drill.run()
    acknowledged = {m["path"] for _, line in drill.lines if (m := _COMMITTED.search(line))}
    ids, by_shard = _worker_groups(store, "w")
    lost = sum(len(by_shard.get(p, [])) == 0 for p in acknowledged)
    bad, orphans, _ = partial_visible(store)
    return RolloutDrillResult(
        kills=len(records), starts=drill.starts, groups_committed=len(set(ids)),
        acknowledged_groups=sum(len(by_shard.get(p, [])) for p in acknowledged), lost=lost,
        duplicated=sum(n - 1 for n in Counter(ids).values()), partial_visible=bad, orphans=orphans,
        resume_gaps_s=tuple(resume_gaps(records)), seconds=round(time.monotonic() - start, 1))


# -- evaluator --------------------------------------------------------------------------------------------

_EVALUATE_SCRIPT = """
import sys
from pipelines_lib.stages.campaign import load_campaign_config
from pipelines_lib.stages.evaluate import evaluate
from pipelines_lib.storage.layout import eval_path
from pipelines_lib.storage.store import Store
store, version = Store(sys.argv[1]), int(sys.argv[2])
print(f"evaluate: v{version} started", flush=True)
evaluate(store, load_campaign_config(store), version=version)
print(f"evaluate: committed {eval_path(version)}", flush=True)
"""
_EVAL_STARTED = re.compile(r"^evaluate: v\d+ started")
_EVAL_COMMITTED = re.compile(r"^evaluate: committed ")
NOT_DETERMINISTIC = ("wall_s",)
"""Result fields left out of the comparison with the uninterrupted evaluation (timing)."""


def drill_evaluator_config() -> Any:
    """The trainer drill's campaign trained 2 steps (the trainer publishes v1), scoring 8 held-out tasks once
    greedily and twice sampled: a few seconds of evaluation on CPU."""
    from pipelines_lib.evaluate import EvalConfig

    return dataclasses.replace(small_trainer_config(2), eval=EvalConfig(n_tasks=8, samples=2, max_concurrency=16))


def _first(lines: list[tuple[float, str]], pattern: re.Pattern[str], after: float = 0.0) -> float | None:
    return next((t for t, line in lines if t >= after and pattern.search(line)), None)


@dataclass(frozen=True, kw_only=True)
class EvaluatorDrillResult:
    kills: int
    starts: int
    version: int
    eval_file_after_kill: tuple[str, ...]
    """``eval/v<N>.json`` after each kill: ``absent``, ``complete`` (every field of the reference), ``incomplete``
    or ``unreadable``; only the first two are allowed."""
    partial_visible: int
    """Most unreadable visible objects seen at once, over the checks after every kill and at the end."""
    orphans: int
    results_identical: bool
    """The finished evaluation equals the uninterrupted one in every field but ``NOT_DETERMINISTIC``."""
    greedy_identical: bool
    reference_s: float
    """The uninterrupted evaluation, from its ``started`` line to its ``committed`` line."""
    recover_s: float | None
    """From the last kill to the ``committed`` line of the start that finished."""
    resume_gaps_s: tuple[float, ...]
    seconds: float


def evaluator_kill_drill(root: Path, *, kills: int, seed: int = 0,
                         log: Callable[[str], None] = lambda s: None) -> EvaluatorDrillResult:
    """The trainer drill's fixed campaign, trained in this process until the trainer publishes v1, then copied; an
    uninterrupted ``evaluate`` of v1 on the copy (a subprocess, timed), then ``evaluate`` on the original killed
    and restarted ``kills`` times; compare.

    Each kill comes at a uniform moment in the first 80 % of the reference evaluation, counted from the
    ``started`` line (after imports): weight load, engine compile, episodes; so it lands before the commit. A
    killed evaluation leaves nothing to resume: the restart evaluates from scratch, and ``recover_s`` is the
    cost of that.

    What is deterministic, and compared: every result field but ``wall_s``. Greedy episodes decode at
    temperature 0 and sampled ones are seeded by (campaign seed, task, sample index), and the engine's slots have
    fixed shapes, so an episode's logits do not depend on which others share the batch: on one backend with one
    engine config the episodes, and so success rates, pass@k, statuses, turns and token counts, repeat exactly. Not deterministic: ``wall_s`` (timing, left out), and the equality does not carry across backends
    or engine configs (slot count, buckets), where logits may differ in the last bits and flip a greedy token.
    """
    from pipelines_lib.dataset import prep
    from pipelines_lib.stages.train import train

    start = time.monotonic()
    config = drill_evaluator_config()
    store = seed_trainer_campaign(str(root / "evaluator"), config, 2 * config.trainer.max_steps)
    prep(store, config.dataset, env=config.env)
    version = int(train(store, config, log=lambda s: None)["version"])
    shutil.copytree(root / "evaluator", root / "warm")
    shutil.copytree(root / "evaluator", root / "reference")
    warm, reference = Store(str(root / "warm")), Store(str(root / "reference"))
    def argv(target: Store) -> Callable[[], list[str]]:
        return lambda: [sys.executable, "-c", _EVALUATE_SCRIPT, target.url, str(version)]

    # An untimed run first: it fills the persistent compilation cache as the killed starts will find it, so the
    # reference is timed like them. (Timed cold, it ran slower than the starts to be killed, and a kill drawn late in
    # its span could land after the evaluation had committed.)
    KillDrill(argv=argv(warm), ready=_EVAL_STARTED, done=lambda: EvalResult.exists(warm, version), kills=0).run()
    uninterrupted = KillDrill(argv=argv(reference), ready=_EVAL_STARTED, done=lambda: EvalResult.exists(reference, version),
                              kills=0, log=log)
    uninterrupted.run()
    started = _first(uninterrupted.lines, _EVAL_STARTED)
    committed = _first(uninterrupted.lines, _EVAL_COMMITTED)
    if started is None or committed is None:
        raise RuntimeError("the uninterrupted evaluation did not print its started and committed lines:\n"
                           + "\n".join(line for _, line in uninterrupted.lines[-30:]))
    reference_s = committed - started
    expected = EvalResult.read(reference, version).to_dict()

    def inspect() -> dict[str, Any]:
        bad, orphans, _ = partial_visible(store)
        state = "absent"
        if EvalResult.exists(store, version):
            try:
                EvalResult.read(store, version)
                state = "complete"
            except RecordError:
                state = "incomplete"
            except StorageError:
                state = "unreadable"
        return {"eval_file": state, "partial_visible": bad, "orphans": orphans}

    drill = KillDrill(argv=argv(store), ready=_EVAL_STARTED, done=lambda: EvalResult.exists(store, version), kills=kills, seed=seed,
                      max_delay_s=0.8 * reference_s, inspect=inspect, log=log)
    records = drill.run()
    final = inspect()
    got = EvalResult.read(store, version).to_dict()
    done_at = _first(drill.lines, _EVAL_COMMITTED, after=records[-1].kill_at) if records else None

    def deterministic(results: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in results.items() if k not in NOT_DETERMINISTIC}

    return EvaluatorDrillResult(
        kills=len(records), starts=drill.starts, version=version,
        eval_file_after_kill=tuple(r.found["eval_file"] for r in records),
        partial_visible=max(f["partial_visible"] for f in [final, *(r.found for r in records)]),
        orphans=max(f["orphans"] for f in [final, *(r.found for r in records)]),
        results_identical=deterministic(got) == deterministic(expected),
        greedy_identical=got["greedy"] == expected["greedy"], reference_s=round(reference_s, 3),
        recover_s=None if done_at is None else round(done_at - records[-1].kill_at, 3),
        resume_gaps_s=tuple(resume_gaps(records)), seconds=round(time.monotonic() - start, 1))


__all__ = ["NOT_DETERMINISTIC", "EvaluatorDrillResult", "KillDrill", "KillRecord", "RolloutDrillResult",
           "TrainerDrillResult", "check_publication", "evaluator_kill_drill", "partial_visible", "publish_in_flight",
           "rollout_kill_drill", "trainer_kill_drill"]
