"""Self-healing campaigns: a crashed campaign is recovered without anyone typing, within a retry budget.

```
worker killed ─> its flow runs stop sending heartbeats (Prefect's flow engine, every
                 PREFECT_FLOWS_HEARTBEAT_FREQUENCY s)
             ─> automation "rollstream: crash zombie runs" (ZOMBIES, registered by `rollstream deploy`):
                 no heartbeat nor end state of a `rollstream`-tagged run for 3 beats -> the run is set Crashed
             ─> prefect.flow-run.Crashed of a rollstream-campaign / rollstream-recover run
             ─> the `heal` deployment's trigger (infra/prefect.yaml) runs `heal(flow_run_id=<crashed run>)`
heal         ─> heal/<n>.json claimed in the campaign folder (create-only numbering)
                 n <= max_attempts: the recover deployment is started for that campaign
                 else: ERROR log + event rollstream.campaign.heal-budget-spent; `rollstream status` shows it
             ─> automation "rollstream: heal budget spent" (NOTIFY, registered by `rollstream deploy --notify BLOCK`):
                 the operator's notification block (Slack, e-mail, webhook...) gets the campaign and the commands
```
Deployment runs carry the ``rollstream`` tag (``infra/prefect.yaml``), so heartbeats watch them; a run started
from the command line is not watched, and ``flows.runs.abandon_runs`` still takes it over by hand.
"""

from __future__ import annotations

import datetime as dt
from typing import Any
from uuid import UUID

from prefect import flow, get_client, get_run_logger
from prefect.client.schemas.objects import StateType
from prefect.deployments import run_deployment
from prefect.events import emit_event
from prefect.events.actions import ChangeFlowRunState, SendNotification
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification
from prefect.runtime import flow_run
from prefect.settings import get_current_settings

from flows import entry
from flows.artifacts import campaign_slug
from flows.campaign import expand_campaign_url
from flows.recover import recover_run_name
from flows.runs import WATCH_TAG
from pipelines_lib.hints import hint_command
from pipelines_lib.stages.campaign import claim_heal_attempt

ZOMBIES = "rollstream: crash zombie runs"
MISSED_BEATS = 3
"""Heartbeats a run may miss before it counts as gone."""
RECOVER_DEPLOYMENT = "rollstream-recover/recover"
BUDGET_SPENT_EVENT = "rollstream.campaign.heal-budget-spent"
NOTIFY = "rollstream: heal budget spent"
DEFAULT_MAX_ATTEMPTS = 3
RUN_RESOURCE = "prefect.flow-run."


class HealBudgetSpent(RuntimeError):
    """The campaign crashed again after ``max_attempts`` automatic recoveries: a person has to look."""


def zombie_automation(heartbeat_s: int | None = None) -> AutomationCore:
    """Prefect's own zombie detection, limited to rollstream's runs: a run that sent a heartbeat, then neither
    another one nor an end state for ``MISSED_BEATS`` beats, is set Crashed (which emits the Crashed event)."""
    beat = heartbeat_s or get_current_settings().flows.heartbeat_frequency
    if not beat:
        raise ValueError(
            "flow run heartbeats are off (PREFECT_FLOWS_HEARTBEAT_FREQUENCY unset): nothing would "
            "notice a killed worker; set it (>= 30 s) for `rollstream deploy` and the workers alike"
        )
    return AutomationCore(
        name=ZOMBIES,
        description=f"A rollstream flow run silent for {MISSED_BEATS} heartbeats ({beat} s each) is Crashed.",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={
                "prefect.flow-run.heartbeat",
                "prefect.flow-run.Completed",
                "prefect.flow-run.Failed",
                "prefect.flow-run.Cancelled",
                "prefect.flow-run.Crashed",
            },
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            match_related=ResourceSpecification(
                {"prefect.resource.role": "tag", "prefect.resource.id": f"prefect.tag.{WATCH_TAG}"}
            ),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=dt.timedelta(seconds=MISSED_BEATS * beat),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=f"no heartbeat for {MISSED_BEATS} beats of {beat} s: its process is gone",
            )
        ],
    )


def register_zombie_automation(heartbeat_s: int | None = None) -> AutomationCore:
    """Create ``ZOMBIES``, replacing an older one of that name (a redeploy may change the heartbeat)."""
    automation = zombie_automation(heartbeat_s)
    with get_client(sync_client=True) as client:
        for old in client.read_automations_by_name(ZOMBIES):
            client.delete_automation(old.id)
        client.create_automation(automation)
    return automation


def notification_block(name: str) -> UUID:
    """The id of the notification block document ``name``: ``BLOCK_TYPE/NAME`` (as ``prefect block ls`` shows it,
    e.g. ``slack-webhook/ops``) or a bare ``NAME`` that one notification block holds."""
    with get_client(sync_client=True) as client:
        documents = [d for d in client.read_block_documents(include_secrets=False) if not d.is_anonymous]
    named = [d for d in documents if name in (d.name, f"{d.block_type.slug if d.block_type else ''}/{d.name}")]
    notifying = [d for d in named if d.block_schema and "notify" in d.block_schema.capabilities]
    if len(notifying) == 1:
        return notifying[0].id
    slugs = sorted(f"{d.block_type.slug if d.block_type else '?'}/{d.name}" for d in notifying or named)
    if len(notifying) > 1:
        raise ValueError(f"notification block {name!r} is ambiguous: {', '.join(slugs)}; name one of them")
    if named:
        raise ValueError(f"block {name!r} ({', '.join(slugs)}) cannot send notifications; name a notification "
                         "block (slack-webhook, custom-webhook, email, ...)")
    raise ValueError(f"no notification block {name!r} on this Prefect API; create one first, e.g. "
                     "`prefect block create slack-webhook` (`prefect block ls` lists them)")


