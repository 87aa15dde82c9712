"""Device meshes and the one sharding rules table of every JAX stage (data × FSDP × tensor parallel).

A stage builds its mesh from its config section (``trainer.mesh``, ``sft.mesh``, ``eval.mesh``,
``engine.mesh``: a ``MeshConfig``) with ``make_mesh``. The mesh has three named axes:

* ``data``: pure data-parallel replicas;
* ``fsdp``: data parallelism whose parameters and optimiser state are stored in shards (each device holds
  ``1 / fsdp`` of them; XLA all-gathers a layer's weights for its matmuls and reduce-scatters gradients);
* ``tensor``: tensor parallelism: attention heads, MLP columns/rows and the vocabulary split over devices,
  so one model too large for a device computes across several.

The decoder's parameters carry *logical* axis names (Flax NNX sharding metadata, set in
``model/decoder.py``: ``layers``, ``embed``, ``vocab``, ``heads``, ``kv_heads``, ``head_dim``, ``mlp``); ``RULES``
maps each name to mesh axes, and batch rows go over ``data`` × ``fsdp``. Adam's moments inherit their
parameter's names (``nnx.Optimizer`` copies the metadata), so optimiser state is laid out like the
parameters without bookkeeping. A dimension whose size the mesh axes do not divide (a single kv head on
two tensor devices) is replicated over them instead; values without names (step counters) are replicated.

Nothing in ``step.py`` knows about the mesh: ``nnx.jit`` follows the shardings of its inputs and XLA
inserts the collectives. Micro-batches are strided over rows (``step._split_micro``) so each one still
spans every device.

Usage::

    mesh = make_mesh(MeshConfig(data=2, fsdp=-1))                 # -1: the remaining devices
    model = create_sharded(lambda rngs: Decoder(cfg, rngs=rngs), mesh)   # or shard_node(model, mesh)
    optimizer = make_nnx_optimizer(model, optim_cfg, mesh)
    metrics = train_step(model, optimizer, shard_batch(batch, mesh), cfg=step_cfg)

Use this path on one device too (``MeshConfig()`` is a 1 × 1 × 1 mesh). jit keys its cache on whether
inputs are committed to devices: a freshly initialised model or optimizer is not, the step's outputs
are, so without placement the *second* step compiles the whole program again.

``jax.make_mesh`` of the JAX we pin (0.10) defaults to *Explicit* axis types, under which
sharding-in-types rejects the embedding gather of the decoder; ``make_mesh`` asks for ``Auto`` axes.

**Multi-host** is the same code. Each process calls ``jax.distributed.initialize()`` before anything
else touches JAX (``pipelines_lib/distributed.py``); ``jax.devices()`` then lists every device of every
host and the mesh spans them. ``create_sharded`` builds each parameter shard on the device that owns it
(nothing is materialised whole on any host); ``model.weights.load_weights(path, mesh)`` and Orbax checkpoint
restores read only the shards a process's devices hold. Every process builds the same global batch (they
read the same groups) and ``shard_batch`` places only the rows of its own devices.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXES = ("data", "fsdp", "tensor")
"""Mesh axis names, in device order (``tensor`` innermost: its collectives run on the closest devices)."""

RULES: Mapping[str, tuple[str, ...]] = {
    "batch": ("data", "fsdp"),
    "embed": ("fsdp",),
    "vocab": ("tensor",),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "mlp": ("tensor",),
    "head_dim": (),
    "layers": (),
}
"""Logical axis name → mesh axes that split it. FSDP splits every parameter along its model width
(``embed``); tensor parallelism splits attention heads, MLP hidden units and the vocabulary; batch rows go
over both data-parallel axes. The stacked layer axis stays whole: the layer scan runs every layer on every
device. The decoder names its parameters' axes with these keys."""

Node = TypeVar("Node")
Batch = TypeVar("Batch")
"""A pytree of arrays whose leading axis is rows (a ``train.batch.TrainBatch``)."""


