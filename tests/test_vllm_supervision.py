"""Supervision of a launched vLLM server that keeps crashing, with a real subprocess in its place
(``fixtures/crashing_vllm_server.py``: the endpoints ``VllmEngine`` uses, fixed tokens, exits on a schedule).

The rollout's view is simulated by ``drive``: lanes of requests one after another, where a request the engine
could not serve is an ``engine_error`` episode and the lane goes on, and any other exception stops the run, as the
orchestrator does."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from pipelines_lib.engine.api import Completion, EngineUnavailableError, SamplingParams
from pipelines_lib.engine.config import VllmConfig
from pipelines_lib.engine.vllm_engine import VllmEngine

CRASHING_SERVER = Path(__file__).resolve().parent / "fixtures" / "crashing_vllm_server.py"
LANES = 8


def crashing_engine(tmp_path: Path, *flags: str, max_restarts: int, logs: list[str]) -> VllmEngine:
    """A ``VllmEngine`` that launches the crashing server with ``flags`` (its lives are counted in
    ``tmp_path/lives``)."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {CRASHING_SERVER} --lives {tmp_path / "lives"} '
                       f'{" ".join(flags)} "$@"\n')
    wrapper.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"dtype": "float32"}')
    config = VllmConfig(python=str(wrapper), max_restarts=max_restarts, startup_timeout_s=30.0,
                        request_timeout_s=30.0)
    return VllmEngine(config, model_dir=model, policy_version=0, max_seq_len=64, log_path=tmp_path / "server.log",
                      log=logs.append)


def lives(tmp_path: Path) -> int:
    return len((tmp_path / "lives").read_text().splitlines())


async def drive(engine: VllmEngine, deadline_s: float = 60.0) -> tuple[int, int, BaseException | None]:
    """``LANES`` lanes of requests, each until a request raises something other than ``EngineUnavailableError``
    (or ``deadline_s`` passes): (served, engine errors, what stopped the run). Every lane runs to its own end, so
    an answer still on its way when another lane stopped is counted (a stopped engine stops every lane)."""
    served = failed = 0
    stop = time.monotonic() + deadline_s

    async def lane(i: int) -> None:
        nonlocal served, failed
        while time.monotonic() < stop:
            try:
                await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=4, seed=i))
                served += 1
            except EngineUnavailableError:
                failed += 1

    ends = await asyncio.gather(*(lane(i) for i in range(LANES)), return_exceptions=True)
    return served, failed, next((end for end in ends if isinstance(end, BaseException)), None)


@pytest.mark.parametrize("death", ["exits", "lingers"])
def test_a_server_that_keeps_dying_stops_the_run_after_max_restarts_naming_the_cause(tmp_path: Path,
                                                                                     death: str) -> None:
    """Each life serves 10 requests, then its engine dies: the process exits, or (as vLLM's API process after its
    engine died) stays up answering 500 and a failing health probe. Only the requests in flight at each death
    fail; the third death stops the run."""
    logs: list[str] = []
    flags = ("--serve", "10", *(("--linger",) if death == "lingers" else ()))

    async def main() -> tuple[int, int, BaseException | None, dict[str, float]]:
        async with crashing_engine(tmp_path, *flags, max_restarts=2, logs=logs) as engine:
            served, failed, stopped = await drive(engine)
            return served, failed, stopped, engine.stats()

    served, failed, stopped, stats = asyncio.run(main())
    assert isinstance(stopped, RuntimeError) and not isinstance(stopped, EngineUnavailableError)
    assert "died again after 2 restarts (engine.vllm.max_restarts)" in str(stopped)
    assert "first error of its last run: RuntimeError: life 3 dies after 10 completions" in str(stopped)
    assert lives(tmp_path) == 3 and stats["restarts"] == 2 and served == 30
    assert failed <= 3 * LANES
    restarts = [line for line in logs if "restarting it" in line]
    assert len(restarts) == 2 and "(RuntimeError: life 2 dies after 10 completions)" in restarts[1]


def test_a_server_that_cannot_start_again_stops_the_run_at_once(tmp_path: Path) -> None:
    async def main() -> tuple[int, int, BaseException | None]:
        async with crashing_engine(tmp_path, "--serve", "10", "--start-lives", "1", max_restarts=3,
                                   logs=[]) as engine:
            return await drive(engine)

    served, failed, stopped = asyncio.run(main())
    assert isinstance(stopped, RuntimeError) and not isinstance(stopped, EngineUnavailableError)
    assert "could not be restarted" in str(stopped) and "life 2 fails during start-up" in str(stopped)
    assert lives(tmp_path) == 2 and served == 10 and failed <= LANES


def test_a_server_that_never_starts_fails_the_engine_on_entry(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="exited during startup(.|\n)*life 1 fails during start-up"):
        asyncio.run(crashing_engine(tmp_path, "--start-lives", "0", max_restarts=3, logs=[]).__aenter__())
    assert lives(tmp_path) == 1


def test_a_server_check_ending_during_a_reload_keeps_requests_out_until_the_reload_is_done(tmp_path: Path) -> None:
    """A failed request starts a check of the server; the check finds it healthy and withdraws its hold on the
    gate while a reload still holds it: a request sent meanwhile waits and runs on the new version."""

    async def main() -> Completion:
        async with crashing_engine(tmp_path, "--reload-s", "2", max_restarts=0, logs=[]) as engine:
            reload = engine.swap_weights(tmp_path / "model", 1)
            await asyncio.sleep(0.5)  # the server is reloading
            await engine._on_failure()  # as a request that failed now would
            await engine._restart  # the check: healthy
            completion = await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
            await reload
            return completion

    assert asyncio.run(main()).policy_versions == [1, 1]
