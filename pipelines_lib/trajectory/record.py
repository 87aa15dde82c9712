"""Python-side trajectory records and their exact conversion to and from ``TRAJECTORY_SCHEMA`` rows.

The episode runner builds ``Trajectory`` objects; the shard writer turns whole groups of them into one Arrow
table with ``to_table``; readers that want objects back use ``from_table``. Nothing else knows the columns.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from pipelines_lib.trajectory.schema import ROLES, STATUSES, TOKEN_COLUMNS, TRAJECTORY_SCHEMA


def utc_now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


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

    @property
    def trajectory_id(self) -> str:
        return f"{self.prompt_id}/{self.sample_idx}/{self.worker_id}"

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"Trajectory.status must be one of {STATUSES}, got {self.status!r}")


def _list_column(values: list[Sequence], type_: pa.DataType) -> pa.Array:
    """A list<type> column built from one flat NumPy buffer (Python-level appends are the slow path)."""
    lengths = np.fromiter((len(v) for v in values), dtype=np.int32, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate([np.asarray(v) for v in values]) if values else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat.astype(type_.to_pandas_dtype()), type_))


def to_table(trajectories: Iterable[Trajectory]) -> pa.Table:
    """Rows in the given order, typed by ``TRAJECTORY_SCHEMA`` (metadata included)."""
    trajectories = list(trajectories)
    columns: dict[str, Any] = {
        "trajectory_id": [t.trajectory_id for t in trajectories],
        "turns": [[asdict(turn) for turn in t.turns] for t in trajectories],
        "reward_parts": [list(t.reward_parts.items()) for t in trajectories],
        "timings": [asdict(t.timings) for t in trajectories],
    }
    for name in ("group_id", "prompt_id", "sample_idx", "group_size", "worker_id", "prompt_len", "reward", "status",
                 "env_name", "task_id", "tokenizer_hash", "engine_info"):
        columns[name] = [getattr(t, name) for t in trajectories]
    for name in TOKEN_COLUMNS:
        columns[name] = _list_column([getattr(t, name) for t in trajectories],
                                     TRAJECTORY_SCHEMA.field(name).type.value_type)
    return pa.Table.from_pydict(columns, schema=TRAJECTORY_SCHEMA)


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
            )
        )
    return out


