"""HF export: import -> export -> import is bit-identical for every family, sharding and the tokenizer travel,
configs without an HF equivalent are refused, and transformers itself loads an exported folder.

The transformers check runs in the vLLM virtualenv (it has torch; the main one does not) as a subprocess:
logits of the exported folder against the JAX model's on the parity fixtures' inputs, within 1e-4 as in
``test_hf_import.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx, traverse_util

from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.hf_export import hf_config, save_hf_checkpoint
from pipelines_lib.model.hf_import import load_hf_checkpoint, read_hf_config
from pipelines_lib.model.tokenizer import ensure_default_tokenizer, tokenizer_files_hash
from tests.test_hf_import import FAMILIES, FIXTURES
from tests.test_vllm_engine import vllm_python


def params(model: Decoder) -> dict:
    return {k: np.asarray(v) for k, v in traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(model, nnx.Param))).items()}


@pytest.mark.parametrize("family", FAMILIES)
def test_import_export_import_is_bit_identical(family: str, tmp_path: Path) -> None:
    first = load_hf_checkpoint(FIXTURES / family)
    # Small shards: the index path is exercised for every family.
    save_hf_checkpoint(first, tmp_path / family, max_shard_bytes=16_384)
    assert (tmp_path / family / "model.safetensors.index.json").is_file()
    again = load_hf_checkpoint(tmp_path / family)
    assert again.cfg == first.cfg
    a, b = params(first), params(again)
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key


def test_config_is_transformers_5_layout_and_tokenizer_files_travel(tmp_path: Path) -> None:
    tokenizer = ensure_default_tokenizer()
    folder = save_hf_checkpoint(Decoder(ModelConfig.tiny(), rngs=nnx.Rngs(0)), tmp_path / "tiny",
                                tokenizer_dir=tokenizer)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    assert config["rope_parameters"] == {"rope_theta": 10000.0, "rope_type": "default"}
    assert "rope_theta" not in config and config["dtype"] == "float32"
    assert sorted(p.name for p in folder.iterdir()) == [
        "chat_template.jinja", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json"]
    assert tokenizer_files_hash(folder) == tokenizer_files_hash(tokenizer)
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == config["eos_token_id"] == 2  # <|im_end|> of the default tokenizer


@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_config_classes_read_each_config_json_as_our_mapping_does(family: str, tmp_path: Path) -> None:
    import transformers

    cfg = read_hf_config(FIXTURES / family)
    for name, folder in (("fixture", FIXTURES / family), ("export", tmp_path)):
        if name == "export":
            (tmp_path / "config.json").write_text(json.dumps(hf_config(cfg)))
        theirs = transformers.AutoConfig.from_pretrained(folder)  # normalises rope, fills defaults
        assert theirs.model_type == cfg.extra["hf_model_type"]  # the family's own class (Qwen3Config, ...)
        assert ModelConfig.from_hf_config(theirs.to_dict(), max_seq_len=cfg.max_seq_len) == cfg, name


def test_a_config_with_no_hf_equivalent_is_refused() -> None:
    llama_with_sliding = dataclasses.replace(ModelConfig.tiny(), layer_types=("full", "sliding", "full", "sliding"),
                                             sliding_window=8)
    with pytest.raises(ValueError, match=r"no llama equivalent: .*layer_types=\('full', 'sliding'"):
        hf_config(llama_with_sliding)


def test_an_existing_folder_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text("{}")
    with pytest.raises(FileExistsError, match="not empty"):
        save_hf_checkpoint(Decoder(ModelConfig.tiny(), rngs=nnx.Rngs(0)), tmp_path / "out")


_TRANSFORMERS_LOGITS = """
import sys, numpy as np, torch, transformers
for folder in sys.argv[1:]:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        logits = model(torch.from_numpy(np.load(folder + "/ids.npy")).long()).logits
    np.save(folder + "/logits.npy", logits.float().numpy())
"""


def test_transformers_loads_every_exported_family_and_matches_the_jax_logits(tmp_path: Path) -> None:
    python = vllm_python()
    models, folders = {}, []
    for family in FAMILIES:
        models[family] = load_hf_checkpoint(FIXTURES / family)
        folders.append(save_hf_checkpoint(models[family], tmp_path / family))
        np.save(folders[-1] / "ids.npy", np.load(FIXTURES / family / "reference.npz")["input_ids"])
    subprocess.run([str(python), "-c", _TRANSFORMERS_LOGITS, *map(str, folders)], check=True, timeout=900,
                   env={**os.environ, "PYTHONPATH": ""})
    for family, folder in zip(FAMILIES, folders, strict=True):
        ours = np.asarray(nnx.jit(lambda m, t: m(t))(models[family], jnp.asarray(np.load(folder / "ids.npy"))))
        np.testing.assert_allclose(np.load(folder / "logits.npy"), ours, rtol=0, atol=1e-4, err_msg=family)
