"""Agents: turn an engine and an env into trajectories.

- :mod:`.parsers`: tool-call parsers by model family (``PARSER_REGISTRY``), never raising on bad calls.
- :mod:`.base`: ``ConversationAgentBase`` (messages + the exact token list), ``AgentConfig``.
- :mod:`.agents`: ``ModelAgent``, ``ToolAgent``, ``AGENT_REGISTRY``/``make_agent``.
- :mod:`.episode`: ``run_episode``, the strict token-in/token-out loop producing one ``Trajectory``.
"""

from pipelines_lib.agents.agents import ModelAgent, ToolAgent, make_agent
from pipelines_lib.agents.base import AGENT_REGISTRY, AgentConfig, ConversationAgentBase, register_agent
from pipelines_lib.agents.episode import run_episode
from pipelines_lib.agents.parsers import PARSER_REGISTRY, ParseResult, ToolCall, ToolCallError, make_parser

__all__ = [
    "AGENT_REGISTRY",
    "PARSER_REGISTRY",
    "AgentConfig",
    "ConversationAgentBase",
    "ModelAgent",
    "ParseResult",
    "ToolAgent",
    "ToolCall",
    "ToolCallError",
    "make_agent",
    "make_parser",
    "register_agent",
    "run_episode",
]
