"""The ``rollstream`` commands that read a campaign for people and warehouse tools: ``audit``, ``export``,
``sql``, ``view`` and ``trace``.

Each is a ``cli.Command`` registered through the ``rollstream.commands`` entry-point group (``pyproject.toml``),
as ``flows.commands`` and the repository's ``bench`` and ``drills`` are; ``pipelines_lib.cli`` loads them by
entry point and never imports this module. The work itself is in ``pipelines_lib.audit`` (the audit, the
Parquet export, the DuckDB tables, the HTML view) and ``pipelines_lib.telemetry.trace``, imported inside each
command so that building the parser stays light. Errors follow ``cli``: a campaign or query the command cannot
use is a ``CommandError``, one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path

from pipelines_lib.cli import (
    Command,
    CommandError,
    add_storage_options,
    did_you_mean,
    open_campaign_store,
    open_store,
    say,
    to_stderr,
)
from pipelines_lib.storage.store import Store

# -- audit ------------------------------------------------------------------------------------------------

def _audit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="campaign folder: a local path, file://... or gs://bucket/prefix")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of tables")
    p.add_argument("--progress-every", type=int, default=100, metavar="N", help="a progress line every N shards")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="worker processes, one version folder at a time each; 1: none, this process decodes "
                        "(default: by size: none for a small campaign, one per 1000 shards up to one per CPU)")
    p.add_argument("--since", type=int, default=None, metavar="VERSION",
                   help="incremental: reuse kept results (--keep) of unchanged version folders below VERSION")
    p.add_argument("--keep", action="store_true",
                   help="keep each version folder's result under audit/versions/ for a later --since")
    add_storage_options(p)


def _audit(args: argparse.Namespace) -> int:
    from pipelines_lib.audit import audit_campaign
    from pipelines_lib.stages.campaign import config_problem

    report = audit_campaign(open_store(args, args.url), progress=to_stderr,
                            progress_every=args.progress_every, jobs=args.jobs, since=args.since,
                            keep=args.keep, config_check=config_problem)
    say(report.to_json() if args.json else report.render_text())
    return 0 if report.ok else 1


AUDIT = Command(HELP="validate every shard of a campaign and report statistics, lineage and anomalies",
                add_arguments=_audit_args, run=_audit)


# -- export -----------------------------------------------------------------------------------------------

def _export_parquet(store: Store, out: Store, jobs: int) -> list:
    from pipelines_lib.audit.export import export_parquet

    return export_parquet(store, out, progress=to_stderr, jobs=jobs)


EXPORTERS: dict[str, Callable[[Store, Store, int], list]] = {"parquet": _export_parquet}
"""Export formats by name; each returns ``audit.export.ExportedVersion``-like records."""


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="campaign folder")
    p.add_argument("out", help="output folder (local path or gs://...); a Parquet dataset, a hive partition "
                               "version=N/ per policy version, create-only (a rerun reports each version as "
                               "written, unchanged, stale or empty), and _dataset_card.md/.json beside it: the "
                               "columns' meanings, counts per version, lineage, audit verdict, config hash")
    p.add_argument("--format", choices=sorted(EXPORTERS), default="parquet")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, metavar="N",
                   help="worker processes, one version at a time each (default: one per CPU)")
    add_storage_options(p)


def _export(args: argparse.Namespace) -> int:
    results = EXPORTERS[args.format](open_campaign_store(args, args.url), open_store(args, args.out), args.jobs)
    print(json.dumps([{"version": r.version, "path": r.path, "status": r.status, "rows": r.rows, "shards": r.shards,
                       "skipped": [s for s, _ in r.skipped]} for r in results], indent=2))
    return 0


EXPORT = Command(HELP="export committed valid shards for warehouse tools (a dataset partitioned by version)",
                 add_arguments=_export_args, run=_export)


# -- sql --------------------------------------------------------------------------------------------------

SQL_VERDICTS = "sql-verdicts"
"""Folder of the user's cache (``Settings.cache``) where ``sql`` keeps the shards it judged valid (``audit.verdicts``)."""


def _sql_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="campaign folder")
    p.add_argument("query", help="DuckDB SQL over the tables trajectories, consumed, dropped, evals, skipped_shards "
                                 "(columns: docs/COMMANDS.md, 'SQL over a campaign')")
    p.add_argument("--json", action="store_true", help="print rows as a JSON list of objects")
    p.add_argument("--max-rows", type=int, default=200, metavar="N", help="rows printed as text (default 200)")
    add_storage_options(p)


def _sql(args: argparse.Namespace) -> int:
    import duckdb

    from pipelines_lib.audit.sql import QueryRefused, campaign_tables, render_text

    store = open_campaign_store(args, args.url)
    try:
        tables = campaign_tables(store, verdicts=args.settings.cache / SQL_VERDICTS)
    except ValueError as e:  # a consumption log or eval file that is not the record its stage writes (names it)
        raise CommandError(str(e)) from e
    for shard, reason in tables.skipped:
        to_stderr(f"rollstream sql: skipped unreadable shard {shard}: {reason}")
    try:
        result = tables.query(args.query)
    except QueryRefused as e:
        raise CommandError(str(e)) from e
    except duckdb.Error as e:
        raise CommandError(f"query failed: {e}") from e
    say(json.dumps(result.to_pylist(), default=str, indent=2) if args.json
          else render_text(result, max_rows=args.max_rows))
    return 0


