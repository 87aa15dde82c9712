"""Configuration of the JAX inference engine."""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("continuous", "static")


MAX_SLOTS = 16_384
"""Most sequences one engine decodes at once (each holds a KV cache of ``max_seq_len``); serving engines run a
few hundred."""


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Shapes fixed at construction: nothing the engine compiles depends on the requests it serves."""

    num_slots: int = 8
    """Sequences decoded together; the KV cache is preallocated for this many."""
    max_seq_len: int = 256
    """KV-cache length: prompt + completion never exceed it (finish reason ``context``)."""
    prefill_buckets: tuple[int, ...] = (16, 32, 64, 128, 256)
    """Prompt chunks are padded to the smallest bucket that fits; longer prompts are prefilled in
    chunks of the largest bucket. One compilation per bucket, made once."""
    mode: str = "continuous"
    """``continuous``: requests join free slots between decode steps and leave the moment they finish.
    ``static``: a batch is admitted only when every slot is free, decodes until its longest request
    finishes, and all its completions are returned together (the baseline to compare against)."""
    prefix_reuse: bool = False
    """Keep a finished request's keys/values in its slot; a later prompt that extends them (the next
    turn of a conversation) is admitted to that slot and prefills only the new tokens. Weight swaps
    discard retained prefixes. Off by default: the reused rows were computed in different prefill
    chunks, so logits can differ from a fresh prefill by float rounding, which weakens "the same seed
    gives the same tokens whatever else ran before" to "the same up to rounding"."""
    close_timeout_s: float = 60.0
    """How long ``close()`` waits for the compute step in flight before giving up."""

    def __post_init__(self) -> None:
        if not 1 <= self.num_slots <= MAX_SLOTS:
            raise ValueError(f"EngineConfig.num_slots must be in [1, {MAX_SLOTS}], got {self.num_slots}")
        if self.max_seq_len < 2:
            raise ValueError(f"EngineConfig.max_seq_len must be >= 2, got {self.max_seq_len}")
        if not self.prefill_buckets:
            raise ValueError("EngineConfig.prefill_buckets must not be empty")
        if list(self.prefill_buckets) != sorted(set(self.prefill_buckets)) or self.prefill_buckets[0] < 1:
            raise ValueError(
                f"EngineConfig.prefill_buckets must be strictly increasing positive ints, got {self.prefill_buckets}"
            )
        if self.prefill_buckets[-1] > self.max_seq_len:
            raise ValueError(
                f"EngineConfig.prefill_buckets has {self.prefill_buckets[-1]} > max_seq_len={self.max_seq_len}"
            )
        if self.mode not in MODES:
            raise ValueError(f"EngineConfig.mode must be one of {MODES}, got {self.mode!r}")
        if self.close_timeout_s <= 0:
            raise ValueError(f"EngineConfig.close_timeout_s must be > 0, got {self.close_timeout_s}")

    @classmethod
    def tiny(cls) -> EngineConfig:
        """Small slots and buckets for the tiny model on CPU."""
        return cls(num_slots=4, max_seq_len=128, prefill_buckets=(16, 32, 64))

    def bucket_for(self, length: int) -> int:
        """Smallest bucket holding ``length`` tokens (the largest one when none does)."""
        return next((b for b in self.prefill_buckets if b >= length), self.prefill_buckets[-1])
