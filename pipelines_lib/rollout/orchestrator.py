"""The asynchronous rollout orchestrator: many episodes in flight over one engine, whole groups out.

```
 tasks ──► group starter ──(admission: engine version >= latest - η)──► G episodes ──► group done
              ▲   (at most max_concurrency episodes in flight)                             │
              │                                                                         group queue
   weight poller: LATEST moved? load in a thread, engine.swap_weights()                       │
                                                                             writer task (one thread at a time)
                                                              the channel's GroupSink: commit by size or age
```

Episodes wait on tools while the engine generates for others, so the engine's slots stay busy. A group is
handed to the writer the moment its last sample finishes, whatever order groups started in. Episode
failures are already statuses (the episode function never raises for them); an unexpected exception in one
is a bug and stops the run, after the groups already finished are flushed.

``mode="sync"`` is the baseline in the same code path: a batch of ``max_concurrency // G`` groups starts
together and the next batch starts only after the slowest trajectory of this one; weights are refreshed
between batches. Put the engine in static mode for lockstep generation as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pipelines_lib import telemetry
from pipelines_lib.engine.api import Engine
from pipelines_lib.envs.base import Task
from pipelines_lib.telemetry.samplers import ThroughputGauges
from pipelines_lib.trajectory.channel import GroupSink
from pipelines_lib.trajectory.record import Trajectory
from pipelines_lib.trajectory.window import Window, admits, zero_advantage
from pipelines_lib.trajectory.writer import ShardInfo, WriterConfig

EpisodeFn = Callable[[Task, str, int], Awaitable[Trajectory]]
"""``(task, group_id, sample_idx) -> Trajectory``; must turn episode failures into statuses itself."""


MAX_CONCURRENCY = 65_536
"""Most episodes one process keeps in flight (rollout or evaluation): beyond this the event loop, not the engine,
is the bottleneck, and a typo such as ``4e11`` would only exhaust memory."""


@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    group_size: int = 4
    """G: samples per prompt; their rewards are normalised together."""
    max_concurrency: int = 16
    """Episodes in flight at once (a multiple of group_size). Enough of them hide tool latency: at least the
    engine's throughput (trajectories/s) × the time an episode spends in flight (generation plus tool calls),
    more for a long-tailed tool, whose slow calls keep their places. The telemetry gauge
    ``engine_active_slots`` below the engine's slots means too few; ``engine_prefix_reuse`` falling as this
    grows means the KV pool cannot keep every conversation's prefix (raise ``engine.num_blocks``)."""
    mode: Literal["async", "sync"] = "async"
    """``async``: groups start whenever episode slots free up; ``sync``: the baseline, a batch of max_concurrency/G groups at a time, the next only after the slowest trajectory."""
    eta: int = 1
    """Staleness bound η: a group starts only on weights no older than latest − η."""
    target_groups: int | None = None
    """Stop after this many groups committed by this worker; None runs until the trainer's done marker."""
    max_groups_per_version: int | None = None
    """Backpressure: this worker starts at most this many groups on one policy version, then waits for the
    next (groups beyond what the trainer consumes per version would only be dropped as stale). A finished group
    whose rewards are all equal gives its place back (``trajectory.window.zero_advantage``): the
    trainer never trains on it (a weak policy's many all-fail groups must not starve the trainer). None: no limit."""
    backpressure_max_wait_s: float = 10.0
    """After waiting this long for a new version, the worker may start another ``max_groups_per_version``
    groups: the trainer may need more groups than expected (e.g. when many have all-equal rewards), and a
    budget must never stall it."""
    weight_poll_s: float = 0.5
    """How often LATEST is checked for new weights."""
    stop_poll_s: float = 1.0
    """How often the trainer's done marker is checked."""
    temperature: float = 1.0
    """Sampling temperature of rollouts (0 = greedy)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 = off)."""
    max_new_tokens: int = 48
    """Per generation call (one assistant turn)."""
    max_tokens: int = 256
    """Per trajectory, prompt included (also capped by the engine's KV-cache length)."""
    episode_timeout_s: float = 120.0
    """Deadline of one episode; past it the sample gets status ``timeout``."""
    tool_timeout_s: float = 10.0
    """Deadline of one tool call; past it the tool result is a timeout error."""
    failure_reward: float = 0.0
    """Reward recorded for a sample that failed (timeout, env error): the group still completes."""
    infra_retries: int = 2
    """Reruns of an episode that failed for an infrastructure reason (sandbox start, a dependency's timeout,
    storage, the engine); one that still fails is recorded as such and its group is kept out of the loss."""
    writer: WriterConfig = field(default_factory=WriterConfig)

    def __post_init__(self) -> None:
        if self.group_size < 2:
            # GRPO's advantage is a sample's reward against its group's: a group of one has no baseline.
            raise ValueError(f"RolloutConfig.group_size must be >= 2, got {self.group_size}")
        if (not self.group_size <= self.max_concurrency <= MAX_CONCURRENCY
                or self.max_concurrency % self.group_size):
            raise ValueError(f"RolloutConfig.max_concurrency must be a multiple of group_size={self.group_size} "
                             f"no larger than {MAX_CONCURRENCY}, got {self.max_concurrency}")
        if not self.temperature >= 0:
            raise ValueError(f"RolloutConfig.temperature must be >= 0, got {self.temperature}")
        if self.mode not in ("async", "sync"):
            raise ValueError(f"RolloutConfig.mode must be 'async' or 'sync', got {self.mode!r}")
        if self.eta < 0:
            raise ValueError(f"RolloutConfig.eta must be >= 0, got {self.eta}")
        if self.max_groups_per_version is not None and self.max_groups_per_version < 1:
            raise ValueError(f"RolloutConfig.max_groups_per_version must be >= 1 or null, got {self.max_groups_per_version}")
        if self.target_groups is not None and self.target_groups < 1:
            raise ValueError(f"RolloutConfig.target_groups must be >= 1 or null, got {self.target_groups}")
        for name in ("weight_poll_s", "stop_poll_s", "episode_timeout_s", "tool_timeout_s", "backpressure_max_wait_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"RolloutConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.infra_retries < 0:
            raise ValueError(f"RolloutConfig.infra_retries must be >= 0, got {self.infra_retries}")
        if self.max_new_tokens < 1 or self.max_tokens < 2:
            raise ValueError(f"RolloutConfig.max_new_tokens/max_tokens too small: {self.max_new_tokens}/{self.max_tokens}")

    @classmethod
    def tiny(cls) -> RolloutConfig:
        return cls(group_size=4, max_concurrency=16, max_new_tokens=40, max_tokens=128,
                   writer=WriterConfig(max_groups=4, max_age_s=2.0))


class WeightSource(Protocol):
    """Where new weights come from (``weights/LATEST`` in a campaign). Both calls run in a worker thread."""

    def latest(self) -> int | None: ...

    def load(self, version: int) -> Any: ...


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "groups_started": self.groups_started, "groups_committed": self.groups_committed,
            "trajectories": self.trajectories, "shards": self.shards, "statuses": dict(self.statuses),
            "weight_swaps": self.weight_swaps, "swap_pause_s": round(self.swap_pause_s, 4),
            "max_in_flight": self.max_in_flight, "backpressure_s": round(self.backpressure_s, 3), "wall_s": round(self.wall_s, 3), "stop_reason": self.stop_reason,
            "versions_started": {str(k): v for k, v in sorted(self.versions_started.items())},
        }


