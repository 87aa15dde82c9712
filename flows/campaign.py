"""The campaign flow: one experiment from an empty folder to an audited, evaluated policy.

```
 init (campaign.json) -> prep -> warm start (publishes v0)
      -> rollout workers 0..N-1  ||  streaming trainer       (concurrent; workers stop on train/DONE.json)
         TrainProgress polls the folder: terminal line + progress artifact per trainer step
      -> evaluate published versions (all, or v0 and the last) -> eval table artifact per version
      -> learning curve artifact -> audit (+ markdown artifact) -> view/<utc>/report.html + learning_curve.png
      -> the campaign's gpu:<slot>:<campaign> concurrency limits deleted (flows.runs.release_campaign_limits)
```

``run_stages`` is the part after init, for any subset of stages in that order: the campaign flow runs
them all (each is a no-op where its marker exists), ``flows.recover`` runs those ``campaign_status`` lists.
Stages start in-process (threads of this flow run: one process, one shared XLA runtime) or, with
``use_deployments``, as deployment runs on work pools (``flows.launch``). A campaign with ``placement:
colocated`` runs everything up to the audit as one task in this process (``tasks.colocated``: the trainer hands
its weights to the engines in device memory), then the same evaluation tables, curve and audit.

Command line: ``rollstream run URL [--preset RECIPE] [--config FILE] [--set key=value ...]``
(``flows.commands``; ``python -m flows.campaign`` is the same command).
"""

from __future__ import annotations

import datetime as dt
import shlex
import sys
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.client.schemas.objects import State
from prefect.futures import PrefectFuture
from prefect.runtime import flow_run
from prefect.states import Crashed
from prefect.task_runners import ThreadPoolTaskRunner

from flows import artifacts, entry
from flows.launch import Launcher, StageRunCrashed
from flows.monitor import TrainProgress
from flows.params import CampaignOverrides, Recipe
from flows.runs import campaign_name, label_run, release_campaign_limits, stopped
from pipelines_lib import records
from pipelines_lib.config import CampaignConfig
from pipelines_lib.hints import hint_command, secrets_note
from pipelines_lib.records import EvalResult, versions_to_evaluate
from pipelines_lib.stages.collect import request_stop
from pipelines_lib.stages.stopping import Stopped, check_stop, stop_on_signals
from pipelines_lib.stages.table import STAGE_NAMES
from pipelines_lib.stages.view import write_campaign_view
from pipelines_lib.storage.errors import StorageError
from pipelines_lib.storage.store import Store, normalize_url
from tasks.colocated import colocated_campaign
from tasks.init import init_campaign

STAGE_ORDER = STAGE_NAMES
"""The stage table's order (``pipelines_lib.stages.table``)."""


def expand_campaign_url(url: str, when: dt.datetime) -> str:
    """``{date}`` / ``{datetime}`` in a URL become the run's scheduled UTC time (``20261202`` / ``20261202T0200``).

    A scheduled deployment gets a fresh folder per run, and a retry of the same run (same scheduled time)
    lands in the same folder and continues it.
    """
    when = when.astimezone(dt.UTC)
    return url.replace("{date}", when.strftime("%Y%m%d")).replace("{datetime}", when.strftime("%Y%m%dT%H%M"))


def _wait_training(trainer: PrefectFuture, collectors: list[PrefectFuture], progress: TrainProgress,
                   poll_s: float, recover: str) -> dict[str, Any]:
    """The trainer's result, following its progress; on its failure, or the monitor's, the stages are stopped and
    waited for before the error surfaces, so that the run never ends while its stage threads still work.
    ``recover`` is the command that continues the campaign, for the warning when every rollout worker stopped."""
    log = get_run_logger()
    warned = False
    while True:
        trainer.wait(timeout=poll_s)
        try:
            progress.poll()
        except StorageError as e:
            _stop_stages(progress.store, f"progress monitor failed: {e}", [trainer, *collectors])
            if not trainer.state.is_completed():
                trainer.result()  # a stage's own error (often the same outage) is the one to report
            raise
        if trainer.state.is_final():
            if not trainer.state.is_completed():
                _stop_stages(progress.store, f"trainer run ended {trainer.state.name}", collectors)
            return trainer.result()
        if not warned and collectors and all(c.state.is_final() for c in collectors):
            log.warning("all rollout workers have stopped before the trainer finished; it will wait for data "
                        "up to trainer.data_timeout_s, then fail (recover with: %s)", recover)
            warned = True


def _stop_stages(store: Store, reason: str, running: list[PrefectFuture]) -> None:
    """Ask this run's rollout workers to stop (threads cannot be cancelled), then wait for ``running`` to end.

    The trainer has no stop marker: it ends on its own, failing on its own storage calls in an outage (each has
    a deadline). In an outage the marker's write may fail as well; the workers then fail the same way."""
    log = get_run_logger()
    try:
        request_stop(store, reason)
    except StorageError as e:
        log.warning("could not write the rollout stop marker (%s); rollout workers end on their own storage errors",
                    e)
    log.info("%s: waiting for %d stage run(s) to end", reason, sum(not f.state.is_final() for f in running))
    for future in running:
        future.wait()


