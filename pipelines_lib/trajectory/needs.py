"""``TrainerNeeds``: the limits a group must fit for the trainer to train on it (``trainable`` checks them), and
``ShardLimits``: what any reader accepts of one shard before it decodes it (``codec`` checks them).

A module of its own, free of Arrow: the audit's merging process reads them from ``campaign.json`` and hands them
to the processes that decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_DECODED_BYTES = 256 * 2**20
"""Default largest decoded size of one shard a reader accepts (writers commit at ~32 MiB estimated)."""
MAX_SHARD_ROWS = 16_384
"""Default most rows one shard may declare. Writers commit ``writer.max_groups`` groups (8 by default) of
``group_size`` rows; the reader's per-row work (group runs, membership, per-group checks) is bounded by this."""
FILE_SLACK_BYTES = 2**20
"""A shard file may exceed its decoded size by its IPC framing: schema, footer, per-buffer length prefixes and
padding."""
MAX_METADATA_DEPTH = 8
"""Deepest nesting of a shard's provenance JSON a reader parses (writers write an object of scalars and one list:
depth 2). A deeper document is refused before it is walked."""


@dataclass(frozen=True, kw_only=True)
class ShardLimits:
    """What a reader accepts of one shard, each checked before the costly step it bounds: the file's size before it
    is read, the declared rows and decoded bytes (``codec.declared_sizes``) before it is decoded."""

    max_bytes: int = MAX_DECODED_BYTES
    """Largest decoded size; the file may be ``FILE_SLACK_BYTES`` larger."""
    max_rows: int = MAX_SHARD_ROWS
    max_row_tokens: int | None = None
    """Longest row the reader can use (None: no per-row budget); bounds decoded bytes per declared row."""

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"ShardLimits.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_row_tokens is not None and self.max_row_tokens < 1:
            raise ValueError(f"ShardLimits.max_row_tokens must be >= 1, got {self.max_row_tokens}")

    @property
    def max_file_bytes(self) -> int:
        return self.max_bytes + FILE_SLACK_BYTES


@dataclass(frozen=True, kw_only=True)
class TrainerNeeds:
    """The trainer's limits a group must fit."""

    group_size: int
    """The campaign's G: rows per group."""
    max_tokens: int
    """Longest row the trainer takes: its largest sequence bucket, within the model's ``max_seq_len``."""
    vocab_size: int
    """Token ids must lie in [0, vocab_size)."""
    max_shard_bytes: int = MAX_DECODED_BYTES
    """Largest decoded shard the trainer reads (``TrainerConfig.max_shard_bytes``)."""
    max_shard_rows: int = MAX_SHARD_ROWS
    """Most rows a shard the trainer reads may declare (``TrainerConfig.max_shard_rows``)."""

    @classmethod
    def of(cls, *, group_size: int, seq_buckets: Sequence[int], max_seq_len: int, vocab_size: int,
           max_shard_bytes: int = MAX_DECODED_BYTES, max_shard_rows: int = MAX_SHARD_ROWS) -> TrainerNeeds:
        """The needs of a trainer with these buckets over a model of this context and vocabulary: a bucket past
        the model's positions holds nothing the model can train on."""
        return cls(group_size=group_size, max_tokens=min(seq_buckets[-1], max_seq_len), vocab_size=vocab_size,
                   max_shard_bytes=max_shard_bytes, max_shard_rows=max_shard_rows)

    def __post_init__(self) -> None:
        for name in ("group_size", "max_tokens", "vocab_size", "max_shard_bytes", "max_shard_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainerNeeds.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def limits(self) -> ShardLimits:
        """What the trainer's reader accepts of a shard before decoding it."""
        return ShardLimits(max_bytes=self.max_shard_bytes, max_rows=self.max_shard_rows, max_row_tokens=self.max_tokens)


def limits_of(needs: TrainerNeeds | None) -> ShardLimits:
    """The shard limits of a reader with ``needs`` (None: a tool that reads, not trains: the defaults)."""
    return ShardLimits() if needs is None else needs.limits
