"""Colocated placement: a whole campaign in one process that holds the device(s), time-sharing them.

```
run_colocated(store, config)
  memory plan (pipelines_lib.memplan): what each part holds on the device, printed; a config that cannot fit is
      refused before anything compiles or is written; engine.num_blocks: auto gets what the plan leaves
  init_campaign -> prep -> warm_start                      the same stage functions, in this thread
  rollout workers 0..N-1 (threads)  ||  trainer (this thread)
      DeviceWeights.hand_over(N, model): the parameters about to be published (their cast, or a copy); workers
      are woken and swap them in at once (no Orbax reload, no host round trip) while the trainer's writer
      publishes v<N> to the folder (Orbax, HF, marker, pointer: as in separate placement); groups sampled from
      v<N> wait in the worker's memory until the pointer names it (DeviceWeights.stored, pointer_moved)
  evaluate the versions eval.versions asks for -> audit
```

Why one process: a TPU chip can be opened by one process only, so rollouts, training and evaluation must share it
through one JAX runtime; XLA interleaves the programs the threads dispatch. Every record the campaign folder gets is
written by the same stage functions as in separate placement, so the audit cannot tell the placements apart, and η
admission and the trainer's window work unchanged (workers still read the pointer; the writer only wakes them when it
moves). A version is served from its hand-over (``rollout.swap_at_hand_over``; false: once the pointer names it), so
rollouts run while it is written; what storage records is unchanged, because a worker commits a group only once every
version it sampled from is stored. Every step is idempotent, so a rerun continues an interrupted (or stopped:
``stages.stopping``) campaign.
Nothing here imports Prefect: a REPL, the ``rollstream run-colocated`` command and the campaign flow's one colocated
task all call ``run_colocated``.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from pipelines_lib import records, telemetry
from pipelines_lib.config import CampaignConfig
from pipelines_lib.memplan import MemoryPlan, device_limit, plan_memory, trainer_rows, xla_step_temporaries
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.hf_import import read_hf_config
from pipelines_lib.publish import CampaignWeights
from pipelines_lib.records import versions_to_evaluate
from pipelines_lib.stages.audit import audit
from pipelines_lib.stages.campaign import init_campaign
from pipelines_lib.stages.collect import collect, request_stop, worker_name
from pipelines_lib.stages.evaluate import evaluate
from pipelines_lib.stages.prep import prep
from pipelines_lib.stages.stopping import check_stop
from pipelines_lib.stages.train import train
from pipelines_lib.stages.warm_start import is_hf_folder, warm_start
from pipelines_lib.storage.store import Store


class DeviceWeights:
    """A rollout ``WeightSource`` fed by the trainer of the same process.

    ``stored`` reads the campaign's pointer, as ``CampaignWeights.latest`` does. ``latest`` is the same, or with
    ``ahead`` the version handed over when the pointer does not name it yet: the trainer hands a version over before
    its writer stores it, and waits for that write before handing over the next, so at most one version is ahead.
    ``load`` returns the parameters the trainer handed over for that version, already on the device; a version it
    never saw (version 0, or versions published before this process started) is loaded from the folder."""

    def __init__(self, store: Store, *, copy: bool = True, ahead: bool = False) -> None:
        self._published = CampaignWeights(store)
        self._copy = copy
        self._ahead = ahead
        self._lock = threading.Lock()
        self._held: tuple[int, nnx.State] | None = None
        self._watchers: list[Callable[[], None]] = []
        self.handed_over = 0
        """Versions taken from device memory by ``load`` (the rest came from the folder)."""

    def hand_over(self, version: int, model: Decoder) -> None:
        """Keep ``model``'s parameters on the device as ``version`` (the trainer's ``on_publish``, called before the
        pointer moves: a worker that sees the version finds it here); one version only, because workers load the
        newest. A copy when ``copy`` (the trainer publishes its masters themselves, whose buffers its next step
        donates); otherwise the publication's own cast to the compute dtype is kept, with no second copy."""
        with telemetry.span("hand_over", track="trainer", version=version):
            params = nnx.state(model, nnx.Param)
            if self._copy:
                params = jax.tree.map(lambda leaf: jnp.array(leaf, copy=True), params)
            jax.block_until_ready(params)  # the span times the cast or copy, not its dispatch
        with self._lock:
            self._held = (version, params)
        if self._ahead:
            self._wake()

    def stored(self) -> int | None:
        """The newest version the campaign's pointer names."""
        return self._published.latest()

    def latest(self) -> int | None:
        """The newest version a worker may serve: ``stored()``, or with ``ahead`` a newer version handed over."""
        stored = self.stored()
        with self._lock:
            held = self._held
        if self._ahead and held is not None and (stored is None or held[0] > stored):
            return held[0]
        return stored

    def watch(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake()`` each time the pointer moves (``pointer_moved``), and with ``ahead`` at each hand-over, until
        the returned ``unwatch()``: a worker's orchestrator looks then rather than at its next poll."""
        with self._lock:
            self._watchers.append(wake)

        def unwatch() -> None:
            with self._lock:
                self._watchers.remove(wake)

        return unwatch

    def pointer_moved(self, version: int) -> None:
        """The trainer's ``on_published``: the pointer names ``version`` now; every watching worker is woken."""
        self._wake()

    def _wake(self) -> None:
        with self._lock:
            watchers = list(self._watchers)
        for wake in watchers:
            wake()

    def load(self, version: int) -> nnx.State:
        with self._lock:
            held = self._held
        if held is not None and held[0] == version:
            self.handed_over += 1
            return held[1]
        return self._published.load(version)


def _evaluate_all(store: Store, config: CampaignConfig, cache: Path | None,
                  log: Callable[[str], None]) -> dict[int, dict[str, Any]]:
    """Score every version ``eval.versions`` asks for that has no ``EvalResult`` yet (a stop signal: none after the
    one being scored)."""
    done = set(records.evaluated_versions(store))
    out = {}
    for v in versions_to_evaluate(records.published_versions(store), config.eval.versions):
        if v not in done:
            check_stop()
            out[v] = evaluate(store, config, version=v, cache=cache, log=log).to_dict()
    return out


def _collect_and_train(store: Store, config: CampaignConfig, *, cache: Path | None,
                       log: Callable[[str], None]) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    """Rollout workers on threads while the trainer runs on this one; if the trainer fails, the workers are asked
    to stop (a stop request, as the campaign flow does) and waited for before the error propagates. A worker that
    fails stops the trainer at its next wait for groups with that worker's error (the others are asked to stop):
    the trainer would otherwise wait ``trainer.data_timeout_s`` for groups and then name the wrong cause."""
    precision = config.trainer.step.precision
    weights = DeviceWeights(store, copy=precision.params == precision.compute, ahead=config.rollout.swap_at_hand_over)
    failed: list[BaseException] = []  # the trainer's abort: the first worker's error, wrapped once

    def note_failure(worker: Future[dict[str, Any]]) -> None:
        if not worker.cancelled() and (err := worker.exception()) is not None:
            wrapped = RuntimeError(f"a colocated rollout worker failed: {type(err).__name__}: {err}")
            wrapped.__cause__ = err
            failed.append(wrapped)

    def abort() -> BaseException | None:
        return failed[0] if failed else None

    with ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="colocated-rollout") as pool:
        workers: list[Future[dict[str, Any]]] = [
            pool.submit(collect, store, config, worker=worker_name(i), worker_index=i, num_workers=config.workers,
                        cache=cache, weights=weights, log=log)
            for i in range(config.workers)]
        for w in workers:
            w.add_done_callback(note_failure)
        try:
            trained = train(store, config, cache=cache, on_publish=weights.hand_over, on_published=weights.pointer_moved,
                            abort=abort, log=log)
        except BaseException as e:
            request_stop(store, f"colocated trainer failed: {type(e).__name__}: {e}")
            raise
        collected = [w.result() for w in workers]  # they stop on the trainer's done marker
    return trained, collected, weights.handed_over


