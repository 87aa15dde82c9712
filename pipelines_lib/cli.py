"""``rollstream``: one command line over the library, one subcommand per stage or tool.

Adding a subcommand is one decorated function plus an argument function::

    def _collect_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("url")

    @subcommand("collect", "run rollout workers against a campaign", _collect_args)
    def _collect(args: argparse.Namespace) -> int:
        from pipelines_lib.rollout import ...   # imported inside: `rollstream audit` must not pay for JAX
        return 0

This module holds the command line's machinery (the parser, shared storage arguments, ``main``) and the
commands that run or manage a stage of one campaign (``status``, ``train``, ``replay``, ``fork``, ``metrics``,
``demo``, ``export-weights``). Whole command modules join in two ways (``commands()``), both loaded by name, so
they import this module and not the other way round:

- built in, ``BUILTIN_COMMANDS``: the library's own, there wherever ``pipelines_lib`` imports (a checkout on
  ``PYTHONPATH`` on a TPU VM, no install, no Prefect): ``pipelines_lib.inspect_commands`` (``audit``, ``export``,
  ``sql``, ``view``, ``trace``: reading a campaign for people and warehouse tools) and
  ``pipelines_lib.colocated_commands`` (``run-colocated``, ``recover``: a whole campaign in this process; ``plan``:
  whether it fits its device);
- installed, the ``rollstream.commands`` entry-point group (``pyproject.toml``): ``flows.commands`` (``run``,
  ``recover``, ``stage``, ``deploy``: through Prefect) and the repository's ``bench`` and ``drills``. An installed
  command replaces the built-in of its name: the recover flow takes over ``recover``.

``run`` returns the exit code. Exit codes: 0 success, 1 the command ran and found a problem (an audit with
violations), 2 it could not run (bad URL, unreachable storage, bad arguments, a campaign file that is not the
record its stage writes): one line on stderr naming the URL, no traceback; 141 the reader of stdout stopped
early (``| head``), silently. ``main`` is an entry point: it sets the libraries' environment defaults and reads
``Settings`` once (``args.settings``), so storage gets the same request timeout and deadline here as in the flows.
"""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import EntryPoint, PackageNotFoundError, entry_points, version
from typing import Any, NoReturn

from pipelines_lib.configio import ConfigError
from pipelines_lib.hints import hint_command, secrets_note
from pipelines_lib.records.base import RecordError
from pipelines_lib.settings import Settings, apply_process_defaults
from pipelines_lib.storage.destination import DestinationError, refuse_inside
from pipelines_lib.storage.errors import StorageError
from pipelines_lib.storage.store import Store
from pipelines_lib.terminal import printable

RunFn = Callable[[argparse.Namespace], int]
EXIT_BROKEN_PIPE = 141
"""Exit code when stdout closed before the command finished: the shell's code for a process ended by SIGPIPE,
as any other tool in a pipeline that stops reading early would report it."""


@dataclass(frozen=True, kw_only=True)
class Subcommand:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: RunFn


SUBCOMMANDS: dict[str, Subcommand] = {}


def subcommand(name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None]) -> Callable[[RunFn], RunFn]:
    def register(run: RunFn) -> RunFn:
        if name in SUBCOMMANDS:
            raise ValueError(f"subcommand {name!r} is registered twice")
        SUBCOMMANDS[name] = Subcommand(name=name, help=help, add_arguments=add_arguments, run=run)
        return run
    return register


@dataclass(frozen=True)
class Command:
    """What a ``COMMAND_GROUP`` entry point may name instead of a module: help line, arguments and the function
    that runs, for a module that holds several commands."""

    HELP: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: RunFn


class CommandError(Exception):
    """A command cannot run; the message is the one line the user sees."""


def did_you_mean(name: str, valid: Sequence[str]) -> str:
    """``"; did you mean 'store'?"`` when a valid name is close to ``name``, else ``""``."""
    close = difflib.get_close_matches(name, list(valid), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


# -- shared arguments -------------------------------------------------------------------------------------

def _storage_option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:  # numbers and booleans as JSON; everything else (paths, URLs, "anon") is a string
        return key, json.loads(value)
    except ValueError:
        return key, value


def add_storage_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage-option", "-o", action="append", type=_storage_option, default=[], metavar="KEY=VALUE",
                   help="fsspec/gcsfs option for gs:// URLs, repeatable (e.g. endpoint_url=http://127.0.0.1:4443, "
                        "token=anon); STORAGE_EMULATOR_HOST is honoured by gcsfs itself")


