"""What the trainer needs of a group beyond the shard invariants (``validate.py``), checked without raising.

A shard can satisfy every invariant and still be something the trainer cannot train on: a group of another
size than the campaign's G, a row longer than the trainer takes (its largest sequence bucket, within the
model's ``max_seq_len``), token ids outside the model's vocabulary (or negative), a reward beyond
``MAX_ABS_REWARD``, tokens stamped with a policy version nobody has published yet, groups whose rows are
interleaved (the writer stores each group's rows contiguously, and consumption logs name row ranges), or a
group filed under a version folder other than its oldest policy version. The tailer skips such groups with
the reason these functions return (the trainer writes it into its consumption log), and the audit reports
the same reasons as findings, so the two never disagree on what is trainable.

``group_digest`` hashes what a step trains on in a group; the consumption log records it, and a restarted trainer
replaying the step from the shard refuses rows that no longer hash the same.
"""

from __future__ import annotations

import json
from hashlib import blake2b

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines_lib.trajectory.needs import TrainerNeeds
from pipelines_lib.trajectory.schema import INFRA_STATUSES

MAX_ABS_REWARD = 1e6
"""Largest reward magnitude a trainable group may carry. Rewards are finite by the shard invariants, but 3e38 is
finite too: its square overflows float32 in the group's variance and the advantages become NaN. The environments
reward in [-1, 1] plus small shaping terms; 1e6 leaves a custom reward six orders of magnitude of room while a
group's summed squares stay far inside float32."""


def group_runs(table: pa.Table) -> tuple[list[tuple[int, int, str]], str | None]:
    """Contiguous row ranges ``(start, end, group_id)`` in row order, and why they are not whole groups (None:
    every group's rows are contiguous)."""
    ids = table.column("group_id").to_pylist()
    runs: list[tuple[int, int, str]] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[start]:
            runs.append((start, i, ids[start]))
            start = i
    first: dict[str, int] = {}
    for s, _, gid in runs:
        if gid in first:
            return runs, (f"rows of group {gid} are not contiguous (rows from {first[gid]} and from {s}): "
                          f"groups are interleaved")
        first[gid] = s
    return runs, None


def group_problem(group: pa.Table, needs: TrainerNeeds, *, folder_version: int | None = None,
                  newest_version: int | None = None) -> str | None:
    """Why the trainer cannot train on ``group`` (the rows of one group), or None.

    ``folder_version``: the version folder of the shard, which must be the group's oldest policy version
    over its loss tokens (0 when it has none), as the writer files it. ``newest_version``: the newest
    published version; a token stamped later cannot exist.
    """
    gid = group.column("group_id")[0].as_py()
    if group.num_rows != needs.group_size:
        return f"group {gid} has {group.num_rows} rows, the campaign's group_size is {needs.group_size}"
    tokens = group.column("tokens")
    longest = pc.max(pc.list_value_length(tokens)).as_py() or 0
    if longest > needs.max_tokens:
        return (f"group {gid} has a row of {longest} tokens, over the {needs.max_tokens} the trainer takes (its "
                f"largest bucket, within the model's max_seq_len)")
    ids = pc.min_max(pc.list_flatten(tokens)).as_py()
    if ids["min"] is not None and (ids["min"] < 0 or ids["max"] >= needs.vocab_size):
        return (f"group {gid} has token ids in [{ids['min']}, {ids['max']}], outside the vocabulary "
                f"[0, {needs.vocab_size})")
    worst = pc.max(pc.abs(group.column("reward"))).as_py()
    if worst is not None and worst > MAX_ABS_REWARD:
        return f"group {gid} has a reward of magnitude {worst:g}, beyond the bound {MAX_ABS_REWARD:g}"
    versions = pc.list_flatten(group.column("policy_version"))
    on_loss = pc.filter(versions, pc.equal(pc.list_flatten(group.column("loss_mask")), 1))
    newest = pc.max(versions).as_py()
    if newest_version is not None and newest is not None and newest > newest_version:
        return f"group {gid} has tokens of policy version {newest}, newer than the newest published {newest_version}"
    oldest = pc.min(on_loss).as_py()
    oldest = 0 if oldest is None else oldest
    if folder_version is not None and oldest != folder_version:
        return (f"group {gid}'s oldest policy version is {oldest} but it is filed under v{folder_version:08d} "
                f"(copied into another version folder?)")
    return None


def _per_group(values_n: np.ndarray, starts_g: np.ndarray, ufunc: np.ufunc) -> np.ndarray:
    """``ufunc`` reduced over each segment ``[starts_g[i], starts_g[i + 1])`` of ``values_n`` (segments non-empty)."""
    return ufunc.reduceat(values_n, starts_g) if len(starts_g) else np.zeros(0, values_n.dtype)


