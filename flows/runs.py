"""What a flow run tells Prefect about itself: which campaign and stage it is, which slot it holds, which dead
run it takes over.

```
label_run(url, stage, preset)   this run's tags += campaign:<name>, stage:<stage>[, preset:<preset>]
                                (deployment runs too: the UI filters a campaign's runs by tag)
campaign_limit(key, url)        <key>:<name>, a global concurrency limit of 1 created if missing: a campaign and
                                its recovery never hold one slot twice, two campaigns never block each other
release_campaign_limits(url, c) deletes the campaign's <key>:<name> limits once it is finished (they would pile
                                up, three a night); a later recovery creates them again
stopped(error)                  the Cancelled end state of a run a signal stopped (pipelines_lib.stages.stopping)
abandon_runs(url)               Running campaign/recover runs of the same campaign -> Crashed, naming this run;
                                refused while one is a deployment run (tag WATCH_TAG): heartbeats watch those,
                                and Prefect's zombie automation (flows.heal) crashes them once they fall silent
```
``<name>`` is the campaign folder's last name: as the folder spells it in tags and run names (``campaign_name``, the
URL a scheduled run's ``{date}`` expanded to), as an artifact key allows it in limits (``artifacts.campaign_slug``).
Every call talks to the Prefect API through a client with its own request timeout.
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
from prefect.client.schemas.objects import FlowRun, State, StateType
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.runtime import flow_run
from prefect.states import Cancelled, Crashed

from flows.artifacts import campaign_slug
from pipelines_lib.config import CampaignConfig
from pipelines_lib.stages.stopping import Stopped
from pipelines_lib.stages.table import STAGES, resources_for

ORCHESTRATING_FLOWS = ("rollstream-campaign", "rollstream-recover")
"""Flows whose abandoned runs a recovery takes over (stage runs end on their own, or hold their slot)."""
WATCH_TAG = "rollstream"
"""The tag of every deployment of infra/prefect.yaml: its runs send heartbeats that the zombie automation watches."""


class StillRunning(RuntimeError):
    """A deployment run of the campaign is Running: Prefect, not a recovery, decides whether its process is gone."""


def campaign_name(campaign_url: str) -> str:
    """The campaign folder's last name as the folder spells it (``nightly-20261207T0151``): every run name and tag
    (artifact keys allow lowercase letters only: ``artifacts.campaign_slug``)."""
    return campaign_url.rstrip("/").rsplit("/", 1)[-1] or "campaign"


def campaign_tag(campaign_url: str) -> str:
    return f"campaign:{campaign_name(campaign_url)}"


def label_run(campaign_url: str, stage: str, preset: str | None = None) -> None:
    """Add the campaign, stage (and preset) tags to this flow run."""
    wanted = [campaign_tag(campaign_url), f"stage:{stage}"] + ([f"preset:{preset}"] if preset else [])
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run.id)
        client.update_flow_run(flow_run.id, tags=sorted({*run.tags, *wanted}))


def stopped(error: Stopped) -> State:
    """The final state of a flow run a signal stopped: Cancelled (a person or a scheduler asked), which no
    automation answers, unlike Crashed; its stages kept what they committed and ``rollstream recover`` continues."""
    get_run_logger().warning("%s; ending Cancelled: `rollstream recover` continues the campaign", error)
    return Cancelled(message=str(error))


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


def campaign_limit_names(campaign_url: str, config: CampaignConfig) -> list[str]:
    """Every ``<key>:<campaign>`` limit this campaign's stages may create (one per accelerator slot)."""
    keys = {resources_for(s.name, config, worker_index=i).concurrency_key
            for s in STAGES for i in range(config.workers if s.name == "collect" else 1)}
    return sorted(f"{key}:{campaign_slug(campaign_url)}" for key in keys if key)


def release_campaign_limits(campaign_url: str, config: CampaignConfig) -> list[str]:
    """Delete this finished campaign's concurrency limits; returns the names that existed. Called once every
    stage has ended, so no slot is held."""
    deleted = []
    with get_client(sync_client=True) as client:
        for name in campaign_limit_names(campaign_url, config):
            with contextlib.suppress(ObjectNotFound):
                client.delete_global_concurrency_limit_by_name(name)
                deleted.append(name)
    return deleted


def abandon_runs(campaign_url: str) -> list[dict[str, Any]]:
    """Mark Running campaign or recover runs of this campaign (other than this run) Crashed, with a message naming
    this run; returns what was marked. Called by a recovery, which the user starts because the run is gone.

    A deployment run (tag ``WATCH_TAG``) is never marked by hand: its heartbeats say whether its process lives,
    and the zombie automation crashes it when they stop (which starts the heal flow). Raises ``StillRunning``."""
    me = f"{flow_run.name} ({flow_run.id})"
    with get_client(sync_client=True) as client:
        running: list[FlowRun] = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=list(ORCHESTRATING_FLOWS))),
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[campaign_tag(campaign_url)]),
                                          state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING]))))
        abandoned = [r for r in running if str(r.id) != str(flow_run.id)]
        if watched := [r for r in abandoned if WATCH_TAG in r.tags]:
            raise StillRunning(
                "deployment run(s) of this campaign still Running: "
                + ", ".join(f"{r.name} ({r.id})" for r in watched)
                + "; Prefect sets a run Crashed once its heartbeats stop (automation 'rollstream: crash zombie runs', "
                "then the heal deployment recovers), or cancel it first: prefect flow-run cancel <id>")
        for run in abandoned:
            client.set_flow_run_state(run.id, Crashed(message=f"abandoned; recovered by flow run {me}"), force=True)
            get_run_logger().warning("flow run %s (%s) of this campaign was still Running: marked Crashed, "
                                     "recovered by this run", run.name, run.id)
    return [{"id": str(r.id), "name": r.name} for r in abandoned]
