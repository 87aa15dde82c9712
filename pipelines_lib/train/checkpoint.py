"""Trainer checkpoints: two functions over Orbax plus a create-only commit marker.

```
train/checkpoints/<step:08d>/state/        Orbax item: {"params": model params, "opt": optimizer state}
train/checkpoints/<step:08d>/meta.json     step, policy version, tail cursor, RNG key data
train/checkpoints/<step:08d>/COMMITTED     written last (create-only): only committed checkpoints exist
```
A crash during a save leaves a folder without ``COMMITTED``; ``restore_latest`` ignores it, and a later save
of the same step picks a fresh attempt folder suffix so nothing is ever overwritten. A checkpoint of a decoder
with unrolled layers (``layers/<i>/...``, the layout of earlier releases) is refused with an error naming it.

A trainer spanning several processes calls both functions on every process: Orbax writes and reads each
process's own shards, process 0 alone writes ``meta.json`` and ``COMMITTED``, and barriers keep every process
on one view of the folder (the same attempt folder, a marker written before anyone looks for it).
"""

from __future__ import annotations

from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx

from pipelines_lib.distributed import barrier, is_writer
from pipelines_lib.model.weights import _path as orbax_path
from pipelines_lib.model.weights import unrolled_layers
from pipelines_lib.records import CheckpointMeta, committed_checkpoints
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store


def checkpoint_state(model: nnx.Module, optimizer: nnx.Optimizer) -> dict[str, Any]:
    """What a checkpoint's Orbax item holds: the model's parameters and the optimizer's state."""
    return {"params": nnx.state(model, nnx.Param), "opt": nnx.state(optimizer)}


def save_checkpoint(
    store: Store,
    *,
    step: int,
    version: int,
    cursor: str,
    rng: jax.Array,
    state: dict[str, Any],
) -> str:
    """Save ``state`` (``checkpoint_state``: device arrays, or host copies of them) and commit; returns the folder.
    Re-saving a committed step is a no-op."""
    barrier(f"checkpoint {step}: look")
    attempt = 0
    folder = layout.checkpoint_dir(step)
    while store.exists(layout.checkpoint_committed(folder)) or store.list(folder, include_hidden=True):
        if store.exists(layout.checkpoint_committed(folder)):
            return folder
        attempt += 1  # a crashed earlier save left a partial folder: never write into it
        folder = layout.checkpoint_dir(step, attempt)
    barrier(f"checkpoint {step}: save into {folder}")  # nobody writes before everybody has chosen

    def save() -> None:
        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(orbax_path(store.uri(f"{folder}/state")), state)

    store.call_external("save checkpoint", f"{folder}/state", save)
    if is_writer():
        rng_data = [int(x) for x in jax.random.key_data(rng).ravel()]
        CheckpointMeta(step=step, version=version, cursor=cursor, rng=rng_data).write(store, folder)
        store.create(layout.checkpoint_committed(folder), b"")
    barrier(f"checkpoint {folder}: committed")
    return folder


def restore_latest(store: Store, *, model: nnx.Module, optimizer: nnx.Optimizer, before_step: int | None = None
                   ) -> tuple[str, CheckpointMeta] | None:
    """Restore the newest committed checkpoint (of a step before ``before_step``, when given) into
    ``model``/``optimizer`` in place; returns its folder and meta, or None if there is none."""
    folders = [f for f in committed_checkpoints(store)
               if before_step is None or (layout.checkpoint_step(f) or 0) < before_step]
    if not folders:
        return None
    folder = folders[-1]
    # The shapes and shardings of the model and optimizer as placed now, not those the checkpoint records: a
    # checkpoint saved on one mesh or device set restores onto another.
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, checkpoint_state(model, optimizer))
    def restore() -> Any:
        path = orbax_path(store.uri(f"{folder}/state"))
        with ocp.StandardCheckpointer() as checkpointer:
            if unrolled_layers(checkpointer.metadata(path).item_metadata.tree):
                raise ValueError(
                    f"{path}: a trainer checkpoint with the decoder's layers unrolled (layers/<i>/...), which this "
                    "release cannot resume (its layers are stacked): finish the run with the release that wrote it, "
                    "or start a new campaign from its published weights (weights folders of that layout still load)")
            return checkpointer.restore(path, target)

    restored = store.call_external("restore checkpoint", f"{folder}/state", restore)
    nnx.update(model, restored["params"])
    nnx.update(optimizer, restored["opt"])
    return folder, CheckpointMeta.read(store, folder)


__all__ = ["checkpoint_state", "restore_latest", "save_checkpoint"]
