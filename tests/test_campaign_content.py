"""What a campaign's content cannot make the operator's commands do: fetch a URL it names, end the HTML report's
data early, write to the terminal, hide shards behind a worker id, or end a command in a traceback (a config nested
thousands deep, a multi-gigabyte sparse ``campaign.json``, a fork that is its own parent, shard metadata nested
too deeply, token ids outside the vocabulary, no readable shard at all)."""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from pipelines_lib import cli
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store
from pipelines_lib.terminal import printable

SHARD = "trajectories/v00000000/w0-00000000-2.arrow"
"""A shard of the demo campaign (``rollstream demo``)."""


@pytest.fixture
def demo(demo_campaign: Store, tmp_path: Path) -> Path:
    folder = tmp_path / "demo"
    shutil.copytree(demo_campaign.url.removeprefix("file://"), folder)
    return folder


@pytest.fixture
def trained(trained_campaign: Store, tmp_path: Path) -> Path:
    folder = tmp_path / "trained"
    shutil.copytree(trained_campaign.url.removeprefix("file://"), folder)
    return folder


def _run(capsys, *argv: object) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def _one_line(code: int, out: str, err: str, command: str) -> str:
    assert code == 2 and out == "", (code, out, err)
    line = err.splitlines()[-1]
    assert line.startswith(f"rollstream {command}: ")
    return line


def _rewrite_shards(folder: Path, edit: Callable[[pa.Table], pa.Table]) -> None:
    for path in sorted((folder / "trajectories").rglob("*.arrow")):
        table = edit(pa.ipc.open_file(pa.memory_map(str(path))).read_all())
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        path.write_bytes(sink.getvalue().to_pybytes())


def _first_value(column: str, value: Callable[[object], object]) -> Callable[[pa.Table], pa.Table]:
    def edit(table: pa.Table) -> pa.Table:
        i = table.schema.get_field_index(column)
        values = table.column(i).to_pylist()
        return table.set_column(i, table.schema.field(i), pa.array([value(values[0]), *values[1:]],
                                                                    table.schema.field(i).type))
    return edit


def _set_parent(folder: Path, url: str) -> None:
    manifest = json.loads((folder / "campaign.json").read_text())
    manifest["parent"] = {"url": url, "step": 4, "version": 1, "config_diff": {}}
    (folder / "campaign.json").write_text(json.dumps(manifest))


@pytest.fixture
def http_server() -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server on the loopback, recording every path asked of it."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the http.server hook's name)
            asked.append(self.path)
            self.send_response(404)
            self.end_headers()

        do_HEAD = do_GET  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_address[1]}/campaign", asked
        server.shutdown()


def test_a_fork_parent_on_no_campaign_storage_is_never_fetched(trained: Path, http_server, tmp_path: Path,
                                                               capsys) -> None:
    url, asked = http_server
    _set_parent(trained, url)
    code, out, _ = _run(capsys, "audit", trained, "--jobs", "1")
    assert code == 1 and f"campaign.json: bad_fork_parent: file://{trained}/campaign.json: parent.url '{url}': " \
                          "protocol 'http' is not campaign storage (file, gs, gcs, memory)" in out
    for argv in (("status", trained), ("export", trained, tmp_path / "out", "--jobs", "1")):
        line = _one_line(*_run(capsys, *argv), argv[0])
        assert "protocol 'http' is not campaign storage" in line
    assert asked == []


@pytest.mark.parametrize("parent", ["itself", "nosuch://bucket/campaign"])
def test_a_fork_that_is_its_own_parent_or_names_an_unknown_protocol_is_one_line(trained: Path, tmp_path: Path,
                                                                                capsys, parent: str) -> None:
    _set_parent(trained, str(trained) if parent == "itself" else parent)
    expected = "its fork ancestry loops" if parent == "itself" else "protocol 'nosuch' is not campaign storage"
    for argv in (("status", trained), ("export", trained, tmp_path / "out", "--jobs", "1"), ("recover", trained)):
        assert expected in _one_line(*_run(capsys, *argv), argv[0])
    code, out, _ = _run(capsys, "audit", trained, "--jobs", "2")  # the workers read the folder as the audit does
    assert code == 1 and expected in out


def test_a_config_nested_thousands_deep_is_a_finding_and_one_line(trained: Path, capsys) -> None:
    text = (trained / "campaign.json").read_text()
    (trained / "campaign.json").write_text(text.replace('"config": {', '"config": {"x": ' + "[" * 900 + "]" * 900
                                                        + ", ", 1))
    code, out, _ = _run(capsys, "audit", trained, "--jobs", "1")
    assert code == 1 and "campaign.json: bad_campaign_json: campaign.json: not a CampaignManifest: nested deeper " \
                          "than 64 levels" in out
    assert "nested deeper than 64 levels" in _one_line(*_run(capsys, "status", trained), "status")


