"""Malformed campaigns through the real command line: each command ends with its report, or one line on stderr and
exit 2, never a traceback; and every project exception survives the trip back from a worker process."""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from drills.fuzz_campaign import COMMANDS, TARGETED, CampaignCase, Edit, check_campaign
from pipelines_lib import cli
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.schema import SCHEMA_VERSION_KEY

ROOT = Path(__file__).resolve().parents[1]
SHARD = "trajectories/v00000000/w0-00000000-2.arrow"
"""A shard of the demo campaign (``rollstream demo``)."""


@pytest.fixture
def demo(demo_campaign: Store, tmp_path: Path) -> Path:
    """A copy of a real demo campaign, free to damage."""
    folder = tmp_path / "campaign"
    shutil.copytree(demo_campaign.url.removeprefix("file://"), folder)
    return folder


def _rewrite_shard(path: Path, edit) -> None:
    table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
    table = edit(table)
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    path.write_bytes(sink.getvalue())


def _null_first_id(table: pa.Table) -> pa.Table:
    i = table.schema.get_field_index("trajectory_id")
    ids = pa.array([None, *table.column(i).to_pylist()[1:]], pa.string())
    return table.set_column(i, table.schema.field(i).with_nullable(True), ids)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def test_a_null_trajectory_id_is_a_finding_naming_shard_and_row(demo: Path, capsys) -> None:
    _rewrite_shard(demo / SHARD, _null_first_id)
    code, out, _ = _run(capsys, "audit", str(demo), "--jobs", "1")
    assert code == 1
    assert f"{SHARD} row 0: null_value: column 'trajectory_id' has 1 null value(s)" in out


def test_garbage_schema_version_bytes_are_shown_and_the_shard_a_bad_file(demo: Path, capsys) -> None:
    _rewrite_shard(demo / SHARD, lambda t: t.replace_schema_metadata({**t.schema.metadata,
                                                                       SCHEMA_VERSION_KEY: b"\xff\xfe\x00junk"}))
    code, out, _ = _run(capsys, "audit", str(demo), "--jobs", "1")
    assert code == 1
    assert "b'\\xff\\xfe\\x00junk': 1" in out
    assert f"{SHARD}: schema_version:" in out and "schema version metadata is not text" in out


def test_a_symlink_loop_in_a_version_folder_is_one_bad_entry_for_audit_and_export(demo: Path, tmp_path: Path,
                                                                                    capsys) -> None:
    folder = demo / "trajectories" / "v00000000"
    os.symlink("w9-00000001-2.arrow", folder / "w9-00000000-2.arrow")
    os.symlink("w9-00000000-2.arrow", folder / "w9-00000001-2.arrow")
    code, out, _ = _run(capsys, "audit", str(demo), "--jobs", "2")
    assert code == 1
    assert out.count("not_a_file: ") == 2 and "a symlink loop (it never reaches a file)" in out
    assert "30 shards, 240 trajectories" in out  # the rest of the campaign is audited as before
    code, out, _ = _run(capsys, "export", str(demo), str(tmp_path / "out"), "--jobs", "1")
    assert code == 0 and "trajectories/v00000000/w9-00000000-2.arrow" in out


@pytest.mark.parametrize("text", ["[1, 2]", "[" * 100_000 + "]" * 100_000, "{"])
def test_a_campaign_json_that_is_not_an_object_is_reported_by_audit_and_one_line_from_status(
        demo: Path, capsys, text: str) -> None:
    (demo / "campaign.json").write_text(text)
    code, out, _ = _run(capsys, "audit", str(demo), "--jobs", "1")
    assert code == 1 and "campaign.json: bad_campaign_json: campaign.json:" in out
    code, out, err = _run(capsys, "status", str(demo))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"rollstream status: file://{demo}/campaign.json: ")


def test_export_on_worker_processes_to_an_unwritable_folder_is_one_line(demo: Path, tmp_path: Path,
                                                                          capsys) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, _, err = _run(capsys, "export", str(demo), str(blocker / "out"), "--jobs", "2")
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"rollstream export: storage create file://{blocker}/out/version=")


def test_a_reader_that_stops_early_gets_no_broken_pipe_traceback(demo: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written: `| head -0`
    try:
        proc = subprocess.run([sys.executable, "-m", "pipelines_lib.cli", "metrics", str(demo), "--json"],
                              stdout=write_end, stderr=subprocess.PIPE, cwd=ROOT, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        os.close(write_end)
    assert proc.stderr == b"" and proc.returncode == cli.EXIT_BROKEN_PIPE


def _project_exceptions() -> list[type[BaseException]]:
    """Every exception class defined in the library and the repository's drills, found in the source: a class
    whose bases name an error or exception."""
    found = []
    for package in ("pipelines_lib", "drills"):
        for path in sorted((ROOT / package).rglob("*.py")):
            classes = [node.name for node in ast.parse(path.read_text()).body if isinstance(node, ast.ClassDef)
                       and any(ast.unparse(b).endswith(("Error", "Exception", "Violation")) for b in node.bases)]
            if classes:
                module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
                found += [getattr(module, name) for name in classes]
    return [c for c in found if issubclass(c, BaseException)]


def test_every_project_exception_survives_a_pickle_round_trip() -> None:
    """What a worker process raises reaches its parent pickled; one that does not unpickle breaks the pool."""
    classes = _project_exceptions()
    assert len(classes) >= 15  # the scan found them (StorageError and its kin, RecordError, ShardError, ...)
    for cls in classes:
        own_init = next(c.__init__ for c in cls.__mro__ if "__init__" in vars(c))
        parameters = [] if own_init in (BaseException.__init__, OSError.__init__) else [
            p for p in list(inspect.signature(own_init).parameters.values())[1:]
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        arguments = [f"{p.name}-value" for p in parameters] or ["a message"]
        error = cls(*arguments)
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is cls and str(copy) == str(error), cls


def test_a_telemetry_line_nested_too_deeply_is_skipped_with_a_reason(tmp_path: Path) -> None:
    from pipelines_lib.storage import layout
    from pipelines_lib.telemetry.trace import read_records

    store = Store(str(tmp_path / "campaign"))
    good = '{"type": "gauge", "process": "trainer", "name": "loss", "ts_us": 1, "value": 0.5}'
    store.create(layout.telemetry_file("trainer-1.jsonl"), f"{good}\n{'[' * 100_000}\n".encode())
    skipped: list[str] = []
    assert [r["name"] for r in read_records(store, on_skip=skipped.append)] == ["loss"]
    assert skipped == [f"skipped {store.uri(layout.telemetry_file('trainer-1.jsonl'))} line 2: not JSON (nested too "
                       "deeply)"]


@pytest.mark.parametrize("target", range(len(TARGETED)))
def test_each_targeted_damage_through_every_command_is_a_report_or_one_line(target: int) -> None:
    """A config nested too deeply or of the wrong types, a sparse multi-gigabyte record, a fork that is its own
    parent or names other storage, a garbage cursor, a pointer entry escaping its folder, an empty folder named like
    a shard, shard metadata nested too deeply, control characters in an id: each command's contract holds."""
    for command in sorted(COMMANDS):
        check_campaign(CampaignCase(edits=(Edit(kind="targeted", pick=0, value=target),), command=command))
