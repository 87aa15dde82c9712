"""The sandbox escape catalogue: hostile programs run through the sandboxed Python tool, each checked for containment.

Every ``Escape`` is a program template run exactly as an agent would run it (``run_tool`` over ``PythonTool``),
against a prepared host: a TCP server on 127.0.0.1 counting connections, a folder outside the sandbox holding a
secret file, and a fake credential planted in the parent's environment. An attempt is *contained* when all of

- the tool call returned text (a result, not an exception), and the attempt's own expectation holds;
- the server accepted no connection, the outside secret was neither read nor changed, nothing new appeared
  outside, the planted credential is not in the result;
- the host is clean afterwards: no descendant processes (psutil) and no process anywhere carrying ``MARKER``, no
  sandbox folder left in the temp dir.

Besides plain hostile programs, half the catalogue attacks the containment mechanism: ``hook_off_*`` attempts
first neutralise the PEP 578 audit hook (``DISABLE_AUDIT_HOOK`` through the garbage collector,
``FRAME_DISABLE_AUDIT_HOOK`` through the frame of the error it raised), then go for the parent's ``/proc``, new
processes, ``ctypes``/``ptrace``/``mmap`` of the interpreter, sockets, signals to every pid, ``stat``/``readlink``
probes outside, device nodes and FIFOs, inherited descriptors, memory-filling files and detached grandchildren.
Under ``isolation="none"`` they do escape (tests/test_sandbox_escapes.py checks that control); under ``bwrap`` the
namespaces, seccomp filter and rlimits hold by themselves.

The last part of the catalogue goes for the host's kernel settings (``/proc/sys``), the memory and limits of the
sandbox's init, each syscall the seccomp filter denies, and the resource caps (``cap`` attempts: the hidden
folders' masks and the work dir's size, SysV IPC and memfd memory, processes and threads past ``max_processes``).

``run_escapes`` returns one ``EscapeOutcome`` per attempt; the count not contained is
``reliability.sandbox_escapes`` (attempts to get out) and ``reliability.sandbox_caps_exceeded`` (caps).
``tests/test_sandbox_escapes.py`` runs the same catalogue one attempt per test.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import platform
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from pipelines_lib.envs.tools.bwrap import SANDBOX_UID
from pipelines_lib.envs.tools.runner import run_tool
from pipelines_lib.envs.tools.sandbox import PythonSandbox, PythonTool, SandboxConfig
from pipelines_lib.envs.tools.seccomp import DENIED_SYSCALLS

DRILL_SANDBOX = SandboxConfig(timeout_s=2.0, cpu_s=2, memory_mb=256, file_size_mb=4, max_output_bytes=4096)
PLANTED_ENV = "ROLLSTREAM_DRILL_API_TOKEN"
PLANTED_VALUE = "sk-drill-0123456789abcdef-do-not-leak"
SECRET_TEXT = "TOP-SECRET-OUTSIDE-THE-SANDBOX"


MARKER = "rollstream-escape-marker"
"""argv[0] of every process an attempt tries to leave behind; any process carrying it afterwards is a survivor."""

DISABLE_AUDIT_HOOK = """import gc
hook = next(o for o in gc.get_objects() if type(o).__name__ == "function" and o.__name__ == "hook"
            and o.__code__.co_filename == "<string>")
code = hook.__code__
hook.__code__ = code.replace(co_consts=tuple(("\\0",) if k == ("socket.", "ctypes.") else k for k in code.co_consts))
for name, cell in zip(code.co_freevars, hook.__closure__):
    if name in ("read_roots", "write_roots"):
        cell.cell_contents = ("",)
    elif name in ("blocked_events", "blocked_modules"):
        cell.cell_contents = frozenset()
    elif name == "path_events":
        cell.cell_contents = {{}}
del gc, hook, code
print("HOOK-DISABLED")
"""
"""Prefix of the attacks on the mechanism: finds the audit hook through the garbage collector and neutralises it
(every path allowed, no event or module blocked, sockets and ctypes allowed). Under ``isolation="none"`` the
program then reaches the host; under ``bwrap`` the namespaces still hold. (Doubled braces: escapes are
``str.format`` templates.)"""

FRAME_DISABLE_AUDIT_HOOK = """import gc
try:
    open("/etc/passwd")
