"""The device memory of a colocated campaign, planned (and refused when it cannot fit) before anything compiles.

```
plan_memory(model, trainer, engine, group_size=, workers=, n_devices=, limit=, step_temporaries=)  -> MemoryPlan
  trainer  masters           N × precision.params                                   ÷ fsdp · tensor
           moments           2 · N × optim.moment_dtype                             ÷ fsdp · tensor
           gradients         N × precision.params                                   ÷ fsdp · tensor
           step temporaries  XLA's memory analysis of the compiled step, less the gradients
                             (``xla_step_temporaries``: given where a device is), else ``estimate_step_temporaries``
  engine   weights           N × serving dtype × (workers + 1)                       ÷ engine tensor
           kv pool           pool blocks × block_size × kv bytes a position × workers  ÷ engine tensor
           temporaries       estimate: every slot's logits, one batched prefill's widest activations
MemoryPlan.check()           total ≤ limit × (1 − headroom), else ``MemoryPlanError`` naming the part and its setting
engine.num_blocks: auto      the pool gets what the other parts leave (at most every slot at max_seq_len)
```

Counted for the device that holds the most, the first one: the trainer's share of a ``trainer.mesh`` spanning several
devices (parameters and moments split over ``fsdp`` × ``tensor``, rows over ``data`` × ``fsdp``) plus every rollout
engine, which serve on the first devices (``engine.mesh``, one by default). The engines hold one version more than
they serve: the trainer hands a version over while the engine still serves the one before (``stages.colocated``);
when the trainer's compute dtype differs from its masters' the handed-over copy is the publication's own cast, not a
second copy. Parts counted by arithmetic are exact; the step's temporaries are XLA's own figure where a device
compiled the step, an estimate otherwise, and the plan says which (``Part.basis``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipelines_lib.engine.config import EngineConfig
from pipelines_lib.model.config import DTYPE_BYTES, ModelConfig, kv_bytes_per_position, param_count
from pipelines_lib.train.config import TrainerConfig

GIB = 2**30
EXACT = "arithmetic"
XLA = "XLA memory analysis"
ESTIMATE = "estimate"
REMAT_KEPT: dict[str, Callable[[ModelConfig], int]] = {
    "full": lambda c: c.d_model,
    "attention": lambda c: c.d_model + c.n_heads * c.head_dim,
    "dots": lambda c: 2 * c.d_model + (c.n_heads + 2 * c.n_kv_heads) * c.head_dim + 3 * c.d_ff,
    "none": lambda c: 4 * c.d_model + (2 * c.n_heads + 2 * c.n_kv_heads) * c.head_dim + 4 * c.d_ff,
}
"""Values per token and layer the backward pass keeps under each ``StepConfig.remat`` policy (the estimate's count:
``full`` the layer's input; ``attention`` and the attention output; ``dots`` the input, the q/k/v, output and MLP
matmuls' results; ``none`` also the norms', the activation's and attention's values)."""


class MemoryPlanError(ValueError):
    """A colocated campaign's parts do not fit the device's memory."""


@dataclass(frozen=True, kw_only=True)
class MemoryConfig:
    """What the colocated memory plan checks against (``pipelines_lib.memplan``)."""

    device_gib: float | None = None
    """Memory of one device in GiB where the runtime does not report its own (``memory_stats``: a CPU, whose plan is
    then checked against this), or to plan on one machine for a chip of another size. None: the device's own limit,
    and a plan that is only printed where there is none."""
    headroom: float = 0.05
    """Fraction of the device's memory the plan leaves free: the allocator's fragmentation, the runtime's own
    buffers and the estimates' error."""

    def __post_init__(self) -> None:
        if self.device_gib is not None and not self.device_gib > 0:
            raise ValueError(f"MemoryConfig.device_gib must be > 0 or null, got {self.device_gib}")
        if not 0 <= self.headroom < 1:
            raise ValueError(f"MemoryConfig.headroom must be in [0, 1), got {self.headroom}")


@dataclass(frozen=True, kw_only=True)
class Part:
    name: str
    bytes: int
    basis: str
    """``arithmetic`` (exact), ``XLA memory analysis`` or ``estimate``."""
    setting: str
    """The settings that shrink it."""


