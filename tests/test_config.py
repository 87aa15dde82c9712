"""Campaign config: YAML at the edge, typed all the way down, clear errors, documented knobs."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import numpy as np
import pytest

from pipelines_lib.config import CampaignConfig
from pipelines_lib.configdoc import render, rows
from pipelines_lib.configio import ConfigError
from pipelines_lib.envs import ENV_REGISTRY
from pipelines_lib.model.config import param_count
from pipelines_lib.rollout.config import RolloutConfig
from pipelines_lib.train.optim import make_schedule

ROOT = Path(__file__).resolve().parents[1]


def test_yaml_overrides_only_what_it_names(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("rollout:\n  eta: 2\n  writer: {max_groups: 3}\ntrainer:\n  max_steps: 7\n")
    config = CampaignConfig.from_yaml(path)
    tiny = CampaignConfig.tiny()
    assert (config.rollout.eta, config.rollout.writer.max_groups, config.trainer.max_steps) == (2, 3, 7)
    assert config.rollout.group_size == tiny.rollout.group_size and config.model == tiny.model


def test_exponent_notation_without_a_dot_is_a_number(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("trainer:\n  optim: {lr: 1e-3}\nsft:\n  optim: {lr: 2.5E-4}\n")  # YAML 1.1 reads 1e-3 as a str
    config = CampaignConfig.from_yaml(path)
    assert (config.trainer.optim.lr, config.sft.optim.lr) == (0.001, 0.00025)


@pytest.mark.parametrize(("text", "message"), [
    ("trainer:\n  optim: {lr: 1e-}\n", "trainer.optim.lr: expected a number, got str '1e-'"),
    ("rollout:\n  etaa: 2\n", "rollout.etaa: unknown key for RolloutConfig; did you mean 'eta'?"),
    ("rollout:\n  eta: two\n", "rollout.eta: expected int, got str 'two'"),
    ("rollout:\n  eta: -1\n", "RolloutConfig.eta must be >= 0, got -1"),
    ("rollout:\n  max_concurrency: 6\n", "max_concurrency must be a multiple of group_size=4 no larger than 65536, got 6"),
    ("trainer:\n  advantage: ppo\n", "TrainerConfig.advantage must be one of ['drgrpo', 'grpo', 'rloo'], got 'ppo'"),
    ("env:\n  name: arithmetc\n", "did you mean 'arithmetic'?"),
    # the env and the dataset must name the same tasks
    ("env:\n  name: twostep\n",
     "dataset.source='builtin:arithmetic' is another env's tasks than env.name='twostep', whose dataset source is "
     "'builtin:twostep'"),
    ("env:\n  name: twostep\ndataset:\n  source: builtin:twostep\n",
     "dataset.env_name='arithmetic' differs from env.name='twostep'"),
    ("dataset:\n  source: tasks.jsonl\n  env_name: code\n", "dataset.env_name='code' differs from env.name='arithmetic'"),
    ("- a list\n", "top level must be a mapping, got list"),
    ("rollout: [1\n", "expected ',' or ']', but got '<stream end>' (line 2, column 1)"),
    # not finite, or out of range: refused naming the key
    ("rollout:\n  temperature: .nan\n", "rollout.temperature: expected a finite number, got nan"),
    ("trainer:\n  optim: {lr: 1e999}\n", "trainer.optim.lr: expected a finite number, got '1e999'"),
    ("trainer:\n  data_timeout_s: .inf\n", "trainer.data_timeout_s: expected a finite number, got inf"),
    ("rollout:\n  group_size: 1\n", "rollout: RolloutConfig.group_size must be >= 2, got 1"),
    ("rollout:\n  max_concurrency: 400000000000\n", "no larger than 65536, got 400000000000"),
    ("engine:\n  num_slots: 1000000000\n", "EngineConfig.num_slots must be in [1, 16384], got 1000000000"),
    ("rollout:\n  temperature: -1\n", "RolloutConfig.temperature must be >= 0, got -1.0"),
    ("workers: " + "9" * 5000 + "\n", "workers: expected int, got str '99999"),
    ("seed: " + "9" * 40 + "\n", "seed: 99999"),
    # YAML features that make a small file expensive or ambiguous
    ("workers: 2\nworkers: 3\n", "duplicate key 'workers' (line 2, column 1)"),
    ("rollout:\n  eta: 1\n  eta: 2\n", "duplicate key 'eta' (line 3, column 3)"),
    ("a: &a [1]\nb: *a\n", "anchors and aliases (&name, *name) are not allowed in a config (line 1, column 4)"),
])
def test_bad_yaml_names_the_key_and_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        CampaignConfig.from_yaml(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_a_knob_whose_default_is_no_limit_may_be_set_back_to_infinity(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("trainer:\n  optim: {grad_clip_norm: .inf}\n")
    assert CampaignConfig.from_yaml(path).trainer.optim.grad_clip_norm == math.inf
    path.write_text("trainer:\n  optim: {grad_clip_norm: .nan}\n")
    with pytest.raises(ConfigError, match="trainer.optim.grad_clip_norm: expected a finite number, got nan"):
        CampaignConfig.from_yaml(path)


def test_an_alias_bomb_is_refused_at_its_first_anchor_without_expanding(tmp_path: Path) -> None:
    from drills.fuzz import CONFIG_BOMB

    path = tmp_path / "bomb.yaml"
    path.write_text(CONFIG_BOMB)
    assert len(CONFIG_BOMB) < 400  # 9**9 scalars once expanded
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: anchors and aliases .* \(line 1, column 4\)"):
        CampaignConfig.from_yaml(path)


def test_a_file_that_is_not_utf8_or_too_large_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("workers: 2 # caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: not UTF-8 text \(byte 16: b'\\xe9'\)"):
        CampaignConfig.from_yaml(path)
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(big))}: config file is larger than 1048576 bytes"):
        CampaignConfig.from_yaml(big)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(tmp_path / 'none.yaml'))}: cannot read config"):
        CampaignConfig.from_yaml(tmp_path / "none.yaml")


def test_config_round_trips_through_its_json_snapshot() -> None:
    config = CampaignConfig.tiny().with_overrides({"rollout.eta": 3})
    assert CampaignConfig.from_mapping(config.to_dict()) == config


def test_cross_section_checks_name_both_sides() -> None:
    with pytest.raises(ConfigError, match=r"trainer.seq_buckets \(largest 64\) cannot hold .*max_tokens=192"):
        CampaignConfig.tiny().with_overrides({"trainer.seq_buckets": [64]})


def test_every_knob_is_documented_and_the_reference_is_current() -> None:
    undocumented = [key for key, _, _, doc in rows(CampaignConfig.tiny()) if not doc]
    assert undocumented == []
    options = [(name, cls.config_class()) for name, cls in ENV_REGISTRY.items() if cls.config_class is not None]
    assert [f"{name}: {key}" for name, config in options for key, _, _, doc in rows(config) if not doc] == []
    assert (ROOT / "docs" / "CONFIG.md").read_text() == render()


def test_the_wide_preset_is_tiny_with_a_decoder_twice_as_wide_and_its_own_recipe() -> None:
    tiny, wide = CampaignConfig.tiny(), CampaignConfig.preset("wide")
    # 4 layers of q 256x256, k and v 256x128 (2 kv heads of 64), o 256x256, MLP 3x256x768, 2 norms of 256;
    # the tied 512 x 256 embedding and the final norm.
    layer = 256 * 256 + 2 * 256 * 128 + 256 * 256 + 3 * 256 * 768 + 2 * 256
    assert param_count(wide.model) == 4 * layer + 512 * 256 + 256 == 3_279_104
    assert (wide.model.n_heads, wide.model.head_dim, wide.model.d_ff) == (4, 64, 768)
    assert (wide.sft.error_rate, wide.sft.optim.lr) == (0.85, 2e-3)
    # GRPO: linear warm-up to 2e-4 over 15 steps (step 7: 7/15 of it), then a cosine down to a quarter at step 60.
    lr = make_schedule(wide.trainer.optim)
    np.testing.assert_allclose([float(lr(s)) for s in (0, 7, 15, 60)], [0.0, 2e-4 * 7 / 15, 2e-4, 5e-5], rtol=1e-5)
    # everything else is tiny's: task, rollouts, steps, evaluation
    assert (wide.dataset, wide.env, wide.rollout, wide.eval) == (tiny.dataset, tiny.env, tiny.rollout, tiny.eval)
    assert (wide.trainer.max_steps, wide.sft.steps) == (tiny.trainer.max_steps, tiny.sft.steps)


def test_a_vllm_campaign_without_hf_folders_is_refused_naming_the_knob() -> None:
    tiny = CampaignConfig.tiny()
    with pytest.raises(ValueError, match=r"engine.kind='vllm' serves each version from its HF folder.*"
                                         r"trainer.publish_hf=true"):
        dataclasses.replace(tiny, engine=dataclasses.replace(tiny.engine, kind="vllm"),
                            trainer=dataclasses.replace(tiny.trainer, publish_hf=False))


@pytest.mark.parametrize(("knobs", "message"), [
    ({"eta": 1, "lead_versions": 2, "max_groups_per_version": 16}, r"lead_versions must be between 0 and eta=1.*got 2"),
    ({"eta": 1, "lead_versions": 1}, r"lead_versions=1 counts in max_groups_per_version budgets.*got "
                                     r"max_groups_per_version=None"),
])
def test_a_lead_past_eta_or_without_a_budget_is_refused_naming_it(knobs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RolloutConfig(**knobs)
