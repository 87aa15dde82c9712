"""Sandboxed Python: run untrusted model code in a throw-away, OS-isolated process.

Containment comes from the kernel, not from the interpreter. The default isolation backend,
``bwrap`` (bubblewrap), starts every program in fresh namespaces::

    parent (rollout worker)            sandbox (new user, pid, mount, ipc, uts, net (+cgroup) namespaces)
      PythonSandbox.run(code) ──stdin──►  pid 1: bwrap init (dies with the parent; killed at the deadline)
        wall clock, output caps ◄─pipes──   pid 2: python -I -S -B  (uid 65534, no capabilities,
                                                    rlimits, seccomp filter, audit hook)
                                            /      read-only: /usr, /lib*, the interpreter and its stdlib
                                            /tmp   private tmpfs of work_dir_mb, the working directory
                                            /proc  its own (only the sandbox's processes), /dev minimal

Nothing of the project, the virtualenv's site-packages or the parent's environment is visible; the
network namespace has only its own loopback; ``--new-session`` detaches the terminal. At the deadline
(or when output passes its cap) the parent kills the namespace's init, which takes every process in
the namespace with it, and waits until it is gone: no grandchild, ``setsid`` or double fork survives.
Kernel limits stay as before: ``RLIMIT_CPU``/``AS``/``FSIZE``/``NOFILE``/``NPROC``/``CORE``; because
``RLIMIT_NPROC`` is not enforced when the parent runs as root, ``max_processes == 1`` is also enforced
by a seccomp filter refusing ``fork``/``vfork``/``clone`` of processes (threads stay allowed).

The PEP 578 audit hook the program starts under (refusing sockets, processes, files outside the
working directory, ...) is an extra layer that gives clear error messages; nothing depends on it:
code can disable it, and the namespaces still hold.

**Backends** are registered in :data:`ISOLATION_BACKENDS` and chosen by ``SandboxConfig.isolation``:
``bwrap`` (default) and ``none`` (a plain child process: unsafe, for machines where no isolation can
be installed; every start logs a warning). A remote service (a pool of gVisor pods, see
``infra/README.md``) plugs in as another :class:`SandboxBackend`. When the configured backend is not
available, :class:`PythonSandbox` refuses to start with :class:`SandboxUnavailable` naming what to
install.

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
import functools
import json
import logging
import os
import platform
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from pipelines_lib.envs.base import InfraError, Tool, require_str_arg
from pipelines_lib.envs.registry import register_tool
from pipelines_lib.registry import registering

log = logging.getLogger(__name__)

SANDBOX_UID = 65534
"""The unprivileged uid (and gid) programs run as inside the ``bwrap`` sandbox."""
WORK_DIR = "/tmp"
"""The program's working directory inside the ``bwrap`` sandbox (a private tmpfs)."""


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
    """RLIMIT_NPROC; 1 also installs a seccomp filter refusing new processes (``bwrap``), since Linux does not
    enforce RLIMIT_NPROC for root."""
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
    warm_pool: int = 8
    """Started workers kept waiting inside ``async with sandbox:`` (0: start each worker on demand). Each runs
    one program only."""
    max_starting: int = 4
    """Workers being started at once (more calls wait for one): parallel namespace creation contends in the
    kernel."""

    def __post_init__(self) -> None:
        if not self.timeout_s > 0 or self.timeout_s == float("inf"):
            raise ValueError(f"timeout_s must be finite and > 0, got {self.timeout_s}")
        for f in ("cpu_s", "memory_mb", "file_size_mb", "max_processes", "max_open_files", "work_dir_mb"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1, got {getattr(self, f)}")
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


# Runs in the worker as `python -I -S -B -c _BOOTSTRAP RLIMIT_X=n ...` from inside the working directory (it
# imports nothing beyond what the interpreter already loaded: json or traceback would double its start-up CPU):
# limits first, then it waits for the program on stdin (a warm worker waits here), writes it to main.py
# (for tracebacks), installs the audit hook (an extra layer with clear messages, not the boundary) and runs
# the program in a fresh namespace with the bootstrap's own traceback frame hidden.
_BOOTSTRAP = r"""
import os, resource, sys
for limit in sys.argv[1:]:
    name, value = limit.split("=")
    value = int(value)
    hard = value + 1 if name == "RLIMIT_CPU" else value
    resource.setrlimit(getattr(resource, name), (value, hard))
SOURCE = sys.stdin.buffer.read().decode("utf-8")
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
os.close(null)
WORK = os.path.realpath(os.getcwd())
STDLIB = os.path.realpath(os.path.dirname(os.__file__))
with open("main.py", "w", encoding="utf-8") as f:
    f.write(SOURCE)
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
    frozenset({"ctypes", "_ctypes", "_posixsubprocess"}),
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
    import traceback
    traceback.print_exception(type(e), e, e.__traceback__.tb_next)
    sys.exit(1)
"""


# --- seccomp: no debugging of other processes, and (max_processes == 1) no new processes, whoever the parent is --
# A classic BPF program over struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]} (little endian).
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_SYSCALLS = {
    "x86_64": {"ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "keyctl": 250, "add_key": 248,
               "request_key": 249, "fork": 57, "vfork": 58, "clone": 56, "clone3": 435},
    "aarch64": {"ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "keyctl": 219, "add_key": 217,
                "request_key": 218, "clone": 220, "clone3": 435},
}
_ALWAYS_DENIED = ("ptrace", "process_vm_readv", "process_vm_writev", "keyctl", "add_key", "request_key")
_CLONE_THREAD = 0x00010000
_RET_ALLOW, _RET_KILL = 0x7FFF0000, 0x80000000
_RET_EPERM, _RET_EAGAIN, _RET_ENOSYS = 0x00050000 | 1, 0x00050000 | 11, 0x00050000 | 38


def seccomp_filter(*, allow_processes: bool, machine: str = platform.machine()) -> bytes | None:
    """The seccomp program bwrap installs before the interpreter starts. Always: ``ptrace``,
    ``process_vm_readv/writev`` (reading or steering the sandbox's init) and the kernel keyring calls fail with
    EPERM; syscalls of another ABI (x32 included) kill the process. Unless ``allow_processes``: ``fork``/``vfork``
    and ``clone`` without ``CLONE_THREAD`` fail with EAGAIN (threads still start), ``clone3`` with ENOSYS (libc
    then falls back to ``clone``). None on an architecture not listed (bwrap then runs without a filter)."""
    if machine not in _AUDIT_ARCH:
        return None
    nrs = _SYSCALLS[machine]
    rules = [(nrs[n], "eperm") for n in _ALWAYS_DENIED]
    if not allow_processes:
        rules += [(nrs[n], "eagain") for n in ("fork", "vfork") if n in nrs] + [(nrs["clone3"], "enosys")]

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("<HBBI", code, jt, jf, k)

    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    clone_check = 0 if allow_processes else 3  # jeq clone, load flags, jset CLONE_THREAD
    body = 4 + len(rules) + clone_check  # instructions before the return block
    target = {"allow": body, "eperm": body + 1, "eagain": body + 2, "enosys": body + 3, "kill": body + 4}

    def jump(pc: int, to: str) -> int:
        return target[to] - pc - 1

    prog = [op(ld, 4), op(jeq, _AUDIT_ARCH[machine], 0, jump(1, "kill")), op(ld, 0),
            op(jge, 0x40000000, jump(3, "kill"), 0)]
    for nr, outcome in rules:
        prog.append(op(jeq, nr, jump(len(prog), outcome), 0))
    if not allow_processes:
        prog.append(op(jeq, nrs["clone"], 0, jump(len(prog), "allow")))
        prog.append(op(ld, 16))  # args[0] (the flags), low 32 bits
        prog.append(op(jset, _CLONE_THREAD, jump(len(prog), "allow"), jump(len(prog), "eagain")))
    assert len(prog) == body
    prog += [op(ret, r) for r in (_RET_ALLOW, _RET_EPERM, _RET_EAGAIN, _RET_ENOSYS, _RET_KILL)]
    return b"".join(prog)


# --- local workers ---------------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class _Worker:
    """A started sandbox waiting for its program on stdin."""

    proc: asyncio.subprocess.Process
    reap: Callable[[], Any]
    """Kills everything the worker started and waits until it is gone (a coroutine function)."""


class LocalProcessBackend:
    """Shared machinery of backends that run the interpreter as a child process: the bootstrap and its limits,
    output caps, the wall clock, and the warm pool. Subclasses say how the child is started (:meth:`_spawn`)."""

    name: ClassVar[str]

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self._ready: collections.deque[_Worker] = collections.deque()
        self._starting: set[asyncio.Task[None]] = set()
        self._pooled = False
        self._starts: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    def unavailable(self) -> str | None:
        return None

    def _python_argv(self) -> list[str]:
        cfg = self.config
        limits = {"RLIMIT_CPU": cfg.cpu_s, "RLIMIT_AS": cfg.memory_mb * 2**20, "RLIMIT_FSIZE": cfg.file_size_mb * 2**20,
                  "RLIMIT_NPROC": cfg.max_processes, "RLIMIT_NOFILE": cfg.max_open_files, "RLIMIT_CORE": 0}
        # This process's interpreter (its standard library is what the sandbox binds), by its resolved path:
        # inside a sandbox a virtualenv's `python` symlink would point nowhere.
        return [os.path.realpath(sys.executable), "-I", "-S", "-B", "-X", "utf8", "-c", _BOOTSTRAP, *(f"{k}={v}" for k, v in limits.items())]

    async def _spawn(self) -> _Worker:
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

    async def _started(self) -> _Worker:
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


_REAP_DEADLINE_S = 10.0


async def _wait_exit(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), timeout=_REAP_DEADLINE_S)


