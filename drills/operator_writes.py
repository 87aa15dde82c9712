"""Operator writes aimed into the campaign they read: every one refused, the folder byte for byte as it was.

Each case runs one ``rollstream`` command as a real subprocess (``poison._cli``, under its deadline) against its
own copy of a small campaign (``campaign.json`` of the tiny preset, two shards, three consumption logs, a telemetry file), with
its destination inside that campaign, or a query that reaches past the campaign's tables:

| case | command |
|---|---|
| ``trace_over_campaign_json``, ``trace_overwrite_into_campaign`` | ``trace C --out C/campaign.json [--overwrite]`` |
| ``sql_copy_over_campaign_json``, ``sql_copy_forges_a_consumption_log`` | ``sql C "COPY ... TO 'C/...'"`` |
| ``sql_attach_creates_a_database``, ``sql_reads_a_host_file``, ``sql_installs_an_extension`` | ``ATTACH``, ``read_csv_auto('/etc/passwd')``, ``INSTALL httpfs`` |
| ``export_into_campaign``, ``export_onto_campaign`` | ``export C C/out``, ``export C C`` |
| ``fork_into_campaign``, ``fork_beyond_the_last_step`` | ``fork C --from-step 1 C/fork``, ``--from-step 10**30`` (once a hang) |
| ``replay_dump_into_campaign``, ``export_weights_into_campaign`` | ``replay C --step 1 --dump C/train``, ``export-weights C C/hf`` |

A case holds when the command exits 2 with its one-line reason, no traceback, nothing of the host file in its
output, and the campaign folder (every file, hidden ones included) unchanged. Figures:
``reliability.operator_overwrites`` (files of the campaign changed or removed), ``reliability.operator_files_added``
(files that appeared in it) and ``reliability.operator_write_failures`` (cases that did not hold, for any reason).
The commands run with ``HOME`` in the drill's scratch folder, so an extension install that got through would land
there, not in the user's home.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from drills.poison import CaseOutcome, _cli

FAR_STEP = str(10**30)
CASES: dict[str, tuple[list[str], str]] = {
    "trace_over_campaign_json": (["trace", "{c}", "--out", "{c}/campaign.json"], "inside the campaign"),
    "trace_overwrite_into_campaign": (["trace", "{c}", "--out", "{c}/campaign.json", "--overwrite"],
                                      "inside the campaign"),
    "sql_copy_over_campaign_json": (["sql", "{c}", "COPY (SELECT 1 AS x) TO '{c}/campaign.json' (FORMAT json)"],
                                    "refused"),
    "sql_copy_forges_a_consumption_log": (["sql", "{c}", "COPY (SELECT 99 AS step) TO "
                                                         "'{c}/train/consumed/00000099.json' (FORMAT json)"], "refused"),
    "sql_attach_creates_a_database": (["sql", "{c}", "ATTACH '{c}/attached.duckdb' AS x"], "refused"),
    "sql_reads_a_host_file": (["sql", "{c}", "SELECT * FROM read_csv_auto('/etc/passwd')"], "refused"),
    "sql_installs_an_extension": (["sql", "{c}", "INSTALL httpfs"], "refused"),
    "export_into_campaign": (["export", "{c}", "{c}/out"], "inside the campaign"),
    "export_onto_campaign": (["export", "{c}", "{c}"], "inside the campaign"),
    "fork_into_campaign": (["fork", "{c}", "--from-step", "1", "{c}/fork"], "inside the campaign"),
    "fork_beyond_the_last_step": (["fork", "{c}", "--from-step", FAR_STEP, "{scratch}/fork"], "its last is step 3"),
    "replay_dump_into_campaign": (["replay", "{c}", "--step", "1", "--dump", "{c}/train"], "inside the campaign"),
    "export_weights_into_campaign": (["export-weights", "{c}", "{c}/hf"], "inside the campaign"),
}
"""Case -> (``rollstream`` arguments, text its error line must hold); ``{c}`` is the campaign, ``{scratch}`` beside it."""


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones too; a symlink by its target) -> a digest of what it holds."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if path.is_symlink():
            out[rel] = f"link:{os.readlink(path)}"
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def seed_campaign(root: Path) -> Path:
    """A tiny-preset campaign: two shards of one group, consumption logs of steps 1-3, a telemetry file."""
    from harness.fixtures import consumption_log
    from pipelines_lib import telemetry
    from pipelines_lib.config import CampaignConfig
    from pipelines_lib.stages.campaign import init_campaign
    from pipelines_lib.storage.store import Store
    from pipelines_lib.trajectory.channel import WriterConfig
    from pipelines_lib.trajectory.folder import FolderChannel
    from pipelines_lib.trajectory.synthetic import synthetic_group

    store = Store(str(root / "campaign"))
    config = CampaignConfig.tiny()
    init_campaign(store, config)
    writer = FolderChannel(store).writer("w0", WriterConfig(max_groups=1))
    for i in range(2):
        writer.add_group(synthetic_group(prompt_id=f"p{i}", group_size=4, worker_id="w0", policy_version=0, seed=i,
                                         vocab_size=config.model.vocab_size, max_len=40))
    writer.flush()
    for step in (1, 2, 3):
        consumption_log(step).write(store)
    with telemetry.recording(store, "trainer", sample_every_s=None), telemetry.span("train_step", track="trainer"):
        pass
    return root / "campaign"


@dataclass(frozen=True, kw_only=True)
class WriteCase:
    outcome: CaseOutcome
    changed: tuple[str, ...] = ()
    """Files of the campaign whose bytes changed or that were removed."""
    added: tuple[str, ...] = ()


def run_case(name: str, pristine: Path, scratch: Path) -> WriteCase:
    """``name`` against a copy of the campaign ``pristine`` in ``scratch``."""
    args, expect = CASES[name]
    campaign = scratch / "campaign"
    shutil.copytree(pristine, campaign, symlinks=True)
    before = snapshot(campaign)
    t0 = time.perf_counter()
    (scratch / "home").mkdir(exist_ok=True)
    rc, out = _cli([a.replace("{c}", str(campaign)).replace("{scratch}", str(scratch)) for a in args],
                   HOME=str(scratch / "home"))
    after = snapshot(campaign)
    changed = tuple(sorted(k for k in before if after.get(k) != before[k]))
    added = tuple(sorted(set(after) - set(before)))
    problems = [f"{len(changed)} file(s) changed or removed: {list(changed)[:3]}"] if changed else []
    problems += [f"{len(added)} file(s) added: {list(added)[:3]}"] if added else []
    if rc is None:
        problems.append("still running at the deadline (hang)")
    elif "Traceback (most recent call last)" in out:
        problems.append("printed a traceback")
    elif rc != 2 or expect not in out:
        problems.append(f"exit {rc}, expected 2 with {expect!r}")
    if "root:" in out:
        problems.append("printed the host's /etc/passwd")
    detail = out.strip().splitlines()[-1][:200] if out.strip() else ""
    return WriteCase(outcome=CaseOutcome(name=name, ok=not problems, seconds=round(time.perf_counter() - t0, 2),
                                         problems=tuple(problems), detail=detail), changed=changed, added=added)


@dataclass(frozen=True, kw_only=True)
class WritesReport:
    cases: list[WriteCase] = field(default_factory=list)

    def figures(self) -> dict[str, float]:
        return {"reliability.operator_write_cases": float(len(self.cases)),
                "reliability.operator_overwrites": float(sum(len(c.changed) for c in self.cases)),
                "reliability.operator_files_added": float(sum(len(c.added) for c in self.cases)),
                "reliability.operator_write_failures": float(sum(not c.outcome.ok for c in self.cases))}


def run_writes_drill(scratch: Path, progress: Callable[[str], None] = print,
                     names: list[str] | None = None) -> WritesReport:
    pristine = seed_campaign(scratch)
    cases = []
    for name in CASES:
        if names is None or name in names:
            (scratch / name).mkdir()
            cases.append(run_case(name, pristine, scratch / name))
    progress(f"operator write cases: {sum(c.outcome.ok for c in cases)}/{len(cases)} refused with nothing changed")
    return WritesReport(cases=cases)


__all__ = ["CASES", "WriteCase", "WritesReport", "run_case", "run_writes_drill", "seed_campaign", "snapshot"]
