"""The ``rollstream`` subcommands that talk to Prefect: ``run``, ``recover``, ``stage`` (they start flows) and
``deploy``.

Registered with the command line through the ``rollstream.commands`` entry-point group (``pyproject.toml``; the
library never imports ``flows``). Each is a ``cli.Command`` (``HELP``, ``add_arguments(parser)``,
``run(args)``), as those of ``pipelines_lib.inspect_commands`` are. ``python -m flows.campaign``,
``python -m flows.recover`` and ``python -m flows.stages`` are the same commands.

A config, URL or argument the command can check before Prefect starts fails there, as one line (exit 2); a
flow run that ends other than Completed is one line naming the run and its state (exit 1). SIGTERM or SIGINT stops
``run``, ``recover`` and ``stage`` politely: the stages end at their next safe point, the campaign's status and the
command that continues it are printed, and the exit code is 128+signal (``pipelines_lib.stages.stopping``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from pipelines_lib.cli import Command, CommandError, add_storage_options, did_you_mean, open_store, say
from pipelines_lib.configio import ConfigError, parse_overrides
from pipelines_lib.hints import hint_command

# Module level stays light (no JAX, no Prefect): every `rollstream` invocation loads this module to build its
# parser, so names such as the presets and stages are checked when a command runs, against their registries.


def _options(args: argparse.Namespace) -> dict[str, Any] | None:
    return dict(args.storage_option) or None


def add_verbose(p: argparse.ArgumentParser) -> None:
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also log each stage's detail lines (one per committed shard); default: progress lines only")


def flow_logging(verbose: bool) -> None:
    """Prefect's log handlers, set up before a command that starts a flow imports the library, and the stage tasks'
    DEBUG lines (per-shard commits) when ``verbose``.

    Order matters: absl (imported with Orbax) calls ``logging.basicConfig()`` on its first log line when the root
    logger has no handler yet, and Prefect then keeps that plain handler, whose lines lose the run names
    (``INFO:prefect.task_runs:Finished in state Completed()``)."""
    from prefect.logging.configuration import setup_logging

    setup_logging()
    if verbose:
        logging.getLogger("prefect.task_runs").setLevel(logging.DEBUG)


def _ended(state: Any, what: str) -> int | None:
    """None when the flow run completed; otherwise the one line saying how it ended, and exit code 1."""
    if state.is_completed():
        return None
    print(f"rollstream: {what} ended {state.name}: {state.message or ''}".rstrip(": "), file=sys.stderr)
    return 1


@contextlib.contextmanager
def _stoppable(args: argparse.Namespace, again: list[str] | None = None) -> Iterator[Any]:
    """The flow run under a polite stop (``stages.stopping.stoppable_command``): on SIGTERM/SIGINT its stages end at
    their safe points, the campaign's status and the command that continues (``again``, default ``recover``) are
    printed, and the command returns 128+signal."""
    from pipelines_lib.stages.stopping import stoppable_command

    store = args.settings.store(args.url, _options(args))
    with stoppable_command(store, hint_command(again or ["recover", store.url], _options(args))) as stop:
        _temporary_api_outlives_ctrl_c()
        yield stop


def _temporary_api_outlives_ctrl_c() -> None:
    """Without a configured Prefect API, start Prefect's temporary server now, with SIGINT blocked in it: a Ctrl-C
    reaches the terminal's whole process group, and the server would be gone while the run still records its stop
    there. Prefect reuses the started server (one a process) and ends it at exit with SIGTERM, as before."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return
    unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # inherited by the server's process
    try:
        SubprocessASGIServer().start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)


# -- run --------------------------------------------------------------------------------------------------

def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="campaign folder to create or continue: a path, file://... or gs://bucket/prefix/name")
    p.add_argument("--preset", default="tiny",
                   help="config the YAML and --set apply to: a recipe of the repository's recipes/ folder, by name: "
                        "tiny (the embedded defaults, 4-9 minutes on 2 cores, the ending varies by seed), smoke (a "
                        "plumbing check of every stage that cannot learn: about 3 minutes on 2 cores with a cold JAX "
                        "compilation cache, less when warm), wide (make demo's: the task on a wider model, steady over "
                        "seeds, 9-11 minutes on 2 cores), twostep (a two-call task), tpu_demo (a 25M-parameter model "
                        "colocated on one accelerator chip) or tpu_real (tpu_demo at Qwen3-0.6B's shape under the "
                        "memory plan); each file's header says what it is for")
    p.add_argument("--config", metavar="FILE", help="YAML config file over the preset")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="dotted override over the YAML, repeatable (e.g. trainer.max_steps=4, eval.versions=ends)")
    p.add_argument("--workers", type=int, help="rollout workers (overrides the config's workers)")
    p.add_argument("--use-deployments", action="store_true",
                   help="start each stage as a deployment run on its work pool (see `rollstream deploy`)")
    p.add_argument("--runner", choices=["threads", "processes"], default="threads",
                   help="in-process stages as threads (default) or in a process pool")
    add_verbose(p)
    add_storage_options(p)


