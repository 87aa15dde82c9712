"""The audit finds every planted kind of damage, passes a clean campaign, and accounts lineage exactly.

The base campaign (``_base``) is small enough to count by hand: workers w0 and w1 each commit one shard at
version 0 and one at version 1, each shard holding two groups of two trajectories: 4 shards, 8 groups,
16 trajectories. Damage is planted as extra shards or consumption logs so each test shows one kind.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
import time
from collections.abc import Callable

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from pipelines_lib.audit import AuditReport, audit_campaign, pool
from pipelines_lib.audit.export import TIMESTAMPS, export_parquet
from pipelines_lib.audit.lineage import CommittedGroup, eta_bounds, reconcile
from pipelines_lib.audit.stats import summarize
from pipelines_lib.config import CampaignConfig
from pipelines_lib.records import (
    CampaignManifest,
    ConsumedGroup,
    ConsumptionLog,
    DroppedStale,
    EvalResult,
    ForkParent,
    Publication,
)
from pipelines_lib.storage import layout
from pipelines_lib.storage.errors import NotFoundError
from pipelines_lib.storage.store import TEMP_MARKER, Store
from pipelines_lib.trajectory.channel import ShardInfo, WriterConfig
from pipelines_lib.trajectory.codec import encode_shard
from pipelines_lib.trajectory.record import Turn, to_table
from pipelines_lib.trajectory.schema import SCHEMA_VERSION, SCHEMA_VERSION_KEY, TRAJECTORY_SCHEMA
from pipelines_lib.trajectory.synthetic import synthetic_group
from pipelines_lib.trajectory.validate import validate_table, validate_tables
from pipelines_lib.trajectory.writer import ShardWriter

PLANTED = "trajectories/v00000000/bad-00000000.arrow"


def _group(pid: str, version: int, worker: str) -> list:
    return synthetic_group(prompt_id=pid, group_size=2, worker_id=worker, policy_version=version, seed=3)


def _manifest(store: Store, config: CampaignConfig | None = None) -> None:
    """A ``campaign.json``; without a config the audit skips the trainer's checks (group size, η etc.)."""
    CampaignManifest(kind="campaign" if config else "test", schema_version=SCHEMA_VERSION, code_version="test",
                     created_at="t", config=config.to_dict() if config else {}).write(store)


def _base(store: Store, config: CampaignConfig | None = None) -> list[ShardInfo]:
    _manifest(store, config)
    infos = []
    for worker in ("w0", "w1"):
        w = ShardWriter(store, worker_id=worker, config=WriterConfig(max_groups=2))
        for version in (0, 1):
            for g in range(2):
                infos += w.add_group(_group(f"{worker}-v{version}-p{g}", version, worker))
    return infos


def _bad_table(edit: Callable[[list[dict]], None]) -> pa.Table:
    rows = to_table(_group("planted", 0, "bad")).to_pylist()
    edit(rows)
    return pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA)


def _first_tool_token(row: dict) -> int:
    return next(t["start"] for t in row["turns"] if t["role"] == "tool")


def _loss_on_tool_token(rows: list[dict]) -> None:
    t = _first_tool_token(rows[1])
    rows[1]["loss_mask"][t] = 1
    rows[1]["logprobs"][t] = -0.5


def _no_version_under_loss(rows: list[dict]) -> None:
    t = rows[1]["prompt_len"]  # the first generated token
    rows[1]["policy_version"][t] = -1


def _turn_out_of_range(rows: list[dict]) -> None:
    rows[0]["turns"][-1]["end"] += 5


def _shorter_logprobs(rows: list[dict]) -> None:
    rows[1]["logprobs"] = rows[1]["logprobs"][:-1]


def _future_version_bytes() -> bytes:
    table = to_table(_group("planted", 0, "bad")).replace_schema_metadata({SCHEMA_VERSION_KEY: b"9.0"})
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, table.schema) as f:
        f.write_table(table)
    return sink.getvalue()


