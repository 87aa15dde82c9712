"""Sandboxed Python: run untrusted model code in a throw-away, OS-isolated process.

Containment comes from the kernel, not from the interpreter: the default isolation backend, ``bwrap``
(bubblewrap, in :mod:`.bwrap` with its seccomp filter), starts every program in fresh namespaces as an
unprivileged user that sees only the interpreter and its standard library, and kills the whole namespace at
the deadline. This module holds what every backend shares::

    PythonTool ─► PythonSandbox ─► ISOLATION_BACKENDS[config.isolation]
                  (SandboxConfig)    ├─ BwrapBackend        (.bwrap: namespaces, seccomp)  ─┐
                                     └─ UnisolatedBackend   (here: a plain child process)  ─┴─► LocalProcessBackend
                                                                   (bootstrap, rlimits, output caps, wall clock, warm pool)

Kernel limits: ``RLIMIT_CPU``/``AS``/``FSIZE``/``NOFILE``/``NPROC``/``CORE``, set by the bootstrap
(:mod:`.bootstrap`) before the program is read, on the sandbox's init too where it has one. The PEP 578 audit hook the program starts under (refusing sockets, processes, files outside
the working directory, ...) is an extra layer that gives clear error messages; nothing depends on it: code
can disable it, and the namespaces still hold.

**Backends** are registered in :data:`ISOLATION_BACKENDS` and chosen by ``SandboxConfig.isolation``:
``bwrap`` (default) and ``none`` (a plain child process: unsafe, for machines where no isolation can
be installed; every start logs a warning). Importing :mod:`pipelines_lib.envs.tools` registers both (the
package imports :mod:`.bwrap`, which imports this module: the arrow points one way). A remote service (a pool
of gVisor pods, see ``infra/README.md``) plugs in as another :class:`SandboxBackend`. When the configured
backend is not available, :class:`PythonSandbox` refuses to start with :class:`SandboxUnavailable` naming
what to install.

**Warm pool.** Starting namespaces and an interpreter costs tens of milliseconds of wall time. Inside
``async with sandbox:`` the sandbox keeps ``warm_pool`` started workers waiting on their stdin for a
program; a call takes one, and a replacement starts in the background. A worker runs exactly one
program and is then killed, so nothing (files, processes, memory, IPC objects) survives from one call
to the next: isolation between calls is the same as for cold starts, only the start is off the
critical path. Outside ``async with`` every call starts its own worker.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from pipelines_lib.envs.base import InfraError, Tool, require_str_arg
from pipelines_lib.envs.registry import register_tool
from pipelines_lib.envs.tools.bootstrap import BOOTSTRAP
from pipelines_lib.registry import registering

log = logging.getLogger(__name__)

class SandboxUnavailable(RuntimeError):
    """The configured isolation backend cannot run on this machine (the message says what to install)."""


class SandboxBackend(Protocol):
    """Where programs run. ``run`` never raises for anything the program does."""

    name: ClassVar[str]

    def unavailable(self) -> str | None:
        """Why this backend cannot run here (with what to install), or None when it can."""

    async def run(self, code: str) -> SandboxResult: ...

    async def start(self) -> None:
        """Get ready for many calls (the local backends fill their warm pool)."""

    async def aclose(self) -> None:
        """Stop everything :meth:`start` started."""


ISOLATION_BACKENDS: dict[str, Callable[[SandboxConfig], SandboxBackend]] = {}


def register_isolation(name: str) -> Callable[[type[Any]], type[Any]]:
    """Class decorator: ``@register_isolation("bwrap")`` makes the backend selectable by ``SandboxConfig.isolation``."""
    return registering(ISOLATION_BACKENDS, "isolation backend", name, set_name=True)


@dataclass(frozen=True, kw_only=True)
class SandboxConfig:
    """Limits and isolation of one sandboxed run."""

    timeout_s: float = 5.0
    """Wall-clock limit; the sandbox (its whole pid namespace with ``bwrap``) is killed when it passes."""
    cpu_s: int = 5
    """RLIMIT_CPU in seconds (SIGXCPU, then SIGKILL one second later)."""
    memory_mb: int = 512
    """RLIMIT_AS (virtual memory) in MiB."""
    file_size_mb: int = 8
    """RLIMIT_FSIZE: largest file the code may write, in MiB (past it the write fails with EFBIG: Python ignores
    SIGXFSZ)."""
    max_processes: int = 1
    """Tasks the program may run at once, itself and its threads included (RLIMIT_NPROC, which Linux counts per
    uid of the sandbox's user namespace under ``bwrap``: each sandbox has its own count); 1: no threads, no
    processes. It binds because the sandbox never runs as host root (``host_uid``)."""
    max_open_files: int = 64
    """RLIMIT_NOFILE."""
    max_output_bytes: int = 16_384
    """Bytes kept per stream (stdout, stderr); more stops the program and marks the result truncated."""
    max_code_chars: int = 50_000
    """Longest accepted program."""
    work_dir_mb: int = 64
    """Size of the private tmpfs holding the working directory (``bwrap``): bounds what many files can take, in
    memory, together."""
    isolation: str = "bwrap"
    """Isolation backend (a key of ``ISOLATION_BACKENDS``): ``bwrap`` runs each program in fresh namespaces
    (needs the ``bubblewrap`` system package); ``none`` runs a plain child process with only the rlimits and
    the audit hook: UNSAFE against hostile code, logs a warning on every start."""
    host_uid: int = 65534
    """Host uid (``bwrap``) workers run as when the rollout runs as root: set before bubblewrap starts, so the
    sandbox's user maps to this unprivileged uid (not to root, who owns ``/proc/sys`` and is exempt from
    RLIMIT_NPROC). 65534 is ``nobody``; a parent that is not root runs workers as itself."""
    host_gid: int = 65534
    """Host gid of the workers when the rollout runs as root (no supplementary groups)."""
    interpreter: str = ""
    """Python the sandbox runs (``bwrap``); empty: this process's interpreter when ``host_uid`` can read it, else
    the system's ``/usr/bin/python3`` (only its standard library is visible either way)."""
    warm_pool: int = 8
    """Started workers kept waiting inside ``async with sandbox:`` (0: start each worker on demand). Each runs
    one program only."""
    max_starting: int = 4
    """Workers being started at once (more calls wait for one): parallel namespace creation contends in the
    kernel."""

    def __post_init__(self) -> None:
        if not self.timeout_s > 0 or self.timeout_s == float("inf"):
            raise ValueError(f"timeout_s must be finite and > 0, got {self.timeout_s}")
        for f in ("cpu_s", "memory_mb", "file_size_mb", "max_processes", "max_open_files", "work_dir_mb", "host_uid",
                  "host_gid"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1, got {getattr(self, f)}")  # host uid/gid 0 would be root
        if self.max_output_bytes < 1:
            raise ValueError(f"max_output_bytes must be >= 1, got {self.max_output_bytes}")
        if self.max_code_chars < 1:
            raise ValueError(f"max_code_chars must be >= 1, got {self.max_code_chars}")
        if self.warm_pool < 0:
            raise ValueError(f"warm_pool must be >= 0, got {self.warm_pool}")
        if self.max_starting < 1:
            raise ValueError(f"max_starting must be >= 1, got {self.max_starting}")
        if self.isolation not in ISOLATION_BACKENDS:
            raise ValueError(f"unknown isolation {self.isolation!r}; valid: {', '.join(sorted(ISOLATION_BACKENDS))}")

    @classmethod
    def tiny(cls) -> SandboxConfig:
        """Tight limits for tests and CPU demos."""
        return cls(timeout_s=3.0, cpu_s=3, memory_mb=256, max_output_bytes=4096, warm_pool=2)


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


# --- local workers ---------------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class Worker:
    """A started sandbox waiting for its program on stdin."""

    proc: asyncio.subprocess.Process
    reap: Callable[[], Any]
    """Kills everything the worker started and waits until it is gone (a coroutine function)."""


class LocalProcessBackend:
    """Shared machinery of backends that run the interpreter as a child process: the bootstrap and its limits,
    output caps, the wall clock, and the warm pool. Subclasses say how the child is started (:meth:`_spawn`)."""

    name: ClassVar[str]
    has_init: ClassVar[bool] = False
    """Whether the program's pid 1 is the sandbox's own init, which the bootstrap gives the program's limits."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.python = os.path.realpath(sys.executable)
        """The interpreter workers run (a backend may pick another the sandbox can reach)."""
        self._ready: collections.deque[Worker] = collections.deque()
        self._starting: set[asyncio.Task[None]] = set()
        self._pooled = False
        self._starts: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    def unavailable(self) -> str | None:
        return None

    def limits(self) -> dict[str, tuple[int, int]]:
        """The kernel limits of a worker (``resource`` names: soft, hard), as the bootstrap sets them."""
        cfg = self.config
        # RLIMIT_NPROC counts the tasks of the uid (in the sandbox's user namespace, with bwrap), threads
        # included; the sandbox's init is one of them, so the program may have max_processes, itself included.
        # The CPU limit's hard value a second later kills a program that ignores the soft limit's SIGXCPU.
        soft = {"RLIMIT_CPU": cfg.cpu_s, "RLIMIT_AS": cfg.memory_mb * 2**20, "RLIMIT_FSIZE": cfg.file_size_mb * 2**20,
                "RLIMIT_NPROC": cfg.max_processes + self.has_init, "RLIMIT_NOFILE": cfg.max_open_files, "RLIMIT_CORE": 0}
        return {name: (value, value + 1 if name == "RLIMIT_CPU" else value) for name, value in soft.items()}

    def _python_argv(self, exe: str) -> list[str]:
        """The interpreter ``exe`` (by its resolved path: inside a sandbox a virtualenv's ``python`` symlink would
        point nowhere) running the bootstrap."""
        return [exe, "-I", "-S", "-B", "-X", "utf8", "-c", BOOTSTRAP, "pid1" if self.has_init else "self",
                *(f"{k}={soft}:{hard}" for k, (soft, hard) in self.limits().items())]

    async def _spawn(self) -> Worker:
        raise NotImplementedError

    def _exit_code(self, returncode: int | None) -> int | None:
        """The program's exit status from the worker process's."""
        return returncode

    async def start(self) -> None:
        self._pooled = True
        self._refill()

    async def aclose(self) -> None:
        self._pooled = False
        if self._starting:
            await asyncio.gather(*self._starting, return_exceptions=True)
        while self._ready:
            await self._ready.popleft().reap()

    def _refill(self) -> None:
        while self._pooled and len(self._ready) + len(self._starting) < self.config.warm_pool:
            task = asyncio.ensure_future(self._start_one())
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def _started(self) -> Worker:
        """A new worker, with at most ``max_starting`` being started at once: namespace creation and teardown
        contend in the kernel, so a burst of calls starting 96 sandboxes together is slower than queueing them."""
        loop = asyncio.get_running_loop()
        if self._starts is None or self._starts[0] is not loop:  # asyncio primitives belong to one loop
            self._starts = (loop, asyncio.Semaphore(self.config.max_starting))
        async with self._starts[1]:
            return await self._spawn()

    async def _start_one(self) -> None:
        worker = await self._started()
        if self._pooled:
            self._ready.append(worker)
        else:
            await worker.reap()

    async def run(self, code: str, *, clock: Callable[[], float] = time.perf_counter) -> SandboxResult:
        try:
            worker = self._ready.popleft() if self._ready else await self._started()
        except OSError as e:  # no process, no namespace, no pipe: the machine's fault, not the program's
            raise InfraError(f"sandbox could not start: {type(e).__name__}: {e}") from e
        self._refill()
        cfg = self.config
        proc = worker.proc
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        out, err = bytearray(), bytearray()
        overflow = asyncio.Event()

        async def drain(stream: asyncio.StreamReader, buf: bytearray) -> None:
            while chunk := await stream.read(65536):
                buf += chunk[: cfg.max_output_bytes - len(buf)]
                if len(buf) >= cfg.max_output_bytes:
                    overflow.set()
                    return

        start = clock()
        drains = asyncio.gather(drain(proc.stdout, out), drain(proc.stderr, err))
        stop = asyncio.ensure_future(overflow.wait())
        timed_out = False
        try:
            async with asyncio.timeout(cfg.timeout_s):
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a worker that died early
                    proc.stdin.write(code.encode("utf-8"))
                    await proc.stdin.drain()
                    proc.stdin.close()
                await asyncio.wait([drains, stop], return_when=asyncio.FIRST_COMPLETED)
                if not overflow.is_set():
                    await proc.wait()
        except TimeoutError:
            timed_out = True
        finally:
            await worker.reap()
            for pending in (drains, stop):
                if not pending.done():
                    pending.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await pending
        return SandboxResult(
            stdout=out.decode("utf-8", errors="replace"), stderr=err.decode("utf-8", errors="replace"),
            exit_code=self._exit_code(proc.returncode), timed_out=timed_out and not overflow.is_set(),
            truncated=overflow.is_set(), wall_s=clock() - start)


REAP_DEADLINE_S = 10.0
"""How long a backend waits for a killed worker to be gone before giving up on it."""


async def wait_exit(proc: asyncio.subprocess.Process) -> None:
    """Wait (up to ``REAP_DEADLINE_S``) for a killed worker process to exit."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), timeout=REAP_DEADLINE_S)


def kill_group(pgid: int) -> None:
    """SIGKILL a worker's process group."""
    # The group may already be gone (normal exit); killing it regardless removes any straggler.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


@register_isolation("none")
class UnisolatedBackend(LocalProcessBackend):
    """A plain child process in a fresh temporary folder, with the rlimits and the audit hook only. UNSAFE: code
    that disables the hook reaches the parent's files, processes and network."""

    async def _spawn(self) -> Worker:
        workdir = tempfile.mkdtemp(prefix="rollstream-sandbox-")
        proc = await asyncio.create_subprocess_exec(
            *self._python_argv(self.python), cwd=workdir, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True,
            env={"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8", "TMPDIR": workdir})

        async def reap() -> None:
            kill_group(proc.pid)
            await wait_exit(proc)
            shutil.rmtree(workdir, ignore_errors=True)

        return Worker(proc=proc, reap=reap)


class PythonSandbox:
    """Runs programs under :class:`SandboxConfig`; safe to share between concurrent episodes.

    ``async with sandbox:`` keeps a warm pool of started workers for many calls; without it each call starts
    its own. Raises :class:`SandboxUnavailable` when the configured isolation cannot run here.
    """

    def __init__(self, config: SandboxConfig | None = None) -> None:
        # The default is built per call, not at import: the ``bwrap`` backend it names registers after this module.
        self.config = config = config or SandboxConfig()
        self.backend: SandboxBackend = ISOLATION_BACKENDS[config.isolation](config)
        reason = self.backend.unavailable()
        if reason is not None:
            raise SandboxUnavailable(reason)
        if config.isolation == "none":
            log.warning("code sandbox started with isolation 'none': model-written code runs WITHOUT OS isolation "
                        "(files, processes and network of this machine are reachable); isolation 'bwrap' (bubblewrap) "
                        "contains it")

    @property
    def isolation(self) -> str:
        """The backend in use (``bwrap``, ``none``, ...)."""
        return self.backend.name

    async def __aenter__(self) -> PythonSandbox:
        await self.backend.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.backend.aclose()

    async def run(self, code: str) -> SandboxResult:
        """Run ``code`` as a program; never raises for anything the program does."""
        if len(code) > self.config.max_code_chars:
            raise ValueError(f"program too long ({len(code)} > {self.config.max_code_chars} characters)")
        try:
            code.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate (a JSON "\ud800" escape) is no source text: the program's
            # error, reported as Python reports an undecodable source file.
            return SandboxResult(stdout="", stderr=f"SyntaxError: (unicode error) {e}\n", exit_code=1,
                                 timed_out=False, truncated=False, wall_s=0.0)
        return await self.backend.run(code)


@register_tool("python")
class PythonTool(Tool):
    """Runs a Python program in :class:`PythonSandbox`; its output (or failure) is the tool result."""

    description = "Run a Python program and return what it prints."
    parameters = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}

    def __init__(self, *, sandbox: PythonSandbox | None = None, config: SandboxConfig | None = None) -> None:
        if sandbox is not None and config is not None:
            raise ValueError("pass either sandbox or config, not both")
        self._sandbox = sandbox
        self._config = config or SandboxConfig()

    @property
    def sandbox(self) -> PythonSandbox:
        """The sandbox the tool runs programs in, built at first use (an env built for its texts or tasks alone,
        as the tokenizer's corpus builds every env, needs no working sandbox on its machine)."""
        if self._sandbox is None:
            self._sandbox = PythonSandbox(self._config)
        return self._sandbox

    async def __call__(self, arguments: dict[str, Any]) -> str:
        code = require_str_arg(arguments, "code", max_len=self.sandbox.config.max_code_chars)
        result = await self.sandbox.run(code)
        return result.as_text(self.sandbox.config.timeout_s)
