"""Storage faults through a real network path: gcsfs → FaultProxy → the GCS-API emulator (drills/storage_faults.py).

The fast tests pin the proxy, the store workload and a single-operation outage; the slow ones run a whole tiny
campaign (``python -m flows.campaign``, Orbax checkpoints included) through 5 % faults, and stages through an
outage followed by ``python -m flows.recover``.
"""

from __future__ import annotations

import logging
import threading
import urllib.error
import urllib.request

import pytest

from drills.fault_campaign import (
    CampaignOutageResult,
    CampaignResult,
    run_fault_campaign,
    run_outage_campaign,
)
from drills.faultproxy import FaultPlan, FaultProxy
from drills.storage_faults import (
    fault_figures,
    outage_drill,
    proxied_store,
    render_fault_section,
    run_fault_workload,
)
from pipelines_lib.storage.emulator import gcs_server
from pipelines_lib.storage.errors import StorageError
from pipelines_lib.storage.retry import RetryPolicy, call_with_deadline
from tasks.common import worth_retrying


@pytest.fixture(autouse=True)
def quiet_gcsfs() -> None:
    logging.getLogger("gcsfs").setLevel(logging.CRITICAL)  # it logs a traceback per retried request


def test_workload_at_five_percent_faults_loses_nothing_and_the_store_retried(gcs_emulator: str) -> None:
    # Seed 1 draws resets (lost replies), a stall (a timeout the store retries) and a 500 in the first 25 requests.
    with FaultProxy(gcs_emulator, FaultPlan(rate=0.05, seed=1)) as proxy:
        result = run_fault_workload(proxied_store(proxy.url), proxy, n_objects=40, n_groups=6)
    assert result.ok, result
    assert result.objects_read_back == 40
    assert result.groups_read_back == result.groups_committed == 6
    assert result.groups_duplicated == 0
    assert result.store_retries > 0
    assert sum(result.faults.values()) >= 3 and result.faults.get("stall", 0) >= 1


def test_an_outage_longer_than_the_retry_budget_fails_naming_op_and_url_without_hanging(gcs_emulator: str) -> None:
    with FaultProxy(gcs_emulator, FaultPlan(rate=0.0)) as proxy:
        store = proxied_store(proxy.url, retry=RetryPolicy(attempts=4, base_delay_s=0.05, max_delay_s=0.2,
                                                           deadline_s=2.0))
        result = outage_drill(store, proxy)
        after = store.read("outage/probe.json")  # the window closed: the same store works again
    assert result.names_op_and_url, result.error
    assert "gave up after" in result.error
    assert result.seconds < 20.0  # 4 s request timeout per try, 2 s retry deadline
    assert after == b"{}"


@pytest.mark.slow
def test_a_503_outage_fails_after_gcsfs_own_retries(gcs_emulator: str) -> None:
    with FaultProxy(gcs_emulator, FaultPlan(rate=0.0, outage_kind="503")) as proxy:
        store = proxied_store(proxy.url, retry=RetryPolicy(attempts=2, base_delay_s=0.05, max_delay_s=0.1,
                                                           deadline_s=1.0))
        result = outage_drill(store, proxy)
    assert result.names_op_and_url and "503" in result.error
    assert result.seconds < 90.0  # gcsfs's 6 tries with backoff (~30 s), then the store gives up


def test_proxy_injects_exactly_the_planned_fault(gcs_emulator: str) -> None:
    with FaultProxy(gcs_emulator, FaultPlan(rate=1.0, kinds=("429",))) as proxy:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{proxy.url}/storage/v1/b", timeout=5)
        assert err.value.code == 429
        proxy.plan = FaultPlan(rate=0.0)
        assert urllib.request.urlopen(f"{proxy.url}/storage/v1/b", timeout=5).status == 200
    assert proxy.requests == 2 and dict(proxy.faults) == {"429": 1}


def test_proxy_refuses_a_non_loopback_upstream() -> None:
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("http://example.com:80")


def test_gcs_server_serves_on_loopback_and_stops(tmp_path) -> None:
    with gcs_server(tmp_path / "gcs") as url:
        assert url.startswith("http://127.0.0.1:")
        assert urllib.request.urlopen(f"{url}/storage/v1/b", timeout=5).status == 200
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2)


def _campaign(**kw: object) -> CampaignResult:
    base = dict(url="gs://b/c", exit_code=0, audit_ok=True, audit_summary="3 shards", train_steps=2,
                published_versions=[0, 1, 2], evaluated_versions=[0, 2], shards=3, store_retries={"list": 2, "read": 1},
                requests=1000, clients={"python": 900, "tensorstore": 100}, faults={"500": 20, "stall": 30},
                seconds=100.0, output_tail="")
    return CampaignResult(**{**base, **kw})  # type: ignore[arg-type]


