"""Orchestrator logic with injected episodes (real shard writer and store; no model)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
import time
from collections.abc import Callable

import pytest

from pipelines_lib.envs.base import Task
from pipelines_lib.rollout.config import RolloutConfig
from pipelines_lib.rollout.orchestrator import Orchestrator
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.channel import WriterConfig
from pipelines_lib.trajectory.codec import read_shard
from pipelines_lib.trajectory.synthetic import synthetic_group
from pipelines_lib.trajectory.writer import ShardWriter


class VersionedEngine:
    """Only what the orchestrator itself touches: the installed version and weight swaps."""

    max_seq_len = 256

    def __init__(self) -> None:
        self.policy_version = 0
        self.swaps: list[int] = []

    def swap_weights(self, params, version: int) -> None:
        self.policy_version = version
        self.swaps.append(version)


class Publisher:
    """A weight source whose latest version the test moves."""

    def __init__(self) -> None:
        self.version = 0

    def latest(self) -> int:
        return self.version

    def load(self, version: int) -> str:
        time.sleep(0.002)
        return f"params-v{version}"


def tasks(n: int | None = None):
    counter = itertools.count() if n is None else range(n)
    for i in counter:
        yield Task(task_id=f"t{i}", env_name="arithmetic", prompt="q", answer="a"), f"t{i}.e0"


def make_episode(engine: VersionedEngine, latency, log: list, group_size: int = 4):
    async def episode(task: Task, group_id: str, idx: int):
        version = engine.policy_version
        log.append(("start", group_id, idx, version))
        await asyncio.sleep(latency(task, idx))
        g = synthetic_group(prompt_id=group_id, group_size=group_size, worker_id="w0", policy_version=version, seed=idx)
        log.append(("end", group_id, idx, version))
        # Rewards 0, 1, 0, 1: every group is mixed (has an advantage), so none gives its backpressure budget back.
        return dataclasses.replace(g[idx], sample_idx=idx, group_id=group_id, prompt_id=group_id, reward=float(idx % 2))
    return episode


def test_groups_finish_out_of_order_and_all_are_written(tmp_path) -> None:
    store = Store(str(tmp_path / "c"))
    engine, log = VersionedEngine(), []
    # Early groups are slow, later ones fast: completion order differs from start order.
    latency = lambda task, idx: 0.06 if int(task.task_id[1:]) < 2 else 0.005  # noqa: E731
    orch = Orchestrator(config=RolloutConfig(group_size=4, max_concurrency=16, target_groups=8),
                        engine=engine, episode_fn=make_episode(engine, latency, log), tasks=tasks(),
                        writer=ShardWriter(store, worker_id="w0", config=WriterConfig(max_groups=1)))
    stats = asyncio.run(orch.run())
    assert stats.groups_started == 8 and stats.groups_committed == 8 and stats.trajectories == 32
    written = []
    for name in store.list("trajectories/v00000000"):
        table, _ = read_shard(store, f"trajectories/v00000000/{name}")
        written.extend(dict.fromkeys(table.column("group_id").to_pylist()))
    assert sorted(written) == sorted(f"t{i}.e0" for i in range(8))
    assert written.index("t0.e0") > written.index("t2.e0"), "a slow early group must not block later ones"
    assert stats.max_in_flight == 16 and stats.stop_reason == "target reached"


def test_in_flight_episodes_never_exceed_max_concurrency(tmp_path) -> None:
    store = Store(str(tmp_path / "c"))
    engine, log = VersionedEngine(), []
    orch = Orchestrator(config=RolloutConfig(group_size=2, max_concurrency=6),
                        engine=engine, episode_fn=make_episode(engine, lambda t, i: 0.003 * (i + 1), log, group_size=2),
                        tasks=tasks(20), writer=ShardWriter(store, worker_id="w0"))
    stats = asyncio.run(orch.run())
    in_flight = peak = 0
    for kind, *_ in log:
        in_flight += 1 if kind == "start" else -1
        peak = max(peak, in_flight)
    assert peak == 6 == stats.max_in_flight
    assert stats.groups_committed == 20 and stats.stop_reason == "tasks exhausted"


class LoggingPublisher(Publisher):
    def __init__(self) -> None:
        super().__init__()
        self.last_returned = 0

    def latest(self) -> int:
        self.last_returned = self.version
        return self.version


@pytest.mark.parametrize("eta", [0, 1, 2])
def test_no_group_starts_on_weights_older_than_eta(tmp_path, eta: int) -> None:
    store = Store(str(tmp_path / "c"))
    engine, log, pub = VersionedEngine(), [], LoggingPublisher()
    staleness: list[int] = []  # latest version the worker had seen minus its engine version, per group start

    async def episode(task, group_id, idx):
        if idx == 0:
            staleness.append(pub.last_returned - engine.policy_version)
            pub.version += 1  # the trainer publishes about once per group: far faster than any real one
        return await make_episode(engine, lambda t, i: 0.002 * (1 + i), log)(task, group_id, idx)

    # One group in flight at a time: every admission sees exactly one new version per finished group, so
    # whether the bound is *reached* does not depend on how a loaded machine interleaves concurrent groups.
    orch = Orchestrator(config=RolloutConfig(group_size=4, max_concurrency=4, eta=eta, target_groups=30,
                                             weight_poll_s=10.0),
                        engine=engine, episode_fn=episode, tasks=tasks(), weights=pub,
                        writer=ShardWriter(store, worker_id="w0"))
    stats = asyncio.run(orch.run())
    assert stats.groups_committed == 30
    assert max(staleness) == eta  # the bound holds and is reached: swaps happen only when needed
    assert engine.swaps == sorted(engine.swaps) and stats.weight_swaps == len(engine.swaps) > 0
    assert stats.swap_pause_s > 0


class WatchedPublisher(Publisher):
    """A weight source that says when its latest version moved, as an in-process trainer's does."""

    def __init__(self) -> None:
        super().__init__()
        self.watchers: list[Callable[[], None]] = []

    def watch(self, wake: Callable[[], None]) -> Callable[[], None]:
        self.watchers.append(wake)
        return lambda: self.watchers.remove(wake)

    def move(self) -> None:
        self.version += 1
        for wake in list(self.watchers):
            wake()


