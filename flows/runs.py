"""What a flow run tells Prefect about itself: which campaign and stage it is, which slot it holds, which dead
run it takes over.

```
label_run(url, stage, preset)   this run's tags += campaign:<name>, stage:<stage>[, preset:<preset>]
                                (deployment runs too: the UI filters a campaign's runs by tag)
campaign_limit(key, url)        <key>:<name>, a global concurrency limit of 1 created if missing: a campaign and
                                its recovery never hold one slot twice, two campaigns never block each other
abandon_runs(url)               Running campaign/recover runs of the same campaign -> Crashed, naming this run
```
``<name>`` is the campaign folder's last name (``artifacts.campaign_slug``). Every call talks to the Prefect API
through a client with its own request timeout.
"""

from __future__ import annotations

import contextlib
from typing import Any

from prefect import get_client, get_run_logger
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.client.schemas.filters import (
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.runtime import flow_run
from prefect.states import Crashed

from flows.artifacts import campaign_slug

ORCHESTRATING_FLOWS = ("rollstream-campaign", "rollstream-recover")
"""Flows whose abandoned runs a recovery takes over (stage runs end on their own, or hold their slot)."""


def campaign_tag(campaign_url: str) -> str:
    return f"campaign:{campaign_slug(campaign_url)}"


def label_run(campaign_url: str, stage: str, preset: str | None = None) -> None:
    """Add the campaign, stage (and preset) tags to this flow run."""
    wanted = [campaign_tag(campaign_url), f"stage:{stage}"] + ([f"preset:{preset}"] if preset else [])
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run.id)
        client.update_flow_run(flow_run.id, tags=sorted({*run.tags, *wanted}))


def campaign_limit(key: str, campaign_url: str) -> str:
    """The concurrency limit ``<key>:<campaign>`` (limit 1), created if missing; returns its name."""
    name = f"{key}:{campaign_slug(campaign_url)}"
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with contextlib.suppress(ObjectAlreadyExists):  # another stage of the campaign created it first
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
    return name


def abandon_runs(campaign_url: str) -> list[dict[str, Any]]:
    """Mark Running campaign or recover runs of this campaign (other than this run) Crashed, with a message naming
    this run; returns what was marked. Called by a recovery, which the user starts because the run is gone."""
    me = f"{flow_run.name} ({flow_run.id})"
    with get_client(sync_client=True) as client:
        running: list[FlowRun] = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=list(ORCHESTRATING_FLOWS))),
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[campaign_tag(campaign_url)]),
                                          state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING]))))
        abandoned = [r for r in running if str(r.id) != str(flow_run.id)]
        for run in abandoned:
            client.set_flow_run_state(run.id, Crashed(message=f"abandoned; recovered by flow run {me}"), force=True)
            get_run_logger().warning("flow run %s (%s) of this campaign was still Running: marked Crashed, "
                                     "recovered by this run", run.name, run.id)
    return [{"id": str(r.id), "name": r.name} for r in abandoned]