def open_store(args: argparse.Namespace, url: str) -> Store:
    """A ``Store`` for ``url`` with the command's storage options and settings; an unknown protocol or a missing
    driver becomes a ``CommandError`` naming it."""
    try:
        return args.settings.store(url, dict(args.storage_option))
    except (ValueError, ImportError) as e:
        raise CommandError(f"{url}: cannot open storage: {e}") from e


def open_campaign_store(args: argparse.Namespace, url: str) -> Store:
    """``open_store`` for a command that reads a campaign: a folder that is missing or empty is a
    ``CommandError`` (exit 2), not an empty report."""
    store = open_store(args, url)
    if not store.list(""):
        raise CommandError(f"{url}: no campaign folder here (missing or empty)")
    return store


def say(text: str) -> None:
    """The command's result on stdout, ``printable`` (``pipelines_lib.terminal``)."""
    print(printable(text))


def to_stderr(line: str) -> None:
    """A progress or warning line on stderr (stdout carries the command's result), ``printable``."""
    print(printable(line), file=sys.stderr, flush=True)


def _export_weights_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="campaign folder")
    p.add_argument("--version", type=int, default=None, help="published version (default: the one LATEST points at)")
    p.add_argument("out", help="local folder to create: a Hugging Face checkpoint (config.json, safetensors, "
                               "the campaign's tokenizer, generation_config.json)")
    add_storage_options(p)


@subcommand("export-weights", "write a published version as a Hugging Face checkpoint folder", _export_weights_args)
def _export_weights(args: argparse.Namespace) -> int:
    from pipelines_lib.model.hf_export import save_hf_checkpoint
    from pipelines_lib.model.tokenizer import tokenizer_dir
    from pipelines_lib.publish import load_published
    from pipelines_lib.records import read_folders
    from pipelines_lib.stages.campaign import load_campaign_config

    store = open_store(args, args.url)
    refuse_inside(args.out, read_folders(store), what="the output folder")
    model, version = load_published(store, args.version)
    try:
        folder = save_hf_checkpoint(model, args.out, tokenizer_dir=tokenizer_dir(load_campaign_config(store).tokenizer, cache=args.settings.cache))
    except FileExistsError as e:
        raise CommandError(str(e)) from e
    print(json.dumps({"version": version, "out": str(folder), "files": sorted(p.name for p in folder.iterdir())}))
    return 0


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="campaign folder")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (default: the config's)")
    p.add_argument("--process-id", type=int, default=None,
                   help="this process's index in the campaign's distributed group (default: distributed.process_id)")
    add_storage_options(p)


@subcommand("train", "run the train stage in this process: one process of a multi-host trainer, or the whole trainer",
            _train_args)
def _train(args: argparse.Namespace) -> int:
    from pipelines_lib.stages.campaign import load_campaign_config
    from pipelines_lib.stages.train import train
    from pipelines_lib.train.reload import ReplayError
    from pipelines_lib.train.trainer import NonFiniteStepError

    store = open_store(args, args.url)
    try:
        summary = train(store, load_campaign_config(store), max_steps=args.max_steps, cache=args.settings.cache,
                        process_id=args.process_id, log=say)
    except (ReplayError, NonFiniteStepError) as e:  # the message names the step (and the shard): one line
        raise CommandError(str(e)) from e
    print(json.dumps(summary))
    return 0


# -- demo -------------------------------------------------------------------------------------------------

def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=None, help="campaign folder to create (default runs/demo-<timestamp>)")


@subcommand("demo", "write, tail and audit a small synthetic campaign (a few seconds, CPU)", _demo_args)
def _demo(args: argparse.Namespace) -> int:
    from pipelines_lib.demo import run_demo

    return 0 if run_demo(args.out).report.ok else 1


# -- telemetry ---------------------------------------------------------------------------------------------

def _metrics_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="campaign folder")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_storage_options(p)


@subcommand("metrics", "summarise the campaign's spans and gauges (count, total, mean, p95)", _metrics_args)
def _metrics(args: argparse.Namespace) -> int:
    from pipelines_lib.telemetry.trace import read_records, summarize

    summary = summarize(read_records(open_campaign_store(args, args.url), on_skip=to_stderr))
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
        return 0
    for name, stats in summary.items():
        say(f"{name:<40} " + "  ".join(f"{k}={v}" for k, v in stats.items()))
    return 0


