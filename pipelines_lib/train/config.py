"""The streaming trainer's config (``trainer:`` in a campaign's YAML): its batches, its writes and its step.

``StreamingTrainer`` (``train.trainer``) runs it; ``memplan`` sizes its device memory from it; ``CampaignConfig``
checks it against the rollout and engine configs it must agree with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipelines_lib.mesh import MeshConfig
from pipelines_lib.train.advantages import ADVANTAGE_ESTIMATORS
from pipelines_lib.train.optim import OptimConfig
from pipelines_lib.train.step import StepConfig
from pipelines_lib.trajectory.needs import MAX_DECODED_BYTES, MAX_SHARD_ROWS


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    """The streaming GRPO trainer (ARCHITECTURE §4, §6). η is ``rollout.eta``: one bound for both sides."""

    batch_groups: int = 4
    """Whole groups per optimizer step."""
    max_steps: int = 100
    """The trainer writes ``train/DONE.json`` after this many steps."""
    checkpoint_every: int = 5
    """Steps between Orbax checkpoints (params, optimiser, RNG, step and tail cursor); the last step always
    checkpoints. A resume replays the logged steps since the newest checkpoint (their publications are stored
    already), so rarer checkpoints cost a resume those steps and a campaign fewer writes (at 0.6B a checkpoint is
    4.8 GB: float32 masters and bfloat16 moments)."""
    publish_every: int = 2
    """Steps between weight publications (a new policy version each time; the last step always publishes)."""
    publish_hf: bool = True
    """Write each version the trainer publishes as a Hugging Face folder too (``weights/v<N>/hf/``), beside the
    Orbax item the JAX engine, evaluation and resumes read: what the vLLM engine serves (``engine.kind: vllm``
    requires it) and what anything outside the project loads. At 0.6B it doubles a version's bytes (1.2 GB more);
    off, ``rollstream export-weights`` writes the HF folder of any version when it is wanted."""
    advantage: str = "grpo"
    """A key of the advantage registry: ``grpo``, ``drgrpo``, ``rloo``."""
    seq_buckets: tuple[int, ...] = (64, 128, 256)
    """Padded sequence lengths of train batches (bounded set: no recompiles per batch)."""
    data_timeout_s: float = 600.0
    """Longest wait for the next group the step can train on before the trainer fails saying what it waited
    for. Groups skipped for all-equal rewards do not end the wait (a collapsed policy fails here)."""
    poll_s: float = 0.5
    """Sleep between polls of storage when data is short (counted as idle time)."""
    skip_zero_advantage: bool = True
    """Leave groups whose advantages are all zero out of the batch (they carry no gradient)."""
    step: StepConfig = field(default_factory=StepConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    seed: int = 0
    """Seed of the trainer's RNG (saved in every checkpoint)."""
    mesh: MeshConfig = field(default_factory=MeshConfig)
    """Devices the trainer spans (``data`` × ``fsdp`` × ``tensor``; default one device). Rows of a step are split
    over ``data`` × ``fsdp``, so ``batch_groups`` × ``group_size`` (÷ ``step.grad_accum_steps``) must divide by it."""
    max_shard_bytes: int = MAX_DECODED_BYTES
    """Largest decoded shard the trainer (and the audit, for this campaign) reads; a larger one is skipped
    unread. Raise it for groups longer than ~20 M tokens."""
    max_shard_rows: int = MAX_SHARD_ROWS
    """Most rows a shard the trainer reads may declare; a shard declaring more is skipped undecoded. Raise it when
    ``rollout.writer.max_groups`` × ``rollout.group_size`` is larger."""

    def __post_init__(self) -> None:
        for name in ("batch_groups", "max_steps", "checkpoint_every", "publish_every", "max_shard_bytes",
                     "max_shard_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainerConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not self.seq_buckets or list(self.seq_buckets) != sorted(set(self.seq_buckets)) or self.seq_buckets[0] < 2:
            raise ValueError(f"TrainerConfig.seq_buckets must be increasing lengths >= 2, got {self.seq_buckets}")
        if self.data_timeout_s <= 0 or self.poll_s <= 0:
            raise ValueError(f"TrainerConfig.data_timeout_s and poll_s must be > 0, got "
                             f"{self.data_timeout_s}, {self.poll_s}")
        if self.advantage not in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"TrainerConfig.advantage must be one of {sorted(ADVANTAGE_ESTIMATORS)}, got {self.advantage!r}")


__all__ = ["TrainerConfig"]
