"""HF checkpoint import: logits parity with transformers per family, and loud errors for broken folders.

Fixtures are built by ``scripts/make_parity_fixtures.py`` (tiny random models, float32). Parity
tolerance: max |logit difference| <= 1e-4 (logits are O(1); observed differences are ~1e-6).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.hf_import import CheckpointError, load_hf_checkpoint, read_hf_config

FIXTURES = Path(__file__).parent / "fixtures" / "parity"
FAMILIES = ["llama", "qwen2", "qwen3", "gemma2", "gemma3"]


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers(family: str) -> None:
    model = load_hf_checkpoint(FIXTURES / family)
    reference = np.load(FIXTURES / family / "reference.npz")
    logits = np.asarray(nnx.jit(lambda m, t: m(t))(model, jnp.asarray(reference["input_ids"])))
    np.testing.assert_allclose(logits, reference["logits"], rtol=0, atol=1e-4)


def test_family_features_are_read_from_config() -> None:
    llama, qwen2, qwen3, gemma2, gemma3 = (read_hf_config(FIXTURES / f) for f in FAMILIES)
    assert llama.rope_scaling is not None and llama.rope_scaling.kind == "llama3" and not llama.tie_embeddings
    assert qwen2.qkv_bias and qwen2.tie_embeddings and not qwen2.qk_norm
    assert qwen3.qk_norm and qwen3.head_dim == 16 and not qwen3.qkv_bias
    assert (gemma2.norm, gemma2.activation, gemma2.post_norms, gemma2.embed_scale) == (
        "gemma_rms",
        "gelu_tanh",
        True,
        True,
    )
    assert (gemma2.attn_logit_softcap, gemma2.final_logit_softcap, gemma2.query_pre_attn_scalar) == (
        2.0,
        5.0,
        24,
    )
    assert gemma2.layer_types == ("sliding", "full") and gemma2.sliding_window == 4
    assert gemma3.qk_norm and gemma3.local_rope_theta == 10000.0 and gemma3.rope_theta == 1e6
    assert gemma3.rope_scaling is not None and gemma3.rope_scaling.kind == "linear"


def test_transformers_v4_config_spelling_maps_the_same() -> None:
    v5 = json.loads((FIXTURES / "llama" / "config.json").read_text())
    v4 = dict(v5)
    rope = dict(v4.pop("rope_parameters"))
    v4.update(rope_theta=rope.pop("rope_theta"), rope_scaling=rope)
    assert ModelConfig.from_hf_config(v4) == ModelConfig.from_hf_config(v5)


def test_v4_qwen_sliding_window_layers_and_unsupported_biases() -> None:
    qwen2 = json.loads((FIXTURES / "qwen2" / "config.json").read_text())
    del qwen2["layer_types"]
    cfg = ModelConfig.from_hf_config(
        {**qwen2, "use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}
    )
    assert (cfg.layer_types, cfg.sliding_window) == (("full", "sliding"), 8)
    llama = json.loads((FIXTURES / "llama" / "config.json").read_text())
    with pytest.raises(ValueError, match="attention_bias=True is not supported for llama"):
        ModelConfig.from_hf_config({**llama, "attention_bias": True})
    with pytest.raises(ValueError, match="mlp_bias=True"):
        ModelConfig.from_hf_config({**llama, "mlp_bias": True})


def copy_fixture(family: str, tmp_path: Path) -> Path:
    folder = tmp_path / family
    shutil.copytree(FIXTURES / family, folder)
    return folder


def rewrite_tensors(file: Path, edit) -> None:
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file)


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    folder = copy_fixture("qwen3", tmp_path)
    rewrite_tensors(folder / "model.safetensors", lambda t: t.pop("model.layers.1.self_attn.k_norm.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'model.layers.1.self_attn.k_norm.weight'"):
        load_hf_checkpoint(folder)


def test_wrong_shape_is_named_with_its_file(tmp_path: Path) -> None:
    folder = copy_fixture("gemma2", tmp_path)

    def shrink(t: dict[str, np.ndarray]) -> None:
        t["model.layers.0.mlp.up_proj.weight"] = t["model.layers.0.mlp.up_proj.weight"][:60]

    rewrite_tensors(folder / "model.safetensors", shrink)
    with pytest.raises(
        CheckpointError,
        match=r"model.safetensors: tensor 'model.layers.0.mlp.up_proj.weight' has shape \(32, 60\), expected \(32, 64\)",
    ):
        load_hf_checkpoint(folder)


def test_unexpected_tensor_is_named(tmp_path: Path) -> None:
    folder = copy_fixture("qwen2", tmp_path)
    rewrite_tensors(
        folder / "model.safetensors",
        lambda t: t.update({"model.layers.0.mlp.extra.weight": np.zeros(3, np.float32)}),
    )
    with pytest.raises(CheckpointError, match="unexpected tensor 'model.layers.0.mlp.extra.weight'"):
        load_hf_checkpoint(folder)


def test_missing_shard_is_named(tmp_path: Path) -> None:
    folder = copy_fixture("llama", tmp_path)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="shard 'model-00002-of-00002.safetensors' .* not found"):
        load_hf_checkpoint(folder)


def test_unknown_architecture_and_missing_config_are_named(tmp_path: Path) -> None:
    folder = copy_fixture("llama", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["MixtralForCausalLM"]}))
    with pytest.raises(CheckpointError, match=r"config.json: .*unknown architecture 'MixtralForCausalLM'"):
        load_hf_checkpoint(folder)
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json: not found"):
        load_hf_checkpoint(folder)
