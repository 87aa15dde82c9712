"""``rollstream view``: one self-contained HTML page for browsing a campaign, written into its folder.

``build_view`` reads the campaign through ``audit.sql.campaign_tables`` and returns a ``View``: summary
numbers (``summary``, pure), the learning-curve PNG and the sampled groups, each trajectory's turns decoded
(``audit.transcript``) by the tokenizer it is given (the campaign's: ``stages.view.campaign_view`` opens it and
the campaign's advantage estimator). ``render_html`` turns that into one page (``audit.page``) with no external
resources (styles, script, data and the PNG are inline), so it opens from a bucket download, a file:// URL or
``--serve`` alike. ``write_view`` commits it create-only as ``view/<utc>/report.html`` next to
``view/<utc>/learning_curve.png``.

The page: the learning curve; reward and staleness distributions per policy version; drop/skip accounting;
a list of trajectories (search their text, filter by env, version, failure kind and reward) whose rows open
their group: each trajectory's turns as text, labelled by role, with tool calls and results set apart, reward,
advantage, stop reason and the policy versions of each generated turn, and every token coloured by loss mask
(policy tokens boxed) and by the policy version that produced it.

Size is bounded: at most ``max_groups`` groups go into the page, sampled evenly across versions (the first
groups of each version in shard order), and the page says how many of how many it shows. Tables are exact
over the whole campaign; only the browsable list is a sample.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
import html
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.dataset as ds

from pipelines_lib.audit.curve import curve_metric, eval_points, learning_curve_png, numeric_fields
from pipelines_lib.audit.page import PAGE
from pipelines_lib.audit.sql import CampaignTables, campaign_tables
from pipelines_lib.audit.transcript import decodes, prompt_text, transcript, vocabulary
from pipelines_lib.model.tokenizer import ChatTokenizer
from pipelines_lib.records import CampaignManifest, with_parents
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store

DEFAULT_MAX_GROUPS = 400
"""Groups embedded in a page. A page costs some tens of bytes per embedded token, decoded text included, plus the
plot and the page's code, so 400 groups of 4 samples of 300 tokens make a page of megabytes, not more."""

VIEW_DIR = "view"

Advantages = Callable[[np.ndarray], np.ndarray]
"""``rewards float[n_groups, group_size] -> advantages float[n_groups, group_size]``: the campaign's estimator."""


@dataclass(frozen=True, kw_only=True)
class View:
    campaign: str
    summary: dict[str, Any]
    """Pure numbers: ``per_version``, ``staleness``, ``accounting``, ``evals`` (see ``summarize``)."""
    groups: list[dict[str, Any]]
    """Sampled groups, each with its trajectories (token columns included)."""
    total_groups: int
    curve_png: bytes
    parent: dict[str, Any] | None = None
    """For a fork: ``campaign.json``'s ``parent`` (URL, step, version, changed settings), shown under the title."""
    tokenizer: dict[str, str] | None = None
    """``{"hash"}`` of the tokenizer the turns were decoded with; None: nothing decoded."""
    tokenizer_note: str = "none given"
    """Why there is no tokenizer, for the page."""
    vocab: dict[int, str] | None = None
    """Each id in the page's tokens -> its own text (the token boxes), when there is a tokenizer."""
    advantage: str | None = None
    """Name of the estimator that gave each trajectory its ``advantage``; None: none computed."""


def sample_groups(group_versions: list[tuple[str, int]], max_groups: int) -> list[str]:
    """Up to ``max_groups`` group ids, spread evenly over versions (round robin, each version in listed order)."""
    if max_groups < 1:
        raise ValueError(f"max_groups must be >= 1, got {max_groups}")
    by_version: dict[int, list[str]] = {}
    for gid, version in group_versions:
        by_version.setdefault(version, []).append(gid)
    queues = [by_version[v] for v in sorted(by_version)]
    out: list[str] = []
    depth = 0
    while len(out) < max_groups and any(depth < len(q) for q in queues):
        out += [q[depth] for q in queues if depth < len(q)][: max_groups - len(out)]
        depth += 1
    return out


SUMMARY_COLUMNS = ["shard", "group_id", "version", "reward", "status"]
"""The columns of ``trajectories`` that ``summarize`` and the group sampling read."""


