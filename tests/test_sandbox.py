"""The Python sandbox, with real bubblewrap sandboxes: isolation, limits, output handling, cleanup, the warm pool.

Attacks on the mechanism itself (a neutralised audit hook) are in the escape catalogue
(tests/test_sandbox_escapes.py); here the same neutraliser shows each OS guarantee holding on its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import os
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from drills.sandbox_escapes import DISABLE_AUDIT_HOOK, MARKER, loopback_listener
from pipelines_lib.envs import ToolError, make_tool, run_tool
from pipelines_lib.envs.tools.bwrap import SANDBOX_UID, SYSTEM_PYTHON
from pipelines_lib.envs.tools.sandbox import (
    ISOLATION_BACKENDS,
    PythonSandbox,
    SandboxConfig,
    SandboxResult,
    SandboxUnavailable,
)
from pipelines_lib.envs.tools.seccomp import DENIED_SYSCALLS, seccomp_filter

FAST = SandboxConfig(timeout_s=3.0, cpu_s=3, memory_mb=256, max_output_bytes=4096)
UNSAFE = dataclasses.replace(FAST, isolation="none")
HOOK_OFF = DISABLE_AUDIT_HOOK.replace("{{", "{").replace("}}", "}")  # the catalogue's template, formatted


def run(code: str, config: SandboxConfig = FAST) -> SandboxResult:
    return asyncio.run(PythonSandbox(config).run(code))


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """Every test ends with no process it started still alive (children of this process, or anything carrying
    the catalogue's marker, wherever it was reparented)."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    after = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    after += [p for p in psutil.process_iter(["cmdline"]) if MARKER in (p.info["cmdline"] or [""])[0]]
    assert after == []


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


@pytest.mark.parametrize("hook", ["on", "off"])
def test_no_connection_reaches_a_local_server(hook: str, tcp_server: tuple[int, list[int]]) -> None:
    port, accepted = tcp_server
    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')"
    result = run((HOOK_OFF if hook == "off" else "") + code)
    assert "connected" not in result.stdout
    assert result.exit_code == 1
    if hook == "off":  # the network namespace refuses it by itself: its loopback is the sandbox's own
        assert "ConnectionRefusedError: [Errno 111] Connection refused" in result.stderr
    assert accepted == []
    # The control: the server does accept connections from outside the sandbox.
    socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_the_default_isolation_is_bubblewrap_and_a_missing_one_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert PythonSandbox(FAST).isolation == "bwrap"
    monkeypatch.setenv("PATH", "/nonexistent")  # no bwrap on PATH
    with pytest.raises(SandboxUnavailable, match="install the system package `bubblewrap`.*isolation: none"):
        PythonSandbox(FAST)
    tool = make_tool("python", config=FAST)  # the tool starts its sandbox at first use, and refuses there
    with pytest.raises(SandboxUnavailable):
        asyncio.run(tool({"code": "print(1)"}))


def test_an_interpreter_the_sandbox_cannot_start_refuses_to_start_naming_it() -> None:
    with pytest.raises(SandboxUnavailable, match="/nonexistent/python3: not a working interpreter.*sandbox.interpreter"):
        PythonSandbox(dataclasses.replace(FAST, interpreter="/nonexistent/python3"))


def test_isolation_none_runs_but_warns_on_every_start(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="pipelines_lib.envs.tools.sandbox"):
        assert run("print(1)", UNSAFE).stdout == "1\n"
        PythonSandbox(UNSAFE)
    warnings = [r for r in caplog.records if "WITHOUT OS isolation" in r.getMessage()]
    assert len(warnings) == 2


def test_isolation_backends_are_a_registry_checked_by_the_config() -> None:
    assert sorted(ISOLATION_BACKENDS) == ["bwrap", "none"]
    with pytest.raises(ValueError, match="unknown isolation 'gvisor'; valid: bwrap, none"):
        SandboxConfig(isolation="gvisor")


def test_program_runs_unprivileged_in_its_own_namespaces_even_with_the_audit_hook_off() -> None:
    code = HOOK_OFF + (
        "import os, socket\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status').read().splitlines())\n"
        "print(os.getuid(), os.getgid(), os.getpid(), status['CapEff'].strip(), socket.gethostname())\n"
        "print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
        "print(sorted(os.listdir('/')), os.getcwd())\n"
    )
    lines = run(code).stdout.splitlines()
    assert lines[1] == f"{SANDBOX_UID} {SANDBOX_UID} 2 0000000000000000 sandbox"
    assert lines[2] == "['1', '2']"  # the namespace's init and the program: no host process is visible
    # Only what the interpreter needs; nothing of the project, the virtualenv or the host's home folders.
    assert set(eval(lines[3].rsplit(" ", 1)[0])) <= {"usr", "lib", "lib64", "lib32", "bin", "root", "proc", "dev",
                                                     "tmp"}
    assert lines[3].endswith(" /tmp")


def test_only_the_standard_library_of_the_interpreter_is_visible() -> None:
    code = HOOK_OFF + (
        "import os, site, sys, sysconfig\n"
        "print([os.listdir(p) for p in {*site.getsitepackages(), sysconfig.get_path('purelib')} if os.path.isdir(p)])\n"
        f"print(os.path.exists({os.getcwd()!r}), os.path.isdir(os.path.dirname(os.__file__)))\n"
    )
    lines = run(code).stdout.splitlines()[1:]
    assert lines[1] == "False True"
    assert set(lines[0]) <= set("[], ")  # every site-packages folder there is empty


def test_parent_environment_is_invisible_even_through_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2-do-not-leak")
    code = HOOK_OFF + (
        "import os\nprint(sorted(os.environ))\n"
        "for pid in ['self', str(os.getppid()), *os.listdir('/proc')]:\n"
        "    try:\n        print(open(f'/proc/{pid}/environ').read())\n    except OSError as e:\n        print(e)\n"
    )
    result = run(code)
    assert result.stdout.splitlines()[1] == "['HOME', 'LANG', 'PATH', 'PWD', 'TMPDIR']"
    assert "hunter2" not in result.stdout + result.stderr


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
        # The hook refuses most; paths under /tmp (pytest's tmp_path) do not exist in the sandbox at all.
        assert "PermissionError: sandbox:" in result.stderr or "No such file or directory" in result.stderr, code
        assert "TOP SECRET" not in result.stdout
    assert not os.path.exists(target)
    assert os.path.exists(secret)


def test_files_inside_the_working_directory_work() -> None:
    result = run(
        "open('a.txt', 'w').write('ok')\nimport os\nprint(open('a.txt').read(), sorted(os.listdir()))"
    )
    assert result.stdout == "ok ['a.txt', 'main.py']\n"


def test_the_working_directory_of_isolation_none_is_removed_afterwards() -> None:
    result = run("import os; print(os.getcwd())", UNSAFE)
    workdir = result.stdout.strip()
    assert "rollstream-sandbox-" in workdir
    assert not os.path.exists(workdir)


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


@pytest.mark.parametrize(
    "code",
    ["import os\nos.fork()",
     "import ctypes\nprint('fork returned', ctypes.CDLL(None).fork())",
     "import os\nos.posix_spawn('/usr/bin/id', ['id'], {})"],
    ids=["os_fork", "libc_fork", "posix_spawn"],
)
def test_no_new_processes_with_the_audit_hook_off_either(code: str) -> None:
    # RLIMIT_NPROC binds: the sandbox never runs as host root, who is exempt from it.
    result = run(HOOK_OFF + code)
    assert "uid=" not in result.stdout
    if "ctypes" in code:
        assert result.stdout == "HOOK-DISABLED\nfork returned -1\n"
    else:
        assert "\nBlockingIOError: [Errno 11] Resource temporarily unavailable" in result.stderr


def test_threads_count_against_max_processes() -> None:
    code = HOOK_OFF + ("import threading, time\nn = 0\ntry:\n    while n < 50:\n"
                       "        threading.Thread(target=time.sleep, args=(2,), daemon=True).start()\n        n += 1\n"
                       "except RuntimeError as e:\n    print(n, e)\n")
    assert run(code, dataclasses.replace(FAST, max_processes=3)).stdout == "HOOK-DISABLED\n2 can't start new thread\n"
    assert "0 can't start new thread" in run(code).stdout  # max_processes 1: the program alone


def test_fork_bomb_stops_at_max_processes() -> None:
    code = HOOK_OFF + ("import os, time\nn = 0\ntry:\n    while n < 200:\n        if os.fork() == 0:\n"
                       "            time.sleep(2)\n            os._exit(0)\n        n += 1\nexcept OSError as e:\n"
                       "    print(n, e.strerror)\n")
    result = run(code, dataclasses.replace(FAST, max_processes=4))
    assert result.stdout == "HOOK-DISABLED\n3 Resource temporarily unavailable\n"  # the program and 3 children


def test_concurrent_sandboxes_each_have_their_own_process_budget() -> None:
    # RLIMIT_NPROC counts per user namespace: a sandbox's budget is not shared with the others on the same uid.
    code = HOOK_OFF + ("import os, time\nfor _ in range(2):\n    if os.fork() == 0:\n        time.sleep(1)\n"
                       "        os._exit(0)\nprint('forked 2')\n")

    async def main() -> list[SandboxResult]:
        sandbox = PythonSandbox(dataclasses.replace(FAST, max_processes=3))
        return await asyncio.gather(*(sandbox.run(code) for _ in range(4)))

    assert [r.stdout for r in asyncio.run(main())] == ["HOOK-DISABLED\nforked 2\n"] * 4


def test_seccomp_filter_is_whole_instructions_ending_in_returns() -> None:
    prog = seccomp_filter(machine="x86_64")
    assert prog is not None and len(prog) % 8 == 0
    # 4 header (arch, x32) + one check per denied syscall + 3 returns (allow, EPERM, kill)
    assert len(prog) // 8 == 4 + len(DENIED_SYSCALLS["x86_64"]) + 3
    assert seccomp_filter(machine="riscv64") is None


@pytest.mark.parametrize(("machine", "header"), [("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
                                               ("aarch64", "/usr/include/asm-generic/unistd.h")])
def test_denied_syscall_numbers_are_the_kernel_headers(machine: str, header: str) -> None:
    if not os.path.exists(header):
        pytest.skip(f"{header} not installed (linux-libc-dev)")
    with open(header) as f:
        numbers = {p[1].removeprefix("__NR_"): p[2] for p in (line.split() for line in f)
                   if len(p) == 3 and p[0] == "#define" and p[1].startswith("__NR_") and p[2].isdigit()}
    assert {name: str(nr) for name, nr in DENIED_SYSCALLS[machine].items()} == {
        name: numbers[name] for name in DENIED_SYSCALLS[machine]}


_TRY_SYSCALLS = (
    "import ctypes, os, platform, threading\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.syscall.restype = ctypes.c_long\n"
    "for name, nr in {denied}[platform.machine()].items():\n"
    "    ctypes.set_errno(0)\n    r = libc.syscall(nr, 0, 0, 0, 0, 0, 0)\n"
    "    print(name, r, os.strerror(ctypes.get_errno()))\n"
    "t = threading.Thread(target=print, args=('thread ok',))\nt.start()\nt.join()\n"
    "open('f', 'w').write('file ok')\nprint(open('f').read())\n"
)


def test_every_denied_syscall_fails_with_eperm_and_ordinary_python_still_works() -> None:
    result = run(HOOK_OFF + _TRY_SYSCALLS.format(denied=DENIED_SYSCALLS), dataclasses.replace(FAST, max_processes=2))
    lines = result.stdout.splitlines()[1:]
    denied = DENIED_SYSCALLS[os.uname().machine]
    assert lines[:len(denied)] == [f"{name} -1 Operation not permitted" for name in denied]
    assert lines[len(denied):] == ["thread ok", "file ok"]


def test_memory_bomb_fails_with_memory_error() -> None:
    result = run("x = bytearray(2 * 1024**3)")
    assert result.exit_code == 1
    assert result.stderr.rstrip().endswith("MemoryError")


def test_infinite_loop_is_killed_at_the_wall_clock_limit() -> None:
    config = SandboxConfig(timeout_s=0.5, cpu_s=10)
    result = run("print('started', flush=True)\nwhile True:\n    pass", config)
    assert result.timed_out and not result.ok
    assert result.exit_code == -signal.SIGKILL
    assert result.stdout == "started\n"  # output before the kill is kept
    assert result.wall_s >= 0.5  # it ran until the deadline (how soon after it is a benchmark's business)
    assert result.as_text(config.timeout_s) == "started\n[timed out after 0.5 s]"


def test_sleeping_program_is_killed_at_the_wall_clock_limit() -> None:
    result = run("import time\ntime.sleep(100)", SandboxConfig(timeout_s=0.3))
    assert result.timed_out


@pytest.mark.parametrize("leave", ["timeout", "exit"])
def test_detached_grandchildren_do_not_survive_the_call(leave: str) -> None:
    # Forking allowed and the hook off: a setsid'd, double-forked grandchild is still in the sandbox's pid
    # namespace, which dies with the call whether the program ends by itself or at the deadline. The autouse
    # fixture looks for the marker among all processes of the machine.
    code = HOOK_OFF + (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        os.execv('/usr/bin/sleep', ['{MARKER}', '300'])\n    os._exit(0)\n"
        "os.wait()\nprint('grandchild started', flush=True)\n"
    ) + ("time.sleep(100)\n" if leave == "timeout" else "")
    result = run(code, dataclasses.replace(FAST, timeout_s=1.0, max_processes=64))
    assert "grandchild started" in result.stdout
    assert result.timed_out == (leave == "timeout")


def test_cpu_limit_stops_a_busy_loop_before_the_wall_clock() -> None:
    result = run("while True:\n    pass", SandboxConfig(timeout_s=10.0, cpu_s=1))
    assert not result.timed_out
    assert result.exit_code == -signal.SIGXCPU  # the soft limit's signal (the hard limit, a second later, kills)


def test_gigantic_output_is_truncated_and_the_program_stopped() -> None:
    result = run("while True:\n    print('x' * 1000)")
    assert result.truncated and not result.timed_out
    assert len(result.stdout) == FAST.max_output_bytes  # stopped by the output cap, not by the timeout (no wall
    # clock bound here: on a loaded 2-core machine reaping took 5 s once; speed lives in benchmarks)
    assert result.as_text(FAST.timeout_s).endswith("\n[output truncated; program stopped]")


def test_file_size_limit_refuses_the_write_with_efbig() -> None:
    # Python ignores SIGXFSZ, so the kernel's RLIMIT_FSIZE shows as EFBIG on the write that crosses it.
    code = "open('big', 'wb').write(b'x' * (2 * 1024**2))\nprint('written')"
    result = run(code, dataclasses.replace(FAST, file_size_mb=1))
    assert result.exit_code == 1
    assert result.stderr.rstrip().endswith(f"OSError: [Errno {errno.EFBIG}] File too large")
    assert run(code, dataclasses.replace(FAST, file_size_mb=3)).stdout == "written\n"  # the control


def test_the_program_never_runs_as_host_root_and_host_kernel_settings_do_not_open_for_writing() -> None:
    # Opened, never written: the test must not change a host setting even if the sandbox failed.
    code = HOOK_OFF + (
        "import os\n"
        "for p in ('/proc/sys/kernel/core_pattern', '/proc/sys/vm/drop_caches', '/proc/sys/kernel/hostname',\n"
        "          '/proc/sys/fs/file-max', '/proc/sysrq-trigger', '/proc/1/mem', '/proc/1/task/1/mem'):\n"
        "    try:\n        os.close(os.open(p, os.O_WRONLY))\n        print(p, 'WRITABLE')\n"
        "    except OSError as e:\n        print(p, e.strerror)\n"
    )
    lines = run(code).stdout.splitlines()[1:]
    assert len(lines) == 7 and not [line for line in lines if "WRITABLE" in line]

    async def host_uids() -> set[int]:
        """The host uids of a started worker: bwrap, the sandbox's init and the interpreter."""
        async with PythonSandbox(dataclasses.replace(FAST, warm_pool=1)) as sandbox:
            backend = sandbox.backend
            while not backend._ready:  # type: ignore[attr-defined]
                await asyncio.sleep(0.01)
            worker = psutil.Process(backend._ready[0].proc.pid)  # type: ignore[attr-defined]
            for _ in range(1000):  # ready as soon as bwrap reports its init; the interpreter may still be starting
                processes = [worker, *worker.children(recursive=True)]
                if len(processes) == 3:
                    break
                await asyncio.sleep(0.01)
            assert len(processes) == 3
            return {uid for p in processes for uid in p.uids()}

    assert asyncio.run(host_uids()) == {FAST.host_uid if os.geteuid() == 0 else os.geteuid()} != {0}


_AS_ANOTHER_USER = """
import asyncio, os, sys
from pipelines_lib.envs.tools import PythonSandbox, SandboxConfig
print(os.getuid(), asyncio.run(PythonSandbox(SandboxConfig(max_processes=4)).run(sys.stdin.read())).stdout)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON), reason="needs root to become another user")
def test_a_parent_that_is_not_root_gets_the_same_guarantees() -> None:
    # The rollout as an ordinary user (uid 4242, no groups), with the system's interpreter: this one's may not be
    # readable by that uid. The fork bomb stops at max_processes, and no host setting opens for writing.
    code = HOOK_OFF + (
        "import os, time\nn = 0\ntry:\n    while n < 200:\n        if os.fork() == 0:\n"
        "            time.sleep(2)\n            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print(n, e.strerror)\n"
        "for p in ('/proc/sys/kernel/core_pattern', '/proc/sys/vm/drop_caches', '/proc/1/mem'):\n"
        "    try:\n        os.close(os.open(p, os.O_WRONLY))\n        print(p, 'WRITABLE')\n"
        "    except OSError as e:\n        print(e.strerror)\n"
    )
    done = subprocess.run([SYSTEM_PYTHON, "-c", _AS_ANOTHER_USER], input=code, capture_output=True, text=True,
                          timeout=60, user=4242, group=4242, extra_groups=[], env={"PYTHONPATH": str(Path(__file__).resolve().parents[1])},
                          check=True)
    assert done.stdout.splitlines() == ["4242 HOOK-DISABLED", "3 Resource temporarily unavailable",
                                        "No such file or directory", "No such file or directory", "Permission denied",
                                        ""]


def test_a_root_parent_refuses_host_uid_zero() -> None:
    with pytest.raises(ValueError, match="host_uid must be >= 1, got 0"):
        SandboxConfig(host_uid=0)


def test_the_sandbox_init_carries_the_program_limits() -> None:
    code = HOOK_OFF + "print(open('/proc/1/limits').read() == open('/proc/self/limits').read())\n"
    assert run(code).stdout == "HOOK-DISABLED\nTrue\n"
    limits = run(HOOK_OFF + "print(open('/proc/1/limits').read())").stdout
    assert "Max processes             2                    2" in limits
    assert f"Max address space         {FAST.memory_mb * 2**20}" in limits


def test_sysv_shared_memory_and_memfd_are_refused() -> None:
    code = HOOK_OFF + (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print('shmget', libc.shmget(0, 1 << 30, 0o1600), os.strerror(ctypes.get_errno()))\n"
        "try:\n    os.memfd_create('x')\nexcept OSError as e:\n    print('memfd', e.strerror)\n"
    )
    assert run(code).stdout.splitlines()[1:] == ["shmget -1 Operation not permitted", "memfd Operation not permitted"]


_AIO_LDT_SECRET = {  # name: (x86_64 number, aarch64 number or None, arguments) with arguments that work unfiltered
    "io_setup": (206, 0, "1, ctypes.byref(ctx)"), "io_submit": (209, 2, "ctx, 0, 0"),
    "io_getevents": (208, 4, "ctx, 0, 1, buf, 0"), "io_pgetevents": (333, 292, "ctx, 0, 1, buf, 0, 0"),
    "io_cancel": (210, 3, "ctx, buf, buf"), "io_destroy": (207, 1, "ctx"),
    "memfd_secret": (447, 447, "0"), "modify_ldt": (154, None, "0, buf, 64"),
}


def test_classic_aio_secret_memory_and_ldt_calls_are_refused_inside_the_sandbox() -> None:
    # Each with real arguments: an AIO context would count against the host-wide fs.aio-max-nr.
    machine = os.uname().machine
    column = {"x86_64": 0, "aarch64": 1}[machine]
    calls = {name: (nrs[column], nrs[2]) for name, nrs in _AIO_LDT_SECRET.items() if nrs[column] is not None}
    code = HOOK_OFF + "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
    code += "ctx, buf = ctypes.c_ulong(0), ctypes.create_string_buffer(64)\n"
    for name, (nr, args) in calls.items():
        code += (f"ctypes.set_errno(0)\nr = libc.syscall({nr}, {args})\n"
                 f"print({name!r}, r, os.strerror(ctypes.get_errno()) if r == -1 else 'allowed')\n")
    assert run(code).stdout.splitlines()[1:] == [f"{name} -1 Operation not permitted" for name in calls]


def test_the_masks_over_hidden_folders_take_no_writes() -> None:
    code = HOOK_OFF + (
        "import os, site\nfor p in site.getsitepackages():\n    if os.path.isdir(p):\n        try:\n"
        "            open(p + '/fill', 'wb').write(b'x' * 2**20)\n            print(p, 'WRITTEN')\n"
        "        except OSError as e:\n            print(p, e.strerror)\n"
    )
    lines = run(code).stdout.splitlines()[1:]
    assert lines and all(line.endswith("Read-only file system") for line in lines)


def test_a_lone_surrogate_is_the_programs_error() -> None:
    tool = make_tool("python", config=FAST)
    text, kind, _ = asyncio.run(run_tool(tool, {"code": "print('\ud800')"}, timeout_s=5.0))
    assert kind is None
    assert text == ("[stderr]\nSyntaxError: (unicode error) 'utf-8' codec can't encode character '\\ud800' in "
                    "position 7: surrogates not allowed\n[exit code 1]")


def test_the_work_dir_is_the_only_writable_place_and_it_is_bounded() -> None:
    code = HOOK_OFF + (
        "for d in ('/', '/dev', '/dev/shm', '/usr', '/tmp'):\n    try:\n        open(d + '/f', 'w').close()\n"
        "        print(d, 'writable')\n    except OSError as e:\n        print(d, e.strerror)\n"
        "open('/dev/null', 'w').write('x')\n"
        "for i in range(20):\n    open(f'/tmp/fill{i}', 'wb').write(b'x' * 4 * 1024**2)\n"
    )
    result = run(code, dataclasses.replace(FAST, work_dir_mb=16))
    assert result.stdout.splitlines()[1:] == ["/ Read-only file system", "/dev Read-only file system",
                                              "/dev/shm Read-only file system", "/usr Read-only file system",
                                              "/tmp writable"]
    assert f"OSError: [Errno {errno.ENOSPC}] No space left on device" in result.stderr


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


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
def test_cancelled_run_kills_the_sandbox_and_removes_its_folder(
    isolation: str, monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]
) -> None:
    """run_tool's deadline shorter than the sandbox's: cancellation must clean up like a timeout (the autouse
    fixture checks the processes)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # isolation none's folder goes here
    tool = make_tool("python", config=SandboxConfig(timeout_s=30.0, cpu_s=30, isolation=isolation))
    code = "print('running', flush=True)\nwhile True:\n    pass"
    text, kind, _ = asyncio.run(run_tool(tool, {"code": code}, timeout_s=0.5))
    assert kind == "timeout"
    assert os.listdir(tmp_path) == []


def test_warm_pool_serves_calls_from_started_workers_and_stops_them_on_exit() -> None:
    async def main() -> tuple[list[int], list[SandboxResult]]:
        async with PythonSandbox(dataclasses.replace(FAST, warm_pool=3)) as sandbox:
            backend = sandbox.backend
            while len(backend._ready) < 3:  # type: ignore[attr-defined]
                await asyncio.sleep(0.01)
            waiting = [w.proc.pid for w in backend._ready]  # type: ignore[attr-defined]
            results = await asyncio.gather(*(sandbox.run(f"print({i} * {i})") for i in range(5)))
        return waiting, results

    waiting, results = asyncio.run(main())
    assert [r.stdout for r in results] == ["0\n", "1\n", "4\n", "9\n", "16\n"]
    assert not any(psutil.pid_exists(pid) for pid in waiting)  # used once, then gone


def test_no_state_survives_from_one_call_to_the_next_in_the_warm_pool() -> None:
    first = HOOK_OFF + (
        "import os, time\nopen('/tmp/left-behind', 'w').write('x')\nos.environ['LEFT'] = '1'\n"
        "if os.fork() == 0:\n    os.setsid()\n"
        f"    os.execv('/usr/bin/sleep', ['{MARKER}', '300'])\n"
        "import builtins\nbuiltins.LEFT = 1\nprint('planted', os.getpid())\n"
    )
    second = HOOK_OFF + (
        "import builtins, os\nprint(os.listdir('/tmp'), 'LEFT' in os.environ, hasattr(builtins, 'LEFT'))\n"
        "print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
    )

    async def main() -> list[SandboxResult]:
        async with PythonSandbox(dataclasses.replace(FAST, warm_pool=1, max_processes=64)) as sandbox:
            return [await sandbox.run(first), await sandbox.run(second)]

    planted, checked = asyncio.run(main())
    assert planted.stdout.splitlines()[1] == "planted 2"
    assert checked.stdout.splitlines()[1:] == ["['main.py'] False False", "['1', '2']"]


def test_config_validation_names_the_bad_value() -> None:
    with pytest.raises(ValueError, match="memory_mb must be >= 1, got 0"):
        SandboxConfig(memory_mb=0)
    with pytest.raises(ValueError, match="warm_pool must be >= 0, got -1"):
        SandboxConfig(warm_pool=-1)
    with pytest.raises(ValueError, match="timeout_s must be finite and > 0, got inf"):
        SandboxConfig(timeout_s=float("inf"))
    with pytest.raises(ValueError, match="program too long"):
        asyncio.run(PythonSandbox(SandboxConfig(max_code_chars=5)).run("print(1)"))


def test_a_code_campaign_refuses_to_start_without_isolation_unless_configured_unsafe(
    monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str], caplog: pytest.LogCaptureFixture
) -> None:
    from pipelines_lib.config import CampaignConfig
    from pipelines_lib.rollout.episodes import env_sandbox

    async def enter(config: CampaignConfig) -> PythonSandbox | None:
        async with env_sandbox(config.env) as sandbox:
            return sandbox

    path = os.path.join(tmp_path, "campaign.yaml")
    with open(path, "w") as f:
        f.write("dataset:\n  source: builtin:code\n  env_name: code\nenv:\n  name: code\n")
    safe = CampaignConfig.from_yaml(path)
    with open(path, "a") as f:
        f.write("  sandbox:\n    isolation: none\n")
    unsafe = CampaignConfig.from_yaml(path)
    assert (safe.env.sandbox.isolation, unsafe.env.sandbox.isolation) == ("bwrap", "none")
    monkeypatch.setenv("PATH", "/nonexistent")  # a machine without bubblewrap
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        asyncio.run(enter(safe))
    with caplog.at_level(logging.WARNING, logger="pipelines_lib.envs.tools.sandbox"):
        sandbox = asyncio.run(enter(unsafe))
    assert sandbox is not None and sandbox.isolation == "none"
    assert "WITHOUT OS isolation" in caplog.text
    assert asyncio.run(enter(CampaignConfig.tiny())) is None  # envs that run no code need no sandbox at all