SHARD_DAMAGE = {
    "length_mismatch": (lambda: encode_shard(_bad_table(_shorter_logprobs), {}), 1, "logprobs="),
    "loss_on_non_policy_token": (lambda: encode_shard(_bad_table(_loss_on_tool_token), {}), 1,
                                 "loss_mask=1 but policy_version=-1"),
    "policy_version_minus_one_under_loss": (lambda: encode_shard(_bad_table(_no_version_under_loss), {}), 1,
                                            "loss_mask=1 but policy_version=-1"),
    "turn_out_of_range": (lambda: encode_shard(_bad_table(_turn_out_of_range), {}), 0, "does not continue"),
    "incomplete_group": (lambda: encode_shard(_bad_table(lambda rows: rows.pop()), {}), 0, "sample_idx [0]"),
}
KIND_OF = {"length_mismatch": "length_mismatch", "loss_on_non_policy_token": "policy_version",
           "policy_version_minus_one_under_loss": "policy_version", "turn_out_of_range": "turns",
           "incomplete_group": "incomplete_group"}


@pytest.mark.parametrize("damage", sorted(SHARD_DAMAGE))
def test_audit_reports_invariant_violations_with_shard_and_row(store: Store, damage: str) -> None:
    _base(store)
    make, row, text = SHARD_DAMAGE[damage]
    store.create(PLANTED, make())
    report = audit_campaign(store)
    assert not report.ok
    assert report.violation_counts == {KIND_OF[damage]: 1}
    [finding] = report.violations
    assert (finding.path, finding.row) == (PLANTED, row) and text in finding.message
    assert report.shards == 5 and report.bad_files == ()


FILE_DAMAGE = {
    "unreadable": (lambda: b"this is not arrow", "not an Arrow IPC file"),
    "truncated": (lambda: encode_shard(to_table(_group("p", 0, "bad")), {})[:-100], "not an Arrow IPC file"),
    "foreign_schema": (lambda: encode_shard(pa.table({"x": [1, 2]}), {}), "not a rollstream shard"),
    "schema_version": (_future_version_bytes, "schema version 9.0 is not readable"),
}


@pytest.mark.parametrize("damage", sorted(FILE_DAMAGE))
def test_audit_reports_files_that_are_not_readable_shards(store: Store, damage: str) -> None:
    _base(store)
    make, text = FILE_DAMAGE[damage]
    store.create(PLANTED, make())
    report = audit_campaign(store)
    assert not report.ok and report.violation_counts == {}
    [bad] = report.bad_files
    assert bad.path == PLANTED and text in bad.reason
    assert bad.kind == ("unreadable" if damage == "truncated" else damage)
    assert report.shards == 4 and report.trajectories == 16


def test_audit_counts_schema_versions_seen_including_unreadable_ones(local_store: Store) -> None:
    _base(local_store)
    local_store.create(PLANTED, _future_version_bytes())
    local_store.create("trajectories/v00000000/bad-00000001.arrow", encode_shard(pa.table({"x": [1]}), {}))
    assert audit_campaign(local_store).schema_versions == {SCHEMA_VERSION: 4, "9.0": 1, "none": 1}


def test_audit_reports_foreign_names_under_trajectories(store: Store) -> None:
    _base(store)
    store.create("trajectories/v00000000/notes.txt", b"hello")
    store.create("trajectories/old/w0-00000000.arrow", b"")
    report = audit_campaign(store)
    assert not report.ok
    assert [(b.path, b.kind) for b in report.bad_files] == [
        ("trajectories/old/w0-00000000.arrow", "foreign_name"), ("trajectories/v00000000/notes.txt", "foreign_name")]


def test_orphaned_temporaries_are_a_warning_not_a_failure(store: Store) -> None:
    _base(store)
    orphans = [f"trajectories/v00000000/.w0-00000009.arrow{TEMP_MARKER}0123456789ab",
               f"weights/.LATEST.json{TEMP_MARKER}deadbeef0000"]
    for path in orphans:
        store.create(path, b"partial")
    report = audit_campaign(store)
    assert report.ok and report.bad_files == ()
    assert report.orphaned_temporaries == tuple(sorted(orphans))
    assert "2 orphaned temporary" in report.warnings[0] and "orphaned temporary" in report.render_text()


def test_a_trajectory_committed_in_two_shards_is_a_duplicate(local_store: Store) -> None:
    _base(local_store)
    again = ShardWriter(local_store, worker_id="w0", config=WriterConfig(max_groups=1), first_seq=7)
    again.add_group(_group("w0-v0-p0", 0, "w0"))
    report = audit_campaign(local_store)
    assert not report.ok and report.violation_counts == {"duplicate_trajectory": 2}
    assert "also committed in trajectories/v00000000/w0-00000000-2.arrow row 0" in report.violations[0].message


