"""``ConversationAgentBase``: one episode's conversation, kept twice: as messages and as the exact token list.

The token list is the ground truth the engine conditions on and the trainer learns from. It only ever grows by
appending: the rendered initial prompt, then each generation's ids exactly as sampled (loss 1, with the
engine's logprobs and policy versions), then each tool result or env message rendered on its own by the chat
template (loss 0). Nothing is ever re-tokenised. The message list mirrors it for parsers, envs and logs.

Subclasses decide what a response means in ``act``: ``FinalResponse`` (score it with ``env.step``) or
``ToolMessages`` (tool results to append before the next generation). The episode runner
(``pipelines_lib/agents/episode.py``) owns the loop, budgets, deadlines and statuses.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pipelines_lib.agents.parsers import PARSER_REGISTRY, ParserLimits
from pipelines_lib.engine.api import Completion
from pipelines_lib.envs.base import Message, Tool
from pipelines_lib.model.tokenizer import ChatTokenizer
from pipelines_lib.trajectory.schema import ROLES


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    kind: str = "tool"
    """Registry key in ``AGENT_REGISTRY``: ``model`` (one response, scored) or ``tool`` (tool-calling loop)."""
    parser: str = "hermes"
    """Tool-call format, a key of ``PARSER_REGISTRY``; must match what the chat template teaches."""
    tool_failure_ends_episode: bool = False
    """If True a failed tool call (parse error, tool error, timeout) ends the episode with status ``tool_error``;
    by default the failure is just a tool message the model sees and can recover from."""
    max_tool_response_chars: int = 1000
    """Tool output beyond this is cut (with a marker) so one chatty tool cannot eat the context."""
    parser_limits: ParserLimits = field(default_factory=ParserLimits)

    def __post_init__(self) -> None:
        if self.kind not in AGENT_REGISTRY:
            raise ValueError(f"AgentConfig.kind must be one of {sorted(AGENT_REGISTRY)}, got {self.kind!r}")
        if self.parser not in PARSER_REGISTRY:
            raise ValueError(f"AgentConfig.parser must be one of {sorted(PARSER_REGISTRY)}, got {self.parser!r}")
        if self.max_tool_response_chars < 1:
            raise ValueError(f"AgentConfig.max_tool_response_chars must be >= 1, got {self.max_tool_response_chars}")


@dataclass(frozen=True, kw_only=True)
class MessageInfo:
    """What the trajectory's turn records about one appended message."""

    role: str
    tool_name: str | None = None
    latency_s: float | None = None
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class FinalResponse:
    """The response is the agent's answer: the runner scores it with ``env.step``."""

    text: str


@dataclass(frozen=True, kw_only=True)
class ToolMessages:
    """Tool results to append before the next generation."""

    messages: list[Message]
    infos: list[MessageInfo]
    latency_s: float
    """Wall time spent running the tools."""

    @property
    def failed(self) -> bool:
        return any(info.error is not None for info in self.infos)


@dataclass(frozen=True, kw_only=True)
class Segment:
    """Tokens ``[start, end)`` of the sequence and where they came from (becomes a trajectory ``Turn``)."""

    start: int
    end: int
    info: MessageInfo