# -- replay -----------------------------------------------------------------------------------------------

def _replay_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="campaign folder")
    p.add_argument("--step", type=int, required=True, help="the logged training step to recompute")
    p.add_argument("--what-if", action="append", default=[], metavar="KEY=VALUE",
                   help="recompute under another loss setting, repeatable (trainer.step.loss.eps_high=0.2, "
                        "trainer.step.loss.behav_weight_cap=2, trainer.advantage=drgrpo); nothing is written")
    p.add_argument("--dump", default=None, metavar="DIR",
                   help="write the batch as Parquet into DIR (tokens, masks, log-probs, advantages, per-token loss)")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    add_storage_options(p)


@subcommand("replay", "recompute a logged training step from storage and compare it with its log", _replay_args)
def _replay(args: argparse.Namespace) -> int:
    from pipelines_lib.configio import ConfigError, parse_overrides
    from pipelines_lib.stages.replay import replay
    from pipelines_lib.train.reload import ReplayError

    store = open_campaign_store(args, args.url)
    try:
        what_if = parse_overrides(args.what_if, flag="--what-if")
        result = replay(store, args.step, what_if=what_if, dump=open_store(args, args.dump) if args.dump else None,
                        log=to_stderr)
    except (ConfigError, ValueError, FileNotFoundError, ReplayError) as e:
        # no such step, a key a what-if cannot set, no campaign, rows that are not what a step trained on
        raise CommandError(str(e)) from e
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        say(f"step {result['step']}: restored checkpoint of step {result['from_checkpoint']}, "
            f"re-trained {result['replayed_steps']} logged step(s)")
        for key in ("loss", "grad_norm"):
            say(f"{key:<10} logged {result[key]['logged']!r:<24} recomputed {result[key]['recomputed']!r}")
        for key, value in sorted(result["metrics"].items()):
            say(f"  {key:<32} {value:.6g}")
        for g in result["groups"]:
            say(f"  group {g['group_id']:<24} loss {g['loss']:+.6g}  advantages {g['advantages']}")
        if result["dump"]:
            say(f"dump: {result['dump']}")
        say("what-if: " + json.dumps(result["what_if"]) if what_if
            else f"identical: {'yes' if result['identical'] else 'NO'}")
    return 0 if result["identical"] or what_if else 1


# -- fork -------------------------------------------------------------------------------------------------

def _fork_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="the parent campaign folder (only read)")
    p.add_argument("--from-step", type=int, required=True, help="the parent's step to start from (its steps after the newest checkpoint at or before it "
                        "must be logged: the fork's trainer replays them)")
    p.add_argument("new_url", help="the fork's campaign folder")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="change a setting in the fork, repeatable (rollout.eta=0, trainer.optim.lr=1e-4); "
                        "model.* and tokenizer are refused")
    add_storage_options(p)


@subcommand("fork", "start a new campaign from a step of another, referencing its history, under changed settings",
            _fork_args)
def _fork(args: argparse.Namespace) -> int:
    from pipelines_lib.configio import ConfigError, parse_overrides
    from pipelines_lib.stages.fork import fork_campaign

    try:
        result = fork_campaign(open_store(args, args.url), args.from_step, open_store(args, args.new_url),
                               parse_overrides(args.set))
    except (ConfigError, ValueError, FileNotFoundError) as e:  # model/tokenizer keys, unlogged steps, no campaign
        raise CommandError(str(e)) from e
    parent = result["parent"]
    changed = ", ".join(f"{k}={v['fork']}" for k, v in parent["config_diff"].items()) or "nothing"
    options = dict(args.storage_option)
    say(f"{'forked' if result['created'] else 'already forked'} {parent['url']} at step {parent['step']} "
        f"(version {parent['version']}) into {result['campaign']}; changed: {changed}\n"
        f"run it with: {hint_command(['recover', result['campaign']], options)}")
    if note := secrets_note(options):
        print(note)
    return 0


# -- campaign status ---------------------------------------------------------------------------------------

def _status_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="campaign folder")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    add_storage_options(p)


@subcommand("status", "what each stage of a campaign has committed, and what a recovery would run", _status_args)
def _status(args: argparse.Namespace) -> int:
    from pipelines_lib.stages.campaign import campaign_status, render_status

    store = open_campaign_store(args, args.url)
    status = campaign_status(store)
    if args.json:
        print(json.dumps(status, indent=2, default=str))
        return 0
    options = dict(args.storage_option)
    say(render_status(status, recover=hint_command(["recover", store.url], options)))
    if status["todo"] and (note := secrets_note(options)):
        print(note)
    return 0


