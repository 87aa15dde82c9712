"""Load a local Hugging Face checkpoint folder into a ``Decoder``. Never downloads.

A folder holds ``config.json`` and either ``model.safetensors`` or shards listed in
``model.safetensors.index.json``. The config is mapped by ``ModelConfig.from_hf_config``; then every
parameter of the (abstract, never randomly initialised) ``Decoder`` is looked up under its HF name,
shape-checked and placed. Anything missing, misshapen or left over is an error naming the file and the
tensor, so a wrong folder fails loudly instead of loading half a model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax.numpy as jnp
from flax import nnx, traverse_util
from safetensors import safe_open

from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
"""Buffers some older checkpoints saved; recomputed here."""


class CheckpointError(ValueError):
    """The folder does not hold a checkpoint this decoder can load."""


def load_hf_checkpoint(
    folder: str | Path, *, dtype: str | None = None, max_seq_len: int | None = None
) -> Decoder:
    """Decoder with the weights of the HF checkpoint in ``folder``.

    ``dtype`` overrides the parameter dtype (default float32); ``max_seq_len`` defaults to the
    checkpoint's ``max_position_embeddings``.
    """
    folder = Path(folder)
    cfg = read_hf_config(folder, max_seq_len=max_seq_len)
    if dtype is not None:
        cfg = ModelConfig.from_dict({**cfg.to_dict(), "dtype": dtype})
    tensors = _tensor_index(folder)
    abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    expected = traverse_util.flatten_dict(nnx.to_pure_dict(state))
    values: dict[tuple[Any, ...], Any] = {}
    used: set[str] = set()
    for path, leaf in expected.items():
        names, transpose = hf_names(path, cfg)
        stacked = path[0] == "layers"  # one HF tensor per layer, stacked along the parameter's leading axis
        shape = leaf.shape[1:] if stacked else leaf.shape
        arrays = [_read_tensor(tensors, folder, name, path, transpose, shape) for name in names]
        values[path] = jnp.asarray(jnp.stack(arrays) if stacked else arrays[0], dtype=leaf.dtype)
        used.update(names)
    leftover = sorted(
        n
        for n in set(tensors) - used
        if not n.endswith(_IGNORED_SUFFIXES) and not (cfg.tie_embeddings and n == "lm_head.weight")
    )
    if leftover:
        raise CheckpointError(
            f"{tensors[leftover[0]]}: unexpected tensor {leftover[0]!r} ({len(leftover)} unexpected in all)"
        )
    nnx.replace_by_pure_dict(state, traverse_util.unflatten_dict(values))
    return nnx.merge(graphdef, state)


def read_hf_config(folder: str | Path, *, max_seq_len: int | None = None) -> ModelConfig:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path}: not found (is {folder} a Hugging Face checkpoint folder?)")
    try:
        return ModelConfig.from_hf_config(json.loads(path.read_text()), max_seq_len=max_seq_len)
    except (KeyError, ValueError, TypeError) as err:
        raise CheckpointError(f"{path}: {err!r}") from err


def hf_names(path: tuple[Any, ...], cfg: ModelConfig) -> tuple[list[str], bool]:
    """HF tensor names of a ``Decoder`` parameter path, and whether HF stores them transposed ([out, in]).

    A parameter of the stacked layers (``layers/...``, leading axis the layer) has one name per layer, in
    order; every other parameter has one."""
    head = path[0]
    if head == "embed":
        return ["model.embed_tokens.weight"], False
    if head == "final_norm":
        return ["model.norm.weight"], False
    if head == "lm_head":
        return ["lm_head.weight"], True
    _, module, *rest = path
    norms = {
        "attn_norm": "input_layernorm",
        # Llama/Qwen call their pre-MLP norm post_attention_layernorm; Gemma uses that name for the
        # sandwich norm on the attention output and calls the pre-MLP one pre_feedforward_layernorm.
        "mlp_norm": "pre_feedforward_layernorm" if cfg.post_norms else "post_attention_layernorm",
        "attn_post_norm": "post_attention_layernorm",
        "mlp_post_norm": "post_feedforward_layernorm",
    }
    transpose = False
    if module in norms:
        suffix = f"{norms[module]}.weight"
    else:
        sub, leaf = rest
        group = "self_attn" if module == "attn" else "mlp"
        # q_norm / k_norm hold a ``scale``; projections a ``kernel`` (transposed in HF) and maybe a ``bias``.
        suffix = f"{group}.{sub}.{'bias' if leaf == 'bias' else 'weight'}"
        transpose = leaf == "kernel"
    return [f"model.layers.{i}.{suffix}" for i in range(cfg.n_layers)], transpose


def _read_tensor(tensors: dict[str, Path], folder: Path, name: str, path: tuple[Any, ...], transpose: bool,
                 shape: tuple[int, ...]) -> Any:
    """Tensor ``name`` in the parameter's layout (``shape``), or an error naming the file and the tensor."""
    if name not in tensors:
        raise CheckpointError(f"{folder}: missing tensor {name!r} (for parameter {'/'.join(map(str, path))})")
    with safe_open(tensors[name], framework="flax") as f:
        array = f.get_tensor(name)
    if transpose:
        array = array.T
    if array.shape != shape:
        raise CheckpointError(
            f"{tensors[name]}: tensor {name!r} has shape {tuple(array.shape)}, expected {tuple(shape)}"
        )
    return array


def _tensor_index(folder: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file holding it."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (KeyError, ValueError) as err:
            raise CheckpointError(f"{index}: malformed index ({err!r})") from err
        out = {}
        for name, file in weight_map.items():
            shard = folder / file
            if not shard.is_file():
                raise CheckpointError(f"{index}: shard {file!r} (holding {name!r}) not found")
            out[name] = shard
        return out
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no *.safetensors files and no model.safetensors.index.json")
    out = {}
    for file in files:
        with safe_open(file, framework="flax") as f:
            out.update({name: file for name in f.keys()})  # noqa: SIM118 - safe_open is not a Mapping
    return out
