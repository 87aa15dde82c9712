"""Multi-process JAX: joining the process group, and the few collectives the stages need around it.

```
DistributedConfig (campaign config ``distributed``)        empty: one process, nothing is initialised
initialize(cfg, process_id=...)                            the stage entry point, before anything touches JAX:
    jax.distributed.initialize(coordinator, n, id)         every device of every process in jax.devices()
    CPU backends collect over gloo                         (fake-device tests: two processes on 127.0.0.1)
is_writer()                                                process 0: the only writer of records, markers,
                                                           publications and pointers
barrier(name) / agree(value, what)                         every process reached here / holds the same value
host_copy(tree)                                            a full host (numpy) copy of sharded arrays, on every
                                                           process (HF export of a publication)
```

All processes run the same program on the same data: they tail the same shards in the same order, build the
same global batch and each feeds the rows its devices hold (``mesh.shard_batch``). ``agree`` turns a
silent divergence (a process that listed a shard the others did not) into an error naming the processes.

Failure: a process that dies stops sending heartbeats to the coordination service; after
``heartbeat_timeout_s`` the service aborts every other process (exit status non-zero) with the message
``The following tasks are unhealthy (stopped sending heartbeats): <process ids>``, even when they are blocked
in a collective. A restart of the whole group resumes from the trainer's checkpoint and write-ahead log.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np


class ProcessDivergenceError(RuntimeError):
    """Processes of one job disagree on what they are about to compute."""


@dataclass(frozen=True, kw_only=True)
class DistributedConfig:
    """How the processes of one multi-process stage find each other; empty means a single process."""

    coordinator_address: str | None = None
    """``host:port`` of process 0's coordination service (the same on every process); None: single process, or
    the environment's values with ``from_environment``."""
    num_processes: int | None = None
    """Processes in the job (with ``coordinator_address``)."""
    process_id: int | None = None
    """This process's index in [0, num_processes); usually given per process on the command line
    (``rollstream train --process-id``, a Kubernetes indexed Job's ``JOB_COMPLETION_INDEX``)."""
    from_environment: bool = False
    """Let JAX read coordinator, count and index from the environment (Cloud TPU VMs, GKE TPU slices, Slurm)."""
    heartbeat_timeout_s: int = 30
    """A process silent for this long is declared dead and every other process exits non-zero naming it."""
    initialization_timeout_s: int = 300
    """Longest wait for every process to join the group at start."""

    def __post_init__(self) -> None:
        if self.coordinator_address is not None:
            host, _, port = self.coordinator_address.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"DistributedConfig.coordinator_address must be host:port, got "
                                 f"{self.coordinator_address!r}")
            if self.num_processes is None or self.num_processes < 1:
                raise ValueError(f"DistributedConfig.num_processes must be >= 1 with a coordinator_address, got "
                                 f"{self.num_processes!r}")
            if self.from_environment:
                raise ValueError("DistributedConfig: give coordinator_address or from_environment, not both")
        if self.process_id is not None and self.num_processes is not None and not (
                0 <= self.process_id < self.num_processes):
            raise ValueError(f"DistributedConfig.process_id must be in [0, {self.num_processes}), got "
                             f"{self.process_id}")
        for name in ("heartbeat_timeout_s", "initialization_timeout_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"DistributedConfig.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def multi_process(self) -> bool:
        return self.from_environment or (self.num_processes or 1) > 1


def initialize(cfg: DistributedConfig, *, process_id: int | None = None) -> None:
    """Join the process group ``cfg`` describes (``process_id`` overrides ``cfg.process_id``); a no-op for an
    empty config. Must run before anything initialises a JAX backend."""
    if not cfg.multi_process or jax.distributed.is_initialized():
        return
    # CPU devices of different processes exchange data over gloo (TCP); accelerators use their own fabric.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if cfg.from_environment:
        jax.distributed.initialize(initialization_timeout=cfg.initialization_timeout_s,
                                   heartbeat_timeout_seconds=cfg.heartbeat_timeout_s)
        return
    index = cfg.process_id if process_id is None else process_id
    if index is None or not 0 <= index < (cfg.num_processes or 1):
        raise ValueError(f"distributed: process id {index!r} is not in [0, {cfg.num_processes}) (give "
                         "distributed.process_id or --process-id)")
    jax.distributed.initialize(cfg.coordinator_address, cfg.num_processes, index,
                               initialization_timeout=cfg.initialization_timeout_s,
                               heartbeat_timeout_seconds=cfg.heartbeat_timeout_s)


def is_writer() -> bool:
    """Whether this process writes the job's records, markers, publications and pointers (process 0)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Return once every process has called ``barrier(name)``; a no-op in a single process."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def any_process(flag: bool) -> bool:
    """Whether ``flag`` is true on any process (a collective: every process must call it)."""
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils

    return bool(np.asarray(multihost_utils.process_allgather(np.int32(flag))).any())


def digest(text: str) -> int:
    """A 63-bit hash of ``text`` (stable across processes and runs, unlike ``hash``)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def agree(text: str, what: str) -> None:
    """Raise ``ProcessDivergenceError`` unless every process passes the same ``text`` (compared by hash)."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    hashes = [int(h) for h in np.asarray(multihost_utils.process_allgather(np.int64(digest(text))))]
    if len(set(hashes)) > 1:
        groups: dict[int, list[int]] = {}
        for process, h in enumerate(hashes):
            groups.setdefault(h, []).append(process)
        raise ProcessDivergenceError(
            f"processes disagree on {what}: " + "; ".join(f"processes {ps} hash {h:016x}" for h, ps in groups.items())
            + f" (this is process {jax.process_index()}, whose value is {text[:300]!r})")


def host_copy(tree: Any) -> Any:
    """``tree`` with every array replaced by a full numpy copy, on every process (a collective when arrays span
    processes: every process must call it)."""
    if jax.process_count() == 1:
        return jax.tree.map(np.asarray, tree)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)


__all__ = ["DistributedConfig", "ProcessDivergenceError", "agree", "barrier", "digest", "host_copy", "initialize",
           "is_writer"]
