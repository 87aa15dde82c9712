"""Storage faults through a real network path: gcsfs → FaultProxy → the GCS-API emulator (drills/storage_faults.py)."""

from __future__ import annotations

import logging
import urllib.error
import urllib.request

import pytest

from pipelines_lib.drills.faultproxy import FaultPlan, FaultProxy
from pipelines_lib.drills.storage_faults import outage_drill, proxied_store, run_fault_workload
from pipelines_lib.storage.store import RetryPolicy


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