def _run(args: argparse.Namespace) -> int:
    flow_logging(args.verbose)
    try:
        overrides = parse_overrides(args.set)
    except ConfigError as e:
        raise CommandError(str(e)) from e
    nulls = [key for key, value in overrides.items() if value is None]
    if nulls:  # the flow's typed overrides read null as "not overridden"
        raise CommandError(f"--set {nulls[0]}=null: the flow reads a null override as \"keep the preset's or YAML's value\"; "
                           "write the value into the --config file instead")
    from flows.params import CampaignOverrides
    from pipelines_lib.config import CampaignConfig

    try:  # the config is checked here, before Prefect starts, so a typo is one line
        config = CampaignConfig.build(preset=args.preset, config_path=args.config, overrides=overrides,
                                      workers=args.workers)
        typed = CampaignOverrides.from_dotted(overrides) if overrides else None
    except (ConfigError, ValueError, OSError) as e:
        raise CommandError(str(e)) from e
    from prefect.task_runners import ProcessPoolTaskRunner

    from flows import entry
    from flows.campaign import campaign, summary

    # A process pool smaller than workers + trainer would queue a stage behind ones that wait for it.
    run = campaign if args.runner == "threads" else campaign.with_options(
        task_runner=ProcessPoolTaskRunner(max_workers=config.workers + 1))
    t0 = time.monotonic()
    with _stoppable(args) as stop:
        state = run(campaign_url=args.url, preset=args.preset, config_path=args.config, overrides=typed,
                    workers=args.workers, storage_options=_options(args), use_deployments=args.use_deployments,
                    return_state=True)
    if stop.signum is not None:
        return stop.exit_code
    if (code := _ended(state, f"campaign run {args.url}")) is not None:
        return code
    result = state.result()
    audit = result.get("audit", {})
    print(summary(entry(args.url, _options(args)).store(args.url, _options(args)), time.monotonic() - t0, audit,
                  result.get("view"), _options(args)))
    return 0 if audit.get("ok") else 1


RUN = Command(HELP="run (or continue) a campaign: prep, warm start, rollouts || trainer, evaluation, audit",
              add_arguments=_run_args, run=_run)


# -- recover ----------------------------------------------------------------------------------------------

def _recover_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="campaign folder whose run died")
    p.add_argument("--use-deployments", action="store_true", help="start each stage as a deployment run")
    add_verbose(p)
    add_storage_options(p)


def _recover(args: argparse.Namespace) -> int:
    flow_logging(args.verbose)
    from pipelines_lib.stages.audit import audit_report, recovery_refusal
    from pipelines_lib.stages.campaign import campaign_status

    store = open_store(args, args.url)
    status = campaign_status(store)
    if refusal := recovery_refusal(store, status):
        raise CommandError(f"{args.url}: {refusal}")
    if not status["todo"]:
        report = audit_report(store)
        say(f"{args.url}: finished, nothing to recover; audit {'OK' if report.ok else 'FAILED'} "
            f"({sum(report.violation_counts.values())} violations, {len(report.bad_files)} bad files)")
        return 0 if report.ok else 1

    from flows.recover import recover

    with _stoppable(args) as stop:
        state = recover(args.url, storage_options=_options(args), use_deployments=args.use_deployments,
                        return_state=True)
    if stop.signum is not None:
        return stop.exit_code
    if (code := _ended(state, f"recover run {args.url}")) is not None:
        return code
    result = state.result()
    ok = result.get("audit", {}).get("ok")
    took_over = "".join(f"; took over {r['name']} ({r['id']}), now Crashed" for r in result["abandoned"])
    say(f"recovered {args.url}: ran {result['plan']}; audit {'OK' if ok else 'FAILED'}{took_over}")
    return 0 if ok else 1


RECOVER = Command(HELP="finish a campaign whose run died: run only the stages its folder lacks",
                  add_arguments=_recover_args, run=_recover)


# -- stage ------------------------------------------------------------------------------------------------

STAGE_FLAGS = {"worker_index": "collect", "num_workers": "collect", "target_groups": "collect",
               "max_steps": "train", "version": "evaluate"}
