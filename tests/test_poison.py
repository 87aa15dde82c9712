"""Data the trainer cannot train on is skipped with a reason, never a crash, a silent loss or trained twice; junk
pointer entries never move LATEST; the CLI never prints a traceback over garbage metadata; special files never
hang a reader. Each case of ``drills/poison.py`` runs here on its own, on real parts (the trainer cases on the
tiny decoder over a real campaign folder, the CLI cases as subprocesses)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from drills import poison
from pipelines_lib.audit.export import export_parquet
from pipelines_lib.audit.lineage import CommittedGroup, reconcile
from pipelines_lib.config import CampaignConfig
from pipelines_lib.records import ConsumedGroup, ConsumptionLog, SkippedShard
from pipelines_lib.storage import layout
from pipelines_lib.storage.errors import NotAnObjectError
from pipelines_lib.storage.store import Store
from pipelines_lib.telemetry.trace import read_records
from pipelines_lib.trajectory.codec import (
    ShardError,
    declared_sizes,
    decode_shard,
    encode_shard,
    identity_problem,
    row_budget,
)
from pipelines_lib.trajectory.cursor import TailCursor
from pipelines_lib.trajectory.needs import MAX_DECODED_BYTES, ShardLimits
from pipelines_lib.trajectory.reader import ShardTailer
from pipelines_lib.trajectory.trainable import TrainerNeeds, clean_groups, group_problem, infra_problem
from pipelines_lib.trajectory.window import Window

CASES = {c.name: c for c in poison.POISON}


def _needs(config: CampaignConfig) -> TrainerNeeds:
    """What the campaign's trainer requires of a group (as ``stages.train`` builds it)."""
    return TrainerNeeds.of(group_size=config.rollout.group_size, seq_buckets=config.trainer.seq_buckets,
                           max_seq_len=config.model.max_seq_len, vocab_size=config.model.vocab_size)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_tailer_skips_poison_with_a_reason_and_hands_out_each_group_once(tmp_path: Path, name: str) -> None:
    store, config, poisoned = poison.seed_poison_campaign(tmp_path, CASES[name], publish=False)
    tailer = ShardTailer(store, needs=_needs(config))
    handed = [g.group_id for g in tailer.next_groups(100, Window(version=1, eta=1))]
    skipped = {g for e in tailer.drain_events() if e.kind == "skipped" and e.reason for g in e.groups}
    assert sorted(handed) == [f"g{i}@w0" for i in range(poison.GOOD_GROUPS)]  # every good group, once
    assert set(poisoned) <= skipped and not set(poisoned) & set(handed)
    assert tailer.cursor.shards_skipped + tailer.cursor.groups_skipped >= 1


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_real_trainer_finishes_over_poison_and_logs_the_skip(tmp_path: Path, name: str) -> None:
    outcome = poison.run_poison_case(CASES[name], tmp_path)
    assert outcome.ok, outcome.problems


def test_a_skipped_group_is_in_the_cursor_so_a_resumed_tailer_does_not_skip_it_again(tmp_path: Path) -> None:
    store, config, poisoned = poison.seed_poison_campaign(tmp_path, CASES["group_size_differs"], publish=False)
    first = ShardTailer(store, needs=_needs(config))
    first.next_groups(2, Window(version=0, eta=0))
    assert [e.groups for e in first.drain_events()] == [poisoned]
    resumed = ShardTailer(store, needs=_needs(config), cursor=TailCursor.from_json(first.cursor.to_json()))
    assert len(resumed.next_groups(100, Window(version=1, eta=1))) == poison.GOOD_GROUPS - 2
    assert resumed.drain_events() == [] and resumed.cursor.groups_skipped == 1


def test_group_problem_names_each_reason() -> None:
    needs = TrainerNeeds(group_size=4, max_tokens=64, vocab_size=256)
    good = poison._group("p")
    assert group_problem(good, needs, folder_version=0, newest_version=0) is None
    assert "group_size is 4" in group_problem(poison._group("p", size=3), needs)
    assert "over the 64 the trainer takes" in group_problem(poison._rows(good, lambda r: poison._lengthen(r, 100)), needs)
    assert "outside the vocabulary" in group_problem(good, TrainerNeeds(group_size=4, max_tokens=64, vocab_size=8))
    assert "filed under v00000003" in group_problem(good, needs, folder_version=3)
    assert "newer than the newest published 0" in group_problem(poison._group("p", version=2), needs, newest_version=0)
    negative = poison._rows(good, lambda r: r[1]["tokens"].__setitem__(0, -1))
    assert "token ids in [-1, " in group_problem(negative, needs)
    absurd = poison._rows(good, lambda r: r[2].update(reward=-3e38))
    assert "a reward of magnitude 3e+38, beyond the bound 1e+06" in group_problem(absurd, needs)
    assert group_problem(poison._rows(good, lambda r: r[2].update(reward=-1e6)), needs) is None  # the bound is in


