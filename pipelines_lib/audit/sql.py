"""SQL over a campaign folder: DuckDB on the campaign's shards, consumption logs and evaluations.

``campaign_tables`` reads the folder (local or ``gs://``) once into Arrow tables that DuckDB queries in place::

    trajectories   one row per trajectory: every shard column (``version`` is the group's policy version),
                   plus ``shard`` (path in the folder) and ``campaign`` (the campaign id)
    consumed       one row per group a train step used: step, trainer_version, group_id, shard, version, staleness
    dropped        one row per group the trainer dropped or skipped: step, kind (dropped_stale | skipped), shard,
                   group_id (null for a skipped shard, or for a shard dropped unopened that did not read), reason
    evals          one row per ``eval/vN.json``: version, greedy_success_rate, pass@k (as ``pass_at_k``), tasks, k
    skipped_shards shards that did not read or validate: shard, reason (they are left out of ``trajectories``)

A shard that does not read (truncated, foreign, newer major schema) is skipped and listed, never fatal: an
auditor still gets answers from the rest. Everything is held in memory, so this suits campaigns up to a few
million trajectories; ``export`` writes Parquet for anything larger.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pipelines_lib import records
from pipelines_lib.records import ConsumptionLog, EvalResult
from pipelines_lib.storage import layout
from pipelines_lib.storage.errors import NotFoundError
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.codec import ShardError, read_shard
from pipelines_lib.trajectory.schema import TRAJECTORY_SCHEMA

CONSUMED_SCHEMA = pa.schema([("step", pa.int64()), ("trainer_version", pa.int64()), ("group_id", pa.string()),
                             ("shard", pa.string()), ("version", pa.int64()), ("staleness", pa.int64())])
DROPPED_SCHEMA = pa.schema([("step", pa.int64()), ("kind", pa.string()), ("shard", pa.string()),
                            ("group_id", pa.string()), ("reason", pa.string())])
EVALS_SCHEMA = pa.schema([("version", pa.int64()), ("greedy_success_rate", pa.float64()), ("pass_at_k", pa.float64()),
                          ("tasks", pa.int64()), ("k", pa.int64())])
SKIPPED_SCHEMA = pa.schema([("shard", pa.string()), ("reason", pa.string())])
TRAJECTORIES_SCHEMA = TRAJECTORY_SCHEMA.append(pa.field("shard", pa.string(), nullable=False)).append(
    pa.field("campaign", pa.string(), nullable=False))


@dataclass(frozen=True, kw_only=True)
class CampaignTables:
    """The campaign as named Arrow tables (see the module docstring for their columns)."""

    tables: dict[str, pa.Table]

    @property
    def skipped(self) -> list[tuple[str, str]]:
        t = self.tables["skipped_shards"]
        return list(zip(t.column("shard").to_pylist(), t.column("reason").to_pylist(), strict=True))

    def query(self, sql: str) -> pa.Table:
        """Run ``sql`` in a fresh in-memory DuckDB that sees every table by name."""
        import duckdb  # imported here: only ``rollstream sql`` and the viewer pay for it

        con = duckdb.connect(":memory:")
        try:
            for name, table in self.tables.items():
                con.register(name, table)
            return con.sql(sql).to_arrow_table()
        finally:
            con.close()


def shard_paths(store: Store) -> list[str]:
    """Every shard name in the campaign folder, in version, worker, seq order."""
    out = []
    for folder in store.list(layout.TRAJECTORIES):
        if layout.parse_version_dir(folder) is None:
            continue
        out += [p for n in store.list(f"{layout.TRAJECTORIES}/{folder}")
                if layout.parse_shard_path(p := f"{layout.TRAJECTORIES}/{folder}/{n}") is not None]
    return sorted(out, key=lambda p: layout.parse_shard_path(p))


def read_trajectories(store: Store, *, progress: Callable[[str], None] | None = None,
                      progress_every: int = 100) -> tuple[pa.Table, list[tuple[str, str]]]:
    """All readable shards as one table with ``shard`` and ``campaign`` columns; (shard, reason) of the others."""
    campaign = layout.campaign_id(store.url)
    parts, skipped = [], []
    paths = shard_paths(store)
    for i, path in enumerate(paths, 1):
        try:
            table, _ = read_shard(store, path)
        except (ShardError, NotFoundError) as e:
            skipped.append((path, str(e)))
            if progress is not None:
                progress(f"skipped {path}: {e}")
            continue
        n = table.num_rows
        parts.append(table.replace_schema_metadata(None)
                     .append_column(TRAJECTORIES_SCHEMA.field("shard"), pa.array([path] * n, pa.string()))
                     .append_column(TRAJECTORIES_SCHEMA.field("campaign"), pa.array([campaign] * n, pa.string())))
        if progress is not None and i % progress_every == 0:
            progress(f"read {i}/{len(paths)} shards")
    table = pa.concat_tables(parts) if parts else TRAJECTORIES_SCHEMA.empty_table()
    return table.cast(TRAJECTORIES_SCHEMA), skipped


def _log_rows(logs: list[ConsumptionLog], trajectories: pa.Table) -> tuple[list[dict], list[dict]]:
    """Rows of ``consumed`` and ``dropped``; a shard dropped unopened names no group, so its groups are the ones
    ``trajectories`` holds for it."""
    consumed, dropped = [], []
    groups_of: dict[str, list[str]] = {}
    if any(d.unread_groups for log in logs for d in log.dropped_stale):
        for shard, gid in zip(trajectories.column("shard").to_pylist(), trajectories.column("group_id").to_pylist(),
                              strict=True):
            groups_of.setdefault(shard, [])
            if gid not in groups_of[shard]:
                groups_of[shard].append(gid)
    for log in logs:
        consumed += [{"step": log.step, "trainer_version": log.trainer_version, "group_id": g.group_id,
                      "shard": g.shard, "version": g.version, "staleness": g.staleness} for g in log.groups]
        for d in log.dropped_stale:
            dropped += [{"step": log.step, "kind": "dropped_stale", "shard": d.shard, "group_id": gid,
                         "reason": d.reason}
                        for gid in (d.groups or groups_of.get(d.shard) or [None])]
        for s in log.skipped:
            dropped += [{"step": log.step, "kind": "skipped", "shard": s.shard, "group_id": gid, "reason": s.reason}
                        for gid in (s.groups or [None])]
    return consumed, dropped


def _eval_row(result: EvalResult) -> dict:
    return {"version": result.version, "greedy_success_rate": result.greedy_success_rate,
            "pass_at_k": result.pass_at_k, "tasks": result.tasks, "k": result.k}


def campaign_tables(store: Store, *, progress: Callable[[str], None] | None = None) -> CampaignTables:
    """Read the campaign at ``store`` (a fork over its parents' history) into the tables ``rollstream sql`` and the
    viewer query."""
    store = records.with_parents(store)
    trajectories, skipped = read_trajectories(store, progress=progress)
    consumed, dropped = _log_rows(records.consumption_logs(store), trajectories)
    evals = [_eval_row(EvalResult.read(store, v)) for v in records.evaluated_versions(store)]
    return CampaignTables(tables={
        "trajectories": trajectories,
        "consumed": pa.Table.from_pylist(consumed, schema=CONSUMED_SCHEMA),
        "dropped": pa.Table.from_pylist(dropped, schema=DROPPED_SCHEMA),
        "evals": pa.Table.from_pylist(sorted(evals, key=lambda r: r["version"]), schema=EVALS_SCHEMA),
        "skipped_shards": pa.Table.from_pylist([{"shard": s, "reason": r} for s, r in skipped], schema=SKIPPED_SCHEMA),
    })


def render_text(table: pa.Table, *, max_rows: int = 200) -> str:
    """An aligned text table of the first ``max_rows`` rows (floats to 4 significant digits)."""
    def cell(v: Any) -> str:
        return "NULL" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)

    rows = [[cell(v) for v in r.values()] for r in table.slice(0, max_rows).to_pylist()]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(table.column_names)]
    lines = ["  ".join(n.ljust(w) for n, w in zip(table.column_names, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    if table.num_rows > max_rows:
        lines.append(f"... {table.num_rows - max_rows} more rows")
    return "\n".join(line.rstrip() for line in lines)