"""Per-stage arguments of ``rollstream stage`` and the stage each applies to."""


def _stage_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="the stage: prep, warm_start, collect, train, evaluate or audit")
    p.add_argument("url", help="campaign folder (started by `rollstream run`: the stage reads campaign.json)")
    p.add_argument("--worker-index", type=int, help="collect: this worker's index")
    p.add_argument("--num-workers", type=int, help="collect: how many workers share the prompts")
    p.add_argument("--target-groups", type=int, help="collect: stop after this many groups")
    p.add_argument("--max-steps", type=int, help="train: stop at this step")
    p.add_argument("--version", type=int, help="evaluate: the published version (default: LATEST)")
    add_verbose(p)
    add_storage_options(p)


def _stage(args: argparse.Namespace) -> int:
    flow_logging(args.verbose)
    from pipelines_lib.stages.table import STAGE_NAMES

    if args.name not in STAGE_NAMES:
        raise CommandError(f"unknown stage {args.name!r}{did_you_mean(args.name, STAGE_NAMES)}; "
                           f"valid: {', '.join(STAGE_NAMES)}")
    params: dict[str, Any] = {}
    for flag, owner in STAGE_FLAGS.items():
        if (value := getattr(args, flag)) is not None:
            if owner != args.name:
                raise CommandError(f"--{flag.replace('_', '-')} applies to the {owner} stage, not {args.name}")
            params[flag] = value

    from flows.stages import STAGE_FLOWS

    again = ["stage", args.name, args.url, *[a for k, v in params.items() for a in (f"--{k.replace('_', '-')}", str(v))]]
    with _stoppable(args, again) as stop:
        state = STAGE_FLOWS[args.name](campaign_url=args.url, storage_options=_options(args), **params,
                                       return_state=True)
    if stop.signum is not None:
        return stop.exit_code
    if (code := _ended(state, f"{args.name} run {args.url}")) is not None:
        return code
    result = state.result()
    print(json.dumps(result, indent=2, default=str))
    return 0 if result.get("ok", True) else 1  # the audit stage's verdict


STAGE = Command(HELP="run one stage of a campaign (the flow its deployment runs)", add_arguments=_stage_args,
                run=_stage)


# -- deploy -----------------------------------------------------------------------------------------------

POOL_TEMPLATES = {"process": {"rollstream-cpu": "process-job-template.json",
                              "rollstream-accel": "process-job-template.json"},
                  "kubernetes": {"rollstream-cpu": "kubernetes-cpu-job-template.json",
                                 "rollstream-accel": "kubernetes-accel-job-template.json"}}
"""Work-pool type -> pool -> its base job template (next to the prefect file)."""
NOTIFY_VARIABLE = "ROLLSTREAM_NOTIFY_BLOCK"
_VARIABLE = re.compile(r"\{\{\s*\$(\w+)\s*\}\}")


def _deploy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prefect-file", type=Path, default=Path("infra/prefect.yaml"),
                   help="the deployments file (default infra/prefect.yaml; run from the repository root)")
    p.add_argument("--name", action="append", default=None, metavar="DEPLOYMENT",
                   help="deploy only this deployment (repeatable; default: all), e.g. nightly-local")
    p.add_argument("--pool-type", choices=sorted(POOL_TEMPLATES), default="process",
                   help="type of the work pools created when missing (process: one machine; kubernetes: a cluster)")
    p.add_argument("--arm", action="append", default=[], metavar="DEPLOYMENT",
                   help="activate this deployment's schedules (repeatable, e.g. nightly); the file deploys every "
                        "schedule paused, so a deploy without --arm pauses them")
    p.add_argument("--notify", default=os.environ.get(NOTIFY_VARIABLE) or None, metavar="BLOCK",
                   help="notification block told when a campaign's automatic recoveries are spent: BLOCK_TYPE/NAME "
                        f"or NAME, e.g. slack-webhook/ops (default: ${NOTIFY_VARIABLE}; neither: nobody is told)")


def unresolved_variables(spec: dict[str, Any], names: list[str]) -> dict[str, list[str]]:
    """``{{ $VAR }}`` references of the named deployments (and the pull steps) whose variable is unset, with
    the deployments that use each."""
    users: dict[str, list[str]] = {}
    for deployment in [d for d in spec["deployments"] if d["name"] in names]:
        for var in _VARIABLE.findall(json.dumps(deployment)):
            users.setdefault(var, []).append(deployment["name"])
    for var in _VARIABLE.findall(json.dumps(spec.get("pull") or [])):
        users.setdefault(var, []).append("pull steps")
    return {var: sorted(set(who)) for var, who in sorted(users.items()) if not os.environ.get(var)}