def run_stages(launcher: Launcher, stages: list[str], *, poll_s: float = 5.0) -> dict[str, Any]:
    """Run ``stages`` (a subset of ``STAGE_ORDER``, kept in that order); returns their manifests. After a stop
    signal (``stages.stopping``) the running stages end at their safe points and no further stage starts:
    ``Stopped`` is raised."""
    unknown = set(stages) - set(STAGE_ORDER)
    if unknown:
        raise ValueError(f"unknown stages {sorted(unknown)}; valid: {STAGE_ORDER}")
    log = get_run_logger()
    url, config = launcher.campaign_url, launcher.config
    store = records.with_parents(launcher.settings.store(url, launcher.storage_options))
    out: dict[str, Any] = {}
    if config.placement == "colocated" and set(stages) & {"prep", "warm_start", "collect", "train", "evaluate"}:
        out["colocated"] = colocated_campaign.submit(url, launcher.storage_options, launcher.settings).result()
        for v, result in out["colocated"]["evaluate"].items():
            artifacts.publish_eval_table(url, int(v), result)
        stages = [s for s in stages if s == "audit"]
    for stage in ("prep", "warm_start"):
        if stage in stages:
            check_stop()
            out[stage] = launcher.submit(stage).result()
            log.info("%s done", stage)
    if "collect" in stages or "train" in stages:
        check_stop()
        collectors = [launcher.submit("collect", worker_index=i, num_workers=config.workers)
                      for i in range(config.workers)] if "collect" in stages else []
        if "train" in stages:
            progress = TrainProgress(store, max_steps=config.trainer.max_steps, log=log.info, warn=log.warning,
                                     key=f"progress-{artifacts.campaign_slug(url)}-train")
            recover = hint_command(["recover", store.url], launcher.storage_options)
            out["train"] = _wait_training(launcher.submit("train"), collectors, progress, poll_s, recover)
            log.info("train done: %s", {k: out["train"].get(k) for k in ("steps", "version", "groups_consumed")})
        out["collect"] = [c.result() for c in collectors]
    check_stop()  # a stopped trainer returned without its done marker: nothing after it may run
    if "evaluate" in stages:
        evaluated = set(records.evaluated_versions(store))
        todo = [v for v in versions_to_evaluate(records.published_versions(store), config.eval.versions) if v not in evaluated]
        futures = {v: launcher.submit("evaluate", version=v) for v in todo}
        out["evaluate"] = {v: f.result() for v, f in futures.items()}
        if not launcher.use_deployments:  # a deployment's stage flow publishes its own table
            for v, result in out["evaluate"].items():
                artifacts.publish_eval_table(url, v, result)
        log.info("evaluated versions %s", sorted(out["evaluate"]))
    artifacts.publish_learning_curve(url, store, config.trainer.max_steps)
    if "audit" in stages:
        check_stop()
        out["audit"] = launcher.submit("audit").result()
        if not launcher.use_deployments:
            artifacts.publish_audit(url, store, out["audit"])
        log.info("audit %s: %s", "OK" if out["audit"]["ok"] else "FAILED", out["audit"]["report"])
        # The finished campaign's report and learning-curve PNG, in its own folder (view/<utc>/).
        out["view"] = store.uri(write_campaign_view(store, cache=launcher.settings.cache))
        log.info("report and learning curve: %s", out["view"])
        # The campaign is finished: its per-campaign slots go (a recovery would create them again).
        out["released_limits"] = release_campaign_limits(url, config)
    artifacts.publish_telemetry(url, store)
    return out


def run_name() -> str:
    """``<campaign>-campaign``: a flow run named after the campaign folder it works on (a scheduled run's, with its
    ``{date}`` expanded as the run's body expands it)."""
    return f"{campaign_name(expand_campaign_url(flow_run.parameters['campaign_url'], run_time()))}-campaign"


def run_time() -> dt.datetime:
    """The time ``{date}``/``{datetime}`` in this run's URL stand for: its scheduled start (a retry keeps it)."""
    return flow_run.scheduled_start_time or dt.datetime.now(dt.UTC)


