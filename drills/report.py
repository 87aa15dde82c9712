"""``RELIABILITY.md``: rendered from the last full drill's record (``bench/reliability.json``, written by
``drills.runner``): a table of every figure with how it was measured, then a section per drill's details.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from drills.bounds import BOUNDS_MEASURED, render_bounds_section
from drills.storage_faults import FAULT_MEASURED, render_fault_section

REPORT = Path("RELIABILITY.md")


def _cell(text: str, limit: int = 160) -> str:
    """One Markdown table cell: no line breaks, pipes escaped, bounded length."""
    return " ".join(str(text).split())[:limit].replace("|", "\\|")


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.4g}"


MEASURED = {
    "reliability.kill_drills": "SIGKILLs delivered: trainer ({trainer_kills}) + trainer while publishing "
                               "({publish_kills}) + rollout worker ({rollout_kills}) + evaluator ({evaluator_kills}), "
                               "each at a seeded random moment after the process reported progress.",
    "reliability.publish_kills": "Trainer SIGKILLs armed when storage showed a publication in flight (newest "
                                 "`weights/v<N>/` without its marker, or LATEST behind it), 0-0.05 s later.",
    "reliability.publish_kills_mid_publish": "Publish kills that left a publication unfinished (unmarked newest "
                                             "folder, or LATEST not yet moved): the kill landed inside it.",
    "reliability.evaluator_kills": "Evaluator SIGKILLs, each at a uniform moment in the first 80 % of an "
                                   "uninterrupted evaluation (weight load, compile, episodes).",
    "reliability.evaluator_results_identical": "1 when the evaluation that finished after the kills equals an "
                                               "uninterrupted one of the same version on a copy in every field but "
                                               "`wall_s` (greedy and seeded sampled episodes; same machine).",
    "reliability.evaluator_recover_s": "Seconds from the last evaluator kill to the restarted evaluation's commit "
                                       "of `eval/v<N>.json` (it starts over: there is nothing to resume).",
    "reliability.lost_groups": "Rollout: groups in shards whose commit a killed-and-restarted worker had "
                               "acknowledged (its `committed` log line) that are no longer readable; trainer: 1 if "
                               "fewer groups were trained than the fixed shards hold.",
    "reliability.duplicated_groups": "Group ids committed more than once by the logical rollout worker across its "
                                     "restarts, plus groups named by two trainer consumption logs.",
    "reliability.partial_visible": "Non-hidden objects (shards, JSON/JSONL) in the killed campaigns that fail to "
                                   "read after the kills (hidden `.tmp-` temporaries are allowed and counted apart); "
                                   "plus, checked after every trainer kill, weights versions that LATEST names or "
                                   "that carry a marker but do not load, and evaluator `eval/v<N>.json` files "
                                   "present but incomplete.",
    "reliability.trainer_bit_identical": "1 when both killed trainers' (random-moment and publish-moment) final "
                                         "parameters equal an uninterrupted run's on a copy of the same shards, bit "
                                         "for bit.",
    **FAULT_MEASURED,
    **BOUNDS_MEASURED,
    "reliability.fuzz_cases": "Hypothesis cases over 6 entry points ({fuzz_examples} each): tool-call parsers, "
                              "calculator, YAML config, shards (+ tailer), dataset files, the operator's commands "
                              "on damaged campaigns.",
    "reliability.fuzz_crashes": "Cases where an entry point raised an undocumented exception, an error without the "
                                "file/key in its message, (calculator) took over 1 s, or (a command) printed a "
                                "traceback.",
    "reliability.sandbox_escapes": "Catalogue attempts not contained: a connection reached the loopback server, "
                                   "a file outside was read/changed/created, the parent's credential appeared, the "
                                   "attempt's own success signal appeared, or processes (any carrying the drill's "
                                   "marker, wherever reparented) / folders were left behind.",
    "reliability.sandbox_caps_exceeded": "Catalogue attempts on a resource cap that got past it: a write into a "
                                         "hidden folder's mask or past the work dir's size, SysV IPC or memfd "
                                         "memory granted, processes or threads past max_processes, a sandbox init "
                                         "without the program's limits.",
    "reliability.sandbox_attempts": "Attempts in the escape catalogue, through the python tool with the default "
                                    "isolation backend; most (hook_off_*) attack the containment mechanism itself.",
    "reliability.infra_errors_in_gradient": "Trained groups (consumption logs) holding a trajectory whose sandbox "
                                            "or dependency failed past its retry budget: sandbox start failures and "
                                            "dependency timeouts injected into real arithmetic episodes (real "
                                            "agent, episode runner and calculator), a real trainer over the shards.",
    "reliability.infra_faults_injected": "Infrastructure faults raised in the infra drill's episodes (retried ones "
                                         "included); a third of its groups outlast the budget, a third recover.",
    "reliability.infra_groups_not_skipped": "Groups with an infra_error trajectory that no consumption log skips "
                                            "with an infrastructure-failure reason.",
    "reliability.trainer_poison_cases": "Poisoned-shard cases, each a real trainer (tiny decoder) run to its last "
                                        "step over a real campaign folder holding valid shards and one poisoned "
                                        "shard: wrong group size, row over the largest bucket, 20 M-token row "
                                        "declared in a small file, out-of-vocabulary and negative ids, a 3e38 "
                                        "reward, unpublished policy version, interleaved groups, copies (same folder, other version, "
                                        "re-encoded), FIFO and symlink-out named like a shard.",
    "reliability.trainer_poison_crashes": "Poisoned-shard cases where the trainer raised, did not finish, trained a "
                                          "poisoned group or a group twice, left a poisoned group out of its "
                                          "consumption logs' `skipped` entries, or the audit did not report it.",
    "reliability.readpath_cases": "Read-path cases on a real trainer: a shard over one read bound (provenance "
                                  "nested 100,000 deep, group_size 2^31-1, a 6 GiB sparse file, 20,000 rows) planted "
                                  "again before each of two restarts, then audit, export and SQL scan; a consumed "
                                  "shard rewritten (log with and without digests) and a diverging step, restarted.",
    "reliability.readpath_crashes": "Read-path cases where a run raised, the trainer did not finish, a planted shard "
                                    "was not named with its bound by the trainer's logs, the audit, the export or the "
                                    "SQL scan, a valid group was lost, or a restart over damage did not refuse "
                                    "naming the step.",
    "reliability.nonfinite_publications": "Published versions, in the read-path replay cases, whose step logged a "
                                          "non-finite loss or gradient norm or whose parameters are not all finite.",
    "reliability.pointer_cases": "Junk entries planted beside `weights/LATEST` at v2: `latest.json`, `zzz.json`, a "
                                 "name disagreeing with its version, negative or string version, non-JSON, non-object, "
                                 "FIFO, symlink out of the campaign.",
    "reliability.pointer_regressions": "Pointer cases where LATEST read as anything but v2, the next advance did not "
                                       "take, or the audit did not report the entry.",
    "reliability.cli_cases": "`rollstream` subprocess runs over garbage metadata (eval, consumption-log, checkpoint "
                             "and pointer names, truncated and malformed telemetry lines, a foreign file in the export "
                             "folder) and over folders that are no campaign (`file:///etc`, `\"\"`), plus the URL "
                             "and timeout cases of other drills.",
    "reliability.cli_tracebacks": "Of those runs: a traceback, an exit code other than documented (audits of a "
                                  "non-campaign: 2 with `not a campaign`) or no end within the deadline.",
    "reliability.hang_cases": "Runs with a FIFO and a character device named like a shard, a FIFO as pointer entry "
                              "and as telemetry file: `audit`, `export`, `status`, `metrics` and the tailer, each a "
                              "subprocess with a 120 s deadline (plus other drills' deadline cases).",
    "reliability.hangs": "Of those runs: still running at the deadline (killed), or failed.",
    "reliability.operator_write_cases": "`rollstream` subprocess runs that aim a write into the campaign they read "
                                        "(trace --out, sql COPY/ATTACH/INSTALL/read_csv, export, fork, replay --dump, "
                                        "export-weights) or fork past its last step.",
    "reliability.operator_overwrites": "Files of the campaign changed or removed by those runs (every file hashed "
                                       "before and after, hidden ones too).",
    "reliability.operator_files_added": "Files that appeared in the campaign folder during those runs.",
    "reliability.operator_write_failures": "Of those runs: not refused with exit 2 and its one-line reason, a "
                                           "traceback, a hang, a host file printed, or the folder changed.",
    "reliability.secret_leaks": "(secret, file) pairs where a planted fake credential appears in the campaign "
                                "folder, trace, audit report or captured logs (Arrow files searched decoded).",
}


def render_report(record: dict[str, Any]) -> str:
    """RELIABILITY.md from the last full drill's record (pure)."""
    figures, details, sizes, run = record["figures"], record["details"], record["sizes"], record["run"]
    m = run["machine"]
    out = ["# Reliability", "",
           "Generated by `rollstream drills` (`make drills`) from `bench/reliability.json`, the last **full** drill; "
           "do not edit by hand. `rollstream drills --quick` runs the same drills smaller and only updates "
           "`bench/results.json`.", "",
           f"**Last full drill.** {run['date']}, {run['seconds']:.0f} s; {m.get('cpus')} CPUs, {m.get('memory_gb')} GiB, "
           f"load {m.get('load_1min')}, Python {m.get('python')}.", "",
           *[line for r in record.get("reruns", []) for line in (  # a paragraph each
               f"**Rerun since.** {r['date']}: {', '.join(r['drills'])}, full sizes; load "
               f"{r['machine'].get('load_1min')}. Their figures and sections below are from that run.", "")],
           "| figure | value | how it was measured |", "|---|---|---|"]
    for key in sorted(figures):
        how = MEASURED.get(key, "")
        if "resume_gap" in key:
            how = ("Seconds from a SIGKILL to the restarted process's next trained step (trainer; publish: after "
                   "replaying and re-publishing the killed step) / next committed shard (rollout) / `started` line "
                   "(evaluator: process start and imports): process start, imports, restore, compile (from the "
                   "persistent cache).")
        out.append(f"| `{key}` | {_fmt(figures[key])} | {how.format(**sizes)} |")
    out.append("")
    if "fuzz" in details:
        out += ["## Fuzzing", "", "| target | cases | crashes | first crash |", "|---|---|---|---|"]
        for name, t in details["fuzz"].items():
            if isinstance(t, dict) and "cases" in t:
                first = _cell(t["examples"][0]) if t["examples"] else ""
                out.append(f"| {name} | {t['cases']} | {t['crashes']} | {first} |")
        out.append("")
    if "sandbox" in details:
        sb = details["sandbox"]
        out += ["## Sandbox escape catalogue", ""]
        if "date" in sb:
            out += [f"Run on its own, full size, {sb['date']}.", ""]
        if "isolation" in sb:
            out += [f"Isolation backend in use: {sb['isolation']}. Attempts named `hook_off_*` first neutralise the "
                    "audit hook (through the garbage collector or the frame of the error it raised); only the OS "
                    "isolation stands between them and the host.", ""]
        out += ["| attempt | contained | seconds | problems |", "|---|---|---|---|"]
        out += [f"| {a['name']} | {'yes' if a['contained'] else '**NO**'} | {a['seconds']} | "
                f"{_cell('; '.join(a['problems']), 300)} |" for a in details["sandbox"]["attempts"]]
        out.append("")
    if "kills" in details:
        k = details["kills"]
        out += ["## Kill drills", ""]
        for name, label in (("trainer", "Trainer"), ("publish", "Trainer, killed while publishing")):
            t = k[name]
            out.append(f"- {label}: {t['kills']} kills over {t['starts']} starts, {t['steps']} steps, "
                       f"{t['groups_trained']} groups trained, {t['trained_twice']} twice, bit-identical: "
                       f"{t['bit_identical']}, where the kills landed in a publication: {dict(Counter(t['landed']))}, unloadable "
                       f"versions {t['unloadable']}, resume gaps (s): {t['resume_gaps_s']}.")
        r, e = k["rollout"], k["evaluator"]
        out += [f"- Rollout worker: {r['kills']} kills over {r['starts']} starts, {r['groups_committed']} groups "
                f"committed ({r['acknowledged_groups']} acknowledged before a kill or exit), lost {r['lost']}, "
                f"duplicated {r['duplicated']}, partial visible {r['partial_visible']}, hidden orphans "
                f"{r['orphans']}, resume gaps (s): {r['resume_gaps_s']}.",
                f"- Evaluator (v{e['version']}): {e['kills']} kills over {e['starts']} starts, `eval/v<N>.json` after "
                f"each kill: {dict(Counter(e['eval_file_after_kill']))}, results identical to an uninterrupted evaluation: "
                f"{e['results_identical']} (greedy: {e['greedy_identical']}), uninterrupted {e['reference_s']} s, "
                f"recovered {e['recover_s']} s after the last kill, resume gaps (s): {e['resume_gaps_s']}.", ""]
    for drill, title, groups in (("poison", "Poisoned data and junk metadata", ("poison", "pointers", "metadata", "fifos")),
                                 ("readpath", "Read bounds and checked replays", ("bounds", "replays"))):
        if drill not in details:
            continue
        out += [f"## {title}", "", "| catalogue | case | held | seconds | problems |", "|---|---|---|---|---|"]
        for group in groups:
            out += [f"| {group} | {c['name']} | {'yes' if c['ok'] else '**NO**'} | {c['seconds']} | "
                    f"{_cell('; '.join(c['problems']), 300)} |" for c in details[drill][group]]
        out.append("")
    if "writes" in details:
        out += ["## Operator writes into a campaign", "", "| case | held | seconds | what it said | problems |",
                "|---|---|---|---|---|"]
        out += [f"| {c['outcome']['name']} | {'yes' if c['outcome']['ok'] else '**NO**'} | {c['outcome']['seconds']} | "
                f"{_cell(c['outcome']['detail'])} | {_cell('; '.join(c['outcome']['problems']), 300)} |"
                for c in details["writes"]["cases"]]
        out.append("")
    if "faults" in details:
        out += render_fault_section(details["faults"])
    if "cases" in details.get("bounds", {}):
        out += render_bounds_section(details["bounds"])
    return "\n".join(out).rstrip() + "\n"


__all__ = ["MEASURED", "REPORT", "render_report"]
