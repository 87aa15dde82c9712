"""Sandboxed Python: run untrusted model code in a separate, limited, throw-away process.

Layers, outermost first (each one alone stops the common accidents; together they contain naive
hostile code):

1. **Process**: ``python -I -S -B`` (isolated mode: no ``PYTHON*`` variables, no site-packages, no
   user site, no bytecode writes), started in its own session so a timeout kills the whole process
   group, with an empty environment (``PATH``/``HOME``/``LANG`` only: no parent variables or
   credentials), stdin from ``/dev/null`` and a fresh temporary working directory that is removed
   afterwards.
2. **Kernel limits** set by the child before running the code: ``RLIMIT_CPU`` (CPU seconds),
   ``RLIMIT_AS`` (memory), ``RLIMIT_FSIZE`` (file size), ``RLIMIT_NPROC`` (processes),
   ``RLIMIT_NOFILE`` and no core dumps. Note: Linux does not enforce ``RLIMIT_NPROC`` for root;
   when the pipeline runs as root, layer 4 and the process-group kill contain fork bombs.
3. **Network namespace**: with ``network="auto"`` the child runs under ``unshare -n`` when that
   works (root, or unprivileged user namespaces via ``unshare -rn``); the namespace has only a
   down loopback, so no connection can leave. Where neither works (some containers) it falls back
   to layer 4 alone; :attr:`PythonSandbox.network_isolation` reports which one is in effect.
4. **Audit hook** (PEP 578) installed before the code runs: refuses socket creation, process
   creation (fork/exec/spawn/subprocess/system; ``_posixsubprocess.fork_exec`` is stubbed),
   signals to other processes, ``ctypes``, links, and any file access outside the working
   directory (reads of the standard library excepted). Audit hooks are defence in depth, not a
   security boundary against an adversary who can reach interpreter internals.

The child keeps the parent's user: file containment beyond the audit hook comes from file
permissions, so run rollout workers as an unprivileged user in production (dropping to ``nobody``
inside the sandbox would need an interpreter that user can read; pyenv installs under ``/root``
cannot be). CPU, memory, output, time, network (with a namespace) and the environment are bounded
by the kernel and the parent whatever the code does.

The parent reads at most ``max_output_bytes`` per stream; past that it stops the child (a print
loop has nothing more to say) and marks the result truncated. Every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from pipelines_lib.envs.base import Tool, require_str_arg
from pipelines_lib.envs.registry import register_tool


@dataclass(frozen=True, kw_only=True)
class SandboxConfig:
    """Limits of one sandboxed run."""

    timeout_s: float = 5.0
    """Wall-clock limit; the process group is killed when it passes."""
    cpu_s: int = 5
    """RLIMIT_CPU in seconds (SIGXCPU, then SIGKILL one second later)."""
    memory_mb: int = 512
    """RLIMIT_AS (virtual memory) in MiB."""
    file_size_mb: int = 8
    """RLIMIT_FSIZE: largest file the code may write, in MiB."""
    max_processes: int = 1
    """RLIMIT_NPROC: 1 means the code cannot fork or start threads (not enforced for root)."""
    max_open_files: int = 64
    """RLIMIT_NOFILE."""
    max_output_bytes: int = 16_384
    """Bytes kept per stream (stdout, stderr); more stops the child and marks the result truncated."""
    max_code_chars: int = 50_000
    """Longest accepted program."""
    network: Literal["auto", "audit"] = "auto"
    """``auto``: network namespace via ``unshare`` when available, plus the audit hook;
    ``audit``: the audit hook alone."""
    python: str = field(default_factory=lambda: sys.executable)
    """Interpreter to run (only its standard library is visible)."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        for f in ("cpu_s", "memory_mb", "file_size_mb", "max_processes", "max_open_files"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1, got {getattr(self, f)}")
        if self.max_output_bytes < 1:
            raise ValueError(f"max_output_bytes must be >= 1, got {self.max_output_bytes}")
        if self.max_code_chars < 1:
            raise ValueError(f"max_code_chars must be >= 1, got {self.max_code_chars}")
        if self.network not in ("auto", "audit"):
            raise ValueError(f"network must be 'auto' or 'audit', got {self.network!r}")

    @classmethod
    def tiny(cls) -> SandboxConfig:
        """Tight limits for tests and CPU demos."""
        return cls(timeout_s=3.0, cpu_s=3, memory_mb=256, max_output_bytes=4096)


