"""The built-in agents and their registry.

- ``ModelAgent`` (``model``): every response is the answer; the env scores it (and may reply, for multi-turn
  envs). Tools are not offered.
- ``ToolAgent`` (``tool``): the env's tools are offered in the prompt; a response with tool calls (parsed by the
  configured parser) gets one tool message per call, run through ``run_tool`` with a per-call timeout, or one
  error message per malformed call; a response without any call attempt is the final answer.
"""

from __future__ import annotations

import time

from pipelines_lib.agents.base import (
    AGENT_REGISTRY,
    AgentConfig,
    ConversationAgentBase,
    FinalResponse,
    MessageInfo,
    ToolMessages,
    register_agent,
)
from pipelines_lib.agents.parsers import make_parser
from pipelines_lib.envs.base import Message
from pipelines_lib.envs.tools.runner import run_tool
from pipelines_lib.model.tokenizer import ChatTokenizer


def make_agent(config: AgentConfig, tokenizer: ChatTokenizer) -> ConversationAgentBase:
    """A fresh agent of ``config.kind`` (validated against ``AGENT_REGISTRY`` by ``AgentConfig``)."""
    return AGENT_REGISTRY[config.kind](config, tokenizer)


@register_agent("model")
class ModelAgent(ConversationAgentBase):
    async def act(self, response: str, *, tool_timeout_s: float) -> FinalResponse | ToolMessages:
        return FinalResponse(text=response)


@register_agent("tool")
class ToolAgent(ConversationAgentBase):
    uses_tools = True

    def __init__(self, config: AgentConfig, tokenizer: ChatTokenizer) -> None:
        super().__init__(config, tokenizer)
        self.parser = make_parser(config.parser)

    def _clip(self, text: str) -> str:
        limit = self.config.max_tool_response_chars
        return text if len(text) <= limit else f"{text[:limit]}... [{len(text) - limit} more characters cut]"

    async def act(self, response: str, *, tool_timeout_s: float) -> FinalResponse | ToolMessages:
        schemas = {name: tool.parameters for name, tool in self.tools.items()}
        parsed = self.parser.parse(response, schemas, self.config.parser_limits)
        if not parsed.has_calls:
            return FinalResponse(text=response)
        messages: list[Message] = []
        infos: list[MessageInfo] = []
        start = time.perf_counter()
        for call in parsed.tool_calls:
            text, error, latency = await run_tool(self.tools[call.name], call.arguments, tool_timeout_s)
            messages.append({"role": "tool", "name": call.name, "content": self._clip(text)})
            infos.append(MessageInfo(role="tool", tool_name=call.name, latency_s=latency, error=error))
        for err in parsed.errors:
            messages.append({"role": "tool", "name": err.name or "", "content": f"Error: {err.message}"})
            infos.append(MessageInfo(role="tool", tool_name=err.name, latency_s=0.0, error="parse_error"))
        return ToolMessages(messages=messages, infos=infos, latency_s=time.perf_counter() - start)
