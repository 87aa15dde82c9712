"""A fault-injecting HTTP proxy for storage drills: loopback only, bounded, in front of a GCS-API server.

gcsfs talks to it unchanged (``endpoint_url`` = the proxy's URL). Each request is forwarded to the upstream
server, except that a seeded share of them (``FaultPlan.rate``) gets one fault, drawn uniformly from
``FaultPlan.kinds``:

| kind | what the client sees | where the request went |
|---|---|---|
| ``429``/``500``/``503`` | that status with a JSON error body | nowhere (refused before the server) |
| ``reset`` | the upstream's status and headers, half the body, then a TCP reset | to the server: it took effect, the reply was lost |
| ``slow`` | the upstream's reply after ``slow_s`` | to the server |
| ``stall`` | nothing, until the client gives up (at most ``stall_s``) | nowhere |

``outage(True)`` starts a full outage window: every request is answered as ``FaultPlan.outage_kind`` (``503``
or ``stall``) until ``outage(False)``. One request per connection (``Connection: close``), at most
``max_connections`` handled at once, every socket with a timeout: the proxy itself never hangs a test.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import struct
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

FAULT_KINDS = ("429", "500", "503", "reset", "slow", "stall")
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
               "content-length", "host"}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    dropped = 0
    """Connections that ended in a socket error, almost always a client that gave up (its own timeout) mid-reply."""

    def handle_error(self, request: object, client_address: object) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            self.dropped += 1  # expected under faults: counted, not printed
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class FaultPlan:
    rate: float = 0.05
    """Share of requests that get a fault."""
    kinds: tuple[str, ...] = FAULT_KINDS
    slow_s: float = 0.3
    stall_s: float = 10.0
    """Longest a stalled request is held (the client normally gives up first)."""
    outage_kind: str = "stall"
    seed: int = 0
    max_connections: int = 64

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"FaultPlan.rate must be in [0, 1], got {self.rate}")
        bad = [k for k in (*self.kinds, self.outage_kind) if k not in FAULT_KINDS]
        if bad or not self.kinds:
            raise ValueError(f"FaultPlan kinds must be among {FAULT_KINDS}, got {bad or self.kinds}")
        if self.slow_s < 0 or self.stall_s <= 0 or self.max_connections < 1:
            raise ValueError(f"FaultPlan slow_s/stall_s/max_connections out of range: {self.slow_s}/{self.stall_s}/"
                             f"{self.max_connections}")


class FaultProxy:
    """``with FaultProxy(upstream_url, plan) as proxy: ... proxy.url ...``; counts requests and faults."""

    def __init__(self, upstream: str, plan: FaultPlan = FaultPlan()) -> None:
        parts = urlsplit(upstream)
        if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"FaultProxy forwards to loopback servers only, got {upstream!r}")
        self.upstream = (parts.hostname, parts.port or 80)
        self.plan = plan
        self.requests = 0
        self.faults: Counter[str] = Counter()
        self.clients: Counter[str] = Counter()
        """Requests by client library (the User-Agent's first word: gcsfs's python, tensorstore's curl, ...)."""
        self._rng = random.Random(plan.seed)
        self._lock = threading.Lock()
        self._outage = False
        self._slots = threading.BoundedSemaphore(plan.max_connections)
        self._closing = threading.Event()
        self._server = _Server(("127.0.0.1", 0), self._handler_class())
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def dropped(self) -> int:
        """Connections that ended in a socket error (clients that gave up mid-reply)."""
        return self._server.dropped

    def outage(self, on: bool) -> None:
        with self._lock:
            self._outage = on

    def __enter__(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _decide(self, user_agent: str) -> str | None:
        with self._lock:
            self.requests += 1
            self.clients[(user_agent.split() or ["-"])[0].split("/")[0]] += 1
            if self._outage:
                kind: str | None = self.plan.outage_kind
            elif self._rng.random() < self.plan.rate:
                kind = self._rng.choice(self.plan.kinds)
            else:
                kind = None
            if kind is not None:
                self.faults[kind] += 1
            return kind

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 30  # socket timeout of every read and write on the client side

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
                return  # quiet: drills count requests instead

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = bytearray()
                    while (size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)) > 0:
                        out += self.rfile.read(size)
                        self.rfile.readline()
                    while self.rfile.readline().strip():
                        pass
                    return bytes(out)
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes, *, length: int | None = None,
                       send: bytes | None = None) -> None:
                self.send_response_only(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body) if length is None else length))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body if send is None else send)
                self.wfile.flush()
                self.close_connection = True

            def _stall(self) -> None:
                # Hold the request unanswered until the client hangs up (or stall_s passes); never forward it.
                deadline = time.monotonic() + proxy.plan.stall_s
                self.connection.settimeout(0.05)
                while time.monotonic() < deadline and not proxy._closing.is_set():
                    try:
                        if self.connection.recv(1, socket.MSG_PEEK) == b"":
                            break
                    except TimeoutError:
                        continue
                    except OSError:
                        break
                self.close_connection = True

            def _handle(self) -> None:
                if not proxy._slots.acquire(timeout=30):
                    self._reply(503, [("Content-Type", "application/json")], b'{"error": {"code": 503}}')
                    return
                try:
                    self._forward()
                finally:
                    proxy._slots.release()

            def _forward(self) -> None:
                body = self._body()
                fault = proxy._decide(self.headers.get("User-Agent", ""))
                if fault in ("429", "500", "503"):
                    err = json.dumps({"error": {"code": int(fault), "message": f"injected fault {fault}"}}).encode()
                    self._reply(int(fault), [("Content-Type", "application/json")], err)
                    return
                if fault == "stall":
                    self._stall()
                    return
                if fault == "slow":
                    time.sleep(proxy.plan.slow_s)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=30)
                try:
                    conn.request(self.command, self.path, body=body if body or self.command in ("POST", "PUT")
                                 else None, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    out_headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
                    length = int(resp.getheader("Content-Length") or 0) if self.command == "HEAD" else None
                    status = resp.status
                finally:
                    conn.close()
                if fault == "reset":
                    self._reply(status, out_headers, data, send=data[: len(data) // 2])
                    # SO_LINGER 0: close() sends a RST instead of a FIN, a reset in the middle of the body.
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                self._reply(status, out_headers, b"" if self.command == "HEAD" else data, length=length)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle

        return Handler


__all__ = ["FAULT_KINDS", "FaultPlan", "FaultProxy"]