def summarize(tables: CampaignTables) -> dict[str, Any]:
    """Reward per version, staleness per version, and what was consumed, dropped and skipped."""
    per_version = tables.query("""
        SELECT version, count(*) AS trajectories, count(DISTINCT group_id) AS groups,
               avg(reward) AS mean_reward, avg(CASE WHEN reward > 0 THEN 1 ELSE 0 END) AS success_rate,
               list(reward ORDER BY reward) AS rewards
        FROM trajectories GROUP BY version ORDER BY version""").to_pylist()
    statuses = tables.query("SELECT status, count(*) AS n FROM trajectories GROUP BY 1 ORDER BY 2 DESC").to_pylist()
    staleness = tables.query("""
        SELECT version, staleness, count(*) AS groups FROM consumed GROUP BY 1, 2 ORDER BY 1, 2""").to_pylist()
    train = tables.query("""
        SELECT c.step, avg(t.reward) AS mean_reward FROM consumed c
        JOIN trajectories t ON t.shard = c.shard AND t.group_id = c.group_id GROUP BY 1 ORDER BY 1""").to_pylist()
    dropped = tables.query("SELECT kind, count(*) AS n FROM dropped GROUP BY 1 ORDER BY 1").to_pylist()
    groups_total = tables.query("SELECT count(DISTINCT (shard, group_id)) AS n FROM trajectories").to_pylist()[0]["n"]
    consumed = tables.query("SELECT count(DISTINCT (shard, group_id)) AS n FROM consumed").to_pylist()[0]["n"]
    by_kind = {r["kind"]: r["n"] for r in dropped}
    accounting = {"groups_committed": groups_total, "groups_consumed": consumed,
                  "groups_dropped_stale": by_kind.get("dropped_stale", 0),
                  "shards_skipped_by_trainer": by_kind.get("skipped", 0),
                  "unreadable_shards": tables.tables["skipped_shards"].num_rows}
    return {"per_version": per_version, "statuses": statuses, "staleness": staleness,
            "train_curve": [(r["step"], r["mean_reward"]) for r in train], "accounting": accounting,
            "skipped_shards": tables.skipped}


@dataclass(frozen=True, kw_only=True)
class ViewParts:
    """What the campaign's own parts add to a view: the tokenizer its ids belong to, its advantage estimator."""

    tokenizer: ChatTokenizer | None = None
    tokenizer_note: str = "none given"
    """Why ``tokenizer`` is None, for the page."""
    advantage: str | None = None
    """The estimator's name (``trainer.advantage``)."""
    advantages: Advantages | None = None


def _trajectory_record(r: dict[str, Any], parts: ViewParts) -> dict[str, Any]:
    turns = transcript(r, parts.tokenizer)
    return {
        "trajectory_id": r["trajectory_id"], "sample_idx": r["sample_idx"], "worker_id": r["worker_id"],
        "env": r["env_name"], "task_id": r["task_id"], "reward": r["reward"], "reward_parts": dict(r["reward_parts"]),
        "advantage": None, "status": r["status"], "status_reason": r["status_reason"], "prompt_len": r["prompt_len"],
        "tokens": r["tokens"], "loss_mask": r["loss_mask"], "policy_version": r["policy_version"],
        "logprobs": [round(x, 3) for x in r["logprobs"]], "turns": turns,
        "decoded": decodes(r, parts.tokenizer), "prompt": prompt_text(turns, r["prompt_len"]),
    }


def _add_advantages(groups: list[dict[str, Any]], advantages: Advantages) -> None:
    """Each trajectory's advantage within its (whole) group, one estimator call per group size."""
    by_size: dict[int, list[dict[str, Any]]] = {}
    for g in groups:
        by_size.setdefault(len(g["trajectories"]), []).append(g)
    for same in by_size.values():
        rewards = np.array([[t["reward"] for t in g["trajectories"]] for g in same], np.float32)
        for g, row in zip(same, np.asarray(advantages(rewards)).tolist(), strict=True):
            for t, a in zip(g["trajectories"], row, strict=True):
                t["advantage"] = a