@flow(name="rollstream-campaign", flow_run_name=run_name, task_runner=ThreadPoolTaskRunner(max_workers=64))
def campaign(campaign_url: str, preset: Recipe = "tiny", config_path: str | None = None,
             overrides: CampaignOverrides | None = None, workers: int | None = None,
             storage_options: dict[str, Any] | None = None, use_deployments: bool = False,
             poll_s: float = 5.0) -> dict[str, Any] | State:
    """Run (or continue: every stage is idempotent) the campaign at ``campaign_url``.

    Args:
        campaign_url: the campaign folder (``file:///...``, a path, or ``gs://bucket/prefix/name``); it names
            the campaign. ``{date}``/``{datetime}`` expand to the scheduled run time (``expand_campaign_url``).
        preset: the config the YAML and overrides apply to: a recipe's name (``recipes/<name>.yaml``: ``tiny``,
            ``make demo``'s ``wide``, ...).
        config_path: YAML over the preset; None runs the preset.
        overrides: any subset of the config over the YAML, nested by section (``{"trainer": {"max_steps": 4}}``);
            typed from the config dataclasses (``flows.params``), so Prefect shows a form and refuses a bad
            type or choice, naming the field, before the run starts.
        workers: rollout workers (overrides ``config.workers``).
        storage_options: fsspec options of the campaign's filesystem (never credentials: use workload identity).
        use_deployments: start each stage as a deployment run (``infra/prefect.yaml``) instead of in-process.
        poll_s: seconds between progress polls of the campaign folder.
    """
    campaign_url = expand_campaign_url(campaign_url, run_time())
    normalize_url(campaign_url)  # a URL without its bucket (an unset variable at deploy time) fails here, first
    settings = entry(campaign_url, storage_options)
    with stop_on_signals(campaign=settings.store(campaign_url, storage_options)):
        label_run(campaign_url, "campaign", preset)
        config = CampaignConfig.build(preset=preset, config_path=config_path,
                                      overrides=overrides.dotted() if overrides else None, workers=workers)
        init = init_campaign(campaign_url, config.to_dict(), storage_options, settings)
        get_run_logger().info("campaign %s (%s)", campaign_url, "new" if init["created"] else "continuing")
        launcher = Launcher(campaign_url=campaign_url, config=config, storage_options=storage_options,
                            settings=settings, use_deployments=use_deployments)
        try:
            return {"init": init, **run_stages(launcher, list(STAGE_ORDER), poll_s=poll_s)}
        except (StageRunCrashed, Stopped) as e:
            return ended(e)


def ended(error: StageRunCrashed | Stopped) -> State:
    """The final state of an orchestrating flow whose stage run lost its process: Crashed, as the flow's own lost
    process would be, so that the heal trigger (``flows.heal``) recovers the campaign; a stage's Failed stays
    Failed (its code or its data, which a retry would meet again). Stopped by a signal (``stages.stopping``):
    Cancelled, which no automation answers; ``rollstream recover`` continues."""
    if isinstance(error, Stopped):
        return stopped(error)
    get_run_logger().error("%s; ending Crashed: the heal automation recovers the campaign", error)
    return Crashed(message=str(error))


def summary(store: Store, wall_s: float, audit: dict[str, Any], view: str | None = None,
            storage_options: dict[str, Any] | None = None) -> str:
    """What a person wants after a campaign: did it learn, where is everything, how to look at it (commands that
    run as printed from any directory, with the ``storage_options`` the campaign was opened with)."""
    evals = {v: EvalResult.read(store, v) for v in records.evaluated_versions(store)}
    lines = [f"campaign {store.url}: done in {wall_s:.0f}s; audit {'OK' if audit.get('ok') else 'FAILED'} "
             f"({audit.get('report')})"]
    if evals and not any(e.greedy_success_rate or e.pass_at_k for e in evals.values()):
        # "0.0% -> 0.0% (+0.0 points)" reads as a run that failed to learn; one that solved nothing had nothing to show.
        lines.append(f"held-out: no evaluated version ({', '.join(f'v{v}' for v in sorted(evals))}) solved a task, "
                     "so there is no learning to show; a plumbing check such as --preset smoke cannot learn")
    elif evals:
        first, last = min(evals), max(evals)
        before, after = evals[first].greedy_success_rate, evals[last].greedy_success_rate
        lines.append(f"held-out greedy success: v{first} {before:.1%} -> v{last} {after:.1%} "
                     f"({(after - before) * 100:+.1f} points); pass@k v{first} "
                     f"{evals[first].pass_at_k or 0.0:.1%} -> v{last} {evals[last].pass_at_k or 0.0:.1%}")
    lines += [
        f"campaign folder:  {store.url}",
        *([f"report + curve:   {view} (learning_curve.png next to it)"] if view else []),
        f"audit it:         {hint_command(['audit', store.url], storage_options)}",
        f"Perfetto trace:   {hint_command(['trace', store.url, '--out', 'trace.json'], storage_options)}"
        "  (open in https://ui.perfetto.dev)",
        f"Prefect UI:       {shlex.quote(str(Path(sys.executable).absolute().with_name('prefect')))} server start, "
        "then rerun with PREFECT_API_URL=http://127.0.0.1:4200/api to keep runs and artifacts",
        *filter(None, [secrets_note(storage_options)]),
    ]
    return "\n".join(lines)


if __name__ == "__main__":  # the same command line as `rollstream run`
    from pipelines_lib.cli import main

    sys.exit(main(["run", *sys.argv[1:]]))
