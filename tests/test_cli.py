"""``rollstream`` subcommands: exit codes, JSON output, storage options, one-line errors, registry."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines_lib import cli
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.schema import TRAJECTORY_SCHEMA
from tests.conftest import gcs_options
from tests.test_audit import PLANTED, _bad_table, _base, _turn_out_of_range

ROLLSTREAM = str(Path(sys.executable).with_name("rollstream"))


def _broken(store: Store) -> None:
    from pipelines_lib.trajectory.codec import encode_shard

    store.create(PLANTED, encode_shard(_bad_table(_turn_out_of_range), {}))


def test_audit_exits_zero_on_a_clean_campaign_and_one_on_violations(local_store: Store, capsys) -> None:
    _base(local_store)
    assert cli.main(["audit", local_store.url]) == 0
    out, err = capsys.readouterr()
    assert "verdict: OK" in out and "4 shards read in 2 version folder(s)" in err
    _broken(local_store)
    assert cli.main(["audit", local_store.url, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["violation_counts"] == {"turns": 1}


def test_audit_subprocess_on_the_gcs_emulator_with_storage_options(gcs_store: Store, gcs_emulator: str) -> None:
    _base(gcs_store)
    opts = [a for k, v in gcs_options(gcs_emulator).items() for a in ("--storage-option", f"{k}={v}")]
    clean = subprocess.run([ROLLSTREAM, "audit", gcs_store.url, "--json", *opts], capture_output=True, text=True,
                           timeout=120)
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout)["shards"] == 4
    _broken(gcs_store)
    broken = subprocess.run([ROLLSTREAM, "audit", gcs_store.url, *opts], capture_output=True, text=True, timeout=120)
    assert broken.returncode == 1 and "verdict: FAILED" in broken.stdout


@pytest.mark.parametrize(("url", "message"), [
    ("nope://bucket/campaign", "nope://bucket/campaign: cannot open storage: Protocol not known: nope"),
    ("/definitely/not/a/campaign", "file:///definitely/not/a/campaign: not a campaign (no campaign.json)"),
    # what gs://{{ $ROLLSTREAM_BUCKET }}/... becomes with the variable unset: never the bucket "campaigns"
    ("gs:///campaigns/nightly", "gs:///campaigns/nightly: cannot open storage: gs:///campaigns/nightly: no bucket"),
])
def test_bad_urls_exit_2_with_one_line_naming_the_url(url: str, message: str) -> None:
    result = subprocess.run([ROLLSTREAM, "audit", url], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_unreachable_gcs_exits_2_with_one_error_line_after_the_storage_deadline() -> None:
    # Default settings: no retry after 60 s (gcsfs retries a refused connection for about 30 s per try).
    result = subprocess.run([ROLLSTREAM, "audit", "gs://b/c", "-o", "endpoint_url=http://127.0.0.1:9",
                             "-o", "token=anon"], capture_output=True, text=True, timeout=150)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    *retries, error = result.stderr.strip().splitlines()
    # Each line names the storage operation and the object under gs://b/c it was for (the first the audit
    # touches is the campaign's record).
    assert retries and all(re.match(r"storage retry \w+ gs://b/c\S*: .*\(try \d of \d\)$", line) for line in retries)
    assert re.match(r"rollstream audit: storage \w+ gs://b/c\S*: .*Cannot connect.*\(gave up after \d+ tries", error)


def test_storage_options_parse_json_scalars_and_keep_strings() -> None:
    assert cli._storage_option("endpoint_url=http://127.0.0.1:4443") == ("endpoint_url", "http://127.0.0.1:4443")
    assert cli._storage_option("token=anon") == ("token", "anon")
    assert cli._storage_option("requester_pays=true") == ("requester_pays", True)
    assert cli._storage_option("timeout=30") == ("timeout", 30)
    with pytest.raises(argparse.ArgumentTypeError, match="expected KEY=VALUE"):
        cli._storage_option("token")


def test_export_writes_parquet_and_reports_each_version(local_store: Store, tmp_path, capsys) -> None:
    _base(local_store)
    out = tmp_path / "warehouse"
    assert cli.main(["export", local_store.url, str(out), "--format", "parquet"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [(r["version"], r["status"], r["rows"]) for r in results] == [(0, "written", 8), (1, "written", 8)]
    exported = pq.read_table(out / "version=1" / "data.parquet")
    assert exported.schema.names == [*(n for n in TRAJECTORY_SCHEMA.names if n != "version"), "campaign"]
    assert set(exported.column("campaign").to_pylist()) == {"campaign"}  # the folder's name
    assert cli.main(["export", local_store.url, str(out)]) == 0
    assert [r["status"] for r in json.loads(capsys.readouterr().out)] == ["unchanged", "unchanged"]


def test_demo_writes_an_audited_campaign_where_asked(tmp_path, capsys) -> None:
    assert cli.main(["demo", "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "verdict: OK" in out and f"campaign folder: file://{tmp_path / 'demo'}" in out
    assert (tmp_path / "demo" / "campaign.json").exists()


def test_every_subcommand_is_in_the_parser_and_names_are_unique() -> None:
    assert {"status", "demo"} <= set(cli.SUBCOMMANDS)
    assert {"audit", "export", "sql", "view", "trace", "bench", "drills"} <= set(cli.commands())
    parser = cli.build_parser()
    assert parser.parse_args(["demo"]).command == "demo"
    with pytest.raises(ValueError, match="registered twice"):
        cli.subcommand("demo", "again", lambda p: None)(lambda a: 0)


def test_python_dash_m_and_the_console_script_are_the_same_command_line() -> None:
    # Under `python -m` the module runs as __main__: a subcommand registered into `pipelines_lib.cli` from another
    # module landed in a second copy of it, and `drills` was an "invalid choice".
    drills = subprocess.run([sys.executable, "-m", "pipelines_lib.cli", "drills", "--help"], capture_output=True,
                            text=True, timeout=60)
    assert drills.returncode == 0, drills.stderr
    assert drills.stdout.startswith("usage: rollstream drills [-h] [--quick] [--only NAME] [--out OUT]")
    helps = [subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=60, check=True).stdout
             for argv in ([sys.executable, "-m", "pipelines_lib.cli"], [ROLLSTREAM])]
    assert helps[0] == helps[1] and "drills" in helps[0] and "audit" in helps[0]


def test_export_weights_writes_a_published_version_as_an_hf_folder(local_store: Store, tmp_path, capsys) -> None:
    import numpy as np
    from flax import nnx

    from pipelines_lib.config import CampaignConfig
    from pipelines_lib.model.decoder import Decoder
    from pipelines_lib.model.hf_import import load_hf_checkpoint
    from pipelines_lib.publish import publish_weights
    from pipelines_lib.stages.campaign import init_campaign

    config = CampaignConfig.tiny()
    init_campaign(local_store, config)
    model = Decoder(config.model, rngs=nnx.Rngs(3))
    publish_weights(local_store, model, version=0, step=0)
    assert cli.main(["export-weights", local_store.url, "--version", "0", str(tmp_path / "hf")]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == 0
    loaded = load_hf_checkpoint(tmp_path / "hf")
    assert (tmp_path / "hf" / "tokenizer.json").is_file()
    np.testing.assert_array_equal(np.asarray(loaded.embed.embedding[...]), np.asarray(model.embed.embedding[...]))
    assert cli.main(["export-weights", local_store.url, str(tmp_path / "hf")]) == 2  # create-only
