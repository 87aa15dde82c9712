"""The Python sandbox, with real subprocesses: containment, limits, output handling, cleanup."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import tempfile
from collections.abc import Iterator

import psutil
import pytest

from drills.sandbox_escapes import loopback_listener
from pipelines_lib.envs import ToolError, make_tool, run_tool
from pipelines_lib.envs.tools.sandbox import PythonSandbox, SandboxConfig, SandboxResult

FAST = SandboxConfig(timeout_s=3.0, cpu_s=3, memory_mb=256, max_output_bytes=4096)


def run(code: str, config: SandboxConfig = FAST) -> SandboxResult:
    return asyncio.run(PythonSandbox(config).run(code))


_PREEXISTING = {p.pid for p in psutil.Process().children(recursive=True)}


def descendants() -> list[psutil.Process]:
    """Child processes other than long-lived test servers (the session's GCS emulator) started by fixtures."""
    servers = {p.pid for p in psutil.Process().children() if "fake-gcs-server" in p.name()}
    return [p for p in psutil.Process().children(recursive=True) if p.pid not in _PREEXISTING | servers]


@pytest.fixture
def tcp_server() -> Iterator[tuple[int, list[int]]]:
    """A listening socket on 127.0.0.1 that records every accepted connection."""
    with loopback_listener() as server:
        yield server


def test_runs_a_program_and_returns_its_output() -> None:
    result = run("print(6 * 7)")
    assert (result.stdout, result.stderr, result.exit_code, result.ok) == ("42\n", "", 0, True)
    assert result.as_text(FAST.timeout_s) == "42"


def test_exception_shows_a_traceback_of_the_program_only() -> None:
    result = run("def f():\n    raise ValueError('bad')\nf()\n")
    assert result.exit_code == 1
    assert 'File "main.py", line 2, in f' in result.stderr
    assert result.stderr.rstrip().endswith("ValueError: bad")
    assert "<string>" not in result.stderr  # the bootstrap frame is hidden
    assert result.as_text(FAST.timeout_s).endswith("ValueError: bad\n[exit code 1]")


def test_exit_code_is_reported() -> None:
    assert run("import sys; sys.exit(3)").as_text(FAST.timeout_s) == "[exit code 3]"


@pytest.mark.parametrize("network", ["auto", "audit"])
def test_no_connection_reaches_a_local_server(network: str, tcp_server: tuple[int, list[int]]) -> None:
    port, accepted = tcp_server
    code = (
        f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')"
    )
    result = run(code, SandboxConfig(timeout_s=3.0, network=network))  # type: ignore[arg-type]
    assert "connected" not in result.stdout
    assert result.exit_code == 1
    assert accepted == []
    # The control: the server does accept connections from outside the sandbox.
    socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_network_isolation_mode_is_reported() -> None:
    sandbox = PythonSandbox(FAST)
    assert sandbox.network_isolation is None
    asyncio.run(sandbox.run("pass"))
    assert sandbox.network_isolation in ("netns", "audit")
    audit_only = PythonSandbox(SandboxConfig(network="audit"))
    asyncio.run(audit_only.run("pass"))
    assert audit_only.network_isolation == "audit"


def test_files_outside_the_working_directory_cannot_be_read_or_written(tmp_path: os.PathLike[str]) -> None:
    secret = os.path.join(tmp_path, "secret.txt")
    with open(secret, "w") as f:
        f.write("TOP SECRET")
    target = os.path.join(tmp_path, "written.txt")
    for code in (
        f"print(open({secret!r}).read())",
        f"import os; print(os.listdir({str(tmp_path)!r}))",
        "print(open('/etc/hostname').read())",
        "print(open('../../etc/hostname').read())",
        f"open({target!r}, 'w').write('x')",
        f"import os; os.remove({secret!r})",
        f"import os; fd = os.open({target!r}, os.O_WRONLY | os.O_CREAT); os.write(fd, b'x')",
    ):
        result = run(code)
        assert result.exit_code == 1, code
        assert "PermissionError: sandbox:" in result.stderr, code
        assert "TOP SECRET" not in result.stdout
    assert not os.path.exists(target)
    assert os.path.exists(secret)


def test_files_inside_the_working_directory_work() -> None:
    result = run(
        "open('a.txt', 'w').write('ok')\nimport os\nprint(open('a.txt').read(), sorted(os.listdir()))"
    )
    assert result.stdout == "ok ['a.txt', 'main.py']\n"


def test_the_working_directory_is_removed_afterwards() -> None:
    result = run("import os; print(os.getcwd())")
    workdir = result.stdout.strip()
    assert "rollstream-sandbox-" in workdir
    assert not os.path.exists(workdir)


def test_parent_environment_is_not_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SECRET_TOKEN", "hunter2-do-not-leak")
    result = run("import os\nprint(sorted(os.environ))\nprint(os.environ.get('FAKE_SECRET_TOKEN'))")
    assert result.stdout == "['HOME', 'LANG', 'PATH', 'TMPDIR']\nNone\n"
    assert "hunter2" not in result.stdout + result.stderr


def test_standard_library_works_but_site_packages_do_not() -> None:
    result = run(
        "import json, re, math, collections, itertools, asyncio\nprint(json.dumps([1]))\nimport psutil"
    )
    assert result.stdout == "[1]\n"
    assert "ModuleNotFoundError: No module named 'psutil'" in result.stderr


@pytest.mark.parametrize(
    "code",
    [
        "import os\nwhile True:\n    os.fork()",
        "import subprocess\nsubprocess.run(['sleep', '100'])",
        "import os\nos.system('sleep 100 &')",
        "import _posixsubprocess\n_posixsubprocess.fork_exec()",
        "import multiprocessing\nmultiprocessing.Process(target=print).start()",
        "import ctypes\nctypes.CDLL(None).fork()",
        "import sys\ndel sys.modules['_posixsubprocess']\nimport _posixsubprocess\n_posixsubprocess.fork_exec()",
    ],
    ids=["fork_bomb", "subprocess", "system", "fork_exec", "multiprocessing", "ctypes", "fresh_fork_exec"],
)
def test_no_new_processes(code: str) -> None:
    result = run(code)
    assert result.exit_code == 1
    assert "PermissionError: sandbox:" in result.stderr
    assert descendants() == []


def test_memory_bomb_fails_with_memory_error() -> None:
    result = run("x = bytearray(2 * 1024**3)")
    assert result.exit_code == 1
    assert result.stderr.rstrip().endswith("MemoryError")


def test_infinite_loop_is_killed_at_the_wall_clock_limit_with_no_leftovers() -> None:
    config = SandboxConfig(timeout_s=0.5, cpu_s=10)
    result = run("print('started', flush=True)\nwhile True:\n    pass", config)
    assert result.timed_out and not result.ok
    assert result.exit_code == -signal.SIGKILL
    assert result.stdout == "started\n"  # output before the kill is kept
    assert 0.5 <= result.wall_s < 2.0
    assert result.as_text(config.timeout_s) == "started\n[timed out after 0.5 s]"
    assert descendants() == []


def test_sleeping_program_is_killed_at_the_wall_clock_limit() -> None:
    result = run("import time\ntime.sleep(100)", SandboxConfig(timeout_s=0.3))
    assert result.timed_out
    assert descendants() == []


def test_cpu_limit_stops_a_busy_loop_before_the_wall_clock() -> None:
    result = run("while True:\n    pass", SandboxConfig(timeout_s=10.0, cpu_s=1))
    assert not result.timed_out
    assert result.exit_code in (-signal.SIGXCPU, -signal.SIGKILL)
    assert result.wall_s < 5.0


def test_gigantic_output_is_truncated_and_the_program_stopped() -> None:
    result = run("while True:\n    print('x' * 1000)")
    assert result.truncated and not result.timed_out
    assert len(result.stdout) == FAST.max_output_bytes  # stopped by the output cap, not by the timeout (no wall
    # clock bound here: on a loaded 2-core machine reaping took 5 s once; speed lives in benchmarks)
    assert result.as_text(FAST.timeout_s).endswith("\n[output truncated; program stopped]")
    assert descendants() == []


def test_file_size_limit() -> None:
    result = run("open('big', 'wb').write(b'x' * (2 * 1024**2))", SandboxConfig(file_size_mb=1))
    assert result.exit_code != 0  # SIGXFSZ or OSError(EFBIG)


def test_concurrent_runs_are_independent() -> None:
    async def main() -> list[SandboxResult]:
        sandbox = PythonSandbox(FAST)
        return await asyncio.gather(*(sandbox.run(f"print({i} * {i})") for i in range(4)))

    assert [r.stdout for r in asyncio.run(main())] == ["0\n", "1\n", "4\n", "9\n"]


def test_python_tool_reports_results_and_refuses_bad_arguments() -> None:
    tool = make_tool("python", config=FAST)
    assert asyncio.run(tool({"code": "print('hi')"})) == "hi"
    with pytest.raises(ToolError, match="missing argument 'code'"):
        asyncio.run(tool({"program": "print(1)"}))
    text, kind, _ = asyncio.run(run_tool(tool, {"code": "1/0"}, timeout_s=5.0))
    assert kind is None  # a failing program is a result, not a tool failure
    assert text.endswith("ZeroDivisionError: division by zero\n[exit code 1]")


def test_cancelled_run_kills_the_child_and_removes_its_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]
) -> None:
    """run_tool's deadline shorter than the sandbox's: cancellation must clean up like a timeout."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the sandbox's folder goes here
    tool = make_tool("python", config=SandboxConfig(timeout_s=30.0, cpu_s=30))
    assert asyncio.run(tool({"code": "import os; print(os.getcwd())"})).startswith(str(tmp_path))
    code = "import os\nprint(os.getcwd(), flush=True)\nwhile True:\n    pass"
    text, kind, latency = asyncio.run(run_tool(tool, {"code": code}, timeout_s=0.5))
    assert kind == "timeout" and latency < 5.0
    assert descendants() == []
    assert os.listdir(tmp_path) == []


def test_config_validation_names_the_bad_value() -> None:
    with pytest.raises(ValueError, match="memory_mb must be >= 1, got 0"):
        SandboxConfig(memory_mb=0)
    with pytest.raises(ValueError, match="network must be 'auto' or 'audit', got 'off'"):
        SandboxConfig(network="off")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="program too long"):
        asyncio.run(PythonSandbox(SandboxConfig(max_code_chars=5)).run("print(1)"))