def _log(step: int, version: int, groups: list[tuple[ShardInfo, int]], dropped: list[tuple[ShardInfo, int]] = (),
         published: int | None = None) -> ConsumptionLog:
    return ConsumptionLog(
        step=step, trainer_version=version,
        groups=[ConsumedGroup(group_id=s.group_ids[i], shard=s.path, row_start=2 * i, row_end=2 * i + 2,
                              version=s.version, staleness=version - s.version) for s, i in groups],
        dropped_stale=[DroppedStale(shard=s.path, groups=[s.group_ids[i]], reason="too stale") for s, i in dropped],
        published_version=published, created_at="2026-12-02T00:00:00+00:00",
    )


def _clean_lineage(store: Store, infos: list[ShardInfo]) -> None:
    """Steps 1-2 train version 0 on w0's v0 shard; step 3, at version 1, takes one of w1's v0 groups (stale by 1)
    and drops the other; v1's four groups stay pending."""
    w0v0, w0v1, w1v0, w1v1 = sorted(infos, key=lambda i: i.path.rsplit("/", 1)[-1])
    assert (w0v0.version, w1v0.worker_id) == (0, "w1")
    _log(1, 0, [(w0v0, 0)]).write(store)
    _log(2, 0, [(w0v0, 1)], published=1).write(store)
    _log(3, 1, [(w1v0, 0)], dropped=[(w1v0, 1)], published=2).write(store)
    for version, step in ((0, 0), (1, 2), (2, 3)):
        published = Publication(version=version, path=layout.weights_dir(version), step=step,
                                published_at=f"t{version}")
        published.write(store)  # the weights folder's marker, as publish writes it before the pointer moves
        published.advance(store)


def test_a_clean_campaign_passes_with_counts_distributions_and_lineage(store: Store) -> None:
    infos = _base(store)
    _clean_lineage(store, infos)
    EvalResult(version=2, split="heldout", temperature=1.0, tasks=2, k=1, greedy={}, greedy_success_rate=0.5,
               pass_at_k=None, wall_s=1.0, generated_tokens=8).write(store)
    lines: list[str] = []
    report = audit_campaign(store, progress=lines.append, progress_every=3)
    assert report.ok, report.render_text()
    assert (report.shards, report.groups, report.trajectories) == (4, 8, 16)
    assert {v: (c.shards, c.trajectories, c.groups) for v, c in report.by_version.items()} == {0: (2, 8, 4), 1: (2, 8, 4)}
    assert {w: c.shards for w, c in report.by_worker.items()} == {"w0": 2, "w1": 2}
    assert report.schema_versions == {SCHEMA_VERSION: 4}
    assert report.statuses == {"ok": 16} and report.tool_calls == {"calculator": 16} and report.tool_errors == {}
    assert report.turns.count == 16 and report.turns.max == 4.0
    assert report.generated_tokens.max <= report.tokens.max
    assert report.campaign == CampaignManifest.read(store).to_dict() and report.evals == ("eval/v00000002.json",)
    assert [line.split(": ", 1)[1].split(" (")[0] for line in lines] == [
        f"{report.files - 4} objects and 2 trajectory folder(s) listed", "3 shards read",
        "4 shards read in 2 version folder(s)"]  # the version folders' 4 shards are listed in turn

    lin = report.lineage
    assert lin is not None and (lin.consumption_logs, lin.last_step) == (3, 3)
    a = lin.accounting
    assert (a.consumed, a.dropped_stale, a.pending, a.unusable) == (3, 1, 4, 0)
    assert lin.by_version[1].pending == 4
    assert lin.staleness == {0: 2, 1: 1}
    assert [(p.version, p.steps, p.groups, p.prompts, len(p.shards)) for p in lin.published] == [
        (0, (), 0, 0, 0), (1, (1, 2), 2, 2, 1), (2, (3,), 1, 1, 1)]
    assert json.loads(report.to_json())["lineage"]["accounting"]["pending"] == 4
    text = report.render_text()
    assert "verdict: OK" in text and "3 consumed, 1 dropped stale, 4 pending" in text


