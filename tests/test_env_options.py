"""An env's own options (``env.options``): checked against the env's config class when the config is built, set
from YAML and ``--set`` like the other mappings, recorded in ``campaign.json``, and reaching every place a campaign
makes its env or its tasks: the prep stage, the warm start's demonstrations, rollout and evaluation episodes."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
import yaml

from pipelines_lib.agents import AgentConfig
from pipelines_lib.config import CampaignConfig
from pipelines_lib.configio import ConfigError, parse_overrides
from pipelines_lib.dataset import load_split
from pipelines_lib.engine.scripted import ScriptedEngine
from pipelines_lib.envs.base import hermes_tool_call
from pipelines_lib.envs.spec import EnvSpec
from pipelines_lib.envs.twostep import TwoStepConfig
from pipelines_lib.model.tokenizer import ChatTokenizer
from pipelines_lib.records import EvalResult, evaluated_versions
from pipelines_lib.rollout.config import RolloutConfig
from pipelines_lib.rollout.episodes import make_episode_fn
from pipelines_lib.stages.campaign import init_campaign, load_campaign_config
from pipelines_lib.stages.colocated import run_colocated
from pipelines_lib.stages.prep import prep
from pipelines_lib.storage.layout import parse_shard_path
from pipelines_lib.storage.store import Store
from pipelines_lib.train.sft import demonstration_rows
from pipelines_lib.trajectory.codec import read_shard

TWOSTEP = {"env.name": "twostep", "dataset.source": "builtin:twostep", "dataset.env_name": "twostep"}
"""The overrides that make the tiny preset a ``twostep`` campaign."""

def twostep(**options: object) -> CampaignConfig:
    return CampaignConfig.tiny().with_overrides({**TWOSTEP, "env.options": options})

def operands(expression: str) -> list[str]:
    return re.findall(r"\d+", expression)

@pytest.mark.parametrize(("overrides", "message"), [
    ({"env.options": {"operand_digit": 2}},
     "env.options.operand_digit: unknown option of env 'twostep' (TwoStepConfig); valid: first_ops, heldout_fraction, "
     "max_turns, mistakes, operand_digits, second_ops; did you mean 'operand_digits'?"),
    ({"env.options": {"operand_digits": 9}},
     "env.options: operand_digits must be in 1..4, got 9 (refused by TwoStepConfig, the config of env 'twostep')"),
    ({"env.options": {"mistakes": ["typo"]}}, "env.options: mistakes must be a non-empty subset of"),
    ({"env.options": {"operand_digits": "two"}}, "env.options.operand_digits: expected int, got str 'two'"),
    ({"env.name": "code", "dataset.source": "builtin:code", "dataset.env_name": "code",
      "env.options": {"n_tests": 2}}, "env.options: env 'code' takes no options, got ['n_tests']"),
])
def test_a_bad_env_option_is_refused_naming_the_key_the_env_and_the_reason(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        CampaignConfig.tiny().with_overrides({**TWOSTEP, **overrides})
    assert message in str(err.value)

def test_a_bad_env_option_in_a_yaml_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"env": {"name": "twostep", "options": {"operand_digits": 0}},
                                    "dataset": {"source": "builtin:twostep", "env_name": "twostep"}}))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: env.options: operand_digits must be in 1..4"):
        CampaignConfig.from_yaml(path)

def test_set_items_give_options_one_key_or_a_whole_mapping_and_a_mapping_replaces_the_one_below(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"env": {"name": "twostep", "options": {"operand_digits": 2, "max_turns": 5}},
                                    "dataset": {"source": "builtin:twostep", "env_name": "twostep"}}))
    from_file = CampaignConfig.build(config_path=path)
    assert from_file.env.env_config == TwoStepConfig(operand_digits=2, max_turns=5)
    one_key = CampaignConfig.build(config_path=path, overrides=parse_overrides(["env.options.operand_digits=3"]))
    assert one_key.env.options == {"operand_digits": 3}  # the file's mapping is replaced, as dataset.columns is
    whole = CampaignConfig.build(config_path=path, overrides=parse_overrides(['env.options={"mistakes": ["wrong_carry"]}']))
    assert whole.env.env_config == TwoStepConfig(mistakes=("wrong_carry",))
    cleared = CampaignConfig.build(config_path=path, overrides=parse_overrides(
        ["env.options={}", "env.name=code", "dataset.source=builtin:code", "dataset.env_name=code"]))
    assert cleared.env.options == {} and cleared.env.env_config is None

def test_campaign_json_carries_the_options_and_a_resumed_campaign_makes_the_same_env(tmp_path: Path) -> None:
    config = twostep(operand_digits=2, mistakes=("wrong_carry",))  # a tuple, as Python code would write it
    store = Store(str(tmp_path / "c"))
    init_campaign(store, config)
    recorded = json.loads(Path(tmp_path / "c" / "campaign.json").read_text())["config"]["env"]["options"]
    assert recorded == {"operand_digits": 2, "mistakes": ["wrong_carry"]}
    resumed = load_campaign_config(store)
    assert resumed == config and resumed.env.env_config == config.env.env_config
    init_campaign(store, config)  # the same config again: accepted, not "a different config"

def test_prep_of_builtin_twostep_with_two_digit_operands_writes_two_digit_tasks(tmp_path: Path) -> None:
    config = twostep(operand_digits=2).with_overrides({"dataset.n_train": 40, "dataset.n_heldout": 10})
    store = Store(str(tmp_path / "c"))
    prep(store, config)
    for split in ("train", "heldout"):
        tasks = load_split(store, split)
        assert tasks and all(len(o) == 2 for t in tasks for o in operands(t.meta["expression"])), split

def test_sft_demonstrations_with_only_wrong_carry_mistakes_never_stop_early(tok: ChatTokenizer) -> None:
    env = twostep(operand_digits=2, mistakes=["wrong_carry"]).env
    tokens, _ = demonstration_rows(env, tok, n=30, error_rate=1.0, seed=0, with_tools=False)
    texts = [tok.decode(ids) for ids in tokens]
    assert all(text.count("<tool_call>") == 2 for text in texts)  # a stop-early demonstration makes one call
    assert all(len(o) == 2 for text in texts for o in operands(re.findall(r'"expression": "([^"]+)"', text)[0]))
    default = demonstration_rows(EnvSpec(name="twostep"), tok, n=30, error_rate=1.0, seed=0, with_tools=False)[0]
    assert any(tok.decode(ids).count("<tool_call>") == 1 for ids in default)  # the defaults do stop early

def test_rollout_episodes_run_the_env_of_the_spec_with_its_options(tok: ChatTokenizer) -> None:
    # A policy that calls the calculator over and over: the episode ends when the env's turn budget is spent.
    env = twostep(max_turns=3).env
    task = env.generate_tasks(seed=0, n=1, split="train")[0]
    call = hermes_tool_call("calculator", {"expression": "1+1"})

    def run(spec: EnvSpec):
        engine = ScriptedEngine(lambda prompt, i: call, tokenizer=tok)
        episode = make_episode_fn(RolloutConfig(group_size=2, max_concurrency=2), AgentConfig(), engine=engine,
                                  tokenizer=tok, worker_id="w0", env=spec)
        return asyncio.run(episode(task, "g0", 0))

    limited, default = run(env), run(EnvSpec(name="twostep"))
    assert limited.status == default.status == "max_turns"
    assert [sum(t.role == "assistant" for t in traj.turns) for traj in (limited, default)] == [3, 4]


def test_a_colocated_campaign_runs_its_dataset_and_its_episodes_on_the_env_its_options_configure(
        tmp_path: Path) -> None:
    # One-digit operands (arithmetic's default is two) and a budget of one assistant message (its default is three):
    # an episode whose message calls the calculator ends there, with nothing left to answer the call.
    config = CampaignConfig.build(preset="smoke", overrides=parse_overrides([
        "placement=colocated", "workers=1", "env.options.operand_digits=1", "env.options.max_turns=1",
        "model.d_model=64", "model.n_layers=1", "model.n_heads=2", "model.n_kv_heads=1", "model.head_dim=32",
        "model.d_ff=128", "trainer.max_steps=2", "eval.versions=ends", "dataset.n_train=32", "dataset.n_heldout=4"]))
    store = Store(str(tmp_path / "c"))
    out = run_colocated(store, config, log=lambda line: None)
    assert out["audit"]["ok"] and out["train"]["steps"] == 2
    assert load_campaign_config(store).env.options == {"operand_digits": 1, "max_turns": 1}
    train = {t.task_id: t for t in load_split(store, "train")}
    assert all(len(o) == 1 for t in train.values() for o in operands(t.meta["expression"]))
    root = tmp_path / "c"
    shards = [p.relative_to(root).as_posix() for p in (root / "trajectories").rglob("*.arrow")]
    rows = [row for path in shards if parse_shard_path(path) for row in read_shard(store, path)[0].to_pylist()]
    assert rows and all(row["task_id"] in train for row in rows)
    assert all(sum(turn["role"] == "assistant" for turn in row["turns"]) == 1 for row in rows)
    assert any(row["status"] == "max_turns" for row in rows)
    # Evaluation too: its episodes stop at the one message (v0's greedy policy calls the calculator at once).
    evals = [EvalResult.read(store, v) for v in evaluated_versions(store)]
    stats = [s for e in evals for s in (e.greedy, e.sampled)]
    assert stats and all(s["avg_turns"] == 1.0 for s in stats) and any("max_turns" in s["statuses"] for s in stats)