class Orchestrator:
    def __init__(self, *, config: RolloutConfig, engine: Engine, episode_fn: EpisodeFn,
                 tasks: Iterator[tuple[Task, str]], writer: GroupSink, weights: WeightSource | None = None,
                 should_stop: Callable[[], bool] | None = None,
                 on_commit: Callable[[ShardInfo], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.engine = engine
        self.episode_fn = episode_fn
        self.tasks = tasks
        self.writer = writer
        self.weights = weights
        self.should_stop = should_stop
        self.on_commit = on_commit
        self.clock = clock
        self.stats = RolloutStats()
        self._latest: int = engine.policy_version
        self._refresh_lock = asyncio.Lock()
        self._in_flight = 0
        self._free_slots = list(range(config.max_concurrency - 1, -1, -1))
        self._budget: dict[int, int] = {}
        self._refunded: Counter = Counter()  # per version: finished groups with all-equal rewards
        self._stopping = asyncio.Event()
        self._gauges = ThroughputGauges(engine, clock=clock)

    # -- weights -----------------------------------------------------------------------------------------
    async def _refresh(self, target: int | None = None) -> None:
        """Load and install the newest weights (blocking only the caller, never the event loop)."""
        if self.weights is None:
            return
        async with self._refresh_lock:
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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.config.weight_poll_s)

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
        """Backpressure: at most ``max_groups_per_version`` groups on one version, widened by another budget
        after ``backpressure_max_wait_s`` without a new version (so a budget never stalls the trainer)."""
        step = self.config.max_groups_per_version
        version = self.engine.policy_version
        if step is None or self._spent(version) < self._budget.setdefault(version, step):
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
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), self.config.weight_poll_s)
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
        group = await asyncio.gather(*(self._episode(task, group_id, i) for i in range(self.config.group_size)))
        if zero_advantage([t.reward for t in group]):
            self._refunded[version] += 1
        await done.put(list(group))

    async def _write(self, done: asyncio.Queue) -> None:
        """The only code touching the writer: commits groups as they finish, and by age on a trickle."""
        while True:
            timeout = self.writer.next_flush_in()
            try:
                group = await asyncio.wait_for(done.get(), timeout) if timeout is not None else await done.get()
            except TimeoutError:
                group = None
            if group is _FLUSH:
                self._account(await asyncio.to_thread(self.writer.flush))
                return
            if group is None:
                self._account(await asyncio.to_thread(self.writer.flush_due))
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

    async def run(self) -> RolloutStats:
        t0 = self.clock()
        done: asyncio.Queue = asyncio.Queue()
        writer = asyncio.create_task(self._write(done))
        helpers = [asyncio.create_task(self._poll_stop())]
        if self.config.mode == "async":
            helpers.append(asyncio.create_task(self._poll_weights()))
        try:
            await (self._run_async(done) if self.config.mode == "async" else self._run_sync(done))
            if self._target_reached():
                self.stats.stop_reason = self.stats.stop_reason or "target reached"
        finally:
            self._stopping.set()
            await done.put(_FLUSH)
            await asyncio.gather(*helpers, return_exceptions=True)
            await writer
            self.stats.wall_s = self.clock() - t0
        return self.stats


_FLUSH: Any = object()
