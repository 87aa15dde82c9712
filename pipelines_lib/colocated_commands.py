"""The ``rollstream`` commands that run a whole campaign in this process, without Prefect: ``run-colocated`` and the
built-in ``recover``; and ``plan``, which says whether such a campaign fits its device before anything runs.

Both call ``stages.colocated.run_colocated`` (one process holds the device for rollouts, trainer and evaluation)
and print the same one-line JSON summary. ``run-colocated`` builds the config from a preset, a YAML file and
``--set``; ``recover`` takes the config the campaign was started with (its ``campaign.json``), so it needs nothing
but the URL::

    python -m pipelines_lib.cli run-colocated C --preset tpu_demo     # killed, or stopped
    python -m pipelines_lib.cli recover C                             # continues it, same config
    python -m pipelines_lib.cli plan --preset tpu_real --devices 4 --device-gib 15.75 --set trainer.mesh.fsdp=-1

This ``recover`` is the one a checkout on ``PYTHONPATH`` has (a TPU VM: no install, no Prefect). An installed
distribution that registers its own ``recover`` under ``cli.COMMAND_GROUP`` (``flows.commands``: the recover flow,
through Prefect, which also runs a separate-placement campaign's stages) replaces it, so ``status`` and every other
hint can print ``recover`` wherever they run. Both recovers refuse, before writing anything, what
``stages.audit.recovery_refusal`` names (no ``campaign.json``, a damaged record a restarted stage reads); a campaign
whose stages run as separate processes is refused here with the command that recovers it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import TYPE_CHECKING

from pipelines_lib.cli import (
    Command,
    CommandError,
    add_storage_options,
    open_campaign_store,
    open_store,
    to_stderr,
)
from pipelines_lib.hints import CHECKOUT, hint_command

if TYPE_CHECKING:
    from pipelines_lib.config import CampaignConfig
    from pipelines_lib.storage.store import Store

def _run_and_summarise(args: argparse.Namespace, store: Store, config: CampaignConfig) -> int:
    """Run (or continue) the campaign here under a polite stop (``stages.stopping``: SIGTERM/SIGINT stop every stage
    at its next safe point, the status and the ``recover`` command that continues are printed, the exit status is
    128+signal); print its summary; 0 when the audit passed, else 1."""
    from pipelines_lib.records import EvalResult, evaluated_versions, with_parents
    from pipelines_lib.stages.colocated import run_colocated
    from pipelines_lib.stages.stopping import stoppable_command

    resume = hint_command(["recover", store.url], dict(args.storage_option))
    with stoppable_command(store, resume, campaign=True) as stop:
        out = run_colocated(store, config, cache=args.settings.cache, log=to_stderr)
    if stop.signum is not None:
        return stop.exit_code
    store = with_parents(store)
    evals = {v: EvalResult.read(store, v).greedy_success_rate for v in evaluated_versions(store)}
    print(json.dumps({"campaign": store.url, "wall_s": out["wall_s"], "audit_ok": out["audit"]["ok"],
                      "handed_over": out["handed_over"], "greedy_success": evals}))
    return 0 if out["audit"]["ok"] else 1


# -- run-colocated ----------------------------------------------------------------------------------------

def _run_colocated_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="campaign folder to create or continue")
    _config_args(p)
    add_storage_options(p)


def _config_args(p: argparse.ArgumentParser) -> None:
    """The config a colocated command builds: a preset, a YAML file over it, ``--set`` over both."""
    p.add_argument("--preset", default="tiny",
                   help="config the YAML and --set apply to: a recipe in recipes/ (e.g. tiny, wide, tpu_demo, tpu_real)")
    p.add_argument("--config", metavar="FILE", help="YAML config file over the preset")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="dotted override, repeatable")


def _colocated_config(args: argparse.Namespace, **overrides: object) -> CampaignConfig:
    """The config of ``_config_args``, placed colocated, with ``overrides`` (dotted keys) over ``--set``."""
    from pipelines_lib.config import CampaignConfig
    from pipelines_lib.configio import parse_overrides

    return CampaignConfig.build(preset=args.preset, config_path=args.config,
                                overrides={**parse_overrides(args.set), "placement": "colocated", **overrides})


def _run_colocated(args: argparse.Namespace) -> int:
    from pipelines_lib.stages.campaign import CampaignMismatchError

    config = _colocated_config(args)
    store = open_store(args, args.url)
    try:
        return _run_and_summarise(args, store, config)
    except CampaignMismatchError as e:  # names the campaign and the sections that differ
        raise CommandError(f"{e}; to continue it with its own: "
                           f"{hint_command(['recover', store.url], dict(args.storage_option))}") from e


RUN_COLOCATED = Command(HELP="run (or continue) a whole campaign in this process, without Prefect: one process "
                             "holds the device for rollouts, trainer and evaluation (placement: colocated)",
                        add_arguments=_run_colocated_args, run=_run_colocated)


# -- recover ----------------------------------------------------------------------------------------------

def _recover_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="campaign folder whose run died or was stopped")
    add_storage_options(p)


def _recover(args: argparse.Namespace) -> int:
    from pipelines_lib.stages.audit import recovery_refusal
    from pipelines_lib.stages.campaign import campaign_status, load_campaign_config

    store = open_campaign_store(args, args.url)
    if refusal := recovery_refusal(store, campaign_status(store)):  # the recover flow's own checks, before any write
        raise CommandError(f"{args.url}: {refusal}")
    config = load_campaign_config(store)
    if config.placement != "colocated":
        raise CommandError(
            f"{store.url}: placement {config.placement!r}: its stages run as separate processes, which only the "
            f"recover flow starts (through Prefect), not installed here; install this checkout with its "
            f"dependencies ({shlex.join([sys.executable, '-m', 'pip', 'install', '-e', str(CHECKOUT)])}) and run: "
            f"{hint_command(['recover', store.url], dict(args.storage_option))}")
    return _run_and_summarise(args, store, config)


RECOVER = Command(HELP="finish a colocated campaign in this process, with the config it was started with "
                       "(without Prefect; an installed rollstream runs its recover flow instead)",
                  add_arguments=_recover_args, run=_recover)


# -- plan -------------------------------------------------------------------------------------------------

def _plan_args(p: argparse.ArgumentParser) -> None:
    _config_args(p)
    p.add_argument("--devices", type=int, metavar="N",
                   help="plan for N devices (a slice; trainer.mesh resolved over N, e.g. --set trainer.mesh.fsdp=-1) "
                        "instead of this machine's; the train step's temporaries are then estimated, not compiled")
    p.add_argument("--device-gib", type=float, metavar="GIB",
                   help="each device's memory (memory.device_gib) where the runtime reports none, e.g. on a CPU "
                        "planning for a TPU v5e: 15.75")


def _plan(args: argparse.Namespace) -> int:
    from pipelines_lib.memplan import MemoryPlanError
    from pipelines_lib.stages.colocated import plan_colocated

    if args.devices is not None and args.devices < 1:
        raise CommandError(f"--devices must be >= 1, got {args.devices}")
    config = _colocated_config(args, **({} if args.device_gib is None else {"memory.device_gib": args.device_gib}))
    try:
        plan = plan_colocated(config, n_devices=args.devices)
    except MemoryPlanError as e:  # the finding this command is for: said on stdout, exit 1
        print(e)
        return 1
    except ValueError as e:  # a trainer or engine mesh the devices cannot hold
        raise CommandError(str(e)) from e
    print(plan.render())
    return 0


PLAN = Command(HELP="the colocated memory plan of a config on this machine's device, or on N devices of a given "
                    "memory: what each part holds, and whether it fits (exit 1 when it does not, naming the part)",
               add_arguments=_plan_args, run=_plan)
