"""The env and tool registries: the only module holding them.

Built-in envs and tools register themselves on import of :mod:`pipelines_lib.envs` (which imports
every built-in module), so ``make_env``/``make_tool`` see them whichever module a caller imports.
Configs name envs and tools by these keys; :func:`make_env`/:func:`make_tool` validate against the
registry itself (no separate allow-list to drift).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any, TypeVar

from pipelines_lib.envs.base import BaseTaskEnv, Tool
from pipelines_lib.registry import registering

ENV_REGISTRY: dict[str, type[BaseTaskEnv]] = {}
TOOL_REGISTRY: dict[str, type[Tool]] = {}

C = TypeVar("C", bound=type)


def register_env(name: str) -> Callable[[C], C]:
    """Class decorator: ``@register_env("arithmetic")`` registers the env and sets its ``name``."""
    return registering(ENV_REGISTRY, "env", name, set_name=True)


def register_tool(name: str) -> Callable[[C], C]:
    """Class decorator: ``@register_tool("calculator")`` registers the tool and sets its ``name``."""
    return registering(TOOL_REGISTRY, "tool", name, set_name=True)


def _lookup(kind: str, registry: dict[str, Any], name: str) -> Any:
    if name in registry:
        return registry[name]
    valid = ", ".join(sorted(registry))
    close = difflib.get_close_matches(name, list(registry), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown {kind} {name!r}; valid {kind}s: {valid}{hint}")


def env_class(name: str) -> type[BaseTaskEnv]:
    """The registered env class (for classmethods such as ``generate_tasks``)."""
    return _lookup("env", ENV_REGISTRY, name)


def make_env(name: str, *, sandbox: Any = None, **kwargs: Any) -> BaseTaskEnv:
    """A fresh env instance (one per episode); ``kwargs`` go to the env's constructor, and so does ``sandbox`` (a
    ``PythonSandbox`` shared by a worker's episodes) when the env runs code."""
    cls = env_class(name)
    if sandbox is not None and cls.runs_code:
        kwargs["sandbox"] = sandbox
    return cls(**kwargs)


def make_tool(name: str, **kwargs: Any) -> Tool:
    """A tool instance; ``kwargs`` go to the tool's constructor."""
    return _lookup("tool", TOOL_REGISTRY, name)(**kwargs)
