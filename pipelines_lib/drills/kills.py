"""Process-kill drills: SIGKILL a stage's process at random moments, restart it, and account for every group.

``KillDrill`` supervises one subprocess at a time: it starts the stage, waits until the process reports
progress (a ``ready`` line: past start-up and compilation), sleeps a seeded random delay, SIGKILLs it, and
starts it again, ``kills`` times; the last start runs to completion. Every output line is timestamped, so the
**resume gap** (DESIGN §7) is measured from the kill to the first progress line of the restarted process.

Two drills use it:

- ``trainer_kill_drill``: the streaming trainer on fixed pre-written shards. Afterwards the final parameters
  must be bit-identical to an uninterrupted run on a copy of the same campaign, and no group may appear in two
  consumption logs (``trained_twice``).
- ``rollout_kill_drill``: ``collect`` with a target group count per start (a restart skips committed groups).
  Afterwards: **lost** = groups of shards whose commit a process acknowledged (its ``committed`` log line) that
  are no longer readable; **duplicated** = group ids committed more than once by the logical worker (its
  restarts skip committed groups, so any repeat is a bug); **partial visible** = non-hidden objects that fail
  to read (a killed writer may only leave hidden temporaries, counted separately as ``orphans``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines_lib.storage import layout
from pipelines_lib.storage.shards import ShardError, read_shard
from pipelines_lib.storage.store import TEMP_MARKER, Store

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class KillRecord:
    kill_at: float
    resumed_at: float | None = None

    @property
    def gap_s(self) -> float | None:
        return None if self.resumed_at is None else round(self.resumed_at - self.kill_at, 3)


@dataclass
class KillDrill:
    """Start, kill and restart ``argv`` until ``done()``; ``ready`` matches a progress line."""

    argv: Callable[[], list[str]]
    """Command of the next start (it may depend on what is already in storage)."""
    ready: re.Pattern[str]
    done: Callable[[], bool]
    kills: int
    seed: int = 0
    max_delay_s: float = 1.5
    start_timeout_s: float = 600.0
    log: Callable[[str], None] = lambda s: None
    records: list[KillRecord] = field(default_factory=list)
    lines: list[tuple[float, str]] = field(default_factory=list)
    starts: int = 0
    completed: bool = False
    """A start after the last kill exited cleanly (the stage finished what it was asked)."""

    def _start(self) -> tuple[subprocess.Popen[str], queue.Queue[tuple[float, str] | None]]:
        env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"), "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(self.argv(), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        lines: queue.Queue[tuple[float, str] | None] = queue.Queue()

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put((time.monotonic(), line.rstrip("\n")))
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        self.starts += 1
        return proc, lines

    def run(self) -> list[KillRecord]:
        rng = random.Random(self.seed)
        while not self.done():
            proc, lines = self._start()
            killing = len(self.records) < self.kills
            kill_at: float | None = None
            deadline = time.monotonic() + self.start_timeout_s
            output: list[str] = []
            while True:
                if kill_at is not None and time.monotonic() >= kill_at:
                    proc.send_signal(signal.SIGKILL)
                    self.records.append(KillRecord(kill_at=time.monotonic()))
                    self.log(f"kill {len(self.records)}/{self.kills} (start {self.starts})")
                    kill_at, killing = None, False
                wait = (kill_at if kill_at is not None else deadline) - time.monotonic()
                try:
                    item = lines.get(timeout=max(0.0, wait))
                except queue.Empty:
                    if kill_at is not None:
                        continue
                    proc.kill()
                    raise TimeoutError(f"{self.argv()[:3]}: no progress in {self.start_timeout_s:.0f}s:\n"
                                       + "\n".join(output[-30:])) from None
                if item is None:
                    break
                t, line = item
                deadline = t + self.start_timeout_s  # "no progress" means no output at all for that long
                output.append(line)
                self.lines.append((t, line))
                if self.ready.search(line):
                    last = self.records[-1] if self.records else None
                    if last is not None and last.resumed_at is None:
                        last.resumed_at = t
                    if killing and kill_at is None:
                        kill_at = time.monotonic() + rng.uniform(0.0, self.max_delay_s)
            code = proc.wait(timeout=60)
            if code not in (0, -signal.SIGKILL):
                raise RuntimeError(f"stage process failed with exit code {code}:\n" + "\n".join(output[-40:]))
            self.completed = code == 0 and len(self.records) >= self.kills
        return self.records


# -- shared checks ----------------------------------------------------------------------------------------

def partial_visible(store: Store) -> tuple[int, int, list[str]]:
    """(unreadable visible objects, hidden temporaries, first few bad paths) over the whole campaign."""
    bad: list[str] = []
    orphans = 0
    for rel in store.walk():
        name = rel.rsplit("/", 1)[-1]
        if name.startswith(".") or TEMP_MARKER in name or "orbax-checkpoint-tmp" in rel:
            orphans += name.startswith(".") and TEMP_MARKER in name
            continue
        try:
            if rel.endswith(".arrow") and rel.startswith(layout.TRAJECTORIES):
                read_shard(store, rel)
            elif rel.endswith(".json") or rel.endswith(".jsonl"):
                text = store.read(rel).decode()
                for chunk in (text.splitlines() if rel.endswith(".jsonl") else [text]):
                    json.loads(chunk)
        except (ShardError, ValueError, UnicodeDecodeError) as e:
            bad.append(f"{rel}: {e}")
    return len(bad), orphans, bad[:5]


def _gaps(records: list[KillRecord]) -> list[float]:
    return [r.gap_s for r in records if r.gap_s is not None]


# -- trainer ----------------------------------------------------------------------------------------------

_TRAIN_SCRIPT = """
import sys
from pipelines_lib.campaign import load_campaign_config
from pipelines_lib.storage.store import Store
from pipelines_lib.train.trainer import train
store = Store(sys.argv[1])
train(store, load_campaign_config(store), log=lambda s: print(s, flush=True))
"""


def drill_trainer_config(max_steps: int) -> Any:
    """A 1-layer model and small batches: steps of a few hundred milliseconds on CPU."""
    from pipelines_lib.config import CampaignConfig
    from pipelines_lib.model.config import ModelConfig

    base = CampaignConfig.tiny()
    model = dataclasses.replace(ModelConfig.tiny(), n_layers=1, d_model=64, n_heads=2, n_kv_heads=1, head_dim=32,
                                d_ff=128)
    return dataclasses.replace(base, model=model, rollout=dataclasses.replace(base.rollout, eta=10_000),
                               trainer=dataclasses.replace(base.trainer, batch_groups=2, max_steps=max_steps,
                                                           publish_every=2, checkpoint_every=3,
                                                           skip_zero_advantage=False, poll_s=0.05, data_timeout_s=30))


def seed_trainer_campaign(url: str, config: Any, n_groups: int) -> Store:
    """init, a random-init v0, and ``n_groups`` synthetic groups in shards of 3."""
    from flax import nnx

    from pipelines_lib.campaign import init_campaign
    from pipelines_lib.model.decoder import Decoder
    from pipelines_lib.publish import publish_weights
    from pipelines_lib.storage.shards import ShardWriter, WriterConfig
    from pipelines_lib.trajectory.synthetic import synthetic_group

    store = Store(url)
    init_campaign(store, config)
    publish_weights(store, Decoder(config.model, rngs=nnx.Rngs(0)), version=0, step=0)
    writer = ShardWriter(store, worker_id="w0", config=WriterConfig(max_groups=3))
    for i in range(n_groups):
        writer.add_group(synthetic_group(prompt_id=f"p{i:03d}", group_size=4, worker_id="w0", policy_version=0,
                                         seed=i, vocab_size=config.model.vocab_size, max_len=60))
    writer.flush()
    return store


def _final_params(store: Store) -> str:
    import jax
    import numpy as np
    from flax import nnx

    from pipelines_lib.model.weights import load_weights

    done = store.read_json(layout.TRAIN_DONE)
    model = load_weights(store.uri(layout.weights_dir(done["version"])))
    return json.dumps([np.asarray(x).tolist() for x in jax.tree.leaves(nnx.state(model, nnx.Param))])


def _consumed(store: Store) -> list[str]:
    return [g["group_id"] for name in store.list("train/consumed")
            for g in store.read_json(f"train/consumed/{name}")["groups"]]


@dataclass(frozen=True, kw_only=True)
class TrainerDrillResult:
    kills: int
    starts: int
    steps: int
    groups_trained: int
    trained_twice: int
    bit_identical: bool
    partial_visible: int
    orphans: int
    resume_gaps_s: tuple[float, ...]
    seconds: float


def trainer_kill_drill(root: Path, *, kills: int, seed: int = 0, max_steps: int | None = None,
                       log: Callable[[str], None] = lambda s: None) -> TrainerDrillResult:
    """Reference run in this process, then the killed run in subprocesses; compare."""
    from pipelines_lib.train.trainer import train

    start = time.monotonic()
    steps = max_steps or 3 * kills + 6  # room for every kill before the run ends
    config = drill_trainer_config(steps)
    n_groups = 2 * steps
    reference = seed_trainer_campaign(str(root / "reference"), config, n_groups)
    train(reference, config, log=lambda s: None)
    killed = seed_trainer_campaign(str(root / "killed"), config, n_groups)
    drill = KillDrill(argv=lambda: [sys.executable, "-c", _TRAIN_SCRIPT, killed.url],
                      ready=re.compile(r"^trainer: step \d+/"), done=lambda: killed.exists(layout.TRAIN_DONE),
                      kills=kills, seed=seed, max_delay_s=0.8, log=log)
    records = drill.run()
    groups = _consumed(killed)
    bad, orphans, _ = partial_visible(killed)
    return TrainerDrillResult(
        kills=len(records), starts=drill.starts, steps=killed.read_json(layout.TRAIN_DONE)["steps"],
        groups_trained=len(groups), trained_twice=len(groups) - len(set(groups)),
        bit_identical=_final_params(killed) == _final_params(reference), partial_visible=bad, orphans=orphans,
        resume_gaps_s=tuple(_gaps(records)), seconds=round(time.monotonic() - start, 1))


# -- rollout worker ---------------------------------------------------------------------------------------

_COLLECT_SCRIPT = """
import sys
from pipelines_lib.campaign import load_campaign_config
from pipelines_lib.rollout.collect import collect
from pipelines_lib.storage.store import Store
store = Store(sys.argv[1])
collect(store, load_campaign_config(store), worker="w", worker_index=0, num_workers=1,
        target_groups=int(sys.argv[2]), log=lambda s: print(s, flush=True))
"""
_COMMITTED = re.compile(r"^rollout (?P<wid>\S+): committed (?P<path>\S+) \((?P<n>\d+) groups")


def drill_rollout_config() -> Any:
    """The tiny campaign with a shard per 2 groups, so kills land between, during and after commits. No trainer
    runs in this drill, so the per-version backpressure is off (it would wait for a version that never comes)."""
    from pipelines_lib.config import CampaignConfig
    from pipelines_lib.storage.shards import WriterConfig

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

    from pipelines_lib.campaign import init_campaign
    from pipelines_lib.dataset import prep
    from pipelines_lib.model.decoder import Decoder
    from pipelines_lib.publish import publish_weights

    start = time.monotonic()
    config = drill_rollout_config()
    store = Store(str(root / "rollout"))
    init_campaign(store, config)
    prep(store, config.dataset)
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
        resume_gaps_s=tuple(_gaps(records)), seconds=round(time.monotonic() - start, 1))


__all__ = ["KillDrill", "KillRecord", "RolloutDrillResult", "TrainerDrillResult", "partial_visible",
           "rollout_kill_drill", "trainer_kill_drill"]