def plan_colocated(config: CampaignConfig, *, n_devices: int | None = None) -> MemoryPlan:
    """The campaign's memory plan on this process's first device, checked (``MemoryPlanError`` naming the part and
    the setting to change): first what arithmetic counts exactly, before anything compiles; then with the train
    step's temporaries, from XLA's memory analysis of the compiled step on an accelerator with a one-device trainer,
    estimated elsewhere. The model is the HF folder's when ``init_from`` names one (in ``model.dtype``).
    ``n_devices``: plan for that many devices of this kind instead of the process's (``rollstream plan
    --devices``: a slice planned from one chip or a laptop); the temporaries are then estimated."""
    model = config.model
    if config.init_from is not None and is_hf_folder(config.init_from):
        model = dataclasses.replace(read_hf_config(config.init_from), dtype=config.model.dtype)
    limit, source = device_limit(config.memory)
    here = n_devices is None or n_devices == jax.device_count()
    devices = jax.device_count() if n_devices is None else n_devices
    args = dict(group_size=config.rollout.group_size, workers=config.workers, n_devices=devices,
                limit_bytes=limit, limit_source=source, headroom=config.memory.headroom)
    plan = plan_memory(model, config.trainer, config.engine, **args)
    plan.check(exact_only=True)
    if here and jax.default_backend() != "cpu" and math.prod(config.trainer.mesh.resolve(devices)) == 1:
        rows = trainer_rows(config.trainer, group_size=config.rollout.group_size, n_devices=1)
        plan = plan_memory(model, config.trainer, config.engine, **args,
                           step_temporaries=xla_step_temporaries(model, config.trainer, rows=rows))
    plan.check()
    return plan


