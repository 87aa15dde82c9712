"""Resource sizing per stage, pure functions of the campaign config (what a work pool's job asks for); the
stage table (``stages.table``) names one per stage, and ``resources_for(stage, config)`` looks it up.

```
stage        pool               device memory estimate                         host CPU
prep/audit   rollstream-cpu     -                                              1
evaluate     rollstream-cpu     params + KV cache of eval concurrency          2
warm_start   rollstream-accel   params x (weights + grads + Adam moments)      4
             + activations of one SFT batch
collect      rollstream-accel   params + KV cache (slots x seq x layers x K,V)   2 + concurrency/16 (tools)
train        rollstream-accel   as warm_start, batch = batch_groups x group_size x largest bucket
```

Accelerators are counted from the device memory estimate (with headroom) over one device's memory, so a
larger model asks for more chips without anyone editing the deployment. Only accelerator stages carry a
concurrency key: ``gpu:<worker>`` is a global concurrency limit of 1 per device slot (``rollout<i>``,
``trainer``), so a scheduled campaign and a recovery never put two holders on one slot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pipelines_lib.config import CampaignConfig
from pipelines_lib.model.config import ModelConfig

Accelerator = Literal["gpu", "tpu"]
CPU_POOL = "rollstream-cpu"
ACCEL_POOL = "rollstream-accel"
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_GIB = 2**30
HEADROOM = 1.25
"""XLA scratch, fragmentation and the runtime's own buffers on top of the estimate."""


@dataclass(frozen=True, kw_only=True)
class Resources:
    pool: str
    cpu: float
    memory_gib: float
    """Host memory of the job (the container's request)."""
    accelerator: Accelerator | None
    accelerators: int
    device_memory_gib: float
    """Estimated accelerator memory the stage needs (0 for CPU stages)."""
    concurrency_key: str | None

    def job_variables(self) -> dict[str, Any]:
        """The variables every rollstream work-pool template declares (``infra/*job-template*``)."""
        return {"cpu": self.cpu, "memory_gib": self.memory_gib, "accelerators": self.accelerators}


def param_count(m: ModelConfig) -> int:
    """Parameters of the decoder: embeddings, attention, gated MLP and norms."""
    embed = m.vocab_size * m.d_model * (1 if m.tie_embeddings else 2)
    attn = m.d_model * m.head_dim * (2 * m.n_heads + 2 * m.n_kv_heads)
    attn += m.head_dim * (m.n_heads + 2 * m.n_kv_heads) if m.qkv_bias else 0
    mlp = 3 * m.d_model * m.d_ff
    norms = m.d_model * (4 if m.post_norms else 2) + (2 * m.head_dim if m.qk_norm else 0)
    return embed + m.n_layers * (attn + mlp + norms) + m.d_model


def kv_cache_bytes(m: ModelConfig, *, sequences: int, seq_len: int) -> int:
    return sequences * seq_len * m.n_layers * 2 * m.n_kv_heads * m.head_dim * _BYTES[m.dtype]


def _training_bytes(m: ModelConfig, *, sequences: int, seq_len: int) -> int:
    # bf16/fp32 weights, fp32 grads and two fp32 Adam moments; activations: ~12 d_model-wide values per
    # token per layer kept for the backward pass, plus the fp32 logits of one sequence batch.
    state = param_count(m) * (_BYTES[m.dtype] + 4 + 8)
    tokens = sequences * seq_len
    return state + tokens * (12 * m.d_model * m.n_layers * _BYTES[m.dtype] + 4 * m.vocab_size)


def cpu_light(config: CampaignConfig, *, worker_index: int = 0, accelerator: Accelerator = "gpu",
              device_memory_gib: float = 80.0) -> Resources:
    """prep and audit: a little host memory, no device."""
    return Resources(pool=CPU_POOL, cpu=1, memory_gib=2, accelerator=None, accelerators=0, device_memory_gib=0,
                     concurrency_key=None)


def evaluate_resources(config: CampaignConfig, *, worker_index: int = 0, accelerator: Accelerator = "gpu",
                       device_memory_gib: float = 80.0) -> Resources:
    m = config.model
    need = _weights(m) + kv_cache_bytes(m, sequences=config.eval.max_concurrency, seq_len=config.engine.max_seq_len)
    return Resources(pool=CPU_POOL, cpu=2, memory_gib=_host_gib(need), accelerator=None, accelerators=0,
                     device_memory_gib=0, concurrency_key=None)


def collect_resources(config: CampaignConfig, *, worker_index: int = 0, accelerator: Accelerator = "gpu",
                      device_memory_gib: float = 80.0) -> Resources:
    m = config.model
    need = _weights(m) + kv_cache_bytes(m, sequences=config.engine.num_slots, seq_len=config.engine.max_seq_len)
    return _accel(need, cpu=2 + math.ceil(config.rollout.max_concurrency / 16), slot=f"rollout{worker_index}",
                  accelerator=accelerator, device_memory_gib=device_memory_gib)


def train_resources(config: CampaignConfig, *, worker_index: int = 0, accelerator: Accelerator = "gpu",
                    device_memory_gib: float = 80.0) -> Resources:
    need = _training_bytes(config.model, sequences=config.trainer.batch_groups * config.rollout.group_size,
                           seq_len=config.trainer.seq_buckets[-1])
    return _accel(need, cpu=4, slot="trainer", accelerator=accelerator, device_memory_gib=device_memory_gib)


def warm_start_resources(config: CampaignConfig, *, worker_index: int = 0, accelerator: Accelerator = "gpu",
                         device_memory_gib: float = 80.0) -> Resources:
    need = _training_bytes(config.model, sequences=config.sft.batch_size, seq_len=config.engine.max_seq_len)
    return _accel(need, cpu=4, slot="trainer", accelerator=accelerator, device_memory_gib=device_memory_gib)


def _weights(m: ModelConfig) -> int:
    return param_count(m) * _BYTES[m.dtype]


def _accel(need: int, *, cpu: float, slot: str, accelerator: Accelerator, device_memory_gib: float) -> Resources:
    need_gib = need * HEADROOM / _GIB
    return Resources(pool=ACCEL_POOL, cpu=cpu, memory_gib=_host_gib(need), accelerator=accelerator,
                     accelerators=max(1, math.ceil(need_gib / device_memory_gib)),
                     device_memory_gib=round(need_gib, 3), concurrency_key=f"gpu:{slot}")


def _host_gib(device_bytes: int) -> float:
    # The host stages the checkpoint (one copy of the weights) besides the Python/JAX runtime's ~2 GiB.
    return float(max(2, math.ceil(2 + device_bytes * HEADROOM / _GIB)))