def test_the_longest_row_the_trainer_takes_is_its_largest_bucket_within_the_models_context() -> None:
    needs = TrainerNeeds.of(group_size=4, seq_buckets=(64, 512), max_seq_len=256, vocab_size=256)
    assert needs.max_tokens == 256
    assert TrainerNeeds.of(group_size=4, seq_buckets=(64, 128), max_seq_len=256, vocab_size=256).max_tokens == 128
    long = poison._rows(poison._group("p"), lambda r: poison._lengthen(r, 300))
    assert "over the 256 the trainer takes" in group_problem(long, needs)


def test_the_batch_screen_clears_exactly_the_groups_with_no_problem() -> None:
    good = poison._group("p")
    groups = [good, poison._group("q", size=3), poison._rows(good, lambda r: poison._lengthen(r, 100)),
              poison._group("r", version=2), poison._rows(good, lambda r: r[1].update(status="infra_error")),
              poison._rows(good, lambda r: r[0].update(loss_mask=[0] * len(r[0]["loss_mask"]))),
              poison._rows(good, lambda r: r[3].update(reward=3e38))]
    whole = pa.concat_tables(groups)
    ends = np.cumsum([g.num_rows for g in groups])
    bounds = np.stack([ends - [g.num_rows for g in groups], ends], axis=1)
    for needs in (TrainerNeeds(group_size=4, max_tokens=64, vocab_size=256),
                  TrainerNeeds(group_size=3, max_tokens=200, vocab_size=8)):
        for newest, folders in ((None, [0, 0, 0, 2, 0, 0, 0]), (1, [0, 0, 0, 2, 0, 0, 0]),
                                (2, [1, 0, 0, 2, 0, 0, 0])):
            clean = clean_groups(whole, bounds, needs, folder_version_g=np.array(folders), newest_version=newest,
                                 infra=True)
            assert clean.tolist() == [group_problem(g, needs, folder_version=v, newest_version=newest) is None
                                      and infra_problem(g) is None for g, v in zip(groups, folders, strict=True)]
    assert clean_groups(whole, bounds, TrainerNeeds(group_size=4, max_tokens=64, vocab_size=256),
                        folder_version_g=np.zeros(7), newest_version=None, infra=False).tolist() == [
        True, False, False, False, True, True, False]  # the infrastructure failure is the tailer's concern only


def test_declared_sizes_are_read_without_decoding_and_bound_the_decode() -> None:
    table = poison._group("p")
    rows, decoded = declared_sizes(encode_shard(table, {}))
    assert rows == 4 and decoded > 4 * 13  # four token columns at least
    huge = encode_shard(poison._huge_row(table, 2_000_000), {})
    assert len(huge) < 200_000 and declared_sizes(huge)[1] > 2_000_000 * 13  # LZ4 compresses zeros ~250:1
    with pytest.raises(ShardError, match=f"over {row_budget(192)} a row"):
        decode_shard(huge, "where.arrow", limits=ShardLimits(max_row_tokens=192))
    assert decode_shard(huge, "where.arrow", validate=False)[0].num_rows == 4  # under MAX_DECODED_BYTES
    assert MAX_DECODED_BYTES > 2_000_000 * 13
    with pytest.raises(ShardError, match="where.arrow: unreadable"):
        decode_shard(b"ARROW1\0\0" + b"\xff" * 40 + b"ARROW1", "where.arrow")


def test_identity_ties_provenance_to_the_shard_name() -> None:
    prov = {"worker_id": "w0", "seq": 3, "version": 0}
    assert identity_problem("trajectories/v00000000/w0-00000003.arrow", prov) is None
    assert identity_problem("trajectories/v00000000/w0-00000003.arrow", {}) is None
    assert "trajectories/v00000000/w0-00000003.arrow" in identity_problem("trajectories/v00000001/w0-00000003.arrow",
                                                                          prov)
    assert "'seq': 3" in identity_problem("gs://b/c/trajectories/v00000000/w0-00000009.arrow", prov)


@pytest.mark.parametrize("name", sorted(poison.POINTER_JUNK))
def test_a_junk_pointer_entry_never_moves_latest_and_the_audit_reports_it(tmp_path: Path, name: str) -> None:
    outcome = poison.run_pointer_case(name, tmp_path)
    assert outcome.ok, outcome.problems


def test_store_reads_refuse_fifos_devices_and_symlinks_out_of_the_campaign(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "c"))
    store.create("inside", b"ok")
    os.mkfifo(tmp_path / "c" / "fifo")
    (tmp_path / "secret").write_text("outside")
    (tmp_path / "c" / "out").symlink_to(tmp_path / "secret")
    (tmp_path / "c" / "in").symlink_to(tmp_path / "c" / "inside")
    (tmp_path / "c" / "dir_out").symlink_to(tmp_path)
    with pytest.raises(NotAnObjectError, match="not a regular file \\(a FIFO\\)"):
        store.read("fifo")
    with pytest.raises(NotAnObjectError, match="symlink leading outside the campaign"):
        store.read("out")
    assert store.read("in") == b"ok"  # a link that stays inside is an ordinary object
    assert store.walk("") == ["dir_out", "fifo", "in", "inside", "out"]  # the folder link is listed, not entered