except PermissionError as e:
    tb = e.__traceback__
    while tb.tb_next:
        tb = tb.tb_next
    hook = next(f for f in gc.get_referrers(tb.tb_frame.f_code) if type(f).__name__ == "function")
    for name, cell in zip(hook.__code__.co_freevars, hook.__closure__):
        if name in ("read_roots", "write_roots"):
            cell.cell_contents = ("",)
        elif name in ("blocked_events", "blocked_modules"):
            cell.cell_contents = frozenset()
print("HOOK-DISABLED")
"""
"""The same through the frame of the ``PermissionError`` the hook raised (its code object leads to the function)."""


@dataclass(frozen=True, kw_only=True)
class Escape:
    name: str
    code: str
    """Program; ``{port}``, ``{outside}`` (a folder), ``{secret}`` (a file in it) and ``{marker}`` are filled in."""
    expect: Callable[[str], bool] = lambda text: True
    """Extra condition on the tool result text."""
    max_processes: int = 1
    """The sandbox's ``max_processes`` for this attempt (> 1 lets it fork, to try leaving survivors)."""
    cap: bool = False
    """An attempt to pass a resource cap (``reliability.sandbox_caps_exceeded``) rather than to get out."""


def _refused(text: str) -> bool:
    return "PermissionError: sandbox:" in text or "MemoryError" in text or "[exit code" in text


def _hook_off(code: str) -> str:
    return DISABLE_AUDIT_HOOK + code


