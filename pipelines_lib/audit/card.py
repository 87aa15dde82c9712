"""The dataset card an export writes beside its Parquet files: what the columns mean and where the rows came from.

``audit.export.export_parquet`` ends with ``write_card``::

    out/version=<N>/data.parquet ...      the rows (written, or left as an earlier export wrote them)
    out/_dataset_card.md                  for people: the tables below
    out/_dataset_card.json                the same as data, written last

The card holds the schema (each column's Arrow type and its meaning, from the ``doc`` metadata of the export's
schema, which takes them from ``trajectory.schema.TRAJECTORY_SCHEMA``), rows and shards per exported version, the
campaign (URL, id, code version and a SHA-256 of ``campaign.json``'s config in canonical JSON: two exports with
the same hash came from the same settings), its fork lineage (each parent's URL, the step and version forked
from, the settings changed) and the verdict of the campaign's newest kept audit (``rollstream audit`` keeps one;
none kept: the card says so).

Create-only like the rest of the export: a rerun whose card would say the same (all but ``written_at``) writes
nothing; one with something new to say (versions exported since, a newer audit) writes ``_dataset_card.<n>.md``
and ``.json`` with the next ``n``, so the newest card is the one with the largest ``n``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from pipelines_lib import records
from pipelines_lib.records import CampaignManifest
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store
from pipelines_lib.utc import utc_now_iso

CARD = "_dataset_card"
"""The card's name: a leading ``_`` keeps it out of the dataset for readers of the folder (pyarrow, Spark and
DuckDB's hive readers skip such names, as they skip ``_SUCCESS``)."""
_CARD_RE = re.compile(rf"^{CARD}(?:\.(?P<n>\d+))?\.json$")
CARD_VERSION = 1
WITH_FILES = ("written", "unchanged", "stale")
"""Export statuses of a version whose file is in the dataset."""


def config_hash(config: dict[str, Any]) -> str:
    """SHA-256 of a config mapping as canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _audit(store: Store) -> dict[str, Any] | None:
    newest = records.newest_audit(store)
    if newest is None:
        return None
    path, audit = newest
    return {"path": store.uri(path), "audited_at": audit.audited_at, "ok": audit.ok,
            "violations": audit.report.get("violation_counts", {}), "warnings": len(audit.warnings)}


def dataset_card(store: Store, versions: Sequence[dict[str, Any]], schema: pa.Schema, *,
                 partition: pa.Field) -> dict[str, Any]:
    """The card of an export of the campaign at ``store``: ``versions`` are the export's results (``version``,
    ``path``, ``status``, ``rows``, ``shards``), ``schema`` its files' schema, ``partition`` the key in the path."""
    manifest = CampaignManifest.read(store) if store.exists(CampaignManifest.PATH) else None
    kept = [{**{k: v[k] for k in ("version", "path", "rows", "shards")}, "stale": v["status"] == "stale"}
            for v in versions if v["status"] in WITH_FILES]
    fields = [partition, *schema]
    return {
        "card_version": CARD_VERSION,
        "written_at": utc_now_iso(),
        "campaign": {"url": store.url, "id": layout.campaign_id(store.url),
                     **({"kind": None, "code_version": None, "schema_version": None, "config_hash": None}
                        if manifest is None else
                        {"kind": manifest.kind, "code_version": manifest.code_version,
                         "schema_version": manifest.schema_version, "config_hash": config_hash(manifest.config)})},
        "lineage": [{"url": p.url, "step": p.step, "version": p.version, "config_diff": p.config_diff}
                    for _, p in records.fork_chain(store)],
        "audit": _audit(store),
        "partitioning": f"hive: {partition.name}=<N>/data.parquet; {partition.name} is read back from the path",
        "totals": {"versions": len(kept), "rows": sum(v["rows"] for v in kept),
                   "shards": sum(v["shards"] for v in kept)},
        "versions": kept,
        "schema": [{"name": f.name, "type": str(f.type), "doc": (f.metadata or {}).get(b"doc", b"").decode()}
                   for f in fields],
    }


def render_card(card: dict[str, Any]) -> str:
    """The card as Markdown."""
    c, audit = card["campaign"], card["audit"]
    verdict = ("none kept (the campaign's audit stage keeps one under audit/)" if audit is None else
               f"{'OK' if audit['ok'] else 'FAILED'} at {audit['audited_at']} "
               f"(violations: {audit['violations'] or 'none'}; warnings: {audit['warnings']}; {audit['path']})")
    out = [f"# Dataset card: {c['id']}", "",
           f"Trajectories of the rollstream campaign `{c['url']}`, one Parquet file per policy version "
           f"({card['partitioning']}). Written {card['written_at']}.", "",
           f"- config hash (SHA-256 of campaign.json's config): `{c['config_hash']}`",
           f"- code version `{c['code_version']}`, shard schema {c['schema_version']}",
           f"- audit: {verdict}",
           f"- totals: {card['totals']['rows']} rows from {card['totals']['shards']} shards in "
           f"{card['totals']['versions']} versions", ""]
    out += ["## Lineage", ""]
    out += [f"- forked from `{p['url']}` at step {p['step']} (version {p['version']}), changed: "
            + (", ".join(f"{k}={v['fork']!r}" for k, v in p["config_diff"].items()) or "nothing")
            for p in card["lineage"]] or ["- not a fork: the campaign started from scratch"]
    out += ["", "## Versions", "", "| version | rows | shards | file |", "|---|---|---|---|"]
    out += [f"| {v['version']} | {v['rows']} | {v['shards']} | `{v['path']}`"
            f"{' (stale: the campaign has shards since)' if v['stale'] else ''} |" for v in card["versions"]]
    out += ["", "## Schema", "", "| column | type | meaning |", "|---|---|---|"]
    out += [f"| `{f['name']}` | `{f['type']}` | {f['doc'].replace('|', '/')} |" for f in card["schema"]]
    return "\n".join(out) + "\n"


def _newest(out: Store) -> tuple[int, dict[str, Any] | None]:
    """(n of the newest card, -1 for none; its JSON, None when there is none or it does not parse)."""
    found = [(int(m["n"] or 0), name) for name in out.list("") if (m := _CARD_RE.match(name))]
    if not found:
        return -1, None
    n, name = max(found)
    try:
        return n, json.loads(out.read(name))
    except ValueError:
        return n, None


def write_card(store: Store, out: Store, versions: Sequence[dict[str, Any]], schema: pa.Schema, *,
               partition: pa.Field) -> str:
    """Write the export's card into ``out`` unless its newest card says the same; returns the Markdown's name."""
    card = dataset_card(store, versions, schema, partition=partition)
    n, previous = _newest(out)
    name = CARD if n < 0 else f"{CARD}.{n}"
    if previous is None or {**previous, "written_at": None} != {**card, "written_at": None}:
        name = CARD if n < 0 else f"{CARD}.{n + 1}"
        out.create(f"{name}.md", render_card(card).encode())
        out.create(f"{name}.json", json.dumps(card, indent=2).encode())
    return f"{name}.md"


__all__ = ["CARD", "config_hash", "dataset_card", "render_card", "write_card"]
