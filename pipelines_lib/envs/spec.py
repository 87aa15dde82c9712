"""``EnvSpec``: the campaign's ``env`` section — which env, its own options, the latency wrapped around its tools,
and the sandbox of envs that run model code.

Every place that makes the campaign's env or its tasks goes through the spec, so the env's options reach them all
alike: the prep stage (``generate_tasks``: the built-in dataset), the warm start's demonstrations and the rollout and
evaluation episodes (``make``); the viewer, replay and the audit read what those wrote and build no env. ``options``
are the keys of the env's ``config_class`` (``TwoStepConfig``, ...), checked here when the spec is made, so a bad one
stops the config before any stage runs; ``campaign.json`` records them with the rest of the config, so a resumed or
recovered campaign makes the same env.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pipelines_lib.configio import ConfigError, from_mapping, to_mapping
from pipelines_lib.envs.base import BaseTaskEnv, Task
from pipelines_lib.envs.registry import env_class, make_env
from pipelines_lib.envs.tools.latency import LatencyProfile
from pipelines_lib.envs.tools.sandbox import PythonSandbox, SandboxConfig

OPTIONS_KEY = "env.options"
"""Where a campaign config holds the options (what their errors name)."""


@dataclass(frozen=True, kw_only=True)
class EnvSpec:
    """Which env a campaign runs, with its options, the latency around its tools and its sandbox."""

    name: str = "arithmetic"
    """A key of the env registry (``arithmetic``, ``twostep``, ``multihop``, ``code``)."""
    options: dict[str, Any] = field(default_factory=dict)
    """The env's own settings, keys of its config class (``twostep``: ``operand_digits``, ``mistakes``, ...; those
    left out keep the class's defaults): they shape the built-in dataset, the warm start's demonstrations and every
    episode. A mapping given here replaces the one of the preset below it (``{}`` clears it). See
    ``docs/ENV_OPTIONS.md``."""
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
        # Plain data (lists, not tuples), so a spec equals the one read back from campaign.json.
        object.__setattr__(self, "options", to_mapping(dict(self.options)))
        self.env_config  # noqa: B018  (builds and so checks the options now, not at the first episode)

    @cached_property
    def env_config(self) -> Any:
        """The env's config (an instance of its ``config_class``) with ``options`` applied; None for an env without
        a config class, which takes no options."""
        cls = env_class(self.name)
        config_class = cls.config_class
        if config_class is None:
            if self.options:
                raise ConfigError(f"{OPTIONS_KEY}: env {self.name!r} takes no options, got {sorted(self.options)}")
            return None
        valid = sorted(f.name for f in dataclasses.fields(config_class) if f.init)
        for key in self.options:
            if key not in valid:
                close = difflib.get_close_matches(str(key), valid, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"{OPTIONS_KEY}.{key}: unknown option of env {self.name!r} "
                                  f"({config_class.__name__}); valid: {', '.join(valid)}{hint}")
        try:
            return from_mapping(config_class, self.options, where=OPTIONS_KEY)
        except ConfigError as e:
            raise ConfigError(f"{e} (refused by {config_class.__name__}, the config of env {self.name!r})") from None

    def make(self, env_name: str | None = None, *, sandbox: PythonSandbox | None = None) -> BaseTaskEnv:
        """A fresh env for one episode or demonstration of a task of ``env_name`` (default: this spec's env): this
        spec's env gets its options; another (a file source's rows may name any registered env) its defaults."""
        name = self.name if env_name is None else env_name
        config = self.env_config if name == self.name else None
        return make_env(name, sandbox=sandbox, **({} if config is None else {"config": config}))

    def generate_tasks(self, *, seed: int, n: int, split: str) -> list[Task]:
        """``n`` tasks of ``split`` from the env's own generator under its options (the ``builtin:`` dataset)."""
        return env_class(self.name).generate_tasks(seed=seed, n=n, split=split, config=self.env_config)


__all__ = ["EnvSpec"]