def _disabled_and(flag: str) -> Callable[[str], bool]:
    """The hook was really disabled, and the attempt never printed ``flag`` (its success signal)."""
    return lambda text: "HOOK-DISABLED" in text and flag not in text


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
    # Attacks on the mechanism: the audit hook is neutralised first; the OS isolation must hold by itself.
    Escape(name="hook_off_read_secret", code=_hook_off("print(open('{secret}').read())"),
           expect=_disabled_and(SECRET_TEXT)),
    Escape(name="hook_frame_off_read_secret", code=FRAME_DISABLE_AUDIT_HOOK + "print(open('{secret}').read())",
           expect=_disabled_and(SECRET_TEXT)),
    Escape(name="hook_off_write_outside", code=_hook_off("open('{outside}/planted.txt', 'w').write('x')\n"
           "print('WROTE')"), expect=_disabled_and("WROTE")),
    Escape(name="hook_off_parent_environ", code=_hook_off("import os\nprint(open(f'/proc/{{os.getppid()}}/environ')"
           ".read())"), expect=lambda t: "HOOK-DISABLED" in t),
    Escape(name="hook_off_every_proc_environ", code=_hook_off(
           "import os\nfor p in os.listdir('/proc'):\n    if p.isdigit():\n        try:\n"
           "            print(p, open(f'/proc/{{p}}/environ').read())\n        except OSError as e:\n"
           "            print(p, e)"), expect=lambda t: "HOOK-DISABLED" in t),
    Escape(name="hook_off_proc_lists_only_the_sandbox", code=_hook_off(
           "import os\npids = [p for p in os.listdir('/proc') if p.isdigit()]\nprint('PIDS', len(pids))\n"
           "if len(pids) > 3:\n    print('HOST-PROCESSES-VISIBLE')"), expect=_disabled_and("HOST-PROCESSES-VISIBLE")),
    Escape(name="hook_off_parent_root_and_cwd", code=_hook_off(
           "import os\nppid = os.getppid()\nprint(os.readlink(f'/proc/{{ppid}}/cwd'), os.listdir(f'/proc/{{ppid}}/root'))"
           "\nprint(open(f'/proc/{{ppid}}/cmdline').read())\nif os.path.exists(f'/proc/{{ppid}}/root{secret}'):\n"
           "    print('SECRET-REACHABLE')"), expect=_disabled_and("SECRET-REACHABLE")),
    Escape(name="hook_off_system_id", code=_hook_off("import os\nprint('STATUS', os.system('id'))"),
           expect=lambda t: "HOOK-DISABLED" in t and "uid=0" not in t),
    Escape(name="hook_off_subprocess", code=_hook_off("import subprocess\nprint(subprocess.run(['id'], "
           "capture_output=True).stdout)"), expect=lambda t: "HOOK-DISABLED" in t and "uid=" not in t),
    Escape(name="hook_off_ctypes_fork", code=_hook_off("import ctypes\nprint('FORK', ctypes.CDLL(None).fork())"),
           expect=lambda t: "HOOK-DISABLED" in t and "FORK -1" in t),
    Escape(name="hook_off_ctypes_ptrace_init", code=_hook_off("import ctypes\nlibc = ctypes.CDLL(None)\n"
           "print('PTRACE', libc.ptrace(16, 1, 0, 0))"), expect=lambda t: "PTRACE -1" in t),
    Escape(name="hook_off_ctypes_new_user_namespace", code=_hook_off(
           "import ctypes\nprint('UNSHARE', ctypes.CDLL(None).unshare(0x10000000))"),
           expect=lambda t: "UNSHARE -1" in t),
    Escape(name="hook_off_patch_interpreter_file", code=_hook_off(
           "import os, sys\nopen(os.path.realpath(sys.executable), 'r+b').write(b'x')\nprint('PATCHED')"),
           expect=_disabled_and("PATCHED")),
    Escape(name="hook_off_mmap_interpreter_writable", code=_hook_off(
           "import mmap, os, sys\nf = open(os.path.realpath(sys.executable), 'rb')\n"
           "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_WRITE, flags=mmap.MAP_SHARED)\n"
           "print('MAPPED')"), expect=_disabled_and("MAPPED")),
    Escape(name="hook_off_write_own_memory_then_exit", code=_hook_off(
           "import ctypes\nctypes.memset(ctypes.c_void_p(ctypes.pythonapi.Py_Initialize), 0, 64)\nprint('ALIVE')"),
           expect=lambda t: "HOOK-DISABLED" in t),
    Escape(name="hook_off_socket_to_loopback_server", code=_hook_off(
           "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), 1)\n    print('CONNECTED')\n"
           "except OSError as e:\n    print('refused', e)"), expect=_disabled_and("CONNECTED")),
    Escape(name="hook_off_udp_to_loopback", code=_hook_off(
           "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nprint(s.sendto(b'x', "
           "('127.0.0.1', {port})))"), expect=lambda t: "HOOK-DISABLED" in t),
    Escape(name="hook_off_external_dns", code=_hook_off(
           "import socket\nprint('RESOLVED', socket.getaddrinfo('pypi.org', 443))"), expect=_disabled_and("RESOLVED (")),
    Escape(name="hook_off_kill_every_pid", code=_hook_off(
           "import os, signal\nfor pid in [-1, *range(1, 5000)]:\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
           "    except OSError:\n        pass"), expect=lambda t: "HOOK-DISABLED" in t),
    Escape(name="hook_off_stat_probe_outside", code=_hook_off(
           "import os\nfor p in ('{secret}', '{outside}', '/root', '/work', '/home', '/etc/passwd'):\n"
           "    if os.path.exists(p):\n        print('EXISTS', p)\n    try:\n        os.stat(p)\n"
           "        print('EXISTS', p)\n    except OSError:\n        pass"),
           expect=lambda t: "HOOK-DISABLED" in t and "EXISTS /etc" not in t and "EXISTS /work" not in t
           and "EXISTS /home" not in t and "outside" not in t),
    Escape(name="hook_off_readlink_probe", code=_hook_off(
           "import os\nfor p in ('/proc/self/exe', '/proc/self/cwd', '/proc/1/exe', '/proc/1/cwd', '/proc/1/root'):\n"
           "    try:\n        print(p, os.readlink(p))\n    except OSError as e:\n        print(p, e)"),
           expect=lambda t: "HOOK-DISABLED" in t and "sandbox-tmp" not in t),
    Escape(name="hook_off_device_node", code=_hook_off(
           "import os, stat\nfor p in ('/tmp/sda', '/tmp/mem'):\n    try:\n"
           "        os.mknod(p, stat.S_IFBLK | 0o600, os.makedev(8, 0))\n        print('DEVICE', p)\n"
           "    except OSError as e:\n        print(p, e)\nfor p in ('/dev/sda', '/dev/mem', '/dev/kmsg'):\n"
           "    try:\n        open(p, 'rb').read(1)\n        print('DEVICE', p)\n    except OSError as e:\n"
           "        print(p, e)"), expect=_disabled_and("DEVICE")),
    Escape(name="hook_off_fifo_outside", code=_hook_off(
           "import os\nos.mkfifo('fifo')\ntry:\n    os.mkfifo('{outside}/fifo')\n    print('FIFO-OUTSIDE')\n"
           "except OSError as e:\n    print(e)"), expect=_disabled_and("FIFO-OUTSIDE")),
    Escape(name="hook_off_inherited_fds", code=_hook_off(
           "import os\nfor fd in range(3, 1024):\n    try:\n        print('FD-OPEN', fd, os.readlink(f'/proc/self/fd/{{fd}}'))\n"
           "    except OSError:\n        pass"), expect=_disabled_and("FD-OPEN")),
    Escape(name="hook_off_setuid_root", code=_hook_off("import os\nos.setuid(0)\nprint('ROOT')"),
           expect=_disabled_and("ROOT")),
    Escape(name="hook_off_fill_memory_with_files", code=_hook_off(
           "for d in ('/tmp', '/', '/dev', '/dev/shm'):\n    try:\n        for i in range(64):\n"
           "            open(f'{{d}}/fill{{i}}', 'wb').write(b'x' * 4 * 1024**2)\n        print('FILLED', d)\n"
           "    except OSError as e:\n        print(d, e)"), expect=_disabled_and("FILLED")),
    Escape(name="hook_off_detached_grandchild_after_timeout", max_processes=64, code=_hook_off(
           "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
           "        os.execv('/usr/bin/sleep', ['{marker}', '300'])\n    os._exit(0)\ntime.sleep(100)"),
           expect=lambda t: "timed out" in t),
    Escape(name="hook_off_double_fork_then_exit", max_processes=64, code=_hook_off(
           "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
           "        os.execv('/usr/bin/sleep', ['{marker}', '300'])\n    os._exit(0)\nprint('PARENT-DONE')"),
           expect=lambda t: "PARENT-DONE" in t),
    # Host kernel settings, the sandbox's init, and the caps: every one must hold whoever runs the rollout.
    Escape(name="hook_off_sysctl_open_for_writing", code=_hook_off(
           "import os\nfor p in ('kernel/core_pattern', 'vm/drop_caches', 'kernel/hostname', 'fs/file-max', "
           "'net/ipv4/ip_forward'):\n    try:\n        os.close(os.open('/proc/sys/' + p, os.O_WRONLY))\n"
           "        print('SYSCTL-WRITABLE', p)\n    except OSError as e:\n        print(p, e)"),
           expect=_disabled_and("SYSCTL-WRITABLE")),
    Escape(name="hook_off_init_memory", code=_hook_off(
           "for p in ('/proc/1/mem', '/proc/1/task/1/mem'):\n    try:\n        open(p, 'r+b').close()\n"
           "        print('INIT-MEMORY-OPEN', p)\n    except OSError as e:\n        print(p, e)"),
           expect=_disabled_and("INIT-MEMORY-OPEN")),
    Escape(name="hook_off_init_without_limits", cap=True, code=_hook_off(
           "if open('/proc/1/limits').read() != open('/proc/self/limits').read():\n    print('INIT-UNLIMITED')"),
           expect=_disabled_and("INIT-UNLIMITED")),
    Escape(name="hook_off_fill_the_hidden_folders", cap=True, code=_hook_off(
           "import os, site, sysconfig\nfor p in {{*site.getsitepackages(), sysconfig.get_path('purelib')}}:\n"
           "    try:\n        open(p + '/fill', 'wb').write(b'x' * 2**20)\n        print('MASK-WRITABLE', p)\n"
           "    except OSError as e:\n        print(p, e)\nn = 0\ntry:\n    while n < 64:\n"
           "        open(f'/tmp/fill{{n}}', 'wb').write(b'x' * 2**22)\n        n += 1\nexcept OSError as e:\n"
           "    print('work dir full at', 4 * n, 'MiB')\nif 4 * n > " + str(DRILL_SANDBOX.work_dir_mb) + ":\n"
           "    print('WORK-DIR-OVER')"),
           expect=lambda t: "HOOK-DISABLED" in t and "MASK-WRITABLE" not in t and "WORK-DIR-OVER" not in t),
    Escape(name="hook_off_sysv_shm_and_memfd", cap=True, code=_hook_off(
           "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nif libc.shmget(0, 1 << 30, 0o1600) >= 0:\n"
           "    print('SHM-GRANTED')\nif libc.msgget(0, 0o1600) >= 0:\n    print('MSGQ-GRANTED')\ntry:\n"
           "    os.memfd_create('x')\n    print('MEMFD-GRANTED')\nexcept OSError as e:\n    print('memfd', e)"),
           expect=lambda t: "HOOK-DISABLED" in t and "-GRANTED" not in t),
    Escape(name="hook_off_fork_past_max_processes", cap=True, max_processes=4, code=_hook_off(
           "import os, time\nn = 0\ntry:\n    while n < 100:\n        if os.fork() == 0:\n            time.sleep(1)\n"
           "            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print(n, 'forks', e)\nif n > 3:\n"
           "    print('NPROC-OVER')"), expect=lambda t: "HOOK-DISABLED" in t and "NPROC-OVER" not in t),
    Escape(name="hook_off_threads_past_max_processes", cap=True, code=_hook_off(
           "import threading, time\nn = 0\ntry:\n    while n < 100:\n        threading.Thread(target=time.sleep, "
           "args=(1,), daemon=True).start()\n        n += 1\nexcept RuntimeError as e:\n    print(n, 'threads', e)\n"
           "if n > 0:\n    print('NPROC-OVER')"), expect=lambda t: "HOOK-DISABLED" in t and "NPROC-OVER" not in t),
    *(Escape(name=f"hook_off_syscall_{name}", code=_hook_off(
           "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
           f"r = libc.syscall({nr}, 0, 0, 0, 0, 0, 0)\nif r != -1 or ctypes.get_errno() != 1:\n"
           f"    print('SYSCALL-ALLOWED {name}', r, os.strerror(ctypes.get_errno()))"),
           expect=_disabled_and("SYSCALL-ALLOWED")) for name, nr in DENIED_SYSCALLS.get(platform.machine(), {}).items()),
)