def _group_records(trajectories: ds.Dataset, chosen: list[str], parts: ViewParts) -> list[dict[str, Any]]:
    if not chosen:  # no readable shard: nothing to open
        return []
    keep = set(chosen)
    shards = sorted({k.partition("#")[0] for k in chosen})  # a filter on ``shard`` opens only these files
    rows = [r for r in trajectories.to_table(filter=ds.field("shard").isin(shards)).to_pylist()
            if f"{r['shard']}#{r['group_id']}" in keep]
    groups: dict[str, dict[str, Any]] = {}
    for r in rows:
        key = f"{r['shard']}#{r['group_id']}"
        g = groups.setdefault(key, {"group_id": r["group_id"], "prompt_id": r["prompt_id"], "version": r["version"],
                                    "shard": r["shard"], "env": r["env_name"], "trajectories": []})
        g["trajectories"].append(_trajectory_record(r, parts))
    ordered = [groups[k] for k in chosen if k in groups]
    for g in ordered:
        g["trajectories"].sort(key=lambda t: t["sample_idx"])
    if parts.advantages is not None:
        _add_advantages(ordered, parts.advantages)
    return ordered


def build_view(store: Store, *, max_groups: int = DEFAULT_MAX_GROUPS, progress: Callable[[str], None] | None = None,
               parts: ViewParts | None = None) -> View:
    """The view of the campaign at ``store``; ``parts`` (default: none) decode its turns and give advantages."""
    parts = parts or ViewParts()
    store = with_parents(store)
    tables = campaign_tables(store, progress=progress)
    shard_files = tables.tables["trajectories"]
    # The summary's queries all read these scalar columns: one scan into memory instead of one per query.
    tables = dataclasses.replace(tables, tables={**tables.tables,
                                                 "trajectories": shard_files.to_table(columns=SUMMARY_COLUMNS)})
    summary = summarize(tables)
    evals = eval_points(store)
    metric = curve_metric([r for _, _, r in evals])
    summary["evals"] = [{"version": v, "step": s, "metric": metric, "value": numeric_fields(r).get(metric or "")}
                        for v, s, r in sorted(evals)]
    png = learning_curve_png(summary["train_curve"],
                             [(e["step"], e["value"]) for e in summary["evals"] if e["value"] is not None], metric)
    keys = tables.query("""SELECT shard || '#' || group_id AS k, version FROM trajectories
                           GROUP BY ALL ORDER BY min(shard), k""").to_pylist()
    chosen = sample_groups([(r["k"], r["version"]) for r in keys], max_groups)
    parent = CampaignManifest.read(store).parent if store.exists(CampaignManifest.PATH) else None
    groups = _group_records(shard_files, chosen, parts)
    tok = parts.tokenizer
    return View(campaign=layout.campaign_id(store.url), summary=summary, groups=groups, total_groups=len(keys),
                curve_png=png, parent=None if parent is None else parent.to_dict(),
                tokenizer=None if tok is None else {"hash": tok.tokenizer_hash}, tokenizer_note=parts.tokenizer_note,
                vocab=None if tok is None else vocabulary(tok, (i for g in groups for t in g["trajectories"]
                                                                for i in t["tokens"])),
                advantage=parts.advantage if parts.advantages is not None else None)


def _json_for_script(obj: Any) -> str:
    """JSON safe inside <script>: with no '<' at all, no '</script>' can close the element early and no '<!--'
    can open a comment that swallows the rest of the page ('\\u003c' is the same string to ``JSON.parse``)."""
    return json.dumps(obj, separators=(",", ":"), default=str).replace("<", "\\u003c")


def render_html(view: View) -> str:
    data = {"campaign": view.campaign, "summary": view.summary, "groups": view.groups,
            "total_groups": view.total_groups, "parent": view.parent, "tokenizer": view.tokenizer,
            "tokenizer_note": view.tokenizer_note, "vocab": view.vocab, "advantage": view.advantage}
    png = base64.b64encode(view.curve_png).decode()
    return (PAGE.replace("__TITLE__", html.escape(f"rollstream: {view.campaign}"))
            .replace("__PNG__", png).replace("__DATA__", _json_for_script(data)))


def write_view(store: Store, view: View, *, now: dt.datetime | None = None) -> str:
    """Commit ``view/<utc>/report.html`` and ``learning_curve.png`` (create-only); returns the report's path."""
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%S.%fZ")
    folder = f"{VIEW_DIR}/{stamp}"
    store.create(f"{folder}/learning_curve.png", view.curve_png)
    store.create(f"{folder}/report.html", render_html(view).encode())
    return f"{folder}/report.html"


def serve(page: str, *, port: int, announce: Callable[[str], None]) -> None:
    """Serve ``page`` at http://127.0.0.1:``port``/ until interrupted (loopback only: campaigns are private)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = page.encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the http.server hook's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
            pass

    with ThreadingHTTPServer(("127.0.0.1", port), Handler) as server:
        announce(f"serving on http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)")
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