def run_colocated(store: Store, config: CampaignConfig, *, cache: Path | None = None,
                  log: Callable[[str], None] = print, with_audit: bool = True) -> dict[str, Any]:
    """Run (or continue) the campaign at ``store`` in this process (see the module docstring); returns each
    stage's manifest, the memory plan, ``wall_s`` and ``handed_over`` (versions the engines took from device memory).
    ``cache`` is the process's cache folder (``Settings.cache``); ``with_audit=False`` leaves the audit to the
    caller (the campaign flow audits as its own task). A stop signal (``stages.stopping``) stops the workers and the
    trainer at their safe points and raises ``Stopped`` before the next stage."""
    if config.placement != "colocated":
        raise ValueError(f"{store.url}: run_colocated needs placement='colocated', got {config.placement!r}")
    started = time.perf_counter()
    plan = plan_colocated(config)  # refuses a config that cannot fit before anything is written
    out: dict[str, Any] = {"memory_plan": plan.to_dict(), "init": init_campaign(store, config)}
    log(plan.render())  # after init_campaign: a campaign started with another config is refused in one line
    if config.engine.num_blocks == "auto":  # the manifest keeps "auto"; the engines get the plan's pool
        config = dataclasses.replace(config, engine=dataclasses.replace(config.engine, num_blocks=plan.kv_blocks))
    store = records.with_parents(store)
    log(f"colocated campaign {store.url} on {jax.default_backend()} ({jax.device_count()} device(s))")
    out["prep"] = prep(store, config)
    check_stop()
    out["warm_start"] = warm_start(store, config, cache=cache, log=log)
    check_stop()
    out["train"], out["collect"], out["handed_over"] = _collect_and_train(store, config, cache=cache, log=log)
    out["evaluate"] = _evaluate_all(store, config, cache, log)
    check_stop()
    if with_audit:
        out["audit"] = audit(store)
    out["wall_s"] = round(time.perf_counter() - started, 3)
    log(f"colocated campaign {store.url}: done in {out['wall_s']:.0f}s")
    return out


__all__ = ["DeviceWeights", "plan_colocated", "run_colocated"]
