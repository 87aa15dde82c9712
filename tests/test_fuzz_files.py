"""Hostile shard and dataset files: only the documented error types, each naming the file (drills/fuzz.py)."""

from __future__ import annotations

from hypothesis import given, settings

from pipelines_lib.drills.fuzz import DatasetCase, check_dataset, check_shard, dataset_inputs, shard_inputs


@settings(max_examples=500, deadline=None)
@given(shard_inputs())
def test_any_bytes_in_a_shard_are_decoded_or_refused_naming_the_shard(data: bytes) -> None:
    check_shard(data)


@settings(max_examples=500, deadline=None)
@given(dataset_inputs())
def test_any_dataset_file_is_prepared_or_refused_naming_the_file(case: DatasetCase) -> None:
    check_dataset(case)
