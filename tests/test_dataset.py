"""The prep stage: built-in generators and user files to dataset splits, once, with bad rows reported."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines_lib.dataset import DatasetConfig, DatasetError, load_split, prep
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store


def test_builtin_source_is_deterministic_and_a_rerun_is_a_no_op(store: Store) -> None:
    config = DatasetConfig(n_train=20, n_heldout=5, seed=3)
    manifest = prep(store, config)
    assert manifest["splits"]["train"]["rows"] == 20 and manifest["splits"]["heldout"]["rows"] == 5
    before = store.walk("dataset")
    assert prep(store, config) == manifest and store.walk("dataset") == before
    train, heldout = load_split(store, "train"), load_split(store, "heldout")
    assert not {t.task_id for t in train} & {t.task_id for t in heldout}
    other = Store("memory://prep-det")
    prep(other, config)
    assert [t.task_id for t in load_split(other, "train")] == [t.task_id for t in train]


def test_jsonl_with_a_column_mapping_reports_bad_rows_by_line(tmp_path) -> None:
    rows = [{"id": f"q{i}", "question": f"What is {i}+1?", "solution": str(i + 1)} for i in range(60)]
    lines = [json.dumps(r) for r in rows]
    lines.insert(10, "{not json")
    lines.insert(20, json.dumps({"id": "x", "question": "", "solution": "1"}))
    src = tmp_path / "tasks.jsonl"
    src.write_text("\n".join(lines) + "\n")
    store = Store(str(tmp_path / "c"))
    manifest = prep(store, DatasetConfig(source=str(src), columns={"task_id": "id", "prompt": "question",
                                                                   "answer": "solution"}, max_bad_fraction=0.1))
    assert manifest["splits"]["train"]["rows"] + manifest["splits"]["heldout"]["rows"] == 60
    assert manifest["bad_rows"] == [f"{src} row 11: not JSON (Expecting property name enclosed in double quotes)",
                                    f"{src} row 21: missing or empty column(s) ['question']"]
    task = next(t for t in load_split(store, "train") + load_split(store, "heldout") if t.task_id == "q5")
    assert (task.prompt, task.answer, task.env_name) == ("What is 5+1?", "6", "arithmetic")


def test_parquet_source_and_too_many_bad_rows_fail_with_the_file_named(tmp_path) -> None:
    src = tmp_path / "tasks.parquet"
    pq.write_table(pa.table({"task_id": ["a", "b", "c"], "prompt": ["p", None, None], "answer": ["1", "2", "3"]}), src)
    with pytest.raises(DatasetError, match=r"(?s)tasks.parquet: 2 of 3 rows are bad .*row 2: missing or empty"):
        prep(Store(str(tmp_path / "c")), DatasetConfig(source=str(src)))
    assert not Store(str(tmp_path / "c")).exists(layout.DATASET_SUCCESS)


def test_unknown_env_and_unreadable_files_are_clear_errors(tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown env 'arithmatic'.*did you mean 'arithmetic'"):
        DatasetConfig(source="builtin:arithmatic")
    with pytest.raises(DatasetError, match="missing.jsonl: cannot read"):
        prep(Store(str(tmp_path / "c")), DatasetConfig(source=str(tmp_path / "missing.jsonl")))
    with pytest.raises(DatasetError, match="no dataset yet"):
        load_split(Store(str(tmp_path / "c")), "train")
