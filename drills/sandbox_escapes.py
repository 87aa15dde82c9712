"""The sandbox escape catalogue: hostile programs run through the sandboxed Python tool, each checked for containment.

Every ``Escape`` is a program template run exactly as an agent would run it (``run_tool`` over ``PythonTool``),
against a prepared host: a TCP server on 127.0.0.1 counting connections, a folder outside the sandbox holding a
secret file, and a fake credential planted in the parent's environment. An attempt is *contained* when all of

- the tool call returned text (a result, not an exception), and the attempt's own expectation holds;
- the server accepted no connection, the outside secret was neither read nor changed, nothing new appeared
  outside, the planted credential is not in the result;
- the host is clean afterwards: no descendant processes (psutil), no sandbox folder left in the temp dir.

``run_escapes`` returns one ``EscapeOutcome`` per attempt; the escaped count is ``reliability.sandbox_escapes``.
``tests/test_sandbox_escapes.py`` runs the same catalogue one attempt per test.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from pipelines_lib.envs.tools.runner import run_tool
from pipelines_lib.envs.tools.sandbox import PythonTool, SandboxConfig

DRILL_SANDBOX = SandboxConfig(timeout_s=2.0, cpu_s=2, memory_mb=256, file_size_mb=4, max_output_bytes=4096)
PLANTED_ENV = "ROLLSTREAM_DRILL_API_TOKEN"
PLANTED_VALUE = "sk-drill-0123456789abcdef-do-not-leak"
SECRET_TEXT = "TOP-SECRET-OUTSIDE-THE-SANDBOX"


@dataclass(frozen=True, kw_only=True)
class Escape:
    name: str
    code: str
    """Program; ``{port}``, ``{outside}`` (a folder) and ``{secret}`` (a file in it) are filled in."""
    expect: Callable[[str], bool] = lambda text: True
    """Extra condition on the tool result text."""


def _refused(text: str) -> bool:
    return "PermissionError: sandbox:" in text or "MemoryError" in text or "[exit code" in text


ESCAPES: tuple[Escape, ...] = (
    Escape(name="socket_to_loopback_server", code="import socket\nsocket.create_connection(('127.0.0.1', {port}), 1)\n"
           "print('connected')", expect=lambda t: "connected" not in t),
    Escape(name="http_to_loopback_server", code="import urllib.request\n"
           "print(urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=1).read())", expect=_refused),
    Escape(name="asyncio_connection", code="import asyncio\nasync def m():\n    await asyncio.open_connection("
           "'127.0.0.1', {port})\n    print('connected')\nasyncio.run(m())", expect=lambda t: "connected" not in t),
    Escape(name="read_outside_absolute", code="print(open('{secret}').read())", expect=_refused),
    Escape(name="read_outside_traversal", code="import os\nrel = os.path.relpath('{secret}')\nprint(open(rel).read())",
           expect=_refused),
    Escape(name="list_outside", code="import os\nprint(os.listdir('{outside}'))", expect=_refused),
    Escape(name="symlink_out", code="import os\nos.symlink('{outside}', 'l')\nprint(open('l/secret.txt').read())",
           expect=_refused),
    Escape(name="write_outside", code="open('{outside}/planted.txt', 'w').write('x')", expect=_refused),
    Escape(name="delete_outside", code="import os\nos.remove('{secret}')", expect=_refused),
    Escape(name="rename_outside", code="import os\nos.rename('{secret}', 'stolen.txt')\nprint(open('stolen.txt').read())",
           expect=_refused),
    Escape(name="environment", code="import os\nprint(dict(os.environ))", expect=lambda t: "PATH" in t),
    Escape(name="parent_environ_via_proc", code="import os\nprint(open(f'/proc/{{os.getppid()}}/environ').read())",
           expect=_refused),
    Escape(name="self_environ_via_proc", code="print(open('/proc/self/environ').read())", expect=_refused),
    Escape(name="signal_parent", code="import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", expect=_refused),
    Escape(name="fork_bomb", code="import os\nwhile True:\n    os.fork()", expect=_refused),
    Escape(name="thread_bomb", code="import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, "
           "args=(100,)).start()", expect=lambda t: "[exit code" in t or "timed out" in t),
    Escape(name="detached_child", code="import subprocess\nsubprocess.Popen(['sleep', '300'], start_new_session=True)",
           expect=_refused),
    Escape(name="ctypes_fork", code="import ctypes\nctypes.CDLL(None).fork()", expect=_refused),
    Escape(name="memory_bomb_bytes", code="x = bytearray(8 * 1024**3)", expect=lambda t: "MemoryError" in t),
    Escape(name="memory_bomb_growth", code="x = []\nwhile True:\n    x.append(' ' * 10**6)",
           expect=lambda t: "MemoryError" in t or "[exit code" in t or "timed out" in t),
    Escape(name="cpu_loop", code="while True:\n    pass", expect=lambda t: "[exit code" in t or "timed out" in t),
    Escape(name="sleep_forever", code="import time\ntime.sleep(10**6)", expect=lambda t: "timed out" in t),
    Escape(name="gigantic_stdout", code="while True:\n    print('x' * 10000)",
           expect=lambda t: "[output truncated" in t and len(t) < 2 * DRILL_SANDBOX.max_output_bytes + 200),
    Escape(name="gigantic_single_write", code="import sys\nsys.stdout.write('y' * 10**8)",
           expect=lambda t: len(t) < 2 * DRILL_SANDBOX.max_output_bytes + 200),
    Escape(name="gigantic_stderr", code="import sys\nwhile True:\n    sys.stderr.write('e' * 10000)",
           expect=lambda t: len(t) < 2 * DRILL_SANDBOX.max_output_bytes + 200),
    Escape(name="big_file", code="open('big', 'wb').write(b'z' * (64 * 1024**2))",
           expect=lambda t: "[exit code" in t),
    Escape(name="many_files", code="for i in range(20000):\n    open(f'f{{i}}', 'w').close()\nprint('done')"),
)


@dataclass(frozen=True, kw_only=True)
class EscapeOutcome:
    name: str
    contained: bool
    problems: tuple[str, ...]
    """Why it is not contained (empty when it is)."""
    result: str
    seconds: float


@dataclass
class Host:
    """What an attempt could reach: a counting loopback server, an outside folder with a secret file."""

    port: int
    outside: Path
    secret: Path
    accepted: list[int]


@contextlib.contextmanager
def loopback_listener() -> Iterator[tuple[int, list[int]]]:
    """A listening socket on 127.0.0.1 that accepts and closes connections; yields ``(port, accepted)``, where
    ``accepted`` grows by one entry per connection that reached it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.05)
    accepted: list[int] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            accepted.append(1)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], accepted
    finally:
        stop.set()
        thread.join()
        server.close()