def test_a_shard_dropped_unopened_accounts_all_its_committed_groups_as_dropped(local_store: Store) -> None:
    w0v0, *_ = sorted(_base(local_store), key=lambda i: i.path)
    ConsumptionLog(step=1, trainer_version=2, created_at="x", groups=[], dropped_stale=[DroppedStale(
        shard=w0v0.path, groups=[], reason="version 0 < window start 1", unread_groups=2)]).write(local_store)
    report = audit_campaign(local_store)
    assert report.ok, report.render_text()
    assert report.lineage.by_version[0].dropped_stale == 2 and report.lineage.accounting.pending == 6


def test_a_shard_whose_name_miscounts_its_groups_is_a_copied_shard(local_store: Store) -> None:
    info, *_ = _base(local_store)
    sid = layout.parse_shard_path(info.path)
    local_store.create(layout.shard_path(sid.version, sid.worker_id, 9, 5), local_store.read(info.path))
    report = audit_campaign(local_store)
    assert report.violation_counts["copied_shard"] == 1
    assert any("its name declares 5 group(s), it holds 2" in f.message for f in report.violations)


def test_audit_flags_a_group_consumed_twice(store: Store) -> None:
    infos = _base(store)
    _clean_lineage(store, infos)
    first = sorted(infos, key=lambda i: i.path)[0]
    _log(4, 1, [(first, 0)]).write(store)
    report = audit_campaign(store)
    assert not report.ok and report.violation_counts == {"consumed_twice": 1}
    [f] = report.violations
    assert f.path == "train/consumed/00000004.json" and "consumed at step 1, consumed at step 4" in f.message


def test_audit_flags_a_consumed_group_that_no_shard_holds(store: Store) -> None:
    _base(store)
    ConsumptionLog(step=1, trainer_version=0, created_at="x", groups=[ConsumedGroup(
        group_id="ghost", shard="trajectories/v00000000/w9-00000000.arrow", row_start=0, row_end=2, version=0,
        staleness=0)]).write(store)
    report = audit_campaign(store)
    assert not report.ok and report.violation_counts == {"consumed_missing": 1}
    assert "group ghost is in no committed shard" in report.violations[0].message


def test_audit_flags_malformed_consumption_logs(local_store: Store) -> None:
    _base(local_store)
    local_store.create(layout.consumed_log(1), b"{not json")
    local_store.create_json(layout.consumed_log(2), {"record_version": 1, "step": 2})
    local_store.create("train/consumed/00000003.arrow", b"")
    report = audit_campaign(local_store)
    assert report.violation_counts == {"bad_consumption_log": 3}
    assert "ConsumptionLog has no field 'trainer_version'" in {f.path: f.message for f in report.violations}[
        layout.consumed_log(2)]


def test_groups_in_invalid_shards_count_as_unusable(local_store: Store) -> None:
    _base(local_store)
    local_store.create(PLANTED, encode_shard(_bad_table(_turn_out_of_range), {}))
    _log(1, 0, []).write(local_store)
    lin = audit_campaign(local_store).lineage
    assert lin is not None and (lin.accounting.pending, lin.accounting.unusable) == (8, 1)


@pytest.mark.parametrize("folder", ["nothing", "not-a-campaign"])
def test_audit_of_a_folder_without_campaign_json_is_not_a_campaign(tmp_path, folder: str) -> None:
    (tmp_path / "not-a-campaign").mkdir()
    (tmp_path / "not-a-campaign" / "passwd").write_text("root:x:0:0")
    with pytest.raises(NotFoundError, match="not a campaign"):
        audit_campaign(Store(str(tmp_path / folder)))


def test_tool_errors_are_counted_by_tool_and_kind(local_store: Store) -> None:
    _manifest(local_store)
    first, second = _group("p", 0, "w0")
    failed = [u if u.role != "tool" else Turn(role="tool", start=u.start, end=u.end, tool_name="python", error="timeout")
              for u in first.turns]
    ShardWriter(local_store, worker_id="w0", config=WriterConfig(max_groups=1)).add_group(
        [dataclasses.replace(first, turns=failed), second])
    report = audit_campaign(local_store)
    assert report.tool_calls == {"calculator": 1, "python": 1}
    assert report.tool_errors == {"python": {"timeout": 1}}


