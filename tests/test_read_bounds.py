"""What the stream reads back, it checks: every shard decode is bounded (file size before reading, declared rows and
bytes before decoding, provenance nesting before parsing, group_size against the rows present), each bound a skip
with its reason for the trainer and a named file for the audit, the export and the SQL scan; a restart replays
only rows that hash as they did when trained, passes the trainable checks, and never publishes a step whose loss
or gradient is not finite. The cases of ``drills/readpath.py`` run here on real parts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from drills import poison, readpath
from pipelines_lib.cli import main
from pipelines_lib.records import ConsumedGroup, ConsumptionLog
from pipelines_lib.storage import layout
from pipelines_lib.storage.errors import TooLargeError
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.codec import ShardError, decode_shard, encode_shard, json_depth
from pipelines_lib.trajectory.needs import FILE_SLACK_BYTES, ShardLimits, TrainerNeeds
from pipelines_lib.trajectory.reader import ShardTailer
from pipelines_lib.trajectory.trainable import clean_groups, group_digest
from pipelines_lib.trajectory.validate import validate_table
from pipelines_lib.trajectory.window import Window

BOUNDS = {b.name: b for b in readpath.BOUNDS}


def _needs(config) -> TrainerNeeds:  # noqa: ANN001 - a CampaignConfig
    return TrainerNeeds.of(group_size=config.rollout.group_size, seq_buckets=config.trainer.seq_buckets,
                           max_seq_len=config.model.max_seq_len, vocab_size=config.model.vocab_size)


def _seeded(root: Path, bound: readpath.Bound) -> tuple[Store, object, str]:
    planted: list[str] = []

    def plant(store: Store, good: list[str]) -> tuple[str, ...]:
        planted.append(bound.plant(store, 0))
        return ()

    store, config, _ = poison.seed_poison_campaign(root, poison.Poison(name=bound.name, plant=plant, audit_kind=""),
                                                   publish=False)
    return store, config, planted[0]


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_a_shard_over_a_read_bound_is_one_skip_with_its_reason_and_the_valid_shards_beside_it_are_read(
        tmp_path: Path, name: str) -> None:
    store, config, planted = _seeded(tmp_path, BOUNDS[name])
    tailer = ShardTailer(store, needs=_needs(config))
    t0 = time.perf_counter()
    handed = [g.group_id for g in tailer.next_groups(100, Window(version=1, eta=1))]
    assert time.perf_counter() - t0 < 30
    assert sorted(handed) == [f"g{i}@w0" for i in range(poison.GOOD_GROUPS)]
    skips = [e for e in tailer.drain_events() if e.kind == "skipped"]
    assert [e.shard for e in skips] == [planted] and BOUNDS[name].reason in skips[0].reason
    assert store.uri(planted) in skips[0].reason and "\n" not in skips[0].reason  # one line naming the file


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_audit_export_and_sql_name_a_shard_over_a_read_bound_and_read_the_others(tmp_path: Path, name: str) -> None:
    store, _, planted = _seeded(tmp_path, BOUNDS[name])
    assert readpath.check_readers(store, [planted], BOUNDS[name].reason, tmp_path) == []


def test_the_real_trainer_skips_a_read_bound_poison_met_again_after_each_of_two_restarts(tmp_path: Path) -> None:
    outcome = readpath.run_bound_case(BOUNDS["metadata_nested_100000_deep"], tmp_path)
    assert outcome.ok, outcome.problems


def test_a_sparse_file_over_the_cap_is_refused_by_its_size_before_a_byte_is_read(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "c"))
    (tmp_path / "c" / layout.version_dir(0)).mkdir(parents=True)
    path = readpath._sparse_file(store, 0)
    t0 = time.perf_counter()
    with pytest.raises(TooLargeError, match=f"{readpath.SPARSE_BYTES} bytes, over the"):
        store.read(path, max_bytes=ShardLimits().max_file_bytes)
    assert time.perf_counter() - t0 < 1.0  # reading 6 GiB of zeros takes seconds


def test_declared_rows_and_file_size_are_checked_before_decoding() -> None:
    data = encode_shard(poison._group("p"), {})
    with pytest.raises(ShardError, match="where.arrow: declares 4 rows, over the limit of 3 a shard"):
        decode_shard(data, "where.arrow", limits=ShardLimits(max_rows=3))
    padded = data + bytes(FILE_SLACK_BYTES)  # bytes handed over by a caller that did not read them capped
    with pytest.raises(ShardError, match=f"where.arrow: file of {len(padded)} bytes, over the limit of {2**20 + 1}"):
        decode_shard(padded, "where.arrow", limits=ShardLimits(max_bytes=1))


def test_provenance_nesting_is_measured_without_parsing_and_strings_do_not_count() -> None:
    assert json_depth(b'{"a": [1, {"b": "[[[[["}]}') == 3
    assert json_depth(b"[" * 100_000 + b"]" * 100_000) == 100_000
    assert json_depth(b'{"s": "\\"}') == 1  # an escaped backslash closes nothing


def test_a_group_size_of_2_31_minus_1_is_held_against_the_rows_present() -> None:
    table = poison._group("p")
    table = table.set_column(table.schema.get_field_index("group_size"), "group_size",
                             pa.array([2**31 - 1] * 4, pa.int32()))
    t0 = time.perf_counter()
    violations = validate_table(table)
    assert time.perf_counter() - t0 < 1.0
    assert [v.kind for v in violations] == ["incomplete_group"] and "2147483647" in violations[0].message


def test_a_token_id_equal_to_the_vocabulary_size_is_skipped_by_the_tailer_and_reported_by_the_audit(
        tmp_path: Path) -> None:
    from pipelines_lib.audit import audit_campaign

    def plant(store: Store, good: list[str]) -> tuple[str, ...]:
        rows = poison._group("edge").to_pylist()
        rows[3]["tokens"][-1] = poison._config().model.vocab_size  # one past the last id
        poison._shard(store, pa.Table.from_pylist(rows, schema=poison._group("edge").schema),
                      worker=poison.POISON_WORKER, seq=0)
        return ("edge@w0",)

    store, config, _ = poison.seed_poison_campaign(tmp_path, poison.Poison(name="edge", plant=plant, audit_kind=""),
                                                   publish=False)
    tailer = ShardTailer(store, needs=_needs(config))
    assert "edge@w0" not in [g.group_id for g in tailer.next_groups(100, Window(version=1, eta=1))]
    (reason,) = [e.reason for e in tailer.drain_events()]
    assert reason.endswith(f", {config.model.vocab_size}], outside the vocabulary [0, {config.model.vocab_size})")
    found = [f.message for f in audit_campaign(store).violations if f.kind == "untrainable_group"]
    assert len(found) == 1 and "outside the vocabulary" in found[0]
    rows = poison._group("edge").to_pylist()
    rows[3]["tokens"][-1] = config.model.vocab_size - 1  # the last id is inside
    group = pa.Table.from_pylist(rows, schema=poison._group("edge").schema)
    assert clean_groups(group, np.array([[0, 4]]), _needs(config), folder_version_g=np.array([0]), newest_version=0,
                        infra=True)[0]


def test_a_group_digest_follows_the_values_not_where_the_rows_sit() -> None:
    a, b = poison._group("a"), poison._group("b")
    both = pa.concat_tables([b, a]).combine_chunks()
    assert group_digest(both.slice(4, 4)) == group_digest(a) != group_digest(b)
    rows = a.to_pylist()
    rows[0]["logprobs"][-1] = rows[0]["logprobs"][-1] / 2
    assert group_digest(pa.Table.from_pylist(rows, schema=a.schema)) != group_digest(a)


def test_a_consumption_log_keeps_each_groups_digest_and_reads_one_written_without(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "c"))
    group = ConsumedGroup(group_id="g", shard="s", row_start=0, row_end=4, version=0, staleness=0, digest="ab")
    ConsumptionLog(step=1, trainer_version=0, created_at="t", groups=[group]).write(store)
    assert ConsumptionLog.read(store, 1).groups[0].digest == "ab"
    raw = ConsumptionLog(step=2, trainer_version=0, created_at="t", groups=[group]).to_json()
    del raw["groups"][0]["digest"]  # a log written before digests were recorded
    store.create(layout.consumed_log(2), json.dumps(raw).encode())
    assert ConsumptionLog.read(store, 2).groups[0].digest is None


@pytest.mark.parametrize("name", readpath.REPLAYS)
def test_a_restart_over_damage_refuses_naming_the_step_and_publishes_nothing_non_finite(tmp_path: Path,
                                                                                        name: str) -> None:
    outcome = readpath.run_replay_case(name, tmp_path)
    assert outcome.ok, outcome.problems
    assert outcome.detail.startswith(("cannot replay step 3: ", "trainer step 2: "))


def test_rollstream_replay_of_a_rewritten_step_names_the_step_and_the_shard(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    readpath.run_replay_case("rewritten_consumed_shard", tmp_path)
    capsys.readouterr()
    assert main(["replay", str(tmp_path / "campaign"), "--step", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the trainer's mesh line
    assert err.startswith("rollstream replay: cannot replay step 3: ") and "rewritten after it was consumed" in err
    assert layout.version_dir(0) in err
