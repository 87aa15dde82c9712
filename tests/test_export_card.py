"""An export is a dataset with a card: the columns' meanings, counts per version, the campaign's lineage, the audit's
verdict and the config hash beside the Parquet files, times as Arrow timestamps, and a rerun that says what it
found already exported."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from drills.operator_writes import seed_campaign
from pipelines_lib.audit.card import config_hash
from pipelines_lib.audit.export import export_parquet
from pipelines_lib.records import CampaignManifest
from pipelines_lib.stages.audit import audit
from pipelines_lib.stages.fork import fork_campaign
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.codec import read_shard
from pipelines_lib.trajectory.schema import TRAJECTORY_SCHEMA


def test_a_forks_export_carries_a_card_with_meanings_counts_lineage_audit_and_config_hash(tmp_path: Path) -> None:
    parent = Store(str(seed_campaign(tmp_path)))
    fork = Store(str(tmp_path / "fork"))
    fork_campaign(parent, 3, fork, {"rollout.eta": 0})
    audit(fork)
    out = Store(str(tmp_path / "out"))
    export_parquet(fork, out)
    card = json.loads((tmp_path / "out" / "_dataset_card.json").read_text())
    assert card["campaign"]["config_hash"] == config_hash(CampaignManifest.read(fork).config)
    assert [(p["url"], p["step"], p["config_diff"]) for p in card["lineage"]] == [
        (parent.url, 3, {"rollout.eta": {"parent": 1, "fork": 0}})]
    assert card["audit"]["ok"] is True and card["audit"]["path"].startswith(fork.url + "/audit/")
    assert card["versions"] == [{"version": 0, "path": "version=0/data.parquet", "rows": 8, "shards": 2,
                                 "stale": False}]
    docs = {f["name"]: f["doc"] for f in card["schema"]}
    assert docs["reward"] == TRAJECTORY_SCHEMA.field("reward").metadata[b"doc"].decode()
    assert set(docs) == {*TRAJECTORY_SCHEMA.names, "campaign"} and all(docs.values())
    markdown = (tmp_path / "out" / "_dataset_card.md").read_text()
    assert f"forked from `{parent.url}` at step 3" in markdown and card["campaign"]["config_hash"] in markdown
    assert "| `reward` | `float` | final scalar reward |" in markdown


def test_times_are_exported_as_utc_timestamps_equal_to_the_shards_iso_text(tmp_path: Path) -> None:
    store = Store(str(seed_campaign(tmp_path)))
    export_parquet(store, Store(str(tmp_path / "out")))
    table = pq.read_table(tmp_path / "out" / "version=0" / "data.parquet")
    timings = table.schema.field("timings").type
    assert timings.field("started_at").type == pa.timestamp("us", tz="UTC") == timings.field("finished_at").type
    shard, _ = read_shard(store, "trajectories/v00000000/" + sorted(
        p.name for p in (tmp_path / "campaign" / "trajectories" / "v00000000").iterdir())[0])
    first = shard.column("timings")[0].as_py()["started_at"]
    assert table.column("timings")[0].as_py()["started_at"] == dt.datetime.fromisoformat(first)


def test_a_rerun_says_what_was_already_exported_and_writes_no_second_card(tmp_path: Path) -> None:
    store = Store(str(seed_campaign(tmp_path)))
    out = Store(str(tmp_path / "out"))
    first: list[str] = []
    export_parquet(store, out, progress=first.append)
    assert first[-1].startswith("2 new shards (8 rows) in 1 versions; 0 already exported")
    again: list[str] = []
    results = export_parquet(store, out, progress=again.append)
    assert [(r.status, r.rows, r.shards) for r in results] == [("unchanged", 8, 2)]
    assert "unchanged, already exported: 8 rows from 2 shards" in again[0]
    assert again[-1].startswith("0 new shards (0 rows) in 0 versions; 2 already exported in 1 unchanged versions")
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.is_file()) == ["_dataset_card.json",
                                                                                   "_dataset_card.md"]
    audit(store)  # something new to say: a second card beside the first, never over it
    export_parquet(store, out)
    assert json.loads((tmp_path / "out" / "_dataset_card.1.json").read_text())["audit"]["ok"] is True