def _flat(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(row lengths, flattened values) of list column ``name``; a null row has length -1."""
    column = table.column(name)
    lengths_r = pc.fill_null(pc.list_value_length(column), -1).to_numpy()
    return lengths_r, pc.list_flatten(column).to_numpy(zero_copy_only=False)


def clean_groups(table: pa.Table, bounds_g2: np.ndarray, needs: TrainerNeeds, *, folder_version_g: np.ndarray,
                 newest_version: int | None, infra: bool) -> np.ndarray:
    """Which groups (rows ``[bounds_g2[g, 0], bounds_g2[g, 1])`` of ``table``, consecutive and covering every row,
    filed under ``folder_version_g[g]``) surely have no ``group_problem`` (nor, with ``infra``, an ``infra_problem``): the same checks over every group
    at once, so a reader calls those functions, for the reason, only on the groups left out. Conservative: a
    group with a null list, lists of unequal lengths or no tokens is left out for them to judge."""
    n_groups = len(bounds_g2)
    if n_groups == 0:
        return np.zeros(0, bool)
    starts_g, ends_g = bounds_g2[:, 0], bounds_g2[:, 1]
    len_r, ids_n = _flat(table, "tokens")
    pv_len_r, pv_n = _flat(table, "policy_version")
    mask_len_r, mask_n = _flat(table, "loss_mask")
    odd_r = (len_r < 0) | (pv_len_r != len_r) | (mask_len_r != len_r)
    tok_start_r = np.concatenate([[0], np.cumsum(np.maximum(len_r, 0))])
    tok_start_g, tok_end_g = tok_start_r[starts_g], tok_start_r[ends_g]
    bad = ((ends_g - starts_g) != needs.group_size) | (tok_end_g == tok_start_g)
    bad |= _per_group(len_r, starts_g, np.maximum) > needs.max_tokens
    absurd_r = np.abs(table.column("reward").to_numpy(zero_copy_only=False)) > MAX_ABS_REWARD
    bad |= _per_group(absurd_r.astype(np.int8), starts_g, np.maximum).astype(bool)
    if odd_r.any():  # lists of unequal lengths: the flat arrays do not line up, so the per-group checks judge
        return np.zeros(n_groups, bool)
    if bad.all():
        return ~bad
    seg = np.minimum(tok_start_g, max(len(ids_n) - 1, 0))  # empty-token groups are already bad
    bad |= (_per_group(ids_n, seg, np.minimum) < 0) | (_per_group(ids_n, seg, np.maximum) >= needs.vocab_size)
    if newest_version is not None:
        bad |= _per_group(pv_n, seg, np.maximum) > newest_version
    none = np.iinfo(np.int64).max  # no loss token: group_problem takes the oldest version as 0
    oldest_g = _per_group(np.where(mask_n == 1, pv_n.astype(np.int64), none), seg, np.minimum)
    oldest_g = np.where(oldest_g == none, 0, oldest_g)
    bad |= oldest_g != folder_version_g
    if infra:
        failed_r = pc.fill_null(pc.is_in(table.column("status"), pa.array(INFRA_STATUSES)), True).to_numpy(
            zero_copy_only=False)
        bad |= _per_group(failed_r.astype(np.int8), starts_g, np.maximum).astype(bool)
    return ~bad


DIGEST_COLUMNS = ("trajectory_id", "group_id", "sample_idx", "prompt_len", "tokens", "loss_mask", "logprobs",
                  "policy_version", "reward", "status")
"""What a step's batch is built from (and the group's identity): the columns ``group_digest`` covers."""


def group_digest(group: pa.Table) -> str:
    """A content hash (hex) of ``DIGEST_COLUMNS`` of ``group`` (the rows of one group, null-free: validated).

    Built from the values, not from an encoding (Arrow IPC's framing may differ between versions): per column its
    name, for a list column its row lengths, then its values, numbers as little-endian bytes of their type and
    strings as a JSON list.
    """
    h = blake2b(digest_size=16)
    for name in DIGEST_COLUMNS:
        column = group.column(name).combine_chunks()
        h.update(name.encode())
        if pa.types.is_list(column.type):
            h.update(pc.list_value_length(column).to_numpy(zero_copy_only=False).astype("<i8").tobytes())
            column = pc.list_flatten(column)
        if pa.types.is_string(column.type):
            h.update(json.dumps(column.to_pylist()).encode())
        else:
            values = column.to_numpy(zero_copy_only=False)
            h.update(values.astype(values.dtype.newbyteorder("<"), copy=False).tobytes())
    return h.hexdigest()


INFRA_REASON = "infrastructure failure"
"""How every ``infra_problem`` reason starts (what the trainer's metrics and the drills count by)."""


def infra_problem(group: pa.Table) -> str | None:
    """Why ``group`` is kept out of the loss for an infrastructure failure, or None.

    A trajectory whose sandbox, dependency, storage or engine failed (``INFRA_STATUSES``) says nothing about the
    policy, and its failure reward would push the whole group's advantages; so the group trains on nothing.
    The reason names the first such trajectory and what failed.
    """
    statuses = group.column("status").to_pylist()
    failed = [i for i, s in enumerate(statuses) if s in INFRA_STATUSES]
    if not failed:
        return None
    i = failed[0]
    return (f"{INFRA_REASON}: group {group.column('group_id')[0].as_py()} has {len(failed)} "
            f"trajectory(ies) with status in {INFRA_STATUSES} (sample {group.column('sample_idx')[i].as_py()}: "
            f"{statuses[i]}: {group.column('status_reason')[i].as_py()})")