@dataclass(frozen=True, kw_only=True)
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None
    """Process exit status; negative = killed by that signal; None if it never finished."""
    timed_out: bool
    truncated: bool
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.truncated

    def as_text(self, timeout_s: float) -> str:
        """What the model sees: stdout, then stderr and status lines only when they say something."""
        parts = [self.stdout.rstrip("\n")] if self.stdout else []
        if self.stderr:
            parts.append("[stderr]\n" + self.stderr.rstrip("\n"))
        if self.truncated:
            parts.append("[output truncated; program stopped]")
        elif self.timed_out:
            parts.append(f"[timed out after {timeout_s:g} s]")
        elif self.exit_code != 0:
            parts.append(f"[exit code {self.exit_code}]")
        return "\n".join(parts) if parts else "(no output)"


# Runs in the child as `python -I -S -B -c _BOOTSTRAP <limits json>` from inside the working
# directory: limits first, then the audit hook, then the program in a fresh namespace (so the
# bootstrap's names are not in its globals) with the bootstrap's own traceback frame hidden.
_BOOTSTRAP = r"""
import json, os, resource, sys, traceback
cfg = json.loads(sys.argv[1])
for name, value in cfg["rlimits"].items():
    hard = value + 1 if name == "RLIMIT_CPU" else value
    resource.setrlimit(getattr(resource, name), (value, hard))
WORK = os.path.realpath(os.getcwd())
STDLIB = os.path.realpath(os.path.dirname(os.__file__))
with open("main.py", encoding="utf-8") as f:
    SOURCE = f.read()
# subprocess (and so asyncio) import fork_exec at import time; a stub keeps them importable while
# making process creation impossible even for code that skips subprocess.Popen's audit event.
import _posixsubprocess
def _no_fork_exec(*args, **kwargs):
    raise PermissionError("sandbox: new processes are not allowed")
_posixsubprocess.fork_exec = _no_fork_exec
sys.stdout.reconfigure(line_buffering=True)
sys.stderr.reconfigure(line_buffering=True)

def _install(work, read_roots, write_roots, blocked_events, blocked_modules, path_events, open_write_flags):
    def inside(path, roots):
        if isinstance(path, int):
            return True
        if path is None:
            path = "."
        p = os.path.realpath(os.path.join(work, os.fsdecode(path)))
        return any(p == r or p.startswith(r + os.sep) for r in roots)

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & open_write_flags)
            if not inside(path, write_roots if writing else read_roots):
                raise PermissionError(f"sandbox: access to {path!r} is not allowed (only the working directory)")
        elif event in path_events:
            n_paths, writing = path_events[event]
            for path in args[:n_paths]:
                if not inside(path, write_roots if writing else read_roots):
                    raise PermissionError(f"sandbox: {event} on {path!r} is not allowed (only the working directory)")
        elif event == "import":
            if args[0].split(".")[0] in blocked_modules:
                raise PermissionError(f"sandbox: module {args[0]!r} is not available")
        elif event in blocked_events or event.startswith(("socket.", "ctypes.")):
            raise PermissionError(f"sandbox: {event} is not allowed (no network, no new processes)")

    sys.addaudithook(hook)

_install(
    WORK,
    (WORK, STDLIB, "/dev/null", "/dev/urandom"),
    (WORK, "/dev/null"),
    frozenset({"os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
               "subprocess.Popen", "os.kill", "os.killpg", "os.symlink", "os.link", "os.chown",
               "os.setxattr", "os.removexattr", "pty.spawn", "sys.addaudithook"}),
    frozenset({"ctypes", "_ctypes", "_posixsubprocess"}),  # re-imports would undo the stub
    # event -> (how many leading arguments are paths, whether it writes)
    {"os.listdir": (1, False), "os.scandir": (1, False), "os.chdir": (1, False),
     "os.remove": (1, True), "os.rmdir": (1, True), "os.mkdir": (1, True), "os.chmod": (1, True),
     "os.truncate": (1, True), "os.utime": (1, True), "os.rename": (2, True),
     "shutil.rmtree": (1, True), "shutil.copyfile": (2, True), "shutil.move": (2, True)},
    os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND,
)
del _install
sys.argv = ["main.py"]
try:
    exec(compile(SOURCE, "main.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
except SystemExit:
    raise
except BaseException as e:
    traceback.print_exception(type(e), e, e.__traceback__.tb_next)
    sys.exit(1)
"""


