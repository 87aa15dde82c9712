"""Python-side trajectory records and their exact conversion to and from ``TRAJECTORY_SCHEMA`` rows.

The episode runner builds ``Trajectory`` objects; the shard writer turns whole groups of them into one Arrow
table with ``to_table``; readers that want objects back use ``from_table``. Nothing else knows the columns.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain, compress

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines_lib.trajectory.schema import ROLES, STATUSES, TOKEN_COLUMNS, TRAJECTORY_SCHEMA


@dataclass(frozen=True, kw_only=True)
class Turn:
    """Tokens ``[start, end)`` of a trajectory came from ``role``."""

    role: str
    start: int
    end: int
    tool_name: str | None = None
    latency_s: float | None = None
    """Wall time of the tool call (tool turns) or of the generation (assistant turns)."""
    error: str | None = None
    """Error kind of a failed tool call (``tool_error``, ``timeout``, ``parse_error``...)."""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Turn.role must be one of {ROLES}, got {self.role!r}")


@dataclass(frozen=True, kw_only=True)
class Timings:
    queue_s: float = 0.0
    generate_s: float = 0.0
    env_s: float = 0.0
    reward_s: float = 0.0
    started_at: str = ""
    finished_at: str = ""


@dataclass(frozen=True, kw_only=True)
class Trajectory:
    """One episode, exactly as the trainer will see it. Token lists have equal length."""

    group_id: str
    prompt_id: str
    sample_idx: int
    group_size: int
    worker_id: str
    tokens: Sequence[int]
    loss_mask: Sequence[int]
    logprobs: Sequence[float]
    policy_version: Sequence[int]
    prompt_len: int
    turns: Sequence[Turn]
    reward: float
    reward_parts: dict[str, float] = field(default_factory=dict)
    status: str = "ok"
    timings: Timings = field(default_factory=Timings)
    env_name: str = ""
    task_id: str = ""
    tokenizer_hash: str = ""
    engine_info: str = "{}"
    status_reason: str | None = None
    """What failed, for an infrastructure failure (``schema.INFRA_STATUSES``); None otherwise."""

    @property
    def trajectory_id(self) -> str:
        return f"{self.prompt_id}/{self.sample_idx}/{self.worker_id}"

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"Trajectory.status must be one of {STATUSES}, got {self.status!r}")


def _offsets(lengths: Iterable[int]) -> pa.Array:
    """int32 list offsets ``[0, l0, l0+l1, ...]``; a total past int32 raises instead of wrapping."""
    return pa.array(list(accumulate(lengths, initial=0)), pa.int32())


@functools.cache
def _numpy_dtype(type_: pa.DataType) -> np.dtype:
    """The NumPy dtype of an Arrow primitive type. Not ``DataType.to_pandas_dtype``: before pyarrow 26 it imports
    pandas, which the library does not need, so every shard write failed where pandas is not installed."""
    return pa.array([], type_).to_numpy(zero_copy_only=False).dtype


def _list_column(values: list[Sequence], type_: pa.ListType) -> pa.Array:
    """A list<number> column: offsets plus one flat NumPy buffer filled straight from the Python sequences.

    ``np.fromiter`` over the chained rows touches each element once; per-row ``np.asarray`` or ``pa.array`` on
    nested lists cost more. An out-of-range value raises ``OverflowError`` rather than wrapping.
    """
    offsets = _offsets(map(len, values))
    flat = np.fromiter(chain.from_iterable(values), dtype=_numpy_dtype(type_.value_type), count=offsets[-1].as_py())
    return pa.ListArray.from_arrays(offsets, pa.array(flat, type_.value_type), type=type_)


def _struct_column(items: Sequence[object], type_: pa.StructType) -> pa.StructArray:
    """A struct column from the same-named attributes of ``items`` (dataclasses), one typed array per field."""
    fields = list(type_)
    return pa.StructArray.from_arrays(
        [pa.array([getattr(x, f.name) for x in items], f.type) for f in fields], fields=fields)


def group_min_version(group: Sequence[Trajectory]) -> int:
    """Oldest policy version over the loss tokens of a group (0 if it has none): the group's ``version``."""
    for t in group:
        if len(t.policy_version) != len(t.loss_mask):
            raise ValueError(f"{t.trajectory_id}: policy_version has {len(t.policy_version)} entries, "
                             f"loss_mask {len(t.loss_mask)}")
    # ``compress`` walks the token lists in C: a per-token Python loop here cost as much as the Arrow conversion.
    oldest = [min(compress(t.policy_version, t.loss_mask), default=None) for t in group]
    return min((v for v in oldest if v is not None), default=0)


def _group_versions(trajectories: Sequence[Trajectory]) -> list[int]:
    """The ``version`` column: each row's group's ``group_min_version`` (rows grouped by ``group_id``)."""
    groups: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.group_id, []).append(t)
    version = {gid: group_min_version(g) for gid, g in groups.items()}
    return [version[t.group_id] for t in trajectories]