# -- entry point ------------------------------------------------------------------------------------------

COMMAND_GROUP = "rollstream.commands"
"""Entry-point group of installed command modules (``flows.commands``; ``bench``, ``drills`` from a checkout):
each names a module or a ``Command`` with ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``."""

BUILTIN_COMMANDS = {
    **{name: f"pipelines_lib.inspect_commands:{name.upper()}" for name in ("audit", "export", "sql", "view", "trace")},
    "run-colocated": "pipelines_lib.colocated_commands:RUN_COLOCATED",
    "recover": "pipelines_lib.colocated_commands:RECOVER",
    "plan": "pipelines_lib.colocated_commands:PLAN",
}
"""The library's command modules, as entry-point values: there without an install, and none of them needs Prefect."""


def commands(installed: Sequence[EntryPoint] | None = None) -> dict[str, Subcommand]:
    """The library's subcommands, its built-in command modules and the ``installed`` ones (default: this
    environment's ``COMMAND_GROUP`` entry points), by name. An installed command replaces a built-in of its name;
    any other name given twice is an error."""
    installed = entry_points(group=COMMAND_GROUP) if installed is None else installed
    chosen: dict[str, EntryPoint] = {}
    for ep in [*(EntryPoint(name=n, value=v, group=COMMAND_GROUP) for n, v in BUILTIN_COMMANDS.items()),
               *sorted(installed, key=lambda ep: ep.name)]:
        if ep.name in SUBCOMMANDS or (ep.name in chosen and chosen[ep.name].value != BUILTIN_COMMANDS.get(ep.name)):
            raise ValueError(f"subcommand {ep.name!r} of entry point {ep.value} is registered twice")
        chosen[ep.name] = ep
    out = dict(SUBCOMMANDS)
    for name, ep in sorted(chosen.items()):
        module = ep.load()
        out[name] = Subcommand(name=name, help=module.HELP, add_arguments=module.add_arguments, run=module.run)
    return out


class _Parser(argparse.ArgumentParser):
    """argparse with a "did you mean" on a mistyped choice (a subcommand, a stage, a preset)."""

    def error(self, message: str) -> NoReturn:
        if m := re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message):
            message += did_you_mean(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
        super().error(message)


def _version() -> str:
    try:
        return f"rollstream {version('rollstream')}"
    except PackageNotFoundError:  # a checkout on PYTHONPATH that was never installed
        return "rollstream (not installed)"


def build_parser(available: dict[str, Subcommand] | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="rollstream", description=__doc__.split("\n\n")[0],
                     epilog="exit codes: 0 ok, 1 the command ran and found a problem (audit violations, a failed "
                            "run), 2 usage error or unreachable input")
    parser.add_argument("--version", action="version", version=_version())
    subs = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for cmd in (commands() if available is None else available).values():
        cmd.add_arguments(subs.add_parser(cmd.name, help=cmd.help, description=cmd.help))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    available = commands()
    args = build_parser(available).parse_args(argv)
    apply_process_defaults(os.environ)  # before anything imports gcsfs (it reads its variables at import)
    # gcsfs logs a traceback for every request it gives up on; the StorageError we print says the same in one line.
    logging.getLogger("gcsfs").setLevel(logging.CRITICAL)
    try:
        try:
            args.settings = Settings.from_env(os.environ)
        except ValueError as e:
            raise CommandError(f"bad environment: {e}") from e
        code = available[args.command].run(args)
        sys.stdout.flush()  # a reader that stopped early shows here, not as the interpreter's last words at exit
        return code
    except (CommandError, ConfigError, DestinationError, FileNotFoundError, RecordError) as e:  # bad input: named
        to_stderr(f"rollstream {args.command}: {e}")
    except StorageError as e:  # its message names the operation and the URL
        to_stderr(f"rollstream {args.command}: {e}")
    except BrokenPipeError:
        # The reader stopped early (``rollstream metrics --json | head``): what it wanted was written. Nothing may
        # be printed any more, and the interpreter's last flush of stdout must not fail either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return 2


if __name__ == "__main__":
    # Run the importable copy: command modules raise ``pipelines_lib.cli.CommandError``, which a ``__main__`` copy
    # of this module would not catch.
    from pipelines_lib.cli import main as _main

    sys.exit(_main())
