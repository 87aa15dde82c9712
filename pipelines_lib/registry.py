"""The one way a swappable part joins its registry: ``registering(table, kind, name)``.

Each registry is a plain ``name -> class or function`` table owned by the module that defines the kind of part
(``envs.registry``: envs and tools; ``envs.tools.sandbox``: isolation backends; ``train.advantages``: advantage
estimators; ``train.losses``: losses). Configs name parts by these keys and are validated against the table
itself, so there is no second list to drift.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

P = TypeVar("P")


def registering(registry: dict[str, Any], kind: str, name: str, *, set_name: bool = False) -> Callable[[P], P]:
    """Decorator adding a class or function to ``registry`` under ``name`` (refused when the name is taken);
    ``set_name`` also sets the class's ``name`` attribute (envs, tools and backends know their key)."""

    def register(part: P) -> P:
        if name in registry:
            raise ValueError(f"{kind} {name!r} is already registered by {registry[name].__qualname__}")
        if set_name:
            part.name = name  # type: ignore[attr-defined]
        registry[name] = part
        return part

    return register
