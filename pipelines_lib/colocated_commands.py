"""The ``rollstream`` commands that run a whole campaign in this process, without Prefect: ``run-colocated`` and the
built-in ``recover``.

Both call ``stages.colocated.run_colocated`` (one process holds the device for rollouts, trainer and evaluation)
and print the same one-line JSON summary. ``run-colocated`` builds the config from a preset, a YAML file and
``--set``; ``recover`` takes the config the campaign was started with (its ``campaign.json``), so it needs nothing
but the URL::

    python -m pipelines_lib.cli run-colocated C --preset tpu_demo     # killed, or stopped
    python -m pipelines_lib.cli recover C                             # continues it, same config

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
    p.add_argument("--preset", default="tiny",
                   help="config the YAML and --set apply to: a recipe in recipes/ (e.g. tiny, wide, tpu_demo, tpu_real)")
    p.add_argument("--config", metavar="FILE", help="YAML config file over the preset")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="dotted override, repeatable")
    add_storage_options(p)


def _run_colocated(args: argparse.Namespace) -> int:
    from pipelines_lib.config import CampaignConfig
    from pipelines_lib.configio import parse_overrides
    from pipelines_lib.stages.campaign import CampaignMismatchError

    overrides = {**parse_overrides(args.set), "placement": "colocated"}
    config = CampaignConfig.build(preset=args.preset, config_path=args.config, overrides=overrides)
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
