"""A lockstep campaign (``CampaignConfig.lockstep()``) is a function of its seeds on one machine: two runs of the
smoke preset with one seed write the same trajectories into the same shards, train on the same groups in the same
order, and publish the same weights, bit for bit."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from pipelines_lib import records
from pipelines_lib.config import CampaignConfig
from pipelines_lib.publish import CampaignWeights
from pipelines_lib.stages.colocated import run_colocated
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.codec import read_shard

PROCESS_OR_CLOCK = ("trajectory_id", "worker_id", "timings")
"""Columns that name the process that wrote a row (its start nonce) or the wall clock; everything else must agree."""


def lockstep_smoke(seed: int) -> CampaignConfig:
    smoke = CampaignConfig.preset("smoke").with_overrides(
        {"seed": seed, "dataset.seed": seed, "sft.seed": seed, "trainer.seed": seed, "eval.versions": "ends"}
    )
    return dataclasses.replace(smoke.lockstep(), placement="colocated")


def shard_rows(store: Store, path: str) -> list[dict[str, Any]]:
    table, _ = read_shard(store, path)
    rows = table.drop_columns(list(PROCESS_OR_CLOCK)).to_pylist()
    for row in rows:
        for turn in row["turns"]:
            turn.pop("latency_s")  # the tool call's measured latency
    return rows


def trained_shards(store: Store) -> list[tuple[int, int, list[dict[str, Any]]]]:
    """(version, seq, rows) of every shard of the versions the trainer trained on, in shard order."""
    trained = {g.version for log in records.consumption_logs(store) for g in log.groups}
    shards = sorted(
        sid
        for v in trained
        for name in store.list(layout.version_dir(v))
        if (sid := layout.parse_shard_path(f"{layout.version_dir(v)}/{name}"))
    )
    return [(sid.version, sid.seq, shard_rows(store, sid.path)) for sid in shards]


def steps(store: Store) -> list[list[tuple[str, int, int, int, int]]]:
    """Per trainer step, the groups it trained on: id, shard (version, seq), rows."""
    return [
        [
            (g.group_id, sid.version, sid.seq, g.row_start, g.row_end)
            for g in log.groups
            if (sid := layout.parse_shard_path(g.shard))
        ]
        for log in records.consumption_logs(store)
    ]


def weights(store: Store) -> dict[int, list[np.ndarray]]:
    published = CampaignWeights(store)
    return {
        v: [np.asarray(leaf) for leaf in jax.tree.leaves(published.load(v))]
        for v in records.published_versions(store)
    }


def test_lockstep_needs_one_worker_whole_prefills_fixed_shapes_every_group_trained_and_a_version_budget() -> None:
    lockstep = CampaignConfig.preset("smoke").lockstep()
    assert (
        lockstep.workers,
        lockstep.rollout.max_groups_per_version,
        lockstep.trainer.skip_zero_advantage,
        lockstep.engine.prefix_reuse,
        lockstep.engine.fixed_shapes,
    ) == (1, 4, False, False, True)
    with pytest.raises(ValueError, match=r"workers=2 .*set workers=1"):
        dataclasses.replace(lockstep, workers=2)
    with pytest.raises(
        ValueError, match=r"max_groups_per_version=16, not trainer.batch_groups x publish_every = 4"
    ):
        lockstep.with_overrides({"rollout.max_groups_per_version": 16})
    with pytest.raises(ValueError, match=r"prefix_reuse=true"):
        lockstep.with_overrides({"engine.prefix_reuse": True})
    with pytest.raises(ValueError, match=r"fixed_shapes=false"):
        lockstep.with_overrides({"engine.fixed_shapes": False})
    with pytest.raises(ValueError, match=r"skip_zero_advantage=true"):
        lockstep.with_overrides({"trainer.skip_zero_advantage": True})
    with pytest.raises(ValueError, match=r"needs max_groups_per_version"):
        lockstep.with_overrides({"rollout.max_groups_per_version": None})


def test_two_lockstep_smoke_campaigns_with_one_seed_write_the_same_shards_and_publish_the_same_weights(
    tmp_path: Path,
) -> None:
    stores = []
    for run in ("a", "b"):
        store = Store(str(tmp_path / run))
        out = run_colocated(store, lockstep_smoke(3), log=lambda line: None, with_audit=False)
        assert out["train"]["steps"] == 4 and out["train"]["version"] == 2
        stores.append(store)
    a, b = stores
    assert steps(a) == steps(b) and [len(s) for s in steps(a)] == [2, 2, 2, 2]
    shards_a = trained_shards(a)
    assert [(v, seq) for v, seq, _ in shards_a] == [(v, seq) for v, seq, _ in trained_shards(b)]
    assert sum(len(rows) for _, _, rows in shards_a) == 2 * 4 * 4  # two versions of 4 groups of 4
    assert shards_a == trained_shards(b)
    weights_a, weights_b = weights(a), weights(b)
    assert sorted(weights_a) == sorted(weights_b) == [0, 1, 2]
    for version, leaves in weights_a.items():
        assert all(np.array_equal(x, y) for x, y in zip(leaves, weights_b[version], strict=True)), version
    # The comparison can tell trajectories apart: another version's groups (other tasks, other weights) differ.
    assert shards_a[0][2] != shards_a[1][2]


def test_fixed_shapes_run_one_decode_program_and_one_prefill_program_per_prompt_bucket() -> None:
    engine = CampaignConfig.preset("smoke").lockstep().engine
    assert engine.row_buckets == (engine.num_slots,) and engine.attention_spans == (engine.blocks_per_sequence,)
    assert (engine.decode_variants, engine.prefill_variants) == (1, len(engine.prefill_buckets))
    assert (engine.rows_for(1), engine.span_for(1)) == (engine.num_slots, engine.blocks_per_sequence)
    unfixed = dataclasses.replace(engine, fixed_shapes=False)
    assert unfixed.decode_variants > 1 and unfixed.rows_for(1) == 1
