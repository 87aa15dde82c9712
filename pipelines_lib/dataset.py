"""The prep stage: tasks from a built-in generator or a user's file → ``dataset/<split>.arrow``.

``source`` is ``builtin:<env>`` (the env's seeded generator under the campaign's ``env.options``; its own disjoint
train/held-out splits) or a JSONL / Parquet / Arrow file (local path or any fsspec URL such as ``gs://``). File
rows are mapped with ``columns`` (our name → the file's column name) onto the task fields ``task_id``, ``prompt``,
``answer``, and optionally ``env_name`` and ``meta``; rows go to the held-out split by a hash of their ``task_id``
(so a row's split never depends on the seed or on the file's order). Bad rows are skipped and reported by their
1-based line/row number in the manifest, and the stage fails when more than ``max_bad_fraction`` are bad.

Outputs are create-only and ``dataset/_SUCCESS`` (the manifest: counts, content hashes, bad rows) is
written last; a rerun that finds it returns it without doing anything.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines_lib.envs import env_class
from pipelines_lib.envs.base import BUILTIN_SOURCE, Task, split_of
from pipelines_lib.envs.spec import EnvSpec
from pipelines_lib.records import DatasetSuccess, SplitInfo
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store

DATASET_SCHEMA = pa.schema([
    pa.field("task_id", pa.string(), nullable=False),
    pa.field("env_name", pa.string(), nullable=False),
    pa.field("prompt", pa.string(), nullable=False),
    pa.field("answer", pa.string(), nullable=False),
    pa.field("meta", pa.string(), nullable=False),
])
TASK_FIELDS = ("task_id", "env_name", "prompt", "answer", "meta")


class DatasetError(ValueError):
    """The source could not be turned into a dataset; the message names the source and rows."""


@dataclass(frozen=True, kw_only=True)
class DatasetConfig:
    source: str = "builtin:arithmetic"
    """``builtin:<env>`` or a path/URL to a ``.jsonl``, ``.parquet`` or ``.arrow`` file."""
    seed: int = 0
    """Seed of the built-in generator (tasks and their order)."""
    n_train: int = 2000
    """Tasks in the train split (built-in sources; files keep all their train rows)."""
    n_heldout: int = 100
    """Tasks in the held-out split (built-in sources)."""
    env_name: str = "arithmetic"
    """Env that scores file rows lacking an ``env_name`` column."""
    columns: dict[str, str] = field(default_factory=dict)
    """File sources: our field name → the file's column name, e.g. ``{"prompt": "question"}``."""
    heldout_fraction: float = 0.1
    """File sources: share of rows (by hash of task_id) in the held-out split."""
    max_bad_fraction: float = 0.05
    """File sources: fail when more rows than this share are malformed."""

    def __post_init__(self) -> None:
        if self.n_train < 1 or self.n_heldout < 1:
            raise ValueError(f"DatasetConfig.n_train/n_heldout must be >= 1, got {self.n_train}/{self.n_heldout}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"DatasetConfig.heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        if not 0.0 <= self.max_bad_fraction <= 1.0:
            raise ValueError(f"DatasetConfig.max_bad_fraction must be in [0, 1], got {self.max_bad_fraction}")
        unknown = set(self.columns) - set(TASK_FIELDS)
        if unknown:
            raise ValueError(f"DatasetConfig.columns has unknown task fields {sorted(unknown)}; valid: {TASK_FIELDS}")
        if self.builtin_env is not None:
            env_class(self.builtin_env)  # validates the name against the registry

    @property
    def builtin_env(self) -> str | None:
        """The env whose own generator ``source`` names (``builtin:<env>``); None for a file source."""
        return self.source.removeprefix(BUILTIN_SOURCE) if self.source.startswith(BUILTIN_SOURCE) else None

    @classmethod
    def tiny(cls) -> DatasetConfig:
        return cls(n_train=256, n_heldout=128)


def _table(tasks: list[Task]) -> pa.Table:
    return pa.Table.from_pylist([t.to_record() for t in tasks], schema=DATASET_SCHEMA)


def _encode(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_table(table)
    return sink.getvalue()


def _read_rows(source: str, storage_options: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        with fsspec.open(source, "rb", **storage_options) as f:
            data = f.read()
    except (OSError, ValueError) as e:
        raise DatasetError(f"{source}: cannot read ({type(e).__name__}: {e})") from e
    try:
        if source.endswith((".jsonl", ".json")):
            rows = []
            for i, line in enumerate(data.decode().splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    row = {"__error__": f"line {i}: not JSON ({e.msg})"}
                rows.append({**row, "__line__": i} if isinstance(row, dict) else
                            {"__error__": f"line {i}: not a JSON object", "__line__": i})
            return rows
        if source.endswith(".parquet"):
            table = pq.read_table(pa.BufferReader(data))
        elif source.endswith((".arrow", ".feather", ".ipc")):
            table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
        else:
            raise DatasetError(f"{source}: unknown file type (use .jsonl, .parquet or .arrow)")
    except (pa.ArrowInvalid, UnicodeDecodeError) as e:
        raise DatasetError(f"{source}: unreadable ({e})") from e
    return [{**row, "__line__": i} for i, row in enumerate(table.to_pylist(), start=1)]


def _row_to_task(row: dict[str, Any], config: DatasetConfig) -> Task:
    if "__error__" in row:
        raise ValueError(row["__error__"].split(": ", 1)[1])
    get = {f: config.columns.get(f, f) for f in TASK_FIELDS}
    missing = [get[f] for f in ("task_id", "prompt", "answer") if row.get(get[f]) in (None, "")]
    if missing:
        raise ValueError(f"missing or empty column(s) {missing}")
    meta = row.get(get["meta"]) or {}
    if isinstance(meta, str):
        meta = json.loads(meta)
    if not isinstance(meta, dict):
        raise ValueError(f"meta must be an object, got {type(meta).__name__}")
    env_name = row.get(get["env_name"]) or config.env_name
    env_class(env_name)
    return Task(task_id=str(row[get["task_id"]]), env_name=env_name, prompt=str(row[get["prompt"]]),
                answer=str(row[get["answer"]]), meta=meta)


def build_splits(config: DatasetConfig, storage_options: dict[str, Any] | None = None, *, env: EnvSpec | None = None
                 ) -> tuple[dict[str, list[Task]], list[str]]:
    """Tasks per split and the list of bad-row reports (no IO to the campaign). A built-in source's tasks come from
    ``env`` (the campaign's, with its options; default: the named env's defaults), which must be the env it names."""
    if config.builtin_env is not None:
        spec = env or EnvSpec(name=config.builtin_env)
        if spec.name != config.builtin_env:
            raise DatasetError(f"{config.source}: the tasks of env {config.builtin_env!r}, but the env given to make "
                               f"them is {spec.name!r}")
        return {
            "train": spec.generate_tasks(seed=config.seed, n=config.n_train, split="train"),
            "heldout": spec.generate_tasks(seed=config.seed, n=config.n_heldout, split="heldout"),
        }, []
    rows = _read_rows(config.source, storage_options or {})
    splits: dict[str, list[Task]] = {"train": [], "heldout": []}
    bad: list[str] = []
    seen: set[str] = set()
    for row in rows:
        try:
            task = _row_to_task(row, config)
            if task.task_id in seen:
                raise ValueError(f"duplicate task_id {task.task_id!r}")
        except (ValueError, TypeError, json.JSONDecodeError) as e:
            bad.append(f"{config.source} row {row['__line__']}: {e}")
            continue
        seen.add(task.task_id)
        splits[split_of(task.task_id, heldout_fraction=config.heldout_fraction)].append(task)
    if not rows or len(bad) > config.max_bad_fraction * len(rows):
        shown = "\n  ".join(bad[:10])
        raise DatasetError(f"{config.source}: {len(bad)} of {len(rows)} rows are bad (limit "
                           f"{config.max_bad_fraction:.0%}):\n  {shown}")
    for split, tasks in splits.items():
        if not tasks:
            raise DatasetError(f"{config.source}: the {split} split is empty ({len(rows)} usable rows)")
    return splits, bad


def prep(store: Store, config: DatasetConfig, *, storage_options: dict[str, Any] | None = None,
         env: EnvSpec | None = None) -> dict[str, Any]:
    """Write ``dataset/`` once; returns the manifest (also stored as ``dataset/_SUCCESS``). ``env``: the campaign's
    env, whose options shape a built-in source's tasks (``build_splits``)."""
    if store.exists(DatasetSuccess.PATH):
        return DatasetSuccess.read(store).to_dict()
    splits, bad = build_splits(config, storage_options, env=env)
    infos: dict[str, SplitInfo] = {}
    for split, tasks in splits.items():
        data = _encode(_table(tasks))
        path = layout.dataset_split(split)
        if not store.exists(path):  # a crashed earlier attempt may have written it already
            store.create(path, data)
        infos[split] = SplitInfo(path=path, rows=len(tasks), sha256=hashlib.sha256(store.read(path)).hexdigest())
    manifest = DatasetSuccess(source=config.source, seed=config.seed, splits=infos, bad_rows=bad)
    manifest.write(store)
    return manifest.to_dict()


def load_split(store: Store, split: str) -> list[Task]:
    """Tasks of a prepared split, in stored order."""
    if not store.exists(DatasetSuccess.PATH):
        raise DatasetError(f"{store.uri('dataset')}: no dataset yet (run the prep stage first)")
    data = store.read(layout.dataset_split(split))
    table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
    return [Task.from_record(r) for r in table.to_pylist()]
