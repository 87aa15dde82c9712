"""SQL over a campaign and the HTML viewer: the auditor queries of docs/COMMANDS.md on a real campaign folder, unreadable
shards skipped and reported, gs:// through the emulator, the viewer's pure parts and its files."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from pipelines_lib import cli
from pipelines_lib.audit.sql import campaign_tables, render_text, shard_paths
from pipelines_lib.audit.view import build_view, render_html, sample_groups, write_view
from pipelines_lib.demo import BATCH_GROUPS, GROUP_SIZE, GROUPS_PER_WORKER, VERSIONS, WORKERS
from pipelines_lib.storage.errors import AlreadyExistsError
from pipelines_lib.storage.forked import ForkStore
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.codec import encode_shard, read_shard
from pipelines_lib.trajectory.record import to_table
from pipelines_lib.trajectory.schema import SCHEMA_VERSION_KEY
from pipelines_lib.trajectory.writer import ShardWriter
from tests.conftest import gcs_options
from tests.test_audit import _base, _group

COMMANDS = Path(__file__).resolve().parents[1] / "docs" / "COMMANDS.md"
TRUNCATED = "trajectories/v00000001/cut-00000000.arrow"
OLD_MINOR = "trajectories/v00000002/w9-00000000.arrow"


def documented_queries() -> list[str]:
    block = re.search(r"Five auditor questions.*?```sql\n(.*?)```", COMMANDS.read_text(), re.S)
    assert block, "docs/COMMANDS.md lost its auditor queries"
    return [line for line in block[1].splitlines() if line and not line.startswith("--")]


def run_sql(capsys, url: str, query: str, *extra: str) -> tuple[list[dict], str]:
    assert cli.main(["sql", url, query, "--json", *extra]) == 0
    out, err = capsys.readouterr()
    return json.loads(out), err


def test_the_five_documented_auditor_queries_each_answer_on_a_real_campaign(demo_campaign: Store, capsys) -> None:
    per_version, staleness, dropped, pending, per_worker = (run_sql(capsys, demo_campaign.url, q)[0]
                                                           for q in documented_queries())
    groups_per_version = WORKERS * GROUPS_PER_WORKER  # 3 workers x 4 groups = 12
    assert [(r["version"], r["trajectories"]) for r in per_version] == \
        [(v, groups_per_version * GROUP_SIZE) for v in range(VERSIONS)]  # 48 each
    # Success rates match a plain read of every shard.
    rewards: dict[int, list[float]] = {}
    tables = campaign_tables(demo_campaign)
    for shard in set(tables.tables["trajectories"].to_table(columns=["shard"]).column("shard").to_pylist()):
        table, prov = read_shard(demo_campaign, shard)
        rewards.setdefault(prov["version"], []).extend(table.column("reward").to_pylist())
    assert [r["success_rate"] for r in per_version] == \
        [pytest.approx(sum(x > 0 for x in rewards[v]) / len(rewards[v])) for v in range(VERSIONS)]
    consumed = sum(r["groups"] for r in staleness)
    assert consumed == 10 * BATCH_GROUPS  # the demo's 10 train steps of 4 groups each
    assert {r["staleness"] for r in staleness} <= {0, 1}  # the demo trains with eta = 1
    n_dropped = sum(r["dropped"] for r in dropped)
    assert n_dropped > 0
    assert pending == [{"pending": VERSIONS * groups_per_version - consumed - n_dropped}]  # 60 - 40 - 4
    assert [(r["worker_id"], r["status"], r["trajectories"]) for r in per_worker] == \
        [(f"w{i}", "ok", VERSIONS * GROUPS_PER_WORKER * GROUP_SIZE) for i in range(WORKERS)]  # 80 each


def test_a_truncated_shard_is_skipped_and_reported_not_fatal(local_store: Store, capsys) -> None:
    _base(local_store)  # per version: 2 workers x 2 groups x 2 samples = 8 trajectories
    local_store.create(TRUNCATED, encode_shard(to_table(_group("cut", 1, "cut")), {})[:-100])
    rows, err = run_sql(capsys, local_store.url, "SELECT version, count(*) AS n FROM trajectories GROUP BY 1 ORDER BY 1")
    assert rows == [{"version": 0, "n": 8}, {"version": 1, "n": 8}]
    assert f"skipped unreadable shard {TRUNCATED}" in err and "unreadable Arrow IPC file" in err
    skipped, _ = run_sql(capsys, local_store.url, "SELECT shard FROM skipped_shards")
    assert skipped == [{"shard": TRUNCATED}]


def _eager_read(store: Store) -> pa.Table:
    """Every readable shard decoded whole and concatenated: what ``trajectories`` held before it was a scan."""
    parts = []
    for path in shard_paths(store):
        if path != TRUNCATED:
            table, _ = read_shard(store, path)
            n = table.num_rows
            parts.append(table.append_column("shard", pa.array([path] * n))
                         .append_column("campaign", pa.array(["campaign"] * n)))
    return pa.concat_tables(parts)


def test_the_lazy_trajectories_table_holds_what_reading_every_shard_gives(local_store: Store) -> None:
    _base(local_store)
    old = to_table(_group("old", 2, "w9")).drop_columns(["version"])
    old = old.replace_schema_metadata({SCHEMA_VERSION_KEY: b"1.0"})
    local_store.create(OLD_MINOR, encode_shard(old, {"worker_id": "w9"}))  # read with ``version`` derived
    local_store.create(TRUNCATED, encode_shard(to_table(_group("cut", 1, "cut")), {})[:-100])
    tables = campaign_tables(local_store)
    order = [("shard", "ascending"), ("trajectory_id", "ascending")]
    got = tables.tables["trajectories"].to_table().sort_by(order)
    expected = _eager_read(local_store).sort_by(order)
    assert got.num_rows == 8 + 8 + 2 and got.select(expected.column_names).to_pylist() == expected.to_pylist()
    assert got.column("version").to_pylist()[-2:] == [2, 2]  # the 1.0 shard's, derived from its tokens
    per_shard: dict[str, float] = {}
    for row in expected.select(["shard", "reward"]).to_pylist():
        per_shard[row["shard"]] = per_shard.get(row["shard"], 0.0) + row["reward"]
    assert tables.query("SELECT shard, sum(reward) AS r FROM trajectories GROUP BY 1 ORDER BY 1").to_pylist() == \
        [{"shard": shard, "r": pytest.approx(r)} for shard, r in sorted(per_shard.items())]
    [(shard, reason)] = tables.skipped
    assert shard == TRUNCATED and "unreadable Arrow IPC file" in reason


def test_a_query_reads_only_the_columns_and_shards_it_names(local_store: Store) -> None:
    _base(local_store)
    tables = campaign_tables(local_store)
    plan = tables.query("EXPLAIN SELECT version, avg(reward) FROM trajectories GROUP BY 1").column(1)[0].as_py()
    scan = plan[plan.index("PYTHON_ARROW_SCAN"):]  # the scan's box: its projections, then "~N rows"
    assert set(re.findall(r"\w+", scan.split("Projections:")[1].split("~")[0])) == {"version", "reward"}, plan
    # A filter on ``shard`` reaches the scan: files of the other shards are never opened, even once gone.
    first, *others = shard_paths(local_store)
    for path in others:
        local_store.local_path(path).unlink()
    rows = tables.query(f"SELECT count(*) AS n FROM trajectories WHERE shard = '{first}'").to_pylist()
    assert rows == [{"n": 4}]  # one writer's shard: 2 groups of 2
    with pytest.raises(Exception, match="No such file|not found|Failed to open"):
        tables.query("SELECT count(*) FROM trajectories")


def test_a_forks_table_scans_its_parents_shard_files_where_they_lie(local_store: Store, tmp_path: Path) -> None:
    _base(local_store)  # the parent: versions 0 and 1
    own = Store(str(tmp_path / "fork"))  # the fork's own folder: one group of version 2
    writer = ShardWriter(own, worker_id="w6")
    writer.add_group(_group("mine", 2, "w6"))
    writer.flush()
    view = ForkStore(own, below=local_store, inherits=lambda rel: True)
    assert view.holder(shard_paths(local_store)[0]) is local_store
    rows = campaign_tables(view).query("SELECT version, campaign, count(*) AS n FROM trajectories GROUP BY ALL "
                                       "ORDER BY 1").to_pylist()
    assert rows == [{"version": v, "campaign": "fork", "n": n} for v, n in ((0, 8), (1, 8), (2, 2))]


def test_sql_reads_a_bucket_through_storage_options(gcs_store: Store, gcs_emulator: str, capsys) -> None:
    _base(gcs_store)
    gcs_store.create(TRUNCATED, b"not arrow at all")
    opts = [a for k, v in gcs_options(gcs_emulator).items() for a in ("-o", f"{k}={v}")]
    rows, err = run_sql(capsys, gcs_store.url, "SELECT worker_id, campaign, count(*) AS n FROM trajectories "
                                               "GROUP BY ALL ORDER BY 1", *opts)
    # per worker: 2 versions x 2 groups x 2 samples = 8; the campaign id is the folder name (gs://b-…/campaigns/c1)
    assert rows == [{"worker_id": "w0", "campaign": "c1", "n": 8}, {"worker_id": "w1", "campaign": "c1", "n": 8}]
    assert TRUNCATED in err


@pytest.mark.parametrize(("url", "query", "message"), [
    ("/no/such/campaign", "SELECT 1", "no campaign folder here"),
    (None, "SELEC 1", "query failed: Parser Error"),
])
def test_sql_user_errors_exit_2_with_one_line(local_store: Store, capsys, url: str | None, query: str,
                                              message: str) -> None:
    _base(local_store)
    assert cli.main(["sql", url or local_store.url, query]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_render_text_aligns_columns_and_says_what_it_left_out() -> None:
    table = pa.table({"version": [0, 1, 2], "avg(reward)": [0.4375, None, 1.0]})
    assert render_text(table, max_rows=2) == "version  avg(reward)\n0        0.4375\n1        NULL\n... 1 more rows"


def test_sampling_spreads_groups_evenly_over_versions() -> None:
    keys = [("a0", 0), ("a1", 0), ("a2", 0), ("b0", 1), ("c0", 2), ("c1", 2)]
    assert sample_groups(keys, 4) == ["a0", "b0", "c0", "a1"]
    assert sample_groups(keys, 100) == ["a0", "b0", "c0", "a1", "c1", "a2"]
    with pytest.raises(ValueError, match="max_groups must be >= 1, got 0"):
        sample_groups(keys, 0)


def test_view_summary_accounts_for_every_committed_group(demo_campaign: Store) -> None:
    view = build_view(demo_campaign, max_groups=7)
    acc = view.summary["accounting"]
    assert acc["groups_committed"] == VERSIONS * WORKERS * GROUPS_PER_WORKER == view.total_groups == 60
    assert acc["groups_consumed"] == 40 and acc["unreadable_shards"] == 0
    assert sum(r["groups"] for r in view.summary["staleness"]) == 40
    assert [s for s, _ in view.summary["train_curve"]] == list(range(1, 11))
    assert len(view.groups) == 7 and Counter(g["version"] for g in view.groups) == {0: 2, 1: 2, 2: 1, 3: 1, 4: 1}


def test_view_writes_a_self_contained_page_and_the_curve_png(local_store: Store) -> None:
    _base(local_store)
    local_store.create(TRUNCATED, b"junk")
    view = build_view(local_store)
    path = write_view(local_store, view)
    folder = path.rsplit("/", 1)[0]
    assert local_store.read(f"{folder}/learning_curve.png")[:8] == b"\x89PNG\r\n\x1a\n"
    page = local_store.read(path).decode()
    assert page == render_html(view)
    assert not re.search(r"""(src|href)=["'](https?:)?//""", page)  # nothing loads from elsewhere
    assert TRUNCATED in page  # the skipped shard is accounted for on the page
    with pytest.raises(AlreadyExistsError):
        local_store.create(path, b"")  # create-only, like every output


