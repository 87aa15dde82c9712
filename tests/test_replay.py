"""Replaying a logged training step from storage: the same floats as the log, a hand-checked what-if, no writes.

One small trainer campaign (``conftest.trained_campaign``: 12 steps of 2 synthetic groups, checkpoints at steps 4,
8 and 12) serves every test: replaying step 2 starts from the warm start and re-trains step 1, step 6 restores
checkpoint 4 and re-trains step 5. The same folder copied onto the GCS emulator replays to the same floats.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipelines_lib.cli import main
from pipelines_lib.records import ConsumptionLog
from pipelines_lib.stages.replay import dump_name, replay
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.codec import read_shard
from tests.conftest import checksums


@pytest.mark.parametrize(("step", "from_checkpoint"), [(2, 0), (6, 4)])
def test_replay_reproduces_the_logged_loss_and_grad_norm_exactly_and_writes_nothing(
        trained_campaign: Store, step: int, from_checkpoint: int) -> None:
    before = checksums(trained_campaign)
    result = replay(trained_campaign, step, log=lambda _: None)
    logged = ConsumptionLog.read(trained_campaign, step).metrics
    assert result["identical"]
    assert result["loss"] == {"logged": logged["loss"], "recomputed": logged["loss"]}
    assert result["grad_norm"] == {"logged": logged["grad_norm"], "recomputed": logged["grad_norm"]}
    assert (result["from_checkpoint"], result["replayed_steps"]) == (from_checkpoint, step - 1 - from_checkpoint)
    assert result["metrics"] == logged  # clip fractions, ratio and weight statistics too
    # The groups' shares add up to the step's loss.
    assert sum(g["loss"] for g in result["groups"]) == pytest.approx(logged["loss"], abs=1e-6)
    assert checksums(trained_campaign) == before


def test_replay_dump_holds_the_batch_with_per_token_terms(trained_campaign: Store, tmp_path) -> None:
    out = Store(str(tmp_path / "dump"))
    result = replay(trained_campaign, 4, dump=out, log=lambda _: None)
    rows = pq.read_table(io.BytesIO(out.read(dump_name(4, what_if=False)))).to_pylist()
    log = ConsumptionLog.read(trained_campaign, 4)
    assert [r["group_id"] for r in rows[::4]] == [g.group_id for g in log.groups]
    assert [r["sample_idx"] for r in rows] == [0, 1, 2, 3] * 2
    for r in rows:
        mask = np.asarray(r["loss_mask"])
        assert len(r["tokens"]) == len(mask) == len(r["logp_proximal"]) == len(r["logp_current"])
        assert np.all(np.asarray(r["loss_token"])[mask == 0] == 0)
        assert np.all(np.asarray(r["logp_behaviour"])[mask == 0] == 0)
    # One update moved the policy: the current log-probs differ from the proximal ones on loss tokens.
    assert any(r["logp_current"] != r["logp_proximal"] for r in rows)
    assert sum(r["contribution"] for r in rows) == pytest.approx(result["loss"]["recomputed"], abs=1e-6)


def test_what_if_correction_cap_gives_the_hand_computed_loss_and_scales_exactly(trained_campaign: Store) -> None:
    """Under a cap C far below every ``exp(logp_prox − logp_behav)`` (behaviour log-probs are in [−3, 0], a random
    policy's near −ln 512), every weight is C; before the update r = 1, so with Dr. GRPO's advantages
    ``A_i = r_i − mean(r)`` and token-mean aggregation the loss is ``−C · Σ_i A_i · n_i / Σ_i n_i`` (``n_i`` the
    loss tokens of row i). Doubling C doubles loss and gradient norm (to float32 rounding: the weight is
    ``exp(min(·, ln C))``)."""
    cap = 2.0 ** -20
    base = {"trainer.advantage": "drgrpo", "trainer.step.loss.behav_weight_cap": cap}
    before = checksums(trained_campaign)
    small = replay(trained_campaign, 3, what_if=base, log=lambda _: None)
    double = replay(trained_campaign, 3, what_if={**base, "trainer.step.loss.behav_weight_cap": 2 * cap}, log=lambda _: None)
    assert checksums(trained_campaign) == before

    a_i, n_i = [], []
    for g in small["groups"]:
        rewards = g["rewards"]
        a_i += [r - sum(rewards) / len(rewards) for r in rewards]
    log = ConsumptionLog.read(trained_campaign, 3)
    for g in log.groups:  # the shard rows the log names, in sample order
        table, _ = read_shard(trained_campaign, g.shard)
        part = table.slice(g.row_start, g.row_end - g.row_start).to_pylist()
        n_i += [sum(r["loss_mask"]) for r in sorted(part, key=lambda r: r["sample_idx"])]
    expected = -cap * sum(a * n for a, n in zip(a_i, n_i, strict=True)) / sum(n_i)
    assert small["metrics"]["behav_weight_capped_frac"] == pytest.approx(1.0, rel=1e-5)  # a sum of 1/N terms
    assert small["loss"]["recomputed"] == pytest.approx(expected, rel=1e-5)
    assert small["loss"]["recomputed"] != small["loss"]["logged"]
    assert not small["identical"]
    assert double["loss"]["recomputed"] == pytest.approx(2 * small["loss"]["recomputed"], rel=1e-5)
    assert double["grad_norm"]["recomputed"] == pytest.approx(2 * small["grad_norm"]["recomputed"], rel=1e-5)


def test_what_if_refuses_a_setting_that_is_not_the_loss(trained_campaign: Store) -> None:
    with pytest.raises(ValueError, match=r"trainer\.optim\.lr.*trainer\.advantage"):
        replay(trained_campaign, 2, what_if={"trainer.optim.lr": 0.1}, log=lambda _: None)


def test_replay_of_a_step_without_a_log_names_the_logged_steps(trained_campaign: Store) -> None:
    with pytest.raises(ValueError, match=r"step 13 has no consumption log \(logged: steps 1\.\.12\)"):
        replay(trained_campaign, 13, log=lambda _: None)


def test_replay_command_prints_identical_and_exits_zero(trained_campaign: Store, capsys: pytest.CaptureFixture) -> None:
    assert main(["replay", trained_campaign.url, "--step", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["identical"] and out["step"] == 3
    assert main(["replay", trained_campaign.url, "--step", "3", "--what-if", "trainer.model=x"]) == 2
    assert "only the step's loss settings" in capsys.readouterr().err


def test_replay_on_the_gcs_emulator_gives_the_same_floats(trained_campaign: Store, gcs_store: Store, gcs_emulator: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # Orbax reads through tensorstore, which ignores STORAGE_EMULATOR_HOST (used by etils' gcsfs backend).
    for name, value in (("STORAGE_EMULATOR_HOST", gcs_emulator), ("TENSORSTORE_GCS_HTTP_URL", gcs_emulator),
                        ("GOOGLE_AUTH_TOKEN_FOR_TESTING", "anon")):
        monkeypatch.setenv(name, value)
    for rel in trained_campaign.walk():
        gcs_store.create(rel, trained_campaign.read(rel))
    result = replay(gcs_store, 4, log=lambda _: None)
    assert result["identical"]
    assert result["loss"]["recomputed"] == ConsumptionLog.read(trained_campaign, 4).metrics["loss"]


def test_replay_flow_reports_an_identical_step(prefect_api, trained_campaign: Store) -> None:
    from flows.replay import replay_flow

    before = checksums(trained_campaign)
    result = replay_flow(trained_campaign.url, 2)
    assert result["identical"] and result["replayed_steps"] == 1
    assert checksums(trained_campaign) == before  # no run record either: a replay reads only