class PythonSandbox:
    """Runs programs under :class:`SandboxConfig` limits; safe to share between concurrent episodes."""

    def __init__(self, config: SandboxConfig = SandboxConfig()) -> None:
        self.config = config
        self._network_prefix: list[str] | None = None

    @property
    def network_isolation(self) -> str | None:
        """``"netns"`` or ``"audit"`` once the first run has probed the machine, else None."""
        if self._network_prefix is None:
            return None
        return "netns" if self._network_prefix else "audit"

    async def _probe_network_prefix(self) -> list[str]:
        if self.config.network == "audit" or shutil.which("unshare") is None:
            return []
        for prefix in (["unshare", "-n", "--"], ["unshare", "-r", "-n", "--"]):
            proc = await asyncio.create_subprocess_exec(
                *prefix, "true", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
            )
            try:
                if await asyncio.wait_for(proc.wait(), timeout=5.0) == 0:
                    return prefix
            except TimeoutError:
                proc.kill()
                await proc.wait()
        return []

    async def run(self, code: str, *, clock: Any = time.perf_counter) -> SandboxResult:
        """Run ``code`` as a program; never raises for anything the program does."""
        cfg = self.config
        if len(code) > cfg.max_code_chars:
            raise ValueError(f"program too long ({len(code)} > {cfg.max_code_chars} characters)")
        if self._network_prefix is None:
            self._network_prefix = await self._probe_network_prefix()
        limits = {
            "rlimits": {
                "RLIMIT_CPU": cfg.cpu_s,
                "RLIMIT_AS": cfg.memory_mb * 2**20,
                "RLIMIT_FSIZE": cfg.file_size_mb * 2**20,
                "RLIMIT_NPROC": cfg.max_processes,
                "RLIMIT_NOFILE": cfg.max_open_files,
                "RLIMIT_CORE": 0,
            }
        }
        workdir = tempfile.mkdtemp(prefix="rollstream-sandbox-")
        try:
            with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
                f.write(code)
            return await self._run_in(workdir, limits, clock)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    async def _run_in(self, workdir: str, limits: dict[str, Any], clock: Any) -> SandboxResult:
        cfg = self.config
        argv = [*(self._network_prefix or []), cfg.python, "-I", "-S", "-B", "-X", "utf8"]
        argv += ["-c", _BOOTSTRAP, json.dumps(limits)]
        start = clock()
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=workdir,
            env={"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8", "TMPDIR": workdir},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # own process group: one killpg reaches every descendant
        )
        out, err = bytearray(), bytearray()
        overflow = asyncio.Event()

        async def drain(stream: asyncio.StreamReader, buf: bytearray) -> None:
            while chunk := await stream.read(65536):
                buf += chunk[: cfg.max_output_bytes - len(buf)]
                if len(buf) >= cfg.max_output_bytes:
                    overflow.set()
                    return

        assert proc.stdout is not None and proc.stderr is not None
        drains = asyncio.gather(drain(proc.stdout, out), drain(proc.stderr, err))
        stop = asyncio.ensure_future(overflow.wait())
        timed_out = False
        try:
            async with asyncio.timeout(cfg.timeout_s):
                await asyncio.wait([drains, stop], return_when=asyncio.FIRST_COMPLETED)
                if not overflow.is_set():
                    await proc.wait()
        except TimeoutError:
            timed_out = True
        finally:
            _kill_group(proc.pid)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), timeout=5.0)
            for pending in (drains, stop):
                if not pending.done():
                    pending.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await pending
        return SandboxResult(
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
            exit_code=proc.returncode,
            timed_out=timed_out and not overflow.is_set(),
            truncated=overflow.is_set(),
            wall_s=clock() - start,
        )


def _kill_group(pgid: int) -> None:
    # The group may already be gone (normal exit); killing it regardless removes any straggler.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


@register_tool("python")
class PythonTool(Tool):
    """Runs a Python program in :class:`PythonSandbox`; its output (or failure) is the tool result."""

    description = "Run a Python program and return what it prints."
    parameters = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}

    def __init__(self, *, sandbox: PythonSandbox | None = None, config: SandboxConfig | None = None) -> None:
        if sandbox is not None and config is not None:
            raise ValueError("pass either sandbox or config, not both")
        self.sandbox = sandbox if sandbox is not None else PythonSandbox(config or SandboxConfig())

    async def __call__(self, arguments: dict[str, Any]) -> str:
        code = require_str_arg(arguments, "code", max_len=self.sandbox.config.max_code_chars)
        result = await self.sandbox.run(code)
        return result.as_text(self.sandbox.config.timeout_s)