def test_summary_statistics_by_hand() -> None:
    s = summarize(np.array([1.0, 2.0, 3.0, 4.0, 10.0]))
    # p95 sits at position 0.95 * (5 - 1) = 3.8 of the sorted values: 4 + 0.8 * (10 - 4)
    assert (s.count, s.mean, s.p50, s.p95, s.max) == (5, 4.0, 3.0, pytest.approx(4 + 0.8 * 6), 10.0)
    assert summarize(np.empty(0)).mean is None


def test_audit_names_a_group_trained_beyond_eta(local_store: Store) -> None:
    """η = 1 in the config snapshot: step 3 at trainer version 1 takes a v0 group (staleness 1, allowed); a planted
    step 4 at version 2 takes another v0 group: staleness 2 > 1, which the audit must name."""
    infos = _base(local_store, CampaignConfig.tiny().with_overrides({"rollout.group_size": 2, "rollout.eta": 1}))
    _clean_lineage(local_store, infos)
    w0v0, w0v1, w1v0, w1v1 = sorted(infos, key=lambda i: i.path.rsplit("/", 1)[-1])
    _log(4, 2, [(w0v1, 0)]).write(local_store)  # staleness 1: inside the bound
    report = audit_campaign(local_store)
    assert report.ok, report.render_text()
    _log(5, 2, [(w1v0, 1)]).write(local_store)  # dropped at step 3, and now trained at staleness 2
    report = audit_campaign(local_store)
    assert report.violation_counts == {"accounted_twice": 1, "consumed_beyond_eta": 1}
    [f] = [f for f in report.violations if f.kind == "consumed_beyond_eta"]
    assert f.path == layout.consumed_log(5)
    assert f.message == (f"group {w1v0.group_ids[1]} of {w1v0.path} (version 0) trained at version 2: "
                         "staleness 2 > eta 1")


def test_a_fork_holds_the_steps_up_to_its_fork_point_to_the_parents_eta() -> None:
    """Parent η 2, forked at step 3 with η 0: staleness 2 at step 3 is the parent's business and allowed, staleness
    1 at step 4 is the fork's and is not."""
    parent = ForkParent(url="file:///parent", step=3, version=1, config_diff={"rollout.eta": {"parent": 2, "fork": 0}})
    campaign = {"kind": "campaign", "config": {"rollout": {"eta": 0}}}
    findings: list = []
    etas = eta_bounds(campaign, [parent], findings)
    assert etas == [(3, 0), (-1, 2)] and findings == []
    committed = {(f"s{v}", f"g{v}"): CommittedGroup(version=v, prompt_id="p", row_start=0, row_end=2, usable=True)
                 for v in (0, 1)}

    def log(step: int, trainer_version: int, v: int) -> tuple[str, ConsumptionLog]:
        return layout.consumed_log(step), ConsumptionLog(
            step=step, trainer_version=trainer_version, created_at="x", groups=[ConsumedGroup(
                group_id=f"g{v}", shard=f"s{v}", row_start=0, row_end=2, version=v, staleness=trainer_version - v)])

    _, found = reconcile(committed, [log(3, 2, 0), log(4, 2, 1)], [], etas)
    assert [(f.kind, f.path) for f in found] == [("consumed_beyond_eta", layout.consumed_log(4))]
    assert eta_bounds({"kind": "demo", "config": {"eta": 1}}, [], findings) == [] and findings == []


def test_reconcile_without_logs_or_publications_has_no_lineage() -> None:
    committed = {("s", "g"): CommittedGroup(version=0, prompt_id="p", row_start=0, row_end=2, usable=True)}
    assert reconcile(committed, [], []) == (None, [])


