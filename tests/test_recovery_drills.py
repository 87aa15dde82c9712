"""Recovery drill: a campaign loses its trainer, a rollout worker and an evaluation, then ``recover`` ends it.

The stages run as separate processes, the way deployment runs do (one stage flow per process, all reporting to
one Prefect API), so the kills are real SIGKILLs of the processes doing the work:

1. init, prep and the warm start (v0) run here; rollout workers 0 and 1 and the trainer start as subprocesses
   (``flows.stages`` flows).
2. **Worker 0 dies mid-shard.** It is SIGKILLed the moment it logs its first commit. "Mid-shard" means: groups
   this life of the worker has started are in no committed shard yet (episodes running, or finished and buffered
   in its ``ShardWriter``). That is certain here: the orchestrator fills all ``max_concurrency / group_size`` = 8
   group slots at start, the engine's 8 slots finish at most 2 groups per decode step, and the kill comes within
   milliseconds of the first commit; the test checks afterwards that this life committed fewer than 8 groups.
3. **The trainer dies mid-campaign**, SIGKILLed as it logs step 3 of 4: checkpoint 2 and v1 are committed, step 3
   is only in its consumption log (the write-ahead log), so the restart must restore step 2 and replay step 3.
4. The campaign reacts as ``flows.campaign`` does to a failed trainer: a stop request; worker 1 exits cleanly.
5. **The evaluation task fails once.** v0 is evaluated; the evaluation of v1 runs while its weights object is
   unreadable (a storage fault scoped to one object: the folder is moved aside, then put back) and ends Failed,
   leaving its failed-run record and no ``eval/v1``.
6. ``flows.recover`` runs collect, train, evaluate and audit: workers restart and skip what they committed, the
   trainer resumes from checkpoint 2, evaluation fills v1 and v2 only, and the audit is clean.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from drills.supervisor import ROOT, KillDrill
from pipelines_lib.config import CampaignConfig
from pipelines_lib.records import AuditRecord, run_records
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.codec import read_shard

DRILL_RUN = {"rollout.max_concurrency": 32, "rollout.max_groups_per_version": 8}
"""The smoke preset, with 8 group slots per worker over the engine's 8 sequence slots, and a
budget of 8 groups per worker and version (the trainer uses 4 per version; more only compete for the 2 cores)."""
GROUP_SLOTS = 32 // 4

_COLLECT = ("import sys; from flows.commands import flow_logging; from flows.stages import collect_flow; "
            "flow_logging(True); "  # the per-shard commit lines the drill reads are detail (DEBUG) lines
            "collect_flow(sys.argv[1], worker_index=int(sys.argv[2]), num_workers=2)")
_TRAIN = "import sys; from flows.stages import train_flow; train_flow(sys.argv[1])"
_COMMITTED = re.compile(r"rollout (?P<wid>rollout0\.\w+): committed (?P<path>\S+) \((?P<n>\d+) groups")


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _killed_once(argv: list[str], ready: str) -> KillDrill:
    """Start ``argv`` and SIGKILL it as soon as a line matches ``ready``; no restart (recovery restarts it)."""
    drill = KillDrill(argv=lambda: argv, ready=re.compile(ready), done=lambda: bool(drill.records), kills=1,
                      max_delay_s=0.0, start_timeout_s=300.0)
    return drill


def _shard_groups(store: Store) -> dict[str, list[str]]:
    """Shard path -> its group ids, over the whole campaign."""
    out = {}
    for vdir in store.list(layout.TRAJECTORIES):
        for name in store.list(f"{layout.TRAJECTORIES}/{vdir}"):
            path = f"{layout.TRAJECTORIES}/{vdir}/{name}"
            out[path] = read_shard(store, path)[0].column("group_id").unique().to_pylist()
    return out


@pytest.mark.slow
def test_recover_finishes_a_campaign_after_killed_trainer_and_worker_and_a_failed_evaluation(
        prefect_api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.recover import recover
    from flows.stages import evaluate_flow, prep_flow, warm_start_flow
    from pipelines_lib.stages.campaign import campaign_status
    from pipelines_lib.stages.collect import request_stop
    from tasks.init import init_campaign

    monkeypatch.setenv("PREFECT_API_URL", prefect_api)  # the stage subprocesses report to this test's API
    url = str(tmp_path / "drilled")
    init_campaign.fn(url, CampaignConfig.preset("smoke").with_overrides(DRILL_RUN).to_dict())
    prep_flow(url)
    warm_start_flow(url)
    store = Store(url)

    # -- 1-4: rollout workers and the trainer as processes; two of them killed ---------------------------------
    worker0 = _killed_once([sys.executable, "-c", _COLLECT, url, "0"], _COMMITTED.pattern)
    trainer = _killed_once([sys.executable, "-c", _TRAIN, url], r"trainer: step 3/4 ")
    with open(tmp_path / "worker1.log", "w") as log1:
        worker1 = subprocess.Popen([sys.executable, "-c", _COLLECT, url, "1"], cwd=ROOT, stdout=log1,
                                   stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        errors: list[BaseException] = []

        def supervise(drill: KillDrill) -> None:
            try:
                drill.run()
            except Exception as e:  # reported by the test thread below
                errors.append(e)

        threads = [threading.Thread(target=supervise, args=(d,)) for d in (worker0, trainer)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=900)
        try:
            assert not errors and not any(t.is_alive() for t in threads), errors
        finally:
            request_stop(store, "drill: the trainer was killed")  # what the campaign flow does on a failed trainer
            assert worker1.wait(timeout=300) == 0, (tmp_path / "worker1.log").read_text()[-3000:]

    # The worker died mid-shard: its life committed some groups, fewer than the group slots it had filled.
    acknowledged = [m for _, line in worker0.lines if (m := _COMMITTED.search(line))]
    killed_life = acknowledged[0]["wid"]
    shards_before = _shard_groups(store)
    killed_groups = [g for p, gs in shards_before.items() if p.rsplit("/", 1)[-1].startswith(killed_life)
                     for g in gs]
    assert 0 < len(killed_groups) < GROUP_SLOTS, killed_groups
    assert all(m["path"] in shards_before for m in acknowledged)  # nothing it acknowledged is lost
    worker0_groups_before = sum(len(gs) for p, gs in shards_before.items() if "/rollout0." in p)
    # The trainer died after logging step 3, with checkpoint 2 (and v1) committed.
    before = campaign_status(store)
    assert (before["train_steps"], before["train_done"], before["published_versions"]) == (3, False, [0, 1])
    assert before["latest_checkpoint"].rsplit("/", 1)[-1].startswith("00000002")
    logs_before = {n: store.read(f"train/consumed/{n}") for n in store.list("train/consumed")}

    # -- 5: the evaluation of v1 fails once ---------------------------------------------------------------------
    assert evaluate_flow(url, version=0)["version"] == 0
    weights = store.local_path(layout.weights_dir(1))
    hidden = weights.with_name(".unavailable-" + weights.name)
    weights.rename(hidden)
    try:
        failed = evaluate_flow(url, version=1, return_state=True)
    finally:
        hidden.rename(weights)
    assert failed.is_failed()
    (record,) = [r for r in run_records(store) if r.key == "evaluate-v00000001" and r.state == "failed"]
    assert "weights/v00000001" in (record.error or "")  # it failed for the injected reason
    assert campaign_status(store)["missing_eval"] == [1]

    # -- 6: recover ---------------------------------------------------------------------------------------------
    lines = _Lines()
    logging.getLogger("prefect").addHandler(lines)
    try:
        result = recover(url, poll_s=1.0)
    finally:
        logging.getLogger("prefect").removeHandler(lines)
    assert result["plan"] == ["collect", "train", "evaluate", "audit"] and result["train"]["steps"] == 4
    # the trainer resumed: restored checkpoint 2, replayed logged step 3, trained step 4 only
    assert any(re.search(r"trainer: restored checkpoint \S+ \(step 2, version 1\)", s) for s in lines.lines), lines.lines
    assert any("trainer: replayed 1 logged step(s) after the checkpoint; now at step 3" in s for s in lines.lines)
    consumed = store.list("train/consumed")
    assert consumed == [f"{s:08d}.json" for s in (1, 2, 3, 4)]
    assert {n: store.read(f"train/consumed/{n}") for n in consumed[:3]} == logs_before  # kept, not rewritten
    # the rollout workers continued: worker 0's restart skipped every group its earlier lives committed
    collect = {c["worker"]: c for c in result["collect"]}
    assert collect["rollout0"]["skipped_done_groups"] == worker0_groups_before
    # evaluation filled the gaps only
    assert sorted(result["evaluate"]) == [1, 2]
    after = campaign_status(store)
    assert after["train_done"] and after["published_versions"] == [0, 1, 2] and after["evaluated_versions"] == [0, 1, 2]
    assert after["todo"] == []  # the recovery's audit covered the data as it now stands
    # no lost and no duplicated groups: the audit accounts for every committed group exactly once
    assert result["audit"]["ok"], result["audit"]
    report = AuditRecord.at(store, result["audit"]["report"]).report
    accounting = report["lineage"]["accounting"]
    assert accounting["unusable"] == 0 and accounting["consumed"] == 4 * 2
    assert sum(accounting.values()) == report["groups"]
    group_ids = [g for gs in _shard_groups(store).values() for g in gs]
    assert not [g for g, n in Counter(group_ids).items() if n > 1]  # a restart never redid a committed group
    print(f"\nrecovery drill: worker 0 killed with {len(killed_groups)} of its {GROUP_SLOTS} started groups "
          f"committed; trainer killed at step 3 (checkpoint 2), resumed to step 4; groups {accounting}")
