"""``RolloutConfig``: a rollout worker's budgets, sampling, mode and staleness bound (``rollout:`` in a campaign config;
the orchestrator in ``rollout.orchestrator`` runs it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipelines_lib.trajectory.channel import WriterConfig

MAX_CONCURRENCY = 65_536
"""Most episodes one process keeps in flight (rollout or evaluation): beyond this the event loop, not the engine,
is the bottleneck, and a typo such as ``4e11`` would only exhaust memory."""


@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    group_size: int = 4
    """G: samples per prompt; their rewards are normalised together."""
    max_concurrency: int = 16
    """Episodes in flight at once (a multiple of group_size). Enough of them hide tool latency: at least the
    engine's throughput (trajectories/s) × the time an episode spends in flight (generation plus tool calls),
    more for a long-tailed tool, whose slow calls keep their places. The telemetry gauge
    ``engine_active_slots`` below the engine's slots means too few; ``engine_prefix_reuse`` falling as this
    grows means the KV pool cannot keep every conversation's prefix (raise ``engine.num_blocks``)."""
    mode: Literal["async", "sync", "lockstep"] = "async"
    """``async``: groups start whenever episode slots free up; ``sync``: the baseline, a batch of max_concurrency/G groups at a time, the next only after the slowest trajectory;
    ``lockstep``: reproducible, ``max_groups_per_version`` groups per version committed in start order, then a wait
    for the next version (module docstring; ``CampaignConfig.lockstep()`` sets the rest of a campaign up for it)."""
    eta: int = 1
    """Staleness bound η: a group starts only on weights no older than latest − η."""
    target_groups: int | None = None
    """Stop after this many groups committed by this worker; None runs until the trainer's done marker."""
    max_groups_per_version: int | None = None
    """Backpressure: this worker starts at most this many groups on one policy version, then waits for the
    next (groups beyond what the trainer consumes per version would only be dropped as stale). A finished group
    whose rewards are all equal gives its place back (``trajectory.window.zero_advantage``) when the trainer never
    trains on it (``trainer.skip_zero_advantage``; a weak policy's many all-fail groups must not starve the
    trainer). None: no limit.
    In ``lockstep`` mode: exactly this many groups per version, none given back."""
    lead_versions: int = 0
    """How many versions' worth of groups (``max_groups_per_version`` each) a worker may start on its first version
    beyond that version's own, at most ``eta``: it then stays that far ahead of the trainer, so that the groups the
    trainer takes while a new version is being stored come from the versions before it (staleness up to
    ``lead_versions``) instead of waiting for it (a worker takes a version only once ``weights/LATEST`` names it).
    0: each version's groups wait for that version. Needs ``max_groups_per_version``; not in ``lockstep`` mode."""
    lockstep_wait_s: float = 600.0
    """``lockstep`` only: the longest wait for the next version after a version's groups are committed; past it the
    worker fails saying which version it waited for."""
    backpressure_max_wait_s: float = 10.0
    """After waiting this long for a new version, the worker may start another ``max_groups_per_version``
    groups: the trainer may need more groups than expected (e.g. when many have all-equal rewards), and a
    budget must never stall it."""
    swap_at_hand_over: bool = True
    """Colocated placement: take a version the moment the trainer hands it over, while it is still being written,
    instead of once ``weights/LATEST`` names it; groups sampled from it are held in memory and committed once the
    pointer names it, so nothing in storage ever names a version that is not stored (a crash loses only those held
    groups). Rollouts then run while a version is written rather than after. No effect in separate placement."""
    hold_timeout_s: float = 60.0
    """Once a worker stops, how long a finished group it holds (``swap_at_hand_over``) still waits for the version
    it sampled from to be stored; past it the group is dropped and counted (``groups_unstored``), as a crash would
    lose it. Until the worker stops a group waits as long as the version's write takes."""
    weight_poll_s: float = 0.5
    """How often LATEST is checked for new weights (in colocated placement also at once when the trainer moves it)."""
    stop_poll_s: float = 1.0
    """How often the trainer's done marker is checked."""
    temperature: float = 1.0
    """Sampling temperature of rollouts (0 = greedy)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 = off)."""
    max_new_tokens: int = 48
    """Per generation call (one assistant turn)."""
    max_tokens: int = 256
    """Per trajectory, prompt included (also capped by the engine's KV-cache length)."""
    episode_timeout_s: float = 120.0
    """Deadline of one episode; past it the sample gets status ``timeout``."""
    tool_timeout_s: float = 10.0
    """Deadline of one tool call; past it the tool result is a timeout error."""
    failure_reward: float = 0.0
    """Reward recorded for a sample that failed (timeout, env error): the group still completes."""
    infra_retries: int = 2
    """Reruns of an episode that failed for an infrastructure reason (sandbox start, a dependency's timeout,
    storage, the engine); one that still fails is recorded as such and its group is kept out of the loss."""
    writer: WriterConfig = field(default_factory=WriterConfig)

    def __post_init__(self) -> None:
        if self.group_size < 2:
            # GRPO's advantage is a sample's reward against its group's: a group of one has no baseline.
            raise ValueError(f"RolloutConfig.group_size must be >= 2, got {self.group_size}")
        if (
            not self.group_size <= self.max_concurrency <= MAX_CONCURRENCY
            or self.max_concurrency % self.group_size
        ):
            raise ValueError(
                f"RolloutConfig.max_concurrency must be a multiple of group_size={self.group_size} "
                f"no larger than {MAX_CONCURRENCY}, got {self.max_concurrency}"
            )
        if not self.temperature >= 0:
            raise ValueError(f"RolloutConfig.temperature must be >= 0, got {self.temperature}")
        if self.mode not in ("async", "sync", "lockstep"):
            raise ValueError(f"RolloutConfig.mode must be 'async', 'sync' or 'lockstep', got {self.mode!r}")
        if self.mode == "lockstep" and self.max_groups_per_version is None:
            raise ValueError(
                "RolloutConfig.mode='lockstep' needs max_groups_per_version (the groups run on each "
                "version), got None"
            )
        if self.eta < 0:
            raise ValueError(f"RolloutConfig.eta must be >= 0, got {self.eta}")
        if self.max_groups_per_version is not None and self.max_groups_per_version < 1:
            raise ValueError(
                f"RolloutConfig.max_groups_per_version must be >= 1 or null, got {self.max_groups_per_version}"
            )
        if not 0 <= self.lead_versions <= self.eta:
            raise ValueError(f"RolloutConfig.lead_versions must be between 0 and eta={self.eta} (a group led by more "
                             f"versions would be too stale to train on), got {self.lead_versions}")
        if self.lead_versions and (self.max_groups_per_version is None or self.mode == "lockstep"):
            raise ValueError(f"RolloutConfig.lead_versions={self.lead_versions} counts in max_groups_per_version "
                             f"budgets outside lockstep mode, got max_groups_per_version={self.max_groups_per_version}, "
                             f"mode={self.mode!r}")
        if self.target_groups is not None and self.target_groups < 1:
            raise ValueError(f"RolloutConfig.target_groups must be >= 1 or null, got {self.target_groups}")
        for name in (
            "weight_poll_s",
            "stop_poll_s",
            "episode_timeout_s",
            "tool_timeout_s",
            "backpressure_max_wait_s",
            "lockstep_wait_s",
            "hold_timeout_s",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"RolloutConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.infra_retries < 0:
            raise ValueError(f"RolloutConfig.infra_retries must be >= 0, got {self.infra_retries}")
        if self.max_new_tokens < 1 or self.max_tokens < 2:
            raise ValueError(
                f"RolloutConfig.max_new_tokens/max_tokens too small: {self.max_new_tokens}/{self.max_tokens}"
            )

    @classmethod
    def tiny(cls) -> RolloutConfig:
        return cls(
            group_size=4,
            max_concurrency=16,
            max_new_tokens=40,
            max_tokens=128,
            writer=WriterConfig(max_groups=4, max_age_s=2.0),
        )


__all__ = ["MAX_CONCURRENCY", "RolloutConfig"]
