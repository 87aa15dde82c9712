"""The program every local sandbox worker runs first (``python -I -S -B -c BOOTSTRAP pid1|self RLIMIT_X=soft:hard ...``): it sets the
limits, waits for the program on stdin, and runs it under the audit hook. Used by
:class:`.sandbox.LocalProcessBackend`, whichever backend starts the interpreter."""

# Runs in the worker as `python -I -S -B -c BOOTSTRAP pid1|self RLIMIT_X=soft:hard ...` from inside the working directory (it
# imports nothing beyond what the interpreter already loaded: json or traceback would double its start-up CPU):
# limits first (on the sandbox's init too, with `pid1`: bwrap starts it without any, and only the same
# uid, not the parent, may set them), then it waits for the program on stdin (a warm worker waits here), writes it to main.py
# (for tracebacks), installs the audit hook (an extra layer with clear messages, not the boundary) and runs
# the program in a fresh namespace with the bootstrap's own traceback frame hidden.
BOOTSTRAP = r"""
import os, resource, sys
PIDS = (1, 0) if sys.argv[1] == "pid1" else (0,)
for limit in sys.argv[2:]:
    name, values = limit.split("=")
    for pid in PIDS:
        resource.prlimit(pid, getattr(resource, name), tuple(map(int, values.split(":"))))
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