@dataclass(frozen=True, kw_only=True)
class MemoryPlan:
    parts: tuple[Part, ...]
    limit_bytes: int | None
    """The device's memory (None: unknown, nothing checked)."""
    limit_source: str
    headroom: float
    kv_blocks: int
    """Blocks of each engine's KV pool (``engine.num_blocks``, or what ``auto`` resolved to)."""

    @property
    def total_bytes(self) -> int:
        return sum(p.bytes for p in self.parts)

    @property
    def budget_bytes(self) -> int | None:
        return None if self.limit_bytes is None else int(self.limit_bytes * (1 - self.headroom))

    def part(self, name: str) -> Part:
        return next(p for p in self.parts if p.name == name)

    def check(self, *, exact_only: bool = False) -> None:
        """Raise ``MemoryPlanError`` if the parts (with ``exact_only``, those counted by arithmetic: what no
        compilation can change) exceed the budget, naming the largest part and the settings that shrink it."""
        budget = self.budget_bytes
        parts = [p for p in self.parts if p.basis == EXACT or not exact_only]
        need = sum(p.bytes for p in parts)
        if budget is None or need <= budget:
            return
        worst = max(parts, key=lambda p: p.bytes)
        raise MemoryPlanError(
            f"colocated memory plan: {need / GIB:.2f} GiB needed on one device, {budget / GIB:.2f} GiB available "
            f"({self.limit_bytes / GIB:.2f} GiB from {self.limit_source}, less memory.headroom={self.headroom}); "
            f"the largest part is {worst.name} ({worst.bytes / GIB:.2f} GiB, {worst.basis}): change {worst.setting}. "
            f"Parts: " + ", ".join(f"{p.name} {p.bytes / GIB:.2f}" for p in parts))

    def render(self) -> str:
        """The plan as a table, one part a line."""
        lines = [f"  {p.name:<22}{p.bytes / GIB:8.3f} GiB  {p.basis:<20} {p.setting}" for p in self.parts]
        limit = ("no device limit known (set memory.device_gib to check one)" if self.limit_bytes is None else
                 f"of {self.budget_bytes / GIB:.3f} GiB ({self.limit_bytes / GIB:.3f} from {self.limit_source}, "
                 f"headroom {self.headroom})")
        return "\n".join(["colocated memory plan, one device:", *lines,
                          f"  {'total':<22}{self.total_bytes / GIB:8.3f} GiB  {limit}"])

    def to_dict(self) -> dict[str, Any]:
        return {"parts": {p.name: {"bytes": p.bytes, "basis": p.basis} for p in self.parts},
                "total_bytes": self.total_bytes, "limit_bytes": self.limit_bytes, "limit_source": self.limit_source,
                "kv_blocks": self.kv_blocks}


