"""The evaluate stage: score one published version on the held-out split; writes ``eval/v<N:08d>.json`` once.

A rerun returns the stored ``EvalResult``; two concurrent evaluations of one version leave one file (the first
to commit), and both return it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pipelines_lib import telemetry
from pipelines_lib.config import CampaignConfig
from pipelines_lib.dataset import load_split
from pipelines_lib.engine.api import Engine
from pipelines_lib.engine.backends import open_engine
from pipelines_lib.envs import Task
from pipelines_lib.evaluate import HELDOUT, evaluate_model
from pipelines_lib.model.tokenizer import ChatTokenizer, open_tokenizer
from pipelines_lib.records import EvalResult, with_parents
from pipelines_lib.storage.errors import AlreadyExistsError
from pipelines_lib.storage.store import Store


def score(engine: contextlib.AbstractAsyncContextManager[Engine], tokenizer: ChatTokenizer, tasks: Sequence[Task],
          config: CampaignConfig) -> dict[str, Any]:
    """``evaluate_model`` on ``engine`` with the campaign's eval, rollout and agent sections and its seed."""
    return evaluate_model(engine, tokenizer, tasks, config.eval, rollout=config.rollout, agent=config.agent,
                          seed=config.seed, env=config.env)


def evaluate(store: Store, config: CampaignConfig, *, version: int, cache: Path | None = None,
             log: Callable[[str], None] = print) -> EvalResult:
    """Score published ``version`` on the first ``config.eval.n_tasks`` held-out tasks (a no-op once scored), on
    an engine of ``config.engine.kind`` on ``config.eval.mesh``. ``cache`` is the process's cache folder
    (``Settings.cache``); ``log`` gets the engine's opening line and the result with its seconds (from loading the
    version, against the scoring's own ``wall_s``)."""
    store = with_parents(store)
    if EvalResult.exists(store, version):
        return EvalResult.read(store, version)
    started = time.monotonic()
    with telemetry.recording(store, "evaluate"), telemetry.span("stage.evaluate", track="stage", version=version):
        tasks = load_split(store, HELDOUT)[: config.eval.n_tasks]
        with tempfile.TemporaryDirectory(prefix="rollstream-evaluate-") as scratch:
            engine, _ = open_engine(store, version, dataclasses.replace(config.engine, mesh=config.eval.mesh),
                                    Path(scratch), log)
            result = EvalResult(version=version, split=HELDOUT, temperature=config.eval.temperature,
                                **score(engine, open_tokenizer(config.tokenizer, cache=cache), tasks, config))
        log(f"evaluate v{version}: greedy {result.greedy_success_rate:.1%} on {result.tasks} held-out tasks in "
            f"{time.monotonic() - started:.1f} s (scoring {result.wall_s:.1f} s)")
        telemetry.gauge("eval.greedy_success_rate", result.greedy_success_rate, step=version)
        if result.pass_at_k is not None:
            telemetry.gauge("eval.pass_at_k", result.pass_at_k, step=version)
    try:
        result.write(store)
    except AlreadyExistsError:
        return EvalResult.read(store, version)  # a concurrent evaluation of the same version committed first
    return result


__all__ = ["evaluate", "score"]
