"""The vLLM server process ``VllmEngine`` launches and supervises: command line, environment, start-up probe,
stop.

```
VllmServer(config.engine.vllm, max_model_len, log_path)
  start(model_dir)   `python -m vllm.entrypoints.openai.api_server` from the configured virtualenv (default
                     ``.venv-vllm``, ``make vllm-venv``) on 127.0.0.1, in its own process group that gets SIGTERM
                     when this process dies; output to a log file; its own TMPDIR; then ``wait_healthy``.
                     Prefills are never split across steps (seeded sampling on a CPU build needs that)
  alive(), cause(), log_tail()    what the engine asks when a request fails: is the process running, the first
                     error it logged since it started (the root cause; the lines after it are its echoes)
  stop()             SIGTERM to the group, SIGKILL after a deadline; the TMPDIR removed
```

``VllmEngine`` (``vllm_engine``) talks to the server over HTTP and decides when to restart it; this module only
runs the process, so a server started by hand or as a sidecar (``engine.vllm.url``) needs nothing from it but
``command``'s flags: the worker extension in ``vllm_server/`` (``EXTENSION_DIR``) and ``VLLM_SERVER_DEV_MODE=1``
for the reload endpoints. The server's virtualenv has its own torch and no rollstream: nothing here is imported
there.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from pipelines_lib.engine.config import VllmConfig

EXTENSION_DIR = Path(__file__).resolve().parent / "vllm_server"
"""Put on the server's ``PYTHONPATH``: holds ``rollstream_vllm.WorkerExtension`` (and nothing that imports
rollstream, which the server's virtualenv does not have)."""
SERVED_NAME = "rollstream"
"""The model name requests use; it stays the same across reloads."""
PREFILL_TOKENS_PER_STEP = 2048
"""Least token budget of one scheduler step of a launched server (vLLM's own default for an API server on CPU);
raised to the model length, since every prompt is prefilled in one step (see ``VllmServer.command``)."""
_REPO_ROOT = Path(__file__).resolve().parents[2]
_ERROR_LINE = re.compile(r"\bERROR\b.*?\b((?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception): .*)$")
"""A line vLLM logs at level ERROR that names an exception (``... ERROR 12-05 18:10:23 [file.py:12] RuntimeError:
CPU Generator does not use offset``); the exception and its message are the group."""


def default_python() -> Path:
    """``<repository>/.venv-vllm/bin/python``, the virtualenv ``make vllm-venv`` creates."""
    return _REPO_ROOT / ".venv-vllm" / "bin" / "python"


