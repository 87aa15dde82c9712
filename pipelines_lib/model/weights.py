"""Inference-weight folders: an Orbax item of the decoder's parameters plus its ``ModelConfig`` as JSON.

    <path>/state/              Orbax StandardCheckpointer item of nnx.state(model, nnx.Param)
    <path>/model_config.json   ModelConfig.to_dict(), written after the Orbax item is complete

``path`` is a local path, a ``file://`` URL, or any URL Orbax understands (``gs://...`` flows through
unchanged; Orbax and ``etils.epath`` handle it). A folder is self-describing: ``load_weights(path)`` rebuilds the
decoder from the JSON and restores the parameters into it without a random initialisation. The
publish stage adds the version pointer on top of these two functions.

The decoder's layers are stacked (``layers/attn/q_proj/kernel`` of shape ``[n_layers, ...]``). A folder in
the unrolled layout of earlier releases (one subtree per layer: ``layers/0/attn/q_proj/kernel``, ...) is
converted as it loads: its item is read whole into each process's host memory, the layers stacked, then placed on
the mesh. Either layout loads onto whatever devices the loading process has, whichever devices saved it: the
restore is given the shardings (or the host) to read into, never the saved ones.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx
from jax.sharding import Mesh

from pipelines_lib.mesh import MeshConfig, make_mesh, place_state, sharded_shapes
from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder

STATE_ITEM = "state"
CONFIG_FILE = "model_config.json"


def _path(path_or_url: str) -> epath.Path:
    # Orbax wants absolute local paths and has no file:// backend: campaign URLs like file:///abs/run
    # become /abs/run, relative paths are resolved; every other URL (gs://...) is passed through.
    if path_or_url.startswith("file://"):
        path_or_url = path_or_url.removeprefix("file://")
    if "://" in path_or_url:
        return epath.Path(path_or_url)
    return epath.Path(epath.Path(path_or_url).resolve())


def save_weights(model: Decoder, path_or_url: str) -> None:
    """Write ``model``'s parameters and config under ``path_or_url``; refuses an existing item.

    With parameters spanning several processes every process calls it (Orbax writes each process's shards);
    process 0 writes the config."""
    root = _path(path_or_url)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(root / STATE_ITEM, nnx.state(model, nnx.Param))
    if jax.process_index() == 0:
        (root / CONFIG_FILE).write_text(json.dumps(model.cfg.to_dict(), indent=2, sort_keys=True))


def load_config(path_or_url: str) -> ModelConfig:
    config_path = _path(path_or_url) / CONFIG_FILE
    if not config_path.exists():
        raise FileNotFoundError(f"{config_path}: no model config (is {path_or_url} a weights folder?)")
    return ModelConfig.from_dict(json.loads(config_path.read_text()))


def load_weights(path_or_url: str, mesh: Mesh | None = None) -> Decoder:
    """The decoder saved by ``save_weights`` at ``path_or_url``, its parameters sharded on ``mesh`` by the rules
    table (``pipelines_lib.mesh``; each process reads only its own devices' shards), by default on one device whatever
    mesh saved them."""
    cfg = load_config(path_or_url)
    abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    graphdef, abstract_params, rest = nnx.split(abstract, nnx.Param, ...)
    mesh = make_mesh(MeshConfig()) if mesh is None else mesh
    item = _path(path_or_url) / STATE_ITEM
    with ocp.StandardCheckpointer() as checkpointer:
        saved = checkpointer.metadata(item).item_metadata.tree
        if not unrolled_layers(saved):
            return nnx.merge(graphdef, checkpointer.restore(item, sharded_shapes(abstract_params, mesh)), rest)
    # Read into host memory, not onto the shardings the item records: those name the devices of the process that
    # wrote it (``cpu:0``, eight fake devices), which this process may not have.
    on_host = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), saved)
    with ocp.PyTreeCheckpointer() as reader:
        unrolled = reader.restore(item, args=ocp.args.PyTreeRestore(restore_args=on_host))
    nnx.replace_by_pure_dict(abstract_params, _variable_values(_stack_layers(unrolled, cfg.n_layers, item)))
    return nnx.merge(graphdef, place_state(abstract_params, mesh), rest)


def unrolled_layers(tree: Any) -> bool:
    """Whether an Orbax item's tree (its metadata or its values) holds the decoder's layers unrolled, one
    subtree per layer (``layers/0/...``), instead of stacked."""
    if not isinstance(tree, dict):
        return False
    layers = tree.get("layers")
    if isinstance(layers, dict) and layers and all(str(k).isdigit() for k in layers):
        return True
    return any(unrolled_layers(v) for k, v in tree.items() if k != "layers")


def _stack_layers(tree: dict[str, Any], n_layers: int, item: epath.Path) -> dict[str, Any]:
    held = sorted(tree["layers"], key=int)
    if held != [str(i) for i in range(n_layers)]:
        raise ValueError(f"{item}: holds layers {held}, its model config has n_layers={n_layers}")
    per_layer = [tree["layers"][str(i)] for i in range(n_layers)]
    return {**tree, "layers": jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *per_layer)}


def _variable_values(tree: Any) -> Any:
    # Orbax writes each nnx.Variable as {"value": array}; a pure dict holds the arrays themselves.
    if isinstance(tree, dict):
        return tree["value"] if set(tree) == {"value"} else {k: _variable_values(v) for k, v in tree.items()}
    return tree
