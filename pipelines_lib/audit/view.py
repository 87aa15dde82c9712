"""``rollstream view``: one self-contained HTML page for browsing a campaign, written into its folder.

``build_view`` reads the campaign through ``audit.sql.campaign_tables`` and returns a ``View``: summary
numbers (``summary``, pure), the learning-curve PNG and the sampled groups. ``render_html`` turns that into
one page with no external resources (styles, script, data and the PNG are inline), so it opens from a bucket
download, a file:// URL or ``--serve`` alike. ``write_view`` commits it create-only as
``view/<utc>/report.html`` next to ``view/<utc>/learning_curve.png``.

The page: the learning curve; reward and staleness distributions per policy version; drop/skip accounting;
a list of groups (search by prompt id, filter by status and version) whose rows open into their trajectories,
each turn with its role, tool, latency and error, and every token coloured by loss mask (policy tokens boxed)
and by the policy version that produced it.

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

import pyarrow.dataset as ds

from pipelines_lib.audit.curve import curve_metric, eval_points, learning_curve_png, numeric_fields
from pipelines_lib.audit.sql import CampaignTables, campaign_tables
from pipelines_lib.records import CampaignManifest, with_parents
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store

DEFAULT_MAX_GROUPS = 400
"""Groups embedded in a page. A page costs about 30 bytes per embedded token (the demo campaign: 345 KB for 240
trajectories, 10,105 tokens, plot included), so 400 groups of 4 samples of 300 tokens make about 14 MB."""

VIEW_DIR = "view"


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


def _group_records(trajectories: ds.Dataset, chosen: list[str]) -> list[dict[str, Any]]:
    keep = set(chosen)
    shards = sorted({k.partition("#")[0] for k in chosen})  # a filter on ``shard`` opens only these files
    rows = [r for r in trajectories.to_table(filter=ds.field("shard").isin(shards)).to_pylist()
            if f"{r['shard']}#{r['group_id']}" in keep]
    groups: dict[str, dict[str, Any]] = {}
    for r in rows:
        key = f"{r['shard']}#{r['group_id']}"
        g = groups.setdefault(key, {"group_id": r["group_id"], "prompt_id": r["prompt_id"], "version": r["version"],
                                    "shard": r["shard"], "env": r["env_name"], "trajectories": []})
        g["trajectories"].append({
            "trajectory_id": r["trajectory_id"], "sample_idx": r["sample_idx"], "worker_id": r["worker_id"],
            "reward": r["reward"], "reward_parts": dict(r["reward_parts"]), "status": r["status"],
            "prompt_len": r["prompt_len"], "tokens": r["tokens"], "loss_mask": r["loss_mask"],
            "policy_version": r["policy_version"], "logprobs": [round(x, 3) for x in r["logprobs"]],
            "turns": r["turns"],
        })
    ordered = [groups[k] for k in chosen if k in groups]
    for g in ordered:
        g["trajectories"].sort(key=lambda t: t["sample_idx"])
        g["mean_reward"] = sum(t["reward"] for t in g["trajectories"]) / len(g["trajectories"])
        g["statuses"] = sorted({t["status"] for t in g["trajectories"]})
    return ordered


def build_view(store: Store, *, max_groups: int = DEFAULT_MAX_GROUPS,
               progress: Callable[[str], None] | None = None) -> View:
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
    return View(campaign=layout.campaign_id(store.url), summary=summary,
                groups=_group_records(shard_files, chosen), total_groups=len(keys), curve_png=png,
                parent=None if parent is None else parent.to_dict())


def _json_for_script(obj: Any) -> str:
    """JSON safe inside <script>: no '</' can close the element early."""
    return json.dumps(obj, separators=(",", ":"), default=str).replace("</", "<\\/")


def render_html(view: View) -> str:
    data = {"campaign": view.campaign, "summary": view.summary, "groups": view.groups,
            "total_groups": view.total_groups, "parent": view.parent}
    png = base64.b64encode(view.curve_png).decode()
    return (_PAGE.replace("__TITLE__", html.escape(f"rollstream: {view.campaign}"))
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


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}
.bar{display:inline-block;height:10px;background:#4a90d9;vertical-align:middle}
#groups tbody tr{cursor:pointer}#groups tbody tr:hover{background:#eef5ff}
.tok{display:inline-block;font:12px monospace;padding:0 2px;margin:1px;border-radius:2px;background:#eee;color:#555}
.tok.loss{border:1px solid #222;color:#000}
.turn{border-left:4px solid #999;margin:.4em 0;padding:.2em .6em}
.turn.assistant{border-color:#2a7}.turn.tool{border-color:#d80}.turn.user,.turn.system{border-color:#58c}
.err{color:#b00}.meta{color:#666;font-size:12px}
.traj{border:1px solid #ddd;margin:.6em 0;padding:.4em .8em}
</style></head><body>
<h1 id="title"></h1><p id="overview" class="meta"></p>
<h2>Learning curve</h2><img id="curve" alt="learning curve" src="data:image/png;base64,__PNG__">
<div id="evals"></div>
<h2>Reward per policy version</h2><div id="per-version"></div>
<h2>Staleness of consumed groups per version</h2><div id="staleness"></div>
<h2>Drops and skips</h2><div id="accounting"></div>
<h2>Groups</h2>
<p>prompt <input id="q" placeholder="search prompt id"> status <select id="status"><option value="">any</option></select>
version <select id="version"><option value="">any</option></select> <span id="shown" class="meta"></span></p>
<table id="groups"><thead><tr><th class="l">group</th><th class="l">prompt</th><th>version</th><th>samples</th>
<th>mean reward</th><th class="l">statuses</th></tr></thead><tbody></tbody></table>
<p><button id="prev">previous</button> <span id="page"></span> <button id="next">next</button></p>
<div id="detail"></div>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const S = D.summary, PAGE = 50;
const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) { if (k === "text") e.textContent = v; else e.setAttribute(k, v); }
  for (const k of kids) e.append(k);
  return e;
};
const fmt = v => typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toFixed(4)) : String(v ?? "");
function table(rows, cols, left = []) {
  const t = el("table"), h = el("tr");
  cols.forEach(c => h.append(el("th", {class: left.includes(c) ? "l" : "", text: c})));
  t.append(el("thead", {}, h));
  const b = el("tbody");
  rows.forEach(r => { const tr = el("tr"); cols.forEach(c => tr.append(el("td", {class: left.includes(c) ? "l" : ""},
    r[c] instanceof Node ? r[c] : fmt(r[c])))); b.append(tr); });
  t.append(b);
  return t;
}
const bar = (n, max) => el("span", {class: "bar", style: `width:${Math.round(120 * n / Math.max(max, 1))}px`});
document.getElementById("title").textContent = `Campaign ${D.campaign}` +
  (D.parent ? ` (forked from ${D.parent.url} at step ${D.parent.step}, version ${D.parent.version})` : "");
document.getElementById("overview").textContent =
  `${S.accounting.groups_committed} groups committed; the list below shows ${D.groups.length} of ${D.total_groups}` +
  (D.groups.length < D.total_groups ? " (sampled evenly across versions)" : "");
if (S.evals.length) document.getElementById("evals").append(table(S.evals, ["version", "step", "metric", "value"], ["metric"]));
function histogram(rewards) {
  const bins = new Map(); rewards.forEach(r => bins.set(fmt(r), (bins.get(fmt(r)) || 0) + 1));
  const max = Math.max(...bins.values()), span = el("span");
  [...bins.entries()].slice(0, 8).forEach(([k, n]) => span.append(el("span", {class: "meta", text: ` ${k}: `}), bar(n, max), ` ${n}`));
  return span;
}
document.getElementById("per-version").append(table(S.per_version.map(r => ({...r, "reward distribution": histogram(r.rewards)})),
  ["version", "groups", "trajectories", "mean_reward", "success_rate", "reward distribution"], ["reward distribution"]));
const maxStale = Math.max(1, ...S.staleness.map(r => r.groups));
document.getElementById("staleness").append(table(S.staleness.map(r => ({...r, "": bar(r.groups, maxStale)})),
  ["version", "staleness", "groups", ""], [""]));
document.getElementById("accounting").append(table(Object.entries(S.accounting).map(([k, v]) => ({what: k, count: v})),
  ["what", "count"], ["what"]));
if (S.skipped_shards.length) document.getElementById("accounting").append(
  table(S.skipped_shards.map(([s, r]) => ({shard: s, reason: r})), ["shard", "reason"], ["shard", "reason"]));
const statusSel = document.getElementById("status"), versionSel = document.getElementById("version");
[...new Set(D.groups.flatMap(g => g.statuses))].sort().forEach(s => statusSel.append(el("option", {value: s, text: s})));
[...new Set(D.groups.map(g => g.version))].sort((a, b) => a - b).forEach(v => versionSel.append(el("option", {value: v, text: v})));
let page = 0;
function filtered() {
  const q = document.getElementById("q").value.toLowerCase(), st = statusSel.value, v = versionSel.value;
  return D.groups.filter(g => g.prompt_id.toLowerCase().includes(q) && (!st || g.statuses.includes(st)) &&
    (v === "" || String(g.version) === v));
}
function versionColour(v) { return v < 0 ? "#eee" : `hsl(${(v * 47) % 360},70%,82%)`; }
function tokens(t, start, end) {
  const div = el("div");
  for (let i = start; i < end; i++) {
    const s = el("span", {class: t.loss_mask[i] ? "tok loss" : "tok", "data-i": i, "data-mask": t.loss_mask[i],
      "data-version": t.policy_version[i], title: `#${i} version ${t.policy_version[i]} logprob ${t.logprobs[i]}`,
      text: t.tokens[i]});
    if (t.loss_mask[i]) s.style.background = versionColour(t.policy_version[i]);
    div.append(s);
  }
  return div;
}
function openGroup(g) {
  const d = document.getElementById("detail"); d.replaceChildren();
  d.append(el("h2", {text: `Group ${g.group_id}`}),
    el("p", {class: "meta", text: `prompt ${g.prompt_id} · version ${g.version} · ${g.shard} · env ${g.env}`}));
  for (const t of g.trajectories) {
    const box = el("div", {class: "traj", "data-trajectory": t.trajectory_id});
    const parts = Object.entries(t.reward_parts).map(([k, v]) => `${k}=${fmt(v)}`).join(", ");
    box.append(el("h3", {text: `sample ${t.sample_idx}: reward ${fmt(t.reward)} (${parts || "no parts"}) · ${t.status}`}),
      el("p", {class: "meta", text: `${t.trajectory_id} · worker ${t.worker_id} · ${t.tokens.length} tokens, prompt ${t.prompt_len}`}));
    const turns = t.turns.length ? t.turns : [{role: "sequence", start: 0, end: t.tokens.length}];
    for (const u of turns) {
      const head = `${u.role}${u.tool_name ? " → " + u.tool_name : ""}` +
        (u.latency_s != null ? ` · ${fmt(u.latency_s)} s` : "") + ` · tokens ${u.start}–${u.end}`;
      const turn = el("div", {class: `turn ${u.role}`}, el("div", {class: "meta", text: head}));
      if (u.error) turn.append(el("div", {class: "err", text: `error: ${u.error}`}));
      turn.append(tokens(t, u.start, u.end));
      box.append(turn);
    }
    d.append(box);
  }
}
function render() {
  const rows = filtered(), pages = Math.max(1, Math.ceil(rows.length / PAGE));
  page = Math.min(page, pages - 1);
  const body = document.querySelector("#groups tbody"); body.replaceChildren();
  rows.slice(page * PAGE, (page + 1) * PAGE).forEach(g => {
    const tr = el("tr", {"data-group": g.group_id});
    [g.group_id, g.prompt_id, g.version, g.trajectories.length, fmt(g.mean_reward), g.statuses.join(", ")]
      .forEach((v, i) => tr.append(el("td", {class: i < 2 || i === 5 ? "l" : "", text: v})));
    tr.addEventListener("click", () => openGroup(g));
    body.append(tr);
  });
  document.getElementById("page").textContent = `page ${page + 1} of ${pages}`;
  document.getElementById("shown").textContent = `${rows.length} groups match`;
}
document.getElementById("prev").addEventListener("click", () => { page = Math.max(0, page - 1); render(); });
document.getElementById("next").addEventListener("click", () => { page += 1; render(); });
// "input" only on the search box: its "change" fires on blur, i.e. when a row is clicked, and re-rendering
// then would swallow that click.
[[document.getElementById("q"), "input"], [statusSel, "change"], [versionSel, "change"]]
  .forEach(([x, ev]) => x.addEventListener(ev, () => { page = 0; render(); }));
render();
</script></body></html>
"""