@dataclass(frozen=True, kw_only=True)
class EscapeOutcome:
    name: str
    cap: bool
    """The attempt was on a resource cap (see ``Escape.cap``)."""
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
    code = escape.code.format(port=host.port, outside=host.outside, secret=host.secret, marker=MARKER)
    config = dataclasses.replace(config, max_processes=escape.max_processes)
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
    leftovers += [p for p in psutil.process_iter(["cmdline"]) if MARKER in (p.info["cmdline"] or [""])[0]]
    if leftovers:
        problems.append(f"processes left behind: {[p.pid for p in leftovers]}")
        for p in leftovers:
            with contextlib.suppress(psutil.Error):
                p.kill()
    sandbox_dirs = os.listdir(tempfile.gettempdir())
    if sandbox_dirs:
        problems.append(f"sandbox folders left behind: {sandbox_dirs}")
    return EscapeOutcome(name=escape.name, cap=escape.cap, contained=not problems, problems=tuple(problems), result=text[:500],
                         seconds=round(seconds, 3))


def isolation_in_use(config: SandboxConfig = DRILL_SANDBOX) -> str:
    """The backend the catalogue runs against, with bubblewrap's version when it is that one."""
    name = PythonSandbox(config).isolation
    if name != "bwrap":
        return f"`{name}`"
    version = subprocess.run(["bwrap", "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    host = f"host uid {config.host_uid}" if os.geteuid() == 0 else f"host uid {os.geteuid()}"
    return (f"`bwrap` ({version}: user, pid, mount, ipc, uts, net namespaces; seccomp; uid {SANDBOX_UID}, "
            f"{host})")


def run_escapes(root: Path, escapes: tuple[Escape, ...] = ESCAPES) -> list[EscapeOutcome]:
    """Every attempt of the catalogue against one prepared host under ``root`` (a fresh folder)."""
    with prepared_host(root) as host:
        return [attempt(e, host) for e in escapes]


__all__ = ["DISABLE_AUDIT_HOOK", "DRILL_SANDBOX", "ESCAPES", "MARKER", "Escape", "EscapeOutcome", "Host", "attempt", "loopback_listener", "isolation_in_use",
           "prepared_host", "run_escapes"]
