"""The vLLM backend of the ``Engine`` protocol: a vLLM OpenAI-compatible server, driven over HTTP.

```
VllmEngine(config.engine.vllm, model_dir=<HF folder of version v>, policy_version=v)
  launched (url: null)    VllmServer (``vllm_supervisor``): `python -m vllm.entrypoints.openai.api_server` from
                          the configured virtualenv on 127.0.0.1, log to a file, /health probe with a deadline;
                          this engine restarts it (from the version it last served) when it dies, up to
                          max_restarts times
  connected (url: ...)    an existing server (a sidecar in the same pod); nothing to launch or restart
generate(ids, sampling)   POST /v1/completions {prompt: ids, return_token_ids, logprobs: 0, stop_token_ids}
swap_weights(folder, v)   -> awaitable: close the gate to new requests, drain (finish) or abort in-flight ones,
                          /pause, /collective_rpc rollstream_reload(folder), /reset_prefix_cache, /resume
```

Strict token-in/token-out: the prompt goes over as ids and the completion comes back as ids
(``return_token_ids``), never through text. The server runs with ``--logprobs-mode processed_logprobs``, so a
token's logprob is taken from the distribution it was sampled from (after temperature, top-k and top-p), as the
trainer's off-policy correction expects; a greedy request reports the unscaled log-softmax (as ``JaxEngine``
does). Only the request's ``stop_ids`` end a generation (the model's own EOS is ignored), and the stop id is
part of the output.

Versions: every request records the version loaded when it was sent. A reload first closes a gate that new
requests wait at, then waits until no request is in flight (``finish``), or aborts them on the server
(``abort``: the server answers with the tokens produced so far, and the request continues from there on the new
weights). So no request ever runs across a reload and each token carries the version that produced it. A
reload that fails reloads the previous folder and keeps its version (the worker log and
``stats()["reload_failures"]`` say so); that version is retried after ``reload_retry_s``.

Failures: a request the server cannot answer (connection refused or reset, HTTP 5xx, past
``request_timeout_s``) raises ``EngineUnavailableError``, which the episode runner records as ``engine_error``;
a failed request of a launched server closes the same gate while the server is checked (its process, its
health probe) and, found dead, restarted once, from the version it last served, while other episodes wait; after
``max_restarts`` restarts the next death (or a failed restart) stops the engine: every request raises a
``RuntimeError`` naming the first error the server logged, which stops the rollout.

The reload goes through the worker extension in ``vllm_server/rollstream_vllm.py`` (why: see there), which
the launched server loads with ``--worker-extension-cls``; a connected server must be started with the same
flags (``VllmServer.command`` shows them; infra/ has the pod templates). The reload endpoints need
``VLLM_SERVER_DEV_MODE=1``: keep the port reachable only inside the pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from pipelines_lib import telemetry
from pipelines_lib.engine.api import Completion, EngineUnavailableError, SamplingParams
from pipelines_lib.engine.config import VllmConfig
from pipelines_lib.engine.vllm_supervisor import SERVED_NAME, VllmServer, wait_healthy

DEATH_SETTLE_S = 5.0
"""How long a launched server whose request failed gets to answer its health probe before it is taken for dead."""


class VllmEngine:
    """``Engine`` over a vLLM server (see the module docstring). Use as ``async with``."""

    def __init__(self, config: VllmConfig, *, model_dir: str | Path, policy_version: int, max_seq_len: int,
                 log_path: Path | None = None, server: VllmServer | None = None, log: Callable[[str], None] = print,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        """``server``: supervise this (possibly running) server instead of launching one; it is left running on
        exit. Otherwise ``config.url`` connects to a server, and without it one is launched (and stopped on exit)."""
        self.config = config
        self._model_dir = str(model_dir)
        self._version = policy_version
        self._max_seq_len = max_seq_len
        self.log = log
        self._clock = clock
        self._owns_server = server is None and config.url is None
        if self._owns_server:
            server = VllmServer(config, max_model_len=max_seq_len, log_path=log_path or Path("vllm-server.log"),
                                log=log)
        self.server = server
        self._url = self.server.url if self.server is not None else str(config.url).rstrip("/")
        self._client: httpx.AsyncClient | None = None
        self._open = asyncio.Event()  # the gate: set while nothing holds it closed (``_close``)
        self._closed_by: set[str] = {"start"}
        self._idle = asyncio.Event()  # set while no request is in flight
        self._in_flight = 0
        self._reload_lock = asyncio.Lock()
        self._restart: asyncio.Task | None = None
        self._fatal: BaseException | None = None
        self._retry_after: dict[int, float] = {}
        self._busy_since: float | None = None
        self._counters: dict[str, float] = dict.fromkeys(
            ("requests", "generated_tokens", "prompt_tokens", "busy_s", "weight_syncs", "weight_sync_s",
             "weight_sync_max_s", "reload_failures", "aborted_requests", "restarts", "failed_requests"), 0.0)
        self._window_start = clock()

    # -- lifecycle -----------------------------------------------------------------------------------------
    async def __aenter__(self) -> VllmEngine:
        # Idle connections are dropped before the server's own keep-alive timeout (uvicorn: 5 s) closes them:
        # reusing one the server has just closed fails the request with a ReadError.
        self._client = httpx.AsyncClient(base_url=self._url, timeout=self.config.request_timeout_s,
                                         limits=httpx.Limits(max_connections=None, max_keepalive_connections=256,
                                                             keepalive_expiry=2.0))
        self._idle.set()
        if self.server is not None and not self.server.alive():
            await self.server.start(self._model_dir)
        else:
            await wait_healthy(self._url, self.config.startup_timeout_s)
        if self.server is None or self.server.model_dir != self._model_dir:  # not launched by us: load ours
            await asyncio.wait_for(self._sync(self._model_dir, self._version, initial=True),
                                   self.config.reload_timeout_s)
        self._reopen("start")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._restart is not None:
            self._restart.cancel()
            with contextlib.suppress(BaseException):
                await self._restart
        if self._client is not None:
            await self._client.aclose()
        if self.server is not None and self._owns_server:
            await self.server.stop()

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def max_seq_len(self) -> int:
        return self._max_seq_len

    @property
    def model_dir(self) -> str:
        """The HF folder of the weights being served."""
        return self._model_dir

    # -- generation ----------------------------------------------------------------------------------------
    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Completion:
        prompt = [int(t) for t in prompt_ids]
        room = self._max_seq_len - len(prompt)
        if room <= 0:
            return Completion(token_ids=[], logprobs=[], policy_versions=[], finish_reason="context")
        budget = min(sampling.max_new_tokens, room)
        tokens: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        t0 = self._clock()
        while True:
            await self._wait_open()
            version = self._version
            choice = await self._complete(prompt + tokens, sampling, budget - len(tokens), len(tokens))
            ids = [int(t) for t in choice["token_ids"]]
            tokens += ids
            logprobs += [float(lp) for lp in choice["logprobs"]["token_logprobs"]]
            versions += [version] * len(ids)
            reason = choice["finish_reason"]
            if reason != "abort" or len(tokens) >= budget:
                break
            self._counters["aborted_requests"] += 1  # stopped by a reload: continue on the new weights
        if tokens and tokens[-1] in sampling.stop_ids:
            finish = "stop"
        else:
            finish = "length" if len(tokens) >= sampling.max_new_tokens else "context"
        return Completion(token_ids=tokens, logprobs=logprobs, policy_versions=versions, finish_reason=finish,
                          timings={"generate_s": self._clock() - t0})

    async def _complete(self, prompt: list[int], sampling: SamplingParams, max_tokens: int,
                        done: int) -> dict[str, Any]:
        body = {
            "model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k or -1,
            # A continuation after an abort must not replay the first part's random stream.
            "seed": sampling.seed + done, "logprobs": 0, "return_token_ids": True,
            "stop_token_ids": list(sampling.stop_ids), "ignore_eos": True, "skip_special_tokens": False,
        }
        self._enter()
        try:
            response = await self._client.post("/v1/completions", json=body)
        except (httpx.TransportError, httpx.TimeoutException) as err:
            self._counters["failed_requests"] += 1
            await self._on_failure()
            raise EngineUnavailableError(f"vLLM server at {self._url}: {type(err).__name__}: {err}") from err
        finally:
            self._leave()
        if response.status_code >= 500:
            self._counters["failed_requests"] += 1
            await self._on_failure()
            raise EngineUnavailableError(f"vLLM server at {self._url}: HTTP {response.status_code}: "
                                         f"{response.text[:500]}")
        if response.status_code != 200:  # a request this client should never make
            raise RuntimeError(f"vLLM server at {self._url} refused a completion request: HTTP "
                               f"{response.status_code}: {response.text[:500]}")
        choice = response.json()["choices"][0]
        self._counters["requests"] += 1
        self._counters["prompt_tokens"] += len(prompt)
        self._counters["generated_tokens"] += len(choice["token_ids"])
        return choice

    def _enter(self) -> None:
        if self._in_flight == 0:
            self._busy_since = self._clock()
        self._in_flight += 1
        self._idle.clear()

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._counters["busy_s"] += self._clock() - (self._busy_since or self._clock())
            self._busy_since = None
            self._idle.set()

    async def _wait_open(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        try:
            async with asyncio.timeout(self.config.startup_timeout_s + self.config.reload_timeout_s):
                # A loop, not one wait: the gate may close again between being opened and this task resuming. From
                # the last check until the request is counted in flight nothing yields, so no request starts
                # while the gate is closed.
                while not self._open.is_set():
                    await self._open.wait()
        except TimeoutError:
            raise EngineUnavailableError(f"vLLM server at {self._url}: still reloading or restarting") from None
        if self._fatal is not None:
            raise self._fatal
        if self.server is not None and not self.server.alive():
            await self._on_failure()
            raise EngineUnavailableError(f"vLLM server at {self._url} is not running (restarting it)")

    # -- supervision ---------------------------------------------------------------------------------------
    async def _on_failure(self) -> None:
        """A request failed: check the launched server (once, whoever notices first), behind the closed gate, so
        that requests wait for the verdict instead of failing one after another against a dead server. Once the
        engine is stopped (``_fatal``) nothing is checked or restarted again: a request that was in flight when the
        verdict came would otherwise start another life of a server that was given up on."""
        if self.server is None or self._fatal is not None or (self._restart is not None and not self._restart.done()):
            return
        self._close("server check")
        self._restart = asyncio.get_running_loop().create_task(self._check_server())

    async def _check_server(self) -> None:
        """Restart the launched server if it is dead: its process has exited, or it has not answered its health
        probe within ``DEATH_SETTLE_S`` (after its engine dies vLLM's API process answers 500 and 503 for a while
        before it exits, and never exits with ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH``). A death after
        ``max_restarts`` restarts, or a restart that fails, is fatal: every request from then on raises it."""
        assert self.server is not None
        try:
            with contextlib.suppress(RuntimeError, TimeoutError):
                await wait_healthy(self._url, DEATH_SETTLE_S, alive=self.server.alive, poll_s=0.2)
                return  # alive: that request failed for a reason of its own
            cause = self.server.cause() or "no error logged"
            done = int(self._counters["restarts"])
            if done >= self.config.max_restarts:
                self._fatal = RuntimeError(
                    f"vLLM server at {self._url} died again after {done} restarts (engine.vllm.max_restarts), "
                    f"first error of its last run: {cause}; last log lines ({self.server.log_path}):\n"
                    f"{self.server.log_tail()}")
                return
            self._counters["restarts"] += 1
            self.log(f"vllm: server at {self._url} died ({cause}); restarting it on v{self._version} "
                     f"(restart {done + 1} of at most {self.config.max_restarts})")
            with telemetry.span("engine_restart", track="weights", version=self._version):
                await self.server.stop()
                await self.server.start(self._model_dir)
        except Exception as err:  # noqa: BLE001 - every waiting request must see it
            self._fatal = RuntimeError(f"vLLM server at {self._url} died and could not be restarted: {err}")
            self._fatal.__cause__ = err
        finally:
            self._reopen("server check")

    def _close(self, why: str) -> None:
        """Close the gate for ``why``; it opens when every reason has been withdrawn (a server check that ends
        during a reload must not let requests in before the reload is done, nor the other way round)."""
        self._closed_by.add(why)
        self._open.clear()

    def _reopen(self, why: str) -> None:
        self._closed_by.discard(why)
        if not self._closed_by:
            self._open.set()

    # -- weights -------------------------------------------------------------------------------------------
    def swap_weights(self, params: Any, version: int) -> asyncio.Task:
        """Reload the server from the HF folder ``params`` as ``version``; await the returned task."""
        return asyncio.get_running_loop().create_task(self._reload(str(params), version))

    async def _reload(self, folder: str, version: int) -> None:
        async with self._reload_lock:
            if version <= self._version:
                return
            wait = self._retry_after.get(version, 0.0) - self._clock()
            if wait > 0:  # this version failed to load recently; do not hammer the server with it
                await asyncio.sleep(wait)
            self._close("reload")
            t0 = self._clock()
            try:
                with telemetry.span("weight_sync", track="weights", version=version):
                    await asyncio.wait_for(self._sync(folder, version), self.config.reload_timeout_s)
            finally:
                self._reopen("reload")
            took = self._clock() - t0
            self._counters["weight_sync_s"] += took
            self._counters["weight_sync_max_s"] = max(self._counters["weight_sync_max_s"], took)

    async def _sync(self, folder: str, version: int, *, initial: bool = False) -> None:
        if initial:
            await self._post("/collective_rpc", json={"method": "rollstream_reload", "args": [folder]})
            if self.server is not None:
                self.server.model_dir = folder
            await self._post("/reset_prefix_cache")
            return
        if self.config.in_flight_on_reload == "abort":
            await self._post("/pause", params={"mode": "abort"})
            # A request that reached the server after the pause is held there, not aborted: abort again until every
            # request this engine sent has come back.
            while not self._idle.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._idle.wait(), 0.2)
                if not self._idle.is_set():
                    await self._post("/abort_requests", json={})
        await self._idle.wait()
        if self.config.in_flight_on_reload == "finish":
            await self._post("/pause", params={"mode": "wait"})
        try:
            await self._post("/collective_rpc", json={"method": "rollstream_reload", "args": [folder]})
        except (httpx.HTTPError, RuntimeError) as err:
            self._counters["reload_failures"] += 1
            self._retry_after[version] = self._clock() + self.config.reload_retry_s
            self.log(f"vllm: reload to v{version} from {folder} failed ({err}); keeping v{self._version}")
            telemetry.count("engine.reload_failures")
            # A reload that failed half-way may have replaced some tensors: load the old version again.
            await self._post("/collective_rpc", json={"method": "rollstream_reload", "args": [self._model_dir]})
        else:
            self._version, self._model_dir = version, folder
            if self.server is not None:
                self.server.model_dir = folder
            self._counters["weight_syncs"] += 1
        await self._post("/reset_prefix_cache")
        await self._post("/resume")

    async def _post(self, path: str, **kwargs: Any) -> httpx.Response:
        """A control call (idempotent); retried on a reset connection: after an error answer the server may close
        the kept-alive connection the next call would have used."""
        for attempt in range(3):
            try:
                response = await self._client.post(path, timeout=self.config.reload_timeout_s, **kwargs)
                break
            except (httpx.ReadError, httpx.RemoteProtocolError):
                if attempt == 2:
                    raise
        if response.status_code != 200:
            raise RuntimeError(f"vLLM server at {self._url}: POST {path} answered HTTP {response.status_code}: "
                               f"{response.text[:1000]}")
        return response

    # -- measurement ---------------------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """Counters since construction or ``reset_stats()``.

        busy_s: time with at least one request in flight (the server's view is not visible from here);
        weight_sync_s / weight_sync_max_s: total and longest gate-closed time of the reloads; the rest count
        requests, tokens, aborted (continued) requests, failed requests, restarts and failed reloads.
        """
        c = dict(self._counters)
        if self._busy_since is not None:
            c["busy_s"] += self._clock() - self._busy_since
        wall = self._clock() - self._window_start
        return {**c, "wall_s": wall, "busy_fraction": c["busy_s"] / wall if wall > 0 else 0.0,
                "tokens_per_s": c["generated_tokens"] / wall if wall > 0 else 0.0}

    def reset_stats(self) -> None:
        self._counters = dict.fromkeys(self._counters, 0.0)
        self._busy_since = self._clock() if self._in_flight else None
        self._window_start = self._clock()


__all__ = ["VllmEngine"]