@dataclass(frozen=True, kw_only=True)
class MeshConfig:
    """Shape of a stage's device mesh; the default is one device. ``-1`` (on one axis) takes the devices the
    other axes leave: ``{fsdp: -1}`` is FSDP over every device."""

    data: int = 1
    """Pure data-parallel replicas (each holds a full copy of the FSDP shards' union)."""
    fsdp: int = 1
    """Devices that split parameters and optimizer state between them (and batch rows, like ``data``)."""
    tensor: int = 1
    """Devices that split attention heads, MLP units and the vocabulary of every layer (tensor parallelism)."""

    def __post_init__(self) -> None:
        for name in AXES:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or (value < 1 and value != -1):
                raise ValueError(f"MeshConfig.{name} must be a positive int or -1 (the remaining devices), got {value!r}")
        if self.sizes().count(-1) > 1:
            raise ValueError(f"MeshConfig: at most one axis may be -1, got {dict(zip(AXES, self.sizes(), strict=True))}")

    def sizes(self) -> tuple[int, int, int]:
        return (self.data, self.fsdp, self.tensor)

    def resolve(self, n_devices: int) -> tuple[int, int, int]:
        """Axis sizes over ``n_devices`` devices (``-1`` filled in); their product may be less than ``n_devices``."""
        sizes = self.sizes()
        fixed = math.prod(s for s in sizes if s != -1)
        if -1 in sizes:
            if n_devices % fixed:
                raise ValueError(f"MeshConfig {self.describe()}: {n_devices} devices do not divide by {fixed}")
            sizes = tuple(n_devices // fixed if s == -1 else s for s in sizes)
        if math.prod(sizes) > n_devices:
            raise ValueError(f"MeshConfig {self.describe()} needs {math.prod(sizes)} devices, have {n_devices}")
        return sizes  # type: ignore[return-value]

    def describe(self) -> str:
        return " × ".join(f"{name}={size}" for name, size in zip(AXES, self.sizes(), strict=True))


def make_mesh(cfg: MeshConfig, devices: list[jax.Device] | None = None) -> Mesh:
    """A ``(data, fsdp, tensor)`` mesh with ``Auto`` axis types over the first devices of ``devices``
    (default: every device of every process)."""
    devices = jax.devices() if devices is None else devices
    sizes = cfg.resolve(len(devices))
    return jax.make_mesh(
        sizes, AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(AXES), devices=devices[: math.prod(sizes)]
    )


def describe_mesh(mesh: Mesh) -> str:
    """``data=1 × fsdp=4 × tensor=1 (4 devices)``: the axes a stage's mesh resolved to, for its start-up log line."""
    devices = f"{mesh.size} device" + ("s" if mesh.size > 1 else "")
    return " × ".join(f"{axis}={size}" for axis, size in mesh.shape.items()) + f" ({devices})"


def logical_spec(
    names: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh | jax.sharding.AbstractMesh,
    rules: Mapping[str, tuple[str, ...]] = RULES,
) -> PartitionSpec:
    """The mesh ``PartitionSpec`` of an array of ``shape`` whose dimensions are named ``names``.

    Each named dimension goes over its rule's mesh axes of size > 1 that it divides (and that no earlier
    dimension took); the others are replicated.
    """
    if len(names) != len(shape):
        raise ValueError(f"logical axes {names} do not match an array of shape {shape}")
    used: set[str] = set()
    spec: list[str | tuple[str, ...] | None] = []
    for name, size in zip(names, shape, strict=True):
        if name is not None and name not in rules:
            raise ValueError(f"unknown logical axis {name!r}; the rules table has {sorted(rules)}")
        axes = tuple(a for a in rules.get(name, ()) if mesh.shape[a] > 1 and a not in used) if name else ()
        if axes and size % math.prod(mesh.shape[a] for a in axes) == 0:
            used.update(axes)
            spec.append(axes if len(axes) > 1 else axes[0])
        else:
            spec.append(None)
    return PartitionSpec(*spec)


def _names(variable: nnx.Variable) -> tuple[str | None, ...] | None:
    names = variable.get_metadata().get("out_sharding")
    return tuple(names) if names else None


def state_shardings(state: Any, mesh: Mesh, rules: Mapping[str, tuple[str, ...]] = RULES) -> Any:
    """``NamedSharding`` for every variable of ``state`` (an ``nnx.State``), by its logical axis names."""

    def sharding(variable: Any) -> NamedSharding:
        names = _names(variable) if isinstance(variable, nnx.Variable) else None
        shape = np.shape(variable.get_value() if isinstance(variable, nnx.Variable) else variable)
        spec = PartitionSpec() if names is None else logical_spec(names, shape, mesh, rules)
        return NamedSharding(mesh, spec)

    return jax.tree.map(sharding, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def _per_leaf(state: Any, mesh: Mesh) -> tuple[list[Any], list[NamedSharding], Any]:
    """(array leaves of ``state``, the sharding of each, the tree structure): one leaf per variable."""
    leaves, treedef = jax.tree.flatten(state)
    shardings = jax.tree.leaves(state_shardings(state, mesh))
    return leaves, shardings, treedef


def _place(x: Any, sharding: NamedSharding) -> jax.Array:
    if sharding.is_fully_addressable or (isinstance(x, jax.Array) and not x.is_fully_addressable):
        return jax.device_put(x, sharding)
    # A value this process holds whole, onto devices of several processes: each places its own shards.
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def place_state(state: Any, mesh: Mesh) -> Any:
    """``state`` (an ``nnx.State``) with every variable on its sharding. Arrays already spanning the mesh move
    device to device; values that span one process's devices only must be the same on every process."""
    leaves, shardings, treedef = _per_leaf(state, mesh)
    return jax.tree.unflatten(treedef, [_place(x, s) for x, s in zip(leaves, shardings, strict=True)])


def shard_node(node: nnx.Module | nnx.Optimizer, mesh: Mesh) -> None:
    """Move every variable of ``node`` (a model or an optimizer) onto its sharding, in place."""
    nnx.update(node, place_state(nnx.state(node), mesh))


def sharded_shapes(state: Any, mesh: Mesh) -> Any:
    """``state`` as ``jax.ShapeDtypeStruct``s carrying their shardings: the target of a sharded Orbax restore,
    in which each process reads only its devices' shards."""
    leaves, shardings, treedef = _per_leaf(state, mesh)
    return jax.tree.unflatten(treedef, [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
                                        for x, s in zip(leaves, shardings, strict=True)])


def create_sharded(factory: Callable[[nnx.Rngs], Node], mesh: Mesh, *, seed: int = 0,
                   prng_impl: str | None = None) -> Node:
    """Build ``factory(nnx.Rngs(jax.random.key(seed, impl=prng_impl)))`` as one jitted program whose outputs are
    placed on their shardings.

    The structure comes from an abstract evaluation (nothing allocated); the initialisation then runs once,
    compiled, with ``out_shardings`` from the rules table, so each device initialises only its own shards and a
    model too large for one device (or host) is never materialised whole. The seed is an argument of the program,
    not a constant in it: with a constant key XLA folds the random initialisers at compile time, which made a
    0.6 B model's build on a TPU v5e much slower (docs/TPU_PERF.md). The values are the eager
    factory's, within rounding.

    ``prng_impl`` (a ``jax.random`` key implementation) defaults to ``threefry2x32``, JAX's own (the same
    weights on every backend: ``factory(nnx.Rngs(seed))``'s) on a CPU, and to ``rbg``, the chip's hardware
    generator, on an accelerator: threefry's bit mixing is most of what the compiler works through (the build's
    time on a TPU v5e is ``tpu.model_build_s`` in bench/results.json). So a seed gives other weights on an
    accelerator than on a CPU unless ``prng_impl`` is passed.
    """
    impl = prng_impl or ("threefry2x32" if jax.default_backend() == "cpu" else "rbg")
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: factory(nnx.Rngs(jax.random.key(seed, impl=impl)))))
    init = jax.jit(lambda seed_u32: nnx.split(factory(nnx.Rngs(jax.random.key(seed_u32, impl=impl))))[1],
                   out_shardings=state_shardings(abstract, mesh))
    return nnx.merge(graphdef, init(np.uint32(seed)))


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Rows over the ``batch`` rule's axes, every other dimension whole."""
    return NamedSharding(mesh, PartitionSpec(RULES["batch"], *(None,) * (ndim - 1)))


def shard_batch(batch: Batch, mesh: Mesh) -> Batch:
    """Split the global ``batch``'s rows over the batch axes; each process places only the rows its own devices
    hold (every process passes the same global batch, see the module doc).

    The global row count must be divisible by the product of the batch axes' sizes (times
    ``grad_accum_steps`` when accumulating, so every micro-batch spans every device).
    """

    def put(global_bt: Any) -> jax.Array:
        global_bt = np.asarray(global_bt)
        return jax.make_array_from_callback(global_bt.shape, batch_sharding(mesh, global_bt.ndim),
                                            lambda index: global_bt[index])

    return jax.tree.map(put, batch)
