"""The env/tool contract every agent, rollout worker and evaluator codes against.

An *episode* pairs one :class:`Task` with one fresh :class:`BaseTaskEnv` instance (envs hold
per-episode state, so never share an instance between concurrent episodes)::

    env = make_env(task.env_name)
    messages = await env.reset(task)              # system + user
    while True:                                   # the agent's loop
        text = <policy generates>                 # may contain <tool_call>{...}</tool_call>
        if it is a tool call:
            result, error_kind, latency_s = await run_tool(env.tools()[name], arguments, timeout_s)
            messages += [assistant, {"role": "tool", "name": name, "content": result}]
        else:
            step = await env.step(text)           # a final answer: scored here
            if step.done: break
            messages += [assistant, *step.messages]

Tool calls never reach :meth:`BaseTaskEnv.step`; the agent executes them through the env's own
:class:`Tool` objects (which count calls, so rewards can see whether a tool was used) and turns
failures into tool-result text with :func:`pipelines_lib.envs.tools.runner.run_tool`.

Splits are disjoint by construction: :func:`split_of` hashes a task's canonical key, so a task
lands in the same split whatever the seed; generators draw candidates and keep those of the
requested split (:func:`draw_unique_tasks`).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

Message = dict[str, Any]
"""A chat message: ``{"role": "system"|"user"|"assistant"|"tool", "content": str}`` plus an optional
``"name"`` (the tool's name, on tool results). Assistant messages carry tool calls inline in
``content`` in Hermes style (see :func:`hermes_tool_call`), exactly the text a model generates."""

Split = Literal["train", "heldout"]
SPLITS: tuple[str, ...] = ("train", "heldout")


@dataclass(frozen=True, kw_only=True)
class Task:
    """One problem instance; JSON-able so the prep stage can store it in ``dataset/``."""

    task_id: str
    """Stable id: ``<env_name>-<hash of the canonical key>``; the same task has the same id in every run."""
    env_name: str
    """Registry key of the env that poses and scores this task."""
    prompt: str
    """The user message."""
    answer: str
    """Canonical answer as a string (for the code task: a reference solution)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """JSON-able extras the env needs to score (e.g. the code task's tests)."""

    def to_record(self) -> dict[str, Any]:
        """Plain dict for Arrow/JSON storage; ``meta`` is JSON-encoded so the schema stays flat."""
        return {
            "task_id": self.task_id,
            "env_name": self.env_name,
            "prompt": self.prompt,
            "answer": self.answer,
            "meta": json.dumps(self.meta, sort_keys=True),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Task:
        """Inverse of :meth:`to_record`."""
        return cls(
            task_id=record["task_id"],
            env_name=record["env_name"],
            prompt=record["prompt"],
            answer=record["answer"],
            meta=json.loads(record["meta"]),
        )


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """What the env says about a final (non-tool-call) assistant message."""

    reward: float
    """Scalar reward of the episode so far; the trajectory's reward is the one of the last step."""
    done: bool
    """False when the env continues the conversation (e.g. feedback on failed tests)."""
    reward_parts: dict[str, float] = field(default_factory=dict)
    """Named components for logging (``correct``, ``format``, ``used_tool``, ...)."""
    messages: list[Message] = field(default_factory=list)
    """New env messages (role ``user``) to append when not done."""


class ToolError(Exception):
    """A tool refused or failed; the message is shown to the model as the tool result."""


class InfraError(Exception):
    """An infrastructure failure inside a tool or an env: a sandbox that could not start, a dependency that timed
    out, a storage error. Not the policy's doing: it is never shown to the model; the episode is retried
    (``run_episode``'s budget) and, failing that, recorded as ``infra_error`` with this message as the reason, and
    its group is kept out of the loss. A model error (bad call, wrong arguments, code that raises) is a
    ``ToolError`` or a tool result instead."""


class Tool(ABC):
    """An async function the model may call by name with JSON arguments."""

    name: str
    """Registry key and the name the model uses in its tool calls."""
    description: str
    """One line shown to the model."""
    parameters: dict[str, Any]
    """JSON schema of the arguments object."""

    @abstractmethod
    async def __call__(self, arguments: dict[str, Any]) -> str:
        """Run the tool; raise :class:`ToolError` on bad arguments or failure."""

    def schema(self) -> dict[str, Any]:
        """OpenAI/Hermes-style function schema for the chat template."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def hermes_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The text of one tool call as a model writes it: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def answer_text(answer: str) -> str:
    """A final answer as the built-in envs expect it: ``<answer>...</answer>``."""
    return f"<answer>{answer}</answer>"


def extract_answers(response: str) -> list[str]:
    """Contents of every ``<answer>`` tag in ``response``, stripped; the last one counts."""
    return [m.strip() for m in ANSWER_RE.findall(response)]


def require_str_arg(arguments: dict[str, Any], key: str, *, max_len: int) -> str:
    """Fetch a required string argument, raising :class:`ToolError` text the model can act on."""
    if not isinstance(arguments, dict):
        raise ToolError(f"arguments must be a JSON object, got {type(arguments).__name__}")
    if key not in arguments:
        raise ToolError(f"missing argument {key!r}")
    value = arguments[key]
    if not isinstance(value, str):
        raise ToolError(f"argument {key!r} must be a string, got {type(value).__name__}")
    if len(value) > max_len:
        raise ToolError(f"argument {key!r} is too long ({len(value)} > {max_len} characters)")
    return value


class CountingTool(Tool):
    """Wraps an env-owned tool to count calls within the current episode (for ``used_tool``)."""

    def __init__(self, inner: Tool) -> None:
        self.inner = inner
        self.name = inner.name
        self.description = inner.description
        self.parameters = inner.parameters
        self.calls = 0

    async def __call__(self, arguments: dict[str, Any]) -> str:
        self.calls += 1
        return await self.inner(arguments)


BUILTIN_SOURCE = "builtin:"
"""Prefix of a ``dataset.source`` naming an env's own task generator."""


class BaseTaskEnv(ABC):
    """A task family: generates tasks, poses one per episode, and scores final answers.

    Subclasses set :attr:`system_prompt`, build their tools in ``__init__`` via
    :meth:`_set_tools`, and implement :meth:`generate_tasks`, :meth:`reward` and
    :meth:`_demonstration`. The default :meth:`step` scores once and ends the episode.
    """

    name: ClassVar[str]
    """Registry key, set by :func:`pipelines_lib.envs.registry.register_env`."""
    runs_code: ClassVar[bool] = False
    """Whether the env runs model code in a ``PythonSandbox`` (its constructor then takes ``sandbox``)."""
    config_class: ClassVar[type | None] = None
    """The env's frozen config dataclass, whose instance its constructor takes as ``config`` and ``generate_tasks``
    as ``config``; a campaign sets its fields through ``env.options`` (``envs.spec.EnvSpec``). None: no options."""

    @classmethod
    def dataset_source(cls) -> str:
        """The ``dataset.source`` of this env's own tasks: ``builtin:<name>``, ``generate_tasks`` seeded by ``prep``.
        A campaign on this env reads these, or a file whose rows it scores (``CampaignConfig`` checks which)."""
        return f"{BUILTIN_SOURCE}{cls.name}"
    max_turns: int
    """Most assistant messages (tool calls included) an agent should generate per episode."""
    system_prompt: str

    def __init__(self, *, max_turns: int) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns
        self._tools: dict[str, CountingTool] = {}
        self._task: Task | None = None

    def _set_tools(self, tools: list[Tool]) -> None:
        self._tools = {t.name: CountingTool(t) for t in tools}

    def wrap_tools(self, wrap: Callable[[Tool], Tool]) -> None:
        """Replace each tool by ``wrap(tool)`` (e.g. a latency profile), keeping the call counting."""
        self._set_tools([wrap(t.inner) for t in self._tools.values()])

    def tools(self) -> dict[str, Tool]:
        """The tools of this episode by name (calls through them count toward ``used_tool``)."""
        return dict(self._tools)

    @property
    def task(self) -> Task:
        if self._task is None:
            raise RuntimeError(f"{type(self).__name__}: call reset(task) before using the episode")
        return self._task

    @property
    def tool_calls(self) -> int:
        """Tool calls made through :meth:`tools` since the last :meth:`reset`."""
        return sum(t.calls for t in self._tools.values())

    async def reset(self, task: Task) -> list[Message]:
        """Start an episode; returns the initial messages (system + user)."""
        if task.env_name != self.name:
            raise ValueError(f"task {task.task_id!r} belongs to env {task.env_name!r}, not {self.name!r}")
        self._task = task
        for t in self._tools.values():
            t.calls = 0
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": task.prompt}]

    async def step(self, response: str) -> StepResult:
        """Score a final assistant message (one without a tool call); single-answer envs end here."""
        reward, parts = await self.score(self.task, response)
        return StepResult(reward=reward, done=True, reward_parts=parts)

    async def score(self, task: Task, response: str) -> tuple[float, dict[str, float]]:
        """Async scoring used by :meth:`step`; adds ``used_tool`` to :meth:`reward`'s parts.

        Envs whose scoring awaits the outside world (the code sandbox) override this.
        """
        reward, parts = self.reward(task, response)
        return reward, {**parts, "used_tool": float(self.tool_calls > 0)}

    @abstractmethod
    def reward(self, task: Task, response: str) -> tuple[float, dict[str, float]]:
        """Reward of a final answer and its named parts; pure in (task, response)."""

    @classmethod
    @abstractmethod
    def generate_tasks(cls, *, seed: int, n: int, split: str, config: Any = None) -> list[Task]:
        """``n`` distinct tasks of ``split`` ("train" | "heldout"), deterministic by ``seed``.

        ``config`` is the env's own frozen config class (its ``tiny()``/defaults when None).
        """

    def demonstration(self, task: Task, *, error_rate: float = 0.0, seed: int = 0) -> list[Message]:
        """The ideal conversation for ``task`` (system, user, tool calls, tool results, answer).

        With ``error_rate`` > 0 a deterministic share of tasks (chosen by hashing ``seed`` and the
        task id) gets a flawed demonstration that scores 0 (wrong tool input, wrong copy, ...), so a
        policy warm-started on them is decent but far from perfect.
        """
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error_rate must be in [0, 1], got {error_rate}")
        rng = random.Random(f"{seed}/{task.task_id}")
        corrupt = rng.random() < error_rate
        head: list[Message] = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": task.prompt},
        ]
        return head + self._demonstration(task, corrupt=corrupt, rng=rng)

    @abstractmethod
    def _demonstration(self, task: Task, *, corrupt: bool, rng: random.Random) -> list[Message]:
        """Messages after the user prompt; flawed (reward 0) when ``corrupt``."""


def split_of(key: str, *, heldout_fraction: float) -> str:
    """Which split a task with canonical ``key`` belongs to; independent of any seed."""
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
    return "heldout" if h < heldout_fraction else "train"


def task_id_for(env_name: str, key: str) -> str:
    return f"{env_name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def draw_unique_tasks(
    *,
    env_name: str,
    seed: int,
    n: int,
    split: str,
    heldout_fraction: float,
    draw: Callable[[random.Random], tuple[str, Callable[[], Task]]],
    max_draws: int | None = None,
) -> list[Task]:
    """Draw ``(key, build)`` candidates until ``n`` distinct keys of ``split`` are found.

    ``build()`` makes the task (only for accepted keys: building may be costly) and must give it
    ``task_id_for(env_name, key)``; it must not use the draw's RNG, so rejected candidates and
    accepted ones consume the same random numbers. Raises when the split's task space looks
    exhausted (too many fruitless draws).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(f"{env_name}/{split}/{seed}")
    budget = max_draws if max_draws is not None else 50 * n + 1000
    seen: set[str] = set()
    tasks: list[Task] = []
    for _ in range(budget):
        if len(tasks) == n:
            break
        key, build = draw(rng)
        if key in seen or split_of(key, heldout_fraction=heldout_fraction) != split:
            continue
        seen.add(key)
        tasks.append(build())
    if len(tasks) < n:
        raise ValueError(
            f"{env_name}: found only {len(tasks)} distinct {split} tasks of {n} requested; "
            "widen the env config's task space"
        )
    return tasks
