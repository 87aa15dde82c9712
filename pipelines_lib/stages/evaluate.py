"""The evaluate stage: score one published version on the held-out split; writes ``eval/v<N:08d>.json`` once.

A rerun returns the stored ``EvalResult``; two concurrent evaluations of one version leave one file (the first
to commit), and both return it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipelines_lib import telemetry
from pipelines_lib.config import CampaignConfig
from pipelines_lib.dataset import load_split
from pipelines_lib.envs import Task
from pipelines_lib.evaluate import HELDOUT, evaluate_model
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.tokenizer import ChatTokenizer, open_tokenizer
from pipelines_lib.publish import load_published
from pipelines_lib.records import EvalResult, with_parents
from pipelines_lib.storage.errors import AlreadyExistsError
from pipelines_lib.storage.store import Store


def score(model: Decoder, tokenizer: ChatTokenizer, tasks: Sequence[Task], config: CampaignConfig) -> dict[str, Any]:
    """``evaluate_model`` with the campaign's eval, rollout, agent and engine sections and its seed."""
    return evaluate_model(model, tokenizer, tasks, config.eval, rollout=config.rollout, agent=config.agent,
                          engine=config.engine, seed=config.seed, env=config.env)


def evaluate(store: Store, config: CampaignConfig, *, version: int, cache: Path | None = None) -> EvalResult:
    """Score published ``version`` on the first ``config.eval.n_tasks`` held-out tasks (a no-op once scored).
    ``cache`` is the process's cache folder (``Settings.cache``)."""
    store = with_parents(store)
    if EvalResult.exists(store, version):
        return EvalResult.read(store, version)
    with telemetry.recording(store, "evaluate"), telemetry.span("stage.evaluate", track="stage", version=version):
        model, _ = load_published(store, version)
        tasks = load_split(store, HELDOUT)[: config.eval.n_tasks]
        result = EvalResult(version=version, split=HELDOUT, temperature=config.eval.temperature,
                            **score(model, open_tokenizer(config.tokenizer, cache=cache), tasks, config))
        telemetry.gauge("eval.greedy_success_rate", result.greedy_success_rate, step=version)
        if result.pass_at_k is not None:
            telemetry.gauge("eval.pass_at_k", result.pass_at_k, step=version)
    try:
        result.write(store)
    except AlreadyExistsError:
        return EvalResult.read(store, version)  # a concurrent evaluation of the same version committed first
    return result


__all__ = ["evaluate", "score"]