def test_a_sparse_multi_gigabyte_campaign_json_is_refused_unread(trained: Path, tmp_path: Path, capsys) -> None:
    os.truncate(trained / "campaign.json", 8 << 30)  # sparse: no disk, 8 GB to a reader that reads it whole
    expected = f"storage read file://{trained}/campaign.json: 8589934592 bytes, over the 67108864 its reader " \
               "accepts"
    code, out, _ = _run(capsys, "audit", trained, "--jobs", "1")
    assert code == 1 and f"campaign.json: bad_campaign_json: {expected}" in out
    for argv in (("status", trained), ("export", trained, tmp_path / "out", "--jobs", "1"),
                 ("sql", trained, "SELECT 1"), ("fork", trained, "--from-step", "4", tmp_path / "fork")):
        assert _one_line(*_run(capsys, *argv), argv[0]) == f"rollstream {argv[0]}: {expected}"


def test_shard_metadata_nested_too_deeply_is_named_and_every_command_reads_on(demo: Path, tmp_path: Path,
                                                                             capsys) -> None:
    from drills.fuzz_arrow import with_meta
    from pipelines_lib.trajectory.codec import SHARD_META_KEY

    path = demo / SHARD
    path.write_bytes(with_meta(path.read_bytes(), SHARD_META_KEY, b"[" * 100_000 + b"]" * 100_000))
    code, out, _ = _run(capsys, "audit", demo, "--jobs", "1")
    assert code == 1 and f"{SHARD}: unreadable: " in out and "29 shards" in out
    code, out, err = _run(capsys, "export", demo, tmp_path / "out", "--jobs", "1")
    assert code == 0 and SHARD in out
    code, out, err = _run(capsys, "sql", demo, "SELECT count(*) AS n FROM trajectories")
    assert code == 0 and f"skipped unreadable shard {SHARD}" in err and "232" in out
    code, out, err = _run(capsys, "view", demo)
    assert code == 0 and f"skipped unreadable shard {SHARD}" in err


def test_script_markup_in_a_shard_string_cannot_end_or_comment_out_the_reports_data(trained: Path, capsys) -> None:
    hostile = "<!--<script></script>"
    _rewrite_shards(trained, _first_value("task_id", lambda _: hostile))
    code, out, _ = _run(capsys, "view", trained, "--max-groups", "100")
    assert code == 0
    page = Path(out.strip().removeprefix("file://")).read_text()
    data = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.DOTALL).group(1)
    assert "<" not in data
    tasks = {t["task_id"] for g in json.loads(data)["groups"] for t in g["trajectories"]}
    assert hostile in tasks


def test_a_token_id_outside_the_vocabulary_is_shown_as_an_id_and_no_readable_shard_is_one_line(trained: Path,
                                                                                               capsys) -> None:
    _rewrite_shards(trained, _first_value("tokens", lambda ids: [-5, *ids[1:]]))
    code, out, _ = _run(capsys, "view", trained, "--max-groups", "100")
    assert code == 0 and out.strip().endswith("report.html")
    for path in (trained / "trajectories").rglob("*.arrow"):
        path.write_bytes(b"not a shard")
    line = _one_line(*_run(capsys, "view", trained), "view")
    assert line == f"rollstream view: {trained}: no readable shard to show (8 unreadable; `rollstream audit` says why)"


def test_control_characters_in_a_campaign_reach_the_terminal_escaped(demo: Path, capsys) -> None:
    _rewrite_shards(demo, _first_value("trajectory_id", lambda tid: f"\x1b[2J\x1b]0;owned\x07{tid}"))
    (demo / SHARD).rename(demo / "trajectories/v00000000/w0\x1b[31m-00000009-2.arrow")
    for argv in (("audit", demo, "--jobs", "1"), ("sql", demo, "SELECT trajectory_id FROM trajectories"),
                 ("view", demo), ("status", demo)):
        _, out, err = _run(capsys, *argv)
        assert "\x1b" not in out + err and "\x07" not in out + err, argv
    _, out, _ = _run(capsys, "audit", demo, "--jobs", "1")
    assert "\\x1b[2J\\x1b]0;owned\\x07" in out and "w0\\x1b[31m-00000009-2.arrow: foreign_name" in out
    assert printable("tab\tand\nnewline stay; \x9b\x7f\x00 do not") == \
        "tab\tand\nnewline stay; \\x9b\\x7f\\x00 do not"


def test_a_worker_id_starting_with_a_dot_is_refused_and_such_a_shard_is_foreign(demo: Path, capsys) -> None:
    from pipelines_lib.trajectory.writer import ShardWriter

    with pytest.raises(ValueError, match=r"worker_id may only use .* \(not first\), got '\.w0'"):
        ShardWriter(Store(str(demo)), worker_id=".w0")
    assert layout.parse_shard_path("trajectories/v00000000/.w0-00000000-2.arrow") is None
    (demo / SHARD).rename(demo / "trajectories/v00000000/.w0-00000000-2.arrow")
    code, out, _ = _run(capsys, "audit", demo, "--jobs", "1")
    assert code == 1 and "trajectories/v00000000/.w0-00000000-2.arrow: foreign_name" in out
