"""The asynchronous rollout orchestrator: many episodes in flight over one engine, whole groups out.

```
 tasks ──► group starter ──(admission: engine version >= latest - η)──► G episodes ──► group done
              ▲   (at most max_concurrency episodes in flight)                             │
              │                                                                         group queue
   weight poller: LATEST moved? load in a thread, engine.swap_weights()                       │
   (every weight_poll_s, or at once when the source says so: watch)                           │
                                                                             writer task (one thread at a time)
                              holds a group until every version it sampled is stored (weights.StoredGate)
                                                              the channel's GroupSink: commit by size or age
```

Episodes wait on tools while the engine generates for others, so the engine's slots stay busy. A group is
handed to the writer the moment its last sample finishes, whatever order groups started in. Episode
failures are already statuses (the episode function never raises for them); an unexpected exception in one
is a bug and stops the run, after the groups already finished are flushed.

``mode="sync"`` is the baseline in the same code path: a batch of ``max_concurrency // G`` groups starts
together and the next batch starts only after the slowest trajectory of this one; weights are refreshed
between batches. Put the engine in static mode for lockstep generation as well.

``mode="lockstep"`` makes a worker's groups a function of the seeds alone (a campaign that reproduces bit for bit on
one machine): on each policy version it runs exactly ``max_groups_per_version`` groups, hands them to the writer in
the order they were started and commits them, then waits (at most ``lockstep_wait_s``) until a newer version is
published and loads it. Which version a group samples from, its sampling key (seeded per episode, never by what
else is in flight) and its place in the shard stream no longer depend on timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pipelines_lib import telemetry
from pipelines_lib.engine.api import Engine
from pipelines_lib.envs.base import Task
from pipelines_lib.rollout.config import RolloutConfig
from pipelines_lib.rollout.weights import StoredGate, WeightSource
from pipelines_lib.telemetry.samplers import ThroughputGauges
from pipelines_lib.trajectory.channel import GroupSink, ShardInfo
from pipelines_lib.trajectory.record import Trajectory
from pipelines_lib.trajectory.window import Window, admits, zero_advantage

EpisodeFn = Callable[[Task, str, int], Awaitable[Trajectory]]
"""``(task, group_id, sample_idx) -> Trajectory``; must turn episode failures into statuses itself."""


@dataclass
class RolloutStats:
    groups_started: int = 0
    groups_committed: int = 0
    trajectories: int = 0
    shards: int = 0
    statuses: Counter = field(default_factory=Counter)
    weight_swaps: int = 0
    swap_pause_s: float = 0.0
    """Seconds group starts were held back waiting for fresher weights (admission)."""
    max_in_flight: int = 0
    backpressure_s: float = 0.0
    """Seconds spent holding group starts because this version's group budget was used up."""
    wall_s: float = 0.0
    stop_reason: str = ""
    versions_started: Counter = field(default_factory=Counter)
    commit_hold_s: float = 0.0
    """Seconds the writer held finished groups until the version they sampled from was stored."""
    groups_unstored: int = 0
    """Groups dropped when the run ended because a version they sampled from was never stored."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "groups_started": self.groups_started, "groups_committed": self.groups_committed,
            "trajectories": self.trajectories, "shards": self.shards, "statuses": dict(self.statuses),
            "weight_swaps": self.weight_swaps, "swap_pause_s": round(self.swap_pause_s, 4),
            "max_in_flight": self.max_in_flight, "backpressure_s": round(self.backpressure_s, 3), "wall_s": round(self.wall_s, 3), "stop_reason": self.stop_reason,
            "versions_started": {str(k): v for k, v in sorted(self.versions_started.items())},
            "commit_hold_s": round(self.commit_hold_s, 3), "groups_unstored": self.groups_unstored,
        }


class Orchestrator:
    def __init__(self, *, config: RolloutConfig, engine: Engine, episode_fn: EpisodeFn,
                 tasks: Iterator[tuple[Task, str]], writer: GroupSink, weights: WeightSource | None = None,
                 should_stop: Callable[[], bool] | None = None,
                 on_commit: Callable[[ShardInfo], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, refund_zero_advantage: bool = True) -> None:
        self.config = config
        self.engine = engine
        self.episode_fn = episode_fn
        self.tasks = tasks
        self.writer = writer
        self.weights = weights
        self.should_stop = should_stop
        self.on_commit = on_commit
        self.clock = clock
        # A group the trainer skips (all rewards equal) gives its place in the version's budget back; one it trains on
        # (trainer.skip_zero_advantage: false) keeps it, or the budget would let the worker outrun the trainer.
        self.refund_zero_advantage = refund_zero_advantage
        self.stats = RolloutStats()
        self._latest: int = engine.policy_version
        self._refresh_lock = asyncio.Lock()
        self._in_flight = 0
        self._free_slots = list(range(config.max_concurrency - 1, -1, -1))
        self._budget: dict[int, int] = {}
        self._refunded: Counter = Counter()  # per version: finished groups with all-equal rewards
        self._stopping = asyncio.Event()
        self._moved = asyncio.Event()  # the weight source said latest moved since the last look
        self._gate = StoredGate(weights, poll_s=config.weight_poll_s, hold_timeout_s=config.hold_timeout_s, clock=clock)
        self._gauges = ThroughputGauges(engine, clock=clock)

    # -- weights -----------------------------------------------------------------------------------------
    async def _refresh(self, target: int | None = None) -> None:
        """Load and install the newest weights (blocking only the caller, never the event loop)."""
        if self.weights is None:
            return
        async with self._refresh_lock:
            self._moved.clear()  # before the look: news of a later move wakes the next pause
            latest = await asyncio.to_thread(self.weights.latest)
            if latest is None:
                return
            self._latest = max(self._latest, latest)
            if latest <= self.engine.policy_version or (target is not None and self.engine.policy_version >= target):
                return
            with telemetry.span("weight_swap", track="weights", version=latest):
                params = await asyncio.to_thread(self.weights.load, latest)
                installing = self.engine.swap_weights(params, latest)
                if installing is not None:  # a server reload: done when the new weights serve
                    await installing
            self.stats.weight_swaps += 1

    async def _poll_weights(self) -> None:
        while not self._stopping.is_set():
            await self._refresh()
            await self._pause()

    async def _pause(self) -> None:
        """Wait ``weight_poll_s`` between looks at the weight source, less once the run stops or the source says
        ``latest`` moved."""
        waits = [asyncio.ensure_future(self._stopping.wait()), asyncio.ensure_future(self._moved.wait())]
        try:
            await asyncio.wait(waits, timeout=self.config.weight_poll_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def _admit(self) -> None:
        """Hold a new group until this version's budget allows it (backpressure), then until the engine's weights
        are within η of the latest published version (admission).

        The pointer is read fresh for every group (one small read per G episodes), so the bound holds against
        what storage says now, not against the poller's last look."""
        if self.weights is None:
            return
        latest = await asyncio.to_thread(self.weights.latest)
        if latest is None:
            return
        self._latest = max(self._latest, latest)
        await self._wait_for_budget()
        await self._wait_for_fresh_weights()

    async def _wait_for_budget(self) -> None:
        """Backpressure: at most ``max_groups_per_version`` groups on one version (on the worker's first version,
        ``lead_versions`` budgets more), widened by another budget after ``backpressure_max_wait_s`` without a new
        version (so a budget never stalls the trainer)."""
        step = self.config.max_groups_per_version
        version = self.engine.policy_version
        if step is None:
            return
        first = not self._budget  # the lead is granted once: the worker then stays that many versions ahead
        if self._spent(version) < self._budget.setdefault(version, step * (1 + self.config.lead_versions * first)):
            return
        t0 = self.clock()
        with telemetry.span("backpressure_wait", track="weights", version=version):
            while (self.engine.policy_version == version and not self._stopping.is_set()
                   and self._spent(version) >= self._budget[version]):
                if self.clock() - t0 >= self.config.backpressure_max_wait_s:
                    self._budget[version] += step
                    break
                await self._refresh()
                if self.engine.policy_version == version:
                    await self._pause()
        self.stats.backpressure_s += self.clock() - t0

    async def _wait_for_fresh_weights(self) -> None:
        """η admission: load weights until the engine's version is at least ``latest − η`` (each refresh may
        see a newer latest, which raises the floor)."""
        if admits(self.engine.policy_version, latest=self._latest, eta=self.config.eta):
            return
        t0 = self.clock()
        with telemetry.span("admission_wait", track="weights", latest=self._latest):
            while (not admits(self.engine.policy_version, latest=self._latest, eta=self.config.eta)
                   and not self._stopping.is_set()):
                await self._refresh(target=Window(version=self._latest, eta=self.config.eta).start)
        self.stats.swap_pause_s += self.clock() - t0

    def _spent(self, version: int) -> int:
        """Groups started on ``version`` that count against its budget."""
        return self.stats.versions_started[version] - self._refunded[version]

    # -- stopping ----------------------------------------------------------------------------------------
    def _target_reached(self) -> bool:
        target = self.config.target_groups
        return target is not None and self.stats.groups_started >= target

    async def _poll_stop(self) -> None:
        while not self._stopping.is_set():
            self._gauges.sample(trajectories=self.stats.trajectories)
            if self.should_stop is not None and await asyncio.to_thread(self.should_stop):
                self.stats.stop_reason = self.stats.stop_reason or "done marker"
                self._stopping.set()
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.config.stop_poll_s)

    # -- groups ------------------------------------------------------------------------------------------
    async def _episode(self, task: Task, group_id: str, idx: int) -> Trajectory:
        self._in_flight += 1
        self.stats.max_in_flight = max(self.stats.max_in_flight, self._in_flight)
        telemetry.gauge("episodes_in_flight", self._in_flight)
        slot = self._free_slots.pop() if self._free_slots else self._in_flight
        try:
            with telemetry.on_track(f"slot-{slot:03d}"):
                return await self.episode_fn(task, group_id, idx)
        finally:
            self._free_slots.append(slot)
            self._in_flight -= 1
            telemetry.gauge("episodes_in_flight", self._in_flight)

    async def _group(self, task: Task, group_id: str, done: asyncio.Queue, version: int) -> None:
        await done.put(await self._run_group(task, group_id, version))

    async def _run_group(self, task: Task, group_id: str, version: int) -> list[Trajectory]:
        group = await asyncio.gather(*(self._episode(task, group_id, i) for i in range(self.config.group_size)))
        if self.refund_zero_advantage and zero_advantage([t.reward for t in group]):
            self._refunded[version] += 1
        return list(group)

    async def _write(self, done: asyncio.Queue) -> None:
        """The only code touching the writer: commits groups as they finish, and by age on a trickle."""
        while True:
            timeout = self.writer.next_flush_in()
            try:
                group = await asyncio.wait_for(done.get(), timeout) if timeout is not None else await done.get()
            except TimeoutError:
                group = None
            if group is _FLUSH or group is _COMMIT:
                self._account(await asyncio.to_thread(self.writer.flush))
                if group is _FLUSH:
                    return
                continue
            if group is None:
                self._account(await asyncio.to_thread(self.writer.flush_due))
                continue
            if not await self._gate.admit(group, self._stopping):
                self.stats.groups_unstored += 1
                telemetry.count("groups_unstored")
                continue
            for t in group:
                self.stats.statuses[t.status] += 1
                telemetry.count(f"status.{t.status}")
            self.stats.trajectories += len(group)
            telemetry.gauge("group_queue_depth", done.qsize())
            with telemetry.span("shard_flush", track="writer", group=group[0].group_id):
                self._account(await asyncio.to_thread(self.writer.add_group, group))

    def _account(self, infos: list[ShardInfo]) -> None:
        for info in infos:
            self.stats.shards += 1
            self.stats.groups_committed += info.n_groups
            if self.on_commit is not None:
                self.on_commit(info)

    def _next_task(self) -> tuple[Task, str] | None:
        if self._stopping.is_set() or self._target_reached():
            return None
        try:
            return next(self.tasks)
        except StopIteration:
            self.stats.stop_reason = self.stats.stop_reason or "tasks exhausted"
            return None

    async def _run_async(self, done: asyncio.Queue) -> None:
        slots = asyncio.Semaphore(self.config.max_concurrency // self.config.group_size)
        running: set[asyncio.Task] = set()
        crashed: list[BaseException] = []

        def finished(t: asyncio.Task) -> None:
            running.discard(t)
            slots.release()
            if not t.cancelled() and t.exception() is not None:
                crashed.append(t.exception())  # type: ignore[arg-type]

        try:
            while True:
                await slots.acquire()
                if crashed:  # surface a crashed group at once instead of after the run
                    raise crashed[0]
                if not self._target_reached():  # no admission wait for a group that will not start
                    await self._admit()
                item = self._next_task()
                if item is None:
                    slots.release()
                    break
                self.stats.groups_started += 1
                version = self.engine.policy_version
                self.stats.versions_started[version] += 1
                t = asyncio.create_task(self._group(*item, done, version))
                running.add(t)
                t.add_done_callback(finished)
            if running:
                await asyncio.gather(*running)
            if crashed:  # a group that crashed after the last start, before the wait above
                raise crashed[0]
        finally:
            for t in running:
                t.cancel()

    async def _run_sync(self, done: asyncio.Queue) -> None:
        batch_groups = self.config.max_concurrency // self.config.group_size
        while True:
            await self._refresh()
            batch = []
            for _ in range(batch_groups):
                item = self._next_task()
                if item is None:
                    break
                self.stats.groups_started += 1
                self.stats.versions_started[self.engine.policy_version] += 1
                batch.append(item)
            if not batch:
                return
            await asyncio.gather(*(self._group(task, gid, done, self.engine.policy_version) for task, gid in batch))

    async def _run_lockstep(self, done: asyncio.Queue) -> None:
        """``max_groups_per_version`` groups on each version (at most ``max_concurrency`` episodes at once), handed
        to the writer in start order and committed, then the next version."""
        slots = asyncio.Semaphore(self.config.max_concurrency // self.config.group_size)

        async def run_group(task: Task, group_id: str, version: int) -> list[Trajectory]:
            async with slots:
                return await self._run_group(task, group_id, version)

        while True:
            version = self.engine.policy_version
            batch = []
            while len(batch) < (self.config.max_groups_per_version or 0) and (item := self._next_task()) is not None:
                batch.append(item)
            if not batch:
                return
            self.stats.groups_started += len(batch)
            self.stats.versions_started[version] += len(batch)
            for group in await asyncio.gather(*(run_group(task, gid, version) for task, gid in batch)):
                await done.put(group)
            await done.put(_COMMIT)  # shard boundaries follow the batch, never the writer's clock
            if not await self._next_version(version):
                return

    async def _next_version(self, version: int) -> bool:
        """Load the first version published after ``version``, waiting at most ``lockstep_wait_s``; False when the
        run stops first."""
        if self.weights is None:
            raise ValueError("rollout mode 'lockstep' needs a weight source (it waits for each next version)")
        t0 = self.clock()
        with telemetry.span("lockstep_wait", track="weights", version=version):
            while not self._stopping.is_set():
                await self._refresh()
                if self.engine.policy_version > version:
                    break
                if self.clock() - t0 > self.config.lockstep_wait_s:
                    raise TimeoutError(f"lockstep rollout: no version after v{version} was published within "
                                       f"{self.config.lockstep_wait_s:g}s (rollout.lockstep_wait_s); is the trainer "
                                       f"running?")
                await self._pause()
        self.stats.swap_pause_s += self.clock() - t0
        return self.engine.policy_version > version

    async def run(self) -> RolloutStats:
        t0 = self.clock()
        done: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def wake() -> None:
            # a source may still call it while this run closes its loop: a finished run needs no news
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._moved.set)
                loop.call_soon_threadsafe(self._gate.moved)

        watch = getattr(self.weights, "watch", None)
        unwatch = watch(wake) if watch is not None else None
        writer = asyncio.create_task(self._write(done))
        helpers = [asyncio.create_task(self._poll_stop())]
        if self.config.mode == "async":
            helpers.append(asyncio.create_task(self._poll_weights()))
        runs = {"async": self._run_async, "sync": self._run_sync, "lockstep": self._run_lockstep}
        main = asyncio.create_task(runs[self.config.mode](done))
        try:
            # The writer ends before the run only by failing (it returns on _FLUSH alone). Its error is raised at
            # once: rollouts would otherwise go on, spending the version's budget on groups nobody commits, and the
            # trainer would wait for groups that never come.
            await asyncio.wait({main, writer}, return_when=asyncio.FIRST_COMPLETED)
            if not main.done():
                writer.result()
                raise RuntimeError("the trajectory writer stopped before the rollouts ended")
            await main
            if self._target_reached():
                self.stats.stop_reason = self.stats.stop_reason or "target reached"
        finally:
            main.cancel()  # a no-op once it is done
            await asyncio.gather(main, return_exceptions=True)
            self._stopping.set()
            await done.put(_FLUSH)
            await asyncio.gather(*helpers, return_exceptions=True)
            try:
                await writer
            finally:  # after the writer: a group it holds waits for news that its version was stored
                if unwatch is not None:
                    unwatch()
            self.stats.wall_s = self.clock() - t0
            self.stats.commit_hold_s = self._gate.held_s
        return self.stats


_FLUSH: Any = object()
"""Writer queue sentinel: commit what is buffered and stop."""
_COMMIT: Any = object()
"""Writer queue sentinel: commit what is buffered and go on (lockstep: after each version's groups)."""
