"""campaign.json is written once per URL; campaign_status reads only markers and says what is left."""

from __future__ import annotations

import pytest

from harness.fixtures import done_marker, eval_result, trained_campaign
from pipelines_lib.config import CampaignConfig
from pipelines_lib.stages.audit import audit as audit_stage
from pipelines_lib.stages.campaign import (
    CampaignMismatchError,
    campaign_status,
    init_campaign,
    load_campaign_config,
)
from pipelines_lib.storage.store import Store


def test_init_is_once_per_url_and_refuses_another_config(store: Store) -> None:
    config = CampaignConfig.tiny()
    assert init_campaign(store, config)["created"] is True
    assert init_campaign(store, config)["created"] is False
    assert load_campaign_config(store) == config
    with pytest.raises(CampaignMismatchError, match=r"different config \(sections differing: \['rollout'\]\)"):
        init_campaign(store, config.with_overrides({"rollout.eta": 3}))


def test_status_lists_the_stages_a_recovery_must_run(tmp_path) -> None:
    store = Store(str(tmp_path / "c"))
    assert campaign_status(store)["todo"] == ["init", "prep", "warm_start", "collect", "train", "evaluate", "audit"]
    trained_campaign(store, CampaignConfig.tiny(), done=False)
    eval_result(0).write(store)
    status = campaign_status(store)
    assert status["todo"] == ["collect", "train", "evaluate", "audit"]
    assert status["missing_eval"] == [1, 2]
    done_marker().write(store)
    assert campaign_status(store)["todo"] == ["evaluate", "audit"]
    eval_result(1).write(store)
    eval_result(2).write(store)
    assert campaign_status(store)["todo"] == ["audit"]
    audit_stage(store)
    assert campaign_status(store)["todo"] == []


def test_a_campaign_that_evaluates_the_ends_is_done_without_the_versions_between(tmp_path) -> None:
    store = Store(str(tmp_path / "c"))
    trained_campaign(store, CampaignConfig.tiny().with_overrides({"eval.versions": "ends"}))
    eval_result(0).write(store)
    assert campaign_status(store)["todo"] == ["evaluate", "audit"]
    eval_result(2).write(store)
    assert campaign_status(store)["todo"] == ["audit"]
    audit_stage(store)
    assert campaign_status(store)["todo"] == []
