"""The campaign config: one frozen tree of typed configs, parsed once at the edge.

```
CampaignConfig
├── dataset: DatasetConfig        prep: source, sizes, column mapping
├── env: EnvSpec                  which env and its options, the latency profile wrapped around its tools
├── model: ModelConfig            architecture (tiny() by default; HF checkpoints bring their own)
├── engine: EngineConfig          inference slots, KV-cache length, prefill buckets
├── agent: AgentConfig            tool-call parser and agent kind
├── rollout: RolloutConfig        group size, concurrency, η, sampling, shard flushing
├── trainer: TrainerConfig        streaming GRPO: batch, steps, checkpoint/publish cadence, loss, optimiser
├── sft: SFTConfig                warm start on demonstrations
├── eval: EvalConfig              held-out evaluation of published versions
├── memory: MemoryConfig          the device memory a colocated campaign's plan checks against
└── distributed: DistributedConfig   the process group of a multi-host stage (empty: one process)
```

Each sub-config lives next to the code that uses it and validates itself; this module only composes
them (``envs.spec.EnvSpec`` pairs an env and its options with the latency wrapped around its tools and its sandbox). Only the stages
(``pipelines_lib.stages``) take a whole ``CampaignConfig``; core code takes its own section. ``CampaignConfig.from_yaml`` reads a YAML file
(unknown keys fail with a "did you mean"); ``tiny()`` is the embedded default that runs on 2 CPU cores. The
presets are recipes, not code: ``recipes/<name>.yaml`` overlays ``tiny()`` (or the recipe it names in
``extends:``), and ``CampaignConfig.preset("smoke")`` loads one (``docs/RECIPES.md``).
Variants are made with ``dataclasses.replace`` or ``with_overrides({"rollout.eta": 2})``.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pipelines_lib.agents.base import AgentConfig
from pipelines_lib.configio import ConfigError, from_mapping, load_yaml, nest_dotted, to_mapping
from pipelines_lib.dataset import DatasetConfig
from pipelines_lib.distributed import DistributedConfig
from pipelines_lib.engine.config import EngineConfig
from pipelines_lib.envs import env_class
from pipelines_lib.envs.spec import EnvSpec
from pipelines_lib.envs.tools.latency import LatencyProfile
from pipelines_lib.evaluate import EvalConfig
from pipelines_lib.memplan import MemoryConfig
from pipelines_lib.model.config import ModelConfig
from pipelines_lib.rollout.config import RolloutConfig
from pipelines_lib.train.config import TrainerConfig
from pipelines_lib.train.optim import OptimConfig
from pipelines_lib.train.sft import SFTConfig
from pipelines_lib.trajectory.channel import WriterConfig

LOCKSTEP_MAX_AGE_S = 86_400.0
"""``lockstep()``'s shard age limit: longer than any version's groups take, so shards are cut by the commit alone."""

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
"""The recipes folder, ``recipes/<name>.yaml``: beside the ``pipelines_lib`` package both in a checkout (used
through ``PYTHONPATH`` or an editable install) and in an installed one (``pyproject.toml`` ships it as package
data)."""

Placement = Literal["separate", "colocated"]
PLACEMENTS: tuple[str, ...] = typing.get_args(Placement)
"""Values of ``CampaignConfig.placement``."""


@dataclass(frozen=True, kw_only=True)
class CampaignConfig:
    seed: int = 0
    """Seed of rollout and evaluation sampling (each episode's key is derived from it, the task and the sample
    index). The dataset, the warm start and the trainer have their own (``dataset.seed``, ``sft.seed``,
    ``trainer.seed``); ``rollstream bench --seeds`` sets all four to one value."""
    workers: int = 2
    """Rollout workers started by the campaign flow."""
    tokenizer: str | None = None
    """Folder of a transformers tokenizer; None builds/uses the embedded default."""
    init_from: str | None = None
    """Start from another campaign's published weights (its URL) or a Hugging Face checkpoint folder
    instead of the SFT warm start."""
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    env: EnvSpec = field(default_factory=EnvSpec)
    model: ModelConfig = field(default_factory=ModelConfig.tiny)
    engine: EngineConfig = field(default_factory=EngineConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    """What a colocated campaign's memory plan (``pipelines_lib.memplan``, printed at its start) checks against."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """How the processes of a multi-host stage find each other (``rollstream train --process-id``); empty: one
    process."""
    placement: Placement = "separate"
    """Where the stages run. ``separate``: each stage its own run (thread, process or deployment), engines loading
    every published version from the folder. ``colocated``: one process holds the device(s) and time-shares them
    between rollouts, the trainer and evaluation (``stages.colocated``), the engine taking each new version from
    the trainer's device memory; the folder's records are the same. One accelerator that only one process may
    open (a TPU chip) needs ``colocated``; it requires ``engine.kind: jax``."""

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"CampaignConfig.workers must be >= 1, got {self.workers}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"CampaignConfig.placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.placement == "colocated" and self.engine.kind != "jax":
            raise ValueError(f"CampaignConfig.placement='colocated' needs engine.kind='jax' (the engine takes the "
                             f"trainer's weights in device memory), got engine.kind={self.engine.kind!r}")
        if self.placement == "colocated" and self.model.dtype != self.trainer.step.precision.compute:
            raise ValueError(f"CampaignConfig.placement='colocated' hands the trainer's compute-dtype weights to engines "
                             f"serving model.dtype={self.model.dtype!r}: set model.dtype and "
                             f"trainer.step.precision.compute alike, got {self.trainer.step.precision.compute!r}")
        if self.engine.kind == "vllm" and not self.trainer.publish_hf:
            raise ValueError("engine.kind='vllm' serves each version from its HF folder, and trainer.publish_hf=false "
                             "publishes none: set trainer.publish_hf=true")
        if self.engine.num_blocks == "auto" and self.placement != "colocated":
            raise ValueError("engine.num_blocks='auto' needs placement='colocated' (the colocated memory plan sizes the "
                             f"KV pool), got placement={self.placement!r}: give engine.num_blocks a number")
        if self.engine.max_seq_len > self.model.max_seq_len:
            raise ValueError(f"engine.max_seq_len={self.engine.max_seq_len} exceeds model.max_seq_len="
                             f"{self.model.max_seq_len}")
        if self.trainer.seq_buckets[-1] < min(self.rollout.max_tokens, self.engine.max_seq_len):
            raise ValueError(f"trainer.seq_buckets (largest {self.trainer.seq_buckets[-1]}) cannot hold a "
                             f"trajectory of rollout.max_tokens={self.rollout.max_tokens}")
        self._check_env_dataset()
        if self.rollout.mode == "lockstep":
            self._check_lockstep()

    def _check_lockstep(self) -> None:
        """What makes a lockstep campaign's trainer batches a function of the seeds alone (``lockstep()``)."""
        per_version = self.trainer.batch_groups * self.trainer.publish_every
        problems = [
            (self.workers != 1, f"workers={self.workers} (two workers' groups would reach the trainer in the "
                                f"order they finish): set workers=1"),
            (self.engine.kind != "jax", f"engine.kind={self.engine.kind!r} (only the jax engine samples each "
                                        f"request from its own key, whatever shares its batch)"),
            (self.engine.prefix_reuse, "engine.prefix_reuse=true (whether a prompt reuses cached keys/values, "
                                       "computed in other chunks, depends on what else the pool held)"),
            (not self.engine.fixed_shapes, "engine.fixed_shapes=false (a call's row bucket and span, hence its "
                                           "program and rounding, follow what else it holds)"),
            (self.trainer.skip_zero_advantage, "trainer.skip_zero_advantage=true (a version's groups might not "
                                               "fill its batches, and the worker waits for the next version)"),
            (self.rollout.max_groups_per_version != per_version,
             f"rollout.max_groups_per_version={self.rollout.max_groups_per_version}, not trainer.batch_groups x "
             f"publish_every = {per_version} (the groups of one version are the batches trained on it)"),
        ]
        bad = [why for failed, why in problems if failed]
        if bad:
            raise ValueError(f"rollout.mode='lockstep' with {'; '.join(bad)}; CampaignConfig.lockstep() sets "
                             f"these up")

    def lockstep(self) -> CampaignConfig:
        """This campaign made reproducible on one machine (``rollout.mode: lockstep``): one rollout worker that runs
        each version's groups, exactly the batches the trainer takes on that version, after it is published; every
        group trained on (``trainer.skip_zero_advantage: false``); every prompt prefilled whole
        (``engine.prefix_reuse: false``: a reused prefix's rounding depends on what the pool still held) and every
        engine call at one shape (``engine.fixed_shapes``: what shares a call picks none of its program). Two runs with the same seeds write the same shard
        rows and publish the same weights (``tests/test_reproducible_campaign.py``); it gives up the overlap of
        rollout and training that ``async`` has. The shard writer's age limit is lifted to a day: the commit after each
        version's groups is the flush, and a flush by age would cut shards where the clock says."""
        per_version = self.trainer.batch_groups * self.trainer.publish_every
        return dataclasses.replace(
            self, workers=1, engine=dataclasses.replace(self.engine, prefix_reuse=False, fixed_shapes=True),
            rollout=dataclasses.replace(self.rollout, mode="lockstep", max_groups_per_version=per_version,
                                        writer=dataclasses.replace(self.rollout.writer, max_age_s=LOCKSTEP_MAX_AGE_S)),
            trainer=dataclasses.replace(self.trainer, skip_zero_advantage=False))

    def _check_env_dataset(self) -> None:
        """The env and the dataset name the same tasks: the env's own source, or a file whose rows it scores (the
        warm start's demonstrations and the sandbox follow ``env.name``, the episodes each task's env)."""
        declared = env_class(self.env.name).dataset_source()
        if self.dataset.builtin_env is not None and self.dataset.source != declared:
            raise ValueError(f"dataset.source={self.dataset.source!r} is another env's tasks than env.name="
                             f"{self.env.name!r}, whose dataset source is {declared!r}")
        if self.dataset.env_name != self.env.name:
            raise ValueError(f"dataset.env_name={self.dataset.env_name!r} differs from env.name={self.env.name!r}: "
                             f"set both to the env that scores the dataset's tasks")

    @classmethod
    def tiny(cls) -> CampaignConfig:
        """The embedded default: tiny model, arithmetic with a calculator, light tool latency, 2 CPU cores."""
        return cls(
            dataset=DatasetConfig.tiny(),
            env=EnvSpec(name="arithmetic", tool_latency=LatencyProfile.light()),
            model=ModelConfig.tiny(),
            engine=EngineConfig(num_slots=16, max_seq_len=192, prefill_buckets=(16, 64, 128)),
            rollout=RolloutConfig(group_size=4, max_concurrency=32, eta=1, max_new_tokens=40, max_tokens=192,
                                  temperature=1.0, max_groups_per_version=16,
                                  writer=WriterConfig(max_groups=4, max_age_s=2.0)),
            # 60 steps: over 3 seeds at 30 the endings spread 83-98 % and the lowest was still climbing (seed 0:
            # v8 69 %, v16 87 %, v20 89 % in a 40-step run); a step took 1.6-3.6 s on 2 cores (quiet to loaded). Over 5 seeds at 60
            # steps the endings spread 70-98 % (`rollstream bench --only learning --preset tiny`): seeds 3 and 4 plateau.
            trainer=TrainerConfig(batch_groups=8, max_steps=60, checkpoint_every=10, publish_every=2,
                                  seq_buckets=(192,),
                                  # One optimizer step per batch, so PPO's clip never binds and Adam's step size alone
                                  # bounds how far the policy moves. Measured on this preset (2 shared cores, the same
                                  # v0): at 5e-4 the policy lost its tool-call format within a few versions in 3 of 3
                                  # runs (JSON like ``{"expression":"}}``: v15 greedy 0-1 %), at 2e-4 it learned
                                  # (v0 4.7 % -> v15 93.8 %).
                                  optim=OptimConfig(lr=2e-4, warmup_steps=0, schedule="constant",
                                                    total_steps=1000, grad_clip_norm=1.0)),
            # Measured on this preset (2 shared cores): the warm start learns to call the tool and copy its result
            # (~80 % of held-out answers hold the right digits after 250 steps), but 70 % of its demonstrations
            # write that number as a float, so v0's greedy answers are mostly floats: 0-22 % success over 5 seeds
            # (0 % for 2 of them), pass@4 20-78 %. Streaming GRPO removes the habit from reward alone within a few
            # steps and then sharpens copying. At 60 % flawed, 2 of 3 seeds' v0 already solved 22 %, and the warm
            # start rather than GRPO decided much of their gain. Clean demonstrations would give a v0 near 88 %, with
            # nothing for a 10-minute demo to show; see ``pipelines_lib/envs/arithmetic.py`` for flaws that do
            # not work (they stop the tiny model learning to copy).
            sft=SFTConfig(n_demos=1024, steps=250, batch_size=16, error_rate=0.7,
                          optim=OptimConfig(lr=3e-3, warmup_steps=10, schedule="constant", total_steps=250,
                                            weight_decay=0.01)),
            eval=EvalConfig(n_tasks=128, samples=4),
        )

    @classmethod
    def from_mapping(cls, data: dict[str, Any], *, base: CampaignConfig | None = None) -> CampaignConfig:
        """Overlay ``data`` (nested mapping) on ``base`` (default: ``tiny()``)."""
        merged = _deep_merge(to_mapping(base or cls.tiny()), data)
        return from_mapping(cls, merged)

    @classmethod
    def from_yaml(cls, path: str | Path, *, base: CampaignConfig | None = None) -> CampaignConfig:
        """Overlay the YAML file ``path`` on ``base``; read with bounded work (``configio.load_yaml``)."""
        return cls._overlay(_yaml_mapping(path), path, base)

    @classmethod
    def _overlay(cls, data: dict[str, Any], path: str | Path, base: CampaignConfig | None) -> CampaignConfig:
        try:
            return cls.from_mapping(data, base=base)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from e

    def with_overrides(self, overrides: dict[str, Any]) -> CampaignConfig:
        """``{"rollout.eta": 2, "trainer.max_steps": 10}`` → a validated copy."""
        return type(self).from_mapping(nest_dotted(overrides), base=self)

    @classmethod
    def preset(cls, name: str, *, folder: Path = RECIPES) -> CampaignConfig:
        """The recipe ``<folder>/<name>.yaml`` over the recipe it ``extends:`` (default: ``tiny()``); an unknown
        name is refused with the valid ones, a loop of ``extends`` with its chain."""
        return cls._recipe(name, folder, ())

    @classmethod
    def _recipe(cls, name: str, folder: Path, chain: tuple[str, ...]) -> CampaignConfig:
        names = preset_names(folder)
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            within = f" (extended by {chain[-1]!r})" if chain else ""
            raise ConfigError(f"unknown preset {name!r}{within}{f'; did you mean {close[0]!r}?' if close else ''}; "
                              f"valid: {', '.join(names)} (the recipes in {folder})")
        if name in chain:
            raise ConfigError(f"recipe {name!r} extends itself: {' -> '.join((*chain, name))}")
        path = folder / f"{name}.yaml"
        data = _yaml_mapping(path)
        parent = data.pop("extends", None)
        if parent is not None and not isinstance(parent, str):
            raise ConfigError(f"{path}: extends: expected a recipe's name, got {type(parent).__name__} {parent!r}")
        base = cls.tiny() if parent is None else cls._recipe(parent, folder, (*chain, name))
        return cls._overlay(data, path, base)

    @classmethod
    def build(cls, *, preset: str = "tiny", config_path: str | Path | None = None,
              overrides: dict[str, Any] | None = None, workers: int | None = None) -> CampaignConfig:
        """A campaign's config as a user states it: the preset, the YAML file over it, dotted ``overrides``
        (``{"trainer.max_steps": 4}``) over that, then ``workers``."""
        config = cls.preset(preset)
        if config_path:
            config = cls.from_yaml(config_path, base=config)
        if overrides:
            config = config.with_overrides(overrides)
        return config if workers is None else dataclasses.replace(config, workers=workers)

    def to_dict(self) -> dict[str, Any]:
        return to_mapping(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str)


