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

Accelerator stages are sized by accelerator type (``ACCELERATORS``: ``v5e``, ``v5p``, ``v6e`` TPUs, ``H100``,
``A100`` GPUs) and, optionally, a slice shape: a TPU ``topology`` (``4x4``, ``2x2x2``) or a GPU count. Without one,
the chips are counted from the device memory estimate (with headroom) over one chip's memory, rounded up to a
power of two, so a larger model asks for more chips without anyone editing the deployment; with one, a shape that
cannot hold the estimate is refused. The result says how many hosts the slice has and how many chips each (a
multi-host TPU slice runs one process per host: ``infra/kubernetes-tpu-slice-job-template.json``) and the mesh the
stage's config builds on those chips. Only accelerator stages carry a concurrency key: ``gpu:<worker>`` is a global
concurrency limit of 1 per device slot (``rollout<i>``, ``trainer``), so a scheduled campaign and a recovery never
put two holders on one slot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pipelines_lib.model.config import DTYPE_BYTES, kv_bytes_per_position

if TYPE_CHECKING:  # annotations only: the stage table imports this module, and `rollstream status` the table
    from pipelines_lib.config import CampaignConfig
    from pipelines_lib.mesh import MeshConfig
    from pipelines_lib.model.config import ModelConfig


@dataclass(frozen=True, kw_only=True)
class AcceleratorType:
    """One kind of chip as a GKE node pool offers it."""

    kind: Literal["gpu", "tpu"]
    memory_gib: float
    """Memory of one chip (HBM)."""
    node_label: str
    """Value of ``cloud.google.com/gke-tpu-accelerator`` (TPU) or ``cloud.google.com/gke-accelerator`` (GPU)."""
    chips_per_host: int
    """Chips of each host of a multi-host slice (TPU), or GPUs of one node."""
    single_host_chips: int
    """The largest slice one host holds."""


ACCELERATORS: dict[str, AcceleratorType] = {
    "v5e": AcceleratorType(kind="tpu", memory_gib=16, node_label="tpu-v5-lite-podslice", chips_per_host=4,
                           single_host_chips=8),
    "v5p": AcceleratorType(kind="tpu", memory_gib=95, node_label="tpu-v5p-slice", chips_per_host=4,
                           single_host_chips=4),
    "v6e": AcceleratorType(kind="tpu", memory_gib=32, node_label="tpu-v6e-slice", chips_per_host=4,
                           single_host_chips=8),
    "H100": AcceleratorType(kind="gpu", memory_gib=80, node_label="nvidia-h100-80gb", chips_per_host=8,
                            single_host_chips=8),
    "A100": AcceleratorType(kind="gpu", memory_gib=40, node_label="nvidia-tesla-a100", chips_per_host=8,
                            single_host_chips=8),
}
"""Accelerator types by name; ``resources_for(..., accelerator=NAME)`` validates against it."""


@dataclass(frozen=True, kw_only=True)
class DeviceSlice:
    """The chips one run of a stage gets: a TPU slice of ``topology``, or GPUs of one node."""

    accelerator: str
    topology: str
    """TPU: ``AxB`` or ``AxBxC`` chips; GPU: the number of GPUs."""
    chips: int
    hosts: int
    chips_per_host: int


def device_slice(accelerator: str, topology: str) -> DeviceSlice:
    """The hosts and chips of ``topology`` on ``accelerator`` chips (a name of ``ACCELERATORS``)."""
    kind = accelerator_type(accelerator)
    dims = topology.split("x") if kind.kind == "tpu" else [topology]
    if not all(d.isdigit() and int(d) > 0 for d in dims) or (kind.kind == "tpu" and len(dims) not in (2, 3)):
        raise ValueError(f"{accelerator}: topology {topology!r} is not "
                         f"{'AxB or AxBxC chips' if kind.kind == 'tpu' else 'a number of GPUs'}")
    chips = math.prod(int(d) for d in dims)
    if chips <= kind.single_host_chips:
        return DeviceSlice(accelerator=accelerator, topology=topology, chips=chips, hosts=1, chips_per_host=chips)
    if kind.kind == "gpu":
        raise ValueError(f"{accelerator}: {chips} GPUs do not fit one node of {kind.single_host_chips}")
    if chips % kind.chips_per_host:
        raise ValueError(f"{accelerator}: a multi-host slice has a multiple of {kind.chips_per_host} chips, "
                         f"{topology} has {chips}")
    return DeviceSlice(accelerator=accelerator, topology=topology, chips=chips, hosts=chips // kind.chips_per_host,
                       chips_per_host=kind.chips_per_host)


