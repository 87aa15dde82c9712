"""The ``bwrap`` isolation backend (bubblewrap) and the seccomp filter it installs: every program in fresh
namespaces::

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
Because ``RLIMIT_NPROC`` is not enforced when the parent runs as root, ``max_processes == 1`` is also
enforced by the seccomp filter refusing ``fork``/``vfork``/``clone`` of processes (threads stay allowed).

The bootstrap, limits, output caps, wall clock and warm pool are :class:`.sandbox.LocalProcessBackend`'s; this
module says only how a worker starts and is reaped. It registers itself as ``bwrap`` in
:data:`.sandbox.ISOLATION_BACKENDS` (the default ``SandboxConfig.isolation``) when imported, which importing
:mod:`pipelines_lib.envs.tools` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import platform
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig

from pipelines_lib.envs.tools.sandbox import (
    REAP_DEADLINE_S,
    LocalProcessBackend,
    SandboxConfig,
    Worker,
    kill_group,
    register_isolation,
    wait_exit,
)

SANDBOX_UID = 65534
"""The unprivileged uid (and gid) programs run as inside the ``bwrap`` sandbox."""
WORK_DIR = "/tmp"
"""The program's working directory inside the ``bwrap`` sandbox (a private tmpfs)."""


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

    async def _spawn(self) -> Worker:
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
            info = await asyncio.wait_for(asyncio.to_thread(_read_all, info_r), timeout=REAP_DEADLINE_S)
        finally:
            os.close(info_r)
        # The namespace's init, opened as a pidfd while it is alive: killing it kills every process in the
        # namespace, and its exit is reported only once they are all gone.
        pidfd = None
        with contextlib.suppress(ValueError, ProcessLookupError, KeyError):
            pidfd = os.pidfd_open(int(json.loads(info)["child-pid"]))

        async def reap() -> None:
            kill_group(proc.pid)
            if pidfd is not None:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                await _wait_readable(pidfd)
                os.close(pidfd)
            await wait_exit(proc)

        return Worker(proc=proc, reap=reap)


@functools.cache
def _bwrap_failure(bwrap: str) -> str | None:
    """Whether bubblewrap can create the namespaces on this machine (a fact about the machine, probed once)."""
    probe = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
             "--ro-bind", "/", "/", "--proc", "/proc", "--uid", str(SANDBOX_UID), "--cap-drop", "ALL", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=REAP_DEADLINE_S, env={})
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
            await asyncio.wait_for(done, timeout=REAP_DEADLINE_S)
    finally:
        loop.remove_reader(fd)