def budget_spent_automation(block_id: UUID) -> AutomationCore:
    """Tell a person, through notification block ``block_id``, each time a campaign's heal budget is spent: nothing
    recovers that campaign until someone does (the heal flow run only fails, and its ERROR is one log line)."""
    return AutomationCore(
        name=NOTIFY,
        description="A campaign that crashed after its last automatic recovery is reported to a person.",
        trigger=EventTrigger(
            expect={BUDGET_SPENT_EVENT},
            match=ResourceSpecification({"prefect.resource.id": "rollstream.campaign.*"}),
            posture=Posture.Reactive,
            threshold=1,
        ),
        actions=[
            SendNotification(
                block_document_id=block_id,
                subject="rollstream: {{ event.resource.name }} crashed again; automatic recovery stopped",
                body=(
                    "Campaign {{ event.payload.campaign_url }} crashed (flow run "
                    "{{ event.payload.crashed_flow_run_name }}, {{ event.payload.crashed_flow_run_id }}) after "
                    "{{ event.payload.attempts }} automatic recoveries, at {{ event.occurred }}. "
                    "Nothing recovers it until a person does.\n"
                    "What happened: {{ event.payload.status_command }}\n"
                    "Once the cause is fixed: {{ event.payload.recover_command }}"
                ),
            )
        ],
    )


def register_budget_notification(block_name: str | None) -> AutomationCore | None:
    """Create ``NOTIFY`` for notification block ``block_name``, replacing an older one of that name; with no block,
    remove it, so that a deploy that names none notifies nobody, as it says."""
    automation = budget_spent_automation(notification_block(block_name)) if block_name else None
    with get_client(sync_client=True) as client:
        for old in client.read_automations_by_name(NOTIFY):
            client.delete_automation(old.id)
        if automation:
            client.create_automation(automation)
    return automation


def run_name() -> str:
    return f"heal-{str(flow_run.parameters['flow_run_id']).removeprefix(RUN_RESOURCE)[:8]}"


@flow(name="rollstream-heal", flow_run_name=run_name)
def heal(flow_run_id: str, max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> dict[str, Any]:
    """Answer the crash of campaign or recover flow run ``flow_run_id``: start the recover deployment for its
    campaign, unless ``max_attempts`` recoveries of it were started already (then raise ``HealBudgetSpent``).
    ``flow_run_id`` may be the run's event resource id (``prefect.flow-run.<id>``), as the trigger passes it."""
    log = get_run_logger()
    with get_client(sync_client=True) as client:
        crashed = client.read_flow_run(UUID(flow_run_id.removeprefix(RUN_RESOURCE)))
    params = crashed.parameters
    # A campaign run's URL may hold {date}: the folder is the one of the crashed run's scheduled time.
    url = expand_campaign_url(params["campaign_url"], crashed.expected_start_time or dt.datetime.now(dt.UTC))
    options = params.get("storage_options")
    claim = claim_heal_attempt(
        entry(url, options).store(url, options),
        max_attempts=max_attempts,
        crashed_flow_run_id=str(crashed.id),
        crashed_flow_run_name=crashed.name,
        healer_flow_run_id=str(flow_run.id),
    )
    if claim.outcome != "recover":
        status, recover = hint_command(["status", url], options), hint_command(["recover", url], options)
        message = (
            f"{url}: flow run {crashed.name} ({crashed.id}) crashed after {max_attempts} automatic "
            f"recoveries; not recovering it again (`{status}` shows the attempts; `{recover}` once the cause "
            f"is fixed)"
        )
        log.error(message)
        emit_event(
            event=BUDGET_SPENT_EVENT,
            resource={
                "prefect.resource.id": f"rollstream.campaign.{campaign_slug(url)}",
                "prefect.resource.name": url,
            },
            related=[
                {
                    "prefect.resource.id": f"prefect.flow-run.{crashed.id}",
                    "prefect.resource.role": "crashed-flow-run",
                    "prefect.resource.name": crashed.name,
                }
            ],
            # what a notification tells a person (budget_spent_automation's templates)
            payload={
                "attempts": max_attempts,
                "campaign_url": url,
                "crashed_flow_run_id": str(crashed.id),
                "crashed_flow_run_name": crashed.name,
                "status_command": status,
                "recover_command": recover,
            },
        )
        raise HealBudgetSpent(message)
    recovery = run_deployment(
        RECOVER_DEPLOYMENT,
        timeout=0,
        flow_run_name=recover_run_name(url),  # the name the run keeps once a worker starts it
        parameters={
            "campaign_url": url,
            "storage_options": options,
            "use_deployments": params.get("use_deployments", False),
        },
    )
    log.warning(
        "%s: flow run %s crashed; recovery %d of %d started: flow run %s (%s)",
        url,
        crashed.name,
        claim.attempt,
        max_attempts,
        recovery.name,
        recovery.id,
    )
    return {"campaign_url": url, "attempt": claim.attempt, "recover_flow_run_id": str(recovery.id)}