class ConversationAgentBase(ABC):
    """Per-episode state; ``start`` resets it, so one instance can run episodes one after another."""

    uses_tools: bool = False
    """Whether the prompt offers the env's tools (their schemas go into the system turn)."""

    def __init__(self, config: AgentConfig, tokenizer: ChatTokenizer) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.clear()

    def clear(self) -> None:
        """Forget the current episode."""
        self.tools: dict[str, Tool] = {}
        self.messages: list[Message] = []
        self.tokens: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.policy_versions: list[int] = []
        self.segments: list[Segment] = []
        self.prompt_len = 0

    def start(self, messages: Sequence[Message], tools: Mapping[str, Tool]) -> None:
        """Begin an episode from the env's initial messages: the rendered prompt, one segment per message."""
        if not messages:
            raise ValueError("an episode needs at least one initial message")
        self.clear()
        if self.uses_tools:
            self.tools = dict(tools)
        self.messages = [dict(m) for m in messages]
        schemas = [t.schema() for t in self.tools.values()] or None
        ids = self.tokenizer.render_prompt(self.messages, schemas)
        # Cut at the lengths of the rendered prefixes (messages[:k]); they are token prefixes of the whole
        # for ChatML. If a template breaks that, the prompt is one segment. The generation prompt goes with the
        # last message.
        cuts: list[int] = []
        for k in range(1, len(self.messages)):
            prefix = self.tokenizer.render_ids(self.messages[:k], tools=schemas)
            if ids[: len(prefix)] != prefix:
                cuts = []
                break
            cuts.append(len(prefix))
        roles = [m["role"] for m in self.messages] if cuts or len(self.messages) == 1 else ["user"]
        bounds = [0, *cuts, len(ids)]
        self._append_ids(ids, [
            Segment(start=a, end=b, info=MessageInfo(role=r if r in ROLES else "user"))
            for a, b, r in zip(bounds[:-1], bounds[1:], roles, strict=True)
        ])
        self.prompt_len = len(ids)

    def _append_ids(self, ids: Sequence[int], segments: list[Segment]) -> None:
        self.tokens += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.policy_versions += [-1] * len(ids)
        self.segments += segments

    def clip_prompt(self, limit: int) -> None:
        """Cut a prompt that alone exceeds the sequence budget to ``limit`` tokens (status ``max_tokens``)."""
        if self.prompt_len <= limit or len(self.tokens) != self.prompt_len:
            raise ValueError(f"clip_prompt({limit}) applies only to an over-long prompt with nothing after it")
        del self.tokens[limit:], self.loss_mask[limit:], self.logprobs[limit:], self.policy_versions[limit:]
        self.segments = [Segment(start=s.start, end=min(s.end, limit), info=s.info)
                         for s in self.segments if s.start < limit]
        self.prompt_len = limit

    @property
    def turn_closed(self) -> bool:
        """Whether the sequence ends with a stop id (a generation cut by a length limit does not)."""
        return bool(self.tokens) and self.tokens[-1] in self.tokenizer.stop_ids

    def add_generation(self, completion: Completion, latency_s: float) -> str:
        """Append the sampled ids exactly as returned; returns the response text (without the stop id)."""
        ids = completion.token_ids
        start = len(self.tokens)
        self.tokens += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += completion.logprobs
        self.policy_versions += completion.policy_versions
        self.segments.append(Segment(start=start, end=len(self.tokens),
                                     info=MessageInfo(role="assistant", latency_s=latency_s)))
        body = ids[:-1] if ids and ids[-1] in self.tokenizer.stop_ids else ids
        text = self.tokenizer.decode(body)
        self.messages.append({"role": "assistant", "content": text})
        return text

    def render_messages(self, messages: Sequence[Message], *, add_generation_prompt: bool = True) -> list[list[int]]:
        """Ids each message would add (nothing is appended); an unclosed assistant turn gets its stop id first."""
        out = []
        for k, m in enumerate(messages):
            ids = self.tokenizer.render_message_ids(
                m, add_generation_prompt=add_generation_prompt and k == len(messages) - 1, follows_assistant=k == 0
            )
            if k == 0 and not self.turn_closed:
                ids = [self.tokenizer.stop_ids[0], *ids]
            out.append(ids)
        return out

    def append_messages(self, messages: Sequence[Message], infos: Sequence[MessageInfo], rendered: Sequence[list[int]]) -> None:
        """Append messages with their ``render_messages`` ids (loss 0), one segment each."""
        for m, info, ids in zip(messages, infos, rendered, strict=True):
            start = len(self.tokens)
            self._append_ids(ids, [Segment(start=start, end=start + len(ids), info=info)])
            self.messages.append(dict(m))

    @abstractmethod
    async def act(self, response: str, *, tool_timeout_s: float) -> FinalResponse | ToolMessages:
        """What the response means: a final answer to score, or tool results to feed back."""


AGENT_REGISTRY: dict[str, type[ConversationAgentBase]] = {}


def register_agent(name: str) -> Callable[[type[ConversationAgentBase]], type[ConversationAgentBase]]:
    def deco(cls: type[ConversationAgentBase]) -> type[ConversationAgentBase]:
        if name in AGENT_REGISTRY:
            raise ValueError(f"agent {name!r} is already registered by {AGENT_REGISTRY[name].__qualname__}")
        AGENT_REGISTRY[name] = cls
        return cls

    return deco
