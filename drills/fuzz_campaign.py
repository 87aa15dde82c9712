"""The ``campaigns`` fuzz target: random edits of a real campaign through the operator's commands.

A real campaign is written once per process (``rollstream demo``: shards, consumption logs, the pointer and its
entries; plus a telemetry file). Each case copies it, applies a few ``Edit``s (a metadata file's bytes
replaced; a shard's bytes cut or flipped, its schema metadata replaced or a value made null; an object renamed;
a symlink planted: a loop, one leading out of the campaign, one to a folder, a dangling one) and runs one
command (``COMMANDS``) through ``cli.main``, in this process. Targeted edits plant the damage a restart or a
reader trips on (``TARGETED``): a config nested too deeply or of the wrong types, a multi-gigabyte sparse record,
a fork parent that is the campaign itself or on no campaign storage, a garbage tail cursor, a pointer entry
escaping its folder, an empty folder named like a shard, shard metadata nested too deeply, control characters in
a trajectory id. The contract (``check_campaign``): the command
returns; with 0 or 1 it printed its report, with 2 one line on stderr naming the command (after any progress
lines); never an exception out of ``main``, never a traceback.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drills.fuzz_arrow import ContractViolation, ipc, with_meta

COMMANDS: dict[str, tuple[str, ...]] = {
    "audit": ("audit", "{c}", "--jobs", "1"),
    "status": ("status", "{c}"),
    "export": ("export", "{c}", "{scratch}/export", "--jobs", "1"),
    "metrics": ("metrics", "{c}", "--json"),
    "sql": ("sql", "{c}", "SELECT version, count(*) FROM trajectories GROUP BY 1"),
    "view": ("view", "{c}"),
    "trace": ("trace", "{c}", "--out", "{scratch}/trace.json"),
}
"""Each command's arguments: ``{c}`` the damaged campaign, ``{scratch}`` a folder for its outputs."""

EDIT_KINDS = ("metadata", "shard_cut", "shard_flip", "shard_meta", "shard_null", "rename", "loop", "outside",
              "folder_link", "dangling", "targeted")

HOSTILE_JSON = (b"[1, 2]", b"[" * 100_000 + b"]" * 100_000, b"{", b"", b"\xff\xfe\x00", b"null", b'{"version": 1e999}',
                b'{"schema_version": 1, "version": -1}', b'"x"', b"{}")
"""Replacement bytes for a metadata file: not an object, nested too deeply, not JSON, not UTF-8, absurd values."""

HOSTILE_META = (b"\xff\xfe\x00", b"", b"2.0", b"1.999999999999999999999", b"{", b"null")
"""Replacement values for a shard's schema-version or provenance metadata."""


@dataclass(frozen=True, kw_only=True)
class Edit:
    kind: str
    """One of ``EDIT_KINDS``."""
    pick: int
    """Which object (modulo the candidates, in name order)."""
    value: int
    """The kind's parameter: where to cut or flip, which hostile bytes, which new name."""


@dataclass(frozen=True, kw_only=True)
class CampaignCase:
    edits: tuple[Edit, ...]
    command: str
    """A key of ``COMMANDS``."""


@functools.cache
def _base_campaign() -> Path:
    """A real campaign, written once per process and only ever copied."""
    from pipelines_lib.demo import run_demo
    from pipelines_lib.storage.store import Store
    from pipelines_lib.telemetry import Recorder

    folder = Path(tempfile.mkdtemp(prefix="rollstream-fuzz-campaign-")) / "demo"
    run_demo(str(folder), echo=lambda _: None)
    # The demo records no telemetry: a few records give metrics and trace something to read (and the edits to break).
    recorder = Recorder(Store(str(folder)), "trainer", clock=lambda: 1.0)
    recorder.span_record("train_step", "trainer", 1.0, 2.0, {"step": 1})
    recorder.gauge_record("loss", 0.5, {"step": 1})
    recorder.flush()
    return folder


