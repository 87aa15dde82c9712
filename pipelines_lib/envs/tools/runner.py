"""``run_tool``: the one place where tool exceptions and timeouts become statuses.

Agents call every tool through it, so a misbehaving tool (bad arguments, a crash, a hang) turns into
tool-result text the model sees plus an error kind recorded on the trajectory's turn, never an
exception that kills the episode. Cancellation still propagates (it is not an episode failure), and so does
``InfraError``: an infrastructure failure is not something the model did, so it must not become a tool result
the model learns from (``run_episode`` retries the episode or records it as ``infra_error``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Literal

from pipelines_lib.envs.base import InfraError, Tool, ToolError

ToolErrorKind = Literal["tool_error", "timeout"]


def timeout_text(name: str, timeout_s: float) -> str:
    """The tool result a model sees when a call passes its deadline."""
    return f"Error: tool {name!r} timed out after {timeout_s:g} s"


async def run_tool(
    tool: Tool,
    arguments: dict[str, Any],
    timeout_s: float,
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[str, ToolErrorKind | None, float]:
    """Call ``tool`` with a deadline; returns ``(text, error_kind, latency_s)`` and never raises.

    - success: ``(result, None, latency)``
    - :class:`ToolError`: ``("Error: <message>", "tool_error", latency)``
    - deadline passed: ``("Error: tool '<name>' timed out after <t> s", "timeout", latency)``
    - any other exception (a tool bug): ``("Error: internal error in tool '<name>': <Type>: <msg>",
      "tool_error", latency)``
    - :class:`InfraError` (the tool's infrastructure failed): raised, never a tool result
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    start = clock()
    try:
        text = await asyncio.wait_for(tool(arguments), timeout=timeout_s)
    except ToolError as e:
        return f"Error: {e}", "tool_error", clock() - start
    except TimeoutError:
        return timeout_text(tool.name, timeout_s), "timeout", clock() - start
    except InfraError:
        raise
    except Exception as e:  # a tool bug must not end the episode; it becomes a recorded status
        return (
            f"Error: internal error in tool {tool.name!r}: {type(e).__name__}: {e}",
            "tool_error",
            clock() - start,
        )
    return text, None, clock() - start
