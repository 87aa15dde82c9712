"""Sharded training on 8 fake CPU devices (data=2 × fsdp=4) matches one device.

XLA reads ``--xla_force_host_platform_device_count`` only when JAX starts, so the comparison runs in
a fresh interpreter: this file re-executes itself as a script with the flag set in its environment,
and the script prints its measurements as JSON for the test to check. The other tests run in-process.
"""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec

from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.train.batch import build_train_batch
from pipelines_lib.train.losses import LossConfig
from pipelines_lib.train.mesh import (
    MeshConfig,
    MeshRules,
    create_sharded,
    make_mesh,
    param_spec,
    shard_batch,
    shard_node,
    state_shardings,
)
from pipelines_lib.train.optim import OptimConfig, make_nnx_optimizer
from pipelines_lib.train.step import StepConfig, train_step

# ModelConfig.tiny() shrunk to one small layer: the same code paths, a fraction of the compile time.
SMALL = dataclasses.replace(
    ModelConfig.tiny(), vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64
)
N_DEVICES = 8
LOSS_RTOL = 1e-5
"""Sharded reductions sum in a different order: float32 leaves ~1e-7 relative noise (measured 4e-7)."""
UPDATE_RTOL = 1e-4
"""On ‖Δθ_sharded − Δθ_single‖ / ‖Δθ_single‖ after two AdamW steps: Adam divides by √v, which
amplifies the rounding noise of tiny gradient entries (measured 1e-6 to 1e-5)."""


def run_on_fake_devices() -> dict:
    assert jax.device_count() == N_DEVICES, jax.devices()
    rng = np.random.default_rng(0)
    tokens = [rng.integers(1, 64, size=int(n)).tolist() for n in rng.integers(5, 15, size=16)]
    masks = [[0] * 3 + [1] * (len(row) - 3) for row in tokens]
    behav = [(-rng.uniform(0.5, 4.0, size=len(row))).tolist() for row in tokens]
    batch = build_train_batch(tokens, masks, behav, rng.normal(size=16).tolist(), seq_buckets=(16,))
    cfg = StepConfig(loss=LossConfig(aggregation="seq_mean_token_mean"), grad_accum_steps=2)

    def factory() -> Decoder:
        return Decoder(SMALL, rngs=nnx.Rngs(0))

    def params_of(model: Decoder) -> list:
        return [np.asarray(p) for p in jax.tree.leaves(nnx.state(model, nnx.Param))]

    def two_steps(model: Decoder, batch, mesh=None) -> tuple[list[float], nnx.Optimizer]:
        optimizer = make_nnx_optimizer(model, OptimConfig(lr=1e-2))
        if mesh is not None:
            # Else the step counter enters on one device and leaves replicated: a recompile.
            shard_node(optimizer, mesh)
        return [float(train_step(model, optimizer, batch, cfg=cfg)["loss"]) for _ in range(2)], optimizer

    single = factory()
    # Committed like the step's outputs, so the second step reuses the first one's compile.
    nnx.update(single, jax.device_put(nnx.state(single), jax.devices()[0]))
    init_params = params_of(single)
    single_losses, _ = two_steps(single, batch)

    mesh = make_mesh(MeshConfig(data=2, fsdp=4))
    sharded = create_sharded(factory, mesh)
    created_diff = max(
        float(np.abs(a - b).max()) for a, b in zip(params_of(sharded), init_params, strict=True)
    )
    sharded_batch = shard_batch(batch, mesh)
    sharded_losses, optimizer = two_steps(sharded, sharded_batch, mesh)

    def relative_update_error(params: list) -> float:
        delta_single = np.concatenate(
            [(p - p0).ravel() for p, p0 in zip(params_of(single), init_params, strict=True)]
        )
        delta = np.concatenate([(p - p0).ravel() for p, p0 in zip(params, init_params, strict=True)])
        return float(np.linalg.norm(delta - delta_single) / np.linalg.norm(delta_single))

    expected_layout = state_shardings(nnx.state(sharded, nnx.Param), mesh)
    layout_kept = jax.tree.map(
        lambda x, s: x.sharding.is_equivalent_to(s, x.ndim), nnx.state(sharded, nnx.Param), expected_layout
    )
    embedding = sharded.embed.embedding
    return {
        "single_losses": single_losses,
        "sharded_losses": sharded_losses,
        "relative_update_error": relative_update_error(params_of(sharded)),
        "created_sharded_max_abs_diff": created_diff,
        "layout_kept": all(jax.tree.leaves(layout_kept)),
        "batch_spec": list(sharded_batch.tokens_bt.sharding.spec),
        "embedding_split_over_fsdp": embedding.sharding.is_equivalent_to(
            NamedSharding(mesh, PartitionSpec("fsdp", None)), 2
        ),
        "embedding_mu_like_param": optimizer.opt_state[1][0]
        .mu["embed"]["embedding"]
        .sharding.is_equivalent_to(embedding.sharding, 2),
        "embedding_shard_shapes": [list(shard.data.shape) for shard in embedding.addressable_shards],
    }


