"""Architecture description of the decoder: one frozen dataclass covering Llama 3, Qwen2/2.5, Qwen3 and
Gemma 2/3 (text).

The families differ only in switches (norm variant, activation, biases, q/k norms, sandwich norms,
soft-caps, sliding windows, embedding scaling, rope scaling), so one ``Decoder`` reads them all.
``from_hf_config`` maps a transformers ``config.json`` (v4 ``rope_theta``/``rope_scaling`` or v5
``rope_parameters`` spelling) onto these fields; ``to_dict``/``from_dict`` give the JSON form that
published weights carry next to their Orbax item.

Why ``from_hf_config`` reads the dict itself rather than through transformers' config classes
(``AutoConfig``): the field mapping onto ``ModelConfig`` and the refusals of what the decoder lacks (biases,
bidirectional attention, unknown rope types) are needed either way; transformers would only take over the v4
spelling and the default layer patterns (a few dozen lines), at seconds for the first ``AutoConfig`` call in a
process beyond importing transformers, where the mapping here takes well under a millisecond. ``tests/test_hf_export.py`` pins that transformers' config class of each family reads every exported
``config.json`` (and the parity fixtures' v5 files) to the same ``ModelConfig`` as this mapping does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

NORM_VARIANTS = ("rms", "gemma_rms")
"""``rms``: ``x / rms(x) * w`` (Llama, Qwen). ``gemma_rms``: ``x / rms(x) * (1 + w)`` (Gemma)."""
ACTIVATIONS = ("silu", "gelu_tanh")
"""Gate activation of the gated MLP: silu gives SwiGLU, gelu_tanh gives GeGLU."""
LAYER_TYPES = ("full", "sliding")
ROPE_SCALINGS = ("linear", "llama3")
DTYPES = ("float32", "bfloat16")
QWEN3_0P6B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 3072, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
    "tie_word_embeddings": True, "hidden_act": "silu",
}
"""The shape fields of Qwen3-0.6B's ``config.json`` (``ModelConfig.from_hf_config`` reads them)."""
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
"""Bytes of one value of each of ``DTYPES``."""

HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
}
"""transformers architecture name -> model_type this package can import."""


@dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """Rotary frequency scaling of the global-attention layers."""

    kind: str
    """``linear`` (positions divided by ``factor``) or ``llama3`` (band-wise frequency scaling)."""
    factor: float
    low_freq_factor: float = 1.0
    """llama3 only: wavelengths above ``original_max_position_embeddings / low_freq_factor`` are scaled."""
    high_freq_factor: float = 4.0
    """llama3 only: wavelengths below ``original_max_position_embeddings / high_freq_factor`` are kept."""
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.kind not in ROPE_SCALINGS:
            raise ValueError(f"RopeScaling.kind must be one of {ROPE_SCALINGS}, got {self.kind!r}")
        if self.factor <= 0:
            raise ValueError(f"RopeScaling.factor must be > 0, got {self.factor}")
        if self.kind == "llama3" and not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError(
                "RopeScaling needs 0 < low_freq_factor < high_freq_factor, got "
                f"{self.low_freq_factor} and {self.high_freq_factor}"
            )


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape and switches of a decoder-only transformer."""

    vocab_size: int
    """Token ids are in [0, vocab_size); must cover the tokenizer."""
    d_model: int
    """Width of the residual stream."""
    n_layers: int
    """Decoder blocks."""
    n_heads: int
    """Query heads per layer."""
    n_kv_heads: int
    """Key/value heads; ``n_heads`` must be a multiple (grouped-query attention)."""
    head_dim: int
    """Width of each attention head (need not be d_model / n_heads)."""
    d_ff: int
    """Hidden width of the gated MLP."""
    max_seq_len: int
    """Longest sequence (prompt + completion) the model is used with."""
    rope_theta: float = 10000.0
    """Rotary position embedding base."""
    rope_scaling: RopeScaling | None = None
    """Long-context rope scaling (``linear`` or ``llama3``); None for none."""
    local_rope_theta: float | None = None
    """Rope base of the sliding-window layers when it differs (Gemma 3); those layers are never scaled."""
    norm_eps: float = 1e-6
    """Epsilon of every RMSNorm."""
    norm: str = "rms"
    """``rms`` (weight · x̂) or ``gemma_rms`` ((1 + weight) · x̂)."""
    activation: str = "silu"
    """Gate activation of the MLP: ``silu`` (SwiGLU) or ``gelu_tanh`` (GeGLU)."""
    qkv_bias: bool = False
    """Bias on the q/k/v projections (Qwen2)."""
    qk_norm: bool = False
    """RMS-normalise each query and key head before rope (Qwen3, Gemma 3)."""
    post_norms: bool = False
    """Gemma 2/3 sandwich norms: normalise the attention and MLP outputs before the residual add."""
    tie_embeddings: bool = False
    """The output projection is the transposed input embedding."""
    embed_scale: bool = False
    """Multiply embeddings by sqrt(d_model) (Gemma)."""
    attn_logit_softcap: float | None = None
    """``c * tanh(s / c)`` on attention scores (Gemma 2)."""
    final_logit_softcap: float | None = None
    """``c * tanh(z / c)`` on output logits (Gemma 2)."""
    sliding_window: int | None = None
    """A ``sliding`` layer attends to keys with ``q_pos - k_pos < sliding_window``."""
    layer_types: tuple[str, ...] = ()
    """Per-layer ``full`` or ``sliding``; empty means all ``full``."""
    query_pre_attn_scalar: float | None = None
    """Scores are scaled by ``query_pre_attn_scalar ** -0.5`` (Gemma); None means ``head_dim ** -0.5``."""
    dtype: str = "float32"
    """Parameter and activation dtype; logits are always float32."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """Provenance only (e.g. the HF architecture); never read by the model."""

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "d_model",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "d_ff",
            "max_seq_len",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"ModelConfig.n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for rope, got {self.head_dim}")
        if self.rope_theta <= 0:
            raise ValueError(f"ModelConfig.rope_theta must be > 0, got {self.rope_theta}")
        if self.local_rope_theta is not None and self.local_rope_theta <= 0:
            raise ValueError(f"ModelConfig.local_rope_theta must be > 0, got {self.local_rope_theta}")
        if self.norm_eps <= 0:
            raise ValueError(f"ModelConfig.norm_eps must be > 0, got {self.norm_eps}")
        if self.norm not in NORM_VARIANTS:
            raise ValueError(f"ModelConfig.norm must be one of {NORM_VARIANTS}, got {self.norm!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"ModelConfig.activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"ModelConfig.dtype must be one of {DTYPES}, got {self.dtype!r}")
        for name in ("attn_logit_softcap", "final_logit_softcap", "query_pre_attn_scalar"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"ModelConfig.{name} must be > 0 or None, got {value}")
        if self.layer_types:
            if len(self.layer_types) != self.n_layers:
                raise ValueError(
                    f"ModelConfig.layer_types has {len(self.layer_types)} entries for n_layers={self.n_layers}"
                )
            bad = [t for t in self.layer_types if t not in LAYER_TYPES]
            if bad:
                raise ValueError(f"ModelConfig.layer_types entries must be in {LAYER_TYPES}, got {bad[0]!r}")
            if "sliding" in self.layer_types and (self.sliding_window is None or self.sliding_window < 1):
                raise ValueError(
                    f"ModelConfig.sliding_window must be >= 1 with sliding layers, got {self.sliding_window}"
                )

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """``layer_types`` with the empty default spelled out."""
        return self.layer_types or ("full",) * self.n_layers

    @property
    def attn_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @classmethod
    def tiny(cls) -> ModelConfig:
        """The embedded default: a ~1M-parameter Llama-style model that trains in seconds on 2 CPU cores."""
        return cls(
            vocab_size=512,
            d_model=128,
            n_layers=4,
            n_heads=4,
            n_kv_heads=2,
            head_dim=32,
            d_ff=384,
            max_seq_len=256,
            tie_embeddings=True,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; ``from_dict`` inverts it exactly."""
        out = dataclasses.asdict(self)
        out["layer_types"] = list(self.layer_types)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"ModelConfig.from_dict: unknown keys {unknown}")
        kwargs = dict(data)
        if kwargs.get("rope_scaling") is not None:
            kwargs["rope_scaling"] = RopeScaling(**kwargs["rope_scaling"])
        kwargs["layer_types"] = tuple(kwargs.get("layer_types", ()))
        return cls(**kwargs)

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any], *, max_seq_len: int | None = None) -> ModelConfig:
        """Map a transformers ``config.json`` dict onto a ``ModelConfig``.

        ``max_seq_len`` defaults to the checkpoint's ``max_position_embeddings``.
        """
        model_type = hf.get("model_type")
        architectures = hf.get("architectures") or []
        arch = architectures[0] if architectures else None
        if arch is not None and arch not in HF_ARCHITECTURES:
            raise ValueError(f"unknown architecture {arch!r}; supported: {sorted(HF_ARCHITECTURES)}")
        if model_type not in HF_ARCHITECTURES.values():
            raise ValueError(
                f"unknown model_type {model_type!r}; supported: {sorted(set(HF_ARCHITECTURES.values()))}"
            )
        if hf.get("use_bidirectional_attention"):
            raise ValueError("use_bidirectional_attention=True is not supported (decoder-only causal model)")
        if hf.get("mlp_bias"):
            raise ValueError("mlp_bias=True is not supported")
        if hf.get("attention_bias") and model_type != "qwen2":
            # Outside Qwen2 the flag also puts a bias on o_proj, which this decoder does not have.
            raise ValueError(f"attention_bias=True is not supported for {model_type}")
        gemma = model_type.startswith("gemma")
        n_heads = hf["num_attention_heads"]
        n_layers = hf["num_hidden_layers"]
        global_rope, local_rope = _hf_rope(hf, model_type)
        layer_types: tuple[str, ...] = ()
        if model_type in ("gemma2", "gemma3_text") or hf.get("use_sliding_window"):
            raw = hf.get("layer_types") or _hf_default_layer_types(model_type, n_layers, hf)
            layer_types = tuple("sliding" if t == "sliding_attention" else "full" for t in raw)
            if "sliding" not in layer_types:
                layer_types = ()
        activation = hf.get("hidden_activation") or hf.get("hidden_act", "silu")
        if activation in ("gelu_pytorch_tanh", "gelu_tanh"):
            activation = "gelu_tanh"
        return cls(
            vocab_size=hf["vocab_size"],
            d_model=hf["hidden_size"],
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=hf.get("num_key_value_heads") or n_heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads,
            d_ff=hf["intermediate_size"],
            max_seq_len=max_seq_len or hf.get("max_position_embeddings", 2048),
            rope_theta=global_rope["theta"],
            rope_scaling=global_rope["scaling"],
            local_rope_theta=local_rope,
            norm_eps=hf.get("rms_norm_eps", 1e-6),
            norm="gemma_rms" if gemma else "rms",
            activation=activation,
            qkv_bias=model_type == "qwen2",
            qk_norm=model_type in ("qwen3", "gemma3_text"),
            post_norms=gemma,
            tie_embeddings=bool(hf.get("tie_word_embeddings", gemma)),
            embed_scale=gemma,
            attn_logit_softcap=hf.get("attn_logit_softcapping") if gemma else None,
            final_logit_softcap=hf.get("final_logit_softcapping") if gemma else None,
            sliding_window=hf.get("sliding_window") if layer_types else None,
            layer_types=layer_types,
            query_pre_attn_scalar=hf.get("query_pre_attn_scalar") if gemma else None,
            dtype="float32",
            extra={"hf_model_type": model_type, "hf_architecture": arch},
        )