@pytest.mark.parametrize("name", sorted(poison.METADATA))
def test_the_cli_over_garbage_metadata_exits_cleanly_without_a_traceback(tmp_path: Path, name: str) -> None:
    [outcome] = poison.run_cli_cases(tmp_path, [name])
    assert outcome.ok, (outcome.problems, outcome.detail)


def test_fifos_and_devices_named_like_objects_never_hang_a_reader(tmp_path: Path) -> None:
    outcomes = poison.run_fifo_cases(tmp_path)
    assert len(outcomes) == 5 and all(o.ok for o in outcomes), [o for o in outcomes if not o.ok]


def test_truncated_and_malformed_telemetry_lines_are_skipped_with_a_reason(tmp_path: Path) -> None:
    poison.garbage_campaign(tmp_path)
    skipped: list[str] = []
    records = read_records(Store(str(tmp_path / "campaign")), on_skip=skipped.append)
    assert [r["name"] for r in records] == ["a"]
    assert len(skipped) == 4 and any("line 2: not JSON" in s for s in skipped)
    assert any("a JSON list, not an object" in s for s in skipped)


def test_export_writes_a_group_once_and_leaves_a_foreign_file_alone(tmp_path: Path) -> None:
    store, _, _ = poison.seed_poison_campaign(tmp_path, CASES["copied_shard_same_folder"], publish=False)
    store.create(layout.shard_path(0, "x0", 0), encode_shard(poison._group("g0"), {"worker_id": "x0", "seq": 0,
                                                                                   "version": 0}))
    out = Store(str(tmp_path / "export"))
    out.create("version=1/data.parquet", b"someone else's file")
    [v0, v1] = export_parquet(store, out)
    assert (v0.status, v0.rows, v1.status) == ("written", 16, "foreign")  # two good shards of two groups
    reasons = dict(v0.skipped)
    assert "a copy?" in reasons["trajectories/v00000000/a0-00000000.arrow"]
    assert "already exported" in reasons["trajectories/v00000000/x0-00000000.arrow"]


def test_lineage_counts_logged_skips_and_a_group_trained_from_two_shards() -> None:
    committed = {(f"s{i}", "g"): CommittedGroup(version=0, prompt_id="p", row_start=0, row_end=4, usable=True)
                 for i in (1, 2)}
    committed[("s3", "h")] = CommittedGroup(version=0, prompt_id="p", row_start=0, row_end=4, usable=True)
    log = ConsumptionLog(step=1, trainer_version=0, created_at="t",
                         groups=[ConsumedGroup(group_id="g", shard=s, row_start=0, row_end=4, version=0, staleness=0)
                                 for s in ("s1", "s2")],
                         skipped=[SkippedShard(shard="s3", groups=["h"], reason="why")])
    lineage, findings = reconcile(committed, [("train/consumed/00000001.json", log)], [])
    assert lineage is not None and (lineage.accounting.consumed, lineage.accounting.skipped) == (2, 1)
    assert [f.kind for f in findings] == ["consumed_twice"]


def test_poison_figures_count_cases_and_failures() -> None:
    ok, bad = poison.CaseOutcome(name="a", ok=True, seconds=0.1), poison.CaseOutcome(name="b", ok=False, seconds=0.1)
    figures = poison.PoisonReport(poison=[ok, bad], pointers=[ok], metadata=[ok, ok], fifos=[bad]).figures()
    assert (figures["reliability.trainer_poison_crashes"], figures["reliability.trainer_poison_cases"]) == (1, 2)
    assert (figures["reliability.pointer_regressions"], figures["reliability.cli_tracebacks"]) == (0, 0)
    assert figures["reliability.hangs"] == 1


def test_status_ignores_names_no_stage_writes_and_lists_them(tmp_path: Path) -> None:
    from pipelines_lib.stages.campaign import campaign_status

    poison.garbage_campaign(tmp_path)
    status = campaign_status(Store(str(tmp_path / "campaign")))
    assert (status["published_versions"], status["evaluated_versions"], status["train_steps"]) == ([0], [], 0)
    assert status["latest_checkpoint"] is None
    assert sorted(status["ignored"]) == ["eval/notes.json", "eval/v1.json", "eval/vXXXXXXXX.json",
                                         "train/checkpoints/00000001.x", "train/checkpoints/latest",
                                         "train/consumed/0000001.json", "train/consumed/last.json",
                                         "weights/LATEST.json.d/latest.json"]


def test_a_shard_name_declaring_another_group_count_than_its_content_is_refused() -> None:
    prov = {"worker_id": "w0", "seq": 3, "version": 0, "n_groups": 2}
    assert identity_problem("trajectories/v00000000/w0-00000003-2.arrow", prov, groups=2) is None
    assert identity_problem("trajectories/v00000000/w0-00000003-5.arrow", prov, groups=2) == \
        "its name declares 5 group(s), it holds 2"
    # Renamed with a count matching its content, the provenance still tells the original name.
    assert "as trajectories/v00000000/w0-00000003-2.arrow" in identity_problem(
        "trajectories/v00000000/w0-00000003-1.arrow", prov, groups=1)
