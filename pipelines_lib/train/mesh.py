"""Device mesh and sharding rules for training (data parallel × FSDP).

The mesh has two named axes, ``data`` and ``fsdp`` (``MeshConfig``). ``MeshRules`` maps the two
logical things we shard onto them:

* **batch rows** are split over *both* axes (``("data", "fsdp")``): FSDP is data parallelism whose
  parameters happen to be stored in shards, so every device sees different rows;
* **parameters and optimizer state** are split over ``fsdp`` along their largest dimension that the
  axis size divides (``param_spec``) and replicated when none does (norm scales of odd width,
  scalars such as the step count). The rule depends only on the shape, so Adam's moments get the
  same layout as their parameters without any bookkeeping.

Nothing in ``step.py`` knows about the mesh: ``nnx.jit`` follows the shardings of its inputs and
XLA inserts the all-gathers (parameters) and reduce-scatters (gradients). Micro-batches are
strided over rows (``step._split_micro``) so each one still spans every device.

Usage::

    mesh = make_mesh(MeshConfig(data=2, fsdp=4))
    model = create_sharded(lambda: Decoder(cfg, rngs=nnx.Rngs(0)), mesh)   # or shard_node(model, mesh)
    optimizer = make_nnx_optimizer(model, optim_cfg); shard_node(optimizer, mesh)
    metrics = train_step(model, optimizer, shard_batch(batch, mesh), cfg=step_cfg)

Use this path on one device too (``MeshConfig()`` is a 1 × 1 mesh). jit keys its cache on whether
inputs are committed to devices: a freshly initialised model or optimizer is not, the step's outputs
are, so without placement the *second* step compiles the whole program again.

``jax.make_mesh`` of the JAX we pin (0.10) defaults to *Explicit* axis types, under which
sharding-in-types rejects the embedding gather of the decoder; ``make_mesh`` asks for ``Auto`` axes.

**Multi-host** is the same code. Each process calls ``jax.distributed.initialize()`` before
anything else touches JAX; ``jax.devices()`` then lists every device of every host and the mesh
spans them. ``create_sharded`` builds each parameter shard on the device that owns it (nothing is
materialised whole on any host), and ``shard_batch`` assembles the global batch from each process's
own rows with ``jax.make_array_from_process_local_data`` (each process passes the rows its devices
hold: with ``make_mesh``'s device order, a contiguous block per process in process order; on one
host, the whole batch). ``shard_node`` moves an existing single-host model and
is meant for one host or for values every process holds identically.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pipelines_lib.train.batch import TrainBatch

AXES = ("data", "fsdp")

Node = TypeVar("Node")


@dataclass(frozen=True, kw_only=True)
class MeshConfig:
    """Shape of the training mesh; ``data · fsdp`` must equal the number of devices used."""

    data: int = 1
    """Pure data-parallel replicas (each holds a full copy of the FSDP shards' union)."""
    fsdp: int = 1
    """Devices that split parameters and optimizer state between them."""

    def __post_init__(self) -> None:
        for name in AXES:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"MeshConfig.{name} must be a positive int, got {value!r}")

    @property
    def n_devices(self) -> int:
        return self.data * self.fsdp


@dataclass(frozen=True, kw_only=True)
class MeshRules:
    """Logical → mesh axis rules."""

    batch: tuple[str, ...] = ("data", "fsdp")
    """Mesh axes that split batch rows."""
    params: str = "fsdp"
    """Mesh axis that splits each parameter's largest divisible dimension."""

    def __post_init__(self) -> None:
        for axis in (*self.batch, self.params):
            if axis not in AXES:
                raise ValueError(f"MeshRules: unknown mesh axis {axis!r}; choose from {AXES}")


def make_mesh(cfg: MeshConfig, devices: list[jax.Device] | None = None) -> Mesh:
    """A ``(data, fsdp)`` mesh with ``Auto`` axis types over ``devices`` (default: all of them)."""
    devices = jax.devices() if devices is None else devices
    if len(devices) < cfg.n_devices:
        raise ValueError(
            f"MeshConfig data={cfg.data} × fsdp={cfg.fsdp} needs {cfg.n_devices} devices, have {len(devices)}"
        )
    return jax.make_mesh(
        (cfg.data, cfg.fsdp),
        AXES,
        axis_types=(jax.sharding.AxisType.Auto,) * len(AXES),
        devices=devices[: cfg.n_devices],
    )


def param_spec(shape: tuple[int, ...], mesh: Mesh, rules: MeshRules = MeshRules()) -> PartitionSpec:
    """Shard the largest dimension divisible by the ``rules.params`` axis size; else replicate."""
    axis_size = mesh.shape[rules.params]
    divisible = [d for d, n in enumerate(shape) if n % axis_size == 0 and n >= axis_size]
    if axis_size == 1 or not divisible:
        return PartitionSpec()
    dim = max(divisible, key=lambda d: shape[d])
    return PartitionSpec(*(rules.params if d == dim else None for d in range(len(shape))))


def state_shardings(state: Any, mesh: Mesh, rules: MeshRules = MeshRules()) -> Any:
    """``NamedSharding`` for every array leaf of ``state`` (an ``nnx.State`` or any pytree)."""
    return jax.tree.map(lambda x: NamedSharding(mesh, param_spec(np.shape(x), mesh, rules)), state)


def shard_node(node: nnx.Module | nnx.Optimizer, mesh: Mesh, rules: MeshRules = MeshRules()) -> None:
    """Move every variable of ``node`` (a model or an optimizer) onto its sharding, in place."""
    state = nnx.state(node)
    nnx.update(node, jax.device_put(state, state_shardings(state, mesh, rules)))


def create_sharded(factory: Callable[[], Node], mesh: Mesh, rules: MeshRules = MeshRules()) -> Node:
    """Build ``factory()`` under jit with every variable constrained to its sharding.

    Each device initialises only its own shards, so a model too large for one device (or host) is
    never materialised whole. The factory must be deterministic (seeded ``nnx.Rngs``).
    """

    @nnx.jit
    def build() -> Node:
        node = factory()
        state = nnx.state(node)
        nnx.update(node, jax.lax.with_sharding_constraint(state, state_shardings(state, mesh, rules)))
        return node

    return build()


def shard_batch(batch: TrainBatch, mesh: Mesh, rules: MeshRules = MeshRules()) -> TrainBatch:
    """Split ``batch`` rows over ``rules.batch``; each process passes its own rows (see module doc).

    The global row count must be divisible by the product of the batch axes' sizes (times
    ``grad_accum_steps`` when accumulating, so every micro-batch spans every device).
    """

    def put(local_bt: Any) -> jax.Array:
        spec = PartitionSpec(rules.batch, *(None,) * (np.ndim(local_bt) - 1))
        return jax.make_array_from_process_local_data(NamedSharding(mesh, spec), np.asarray(local_bt))

    return jax.tree.map(put, batch)