def _own_group_dying_with_parent() -> None:
    """In the server's child process before exec: lead a process group (``stop`` signals the server and its
    engine processes together) and, on Linux, get SIGTERM when the worker dies, so a killed worker leaves no
    server behind."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, 15)  # PR_SET_PDEATHSIG, SIGTERM


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VllmServer:
    """One supervised vLLM server subprocess on 127.0.0.1."""

    def __init__(self, config: VllmConfig, *, max_model_len: int, log_path: Path,
                 log: Callable[[str], None] = print) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.log_path = log_path
        self.log = log
        self.port = config.port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_start = 0
        """Where the current life's output starts in the log (one log holds every restart's)."""
        self.scratch: str | None = None
        """The server's own TMPDIR (its IPC sockets and scratch files), removed when it stops."""
        self.model_dir: str | None = None
        """The HF folder whose weights the server holds now (kept current by the engine's reloads)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self, model_dir: str | Path) -> list[str]:
        python = Path(self.config.python) if self.config.python else default_python()
        # The checkpoint's own dtype: vLLM's "auto" runs float32 checkpoints in bfloat16 on CPU, which moves
        # logprobs by ~1e-2 against the trainer's.
        dtype = json.loads((Path(model_dir) / "config.json").read_text()).get("dtype") or "auto"
        return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                "--dtype", dtype,
                "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(self.port),
                "--max-model-len", str(self.max_model_len), "--max-num-seqs", str(self.config.max_num_seqs),
                # Every prompt (and every recompute of a preempted request) is prefilled in one step: vLLM throws
                # away the token sampled after a partial prefill and rewinds the request's seeded generator, which
                # the CPU build cannot do ("CPU Generator does not use offset" kills the engine, and every request
                # in flight with it). Without chunks the step budget must hold the longest sequence. A GPU build
                # can rewind: its ``extra_args`` may turn chunking back on (later flags win).
                "--no-enable-chunked-prefill", "--max-num-batched-tokens",
                str(max(PREFILL_TOKENS_PER_STEP, self.max_model_len, self.config.max_num_seqs)),
                "--logprobs-mode", "processed_logprobs",
                "--worker-extension-cls", "rollstream_vllm.WorkerExtension", "--seed", "0",
                *self.config.extra_args]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # The reload endpoints (/collective_rpc, /reset_prefix_cache) exist only in dev mode; the server listens on
        # 127.0.0.1 only, so nothing outside the worker's host (pod) reaches them.
        env["VLLM_SERVER_DEV_MODE"] = "1"
        env["VLLM_CPU_KVCACHE_SPACE"] = str(self.config.cpu_kv_cache_gib)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(EXTENSION_DIR), env.get("PYTHONPATH")) if p)
        if self.scratch:
            env["TMPDIR"] = self.scratch
        return env

    async def start(self, model_dir: str | Path) -> None:
        """Launch the server on ``model_dir`` and wait until it answers its health probe."""
        python = Path(self.command(model_dir)[0])
        if not python.exists():
            raise FileNotFoundError(f"vLLM interpreter {python} not found: run `make vllm-venv` or set "
                                    "engine.vllm.python (or engine.vllm.url for a running server)")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # vLLM leaves IPC sockets and scratch files in TMPDIR; a folder of its own keeps /tmp clean across restarts.
        self.scratch = self.scratch or tempfile.mkdtemp(prefix="rollstream-vllm-")
        with open(self.log_path, "ab") as out:
            self.log_start = out.tell()
            self.proc = subprocess.Popen(self.command(model_dir), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.environment(),
                                         preexec_fn=_own_group_dying_with_parent)
        self.log(f"vllm: started server pid {self.proc.pid} on {self.url} for {model_dir} (log {self.log_path})")
        await wait_healthy(self.url, self.config.startup_timeout_s, alive=self.alive, log_tail=self.log_tail)
        self.model_dir = str(model_dir)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _life_log(self) -> list[str]:
        if not self.log_path.exists():
            return []
        with open(self.log_path, "rb") as f:
            f.seek(self.log_start)
            return f.read().decode(errors="replace").splitlines()

    def cause(self) -> str:
        """The first exception logged at level ERROR since the last start, or ``""``."""
        return next((m.group(1) for line in self._life_log() if (m := _ERROR_LINE.search(line))), "")

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines logged since the last start."""
        return "\n".join(self._life_log()[-lines:])

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Terminate the server (and its engine-core children: it leads its own process group)."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)
            try:
                await asyncio.to_thread(proc.wait, timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                await asyncio.to_thread(proc.wait, timeout_s)
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None


async def wait_healthy(url: str, timeout_s: float, *, alive: Callable[[], bool] = lambda: True,
                       log_tail: Callable[[], str] = lambda: "", poll_s: float = 0.5) -> None:
    """Poll ``url/health`` until it answers 200; fail after ``timeout_s`` or when the process has died."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=5.0) as client:
        while True:
            if not alive():
                raise RuntimeError(f"vLLM server at {url} exited during startup; last log lines:\n{log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(f"{url}/health")).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"vLLM server at {url} not healthy after {timeout_s:.0f}s; last log lines:\n"
                                   f"{log_tail()}")
            await asyncio.sleep(poll_s)


__all__ = ["EXTENSION_DIR", "PREFILL_TOKENS_PER_STEP", "SERVED_NAME", "VllmServer", "default_python", "free_port",
           "wait_healthy"]