def trainer_rows(trainer: TrainerConfig, *, group_size: int, n_devices: int) -> int:
    """Rows of one micro-batch on one device: the step's rows over ``grad_accum_steps`` and ``data`` × ``fsdp``."""
    data, fsdp, _ = trainer.mesh.resolve(n_devices)
    return max(1, trainer.batch_groups * group_size // trainer.step.grad_accum_steps // (data * fsdp))


def estimate_step_temporaries(model: ModelConfig, trainer: TrainerConfig, *, rows: int) -> int:
    """What a train step holds besides its inputs and the gradients, estimated: the compute-dtype copy of the
    parameters (mixed precision), the values ``REMAT_KEPT`` counts for every layer, two layers' worth of every value
    (the layer being recomputed and its gradients) and the float32 logits, softmax and gradient of one
    ``logit_chunk_tokens`` slice of the vocabulary."""
    precision = trainer.step.precision
    compute = DTYPE_BYTES[precision.compute]
    copy = param_count(model) * compute if precision.compute != precision.params else 0
    tokens = rows * trainer.seq_buckets[-1]
    kept = model.n_layers * REMAT_KEPT[trainer.step.remat](model) + 2 * REMAT_KEPT["none"](model)
    logits = 3 * trainer.step.logit_chunk_tokens * model.vocab_size * 4
    return copy + tokens * kept * compute + logits


def xla_step_temporaries(model: ModelConfig, trainer: TrainerConfig, *, rows: int) -> int:
    """``temp_size_in_bytes`` of XLA's memory analysis of the train step compiled for this model, optimizer and batch
    shape on the default device, from abstract inputs (nothing is allocated; the step's compile is the cost)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from pipelines_lib.model.decoder import Decoder
    from pipelines_lib.train.batch import TrainBatch
    from pipelines_lib.train.optim import make_optimizer
    from pipelines_lib.train.step import train_step

    cfg = ModelConfig.from_dict({**model.to_dict(), "dtype": trainer.step.precision.params})
    abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    optimizer = nnx.eval_shape(lambda: nnx.Optimizer(Decoder(cfg, rngs=nnx.Rngs(0)), make_optimizer(trainer.optim),
                                                      wrt=nnx.Param))
    shape = (rows * trainer.step.grad_accum_steps, trainer.seq_buckets[-1])
    ints, floats = jax.ShapeDtypeStruct(shape, jnp.int32), jax.ShapeDtypeStruct(shape, jnp.float32)
    batch = TrainBatch(tokens_bt=ints, positions_bt=ints, loss_mask_bt=floats, behav_logp_bt=floats,
                       advantages_bt=floats)
    analysis = train_step.lower(abstract, optimizer, batch, cfg=trainer.step).compile().memory_analysis()
    return int(analysis.temp_size_in_bytes)


def device_limit(memory: MemoryConfig) -> tuple[int | None, str]:
    """The first device's memory and where the figure came from: the runtime's ``memory_stats()['bytes_limit']``
    where it reports one, ``memory.device_gib`` otherwise, else None."""
    import jax

    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"]), f"{device.device_kind} memory_stats"
    if memory.device_gib is not None:
        return int(memory.device_gib * GIB), "memory.device_gib"
    return None, "none"


def plan_memory(model: ModelConfig, trainer: TrainerConfig, engine: EngineConfig, *, group_size: int, workers: int,
                n_devices: int, limit_bytes: int | None, limit_source: str, headroom: float,
                step_temporaries: int | None = None) -> MemoryPlan:
    """The plan of the module docstring. ``step_temporaries``: XLA's ``temp_size_in_bytes`` of the compiled step
    (``xla_step_temporaries``), None to estimate it."""
    n = param_count(model)
    _, fsdp, tensor = trainer.mesh.resolve(n_devices)
    shards = fsdp * tensor
    precision = trainer.step.precision
    rows = trainer_rows(trainer, group_size=group_size, n_devices=n_devices)
    masters = math.ceil(n * DTYPE_BYTES[precision.params] / shards)
    moments = math.ceil(2 * n * DTYPE_BYTES[trainer.optim.moment_dtype] / shards)
    if step_temporaries is None:
        temporaries, basis = estimate_step_temporaries(model, trainer, rows=rows), ESTIMATE
        if trainer.step.grad_accum_steps > 1:
            # the running sum of the micro-batches' gradients, beside each one's own (on a TPU v5e, XLA counted 3.9 GiB
            # more for the tpu_real step in 4 micro-batches than for one of the same micro-batch, docs/TPU.md)
            temporaries += masters
    else:
        temporaries, basis = max(step_temporaries - masters, 0), XLA  # XLA's temporaries hold the gradients
    engine_tensor = engine.mesh.resolve(n_devices)[2]
    # Version 0 serves in the model's dtype, the trainer's publications in its compute dtype: the wider counts.
    serving = max((model.dtype, precision.compute), key=DTYPE_BYTES.__getitem__)
    served = DTYPE_BYTES[serving]
    block_bytes = math.ceil(engine.block_size * kv_bytes_per_position(model, serving) / engine_tensor)
    widest = 2 * model.d_model + (model.n_heads + 2 * model.n_kv_heads) * model.head_dim + 2 * model.d_ff
    parts = [
        Part(name="trainer masters", bytes=masters, basis=EXACT, setting="the model's size, trainer.mesh.fsdp"),
        Part(name="trainer moments", bytes=moments, basis=EXACT,
             setting="trainer.optim.moment_dtype (bfloat16 halves them), trainer.mesh.fsdp"),
        Part(name="trainer gradients", bytes=masters, basis=EXACT, setting="trainer.mesh.fsdp"),
        Part(name="trainer temporaries", bytes=temporaries, basis=basis,
             setting="trainer.step.grad_accum_steps, trainer.step.remat, trainer.batch_groups, trainer.seq_buckets"),
        Part(name="engine weights", bytes=math.ceil(n * served / engine_tensor) * (workers + 1), basis=EXACT,
             setting=f"workers (each engine holds one version, and one more is handed over; workers={workers})"),
        Part(name="engine temporaries",
             bytes=workers * engine.num_slots * (2 * 4 * model.vocab_size
                                                 + engine.prefill_buckets[-1] * widest * served) // engine_tensor,
             basis=ESTIMATE, setting="engine.num_slots, engine.prefill_buckets"),
    ]
    full_pool = engine.num_slots * engine.blocks_per_sequence
    if engine.num_blocks == "auto":
        left = None if limit_bytes is None else int(limit_bytes * (1 - headroom)) - sum(p.bytes for p in parts)
        blocks = full_pool if left is None else max(engine.blocks_per_sequence,
                                                    min(full_pool, left // (workers * block_bytes)))
    else:
        blocks = engine.pool_blocks
    parts.append(Part(name="engine kv pool", bytes=workers * blocks * block_bytes, basis=EXACT,
                      setting=f"engine.num_blocks (auto sizes it from what is left; {blocks} blocks of "
                              f"{engine.block_size}), engine.num_slots, engine.max_seq_len"))
    return MemoryPlan(parts=tuple(parts), limit_bytes=limit_bytes, limit_source=limit_source, headroom=headroom,
                      kv_blocks=blocks)


__all__ = ["MemoryConfig", "MemoryPlan", "MemoryPlanError", "Part", "device_limit", "estimate_step_temporaries",
           "plan_memory", "trainer_rows", "xla_step_temporaries"]
