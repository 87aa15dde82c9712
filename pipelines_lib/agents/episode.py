"""``run_episode``: one task, one agent, one engine -> one ``Trajectory``, strictly token-in/token-out.

The loop::

    prompt ids = render(env.reset(task), tools)                       loss 0
    repeat:
        completion = engine.generate(<all ids so far>)                 loss 1, logprobs, policy versions
        action = agent.act(text of the completion)
        tool calls   -> ids of each tool message rendered alone        loss 0
        final answer -> env.step(text): done, or ids of env messages   loss 0

The engine is always given exactly the recorded token list, so what the trainer scores is what the policy
conditioned on; generated ids are never decoded and re-encoded into the sequence.

Statuses (``pipelines_lib/trajectory/schema.py: STATUSES``):

- ``ok``: the env said done; reward is the env's.
- ``max_turns``: ``env.max_turns`` generations without the env saying done.
- ``max_tokens``: the next generation or message would not fit ``min(engine.max_seq_len, max_tokens)``, a
  generation was cut by that budget, or the engine ran out of context. A prompt longer than the budget is cut to it.
- ``tool_error``: a tool call failed and ``AgentConfig.tool_failure_ends_episode`` is set (otherwise the failure
  is a tool message the model sees and the episode goes on).
- ``env_error``: ``env.reset`` or ``env.step`` raised (a reset failure records the bare task prompt), or
  ``env.step`` continued the episode without a message for the model.
- ``timeout``: ``episode_timeout_s`` passed; the trajectory holds what was done before the deadline.
- ``engine_error``: the engine could not serve a generation (``EngineUnavailableError``: its server died, timed
  out or is restarting); the trajectory holds the turns before it.
- ``infra_error``: a tool or the env raised ``InfraError`` (a sandbox that could not start, a dependency that
  timed out, a storage error inside a tool); ``status_reason`` says what failed.

The last two are infrastructure failures (``INFRA_STATUSES``), not the policy's: ``run_episode`` reruns such an
episode from the start up to ``infra_retries`` times, and a trajectory that still ends in one keeps the failure
and its reason; the trainer leaves its whole group out of the loss.

Rewards: ``ok`` gets the env's final reward; ``max_turns``/``max_tokens`` the last ``env.step`` reward (the env's
running score) or ``failure_reward`` when the env never scored; the failures get ``failure_reward``.
Exceptions from the env become ``env_error`` here and only here (``InfraError``: ``infra_error``), and
``EngineUnavailableError`` becomes ``engine_error``; other exceptions from the engine, the tokenizer or the agent itself are bugs or infrastructure
failures and propagate (the rollout worker decides to restart).

Telemetry (recorded only under ``telemetry.recording``, on the caller's track, see ``pipelines_lib/telemetry``):
an ``episode`` span (group, sample, policy version at the start, status) holding ``env_reset``, one ``generate``
per engine call (turn, tokens, policy version, finish reason; with a ``queue_wait`` child when the engine reports
its queueing time), ``tool_call.<tool>`` per tool run, and ``env_step`` per env call, named ``reward`` when the
env scored the answer and ended the episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from pipelines_lib import telemetry
from pipelines_lib.agents.base import ConversationAgentBase, FinalResponse, MessageInfo, ToolMessages
from pipelines_lib.engine.api import Completion, Engine, EngineUnavailableError, SamplingParams
from pipelines_lib.envs.base import BaseTaskEnv, InfraError, Message, StepResult, Task
from pipelines_lib.model.tokenizer import ChatTokenizer
from pipelines_lib.trajectory.record import Timings, Trajectory, Turn
from pipelines_lib.trajectory.schema import INFRA_STATUSES
from pipelines_lib.utc import utc_now_iso

log = logging.getLogger(__name__)


TimeBucket = Literal["generate_s", "env_s", "reward_s"]


@dataclass(kw_only=True)
class _Phase:
    """One timed phase of a turn; ``bucket`` may change once the phase knows what it was."""

    bucket: TimeBucket
    seconds: float = 0.0


@dataclass(kw_only=True)
class _Outcome:
    """Mutable so a deadline that interrupts the loop keeps what was already decided."""

    clock: Callable[[], float]
    status: str = "ok"
    reason: str | None = None
    """What failed, for an infrastructure failure."""
    reward: float | None = None
    reward_parts: dict[str, float] = field(default_factory=dict)
    generate_s: float = 0.0
    env_s: float = 0.0
    reward_s: float = 0.0

    @contextlib.contextmanager
    def timed(self, bucket: TimeBucket) -> Iterator[_Phase]:
        """Add the enclosed phase's seconds to ``bucket`` (or to the one the phase switched to) when it ends.

        A phase cut short by an exception (the episode's deadline, a bug) adds nothing: the timings stop there."""
        phase = _Phase(bucket=bucket)
        start = self.clock()
        yield phase
        phase.seconds = self.clock() - start
        setattr(self, phase.bucket, getattr(self, phase.bucket) + phase.seconds)

    def scored(self, result: StepResult) -> None:
        self.reward = result.reward
        self.reward_parts = dict(result.reward_parts)

    def infra(self, status: str, err: BaseException) -> None:
        self.status, self.reason = status, f"{type(err).__name__}: {err}"[:500]


def _queue_wait_span(generate_start: float | None, completion: Completion) -> None:
    """Inside the open ``generate`` span: how long the request waited for an engine slot (engines reporting it)."""
    queue_s = completion.timings.get("queue_s")
    end = telemetry.now()
    if generate_start is not None and end is not None and queue_s:
        telemetry.record_span("queue_wait", generate_start, min(generate_start + queue_s, end))


def _tool_spans(action: ToolMessages, act_start: float | None) -> None:
    """One ``tool_call.<tool>`` span per tool that ``agent.act`` ran.

    The agent runs a response's calls one after another and reports each one's latency, so they are laid out
    back to back, ending when ``act`` returned (parsing came before them) and never before it started.
    Malformed calls (``parse_error``) ran nothing and get no span."""
    end = telemetry.now()
    if end is None or act_start is None:
        return
    calls = [info for info in action.infos if info.error != "parse_error"]
    start = max(act_start, end - sum(info.latency_s or 0.0 for info in calls))
    for info in calls:
        stop = min(end, start + (info.latency_s or 0.0))
        tags = {"tool": info.tool_name} | ({"error": info.error} if info.error else {})
        telemetry.record_span(f"tool_call.{info.tool_name}", start, stop, **tags)
        start = stop


@dataclass(kw_only=True)
class _Turns:
    """The turns of one attempt. Each phase (reset, generate, respond) times itself into ``out`` once, records its
    own span, and turns its failures into ``out``'s status; ``None`` from a phase means the episode ended."""

    env: BaseTaskEnv
    task: Task
    agent: ConversationAgentBase
    engine: Engine
    sampling: SamplingParams
    limit: int
    tool_timeout_s: float
    out: _Outcome

    async def run(self) -> None:
        agent, out = self.agent, self.out
        messages = await self._reset()
        if messages is None:
            return
        agent.start(messages, self.env.tools())
        if agent.prompt_len > self.limit:
            agent.clip_prompt(self.limit)
            out.status = "max_tokens"
            return
        for turn in range(self.env.max_turns):
            room = self.limit - len(agent.tokens)
            if room < 1:
                out.status = "max_tokens"
                return
            text = await self._generate(turn, room)
            if text is None:
                return
            reply = await self._respond(turn, text)
            if reply is None:
                return
            if turn == self.env.max_turns - 1:  # nothing would answer these messages
                break
            new_messages, infos = reply
            rendered = agent.render_messages(new_messages)
            if len(agent.tokens) + sum(map(len, rendered)) >= self.limit:  # no room left to generate after them
                out.status = "max_tokens"
                return
            agent.append_messages(new_messages, infos, rendered)
        out.status = "max_turns"

    async def _reset(self) -> list[Message] | None:
        """``env.reset``: the first messages (env time)."""
        with self.out.timed("env_s"):
            try:
                with telemetry.span("env_reset"):
                    return await self.env.reset(self.task)
            except InfraError as err:  # the runner records the bare task prompt
                self.out.infra("infra_error", err)
            except Exception:
                log.warning("env %s: reset(%s) failed", self.env.name, self.task.task_id, exc_info=True)
                self.out.status = "env_error"
        return None

    async def _generate(self, turn: int, room: int) -> str | None:
        """One engine call on exactly the recorded ids, at most ``room`` new ones (generate time; the wait of a call
        the engine could not serve is not). Returns the response text."""
        sampling = dataclasses.replace(self.sampling, max_new_tokens=min(self.sampling.max_new_tokens, room))
        with telemetry.span("generate", turn=turn, prompt_tokens=len(self.agent.tokens)) as gen:
            generate_start = telemetry.now()
            try:
                with self.out.timed("generate_s") as phase:
                    completion = await self.engine.generate(list(self.agent.tokens), sampling)
            except EngineUnavailableError as err:
                log.warning("episode %s: engine unavailable: %s", self.task.task_id, err)
                gen.tags["error"] = str(err)[:200]
                self.out.infra("engine_error", err)
                return None
            gen.tags.update(tokens=len(completion.token_ids), version=completion.policy_version,
                            finish=completion.finish_reason)
            _queue_wait_span(generate_start, completion)
        text = self.agent.add_generation(completion, phase.seconds)
        if completion.finish_reason == "context" or (
            completion.finish_reason == "length" and room < self.sampling.max_new_tokens
            and len(completion.token_ids) == room
        ):
            self.out.status = "max_tokens"
            return None
        return text

    async def _respond(self, turn: int, text: str) -> tuple[list[Message], list[MessageInfo]] | None:
        """The agent acts on the response: its tool calls run, or its final answer goes to ``env.step`` (env time;
        reward time when the env scored the answer). Returns the messages for the model to answer."""
        result: StepResult | None = None
        with self.out.timed("env_s") as phase:
            act_start = telemetry.now()
            try:
                action = await self.agent.act(text, tool_timeout_s=self.tool_timeout_s)
            except InfraError as err:  # a tool's infrastructure failed (``run_tool`` lets only this through)
                self.out.infra("infra_error", err)
                return None
            if isinstance(action, FinalResponse):
                result = await self._env_step(turn, action.text)
                if result is not None and result.done:
                    phase.bucket = "reward_s"
        if isinstance(action, ToolMessages):
            return self._tool_results(action, act_start)
        if result is None or result.done:
            return None
        if not result.messages:  # the env broke its contract: nothing for the model to answer
            self.out.status = "env_error"
            return None
        return list(result.messages), [MessageInfo(role="env") for _ in result.messages]

    async def _env_step(self, turn: int, answer: str) -> StepResult | None:
        """``env.step`` on the final answer; its span is named ``reward`` when the env scored it and ended."""
        try:
            with telemetry.span("env_step", turn=turn) as step:
                result = await self.env.step(answer)
                if result.done:
                    step.name = "reward"
                    step.tags["reward"] = result.reward
        except InfraError as err:
            self.out.infra("infra_error", err)
            return None
        except Exception:
            log.warning("env %s: step failed on task %s", self.env.name, self.task.task_id, exc_info=True)
            self.out.status = "env_error"
            return None
        self.out.scored(result)
        return result

    def _tool_results(self, action: ToolMessages,
                      act_start: float | None) -> tuple[list[Message], list[MessageInfo]] | None:
        """The tools' messages; a failed call ends the episode under ``tool_failure_ends_episode`` (its messages
        kept when they fit)."""
        _tool_spans(action, act_start)
        if action.failed and self.agent.config.tool_failure_ends_episode:
            rendered = self.agent.render_messages(action.messages, add_generation_prompt=False)
            if len(self.agent.tokens) + sum(map(len, rendered)) <= self.limit:
                self.agent.append_messages(action.messages, action.infos, rendered)
            self.out.status = "tool_error"
            return None
        return action.messages, action.infos


async def run_episode(
    *,
    env: BaseTaskEnv,
    task: Task,
    agent: ConversationAgentBase,
    engine: Engine,
    tokenizer: ChatTokenizer,
    sampling: SamplingParams,
    group_id: str,
    sample_idx: int,
    group_size: int,
    worker_id: str,
    episode_timeout_s: float,
    tool_timeout_s: float,
    max_tokens: int,
    failure_reward: float = 0.0,
    queue_s: float = 0.0,
    infra_retries: int = 0,
    clock: Callable[[], float] = time.perf_counter,
) -> Trajectory:
    """Run one episode to a ``Trajectory`` (see the module docstring); env failures become statuses.

    ``sampling.stop_ids`` defaults to the tokenizer's; ``max_tokens`` caps the whole sequence (prompt included);
    ``queue_s`` is how long the episode waited before starting (recorded in the timings). An episode that ends
    in an infrastructure failure (``INFRA_STATUSES``) is run again from the start, at most ``infra_retries``
    times, each attempt with its own ``episode_timeout_s``; the trajectory is the last attempt's.
    """
    if infra_retries < 0:
        raise ValueError(f"run_episode: infra_retries must be >= 0, got {infra_retries}")
    for name, value in (("episode_timeout_s", episode_timeout_s), ("tool_timeout_s", tool_timeout_s),
                        ("max_tokens", max_tokens), ("group_size", group_size)):
        if value <= 0:
            raise ValueError(f"run_episode: {name} must be > 0, got {value}")
    if not 0 <= sample_idx < group_size:
        raise ValueError(f"run_episode: sample_idx must be in [0, {group_size}), got {sample_idx}")
    if not sampling.stop_ids:
        sampling = dataclasses.replace(sampling, stop_ids=tokenizer.stop_ids)
    started_at = utc_now_iso()
    limit = min(engine.max_seq_len, max_tokens)

    def attempt() -> _Turns:
        return _Turns(env=env, task=task, agent=agent, engine=engine, sampling=sampling, limit=limit,
                      tool_timeout_s=tool_timeout_s, out=_Outcome(clock=clock))

    out = await _attempts(attempt, episode_timeout_s=episode_timeout_s, infra_retries=infra_retries,
                          group_id=group_id, sample_idx=sample_idx)
    if not agent.tokens:  # env.reset failed or the deadline passed first: record the bare task prompt
        agent.start([{"role": "user", "content": task.prompt}], {})
        if agent.prompt_len > limit:
            agent.clip_prompt(limit)
    if out.status not in ("ok", "max_turns", "max_tokens"):
        out.reward, out.reward_parts = None, {}
    engine_info = {"engine": type(engine).__name__, "max_seq_len": engine.max_seq_len, "max_tokens": max_tokens,
                   "agent": agent.config.kind, "parser": agent.config.parser, "sampling": dataclasses.asdict(sampling)}
    return Trajectory(
        group_id=group_id,
        prompt_id=group_id,  # the prompt instance (task + epoch): keeps trajectory ids unique
        sample_idx=sample_idx,
        group_size=group_size,
        worker_id=worker_id,
        tokens=list(agent.tokens),
        loss_mask=list(agent.loss_mask),
        logprobs=list(agent.logprobs),
        policy_version=list(agent.policy_versions),
        prompt_len=agent.prompt_len,
        turns=[Turn(role=s.info.role, start=s.start, end=s.end, tool_name=s.info.tool_name,
                    latency_s=s.info.latency_s, error=s.info.error) for s in agent.segments],
        reward=failure_reward if out.reward is None else out.reward,
        reward_parts=out.reward_parts,
        status=out.status,
        timings=Timings(queue_s=queue_s, generate_s=out.generate_s, env_s=out.env_s, reward_s=out.reward_s,
                        started_at=started_at, finished_at=utc_now_iso()),
        env_name=task.env_name,
        task_id=task.task_id,
        tokenizer_hash=tokenizer.tokenizer_hash,
        engine_info=json.dumps(engine_info, sort_keys=True),
        status_reason=out.reason,
    )


async def _attempts(attempt: Callable[[], _Turns], *, episode_timeout_s: float, infra_retries: int,
                    group_id: str, sample_idx: int) -> _Outcome:
    """Run the episode (``attempt`` makes a fresh one), again from the start after an infrastructure failure (at
    most ``infra_retries`` times, each attempt under its own deadline); the last attempt's outcome."""
    for n in range(infra_retries + 1):
        turns = attempt()
        out = turns.out
        turns.agent.clear()
        with telemetry.span("episode", group=group_id, sample=sample_idx, version=turns.engine.policy_version,
                            attempt=n) as episode:
            try:
                async with asyncio.timeout(episode_timeout_s) as deadline:
                    await turns.run()
            except TimeoutError:
                if not deadline.expired():
                    raise
                out.status = "timeout"
            episode.tags["status"] = out.status
        if out.status not in INFRA_STATUSES:
            return out
        log.warning("episode %s/%s: attempt %d of %d failed: %s", group_id, sample_idx, n + 1,
                    infra_retries + 1, out.reason)
    out.reason = f"{out.reason} ({infra_retries + 1} attempt{'s' if infra_retries else ''})"
    return out