def _outage(**kw: object) -> CampaignOutageResult:
    base = dict(url="gs://b/c", stage_errors={"train": "StorageError: storage list gs://b/c/trajectories: x"},
                names_op_and_url=True, hung=False, hung_in="", outage_s=12.5, recover_exit_code=0,
                recover_plan="['collect', 'train', 'evaluate', 'audit']", recovered=True, audit_summary="ok",
                requests=10, faults={"stall": 9}, seconds=200.0, output_tail="")
    return CampaignOutageResult(**{**base, **kw})  # type: ignore[arg-type]


def test_campaign_figures_say_ok_only_for_a_clean_exit_and_audit() -> None:
    figures, details = fault_figures({"campaign": _campaign(), "campaign_outage": _outage()})
    assert figures["reliability.fault_campaign_ok"] == 1.0
    assert figures["reliability.fault_campaign_rate"] == 0.05  # 50 faults / 1000 requests
    assert figures["reliability.fault_campaign_retries"] == 3.0 and figures["reliability.fault_campaign_faults"] == 50
    assert figures["reliability.outage_stage_error_named"] == 1.0 and figures["reliability.outage_recovered"] == 1.0
    assert figures["reliability.outage_stage_hung"] == 0.0 and figures["reliability.outage_stage_fail_s"] == 12.5
    section = "\n".join(render_fault_section(details))
    assert "Whole campaign at 5.0% faults" in section and "train: `StorageError: storage list gs://b/c" in section
    assert fault_figures({"campaign": _campaign(audit_ok=False)})[0]["reliability.fault_campaign_ok"] == 0.0
    assert fault_figures({"campaign": _campaign(exit_code=None)})[0]["reliability.fault_campaign_ok"] == 0.0
    hung = fault_figures({"campaign_outage": _outage(hung=True, stage_errors={})})[0]
    assert hung["reliability.outage_stage_hung"] == 1.0 and hung["reliability.outage_stage_error_named"] == 0.0


@pytest.mark.slow
def test_a_whole_campaign_through_five_percent_faults_completes_with_a_clean_audit(gcs_emulator: str,
                                                                                   tmp_path) -> None:
    result = run_fault_campaign(gcs_emulator, tmp_path, plan=FaultPlan(rate=0.05, seed=1))
    assert result.ok, result.output_tail
    assert result.train_steps == 2 and result.published_versions == [0, 1, 2] and result.evaluated_versions == [0, 2]
    assert 0.03 < result.fault_rate < 0.08 and set(result.faults) >= {"429", "500", "503", "stall"}
    assert sum(result.store_retries.values()) > 0  # stalls time out and the store retries: visible in the log


@pytest.mark.slow
def test_stages_fail_naming_op_and_url_in_an_outage_and_recover_finishes_the_campaign(gcs_emulator: str,
                                                                                     tmp_path) -> None:
    result = run_outage_campaign(gcs_emulator, tmp_path, hang_after_s=90.0)
    # Orbax runs under a deadline (30 s here): a trainer caught inside a publish or checkpoint fails too.
    assert not result.hung, result.hung_in
    assert result.stage_errors and result.names_op_and_url, (result.stage_errors, result.output_tail)
    assert all("gave up after" in e or "no result within 30s" in e for e in result.stage_errors.values())
    assert "train" in result.stage_errors and result.outage_s < 90.0
    assert result.recovered, result.output_tail


def test_a_call_past_its_deadline_fails_naming_op_and_url_as_a_transient_error() -> None:
    stalled, returned = threading.Event(), threading.Event()

    def stalled_save() -> None:
        stalled.wait(60)
        returned.set()

    with pytest.raises(StorageError, match=r"^storage save gs://b/c/weights/v00000001: no result within 0.2s") as err:
        call_with_deadline("save", "gs://b/c/weights/v00000001", stalled_save, timeout_s=0.2)
    assert not returned.is_set()  # the caller got its error while the call was still stalled
    assert worth_retrying(err.value)  # a Prefect task retry may find storage back
    stalled.set()
    assert returned.wait(10)
    assert call_with_deadline("save", "gs://b/c", lambda: 7, timeout_s=5) == 7
    with pytest.raises(ZeroDivisionError):
        call_with_deadline("save", "gs://b/c", lambda: 1 // 0, timeout_s=5)
