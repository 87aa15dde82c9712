"""A trainer's publications and checkpoints, written off its loop.

```
trainer thread, at a step that publishes or checkpoints     writer thread, one job at a time
  wait for the previous job (its error is raised here)
  hand the compute-dtype cast to an in-process engine
  host copies: the cast (unless the engine keeps it),  ──►  publish_weights  (Orbax, HF, marker, pointer)
  masters + optimizer state (at a checkpoint)
  train the next steps                                      save_checkpoint  (Orbax, meta, COMMITTED)
```

A step's writes land in the order they had when the trainer wrote them itself (publication, pointer, then the
checkpoint), and a job starts only once the one before it has finished, so storage passes through the same states.
What changes is who waits: a 0.6B model's version and checkpoint are about 7 GB, which held the trainer's loop 16-17 s
a publication on a TPU VM (docs/TPU.md); the trainer now trains meanwhile, up to its next publication or checkpoint,
which waits for the rest. The jobs read host copies taken before the trainer moves on, because its next step
donates the buffers of the masters and optimizer state it updates; the one exception is a compute-dtype cast that an
in-process engine keeps (``served_kept``): nothing donates it, so the job writes it from the device and the loop
copies nothing at a publication.

``TrainerWrites(inline=True)`` runs each job in the caller's thread: a trainer spanning several processes writes
inline, because its writes are collectives (barriers, gathers) that every process must issue in the same order as
its steps' own collectives. A process that dies with a job in flight leaves what an inline write would have left
when killed at that point: a folder without its marker, which readers never load and a resume writes again.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from pipelines_lib import telemetry
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.publish import publish_weights
from pipelines_lib.storage.store import Store
from pipelines_lib.train.checkpoint import save_checkpoint


def host_snapshot(tree: Any) -> Any:
    """``tree`` with every array copied whole into this host's memory, as arrays of JAX's CPU device (a copy even where
    the array already lives there: a CPU array's buffer is the one the next step donates).

    JAX arrays, not NumPy's: Orbax writes NumPy arrays through a slower path (a 1.2-GB bfloat16 tree on 2 cores:
    6.2 s as NumPy arrays, 2.3 s as CPU arrays)."""
    cpu = jax.devices("cpu")[0]
    for leaf in jax.tree.leaves(tree):  # every transfer under way before the first is waited for
        if isinstance(leaf, jax.Array) and cpu not in leaf.devices():
            leaf.copy_to_host_async()
    # NumPy's copy first: a device_put from an array of the CPU devices may hand back its buffer (a replicated
    # scalar over fake CPU devices did, may_alias=False notwithstanding), which the next step donates.
    return jax.tree.map(lambda leaf: jax.device_put(np.array(leaf, copy=True), cpu), tree)


class TrainerWrites:
    """Runs a trainer's write jobs one at a time on a thread of their own (or inline), and raises a failed job's
    error at the next ``submit`` or ``wait``, naming the job."""

    def __init__(self, *, inline: bool) -> None:
        self.inline = inline
        self._thread: threading.Thread | None = None
        self._what = ""
        self._error: BaseException | None = None

    def submit(self, what: str, job: Callable[[], None]) -> None:
        """Start ``job`` (``what`` names it in errors and in the ``writer`` track's span) once the previous job has
        finished; inline, run it now."""
        self.wait()
        if self.inline:
            job()
            return

        def run() -> None:
            try:
                with telemetry.span("write", track="writer", what=what):
                    job()
            except BaseException as e:  # handed to the trainer's thread, which raises it
                self._error = e

        self._what = what
        # In the trainer's context, so that the job's spans reach the trainer's telemetry recorder.
        self._thread = threading.Thread(target=contextvars.copy_context().run, args=(run,),
                                        name=f"trainer-writes: {what}", daemon=False)
        self._thread.start()

    def step(self, store: Store, *, step: int, version: int, cursor: str, rng: jax.Array,
             state: dict[str, Any] | None, served: Decoder | None, tokenizer_dir: str | Path | None,
             hf: bool, served_kept: bool, published: Callable[[], None] | None) -> None:
        """Submit a step's writes: ``served`` published as ``version`` (when given; with its HF folder when ``hf``),
        then the checkpoint of ``state`` (``checkpoint_state``, when given); off the loop, from host copies.
        ``served_kept``: ``served``'s buffers outlive the job untouched (a cast an in-process engine keeps), so the
        job writes them from the device and the loop copies nothing of them. ``published()`` (when given) is called
        once the pointer names the version, from the job's thread."""
        if state is None and served is None:
            raise ValueError(f"TrainerWrites.step: step {step} has nothing to write (no state, no served model)")
        if not self.inline:  # the trainer's next step donates these buffers: the job writes copies
            state = None if state is None else host_snapshot(state)
            if served is not None and not served_kept:
                graphdef, params, rest = nnx.split(served, nnx.Param, ...)
                served = nnx.merge(graphdef, host_snapshot(params), rest)

        def job() -> None:
            if served is not None:
                publish_weights(store, served, version=version, step=step, tokenizer_dir=tokenizer_dir, hf=hf)
                if published is not None:
                    published()
            if state is not None:
                save_checkpoint(store, step=step, version=version, cursor=cursor, rng=rng, state=state)

        what = [f"version {version}"] * (served is not None) + ["checkpoint"] * (state is not None)
        self.submit(f"step {step}: {' and '.join(what)}", job)

    def wait(self) -> None:
        """Return once no job is running; raise the error of the one that ran last, if it failed."""
        if self._thread is None:
            return
        self._thread.join()
        self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise RuntimeError(f"the trainer's background write ({self._what}) failed: {error}") from error

    def finish(self, log: Callable[[str], None]) -> None:
        """``wait`` while another error propagates: the write in flight finishes (what it leaves is as consistent as
        the rest of storage), and its own failure is logged instead of raised over that error."""
        try:
            self.wait()
        except RuntimeError as e:
            log(f"trainer: {e}")


__all__ = ["TrainerWrites", "host_snapshot"]
