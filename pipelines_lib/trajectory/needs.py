"""``TrainerNeeds``: the limits a group must fit for the trainer to train on it (``trainable`` checks them).

A module of its own, free of Arrow: the audit's merging process reads them from ``campaign.json`` and hands them
to the processes that decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class TrainerNeeds:
    """The trainer's limits a group must fit."""

    group_size: int
    """The campaign's G: rows per group."""
    max_tokens: int
    """Longest row the trainer takes: its largest sequence bucket, within the model's ``max_seq_len``."""
    vocab_size: int
    """Token ids must lie in [0, vocab_size)."""

    @classmethod
    def of(cls, *, group_size: int, seq_buckets: Sequence[int], max_seq_len: int, vocab_size: int) -> TrainerNeeds:
        """The needs of a trainer with these buckets over a model of this context and vocabulary: a bucket past
        the model's positions holds nothing the model can train on."""
        return cls(group_size=group_size, max_tokens=min(seq_buckets[-1], max_seq_len), vocab_size=vocab_size)

    def __post_init__(self) -> None:
        for name in ("group_size", "max_tokens", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainerNeeds.{name} must be >= 1, got {getattr(self, name)}")