def _hf_rope(hf: dict[str, Any], model_type: str) -> tuple[dict[str, Any], float | None]:
    """(global theta + scaling, local theta or None) from either config spelling."""
    params = hf.get("rope_parameters")
    if params is not None:  # transformers v5
        if "full_attention" in params:
            glob, local = params["full_attention"], params.get("sliding_attention")
        else:
            glob, local = params, None
    else:  # transformers v4 config.json files on disk
        glob = dict(hf.get("rope_scaling") or {})
        glob["rope_theta"] = hf.get("rope_theta", 10000.0)
        local = {"rope_theta": hf["rope_local_base_freq"]} if "rope_local_base_freq" in hf else None
        if local is None and model_type == "gemma3_text":
            local = {"rope_theta": 10000.0}
    kind = glob.get("rope_type") or glob.get("type") or "default"
    scaling = None
    if kind != "default":
        if kind not in ROPE_SCALINGS:
            raise ValueError(f"unsupported rope_type {kind!r}; supported: {('default', *ROPE_SCALINGS)}")
        scaling = RopeScaling(
            kind=kind,
            factor=float(glob["factor"]),
            **(
                {
                    "low_freq_factor": float(glob["low_freq_factor"]),
                    "high_freq_factor": float(glob["high_freq_factor"]),
                    "original_max_position_embeddings": int(glob["original_max_position_embeddings"]),
                }
                if kind == "llama3"
                else {}
            ),
        )
    if local is not None and (local.get("rope_type") or "default") != "default":
        raise ValueError(f"unsupported rope_type {local.get('rope_type')!r} for sliding layers")
    local_theta = float(local["rope_theta"]) if local is not None else None
    return {"theta": float(glob["rope_theta"]), "scaling": scaling}, local_theta


def _hf_default_layer_types(model_type: str, n_layers: int, hf: dict[str, Any]) -> list[str]:
    """Layer pattern of configs written before ``layer_types`` existed."""
    if model_type == "gemma2":  # even layers slide
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)]
    if model_type == "gemma3_text":
        pattern = hf.get("sliding_window_pattern", 6)
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)]
    # Qwen2/3: with use_sliding_window, layers from max_window_layers on slide.
    first_sliding = hf.get("max_window_layers", n_layers) if hf.get("use_sliding_window") else n_layers
    return ["sliding_attention" if i >= first_sliding else "full_attention" for i in range(n_layers)]


def kv_bytes_per_position(cfg: ModelConfig, dtype: str | None = None) -> int:
    """Bytes of the keys and values one position holds over every layer, in ``dtype`` (default ``cfg.dtype``)."""
    return cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * DTYPE_BYTES[dtype or cfg.dtype]


def param_count(cfg: ModelConfig) -> int:
    """Number of parameters of a ``Decoder`` built from ``cfg`` (a quick size check)."""
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    attn = cfg.d_model * (q + 2 * kv) + q * cfg.d_model + (q + 2 * kv if cfg.qkv_bias else 0)
    norms = (4 if cfg.post_norms else 2) * cfg.d_model + (2 * cfg.head_dim if cfg.qk_norm else 0)
    layer = attn + 3 * cfg.d_model * cfg.d_ff + norms
    embed = cfg.vocab_size * cfg.d_model * (1 if cfg.tie_embeddings else 2)
    return cfg.n_layers * layer + embed + cfg.d_model