def _kill_group(pgid: int) -> None:
    # The group may already be gone (normal exit); killing it regardless removes any straggler.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _interpreter_binds(python: str) -> list[str]:
    """What the interpreter needs, read-only: its executable (symlinks resolved: a virtualenv's ``python`` points
    at a base interpreter), its shared library and its standard library; site-packages hidden under an empty
    tmpfs. ``/usr`` and ``/lib*`` (the C library) are bound separately."""
    exe = os.path.realpath(python)
    stdlib = sysconfig.get_path("stdlib")
    binds = [exe]
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    ldlib = sysconfig.get_config_var("INSTSONAME") or ""
    if libdir and ldlib and os.path.exists(os.path.join(libdir, ldlib)):
        binds.append(os.path.join(libdir, ldlib))
    binds.append(stdlib)
    args: list[str] = []
    for path in binds:
        args += ["--ro-bind", path, path]
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    for hidden in sorted({sysconfig.get_path("purelib", vars=base), sysconfig.get_path("platlib", vars=base)}):
        if hidden.startswith(stdlib + os.sep) and os.path.isdir(hidden):
            args += ["--tmpfs", hidden]
    return args


@register_isolation("bwrap")
class BwrapBackend(LocalProcessBackend):
    """Each program in its own bubblewrap sandbox (see the module docstring)."""

    def __init__(self, config: SandboxConfig) -> None:
        super().__init__(config)
        self._bwrap = shutil.which("bwrap")
        self._seccomp = seccomp_filter(allow_processes=config.max_processes > 1)

    def unavailable(self) -> str | None:
        if self._bwrap is None:
            return ("the code sandbox needs bubblewrap (`bwrap`): install the system package `bubblewrap` "
                    "(Debian/Ubuntu: `apt-get install bubblewrap`; `make sysdeps` does it as root), or set "
                    "sandbox.isolation: none to run model code without isolation (unsafe)")
        failure = _bwrap_failure(self._bwrap)
        if failure is not None:
            return (f"bubblewrap cannot create namespaces here ({failure}): allow unprivileged user namespaces "
                    "(sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0; in a container, "
                    "a seccomp/AppArmor profile permitting them), or set sandbox.isolation: none (unsafe)")
        return None

    def _exit_code(self, returncode: int | None) -> int | None:
        # bwrap exits with the program's status, or 128 + N when a signal N ended the program (statuses 129-192
        # the program chose itself read as signals too; Python's own are 0-2 unless the code says otherwise).
        if returncode is not None and 128 < returncode <= 128 + 64:
            return -(returncode - 128)
        return returncode

    def argv(self, info_fd: int, seccomp_fd: int | None) -> list[str]:
        """The full command line of one worker."""
        args = [self._bwrap or "bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
                "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
                "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--clearenv",
                "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", WORK_DIR, "--setenv", "TMPDIR", WORK_DIR,
                "--setenv", "LANG", "C.UTF-8", "--hostname", "sandbox"]
        for path in ("/usr", "/lib", "/lib64", "/lib32", "/bin"):
            if os.path.exists(path):
                args += ["--ro-bind", path, path]
        args += _interpreter_binds(sys.executable)
        args += ["--proc", "/proc", "--dev", "/dev", "--size", str(self.config.work_dir_mb * 2**20), "--tmpfs", WORK_DIR,
                 "--chdir", WORK_DIR, "--disable-userns",
                 # bwrap's root and /dev are tmpfs too: read-only, so the work dir is the only writable memory.
                 "--remount-ro", "/dev", "--remount-ro", "/",
                 "--info-fd", str(info_fd)]
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        return args + self._python_argv()

    async def _spawn(self) -> _Worker:
        info_r, info_w = os.pipe()
        seccomp_fd = None
        fds = [info_w]
        try:
            if self._seccomp is not None:
                seccomp_fd = os.memfd_create("rollstream-seccomp")
                os.write(seccomp_fd, self._seccomp)
                os.lseek(seccomp_fd, 0, os.SEEK_SET)
                fds.append(seccomp_fd)
            proc = await asyncio.create_subprocess_exec(
                *self.argv(info_w, seccomp_fd), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, pass_fds=fds, env={}, start_new_session=True)
        finally:
            for fd in fds:
                os.close(fd)
        try:
            info = await asyncio.wait_for(asyncio.to_thread(_read_all, info_r), timeout=_REAP_DEADLINE_S)
        finally:
            os.close(info_r)
        # The namespace's init, opened as a pidfd while it is alive: killing it kills every process in the
        # namespace, and its exit is reported only once they are all gone.
        pidfd = None
        with contextlib.suppress(ValueError, ProcessLookupError, KeyError):
            pidfd = os.pidfd_open(int(json.loads(info)["child-pid"]))

        async def reap() -> None:
            _kill_group(proc.pid)
            if pidfd is not None:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                await _wait_readable(pidfd)
                os.close(pidfd)
            await _wait_exit(proc)

        return _Worker(proc=proc, reap=reap)


