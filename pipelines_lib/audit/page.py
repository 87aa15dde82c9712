"""The viewer's page: one HTML document whose styles and script are inline, filled in by ``view.render_html``.

``__TITLE__``, ``__PNG__`` (the learning curve, base64) and ``__DATA__`` (the ``View`` as JSON) are replaced.
The script builds everything from that data: the summary tables; a list of trajectories (50 a page) searchable
by text (prompt, task, group and every decoded turn) and filtered by environment, group policy version, failure
kind (the trajectory's status: ``ok``, any failure, or one status) and a reward range; and, for a clicked row,
its whole group, each trajectory's turns decoded, labelled by role, tool calls and tool results set apart, with
reward, advantage, stop reason and the policy versions of each generated turn. Every turn also keeps its tokens
(one box each, boxed when they carry loss, coloured by the policy version that produced them).
"""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}
td.prompt{max-width:32em;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.bar{display:inline-block;height:10px;background:#4a90d9;vertical-align:middle}
#trajectories tbody tr{cursor:pointer}#trajectories tbody tr:hover{background:#eef5ff}
.tok{display:inline-block;font:12px monospace;padding:0 2px;margin:1px;border-radius:2px;background:#eee;color:#555;
white-space:pre}
.tok.loss{border:1px solid #222;color:#000}
.turn{border-left:4px solid #999;margin:.4em 0;padding:.2em .6em}
.turn.assistant{border-color:#2a7}.turn.tool{border-color:#d80;background:#fff8ee}
.turn.user,.turn.system{border-color:#58c}
.role{font-weight:600;margin-right:.6em}
pre.text{white-space:pre-wrap;font:13px/1.45 monospace;margin:.3em 0}
.part.markup{color:#aaa}
.part.tool_call{background:#e6f4ea;border:1px solid #2a7;border-radius:3px}
.part.tool_call::before{content:"tool call ";font:600 11px system-ui;color:#2a7}
.part.tool_result{background:#fdf0dc;border:1px solid #d80;border-radius:3px}
.part.tool_result::before{content:"tool result ";font:600 11px system-ui;color:#b60}
.err{color:#b00}.meta{color:#666;font-size:12px}
.traj{border:1px solid #ddd;margin:.6em 0;padding:.4em .8em}.traj.focus{border:2px solid #4a90d9}
</style></head><body>
<h1 id="title"></h1><p id="overview" class="meta"></p>
<h2>Learning curve</h2><img id="curve" alt="learning curve" src="data:image/png;base64,__PNG__">
<div id="evals"></div>
<h2>Reward per policy version</h2><div id="per-version"></div>
<h2>Staleness of consumed groups per version</h2><div id="staleness"></div>
<h2>Drops and skips</h2><div id="accounting"></div>
<h2>Trajectories</h2>
<p>search <input id="q" placeholder="text, prompt or task id"> env <select id="env"><option value="">any</option></select>
version <select id="version"><option value="">any</option></select>
failure <select id="kind"><option value="">any</option><option value="ok">none (ok)</option>
<option value="failed">any failure</option></select>
reward <input id="rmin" type="number" step="any" placeholder="min" size="5"> to
<input id="rmax" type="number" step="any" placeholder="max" size="5"> <span id="shown" class="meta"></span></p>
<table id="trajectories"><thead><tr><th class="l">trajectory</th><th class="l">env</th><th class="l">prompt</th>
<th>version</th><th>reward</th><th>advantage</th><th class="l">stop</th><th>turns</th></tr></thead><tbody></tbody></table>
<p><button id="prev">previous</button> <span id="page"></span> <button id="next">next</button></p>
<div id="detail"></div>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const S = D.summary, PAGE = 50, VOCAB = D.vocab || {};
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
const T = D.groups.flatMap(g => g.trajectories.map(t => Object.assign(t, {group: g})));
T.forEach(t => { t.search = [t.group.group_id, t.group.prompt_id, t.task_id, t.prompt,
  ...t.turns.flatMap(u => (u.parts || []).map(p => p[1]))].join("\\n").toLowerCase(); });
const undecoded = T.filter(t => !t.decoded).length;
document.getElementById("title").textContent = `Campaign ${D.campaign}` +
  (D.parent ? ` (forked from ${D.parent.url} at step ${D.parent.step}, version ${D.parent.version})` : "");
document.getElementById("overview").textContent =
  `${S.accounting.groups_committed} groups committed; the list below shows ${T.length} trajectories of ` +
  `${D.groups.length} of ${D.total_groups} groups` +
  (D.groups.length < D.total_groups ? " (sampled evenly across versions)" : "") + ". " +
  (D.tokenizer ? `Text decoded with the campaign's tokenizer (${D.tokenizer.hash.slice(0, 12)})` +
    (undecoded ? `; ${undecoded} trajectories recorded with another tokenizer show token ids` : "") + "."
    : `No tokenizer (${D.tokenizer_note}): turns show token ids.`) +
  (D.advantage ? ` Advantages: ${D.advantage} over each group.` : " No advantage estimator: advantages not shown.");
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
const $ = id => document.getElementById(id);
const options = (sel, values) => values.forEach(v => sel.append(el("option", {value: v, text: v})));
options($("env"), [...new Set(T.map(t => t.env))].sort());
options($("version"), [...new Set(T.map(t => t.group.version))].sort((a, b) => a - b));
options($("kind"), [...new Set(T.map(t => t.status))].filter(s => s !== "ok").sort());
let page = 0;
function filtered() {
  const q = $("q").value.toLowerCase(), env = $("env").value, v = $("version").value, kind = $("kind").value;
  const lo = $("rmin").value === "" ? -Infinity : Number($("rmin").value);
  const hi = $("rmax").value === "" ? Infinity : Number($("rmax").value);
  return T.filter(t => t.search.includes(q) && (!env || t.env === env) && (v === "" || String(t.group.version) === v) &&
    (!kind || (kind === "failed" ? t.status !== "ok" : t.status === kind)) && t.reward >= lo && t.reward <= hi);
}
function versionColour(v) { return v < 0 ? "#eee" : `hsl(${(v * 47) % 360},70%,82%)`; }
const piece = id => id in VOCAB ? VOCAB[id].replace(/\\n/g, "\\u21b5") : String(id);
function tokens(t, start, end) {
  const div = el("div");
  for (let i = start; i < end; i++) {
    const s = el("span", {class: t.loss_mask[i] ? "tok loss" : "tok", "data-i": i, "data-id": t.tokens[i],
      "data-mask": t.loss_mask[i], "data-version": t.policy_version[i],
      title: `#${i} id ${t.tokens[i]} version ${t.policy_version[i]} logprob ${t.logprobs[i]}`, text: piece(t.tokens[i])});
    if (t.loss_mask[i]) s.style.background = versionColour(t.policy_version[i]);
    div.append(s);
  }
  return div;
}
const versions = vs => vs.length ? (vs[0] === vs[1] ? `policy v${vs[0]}` : `policy v${vs[0]}\\u2013v${vs[1]}`) : "";
const ENDED = {stop: "ended by its stop token", cut: "cut by a length limit"};
function turnBox(t, u) {
  const label = u.role === "tool" ? `tool result${u.tool_name ? " \\u2190 " + u.tool_name : ""}` : u.role;
  const meta = [versions(u.versions), u.latency_s != null ? `${fmt(u.latency_s)} s` : "", ENDED[u.ended] || "",
    `tokens ${u.start}\\u2013${u.end}`].filter(Boolean).join(" \\u00b7 ");
  const box = el("div", {class: `turn ${u.role}`, "data-role": u.role},
    el("div", {}, el("span", {class: "role", text: label}), el("span", {class: "meta", text: meta})));
  if (u.error) box.append(el("div", {class: "err", text: `error: ${u.error}`}));
  const toks = el("details", {class: "tokens"}, el("summary", {class: "meta", text: "tokens"}), tokens(t, u.start, u.end));
  if (u.parts) box.append(el("pre", {class: "text"}, ...u.parts.map(([k, s]) => el("span", {class: `part ${k}`, text: s}))));
  else toks.open = true;
  box.append(toks);
  return box;
}
function openGroup(g, focus) {
  const d = $("detail"); d.replaceChildren();
  d.append(el("h2", {text: `Group ${g.group_id}`}),
    el("p", {class: "meta", text: `prompt ${g.prompt_id} \\u00b7 version ${g.version} \\u00b7 ${g.shard} \\u00b7 env ${g.env}`}));
  let focused = null;
  for (const t of g.trajectories) {
    const box = el("div", {class: t.trajectory_id === focus ? "traj focus" : "traj", "data-trajectory": t.trajectory_id});
    const parts = Object.entries(t.reward_parts).map(([k, v]) => `${k}=${fmt(v)}`).join(", ");
    const stop = t.status + (t.status_reason ? `: ${t.status_reason}` : "");
    box.append(el("h3", {class: "head", text: `sample ${t.sample_idx}: reward ${fmt(t.reward)} (${parts || "no parts"})` +
        (t.advantage != null ? ` \\u00b7 advantage ${fmt(t.advantage)}` : "") + ` \\u00b7 stop: ${stop}`}),
      el("p", {class: "meta", text: `${t.trajectory_id} \\u00b7 worker ${t.worker_id} \\u00b7 task ${t.task_id} \\u00b7 ` +
        `${t.tokens.length} tokens, prompt ${t.prompt_len}` + (t.decoded ? "" : " \\u00b7 not decoded: token ids")}));
    t.turns.forEach(u => box.append(turnBox(t, u)));
    d.append(box);
    if (t.trajectory_id === focus) focused = box;
  }
  (focused || d).scrollIntoView();
}
function render() {
  const rows = filtered(), pages = Math.max(1, Math.ceil(rows.length / PAGE));
  page = Math.min(page, pages - 1);
  const body = document.querySelector("#trajectories tbody"); body.replaceChildren();
  rows.slice(page * PAGE, (page + 1) * PAGE).forEach(t => {
    const tr = el("tr", {"data-trajectory": t.trajectory_id, "data-group": t.group.group_id});
    [[`${t.group.group_id} #${t.sample_idx}`, "l"], [t.env, "l"], [t.prompt || t.group.prompt_id, "l prompt"],
     [t.group.version, ""], [fmt(t.reward), ""], [t.advantage == null ? "" : fmt(t.advantage), ""],
     [t.status, "l"], [t.turns.length, ""]]
      .forEach(([v, c]) => tr.append(el("td", {class: c, text: v})));
    tr.addEventListener("click", () => openGroup(t.group, t.trajectory_id));
    body.append(tr);
  });
  $("page").textContent = `page ${page + 1} of ${pages}`;
  $("shown").textContent = `${rows.length} trajectories match`;
}
$("prev").addEventListener("click", () => { page = Math.max(0, page - 1); render(); });
$("next").addEventListener("click", () => { page += 1; render(); });
// "input" on the text boxes: their "change" fires on blur, i.e. when a row is clicked, and re-rendering then
// would swallow that click.
[["q", "input"], ["rmin", "input"], ["rmax", "input"], ["env", "change"], ["version", "change"], ["kind", "change"]]
  .forEach(([id, ev]) => $(id).addEventListener(ev, () => { page = 0; render(); }));
render();
</script></body></html>
"""
