"""The ``bwrap`` isolation backend (bubblewrap): every program in fresh namespaces, never as host root::

    parent (rollout worker; root drops  sandbox (new user, pid, mount, ipc, uts, net (+cgroup) namespaces)
    to host_uid/host_gid before bwrap)
      PythonSandbox.run(code) ──stdin──►  pid 1: bwrap init (dies with the parent; killed at the deadline;
                                                 the program's rlimits, its memory masked)
        wall clock, output caps ◄─pipes──   pid 2: python -I -S -B  (uid 65534, no capabilities,
                                                    rlimits, seccomp filter (.seccomp), audit hook)
                                            /      read-only: /usr, /lib*, the interpreter and its stdlib
                                            /tmp   private tmpfs of work_dir_mb, the working directory
                                            /proc  its own (only the sandbox's processes); /proc/sys, irq,
                                                   bus, sysrq-trigger masked; /dev minimal

Nothing of the project, the virtualenv's site-packages or the parent's environment is visible; the
network namespace has only its own loopback; ``--new-session`` detaches the terminal. At the deadline
(or when output passes its cap) the parent kills the namespace's init, which takes every process in
the namespace with it, and waits until it is gone: no grandchild, ``setsid`` or double fork survives.

The sandbox's user maps to an unprivileged host uid: a root parent starts bwrap as ``host_uid``/``host_gid``
(:func:`host_credentials`). Host root would own ``/proc/sys`` and be exempt from ``RLIMIT_NPROC``; that uid owns
nothing and is counted, per sandbox (the kernel counts per user namespace), so ``max_processes`` binds. bwrap
resolves its bind sources as that uid, so the interpreter must be readable by it: this process's, else the
system's (:data:`SYSTEM_PYTHON`), probed once with a real sandbox. The init's limits are set by the bootstrap
(the same uid may; a root parent without ``CAP_SYS_RESOURCE`` may not).

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
import shutil
import signal
import subprocess
import sys
from typing import Any

from pipelines_lib.envs.tools.sandbox import (
    REAP_DEADLINE_S,
    LocalProcessBackend,
    SandboxConfig,
    Worker,
    kill_group,
    register_isolation,
    wait_exit,
)
from pipelines_lib.envs.tools.seccomp import seccomp_filter

SYSTEM_PYTHON = "/usr/bin/python3"
"""The interpreter the sandbox falls back to when the sandbox's uid cannot read this process's (one under a root-only
home folder, for instance)."""
SANDBOX_UID = 65534
"""The unprivileged uid (and gid) programs run as inside the ``bwrap`` sandbox."""
WORK_DIR = "/tmp"
"""The program's working directory inside the ``bwrap`` sandbox (a private tmpfs)."""


_INTERPRETER_QUERY = """import json, os, site, sys, sysconfig
libdir, soname = sysconfig.get_config_var("LIBDIR") or "", sysconfig.get_config_var("INSTSONAME") or ""
print(json.dumps({"exe": os.path.realpath(sys.executable), "stdlib": sysconfig.get_path("stdlib"),
                  "libpython": os.path.join(libdir, soname) if libdir and soname else "",
                  "site": [*site.getsitepackages(), sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]}))
"""
_SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/bin")
_PROC_MASKS = ("/proc/sys", "/proc/irq", "/proc/bus", "/proc/sysrq-trigger", "/proc/1/mem", "/proc/1/task/1/mem")
"""Host-global kernel settings and the memory of the sandbox's init: neither is the program's to write (an empty
read-only folder, or /dev/null without device access, is laid over each)."""


@functools.cache
def interpreter_binds(python: str) -> tuple[str, tuple[str, ...]]:
    """The resolved executable of ``python`` and the bwrap arguments giving it what it needs, read-only: its executable (symlinks resolved: a
    virtualenv's ``python`` points at a base interpreter), its shared library and its standard library, with its
    site-packages hidden under empty read-only folders. ``/usr`` and ``/lib*`` (the C library) are bound
    separately. The layout is asked of the interpreter itself (once), so any interpreter can serve."""
    done = subprocess.run([python, "-I", "-S", "-c", _INTERPRETER_QUERY], capture_output=True, text=True,
                          timeout=REAP_DEADLINE_S, env={}, check=True)
    layout = json.loads(done.stdout)
    stdlib = layout["stdlib"]
    args: list[str] = []
    for path in (layout["exe"], layout["libpython"], stdlib):
        if path and os.path.exists(path):
            args += ["--ro-bind", path, path]
    roots = (stdlib, *_SYSTEM_DIRS)
    for hidden in sorted(set(layout["site"])):
        if os.path.isdir(hidden) and any(hidden.startswith(r + os.sep) for r in roots):
            args += ["--tmpfs", hidden, "--remount-ro", hidden]
    return layout["exe"], tuple(args)


