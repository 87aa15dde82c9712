"""Process settings: read once from the environment by each entry point, the same defaults everywhere, and a storage
endpoint that never answers cannot hang a command (a real black-hole TCP listener as gcsfs's endpoint)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from drills.blackhole import BlackHole
from pipelines_lib.settings import (
    COMPILATION_CACHE_VAR,
    DEFAULTS,
    ENV_VARS,
    PROCESS_DEFAULTS,
    Settings,
    apply_process_defaults,
    compilation_cache_dir,
)
from pipelines_lib.storage.errors import StorageError
from pipelines_lib.storage.store import Store
from tasks.common import worth_retrying

ROOT = Path(__file__).resolve().parents[1]
FAST = {"ROLLSTREAM_STORAGE_REQUEST_TIMEOUT_S": "0.5", "ROLLSTREAM_STORAGE_DEADLINE_S": "1"}
"""Short budgets for the black-hole commands (the defaults, 30 s / 60 s, are what users get)."""


def test_settings_come_from_rollstream_variables_and_default_otherwise(tmp_path: Path) -> None:
    assert Settings.from_env({}) == DEFAULTS == Settings()
    assert (DEFAULTS.storage_request_timeout_s, DEFAULTS.storage_deadline_s, DEFAULTS.orbax_deadline_s) == (30, 60, 600)
    got = Settings.from_env({"ROLLSTREAM_STORAGE_REQUEST_TIMEOUT_S": "5", "ROLLSTREAM_STORAGE_DEADLINE_S": "7.5",
                             "ROLLSTREAM_ORBAX_DEADLINE_S": "30", "ROLLSTREAM_CACHE": str(tmp_path), "OTHER": "x"})
    assert got == Settings(storage_request_timeout_s=5, storage_deadline_s=7.5, orbax_deadline_s=30, cache=tmp_path)
    assert (got.retry().request_timeout_s, got.retry().deadline_s) == (5, 7.5)


@pytest.mark.parametrize("var", ["ROLLSTREAM_STORAGE_REQUEST_TIMEOUT_S", "ROLLSTREAM_STORAGE_DEADLINE_S",
                                 "ROLLSTREAM_ORBAX_DEADLINE_S"])
@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "soon"])
def test_a_bad_setting_is_refused_naming_its_variable(var: str, bad: str) -> None:
    with pytest.raises(ValueError, match=var):
        Settings.from_env({var: bad})


def test_process_defaults_fill_gaps_and_explicit_values_win() -> None:
    environ = {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "true", "HOME": "/home/u"}
    apply_process_defaults(environ)
    assert environ == {**PROCESS_DEFAULTS, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "true", "HOME": "/home/u",
                       "JAX_COMPILATION_CACHE_DIR": "/home/u/.cache/rollstream/jax"}


def test_compilation_cache_is_in_the_users_cache_folder_unless_chosen_or_off() -> None:
    assert compilation_cache_dir({"HOME": "/home/u"}) == "/home/u/.cache/rollstream/jax"
    assert compilation_cache_dir({"HOME": "/home/u", "XDG_CACHE_HOME": "/c"}) == "/c/rollstream/jax"
    assert compilation_cache_dir({"HOME": "/home/u", COMPILATION_CACHE_VAR: "~/jc"}) == os.path.expanduser("~/jc")
    assert compilation_cache_dir({"HOME": "/home/u", COMPILATION_CACHE_VAR: "OFF"}) is None
    explicit = {COMPILATION_CACHE_VAR: "off", "JAX_COMPILATION_CACHE_DIR": "/x"}
    assert compilation_cache_dir(explicit) == "/x"
    off = {"HOME": "/home/u", COMPILATION_CACHE_VAR: "off"}
    apply_process_defaults(off)
    assert "JAX_COMPILATION_CACHE_DIR" not in off


_WARM_UP = """
import asyncio, dataclasses, json, os
from pipelines_lib.settings import apply_process_defaults
apply_process_defaults(os.environ)  # as every entry point does, before JAX is imported
import jax
from flax import nnx
counts = {"hits": 0, "misses": 0}
jax.monitoring.register_event_listener(
    lambda event, **_: counts.update({k: counts[k] + 1 for k in counts if event.endswith("cache_" + k)}))
from pipelines_lib.engine import EngineConfig, JaxEngine
from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder
model = Decoder(dataclasses.replace(ModelConfig.tiny(), n_layers=1), rngs=nnx.Rngs(0))
async def main():
    async with JaxEngine(model, EngineConfig(num_slots=1, max_seq_len=32, prefill_buckets=(16,))) as engine:
        await engine.warmup()
asyncio.run(main())
print(json.dumps(counts))
"""


_OPEN_TOKENIZER = """
import os, sys
from pipelines_lib.settings import apply_process_defaults
if sys.argv[1] == "entry":
    apply_process_defaults(os.environ)
