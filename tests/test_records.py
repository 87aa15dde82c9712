"""Campaign records: each round-trips through its one writer and reader, and a bad object is named on error."""

from __future__ import annotations

import dataclasses

import pytest

from harness.fixtures import consumption_log, done_marker, eval_result
from pipelines_lib.records import ConsumptionLog, DoneMarker, EvalResult, RecordError, consumption_steps
from pipelines_lib.storage import layout
from pipelines_lib.storage.errors import AlreadyExistsError
from pipelines_lib.storage.store import Store


def test_a_record_reads_back_equal_and_its_writer_is_create_only(local_store: Store) -> None:
    log = consumption_log(3, staleness=(0, 2), mean_reward=0.5, published_version=1)
    log.write(local_store)
    assert ConsumptionLog.read(local_store, 3) == log
    assert local_store.read_json(layout.consumed_log(3))["record_version"] == 2
    log.write(local_store)  # the same bytes again: a retried write that already landed
    with pytest.raises(AlreadyExistsError):
        dataclasses.replace(log, mean_reward=0.75).write(local_store)
    assert consumption_steps(local_store) == [3] and log.staleness_max == 2


def test_a_mistyped_field_is_named_with_the_object(local_store: Store) -> None:
    raw = eval_result(2).to_json() | {"greedy_success_rate": "high"}
    local_store.create_json(layout.eval_path(2), raw)
    with pytest.raises(RecordError, match=r"eval/v00000002\.json: EvalResult\.greedy_success_rate: expected a "
                                          r"number, got 'high'"):
        EvalResult.read(local_store, 2)


def test_an_unknown_record_version_is_refused(local_store: Store) -> None:
    local_store.create_json(layout.TRAIN_DONE, done_marker().to_json() | {"record_version": 2})
    with pytest.raises(RecordError, match=r"DONE\.json: DoneMarker record_version 2 is not the supported 1"):
        DoneMarker.read(local_store)


def test_nested_parts_are_checked_too() -> None:
    raw = consumption_log(1, staleness=(0,)).to_json()
    raw["groups"][0]["row_start"] = None
    with pytest.raises(RecordError, match=r"where: ConsumptionLog\.groups\[0\]: ConsumedGroup\.row_start: expected int"):
        ConsumptionLog.from_json(raw, where="where")