def test_a_worker_waiting_on_its_budget_takes_a_version_when_its_source_says_latest_moved(tmp_path) -> None:
    store = Store(str(tmp_path / "c"))
    engine, log, pub = VersionedEngine(), [], WatchedPublisher()
    run = make_episode(engine, lambda task, idx: 0.001, log)

    async def episode(task, group_id, idx):
        if idx == 0:  # the trainer publishes 50 ms after each group starts, from a thread of its own
            threading.Timer(0.05, pub.move).start()
        return await run(task, group_id, idx)

    # One group a version: each next group waits for a version, and a look every 30 s would take a minute and more.
    orch = Orchestrator(config=RolloutConfig(group_size=4, max_concurrency=4, max_groups_per_version=1,
                                             backpressure_max_wait_s=60.0, target_groups=3, weight_poll_s=30.0),
                        engine=engine, episode_fn=episode, tasks=tasks(), weights=pub,
                        writer=ShardWriter(store, worker_id="w0"))
    t0 = time.monotonic()
    stats = asyncio.run(orch.run())
    assert time.monotonic() - t0 < 20
    assert stats.groups_committed == 3 and stats.versions_started == {0: 1, 1: 1, 2: 1}
    assert pub.watchers == []  # the run stopped watching when it ended


class HandingOverPublisher(WatchedPublisher):
    """A weight source whose latest version runs ahead of what storage holds, as an in-process trainer's hand-over
    does: ``hand_over`` names a version at once, ``store`` once its write is done."""

    def __init__(self) -> None:
        super().__init__()
        self.stored_version = 0

    def stored(self) -> int:
        return self.stored_version

    def hand_over(self) -> None:
        self.move()

    def store(self) -> None:
        self.stored_version = self.version
        for wake in list(self.watchers):
            wake()


