"""Weights folders and trainer checkpoints restore onto the devices of the process restoring them, whichever devices
saved them: a process of 8 fake CPU devices restores, on a ``fsdp=8`` mesh, what this one saved on JAX's default
device (a CPU under ``make test``, the chip in the accelerator tier), and this one restores what that one saved.

Each side saves a model and an Adam optimizer (random moments) three ways: a weights folder, a trainer checkpoint, and
a weights folder in the unrolled layout of earlier releases (``layers/<i>/...``); ``values.npz`` beside them holds
what was saved. XLA reads ``--xla_force_host_platform_device_count`` only when JAX starts, so the 8-device side is
this module run in a fresh interpreter (``python -m tests.test_restore_topology FROM TO``): it saves into ``TO``,
then restores ``FROM``, failing on any difference.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from jax.sharding import Mesh

from bench.scale import ROOT, fake_devices_env
from pipelines_lib.mesh import MeshConfig, make_mesh, shard_node
from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.weights import CONFIG_FILE, STATE_ITEM, load_weights, save_weights
from pipelines_lib.storage.store import Store
from pipelines_lib.train.checkpoint import checkpoint_state, restore_latest, save_checkpoint
from pipelines_lib.train.optim import OptimConfig, make_nnx_optimizer

CFG = dataclasses.replace(ModelConfig.tiny(), n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128)
"""Two layers whose every width splits on 8 devices."""
FAKE_DEVICES = 8


def _values(params: nnx.State, opt: nnx.State | None = None) -> dict[str, np.ndarray]:
    trees = {"params": params} if opt is None else {"params": params, "opt": opt}
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(trees)}


def _model_and_optimizer(mesh: Mesh, seed: int) -> tuple[Decoder, nnx.Optimizer]:
    model = Decoder(CFG, rngs=nnx.Rngs(seed))
    shard_node(model, mesh)
    optimizer = make_nnx_optimizer(model, OptimConfig(), mesh)
    rng = np.random.default_rng(seed)
    nnx.update(optimizer, jax.tree.map(
        lambda x: jax.device_put(rng.normal(size=x.shape).astype(x.dtype), x.sharding)
        if jnp.issubdtype(x.dtype, jnp.floating) else x, nnx.state(optimizer)))
    return model, optimizer


def save_all(folder: Path, mesh: Mesh, seed: int) -> None:
    """A model and optimizer on ``mesh`` saved the three ways under ``folder``, with ``values.npz``."""
    model, optimizer = _model_and_optimizer(mesh, seed)
    save_weights(model, str(folder / "weights"))
    save_checkpoint(Store(str(folder / "campaign")), step=1, version=0, cursor="{}", rng=jax.random.key(seed),
                    state=checkpoint_state(model, optimizer))
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    stacked = params.pop("layers")
    params["layers"] = {str(i): jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(CFG.n_layers)}
    with ocp.StandardCheckpointer() as checkpointer:  # on the mesh's devices, as an earlier release saved it
        checkpointer.save((folder / "unrolled" / STATE_ITEM).resolve(), params)
    (folder / "unrolled" / CONFIG_FILE).write_text(json.dumps(CFG.to_dict()))
    np.savez(folder / "values.npz", **_values(nnx.state(model, nnx.Param), nnx.state(optimizer)))


def assert_restores(folder: Path, mesh: Mesh) -> None:
    """Every form saved under ``folder`` restores onto ``mesh``'s devices with the values saved."""
    saved = dict(np.load(folder / "values.npz"))
    model, optimizer = _model_and_optimizer(mesh, seed=99)
    assert restore_latest(Store(str(folder / "campaign")), model=model, optimizer=optimizer) is not None
    restored = {"checkpoint": (nnx.state(model, nnx.Param), nnx.state(optimizer))}
    for form in ("weights", "unrolled"):
        restored[form] = (nnx.state(load_weights(str(folder / form), mesh), nnx.Param), None)
    for form, (params, opt) in restored.items():
        got = _values(params, opt)
        expected = saved if opt is not None else {k: v for k, v in saved.items() if k.startswith("['params']")}
        assert got.keys() == expected.keys(), form
        for key, value in expected.items():
            np.testing.assert_array_equal(got[key], value, err_msg=f"{form} {key}")
        devices = {d for leaf in jax.tree.leaves((params, opt)) for d in leaf.sharding.device_set}
        assert devices == set(mesh.devices.flat), form


@pytest.fixture(scope="module")
def eight_devices(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """What this process saved on one device (``one/``) and what 8 fake devices saved (``eight/``), with the 8-device
    interpreter's run (it restored ``one/``)."""
    root = tmp_path_factory.mktemp("topology")
    save_all(root / "one", make_mesh(MeshConfig(), devices=jax.devices()[:1]), seed=0)
    run = subprocess.run([sys.executable, "-m", "tests.test_restore_topology", str(root / "one"), str(root / "eight")],
                         cwd=ROOT, env=fake_devices_env(FAKE_DEVICES), capture_output=True, text=True, timeout=300)
    return root, run


def test_what_one_device_saved_restores_onto_8_devices(eight_devices) -> None:
    _, run = eight_devices
    assert run.returncode == 0, run.stderr[-4000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"restored_on_devices": FAKE_DEVICES}


def test_what_8_devices_saved_restores_onto_one_device(eight_devices) -> None:
    root, run = eight_devices
    assert (root / "eight" / "values.npz").is_file(), run.stderr[-4000:]
    assert_restores(root / "eight", make_mesh(MeshConfig(), devices=jax.devices()[:1]))


if __name__ == "__main__":
    source, target = map(Path, sys.argv[1:3])
    eight = make_mesh(MeshConfig(fsdp=FAKE_DEVICES))
    save_all(target, eight, seed=1)
    assert_restores(source, eight)
    print(json.dumps({"restored_on_devices": eight.size}))