def accelerator_type(name: str) -> AcceleratorType:
    if name not in ACCELERATORS:
        raise ValueError(f"unknown accelerator {name!r}; valid: {sorted(ACCELERATORS)}")
    return ACCELERATORS[name]


def _smallest_slice(accelerator: str, chips: int) -> DeviceSlice:
    """A power-of-two slice of at least ``chips`` chips (TPU topologies as near-square as the generation has)."""
    kind = accelerator_type(accelerator)
    n = 1 << max(0, math.ceil(math.log2(chips)))
    if kind.kind == "gpu":
        return device_slice(accelerator, str(n))
    k, axes = n.bit_length() - 1, 3 if accelerator == "v5p" else 2
    exponents = sorted(k // axes + (1 if i < k % axes else 0) for i in range(axes))
    return device_slice(accelerator, "x".join(str(1 << e) for e in exponents))

CPU_POOL = "rollstream-cpu"
ACCEL_POOL = "rollstream-accel"
_GIB = 2**30
HEADROOM = 1.25
"""XLA scratch, fragmentation and the runtime's own buffers on top of the estimate."""


@dataclass(frozen=True, kw_only=True)
class Resources:
    pool: str
    cpu: float
    memory_gib: float
    """Host memory of the job (per host)."""
    accelerator: str | None
    """A name of ``ACCELERATORS``; None for CPU stages."""
    accelerators: int
    """Chips of the whole slice."""
    device_memory_gib: float
    """Estimated accelerator memory the stage needs (0 for CPU stages)."""
    concurrency_key: str | None
    device_slice: DeviceSlice | None = None
    """Topology, hosts and chips per host of an accelerator stage."""
    mesh: tuple[int, int, int] | None = None
    """``(data, fsdp, tensor)`` sizes the stage's mesh config resolves to on the slice's chips."""

    def job_variables(self) -> dict[str, Any]:
        """The variables every rollstream work-pool template declares (``infra/*job-template*``)."""
        return {"cpu": self.cpu, "memory_gib": self.memory_gib, "accelerators": self.accelerators}

    def slice_variables(self) -> dict[str, Any]:
        """The extra variables of the accelerator templates: ``kubernetes-accel-job-template.json`` (a GPU node)
        or ``kubernetes-tpu-slice-job-template.json`` (a TPU slice, one pod per host)."""
        if self.device_slice is None:
            return {}
        kind = accelerator_type(self.device_slice.accelerator)
        if kind.kind == "gpu":
            return {"gpu_accelerator": kind.node_label}
        return {"hosts": self.device_slice.hosts, "chips_per_host": self.device_slice.chips_per_host,
                "tpu_accelerator": kind.node_label, "tpu_topology": self.device_slice.topology}


def param_count(m: ModelConfig) -> int:
    """Parameters of the decoder: embeddings, attention, gated MLP and norms."""
    embed = m.vocab_size * m.d_model * (1 if m.tie_embeddings else 2)
    attn = m.d_model * m.head_dim * (2 * m.n_heads + 2 * m.n_kv_heads)
    attn += m.head_dim * (m.n_heads + 2 * m.n_kv_heads) if m.qkv_bias else 0
    mlp = 3 * m.d_model * m.d_ff
    norms = m.d_model * (4 if m.post_norms else 2) + (2 * m.head_dim if m.qk_norm else 0)
    return embed + m.n_layers * (attn + mlp + norms) + m.d_model


def kv_cache_bytes(m: ModelConfig, *, sequences: int, seq_len: int) -> int:
    return sequences * seq_len * kv_bytes_per_position(m)


def _training_bytes(m: ModelConfig, *, sequences: int, seq_len: int) -> int:
    # bf16/fp32 weights, fp32 grads and two fp32 Adam moments; activations: ~12 d_model-wide values per
    # token per layer kept for the backward pass, plus the fp32 logits of one sequence batch.
    state = param_count(m) * (DTYPE_BYTES[m.dtype] + 4 + 8)
    tokens = sequences * seq_len
    return state + tokens * (12 * m.d_model * m.n_layers * DTYPE_BYTES[m.dtype] + 4 * m.vocab_size)


def cpu_light(config: CampaignConfig, *, worker_index: int = 0, accelerator: str = "H100",
              topology: str | None = None) -> Resources:
    """prep and audit: a little host memory, no device."""
    return Resources(pool=CPU_POOL, cpu=1, memory_gib=2, accelerator=None, accelerators=0, device_memory_gib=0,
                     concurrency_key=None)


def evaluate_resources(config: CampaignConfig, *, worker_index: int = 0, accelerator: str = "H100",
                       topology: str | None = None) -> Resources:
    m = config.model
    need = _weights(m) + kv_cache_bytes(m, sequences=config.eval.max_concurrency, seq_len=config.engine.max_seq_len)
    return Resources(pool=CPU_POOL, cpu=2, memory_gib=_host_gib(need), accelerator=None, accelerators=0,
                     device_memory_gib=0, concurrency_key=None)


def collect_resources(config: CampaignConfig, *, worker_index: int = 0, accelerator: str = "H100",
                      topology: str | None = None) -> Resources:
    m = config.model
    need = _weights(m) + kv_cache_bytes(m, sequences=config.engine.num_slots, seq_len=config.engine.max_seq_len)
    return _accel(need, cpu=2 + math.ceil(config.rollout.max_concurrency / 16), slot=f"rollout{worker_index}",
                  accelerator=accelerator, topology=topology, mesh=config.engine.mesh)


def train_resources(config: CampaignConfig, *, worker_index: int = 0, accelerator: str = "H100",
                    topology: str | None = None) -> Resources:
    need = _training_bytes(config.model, sequences=config.trainer.batch_groups * config.rollout.group_size,
                           seq_len=config.trainer.seq_buckets[-1])
    return _accel(need, cpu=4, slot="trainer", accelerator=accelerator, topology=topology, mesh=config.trainer.mesh)


def warm_start_resources(config: CampaignConfig, *, worker_index: int = 0, accelerator: str = "H100",
                         topology: str | None = None) -> Resources:
    need = _training_bytes(config.model, sequences=config.sft.batch_size, seq_len=config.engine.max_seq_len)
    return _accel(need, cpu=4, slot="trainer", accelerator=accelerator, topology=topology, mesh=config.sft.mesh)


def _weights(m: ModelConfig) -> int:
    return param_count(m) * DTYPE_BYTES[m.dtype]


def _accel(need: int, *, cpu: float, slot: str, accelerator: str, topology: str | None, mesh: MeshConfig
           ) -> Resources:
    need_gib = need * HEADROOM / _GIB
    chip_gib = accelerator_type(accelerator).memory_gib
    shape = (_smallest_slice(accelerator, math.ceil(need_gib / chip_gib)) if topology is None
             else device_slice(accelerator, topology))
    if need_gib > shape.chips * chip_gib:
        raise ValueError(f"the stage needs ~{need_gib:.1f} GiB of accelerator memory; {accelerator} {shape.topology} "
                         f"has {shape.chips} × {chip_gib:g} GiB")
    try:
        sizes = mesh.resolve(shape.chips)
    except ValueError as e:
        raise ValueError(f"{accelerator} {shape.topology} ({shape.chips} chips): {e}") from None
    # Host memory per host: the host stages its share of the checkpoint.
    return Resources(pool=ACCEL_POOL, cpu=cpu, memory_gib=_host_gib(need // shape.hosts), accelerator=accelerator,
                     accelerators=shape.chips, device_memory_gib=round(need_gib, 3), concurrency_key=f"gpu:{slot}",
                     device_slice=shape, mesh=sizes)


def _host_gib(device_bytes: int) -> float:
    # The host stages the checkpoint (one copy of the weights) besides the Python/JAX runtime, allowed 2 GiB.
    return float(max(2, math.ceil(2 + device_bytes * HEADROOM / _GIB)))