def test_export_writes_one_dataset_partitioned_by_version_with_the_same_rows(store: Store, tmp_path) -> None:
    _base(store)
    store.create(PLANTED, b"junk")
    out = Store(str(tmp_path / "export"))
    results = export_parquet(store, out)
    assert [(r.version, r.status, r.rows, r.shards, len(r.skipped)) for r in results] == [
        (0, "written", 8, 2, 1), (1, "written", 8, 2, 0)]
    assert [r.path for r in results] == ["version=0/data.parquet", "version=1/data.parquet"]
    dataset = ds.dataset(out.local_path(), format="parquet", partitioning="hive")
    for version in (0, 1):
        table = dataset.to_table(filter=ds.field("version") == version)
        assert set(table.column("campaign").to_pylist()) == {"c1" if store.url.startswith("gs://") else "campaign"}
        table = table.select(TRAJECTORY_SCHEMA.names)  # the partition key comes back from the path
        expected = pa.concat_tables([
            pa.ipc.open_file(pa.BufferReader(store.read(layout.shard_path(version, w, version, 2))))
            .read_all().select(TRAJECTORY_SCHEMA.names) for w in ("w0", "w1")])
        # The same rows; timings' ISO-8601 start and finish as the timestamps they spell.
        iso = [{**t, **{k: dt.datetime.fromisoformat(t[k]) for k in TIMESTAMPS}}
               for t in expected.column("timings").to_pylist()]
        assert table.drop_columns(["timings"]).to_pylist() == expected.drop_columns(["timings"]).to_pylist()
        assert table.column("timings").to_pylist() == iso
    # DuckDB reads the same partitions, the version from the folder name.
    rows = duckdb.sql(f"SELECT version, count(*) AS n, count(DISTINCT group_id) AS g FROM read_parquet("
                      f"'{out.local_path()}/*/*.parquet', hive_partitioning = true) GROUP BY 1 ORDER BY 1").fetchall()
    assert rows == [(0, 8, 4), (1, 8, 4)]
    # Create-only and idempotent: a rerun writes nothing; a version that gained a shard is reported stale.
    assert [r.status for r in export_parquet(store, out)] == ["unchanged", "unchanged"]
    ShardWriter(store, worker_id="w2", config=WriterConfig(max_groups=1)).add_group(_group("new", 1, "w2"))
    assert [r.status for r in export_parquet(store, out)] == ["unchanged", "stale"]


def _same_report(a: AuditReport, b: AuditReport) -> bool:
    """Equal but for when and how long, and the objects listed (kept per-version results are objects too)."""
    def findings(r: AuditReport) -> dict:
        return {k: v for k, v in r.to_dict().items() if k not in ("audited_at", "seconds", "files")}
    return findings(a) == findings(b)


def test_a_trajectory_committed_in_two_version_folders_is_a_duplicate(local_store: Store) -> None:
    _base(local_store)
    # The same group again, filed under version 1 by a writer of another name (its provenance names the copy).
    ShardWriter(local_store, worker_id="w9", config=WriterConfig(max_groups=1)).add_group(
        [dataclasses.replace(t, policy_version=[1 if v >= 0 else v for v in t.policy_version])
         for t in _group("w0-v0-p0", 0, "w0")])
    report = audit_campaign(local_store)
    dups = [f for f in report.violations if f.kind == "duplicate_trajectory"]
    assert len(dups) == 2  # one per trajectory of the group
    assert all(d.path == "trajectories/v00000001" and "also committed in trajectories/v00000000" in d.message
               for d in dups)


def test_an_audit_on_worker_processes_reports_what_one_process_reports(local_store: Store) -> None:
    infos = _base(local_store)
    _clean_lineage(local_store, infos)
    local_store.create(PLANTED, encode_shard(_bad_table(_loss_on_tool_token), {}))
    one, two = audit_campaign(local_store), audit_campaign(local_store, jobs=2)
    assert _same_report(one, two) and two.shards == 5 and two.violation_counts == {"policy_version": 1}


@pytest.mark.parametrize(("worker", "timeout_s", "said"), [
    ("import sys; sys.stdin.readline(); sys.exit(3)", 60.0, "exited with code 3 while auditing trajectories/v0000000"),
    ("import sys, time; sys.stdin.readline(); time.sleep(60)", 1.0, "did not finish trajectories/v0000000"),
])
def test_an_audit_worker_that_dies_or_hangs_stops_the_audit_naming_its_version_folder(
        local_store: Store, monkeypatch, worker: str, timeout_s: float, said: str) -> None:
    _base(local_store)
    monkeypatch.setattr(pool, "WORKER_COMMAND", ("-c", worker))
    start = time.monotonic()
    with pytest.raises(pool.AuditWorkerError, match=said):
        audit_campaign(local_store, jobs=2, unit_timeout_s=timeout_s)
    assert time.monotonic() - start < 30  # the hung worker was killed, not waited for


@pytest.mark.parametrize(("shards", "cpus", "jobs"), [(0, 8, 1), (40, 8, 1), (pool.SHARDS_PER_WORKER - 1, 8, 1),
                                                    (2 * pool.SHARDS_PER_WORKER, 2, 2), (10**6, 4, 4), (10**6, 1, 1)])