def test_groups_sampled_from_a_version_still_being_stored_are_committed_once_storage_holds_it(tmp_path) -> None:
    store = Store(str(tmp_path / "c"))
    engine, log, pub = VersionedEngine(), [], HandingOverPublisher()
    commits: list[tuple[int, int]] = []  # (shard version, what storage held when it was committed)
    run = make_episode(engine, lambda task, idx: 0.02, log)

    async def episode(task, group_id, idx):
        if group_id == "t1.e0" and idx == 0:  # the trainer hands version 1 over as the second group starts...
            pub.hand_over()
            threading.Timer(1.0, pub.store).start()  # ...and its write takes a second
        return await run(task, group_id, idx)

    orch = Orchestrator(config=RolloutConfig(group_size=4, max_concurrency=4, target_groups=6, weight_poll_s=30.0),
                        engine=engine, episode_fn=episode, tasks=tasks(),
                        weights=pub, writer=ShardWriter(store, worker_id="w0", config=WriterConfig(max_groups=1)),
                        on_commit=lambda info: commits.append((info.version, pub.stored_version)))
    t0 = time.monotonic()
    stats = asyncio.run(orch.run())
    assert engine.swaps == [1] and stats.versions_started[1] > 0  # served from the hand-over...
    assert time.monotonic() - t0 < 10  # ...and woken by it, not by a poll 30 s later
    assert {version for version, _ in commits} == {0, 1}
    assert all(version <= held for version, held in commits)  # ...but committed only once stored
    assert stats.groups_committed == 6 and stats.commit_hold_s > 0.5 and stats.groups_unstored == 0


def test_a_group_whose_version_is_never_stored_is_dropped_when_the_run_ends_and_counted(tmp_path) -> None:
    store = Store(str(tmp_path / "c"))
    engine, log, pub = VersionedEngine(), [], HandingOverPublisher()
    pub.hand_over()  # version 1 handed over; its write never finishes (the trainer died)
    orch = Orchestrator(config=RolloutConfig(group_size=4, max_concurrency=4, target_groups=2, weight_poll_s=0.05,
                                             hold_timeout_s=0.3),
                        engine=engine, episode_fn=make_episode(engine, lambda task, idx: 0.01, log), tasks=tasks(),
                        weights=pub, writer=ShardWriter(store, worker_id="w0", config=WriterConfig(max_groups=1)))
    t0 = time.monotonic()
    stats = asyncio.run(orch.run())
    assert 0.3 <= time.monotonic() - t0 < 10  # each held group waited out hold_timeout_s once the run stopped
    assert stats.versions_started[1] >= 1  # the first group may start on version 0, which η admits
    assert stats.groups_unstored == stats.versions_started[1] and stats.groups_committed == stats.versions_started[0]
    assert not store.list("trajectories/v00000001")


def test_sync_mode_starts_a_batch_only_after_the_slowest(tmp_path) -> None:
    store = Store(str(tmp_path / "c"))
    engine, log = VersionedEngine(), []
    latency = lambda task, idx: 0.05 if idx == 3 else 0.001  # noqa: E731 - one straggler per group
    orch = Orchestrator(config=RolloutConfig(group_size=4, max_concurrency=8, mode="sync"),
                        engine=engine, episode_fn=make_episode(engine, latency, log), tasks=tasks(6),
                        writer=ShardWriter(store, worker_id="w0"))
    stats = asyncio.run(orch.run())
    assert stats.groups_committed == 6
    events = [(k, g) for k, g, *_ in log]
    first_start_batch2 = min(i for i, (k, g) in enumerate(events) if k == "start" and g in ("t2.e0", "t3.e0"))
    last_end_batch1 = max(i for i, (k, g) in enumerate(events) if k == "end" and g in ("t0.e0", "t1.e0"))
    assert first_start_batch2 > last_end_batch1


