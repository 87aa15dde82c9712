"""Records of the evaluate stage: one ``EvalResult`` per evaluated version (``eval/v<N>.json``);
``evaluated_versions`` lists them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pipelines_lib.records.base import Record
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store

# -- eval/v<N>.json ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class EvalResult(Record):
    """Scores of one published version on the held-out split (``evaluate.summarize`` gives the figures)."""

    version: int
    split: str
    temperature: float
    tasks: int
    k: int
    """Sampled attempts per task, besides the greedy one."""
    greedy: dict[str, Any]
    sampled: dict[str, Any] | None = None
    greedy_success_rate: float
    pass_at_k: float | None
    wall_s: float
    generated_tokens: int

    KEY: ClassVar[tuple[str, ...]] = ("version",)

    @classmethod
    def path_of(cls, version: int) -> str:  # type: ignore[override]
        return layout.eval_path(version)


def evaluated_versions(store: Store) -> list[int]:
    return sorted(v for n in store.list(layout.EVAL) if (v := layout.parse_eval_name(n)) is not None)


def versions_to_evaluate(published: Sequence[int], choice: Literal["all", "ends"]) -> list[int]:
    """The published versions ``EvalConfig.versions`` asks for, in order."""
    published = sorted(published)
    return published if choice == "all" or len(published) <= 2 else [published[0], published[-1]]
