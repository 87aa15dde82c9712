"""What every stage task shares: opening the campaign, the retry policy, and the run record.

The run record ties Prefect to the campaign folder. A stage that ran inside a flow run writes
a ``records.RunRecord`` (``runs/<key>-<flow_run_id>.json``, create-only) with the flow and task run ids, the host, the timings and
the stage's manifest, so the folder alone says which Prefect run produced which outputs, and the Prefect UI
(flow run id) leads to the folder. A failed attempt leaves ``runs/<key>-<flow_run_id>-failed-<n>.json``
with the error, then the exception propagates. Outside a flow run (a REPL, ``.fn`` in tests) nothing is
recorded: there is no run to link.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from prefect import Task
from prefect.client.schemas.objects import TaskRun
from prefect.runtime import deployment, flow_run, task_run
from prefect.states import State

from pipelines_lib.config import CampaignConfig
from pipelines_lib.records import RunRecord, with_parents
from pipelines_lib.settings import Settings
from pipelines_lib.stages.campaign import load_campaign_config
from pipelines_lib.storage.errors import AlreadyExistsError, NotFoundError, StorageError
from pipelines_lib.storage.retry import is_transient
from pipelines_lib.storage.store import Store
from pipelines_lib.utc import utc_now_iso

IO_RETRIES = 3
IO_RETRY_DELAYS_S = [10, 30, 90]
"""Task-level retries come after the store's own (seconds-scale) retries gave up: a longer outage."""


def open_store(campaign_url: str, storage_options: dict[str, Any] | None, settings: Settings) -> Store:
    """The campaign's ``Store`` with the entry point's timeouts and deadlines (the flows read ``settings`` and
    point Orbax at a ``gs://`` endpoint before any task runs: ``flows.entry``); a fork over its parents' history
    (``records.with_parents``)."""
    return with_parents(settings.store(campaign_url, storage_options))


def open_campaign(campaign_url: str, storage_options: dict[str, Any] | None, settings: Settings
                  ) -> tuple[Store, CampaignConfig]:
    """The store and the config the campaign was started with (``campaign.json``)."""
    store = open_store(campaign_url, storage_options, settings)
    return store, load_campaign_config(store)


def worth_retrying(exc: BaseException) -> bool:
    """A storage outage the store gave up on, or a dropped connection; never a missing/duplicate object."""
    if isinstance(exc, (AlreadyExistsError, NotFoundError)):
        return False
    if isinstance(exc, StorageError):
        return exc.__cause__ is not None and is_transient(exc.__cause__)
    return isinstance(exc, ConnectionError)


def retry_transient(task: Task, run: TaskRun, state: State) -> bool:
    """Prefect ``retry_condition_fn``: spend retries only on failures that may pass."""
    exc = state.result(raise_on_failure=False)
    return isinstance(exc, BaseException) and worth_retrying(exc)


def stage_key(stage: str, *, worker_index: int | None = None, version: int | None = None) -> str:
    """Name of one stage run within a flow run: ``collect-w1``, ``evaluate-v00000004``, ``train``."""
    if worker_index is not None:
        return f"{stage}-w{worker_index}"
    if version is not None:
        return f"{stage}-v{version:08d}"
    return stage


def stage_run(store: Store, key: str, call: Callable[[], dict[str, Any]],
              clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Run ``call`` (one library function) and record the run in the campaign folder; returns its manifest."""
    run_id = flow_run.id
    started_at = utc_now_iso()
    start = clock()

    def record(**outcome: Any) -> RunRecord:
        return RunRecord(key=key, flow_run_id=run_id, flow_run_name=flow_run.name, deployment_id=deployment.id,
                         task_run_id=task_run.id, host=socket.gethostname(), pid=os.getpid(), started_at=started_at,
                         finished_at=utc_now_iso(), seconds=round(clock() - start, 3), **outcome)

    try:
        manifest = call()
    except Exception as e:
        if run_id is not None:
            _create_once(store, record(state="failed", attempt=f"{flow_run.run_count}.{task_run.run_count}",
                                       error=f"{type(e).__name__}: {e}"))
        raise
    if run_id is not None:
        _create_once(store, record(state="completed", manifest=manifest))
    return manifest


def _create_once(store: Store, record: RunRecord) -> None:
    # A retried flow run keeps its id: its first record of this stage stands (the stages are idempotent,
    # so a second manifest would say the same).
    with contextlib.suppress(AlreadyExistsError):
        record.write(store)