def test_a_closing_script_tag_in_the_data_cannot_break_the_page(local_store: Store) -> None:
    writer = ShardWriter(local_store, worker_id="w0")
    writer.add_group(_group("</script><b>x", 0, "w0"))
    writer.flush()
    page = render_html(build_view(local_store))
    assert page.count("</script>") == 2  # the data block's and the code's own


def test_view_cli_prints_the_report_url(demo_campaign: Store, capsys) -> None:
    assert cli.main(["view", demo_campaign.url, "--max-groups", "5"]) == 0
    out = capsys.readouterr()
    url = out.out.strip()
    assert url.startswith(demo_campaign.url) and url.endswith("/report.html")
    # The synthetic demo names no tokenizer: the command says its page shows ids, and why.
    assert "turns shown as token ids (a demo folder: no tokenizer or advantage estimator is named)" in out.err


@pytest.mark.parametrize("command", ["sql", "view"])
def test_a_malformed_consumption_log_is_one_line_naming_it(local_store: Store, capsys, command: str) -> None:
    _base(local_store)
    local_store.create_json("train/consumed/00000001.json", [1])
    assert cli.main([command, local_store.url, *(["SELECT 1"] if command == "sql" else [])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "train/consumed/00000001.json: expected a JSON object for a ConsumptionLog" in err
