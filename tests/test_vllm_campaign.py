"""A whole tiny campaign on ``engine.kind: vllm`` (``bench.vllm.run_vllm_campaign``): warm start, a rollout worker
serving from a vLLM server it launches, the streaming trainer publishing after each of its two steps (so the
worker reloads the server twice), and a clean audit.

Marked slow (about 90 s on 2 cores, most of it the server's start-up): ``make bench``'s ``vllm`` benchmark runs the
same campaign with goals on the same figures, and the default suite checks the engine's reloads, restarts and
logprobs against a server in ``test_vllm_engine.py``. The model is the tiny preset with untied embeddings (the
tied case is ``test_vllm_engine.py``'s). The mismatch metric is what proves the reloads: tokens the trainer
consumed were sampled by the server, and their recorded logprobs agree with the trainer's own on the same version
within the engines' tolerance only if the server was really serving that version.
"""

from __future__ import annotations

import pytest

from bench.vllm import run_vllm_campaign, vllm_campaign_config
from pipelines_lib.storage.store import Store
from tests.test_vllm_engine import vllm_python


@pytest.mark.slow
def test_a_tiny_campaign_on_vllm_trains_publishes_reloads_and_audits_clean(tmp_path) -> None:
    store = Store(str(tmp_path / "campaign"))
    result = run_vllm_campaign(store, vllm_campaign_config(python=str(vllm_python())))
    assert result["published_version"] == 2
    assert store.exists("weights/v00000002/hf/config.json")
    assert {0, 1} <= set(result["versions_sampled"]), result  # the worker reloaded its server and stamped the new version
    assert any(n.startswith("engine-w0.") for n in store.list("telemetry"))
    assert result["fresh_mismatch_p99"] and max(result["fresh_mismatch_p99"]) < 1e-3, result
    assert result["audit_ok"]