DEMO_PRESET = "wide"
"""The preset ``make demo`` runs, and the learning benchmark by default: the one whose ending holds over seeds."""


def preset_names(folder: Path = RECIPES) -> tuple[str, ...]:
    """The presets a campaign can start from: the recipes in ``folder``, by name."""
    return tuple(sorted(p.stem for p in folder.glob("*.yaml")))


def _yaml_mapping(path: str | Path) -> dict[str, Any]:
    data = load_yaml(path) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


REPLACED_MAPPINGS: tuple[str, ...] = ("dataset.columns", "env.options")
"""Mappings that an overlay (a recipe, a YAML file, ``--set``) replaces whole instead of merging into: their keys
belong to what they map (a file's columns, an env's config), so keys of the base's would not fit another file or env,
and ``{}`` has to be able to clear them."""


def _deep_merge(base: dict[str, Any], over: dict[str, Any], path: str = "") -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        key = f"{path}{k}"
        if isinstance(v, dict) and isinstance(out.get(k), dict) and key not in REPLACED_MAPPINGS:
            out[k] = _deep_merge(out[k], v, f"{key}.")
        else:
            out[k] = v
    return out


__all__ = ["DEMO_PRESET", "PLACEMENTS", "RECIPES", "Placement", "CampaignConfig", "ConfigError", "preset_names"]