def test_done_marker_stops_the_worker_and_flushes(tmp_path) -> None:
    store = Store(str(tmp_path / "c"))
    engine, log = VersionedEngine(), []
    orch = Orchestrator(config=RolloutConfig(group_size=4, max_concurrency=8, stop_poll_s=0.05),
                        engine=engine, episode_fn=make_episode(engine, lambda t, i: 0.01, log), tasks=tasks(),
                        writer=ShardWriter(store, worker_id="w0", config=WriterConfig(max_groups=1000)),
                        should_stop=lambda: orch.stats.groups_started >= 5)  # the trainer's marker appears
    stats = asyncio.run(asyncio.wait_for(orch.run(), 60))
    assert stats.stop_reason == "done marker"
    assert stats.groups_committed == stats.groups_started > 0  # everything started was finished and flushed


def test_a_crashing_episode_function_surfaces_after_flushing_finished_groups(tmp_path) -> None:
    store = Store(str(tmp_path / "c"))
    engine, log = VersionedEngine(), []
    inner = make_episode(engine, lambda t, i: 0.001 if t.task_id == "t0" else 0.05, log)

    async def episode(task, group_id, idx):
        if task.task_id == "t3":
            while sum(1 for e in log if e[:2] == ("end", "t0.e0")) < 4:  # t0's group finishes first
                await asyncio.sleep(0.001)
            raise RuntimeError("bug in episode code")
        return await inner(task, group_id, idx)

    orch = Orchestrator(config=RolloutConfig(group_size=4, max_concurrency=16),
                        engine=engine, episode_fn=episode, tasks=tasks(4),
                        writer=ShardWriter(store, worker_id="w0", config=WriterConfig(max_groups=100)))
    with pytest.raises(RuntimeError, match="bug in episode code"):
        asyncio.run(orch.run())
    assert orch.stats.groups_committed >= 1  # t0 finished before the crash and was flushed
    table, _ = read_shard(store, f"trajectories/v00000000/{store.list('trajectories/v00000000')[0]}")
    assert "t0.e0" in table.column("group_id").to_pylist()


def test_backpressure_caps_groups_per_version_until_the_next_publication(tmp_path) -> None:
    store = Store(str(tmp_path / "c"))
    engine, log, pub = VersionedEngine(), [], Publisher()
    started: list[int] = []

    async def episode(task, group_id, idx):
        if idx == 0:
            started.append(engine.policy_version)
        return await make_episode(engine, lambda t, i: 0.002, log)(task, group_id, idx)

    async def trainer() -> None:
        """Publishes the next version only once every group started on this one has finished: slots were free
        all that time, so only the budget kept a fourth group from starting on it."""
        for version in (1, 2, 3):
            while not (started.count(version - 1) >= 3
                       and sum(1 for e in log if e[0] == "end" and e[3] == version - 1) == 4 * started.count(version - 1)):
                await asyncio.sleep(0.001)
            pub.version = version

    async def main():
        orch = Orchestrator(config=RolloutConfig(group_size=4, max_concurrency=16, max_groups_per_version=3,
                                                 target_groups=12, weight_poll_s=0.01),
                            engine=engine, episode_fn=episode, tasks=tasks(), weights=pub,
                            writer=ShardWriter(store, worker_id="w0"))
        stats, _ = await asyncio.gather(orch.run(), trainer())
        return stats

    stats = asyncio.run(asyncio.wait_for(main(), 60))
    assert stats.groups_committed == 12
    assert {v: started.count(v) for v in set(started)} == {0: 3, 1: 3, 2: 3, 3: 3}
    assert stats.backpressure_s > 0


def _four_all_fail_then_mixed(engine: VersionedEngine) -> Callable:
    """Episodes of tasks t0..t3 fail in every sample (zero advantage); t4, t5 are mixed."""
    mixed = make_episode(engine, lambda t, i: 0.002, [])

    async def episode(task, group_id, idx):
        t = await mixed(task, group_id, idx)
        return dataclasses.replace(t, reward=0.0) if int(task.task_id[1:]) < 4 else t

    return episode