from pipelines_lib.model.tokenizer import open_tokenizer
open_tokenizer(None)
"""


def test_an_entry_point_opens_the_tokenizer_without_transformers_pytorch_notice() -> None:
    def stderr(how: str) -> str:
        env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_NO_ADVISORY_WARNINGS"}
        done = subprocess.run([sys.executable, "-c", _OPEN_TOKENIZER, how], env=env, capture_output=True, text=True,
                              timeout=120, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stderr

    notice = "PyTorch was not found"
    assert notice not in stderr("entry")
    try:
        import torch  # noqa: F401
    except ImportError:  # the control: without the entry point's defaults transformers prints it here
        assert notice in stderr("bare")


def test_a_second_process_with_the_same_shapes_loads_the_engine_from_the_compilation_cache(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    # Cache every program, however fast it compiled (JAX skips those under a second by default).
    env.update({COMPILATION_CACHE_VAR: str(tmp_path / "jax"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"})

    def warm_up() -> dict[str, int]:
        done = subprocess.run([sys.executable, "-c", _WARM_UP], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    first = warm_up()
    assert first["hits"] == 0 and first["misses"] >= 2  # at least the prefill and decode programs
    assert any((tmp_path / "jax").iterdir())
    second = warm_up()
    assert second == {"hits": first["misses"], "misses": 0}


def test_a_gcs_store_gets_the_request_timeout_unless_its_options_set_one() -> None:
    options = {"endpoint_url": "http://127.0.0.1:9", "token": "anon"}
    store = Settings(storage_request_timeout_s=3, orbax_deadline_s=9).store("gs://b/c", options)
    assert store.fs.requests_timeout == 3 and store.retry.deadline_s == 60 and store.external_deadline_s == 9
    assert options == {"endpoint_url": "http://127.0.0.1:9", "token": "anon"}  # the caller's mapping is untouched
    explicit = DEFAULTS.store("gs://b/c", {**options, "requests_timeout": 11})
    assert explicit.fs.requests_timeout == 11
    assert explicit.other("gs://b/other").fs.requests_timeout == 11  # same backend: same options and budgets


def test_orbax_is_pointed_at_a_gcs_endpoint_only() -> None:
    env = Settings.orbax_environment("gs://b/c", {"endpoint_url": "http://h:1", "token": "anon"})
    assert env == {"TENSORSTORE_GCS_HTTP_URL": "http://h:1", "STORAGE_EMULATOR_HOST": "http://h:1",
                   "GOOGLE_AUTH_TOKEN_FOR_TESTING": "anon"}
    assert Settings.orbax_environment("gs://b/c", None) == {} == Settings.orbax_environment("/tmp/x", env)


def test_an_external_call_past_the_stores_deadline_fails_naming_op_and_url(tmp_path: Path) -> None:
    store = Store(str(tmp_path), external_deadline_s=0.2)
    stalled = threading.Event()
    with pytest.raises(StorageError, match=rf"^storage save weights {store.url}/weights/v1: no result within 0.2s"
                       ) as err:
        store.call_external("save weights", "weights/v1", lambda: stalled.wait(30))
    stalled.set()
    assert worth_retrying(err.value)


def test_nothing_below_the_entry_points_reads_the_environment() -> None:
    # Entry points: the CLI and settings (which the entry points call). Everything else gets Settings passed down.
    # The vLLM supervisor hands this process's environment on to the server it starts; it reads no setting from it.
    allowed = {ROOT / "pipelines_lib" / "settings.py", ROOT / "pipelines_lib" / "cli.py",
               ROOT / "pipelines_lib" / "engine" / "vllm_supervisor.py"}
    readers = []
    for path in sorted([*(ROOT / "pipelines_lib").rglob("*.py"), *(ROOT / "tasks").glob("*.py")]):
        if path in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv") and (
                    isinstance(node.value, ast.Name) and node.value.id == "os"):
                readers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert readers == []


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipelines_lib.cli", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


def _bare_env(**extra: str) -> dict[str, str]:
    """This environment without any of the defaults the CLI must set itself, nor ROLLSTREAM_* settings."""
    drop = {*PROCESS_DEFAULTS, *ENV_VARS.values()}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "PYTHONPATH": str(ROOT), **extra}


@pytest.mark.parametrize("command", [["audit"], ["status"], ["metrics"], ["trace", "--out", "unused.json"],
                                     ["export", "{out}"]])
def test_a_black_hole_endpoint_fails_each_command_with_one_line_naming_op_and_url(command: list[str],
                                                                                  tmp_path: Path) -> None:
    with BlackHole() as hole:
        args = [c.replace("{out}", str(tmp_path / "out")) for c in command]
        result = _cli(args[0], "gs://bucket/campaign", *args[1:], "-o", f"endpoint_url={hole.url}", "-o", "token=anon",
                      env=_bare_env(**FAST))
        assert hole.connections >= 1
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"rollstream {command[0]}: storage ") and "gs://bucket/campaign" in last
    assert "gave up after" in last and "Traceback" not in result.stderr


def test_the_cli_sets_the_library_defaults_before_gcsfs_is_imported() -> None:
    code = ("import os, sys; from pipelines_lib import cli; cli.main(['status', 'nope://x']); "
            "import gcsfs.core; print(os.environ['GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT'], "
            "'gcsfs.extended_gcsfs' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=_bare_env(), capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["false", "False"], out.stderr


def test_a_bad_setting_exits_2_with_one_line() -> None:
    result = _cli("status", "/nowhere", env=_bare_env(ROLLSTREAM_STORAGE_DEADLINE_S="soon"))
    assert result.returncode == 2
    assert result.stderr == "rollstream status: bad environment: ROLLSTREAM_STORAGE_DEADLINE_S must be a number " \
                            "of seconds, got 'soon'\n"
