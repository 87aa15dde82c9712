"""Campaign config: YAML at the edge, typed all the way down, clear errors, documented knobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines_lib.config import CampaignConfig
from pipelines_lib.configdoc import render, rows
from pipelines_lib.configio import ConfigError

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
    ("rollout:\n  max_concurrency: 6\n", "max_concurrency must be a positive multiple of group_size=4, got 6"),
    ("trainer:\n  advantage: ppo\n", "TrainerConfig.advantage must be one of ['drgrpo', 'grpo', 'rloo'], got 'ppo'"),
    ("env:\n  name: arithmetc\n", "did you mean 'arithmetic'?"),
    ("- a list\n", "top level must be a mapping, got list"),
    ("rollout: [1\n", "cannot read config"),
])
def test_bad_yaml_names_the_key_and_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        CampaignConfig.from_yaml(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_config_round_trips_through_its_json_snapshot() -> None:
    config = CampaignConfig.tiny().with_overrides({"rollout.eta": 3})
    assert CampaignConfig.from_mapping(config.to_dict()) == config


def test_cross_section_checks_name_both_sides() -> None:
    with pytest.raises(ConfigError, match=r"trainer.seq_buckets \(largest 64\) cannot hold .*max_tokens=192"):
        CampaignConfig.tiny().with_overrides({"trainer.seq_buckets": [64]})


def test_every_knob_is_documented_and_the_reference_is_current() -> None:
    undocumented = [key for key, _, _, doc in rows(CampaignConfig.tiny()) if not doc]
    assert undocumented == []
    assert (ROOT / "docs" / "CONFIG.md").read_text() == render()
