"""The warm-start stage: no-op when version 0 exists, imports (HF folder, another campaign), and SFT on
demonstrations with the real decoder, tokenizer, env generator and train step (shrunk for CPU)."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from pipelines_lib.agents import AgentConfig
from pipelines_lib.config import CampaignConfig
from pipelines_lib.engine import JaxEngine
from pipelines_lib.envs import env_class
from pipelines_lib.envs.spec import EnvSpec
from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.hf_import import load_hf_checkpoint
from pipelines_lib.model.tokenizer import ChatTokenizer
from pipelines_lib.publish import CampaignWeights, load_published, publish_weights
from pipelines_lib.stages.evaluate import score
from pipelines_lib.stages.warm_start import warm_start
from pipelines_lib.storage.store import Store
from pipelines_lib.train.optim import OptimConfig
from pipelines_lib.train.sft import SFTConfig, demonstration_rows, mean_nll, sft_train
from tests.test_telemetry import _read_tfrecords

LLAMA_FIXTURE = Path(__file__).parent / "fixtures" / "parity" / "llama"
# The tiny model's vocabulary (the default tokenizer's) with every other dimension shrunk for compile speed.
ARITHMETIC = EnvSpec(name="arithmetic")
SMALL = dataclasses.replace(ModelConfig.tiny(), d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)


def small_config(**sft: object) -> CampaignConfig:
    """The plain-answer agent (no tool schemas in the prompt) keeps demonstrations short, so steps compile fast."""
    base = CampaignConfig.tiny()
    return dataclasses.replace(base, model=SMALL, agent=AgentConfig(kind="model"),
                               sft=dataclasses.replace(base.sft, **sft))


def params(model_or_state: object) -> list[np.ndarray]:
    state = nnx.state(model_or_state, nnx.Param) if isinstance(model_or_state, nnx.Module) else model_or_state
    return [np.asarray(x) for x in jax.tree.leaves(state)]


def assert_same(a: object, b: object) -> None:
    for x, y in zip(params(a), params(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_demonstrations_train_only_the_assistant_tokens(tok: ChatTokenizer) -> None:
    tokens, masks = demonstration_rows(ARITHMETIC, tok, n=4, error_rate=0.0, seed=0, with_tools=True)
    assert len(tokens) == 4
    for ids, mask in zip(tokens, masks, strict=True):
        assert len(ids) == len(mask) and mask[0] == 0
        trained = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
        # One tool call, then the answer; each assistant turn ends with its stop id. Prompt and tool result
        # (the calculator's output inside <tool_response>) are never trained on.
        assert trained.startswith("<tool_call>") and trained.endswith("</answer><|im_end|>")
        assert trained.count("<|im_end|>") == 2
        assert "<tool_response>" not in trained and "system" not in trained
        assert "<tools>" in tok.decode(ids)


def test_flawed_demonstrations_follow_the_error_rate_deterministically(tok: ChatTokenizer) -> None:
    clean = demonstration_rows(ARITHMETIC, tok, n=40, error_rate=0.0, seed=3, with_tools=False)
    flawed = demonstration_rows(ARITHMETIC, tok, n=40, error_rate=0.5, seed=3, with_tools=False)
    assert flawed == demonstration_rows(ARITHMETIC, tok, n=40, error_rate=0.5, seed=3, with_tools=False)
    differ = sum(a != b for a, b in zip(clean[0], flawed[0], strict=True))
    assert 10 <= differ <= 30  # about half of 40


def test_a_short_sft_lowers_the_nll_on_demonstrations(tok: ChatTokenizer) -> None:
    rows = demonstration_rows(ARITHMETIC, tok, n=16, error_rate=0.0, seed=0, with_tools=False)
    model = Decoder(SMALL, rngs=nnx.Rngs(0))
    before = mean_nll(model, rows, pad_id=tok.pad_id)
    logs: list[str] = []
    cfg = SFTConfig(n_demos=16, steps=8, batch_size=4, optim=OptimConfig(lr=1e-2, total_steps=8))
    info = sft_train(model, rows, cfg, pad_id=tok.pad_id, log=logs.append, log_every=4)
    after = mean_nll(model, rows, pad_id=tok.pad_id)
    assert after < before - 1.0, (before, after)
    assert [line.split(":")[0] for line in logs] == ["sft step 4/8", "sft step 8/8"]
    assert info["steps"] == 8 and info["final_nll"] < info["first_nll"]


def test_warm_start_trains_and_publishes_version_0_deterministically(tmp_path: Path) -> None:
    config = small_config(n_demos=8, steps=2, batch_size=4)
    manifests = [warm_start(Store(str(tmp_path / name)), config, log=lambda _: None) for name in ("a", "b")]
    for m in manifests:
        assert (m["version"], m["step"], m["source"], m["demos"], m["skipped"]) == (0, 0, "sft", 8, False)
    a, _ = load_published(Store(str(tmp_path / "a")), 0)
    b, _ = load_published(Store(str(tmp_path / "b")), 0)
    assert_same(a, b)
    assert not np.array_equal(params(a)[0], params(Decoder(SMALL, rngs=nnx.Rngs(0)))[0])  # it trained


def test_warm_start_writes_the_sft_loss_per_step_for_tensorboard(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "c"))
    warm_start(store, small_config(n_demos=8, steps=3, batch_size=4), log=lambda _: None)
    records = [r for name in store.list("telemetry/tb/warm_start")
               for r in _read_tfrecords(store.read(f"telemetry/tb/warm_start/{name}"))]
    nll = [r for r in records if b"\x0a\x07sft.nll" in r]
    # one scalar a step, x = the SFT step (field 2, varint), y = a finite positive nll (the last 4 bytes, float)
    assert sorted(r[9:11] for r in nll) == [b"\x10\x01", b"\x10\x02", b"\x10\x03"]
    assert all(0 < struct.unpack("<f", r[-4:])[0] < 20 for r in nll)


def test_warm_start_is_a_no_op_when_version_0_exists(local_store: Store) -> None:
    published = Decoder(SMALL, rngs=nnx.Rngs(7))
    publish_weights(local_store, published, version=0, step=0)
    logs: list[str] = []
    manifest = warm_start(local_store, small_config(), log=logs.append)
    assert manifest["skipped"] and manifest["version"] == 0
    assert logs == []
    assert_same(CampaignWeights(local_store).load(0), published)


def test_warm_start_imports_another_campaigns_latest_weights(tmp_path: Path) -> None:
    source = Store(str(tmp_path / "source"))
    publish_weights(source, Decoder(SMALL, rngs=nnx.Rngs(1)), version=0, step=0)
    newest = Decoder(SMALL, rngs=nnx.Rngs(2))
    publish_weights(source, newest, version=3, step=6)
    target = Store(str(tmp_path / "target"))
    manifest = warm_start(target, dataclasses.replace(small_config(), init_from=source.url))
    assert (manifest["source"], manifest["from_version"], manifest["version"]) == ("campaign", 3, 0)
    assert_same(CampaignWeights(target).load(0), newest)


def test_warm_start_imports_a_hugging_face_folder(local_store: Store) -> None:
    manifest = warm_start(local_store, dataclasses.replace(small_config(), init_from=str(LLAMA_FIXTURE)))
    assert manifest["source"] == "hf"
    loaded, version = load_published(local_store)
    assert version == 0
    assert_same(loaded, load_hf_checkpoint(LLAMA_FIXTURE))


@pytest.mark.slow
def test_sft_on_arithmetic_reaches_nontrivial_greedy_success(tok: ChatTokenizer) -> None:
    """The tiny model, warm-started as the stage does it on clean demonstrations, solves held-out problems.

    Measured 2026-12-02 (2 shared CPU cores): 250 steps of 16 at lr 3e-3 -> 56/64 greedy (0.875); 150 steps ->
    0.55 (copying the tool's result into the answer is learned late and steeply). The preset's flawed share
    (float answers) is left out: its greedy answers are floats, which is the point of the preset.
    """
    config = CampaignConfig.tiny().with_overrides({"sft.error_rate": 0.0, "eval.samples": 1})
    rows = demonstration_rows(config.env, tok, n=config.sft.n_demos, error_rate=config.sft.error_rate,
                              seed=config.sft.seed, with_tools=True)
    model = Decoder(config.model, rngs=nnx.Rngs(config.sft.seed))
    sft_train(model, rows, config.sft, pad_id=tok.pad_id)
    tasks = env_class("arithmetic").generate_tasks(seed=0, n=32, split="heldout")
    results = score(JaxEngine(model, config.engine), tok, tasks, config)
    print(f"held-out greedy success after SFT: {results['greedy_success_rate']:.3f}")
    assert results["greedy_success_rate"] >= 0.5