def _deploy(args: argparse.Namespace) -> int:
    try:
        spec = yaml.safe_load(args.prefect_file.read_text())
    except OSError as e:
        raise CommandError(f"{args.prefect_file}: cannot read the deployments file: {e.strerror}") from e
    declared = [d["name"] for d in spec["deployments"]]
    names = args.name or declared
    for name in names:
        if name not in declared:
            raise CommandError(f"{args.prefect_file}: no deployment {name!r}{did_you_mean(name, declared)}; "
                               f"declared: {', '.join(declared)}")
    scheduled = [d["name"] for d in spec["deployments"] if d.get("schedules")]
    for name in args.arm:
        if name not in names or name not in scheduled:
            raise CommandError(f"--arm {name}: not a deployment with schedules among those deployed "
                               f"({', '.join(n for n in names if n in scheduled) or 'none'})")
    if missing := unresolved_variables(spec, names):
        raise CommandError("unresolved variables, set them first: " + "; ".join(
            f"{var} (used by {', '.join(who)})" for var, who in missing.items()))
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    from flows.heal import notification_block, register_budget_notification, register_zombie_automation

    if args.notify:  # a misspelt block fails before anything is deployed, not after
        try:
            notification_block(args.notify)
        except ValueError as e:
            raise CommandError(f"--notify {args.notify}: {e}") from e
    pools = sorted({d["work_pool"]["name"] for d in spec["deployments"] if d["name"] in names})
    with get_client(sync_client=True) as client:
        for pool in pools:
            try:
                client.read_work_pool(pool)
            except ObjectNotFound:
                template = args.prefect_file.parent / POOL_TEMPLATES[args.pool_type][pool]
                client.create_work_pool(WorkPoolCreate(name=pool, type=args.pool_type,
                                                       base_job_template=json.loads(template.read_text())))
                print(f"created work pool {pool} ({args.pool_type}, {template})", file=sys.stderr)
    prefect = Path(sys.executable).with_name("prefect")
    selection = ["--all"] if args.name is None else [a for n in names for a in ("--name", n)]
    if subprocess.run([str(prefect), "--no-prompt", "deploy", "--prefect-file", str(args.prefect_file),
                       *selection], timeout=600).returncode != 0:
        return 1
    zombies = register_zombie_automation()
    print(f"automation {zombies.name!r}: {zombies.description}")
    if notify := register_budget_notification(args.notify):
        print(f"automation {notify.name!r}: {notify.description} (notification block {args.notify})")
    else:
        print(f"no notification block: a campaign whose automatic recoveries are spent notifies nobody (only "
              f"`rollstream status` shows it); name one with --notify BLOCK or ${NOTIFY_VARIABLE}")
    print(arm_schedules([n for n in names if n in scheduled], args.arm))
    return 0


def arm_schedules(scheduled: list[str], arm: list[str]) -> str:
    """Activate the schedules of the deployments in ``arm``; returns one line per schedule of ``scheduled``
    (deployment names), saying whether it is armed and what it runs."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterName,
        FlowFilter,
        FlowFilterName,
    )

    if not scheduled:
        return "no deployment with a schedule was deployed"
    lines = []
    with get_client(sync_client=True) as client:
        deployments = client.read_deployments(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=scheduled)),
            flow_filter=FlowFilter(name=FlowFilterName(like_="rollstream-")))
        flows = {d.flow_id: client.read_flow(d.flow_id).name for d in deployments}
        for deployment in sorted(deployments, key=lambda d: d.name):
            for schedule in client.read_deployment_schedules(deployment.id):
                if deployment.name in arm and not schedule.active:
                    client.update_deployment_schedule(deployment.id, schedule.id, active=True)
                armed = deployment.name in arm or schedule.active
                when = getattr(schedule.schedule, "cron", None) or str(schedule.schedule)
                tz = getattr(schedule.schedule, "timezone", None) or "UTC"
                lines.append(f"{'ARMED ' if armed else 'paused'} {flows[deployment.flow_id]}/{deployment.name}: "
                             f"{when} {tz} -> {deployment.parameters.get('campaign_url')}"
                             + ("" if armed else f"  (arm: rollstream deploy --arm {deployment.name})"))
    return "\n".join(lines)


DEPLOY = Command(HELP="create the work pools if missing, deploy infra/prefect.yaml (refuses unset variables), "
                      "arm the schedules named by --arm and say which are armed",
                 add_arguments=_deploy_args, run=_deploy)
