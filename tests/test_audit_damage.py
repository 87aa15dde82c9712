"""Damage the audit must name (exit 1), never pass as OK: what a restart restores from (pointer entries, checkpoints,
consumption logs' cursors, evaluations, the config), a version folder that does not list, an empty folder named like
a shard; and ``recover``, which refuses such a campaign before writing anything and reports a finished one as such."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest

from pipelines_lib import cli
from pipelines_lib.storage.store import Store
from tests.conftest import checksums


@pytest.fixture
def trained(trained_campaign: Store, tmp_path: Path) -> Path:
    """A copy of a finished small trainer campaign (checkpoints at steps 4, 8, 12; versions 0 to 3), free to damage."""
    folder = tmp_path / "trained"
    shutil.copytree(trained_campaign.url.removeprefix("file://"), folder)
    return folder


def _audit(capsys, folder: Path) -> tuple[int, str]:
    code = cli.main(["audit", str(folder), "--jobs", "1"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out


def _edit_json(target: Path, fields: dict) -> None:
    target.write_text(json.dumps({**json.loads(target.read_text()), **fields}))


def _manifest_config(folder: Path, section: str | None, key: str, value) -> None:
    manifest = json.loads((folder / "campaign.json").read_text())
    (manifest["config"][section] if section else manifest["config"])[key] = value
    (folder / "campaign.json").write_text(json.dumps(manifest))  # NaN as the literal NaN, as Python writes it


def test_the_undamaged_trained_campaign_audits_clean(trained: Path, capsys) -> None:
    code, out = _audit(capsys, trained)
    assert code == 0 and "verdict: OK" in out


DAMAGE = {
    "pointer entry naming a version with no weights": (
        lambda c: (c / "weights/LATEST.json.d/000000000007.json").write_text(json.dumps(
            {"record_version": 1, "version": 7, "path": "weights/v00000007", "step": 28,
             "published_at": "2026-01-01T00:00:00+00:00"})),
        "weights/LATEST.json.d/000000000007.json: bad_pointer_entry: version 7 has no committed weights "
        "(no weights/v00000007/PUBLISHED.json)"),
    "pointer entry escaping its folder": (
        lambda c: _edit_json(c / "weights/LATEST.json.d/000000000003.json", {"path": "../../../etc"}),
        "weights/LATEST.json.d/000000000003.json: bad_pointer_entry: path '../../../etc' is not version 3's weights "
        "folder weights/v00000003"),
    "checkpoint without state": (
        lambda c: shutil.rmtree(c / "train/checkpoints/00000008/state"),
        "train/checkpoints/00000008: bad_checkpoint: committed without its Orbax state"),
    "checkpoint with garbage meta": (
        lambda c: (c / "train/checkpoints/00000008/meta.json").write_text("garbage"),
        "train/checkpoints/00000008/meta.json: bad_checkpoint: train/checkpoints/00000008/meta.json: not valid JSON"),
    "consumption log with a garbage cursor": (
        lambda c: _edit_json(c / "train/consumed/00000005.json", {"cursor_delta": "[1, 2"}),
        "train/consumed/00000005.json: bad_consumption_log: not a rollstream tail cursor delta"),
    "garbage evaluation": (
        lambda c: (c / "eval").mkdir() or (c / "eval/v00000001.json").write_text("{]"),
        "eval/v00000001.json: bad_eval: eval/v00000001.json: not valid JSON for a EvalResult"),
    "vocab_size as a string": (
        lambda c: _manifest_config(c, "model", "vocab_size", "512"),
        "campaign.json: bad_campaign_json: config does not load: model.vocab_size: expected int, got str '512'"),
    "negative max_steps": (
        lambda c: _manifest_config(c, "trainer", "max_steps", -3),
        "campaign.json: bad_campaign_json: config does not load: trainer: TrainerConfig.max_steps must be >= 1"),
    "NaN seed": (
        lambda c: _manifest_config(c, None, "seed", float("nan")),
        "campaign.json: bad_campaign_json: config does not load: seed: expected int, got float nan"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_each_damage_a_restart_trips_on_fails_the_audit_naming_it(trained: Path, capsys, damage: str) -> None:
    edit, expected = DAMAGE[damage]
    edit(trained)
    code, out = _audit(capsys, trained)
    assert code == 1 and "verdict: FAILED" in out
    assert expected in out


@pytest.mark.parametrize("recover", ["installed", "built-in"])
@pytest.mark.parametrize("damage", ["pointer entry escaping its folder", "checkpoint with garbage meta",
                                    "consumption log with a garbage cursor", "garbage evaluation", "NaN seed"])
def test_recover_refuses_a_damaged_campaign_in_one_line_before_writing_anything(
        trained: Path, capsys, monkeypatch: pytest.MonkeyPatch, damage: str, recover: str) -> None:
    """Both recovers: the recover flow's command and the built-in one a checkout without Prefect has."""
    if recover == "built-in":
        monkeypatch.setattr(cli, "entry_points", lambda group: ())  # no installed command replaces the built-in
    edit, expected = DAMAGE[damage]
    edit(trained)
    before = checksums(Store(str(trained)))
    code = cli.main(["recover", str(trained)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"rollstream recover: {trained}: not recovered: 1 damaged record(s) a restart reads, the "
                          f"first {expected}")
    assert checksums(Store(str(trained))) == before


def test_recover_on_a_finished_campaign_says_so_with_a_clean_audit_and_exit_0(tmp_path: Path, capsys) -> None:
    from harness.fixtures import seed_trainer_campaign, small_trainer_config
    from pipelines_lib import records
    from pipelines_lib.stages.audit import audit
    from pipelines_lib.stages.evaluate import evaluate
    from pipelines_lib.stages.prep import prep
    from pipelines_lib.stages.train import train

    config = small_trainer_config(2, checkpoint_every=2, publish_every=2)
    config = dataclasses.replace(config, eval=dataclasses.replace(config.eval, n_tasks=2, samples=1))
    store = seed_trainer_campaign(str(tmp_path / "finished"), config, 4)
    train(store, config, log=lambda _: None)
    prep(store, config)
    for version in records.published_versions(store):
        evaluate(store, config, version=version)
    assert audit(store)["ok"]
    before = checksums(store)
    capsys.readouterr()  # the stages' own lines
    code = cli.main(["recover", store.url])
    out, err = capsys.readouterr()
    assert (code, out) == (0, f"{store.url}: finished, nothing to recover; audit OK (0 violations, 0 bad files)\n")
    assert "Traceback" not in err and checksums(store) == before


def _nest_beyond_the_path_limit(folder: Path) -> None:
    """Folders nested past PATH_MAX under ``folder``: listing them fails even for root (ENAMETOOLONG)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        for _ in range(20):
            os.mkdir("x" * 250, dir_fd=fd)
            inner = os.open("x" * 250, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)


def test_a_version_folder_that_does_not_list_is_an_unreadable_bad_file_not_a_silent_hole(demo_campaign: Store,
                                                                                          tmp_path: Path,
                                                                                          capsys) -> None:
    folder = tmp_path / "demo"
    shutil.copytree(demo_campaign.url.removeprefix("file://"), folder)
    _nest_beyond_the_path_limit(folder / "trajectories/v00000001")
    code, out = _audit(capsys, folder)
    assert code == 1
    assert "trajectories/v00000001: unreadable: the folder does not list: storage walk" in out
    assert "File name too long" in out
    assert "24 shards" in out  # every other version folder is audited as before (30 shards in all)


def test_an_empty_folder_named_like_a_shard_is_a_bad_file(demo_campaign: Store, tmp_path: Path, capsys) -> None:
    folder = tmp_path / "demo"
    shutil.copytree(demo_campaign.url.removeprefix("file://"), folder)
    (folder / "trajectories/v00000000/w5-00000000-2.arrow").mkdir()
    code, out = _audit(capsys, folder)
    assert code == 1 and "trajectories/v00000000/w5-00000000-2.arrow: not_a_file: an empty folder" in out