@functools.cache
def _bwrap_failure(bwrap: str) -> str | None:
    """Whether bubblewrap can create the namespaces on this machine (a fact about the machine, probed once)."""
    probe = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
             "--ro-bind", "/", "/", "--proc", "/proc", "--uid", str(SANDBOX_UID), "--cap-drop", "ALL", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=_REAP_DEADLINE_S, env={})
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{type(e).__name__}: {e}"
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit status {done.returncode}")


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks)


async def _wait_readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(fd, lambda: done.done() or done.set_result(None))
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done, timeout=_REAP_DEADLINE_S)
    finally:
        loop.remove_reader(fd)


@register_isolation("none")
class UnisolatedBackend(LocalProcessBackend):
    """A plain child process in a fresh temporary folder, with the rlimits and the audit hook only. UNSAFE: code
    that disables the hook reaches the parent's files, processes and network."""

    async def _spawn(self) -> _Worker:
        workdir = tempfile.mkdtemp(prefix="rollstream-sandbox-")
        proc = await asyncio.create_subprocess_exec(
            *self._python_argv(), cwd=workdir, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True,
            env={"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8", "TMPDIR": workdir})

        async def reap() -> None:
            _kill_group(proc.pid)
            await _wait_exit(proc)
            shutil.rmtree(workdir, ignore_errors=True)

        return _Worker(proc=proc, reap=reap)


class PythonSandbox:
    """Runs programs under :class:`SandboxConfig`; safe to share between concurrent episodes.

    ``async with sandbox:`` keeps a warm pool of started workers for many calls; without it each call starts
    its own. Raises :class:`SandboxUnavailable` when the configured isolation cannot run here.
    """

    def __init__(self, config: SandboxConfig = SandboxConfig()) -> None:
        self.config = config
        self.backend: SandboxBackend = ISOLATION_BACKENDS[config.isolation](config)
        reason = self.backend.unavailable()
        if reason is not None:
            raise SandboxUnavailable(reason)
        if config.isolation == "none":
            log.warning("code sandbox started with isolation 'none': model-written code runs WITHOUT OS isolation "
                        "(files, processes and network of this machine are reachable); install bubblewrap")

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
        return await self.backend.run(code)


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
