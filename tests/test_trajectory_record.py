"""``to_table`` builds columns directly; these pin it to pyarrow's own row-wise conversion of the same records.

The expected tables come from ``Table.from_pylist`` over row dicts written out field by field here, so a
column the fast path gets wrong (offsets, nullability, a cast) shows up as a table mismatch.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipelines_lib.trajectory.record import Timings, Trajectory, Turn, to_table
from pipelines_lib.trajectory.schema import TRAJECTORY_SCHEMA

INT32_MAX = 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38


def _row(t: Trajectory, version: int) -> dict:
    return {
        "trajectory_id": t.trajectory_id, "group_id": t.group_id, "prompt_id": t.prompt_id,
        "sample_idx": t.sample_idx, "group_size": t.group_size, "worker_id": t.worker_id, "version": version,
        "tokens": list(t.tokens), "loss_mask": list(t.loss_mask), "logprobs": list(t.logprobs),
        "policy_version": list(t.policy_version), "prompt_len": t.prompt_len,
        "turns": [{"role": u.role, "start": u.start, "end": u.end, "tool_name": u.tool_name,
                   "latency_s": u.latency_s, "error": u.error} for u in t.turns],
        "reward": t.reward, "reward_parts": list(t.reward_parts.items()), "status": t.status,
        "timings": {"queue_s": t.timings.queue_s, "generate_s": t.timings.generate_s, "env_s": t.timings.env_s,
                    "reward_s": t.timings.reward_s, "started_at": t.timings.started_at,
                    "finished_at": t.timings.finished_at},
        "env_name": t.env_name, "task_id": t.task_id, "tokenizer_hash": t.tokenizer_hash,
        "engine_info": t.engine_info,
    }


def _traj(idx: int, **kw) -> Trajectory:
    base = dict(group_id="g", prompt_id="p", sample_idx=idx, group_size=3, worker_id="w0", tokens=[5, 6, 7],
                loss_mask=[0, 1, 1], logprobs=[0.0, -0.25, -1.5], policy_version=[-1, 2, 2], prompt_len=1,
                turns=[Turn(role="user", start=0, end=1), Turn(role="assistant", start=1, end=3, latency_s=0.5)],
                reward=1.0, reward_parts={"correct": 1.0})
    return Trajectory(**(base | kw))


EDGE_GROUP = [
    # Unicode everywhere a string goes, a failed tool turn, several reward parts.
    _traj(0, group_id="grüppe/組", prompt_id="プロンプト", worker_id="wörker.0", env_name="環境", task_id="tâche",
          tokens=[1, 2, 3, 4], loss_mask=[0, 1, 0, 1], logprobs=[0.0, -0.5, 0.0, -2.0], policy_version=[-1, 3, -1, 4],
          turns=[Turn(role="user", start=0, end=1), Turn(role="assistant", start=1, end=2, latency_s=0.25),
                 Turn(role="tool", start=2, end=3, tool_name="calc✓", latency_s=1.5, error="timeout—é"),
                 Turn(role="assistant", start=3, end=4)],
          reward_parts={"naïve": 0.5, "正解": 1.0, "": -1.0}, status="tool_error",
          timings=Timings(queue_s=0.125, generate_s=2.5, env_s=1.0, reward_s=0.0,
                          started_at="2026-01-01T00:00:00.000000+00:00", finished_at="2026-01-01T00:00:03.000000+00:00"),
          engine_info='{"kind": "fake", "note": "ü"}'),
    # Zero-length token lists, no turns, no reward parts (an env failure before the first token).
    _traj(1, tokens=[], loss_mask=[], logprobs=[], policy_version=[], prompt_len=0, turns=[], reward_parts={},
          reward=0.0, status="env_error"),
    # Extremes of every token column's type, and a long trajectory.
    _traj(2, tokens=[INT32_MAX, 0, -(2**31)] + list(range(5000)), loss_mask=[1, 0, 1] + [1] * 5000,
          logprobs=[-FLOAT32_MAX, -0.0, -1e-45] + [-0.1] * 5000,
          policy_version=[INT32_MAX, -1, 0] + [7] * 5000, prompt_len=0,
          turns=[Turn(role="assistant", start=0, end=5003, latency_s=FLOAT32_MAX)],
          reward=-FLOAT32_MAX, reward_parts={"x": FLOAT32_MAX}, status="max_tokens"),
]


@pytest.mark.parametrize("rows", [EDGE_GROUP, EDGE_GROUP[1:2], EDGE_GROUP[::-1]], ids=["group", "only-empty", "reversed"])
def test_to_table_equals_pyarrow_row_wise_conversion(rows: list[Trajectory]) -> None:
    # EDGE_GROUP's first row is a group of its own (oldest loss version 3); the other two share a group whose
    # oldest loss-token version is row 2's 0; a group with no loss token at all is version 0.
    version = {EDGE_GROUP[0].group_id: 3, EDGE_GROUP[1].group_id: 0}
    expected = pa.Table.from_pylist([_row(t, version[t.group_id]) for t in rows], schema=TRAJECTORY_SCHEMA)
    table = to_table(rows)
    table.validate(full=True)
    assert table.schema.equals(TRAJECTORY_SCHEMA, check_metadata=True)
    assert table.equals(expected, check_metadata=True)


def test_to_table_keeps_offsets_and_values_checkable_by_hand() -> None:
    table = to_table(EDGE_GROUP)
    assert table.column("tokens").chunk(0).offsets.to_pylist() == [0, 4, 4, 5007]
    assert table.column("turns").chunk(0).offsets.to_pylist() == [0, 4, 4, 5]
    assert table.column("reward_parts").to_pylist()[0] == [("naïve", 0.5), ("正解", 1.0), ("", -1.0)]
    assert table.column("tokens").to_pylist()[2][:3] == [INT32_MAX, 0, -(2**31)]
    assert table.column("logprobs").to_pylist()[0] == [0.0, -0.5, 0.0, -2.0]  # exact in float32
    assert table.column("turns").to_pylist()[0][2] == {"role": "tool", "start": 2, "end": 3, "tool_name": "calc✓",
                                                        "latency_s": 1.5, "error": "timeout—é"}


def test_to_table_of_no_records_is_an_empty_table_with_the_schema() -> None:
    table = to_table([])
    assert table.num_rows == 0 and table.schema.equals(TRAJECTORY_SCHEMA, check_metadata=True)


@pytest.mark.parametrize("column,value", [("tokens", 2**31), ("policy_version", -(2**31) - 1), ("loss_mask", 128)])
def test_to_table_refuses_a_token_value_outside_its_column_type(column: str, value: int) -> None:
    """A value that does not fit raises (as ``Table.from_pylist`` does) instead of wrapping around."""
    with pytest.raises(OverflowError):
        to_table([_traj(0, **{column: [5, value, 7]})])