def test_auto_jobs_stays_in_one_process_until_each_worker_has_enough_shards(shards: int, cpus: int, jobs: int) -> None:
    assert pool.auto_jobs(shards, cpus) == jobs


def test_the_default_audit_of_a_small_campaign_starts_no_worker_and_a_large_one_does(local_store: Store,
                                                                                     monkeypatch) -> None:
    _base(local_store)
    monkeypatch.setattr(pool, "WORKER_COMMAND", ("-c", "import sys; sys.exit(3)"))  # any worker started fails
    assert _same_report(audit_campaign(local_store, jobs=None), audit_campaign(local_store))
    monkeypatch.setattr(pool, "SHARDS_PER_WORKER", 1)
    monkeypatch.setattr(pool.os, "cpu_count", lambda: 2)
    with pytest.raises(pool.AuditWorkerError, match="exited with code 3"):
        audit_campaign(local_store, jobs=None)


def test_export_on_worker_processes_writes_the_same_rows_with_small_shards_in_one_row_group(
        local_store: Store, tmp_path) -> None:
    _base(local_store)
    one, two = Store(str(tmp_path / "one")), Store(str(tmp_path / "two"))
    assert export_parquet(local_store, one) == export_parquet(local_store, two, jobs=2)
    for version in (0, 1):
        a, b = (pq.ParquetFile(s.local_path(f"version={version}/data.parquet")) for s in (one, two))
        assert a.read().equals(b.read()) and a.metadata.num_row_groups == 1  # two shards, one row group


def test_an_incremental_audit_reuses_unchanged_version_folders_and_reads_changed_ones(local_store: Store) -> None:
    infos = _base(local_store)
    _clean_lineage(local_store, infos)
    full = audit_campaign(local_store, keep=True)
    assert sorted(local_store.list(layout.AUDIT_VERSIONS)) == sorted(
        n.rsplit("/", 1)[-1] for n in local_store.walk(layout.AUDIT_VERSIONS))
    assert len(local_store.list(layout.AUDIT_VERSIONS)) == 2
    lines: list[str] = []
    again = audit_campaign(local_store, since=2, progress=lines.append)
    assert _same_report(full, again) and "reused the kept results of 2 version folder(s) below 2" in lines[-1]
    # Version 0 gains a shard: its folder is read again, version 1's result is reused; same report as a full audit.
    ShardWriter(local_store, worker_id="w2", config=WriterConfig(max_groups=1)).add_group(_group("new", 0, "w2"))
    lines.clear()
    again = audit_campaign(local_store, since=2, progress=lines.append)
    assert _same_report(audit_campaign(local_store), again) and again.shards == 5
    assert "reused the kept results of 1 version folder(s)" in lines[-1]


def _renamed(rows: list[dict]) -> None:
    for row in rows:
        row["group_id"] = "shared"


def _bad_reward_and_status(rows: list[dict]) -> None:
    rows[0]["reward"] = float("nan")
    rows[1]["status"] = "lost"


def test_shards_validated_together_get_the_findings_each_gets_alone() -> None:
    def damaged(i: int, edit: Callable[[list[dict]], None]) -> pa.Table:
        rows = to_table(_group(f"bad{i}", 0, "w")).to_pylist()  # group ids unique in the batch
        edit(rows)
        return pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA)

    good = [to_table(_group(f"ok{i}", i % 2, "w")) for i in range(3)]
    bad = [damaged(i, edit) for i, edit in enumerate((_loss_on_tool_token, _no_version_under_loss,
                                                      _turn_out_of_range, _shorter_logprobs, _bad_reward_and_status))]
    batch = [good[0], *bad, good[1], good[2]]
    alone = [validate_table(t) for t in batch]
    assert validate_tables(batch) == alone
    assert [bool(v) for v in alone] == [False, True, True, True, True, True, False, False]
    assert {v.kind for v in alone[5]} == {"reward", "status"} and all(v.row is not None for v in alone[5])
    # Shards sharing a group id (a copy), an empty one: each still checked on its own terms.
    shared = [_bad_table(_renamed), _bad_table(_renamed), good[0].slice(0, 0)]
    assert validate_tables(shared) == [validate_table(t) for t in shared] and validate_tables([]) == []
