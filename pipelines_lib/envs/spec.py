"""``EnvSpec``: the campaign's ``env`` section — which env, the latency wrapped around its tools, and the sandbox
of envs that run model code. The rollout and evaluation stages hand it to ``rollout.episodes``."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipelines_lib.envs import env_class
from pipelines_lib.envs.tools.latency import LatencyProfile
from pipelines_lib.envs.tools.sandbox import SandboxConfig


@dataclass(frozen=True, kw_only=True)
class EnvSpec:
    name: str = "arithmetic"
    """A key of the env registry (``arithmetic``, ``twostep``, ``multihop``, ``code``)."""
    tool_latency: LatencyProfile = field(default_factory=LatencyProfile.none)
    """Delay added to every tool call, to emulate slow external services."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """The sandbox of envs that run model code (``code``): limits, warm pool and ``isolation`` (``bwrap``, the
    default, needs the bubblewrap package; ``none`` runs model code unisolated: unsafe, warned on every start)."""

    def __post_init__(self) -> None:
        try:
            env_class(self.name)
        except ValueError as e:
            raise ValueError(f"EnvSpec.name: {e}") from None


__all__ = ["EnvSpec"]