def host_credentials(config: SandboxConfig) -> dict[str, Any]:
    """``subprocess`` arguments that make a worker started by root run as ``config.host_uid``/``host_gid`` (no
    supplementary groups) before bwrap starts, so that the sandbox's uid maps to an unprivileged host uid; a
    parent that is not root already is one (empty)."""
    if os.geteuid() != 0:
        return {}
    return {"user": config.host_uid, "group": config.host_gid, "extra_groups": ()}


@register_isolation("bwrap")
class BwrapBackend(LocalProcessBackend):
    """Each program in its own bubblewrap sandbox (see the module docstring)."""

    has_init = True

    def __init__(self, config: SandboxConfig) -> None:
        super().__init__(config)
        self._bwrap = shutil.which("bwrap")
        self._seccomp = seccomp_filter()
        self._why_not: str | None = None
        if self._bwrap is None:
            self._why_not = ("the code sandbox needs bubblewrap (`bwrap`): install the system package `bubblewrap` "
                             "(Debian/Ubuntu: `apt-get install bubblewrap`; `make sysdeps` does it as root), or set "
                             "sandbox.isolation: none to run model code without isolation (unsafe)")
        else:
            self._why_not = self._choose_interpreter()

    def _choose_interpreter(self) -> str | None:
        """Pick the interpreter the sandbox's uid can start (``config.interpreter``, else this process's, else the
        system's ``python3``); the reason none can when none can."""
        cfg = self.config
        creds = host_credentials(cfg)
        failures = []
        for python in dict.fromkeys([cfg.interpreter] if cfg.interpreter else [sys.executable, SYSTEM_PYTHON]):
            failure = _bwrap_failure(self, python)
            if failure is None:
                self.python = python
                return None
            failures.append(f"{python}: {failure}")
        who = f"uid {creds['user']}/gid {creds['group']} (sandbox.host_uid/host_gid)" if creds else "this user"
        return (f"bubblewrap cannot start a sandbox here as {who} ({'; '.join(failures)}): allow unprivileged "
                "user namespaces (sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0; in a "
                "container, a seccomp/AppArmor profile permitting them), let that uid read an interpreter "
                "(sandbox.interpreter), or set sandbox.isolation: none (unsafe)")

    def unavailable(self) -> str | None:
        return self._why_not

    def _exit_code(self, returncode: int | None) -> int | None:
        # bwrap exits with the program's status, or 128 + N when a signal N ended the program (statuses 129-192
        # the program chose itself read as signals too; Python's own are 0-2 unless the code says otherwise).
        if returncode is not None and 128 < returncode <= 128 + 64:
            return -(returncode - 128)
        return returncode

    def argv(self, info_fd: int | None, seccomp_fd: int | None) -> list[str]:
        """The full command line of one worker."""
        exe, binds = interpreter_binds(self.python)
        return self.bwrap_args(binds, info_fd, seccomp_fd) + self._python_argv(exe)

    def bwrap_args(self, binds: tuple[str, ...], info_fd: int | None, seccomp_fd: int | None) -> list[str]:
        """bwrap and its options, up to the command it starts."""
        args = [self._bwrap or "bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
                "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
                "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--clearenv",
                "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", WORK_DIR, "--setenv", "TMPDIR", WORK_DIR,
                "--setenv", "LANG", "C.UTF-8", "--hostname", "sandbox"]
        for path in _SYSTEM_DIRS:
            if os.path.exists(path):
                args += ["--ro-bind", path, path]
        args += [*binds, "--proc", "/proc"]
        for path in _PROC_MASKS:
            if os.path.isdir(path):
                args += ["--tmpfs", path, "--remount-ro", path]
            elif os.path.exists(path):
                args += ["--ro-bind", os.devnull, path]
        args += ["--dev", "/dev", "--size", str(self.config.work_dir_mb * 2**20), "--tmpfs", WORK_DIR,
                 "--chdir", WORK_DIR, "--disable-userns",
                 # bwrap's root and /dev are tmpfs too: read-only, so the work dir is the only writable memory.
                 "--remount-ro", "/dev", "--remount-ro", "/"]
        if info_fd is not None:
            args += ["--info-fd", str(info_fd)]
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        return args

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
                stderr=asyncio.subprocess.PIPE, pass_fds=fds, env={}, start_new_session=True,
                **host_credentials(self.config))
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


def _bwrap_failure(backend: BwrapBackend, python: str) -> str | None:
    """Why ``backend`` cannot start ``python`` on this machine, or None when it can (probed once per machine)."""
    try:
        exe, binds = interpreter_binds(python)
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        return f"not a working interpreter ({type(e).__name__}: {e})"
    return _probe(tuple(backend.bwrap_args(binds, None, None)), exe,
                  tuple(sorted(host_credentials(backend.config).items())))


@functools.cache
def _probe(sandbox: tuple[str, ...], exe: str, credentials: tuple[tuple[str, Any], ...]) -> str | None:
    try:
        done = subprocess.run([*sandbox, exe, "-I", "-S", "-c", ""], capture_output=True, text=True,
                              timeout=REAP_DEADLINE_S, env={}, **dict(credentials))
    except (OSError, subprocess.SubprocessError) as e:
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
