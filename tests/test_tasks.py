"""Stage tasks called through ``.fn`` (no Prefect run): the thin layer over the library stages."""

from __future__ import annotations

import pytest
from prefect.logging import disable_run_logger

from pipelines_lib.config import CampaignConfig
from pipelines_lib.records import AuditRecord
from pipelines_lib.stages.campaign import CampaignMismatchError
from pipelines_lib.storage.errors import AlreadyExistsError, NotFoundError, StorageError
from pipelines_lib.storage.store import Store
from tasks.audit import audit
from tasks.common import stage_key, stage_run, worth_retrying
from tasks.init import init_campaign
from tasks.prep import prep_dataset
from tests.conftest import SMALL_CAMPAIGN


def test_prep_task_rerun_after_success_is_a_no_op(campaign: Store) -> None:
    with disable_run_logger():
        first = prep_dataset.fn(campaign.url)
        objects = campaign.walk()
        second = prep_dataset.fn(campaign.url)
    assert second == first
    assert campaign.walk() == objects
    assert first["splits"]["train"]["rows"] == 16 and first["splits"]["heldout"]["rows"] == 8


def test_init_task_refuses_a_different_config_for_the_same_folder(campaign: Store) -> None:
    assert init_campaign.fn(campaign.url, CampaignConfig.from_mapping(SMALL_CAMPAIGN).to_dict())["created"] is False
    other = CampaignConfig.from_mapping({**SMALL_CAMPAIGN, "seed": 7}).to_dict()
    with pytest.raises(CampaignMismatchError, match="different config"):
        init_campaign.fn(campaign.url, other)


def test_audit_task_keeps_its_report_under_audit(campaign: Store) -> None:
    with disable_run_logger():
        prep_dataset.fn(campaign.url)
        summary = audit.fn(campaign.url)
    assert summary["ok"] and summary["shards"] == 0
    assert campaign.exists(summary["report"]) and campaign.exists(summary["text"])
    kept = AuditRecord.at(campaign, summary["report"])
    assert kept.ok is True and kept.report["shards"] == 0


def test_stage_run_outside_a_flow_run_records_nothing(tmp_path) -> None:
    store = Store(str(tmp_path / "c"))
    assert stage_run(store, "prep", lambda: {"n": 1}) == {"n": 1}
    assert store.walk() == []


def test_stage_keys_name_the_worker_or_the_version() -> None:
    assert stage_key("collect", worker_index=1) == "collect-w1"
    assert stage_key("evaluate", version=4) == "evaluate-v00000004"
    assert stage_key("train") == "train"


def _storage_error(cause: BaseException) -> StorageError:
    try:
        raise StorageError("read", "gs://b/x", str(cause)) from cause
    except StorageError as e:
        return e


@pytest.mark.parametrize(("exc", "retry"), [
    (_storage_error(ConnectionResetError("reset")), True),
    (_storage_error(TimeoutError("slow")), True),
    (_storage_error(PermissionError("403")), False),
    (AlreadyExistsError("create", "gs://b/x", "exists"), False),
    (NotFoundError("read", "gs://b/x", "missing"), False),
    (ConnectionError("refused"), True),
    (ValueError("bad config"), False),
])
def test_tasks_retry_only_failures_that_may_pass(exc: BaseException, retry: bool) -> None:
    assert worth_retrying(exc) is retry
