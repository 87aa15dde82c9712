"""The staleness bound η and the zero-advantage rule, each written once for every side of the stream.

A group's *staleness* is the trainer's version when it trains on the group minus the group's version (the
policy its worker had loaded when it started the group). η (``rollout.eta``) is the largest staleness allowed:

- the rollout orchestrator starts a group only while ``admits(loaded, latest=..., eta=...)``: the version it has
  loaded would still be inside the window of the newest published one;
- the trainer at version V reads ``Window(version=V, eta=η)``, and the tailer (``reader.ShardTailer``) hands out
  only groups of its versions, dropping older ones as stale with ``Window.stale_reason``;
- the audit recomputes every consumed group's staleness from the consumption logs and reports each one
  ``beyond_eta`` as a problem: the bound is checked after the fact, not only enforced.

A group whose rewards are all equal (``zero_advantage``) has zero advantage under every estimator: the
orchestrator gives its admission back and the trainer leaves it out of the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def staleness(trainer_version: int, group_version: int) -> int:
    """How many published versions the policy moved between a group's start and its use."""
    return trainer_version - group_version


def beyond_eta(trainer_version: int, group_version: int, eta: int) -> bool:
    """Whether a group of ``group_version`` is too stale for ``trainer_version`` (the one η rule)."""
    return staleness(trainer_version, group_version) > eta


def admits(loaded_version: int, *, latest: int, eta: int) -> bool:
    """Whether a worker on ``loaded_version`` may start a group while ``latest`` is published."""
    return not beyond_eta(latest, loaded_version, eta)


def zero_advantage(rewards: Sequence[float]) -> bool:
    """Whether one group's rewards are all equal: its advantages are zero under every estimator."""
    return len(set(rewards)) == 1


def zero_advantage_summary(rewards: Sequence[float]) -> str:
    """What a trainer waiting for groups says of the all-equal ones it read meanwhile (``rewards``: each one's)."""
    if not rewards:
        return ""
    return (f"; {len(rewards)} groups read meanwhile had all-equal rewards (mean {sum(rewards) / len(rewards):.2f}), "
            "no learning signal")


@dataclass(frozen=True, kw_only=True)
class Window:
    """The policy versions a trainer at ``version`` may train on: ``[max(0, version − eta), version]``."""

    version: int
    eta: int

    def __post_init__(self) -> None:
        if self.version < 0:
            raise ValueError(f"Window.version must be >= 0, got {self.version}")
        if self.eta < 0:
            raise ValueError(f"Window.eta must be >= 0, got {self.eta}")

    @property
    def start(self) -> int:
        """The oldest version still inside the window."""
        return max(0, self.version - self.eta)

    @property
    def versions(self) -> range:
        return range(self.start, self.version + 1)

    def stale_reason(self, group_version: int) -> str:
        """Why groups of ``group_version`` (older than ``start``) are dropped."""
        return (f"version {group_version} < window start {self.start} (trainer version {self.version}, "
                f"eta {self.eta})")
