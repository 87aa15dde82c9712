"""Hostile dataset files through ``dataset.prep`` with a file source: a dataset, or ``DatasetError`` naming the
file (contracts: drills/fuzz.py)."""

from __future__ import annotations

from hypothesis import given, settings

from drills.fuzz import DatasetCase, check_dataset, dataset_inputs


@settings(max_examples=500, deadline=None)
@given(dataset_inputs())
def test_any_dataset_file_is_prepared_or_refused_naming_the_file(case: DatasetCase) -> None:
    check_dataset(case)