def _manifest(root: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    path = root / "campaign.json"
    with contextlib.suppress(ValueError):  # a manifest an earlier edit already broke stays as it is
        manifest = json.loads(path.read_bytes())
        edit(manifest)
        path.write_text(json.dumps(manifest))


def _parent(url: str) -> Callable[[dict[str, Any]], None]:
    return lambda m: m.update(parent={"url": url, "step": 1, "version": 0, "config_diff": {}})


def _bad_config(m: dict[str, Any]) -> None:
    m.update(kind="campaign", config={"model": {"vocab_size": "512"}, "trainer": {"max_steps": -3},
                                      "seed": float("nan")})


def _first(root: Path, pattern: str) -> Path | None:
    return next(iter(sorted(p for p in root.glob(pattern) if p.is_file() and not p.is_symlink())), None)


def _rewrite_json(target: Path | None, fields: dict[str, Any]) -> None:
    if target is not None:
        with contextlib.suppress(ValueError):
            target.write_text(json.dumps({**json.loads(target.read_bytes()), **fields}))


def _deep_shard_meta(root: Path) -> None:
    from pipelines_lib.trajectory.codec import SHARD_META_KEY

    if (shard := _first(root, "trajectories/*/*.arrow")) is not None:
        _replace_meta(shard, SHARD_META_KEY, b"[" * 100_000 + b"]" * 100_000)


def _escapes_in_an_id(root: Path) -> None:
    if (shard := _first(root, "trajectories/*/*.arrow")) is not None:
        _edit_table(shard, lambda t: _set_first(t, "trajectory_id", "\x1b[2J\x1b]0;pwned\x07id"))


TARGETED: tuple[Callable[[Path], None], ...] = (
    lambda root: _manifest(root, lambda m: m.update(config={"x": json.loads("[" * 900 + "]" * 900)})),
    lambda root: os.truncate(root / "campaign.json", 3 << 30),  # sparse: no disk, 3 GB to a reader that reads it
    lambda root: _manifest(root, _parent(str(root))),
    lambda root: _manifest(root, _parent("http://127.0.0.1:9/campaign")),
    lambda root: _manifest(root, _parent("nosuch://bucket/campaign")),
    lambda root: _manifest(root, _bad_config),
    lambda root: _rewrite_json(_first(root, "train/consumed/*.json"), {"cursor_delta": "[1, 2"}),
    lambda root: _rewrite_json(_first(root, "weights/LATEST.json.d/*.json"), {"path": "../../../etc"}),
    lambda root: (root / "trajectories" / "v00000000" / "w5-00000000-2.arrow").mkdir(exist_ok=True),
    _deep_shard_meta,
    _escapes_in_an_id,
)
"""The ``targeted`` edits (``Edit.value`` picks one): damage a restart or a reader trips on."""


def _apply(edit: Edit, root: Path) -> None:
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    shards = [p for p in files if p.suffix == ".arrow"] or files
    metadata = [p for p in files if p.suffix in (".json", ".jsonl")] or files
    if edit.kind == "metadata":
        target = metadata[edit.pick % len(metadata)]
        target.write_bytes(HOSTILE_JSON[edit.value % len(HOSTILE_JSON)])
    elif edit.kind in ("shard_cut", "shard_flip"):
        target = shards[edit.pick % len(shards)]
        data = bytearray(target.read_bytes())
        at = edit.value % max(len(data), 1)
        if edit.kind == "shard_cut":
            del data[at:]
        elif data:
            data[at] ^= 1 + edit.value % 255
        target.write_bytes(bytes(data))
    elif edit.kind == "shard_meta":
        _replace_shard_meta(shards[edit.pick % len(shards)], edit.value)
    elif edit.kind == "shard_null":
        _null_a_value(shards[edit.pick % len(shards)], edit.value)
    elif edit.kind == "rename":
        target = files[edit.pick % len(files)]
        names = ("v00000000", "w0-00000000-2.arrow", ".hidden", "x.arrow", "w0-99999999-0.arrow",
                 f"w0-00000000-2.arrow{'.tmp-' if edit.value % 2 else ''}")
        target.rename(target.with_name(names[edit.value % len(names)]))
    elif edit.kind == "targeted":
        TARGETED[edit.value % len(TARGETED)](root)
    else:
        _plant_link(edit, root, files)


def _replace_meta(path: Path, key: bytes, value: bytes) -> None:
    with contextlib.suppress(Exception):  # a shard an earlier edit already broke stays as it is
        path.write_bytes(with_meta(path.read_bytes(), key, value))


def _replace_shard_meta(path: Path, value: int) -> None:
    from pipelines_lib.trajectory.codec import SHARD_META_KEY
    from pipelines_lib.trajectory.schema import SCHEMA_VERSION_KEY

    _replace_meta(path, (SCHEMA_VERSION_KEY, SHARD_META_KEY)[value % 2], HOSTILE_META[value % len(HOSTILE_META)])


def _edit_table(path: Path, edit: Callable[[Any], Any]) -> None:
    import pyarrow as pa

    with contextlib.suppress(Exception):  # a shard an earlier edit already broke stays as it is
        path.write_bytes(ipc(edit(pa.ipc.open_file(pa.BufferReader(path.read_bytes())).read_all())))


def _set_first(table: Any, i: int | str, value: Any) -> Any:
    """``table`` with the first value of column ``i`` replaced, the column declared nullable (the IPC reader lets
    both by)."""
    import pyarrow as pa

    i = table.schema.get_field_index(i) if isinstance(i, str) else i
    column = table.column(i)
    return table.set_column(i, table.schema.field(i).with_nullable(True),
                            pa.array([value, *column.to_pylist()[1:]], column.type))


def _null_a_value(path: Path, value: int) -> None:
    """The first value of one column made null."""
    _edit_table(path, lambda t: _set_first(t, value % t.num_columns, None))


def _plant_link(edit: Edit, root: Path, files: list[Path]) -> None:
    folders = sorted({p.parent for p in files})
    folder = folders[edit.pick % len(folders)]
    name = f"w7-{edit.value % 100:08d}-2.arrow" if "trajectories" in folder.parts else f"{edit.value % 100:08d}.json"
    link = folder / name
    if link.exists() or link.is_symlink():
        return
    if edit.kind == "loop":
        os.symlink(name, link)
    elif edit.kind == "outside":
        os.symlink("/etc/hostname", link)
    elif edit.kind == "folder_link":
        os.symlink(root, link)
    else:
        os.symlink(folder / "no-such-object", link)


def check_campaign(case: CampaignCase) -> None:
    from pipelines_lib import cli

    with tempfile.TemporaryDirectory(prefix="rollstream-fuzz-") as d:
        root = Path(d) / "campaign"
        shutil.copytree(_base_campaign(), root, symlinks=True)
        for edit in case.edits:
            _apply(edit, root)
        argv = [a.format(c=root, scratch=d) for a in COMMANDS[case.command]]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(argv)
            except Exception as e:  # noqa: BLE001 - an exception out of main is the traceback the user would see
                raise ContractViolation(f"{case.command} raised {type(e).__name__}: {e}") from e
    lines = err.getvalue().splitlines()
    if "Traceback" in err.getvalue():
        raise ContractViolation(f"{case.command} printed a traceback: {err.getvalue()[-500:]}")
    if code == 2:  # progress lines and skipped-shard warnings may come first; the last line says why it stopped
        if not lines or not lines[-1].startswith(f"rollstream {case.command}: "):
            raise ContractViolation(f"{case.command} exit 2 without a line naming it: {lines[-3:]}")
    elif code not in (0, 1) or not out.getvalue().strip():
        raise ContractViolation(f"{case.command} exit {code} without a report")


def campaign_inputs() -> Any:
    import hypothesis.strategies as st

    edit = st.builds(Edit, kind=st.sampled_from(EDIT_KINDS), pick=st.integers(0, 10**6), value=st.integers(0, 10**6))
    return st.builds(CampaignCase, edits=st.lists(edit, min_size=1, max_size=3).map(tuple),
                     command=st.sampled_from(sorted(COMMANDS)))


__all__ = ["COMMANDS", "EDIT_KINDS", "CampaignCase", "Edit", "campaign_inputs", "check_campaign"]