def test_groups_with_all_equal_rewards_give_their_backpressure_budget_back(tmp_path) -> None:
    store = Store(str(tmp_path / "c"))
    engine, pub = VersionedEngine(), Publisher()  # nobody publishes, and the budget's wait is long
    # The all-fail groups are the ones the trainer skips (trainer.skip_zero_advantage, the default).
    orch = Orchestrator(config=RolloutConfig(group_size=4, max_concurrency=8, max_groups_per_version=2,
                                             backpressure_max_wait_s=60.0, target_groups=6, weight_poll_s=0.01),
                        engine=engine, episode_fn=_four_all_fail_then_mixed(engine), tasks=tasks(), weights=pub,
                        writer=ShardWriter(store, worker_id="w0"))
    # Without the refund the third group would wait 60 s for a new version; with it, each all-fail group that
    # finishes lets the next one start, and only the two mixed groups spend version 0's budget of 2.
    stats = asyncio.run(asyncio.wait_for(orch.run(), 20))
    assert stats.groups_committed == 6 and stats.versions_started[0] == 6
    assert orch._spent(0) == 2


def test_all_equal_groups_keep_their_budget_when_the_trainer_trains_on_them(tmp_path) -> None:
    # trainer.skip_zero_advantage: false: the trainer consumes every group, so a refund would let the worker run
    # ahead of it (a random model's groups all score 0: every group would give its place back, without end).
    store = Store(str(tmp_path / "c"))
    engine, pub = VersionedEngine(), Publisher()
    orch = Orchestrator(config=RolloutConfig(group_size=4, max_concurrency=8, max_groups_per_version=2,
                                             backpressure_max_wait_s=0.1, target_groups=6, weight_poll_s=0.01),
                        engine=engine, episode_fn=_four_all_fail_then_mixed(engine), tasks=tasks(), weights=pub,
                        writer=ShardWriter(store, worker_id="w0"), refund_zero_advantage=False)
    stats = asyncio.run(asyncio.wait_for(orch.run(), 20))
    assert stats.groups_committed == 6 and orch._spent(0) == 6
    assert stats.backpressure_s >= 0.2  # the budget of 2 widened twice by waiting: no group gave its place back


@pytest.mark.parametrize(("lead", "waits"), [(0, True), (1, False)])
def test_a_worker_leads_by_lead_versions_budgets_on_its_first_version_only(tmp_path, lead: int, waits: bool) -> None:
    # Budget 2 a version; nobody publishes. With a lead of one version the first version's budget is 4: the worker
    # starts its 4 groups at once; without it the third group waits for the budget to widen (0.3 s).
    store = Store(str(tmp_path / "c"))
    engine, log, pub = VersionedEngine(), [], Publisher()
    orch = Orchestrator(config=RolloutConfig(group_size=4, max_concurrency=16, max_groups_per_version=2, eta=1,
                                             lead_versions=lead, backpressure_max_wait_s=0.3, target_groups=4,
                                             weight_poll_s=0.01),
                        engine=engine, episode_fn=make_episode(engine, lambda t, i: 0.001, log), tasks=tasks(),
                        weights=pub, writer=ShardWriter(store, worker_id="w0"))
    stats = asyncio.run(asyncio.wait_for(orch.run(), 30))
    # both end with a budget of 4 on version 0: one granted it up front, the other only after waiting
    assert stats.groups_committed == 4 and orch._budget[0] == 4
    assert (stats.backpressure_s >= 0.3) == waits


def test_backpressure_never_stalls_a_trainer_that_needs_more_groups(tmp_path) -> None:
    store = Store(str(tmp_path / "c"))
    engine, log, pub = VersionedEngine(), [], Publisher()  # nobody publishes: the budget alone must not deadlock
    orch = Orchestrator(config=RolloutConfig(group_size=4, max_concurrency=8, max_groups_per_version=2,
                                             backpressure_max_wait_s=0.05, target_groups=6, weight_poll_s=0.01),
                        engine=engine, episode_fn=make_episode(engine, lambda t, i: 0.001, log), tasks=tasks(),
                        weights=pub, writer=ShardWriter(store, worker_id="w0"))
    stats = asyncio.run(asyncio.wait_for(orch.run(), 30))
    assert stats.groups_committed == 6 and stats.backpressure_s >= 0.1  # two extra budgets were granted