SQL = Command(HELP="run a DuckDB SQL query over a campaign's shards, consumption logs and evaluations",
              add_arguments=_sql_args, run=_sql)


# -- view -------------------------------------------------------------------------------------------------

def _view_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="campaign folder")
    p.add_argument("--max-groups", type=int, default=None, metavar="N",
                   help="groups in the browsable list, sampled evenly across versions (default 400)")
    p.add_argument("--serve", action="store_true", help="also serve the page on 127.0.0.1 until Ctrl-C")
    p.add_argument("--port", type=int, default=8765, help="port for --serve (0 picks a free one)")
    add_storage_options(p)


def _view(args: argparse.Namespace) -> int:
    from pipelines_lib.audit.view import DEFAULT_MAX_GROUPS, render_html, serve, write_view
    from pipelines_lib.stages.view import campaign_view

    store = open_campaign_store(args, args.url)
    try:
        view = campaign_view(store, max_groups=args.max_groups or DEFAULT_MAX_GROUPS, cache=args.settings.cache,
                             progress=to_stderr)
    except ValueError as e:  # a consumption log or eval file that is not the record its stage writes (names it)
        raise CommandError(str(e)) from e
    if view.tokenizer is None:
        to_stderr(f"rollstream view: turns shown as token ids ({view.tokenizer_note})")
    skipped = view.summary["skipped_shards"]
    for shard, reason in skipped:
        to_stderr(f"rollstream view: skipped unreadable shard {shard}: {reason}")
    if not view.total_groups:
        raise CommandError(f"{args.url}: no readable shard to show ({len(skipped)} unreadable; `rollstream audit` "
                           "says why)" if skipped else f"{args.url}: no shards yet: nothing to show")
    path = write_view(store, view)
    say(store.uri(path))
    if args.serve:
        serve(render_html(view), port=args.port, announce=to_stderr)
    return 0


VIEW = Command(HELP="write a browsable HTML report (and the learning-curve PNG) into the campaign folder",
               add_arguments=_view_args, run=_view)


# -- trace ------------------------------------------------------------------------------------------------

def _trace_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="campaign folder")
    p.add_argument("--out", type=Path, default=Path("trace.json"),
                   help="where to write the trace JSON: a new file outside the campaign folder")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists (never inside the campaign)")
    p.add_argument("--stage", action="append", default=None, metavar="NAME",
                   help="only this stage's processes (repeatable): prep, warm_start, collect, train, evaluate, audit")
    p.add_argument("--since", metavar="WHEN", help="only what overlaps from WHEN on: seconds after the first record, "
                                                    "or an ISO time (UTC unless it says)")
    p.add_argument("--until", metavar="WHEN", help="only what overlaps up to WHEN (as --since)")
    add_storage_options(p)


def _trace(args: argparse.Namespace) -> int:
    from pipelines_lib.records import read_folders
    from pipelines_lib.stages.table import STAGE_NAMES
    from pipelines_lib.storage.destination import refuse_inside, write_file
    from pipelines_lib.telemetry.trace import parse_when, read_records, select, to_chrome_trace

    for name in args.stage or []:
        if name not in STAGE_NAMES:
            raise CommandError(f"unknown stage {name!r}{did_you_mean(name, STAGE_NAMES)}; valid: {', '.join(STAGE_NAMES)}")
    store = open_campaign_store(args, args.url)
    refuse_inside(str(args.out), read_folders(store), what="--out")
    if os.path.lexists(args.out) and not args.overwrite:  # said before reading telemetry; write_file checks again
        raise CommandError(f"--out {args.out}: already exists; pass --overwrite to replace it")
    records = read_records(store, on_skip=to_stderr)
    if not records:
        raise CommandError(f"{args.url}: no telemetry recorded (telemetry/ is empty)")
    try:
        since, until = (None if w is None else parse_when(w, records[0]["ts_us"]) for w in (args.since, args.until))
    except ValueError as e:
        raise CommandError(f"--since/--until: {e}") from e
    chosen = select(records, stages=args.stage, since_us=since, until_us=until)
    if not chosen:
        raise CommandError(f"{args.url}: no telemetry in the chosen stages and time window "
                           f"({len(records)} records in all)")
    trace = to_chrome_trace(chosen)
    write_file(args.out, json.dumps(trace).encode(), overwrite=args.overwrite)
    print(f"{args.out}: {len(trace['traceEvents'])} events from {len(chosen)} of {len(records)} records; "
          "open in https://ui.perfetto.dev")
    return 0


TRACE = Command(HELP="write the campaign's spans as a Perfetto/Chrome trace (open it in ui.perfetto.dev)",
                add_arguments=_trace_args, run=_trace)
