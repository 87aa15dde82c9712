"""Write a ``Decoder`` as a Hugging Face checkpoint folder: the inverse of ``hf_import``.

```
hf_files(model, tokenizer_dir=...)  -> {file name: bytes}
    config.json                     transformers-5 layout (``rope_parameters``, ``dtype``, ``layer_types``)
    model.safetensors               or model-0000i-of-0000n.safetensors + model.safetensors.index.json
    generation_config.json          stop ids and pad id of the tokenizer
    tokenizer files                 copied byte for byte (``TOKENIZER_FILES`` present in ``tokenizer_dir``)
save_hf_checkpoint(model, folder)   the same files in a new local folder
```

Every tensor goes under the name ``hf_import.hf_names`` gives its parameter (each layer of a stacked layer
parameter under its own name, kernels transposed back to HF's ``[out, in]``), so import -> export -> import is bit-identical. The family (llama, qwen2, qwen3, gemma2,
gemma3_text) comes from the config's provenance when it was imported, else from its switches; the written
``config.json`` is checked to map back onto the same ``ModelConfig``, so a config with no HF equivalent (a Llama
with sliding layers, say) fails here, naming the fields, instead of exporting a folder that loads differently.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax.numpy as jnp
from flax import nnx, traverse_util
from safetensors.flax import save as safetensors_bytes

from pipelines_lib.model.config import HF_ARCHITECTURES, ModelConfig
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.hf_import import hf_names
from pipelines_lib.model.tokenizer import TOKENIZER_FILES, load_tokenizer

TRANSFORMERS_LAYOUT = "5.0.0"
"""``transformers_version`` written into config files: the layout they follow."""
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3
"""Tensors are split into shards of at most this size (a single tensor larger than it gets a shard alone)."""
_ARCHITECTURE = {model_type: arch for arch, model_type in HF_ARCHITECTURES.items()}


def hf_model_type(cfg: ModelConfig) -> str:
    """The transformers ``model_type`` this config is written as."""
    imported = cfg.extra.get("hf_model_type")
    if imported in _ARCHITECTURE:
        return imported
    if cfg.norm == "gemma_rms":
        return "gemma3_text" if cfg.qk_norm else "gemma2"
    if cfg.qk_norm:
        return "qwen3"
    return "qwen2" if cfg.qkv_bias else "llama"


def _rope(theta: float, scaling: Any) -> dict[str, Any]:
    if scaling is None:
        return {"rope_theta": theta, "rope_type": "default"}
    out = {"rope_theta": theta, "rope_type": scaling.kind, "factor": scaling.factor}
    if scaling.kind == "llama3":
        out |= {"low_freq_factor": scaling.low_freq_factor, "high_freq_factor": scaling.high_freq_factor,
                "original_max_position_embeddings": scaling.original_max_position_embeddings}
    return out


def hf_config(cfg: ModelConfig, *, eos_ids: tuple[int, ...] = (), pad_id: int | None = None) -> dict[str, Any]:
    """``config.json`` of ``cfg`` in the transformers-5 layout; ``from_hf_config`` maps it back onto ``cfg``."""
    model_type = hf_model_type(cfg)
    gemma = model_type.startswith("gemma")
    rope = _rope(cfg.rope_theta, cfg.rope_scaling)
    if cfg.local_rope_theta is not None:
        rope = {"full_attention": rope, "sliding_attention": _rope(cfg.local_rope_theta, None)}
    out: dict[str, Any] = {
        "architectures": [_ARCHITECTURE[model_type]],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_parameters": rope,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": cfg.qkv_bias,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "dtype": cfg.dtype,
        "use_cache": True,
        "eos_token_id": list(eos_ids) if len(eos_ids) != 1 else eos_ids[0],
        "pad_token_id": pad_id,
        "transformers_version": TRANSFORMERS_LAYOUT,
    }
    out["hidden_activation" if gemma else "hidden_act"] = (
        "gelu_pytorch_tanh" if cfg.activation == "gelu_tanh" else cfg.activation
    )
    layer_types = [f"{kind}_attention" for kind in cfg.layer_kinds]
    if gemma:
        out |= {"attn_logit_softcapping": cfg.attn_logit_softcap, "final_logit_softcapping": cfg.final_logit_softcap,
                "query_pre_attn_scalar": cfg.query_pre_attn_scalar or cfg.head_dim,
                "sliding_window": cfg.sliding_window, "layer_types": layer_types}
    elif model_type in ("qwen2", "qwen3"):
        sliding = "sliding" in cfg.layer_kinds
        out |= {"use_sliding_window": sliding, "sliding_window": cfg.sliding_window if sliding else None,
                "max_window_layers": cfg.layer_kinds.index("sliding") if sliding else cfg.n_layers,
                "layer_types": layer_types}
    _check_round_trip(cfg, out)
    return out


def _check_round_trip(cfg: ModelConfig, out: dict[str, Any]) -> None:
    back = ModelConfig.from_hf_config(out, max_seq_len=cfg.max_seq_len)
    differ = [f.name for f in dataclasses.fields(cfg)
              if f.name not in ("dtype", "extra") and getattr(back, f.name) != getattr(cfg, f.name)]
    if differ:
        raise ValueError(f"ModelConfig has no {out['model_type']} equivalent: "
                         + ", ".join(f"{n}={getattr(cfg, n)!r} would load as {getattr(back, n)!r}" for n in differ))


def hf_tensors(model: Decoder) -> dict[str, jnp.ndarray]:
    """HF tensor name -> array, in the checkpoint's own layout and the model's dtype."""
    flat = traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    out = {}
    for path, value in flat.items():
        names, transpose = hf_names(path, model.cfg)
        per_name = list(value) if path[0] == "layers" else [value]  # the stacked layers: one tensor each
        for name, array in zip(names, per_name, strict=True):
            out[name] = jnp.asarray(array.T if transpose else array)
    return dict(sorted(out.items()))


def _shards(tensors: dict[str, jnp.ndarray], max_shard_bytes: int) -> list[dict[str, jnp.ndarray]]:
    shards: list[dict[str, jnp.ndarray]] = [{}]
    size = 0
    for name, array in tensors.items():
        if shards[-1] and size + array.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = array
        size += array.nbytes
    return shards


def hf_files(model: Decoder, *, tokenizer_dir: str | Path | None = None,
             max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> dict[str, bytes]:
    """The files of ``model``'s HF checkpoint folder, by name (see the module docstring)."""
    if max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes must be >= 1, got {max_shard_bytes}")
    eos_ids: tuple[int, ...] = ()
    pad_id = None
    files: dict[str, bytes] = {}
    if tokenizer_dir is not None:
        tokenizer = load_tokenizer(tokenizer_dir)
        eos_ids, pad_id = tokenizer.stop_ids, tokenizer.pad_id
        for name in TOKENIZER_FILES:
            if (Path(tokenizer_dir) / name).is_file():
                files[name] = (Path(tokenizer_dir) / name).read_bytes()
    config = hf_config(model.cfg, eos_ids=eos_ids, pad_id=pad_id)
    files["config.json"] = _json_bytes(config)
    files["generation_config.json"] = _json_bytes(
        {"eos_token_id": config["eos_token_id"], "pad_token_id": pad_id, "transformers_version": TRANSFORMERS_LAYOUT})
    tensors = hf_tensors(model)
    shards = _shards(tensors, max_shard_bytes)
    metadata = {"format": "pt"}  # transformers refuses safetensors files without a known format
    if len(shards) == 1:
        files["model.safetensors"] = safetensors_bytes(shards[0], metadata=metadata)
        return files
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        files[name] = safetensors_bytes(shard, metadata=metadata)
        weight_map |= dict.fromkeys(shard, name)
    files["model.safetensors.index.json"] = _json_bytes(
        {"metadata": {"total_size": sum(a.nbytes for a in tensors.values())}, "weight_map": weight_map})
    return files


def save_hf_checkpoint(model: Decoder, folder: str | Path, *, tokenizer_dir: str | Path | None = None,
                       max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> Path:
    """Write ``model`` as an HF checkpoint into ``folder`` (created; refused if it exists and is not empty)."""
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()):
        raise FileExistsError(f"{folder}: not empty; refusing to write an HF checkpoint over it")
    files = hf_files(model, tokenizer_dir=tokenizer_dir, max_shard_bytes=max_shard_bytes)
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()