@contextlib.contextmanager
def prepared_host(root: Path) -> Iterator[Host]:
    """Server, outside folder, planted credential and a private temp dir for sandbox folders; all undone after."""
    outside = root / "outside"
    outside.mkdir(parents=True)
    secret = outside / "secret.txt"
    secret.write_text(SECRET_TEXT)
    sandbox_tmp = root / "sandbox-tmp"
    sandbox_tmp.mkdir()
    old_env, old_tmp = os.environ.get(PLANTED_ENV), tempfile.tempdir
    os.environ[PLANTED_ENV] = PLANTED_VALUE
    tempfile.tempdir = str(sandbox_tmp)
    try:
        with loopback_listener() as (port, accepted):
            yield Host(port=port, outside=outside, secret=secret, accepted=accepted)
    finally:
        tempfile.tempdir = old_tmp
        if old_env is None:
            os.environ.pop(PLANTED_ENV, None)
        else:
            os.environ[PLANTED_ENV] = old_env


def attempt(escape: Escape, host: Host, config: SandboxConfig = DRILL_SANDBOX) -> EscapeOutcome:
    """Run one escape attempt through the tool and check every containment condition."""
    code = escape.code.format(port=host.port, outside=host.outside, secret=host.secret)
    before_outside = sorted(p.name for p in host.outside.iterdir())
    before_conn = len(host.accepted)
    # Children this process had before the attempt (test servers, emulators) are not the sandbox's doing.
    before_children = {p.pid for p in psutil.Process().children(recursive=True)}
    start = time.perf_counter()
    problems: list[str] = []
    try:
        text, kind, _ = asyncio.run(run_tool(PythonTool(config=config), {"code": code},
                                             timeout_s=config.timeout_s + 10))
    except Exception as e:  # noqa: BLE001 - an exception out of the tool is itself a finding
        text, kind = "", None
        problems.append(f"tool raised {type(e).__name__}: {e}")
    seconds = time.perf_counter() - start
    if kind is not None:
        problems.append(f"tool call failed ({kind}): {text[:200]}")
    if not escape.expect(text):
        problems.append("unexpected result")
    if len(host.accepted) != before_conn:
        problems.append("the loopback server accepted a connection")
    if SECRET_TEXT in text:
        problems.append("the outside secret appears in the result")
    if not host.secret.exists() or host.secret.read_text() != SECRET_TEXT:
        problems.append("the outside secret was changed or removed")
    if sorted(p.name for p in host.outside.iterdir()) != before_outside:
        problems.append("a file appeared outside the sandbox")
    if PLANTED_VALUE in text:
        problems.append("the parent's planted credential appears in the result")
    leftovers = [p for p in psutil.Process().children(recursive=True) if p.pid not in before_children]
    if leftovers:
        problems.append(f"processes left behind: {[p.pid for p in leftovers]}")
        for p in leftovers:
            with contextlib.suppress(psutil.Error):
                p.kill()
    sandbox_dirs = os.listdir(tempfile.gettempdir())
    if sandbox_dirs:
        problems.append(f"sandbox folders left behind: {sandbox_dirs}")
    return EscapeOutcome(name=escape.name, contained=not problems, problems=tuple(problems), result=text[:500],
                         seconds=round(seconds, 3))


def run_escapes(root: Path, escapes: tuple[Escape, ...] = ESCAPES) -> list[EscapeOutcome]:
    """Every attempt of the catalogue against one prepared host under ``root`` (a fresh folder)."""
    with prepared_host(root) as host:
        return [attempt(e, host) for e in escapes]


__all__ = ["DRILL_SANDBOX", "ESCAPES", "Escape", "EscapeOutcome", "Host", "attempt", "loopback_listener", "prepared_host",
           "run_escapes"]
