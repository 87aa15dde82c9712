"""``TrainerNeeds``: the limits a group must fit for the trainer to train on it (``trainable`` checks them).

A module of its own, free of Arrow: the audit's merging process reads them from ``campaign.json`` and hands them
to the processes that decode.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class TrainerNeeds:
    """The trainer's limits a group must fit."""

    group_size: int
    """The campaign's G: rows per group."""
    max_tokens: int
    """The trainer's largest sequence bucket: longest row it can pad into a batch."""
    vocab_size: int
    """Token ids must lie in [0, vocab_size)."""

    def __post_init__(self) -> None:
        for name in ("group_size", "max_tokens", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainerNeeds.{name} must be >= 1, got {getattr(self, name)}")