def table_group_versions(table: pa.Table) -> pa.Array:
    """``group_min_version`` of each row's group, computed on a table (for shards written before ``version``).

    Rows whose ``policy_version`` and ``loss_mask`` differ in length are left out of their group's minimum
    (``validate_table`` reports them).
    """
    aligned = table.filter(pc.equal(pc.list_value_length(table.column("policy_version")),
                                     pc.list_value_length(table.column("loss_mask"))))
    # NumPy over the flat token columns: an Arrow group_by starts an execution plan per call, which cost more
    # than everything else an audit does with a small shard.
    code_of: dict[str, int] = {}
    row_code = np.array([code_of.setdefault(g, len(code_of)) for g in aligned.column("group_id").to_pylist()],
                        np.int64)
    versions = aligned.column("policy_version").combine_chunks()
    parents = pc.list_parent_indices(versions).to_numpy(zero_copy_only=False)
    v = pc.list_flatten(versions).to_numpy(zero_copy_only=False).astype(np.int64)
    on_loss = pc.list_flatten(aligned.column("loss_mask").combine_chunks()).to_numpy(zero_copy_only=False) == 1
    none = np.iinfo(np.int64).max
    oldest = np.full(len(code_of), none, np.int64)
    np.minimum.at(oldest, row_code[parents[on_loss]], v[on_loss])
    by_group = {g: int(oldest[c]) for g, c in code_of.items() if oldest[c] != none}
    return pa.array([by_group.get(g, 0) for g in table.column("group_id").to_pylist()], pa.int32())


def to_table(trajectories: Iterable[Trajectory]) -> pa.Table:
    """Rows in the given order, typed by ``TRAJECTORY_SCHEMA`` (metadata included).

    Built column by column (one typed array per field, list columns as offsets + flat values), with no row
    dicts: the shard writer calls this for every shard it commits, and Python-to-Arrow conversion is most of
    its cost. The result equals ``Table.from_pylist`` of the same rows (tests pin that).
    """
    trajectories = list(trajectories)
    columns: dict[str, pa.Array] = {"trajectory_id": pa.array([t.trajectory_id for t in trajectories], pa.string())}
    for name in ("group_id", "prompt_id", "sample_idx", "group_size", "worker_id", "prompt_len", "reward", "status",
                 "env_name", "task_id", "tokenizer_hash", "engine_info", "status_reason"):
        columns[name] = pa.array([getattr(t, name) for t in trajectories], TRAJECTORY_SCHEMA.field(name).type)
    for name in TOKEN_COLUMNS:
        columns[name] = _list_column([getattr(t, name) for t in trajectories], TRAJECTORY_SCHEMA.field(name).type)
    columns["version"] = pa.array(_group_versions(trajectories), pa.int32())  # after policy_version: it checks the range
    turns_type = TRAJECTORY_SCHEMA.field("turns").type
    columns["turns"] = pa.ListArray.from_arrays(
        _offsets(len(t.turns) for t in trajectories),
        _struct_column([turn for t in trajectories for turn in t.turns], turns_type.value_type), type=turns_type)
    parts_type = TRAJECTORY_SCHEMA.field("reward_parts").type
    columns["reward_parts"] = pa.MapArray.from_arrays(
        _offsets(len(t.reward_parts) for t in trajectories),
        pa.array([k for t in trajectories for k in t.reward_parts], parts_type.key_type),
        pa.array([v for t in trajectories for v in t.reward_parts.values()], parts_type.item_type), type=parts_type)
    columns["timings"] = _struct_column([t.timings for t in trajectories], TRAJECTORY_SCHEMA.field("timings").type)
    return pa.Table.from_arrays([columns[name] for name in TRAJECTORY_SCHEMA.names], schema=TRAJECTORY_SCHEMA)


def from_table(table: pa.Table) -> list[Trajectory]:
    out = []
    for row in table.to_pylist():
        out.append(
            Trajectory(
                group_id=row["group_id"],
                prompt_id=row["prompt_id"],
                sample_idx=row["sample_idx"],
                group_size=row["group_size"],
                worker_id=row["worker_id"],
                tokens=row["tokens"],
                loss_mask=row["loss_mask"],
                logprobs=row["logprobs"],
                policy_version=row["policy_version"],
                prompt_len=row["prompt_len"],
                turns=[Turn(**turn) for turn in row["turns"]],
                reward=row["reward"],
                reward_parts=dict(row["reward_parts"]),
                status=row["status"],
                timings=Timings(**row["timings"]),
                env_name=row["env_name"],
                task_id=row["task_id"],
                tokenizer_hash=row["tokenizer_hash"],
                engine_info=row["engine_info"],
                status_reason=row["status_reason"],
            )
        )
    return out


