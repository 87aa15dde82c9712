"""``search``: look an entity up in the generated knowledge base (:mod:`pipelines_lib.envs.knowledge`).

Returns the entity's fact line for an exact name, the entries of any names mentioned in the query,
or a "No entry ... Did you mean" line; only malformed arguments raise :class:`ToolError`.
"""

from __future__ import annotations

from typing import Any

from pipelines_lib.envs.base import Tool, require_str_arg
from pipelines_lib.envs.knowledge import KnowledgeBase, KnowledgeConfig
from pipelines_lib.envs.registry import register_tool


@register_tool("search")
class SearchTool(Tool):
    description = "Look up a person, city or country by name."
    parameters = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}

    def __init__(self, *, kb: KnowledgeBase | None = None, config: KnowledgeConfig | None = None) -> None:
        if kb is not None and config is not None:
            raise ValueError("pass either kb or config, not both")
        self.kb = kb if kb is not None else KnowledgeBase.generate(config or KnowledgeConfig())

    async def __call__(self, arguments: dict[str, Any]) -> str:
        return self.kb.search(require_str_arg(arguments, "query", max_len=200))