def test_fake_8_device_mesh_matches_one_device() -> None:
    env = os.environ | {
        "JAX_PLATFORMS": "cpu",
        # Optimisation level 0 roughly halves XLA's CPU compile time; both sides of the comparison use it.
        "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={N_DEVICES}"
        " --xla_backend_optimization_level=0",
    }
    proc = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=300, cwd=os.getcwd()
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])

    for single, sharded in zip(result["single_losses"], result["sharded_losses"], strict=True):
        assert sharded == pytest.approx(single, rel=LOSS_RTOL)
    assert result["single_losses"][1] != result["single_losses"][0]  # the first step did move the params
    assert result["relative_update_error"] <= UPDATE_RTOL
    # Same initial values; jit and eager initialisers may round the last bit differently.
    assert result["created_sharded_max_abs_diff"] <= 1e-6
    assert result["layout_kept"]
    assert result["batch_spec"] == [["data", "fsdp"], None]
    # embed [64, 32]: the largest dim (vocab, 64) splits over fsdp=4 and is replicated over data=2;
    # Adam's first moment follows the same shape rule.
    assert result["embedding_split_over_fsdp"]
    assert result["embedding_mu_like_param"]
    assert result["embedding_shard_shapes"] == [[16, 32]] * N_DEVICES


def test_placed_inputs_make_the_step_compile_once() -> None:
    # On one device (a 1 × 1 mesh) too: placed model, optimizer and batch are committed like the
    # step's outputs, so the steps after the first compile nothing (for a real model a recompile
    # costs minutes).
    rng = np.random.default_rng(0)
    tokens = [rng.integers(1, 64, size=10).tolist() for _ in range(4)]
    batch = build_train_batch(
        tokens, [[0] * 3 + [1] * 7] * 4, None, [1.0, -1.0, 0.5, -0.5], seq_buckets=(16,)
    )
    mesh = make_mesh(MeshConfig(), devices=jax.devices()[:1])
    model = Decoder(SMALL, rngs=nnx.Rngs(0))
    shard_node(model, mesh)
    optimizer = make_nnx_optimizer(model, OptimConfig(lr=1e-3))
    shard_node(optimizer, mesh)
    train_step(model, optimizer, shard_batch(batch, mesh), cfg=StepConfig())

    compiles: list[str] = []

    def on_event(name: str, secs: float, **kwargs) -> None:
        # Tracing as well as compiling: with the persistent compilation cache on, a retrace that
        # finds its executable on disk skips the backend compile but still costs a trace and a load.
        if name.startswith("/jax/core/compile/"):
            compiles.append(name)

    jax.monitoring.register_event_duration_secs_listener(on_event)
    try:
        for _ in range(2):
            train_step(model, optimizer, shard_batch(batch, mesh), cfg=StepConfig())
    finally:
        jax.monitoring.unregister_event_duration_listener(on_event)
    assert compiles == []


@pytest.mark.parametrize(
    ("shape", "fsdp", "expected"),
    [
        ((64, 32), 4, ("fsdp", None)),
        ((30, 32), 4, (None, "fsdp")),
        ((6,), 4, ()),
        ((), 4, ()),
        ((64, 32), 1, ()),
    ],
)
def test_param_spec_shards_the_largest_divisible_dim(shape: tuple, fsdp: int, expected: tuple) -> None:
    mesh = AbstractMesh((1, fsdp), ("data", "fsdp"), axis_types=(AxisType.Auto,) * 2)
    assert param_spec(shape, mesh) == PartitionSpec(*expected)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: MeshConfig(data=0), "MeshConfig.data must be a positive int, got 0"),
        (lambda: MeshRules(batch=("model",)), r"unknown mesh axis 'model'; choose from \('data', 'fsdp'\)"),
    ],
)
def test_mesh_configs_reject_bad_values(build, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build()


if __name__ == "__main__":
    print(json.dumps(run_on_fake_devices()))
