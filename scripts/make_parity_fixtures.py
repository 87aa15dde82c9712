"""Build the HF parity fixtures in ``tests/fixtures/parity/<family>/`` (needs torch; run once, commit output).

Each fixture is a tiny randomly initialised transformers model saved as ``config.json`` +
safetensors, plus ``reference.npz`` holding a fixed ``input_ids`` batch and the float32 logits
transformers computes for it. Every parameter (norm weights and biases included) is perturbed away
from its default init so the test sees each weight's role. Dimensions are chosen so that each
family-specific feature actually changes the output: a sliding window shorter than the input,
soft-caps small enough to bend the logits, a llama3 rope band that covers the head's frequencies, a
head_dim different from d_model / n_heads. The llama fixture is saved sharded to cover
``model.safetensors.index.json``.

    .venv/bin/python scripts/make_parity_fixtures.py [--out tests/fixtures/parity]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import torch
import transformers

COMMON = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
}

FAMILIES: dict[str, tuple[str, str, dict]] = {
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "tie_word_embeddings": False,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True, "rope_theta": 1000000.0}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16, "tie_word_embeddings": False}),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {
            "head_dim": 16,
            "query_pre_attn_scalar": 24,
            "sliding_window": 4,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 5.0,
        },
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "head_dim": 16,
            "query_pre_attn_scalar": 16,
            "sliding_window": 4,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
            },
        },
    ),
}

SEQ_LEN = 12
BATCH = 2


def build(family: str, out: Path, seed: int) -> None:
    config_cls, model_cls, extra = FAMILIES[family]
    config = getattr(transformers, config_cls)(**COMMON, **extra)
    config.architectures = [model_cls]
    config._attn_implementation = "eager"  # the reference path with soft-capping and sliding windows
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).to(torch.float32).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    target = out / family
    if target.exists():
        shutil.rmtree(target)
    shard = {"max_shard_size": "60KB"} if family == "llama" else {}
    model.save_pretrained(target, **shard)
    (target / "generation_config.json").unlink(missing_ok=True)
    input_ids = (
        np.random.default_rng(seed).integers(0, COMMON["vocab_size"], (BATCH, SEQ_LEN)).astype(np.int32)
    )
    with torch.no_grad():
        logits = model(torch.from_numpy(input_ids).long()).logits.float().numpy()
    np.savez(target / "reference.npz", input_ids=input_ids, logits=logits)
    files = sorted(p.name for p in target.iterdir())
    size = sum(p.stat().st_size for p in target.iterdir())
    print(f"{family}: {size / 1024:.0f} KB {files} (transformers {transformers.__version__})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/parity"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for family in FAMILIES:
        build(family, args.out, args.seed)


if __name__ == "__main__":
    main()