def test_lockstep_commits_each_versions_groups_in_start_order_then_waits_for_the_next_version(tmp_path) -> None:
    store = Store(str(tmp_path / "c"))
    engine, log, pub = VersionedEngine(), [], Publisher()
    # Later groups finish first: the shards must still hold them in the order they started.
    latency = lambda task, idx: 0.03 if int(task.task_id[1:]) % 3 == 0 else 0.002  # noqa: E731
    committed: list[int] = []

    def on_commit(info) -> None:  # the trainer: publishes the next version once a version's groups are in
        committed.append(info.n_groups)
        pub.version += 1

    orch = Orchestrator(config=RolloutConfig(group_size=4, max_concurrency=8, mode="lockstep",
                                             max_groups_per_version=3, weight_poll_s=0.01),
                        engine=engine, episode_fn=make_episode(engine, latency, log), tasks=tasks(9),
                        writer=ShardWriter(store, worker_id="w0", config=WriterConfig(max_groups=8, max_age_s=3600.0)),
                        weights=pub, on_commit=on_commit)
    stats = asyncio.run(orch.run())
    assert committed == [3, 3, 3] and engine.swaps == [1, 2, 3]
    for version in range(3):
        (name,) = store.list(f"trajectories/v{version:08d}")
        table, _ = read_shard(store, f"trajectories/v{version:08d}/{name}")
        assert list(dict.fromkeys(table.column("group_id").to_pylist())) == [f"t{i}.e0" for i in
                                                                            range(3 * version, 3 * version + 3)]
    assert {v for kind, _, _, v in log if kind == "start"} == {0, 1, 2}
    assert stats.stop_reason == "tasks exhausted"


def test_lockstep_fails_naming_the_version_it_waited_past_when_none_comes(tmp_path) -> None:
    engine = VersionedEngine()
    orch = Orchestrator(config=RolloutConfig(group_size=4, max_concurrency=8, mode="lockstep", max_groups_per_version=1,
                                             weight_poll_s=0.01, lockstep_wait_s=0.1),
                        engine=engine, episode_fn=make_episode(engine, lambda t, i: 0.001, []), tasks=tasks(4),
                        writer=ShardWriter(Store(str(tmp_path / "c")), worker_id="w0"), weights=Publisher())
    with pytest.raises(TimeoutError, match=r"no version after v0 was published within 0.1s \(rollout.lockstep_wait_s\)"):
        asyncio.run(orch.run())


class FailingWriter(ShardWriter):
    """A shard writer whose storage refuses every commit."""

    def add_group(self, group):
        raise OSError("no space left on device")


def test_a_failing_writer_stops_the_rollouts_with_its_error(tmp_path) -> None:
    store = Store(str(tmp_path / "c"))
    engine, log, pub = VersionedEngine(), [], Publisher()  # nobody publishes: the budget's wait would be 60 s
    orch = Orchestrator(config=RolloutConfig(group_size=4, max_concurrency=8, max_groups_per_version=2,
                                             backpressure_max_wait_s=60.0, weight_poll_s=0.01),
                        engine=engine, episode_fn=make_episode(engine, lambda t, i: 0.002, log), tasks=tasks(),
                        weights=pub, writer=FailingWriter(store, worker_id="w0"))
    # Endless tasks: without the writer's error ending the run, it would wait on version 0's budget, then start
    # more groups nobody commits, until the 30 s deadline cancelled it (and the flush re-raised the error).
    t0 = time.monotonic()
    with pytest.raises(OSError, match="no space left"):
        asyncio.run(asyncio.wait_for(orch.run(), 30))
    assert time.monotonic() - t0 < 15, "the run went on after its writer failed"
    assert orch.stats.groups_committed == 0 and orch.stats.groups_started <= 4
