"""A storage endpoint that accepts connections and never answers: the outage no retry fixes.

``BlackHole`` listens on 127.0.0.1 at a free port, accepts every connection and reads what the client sends, but
never writes a byte, so a client without a request timeout waits forever. Used by the bounds drill and its tests
as a gcsfs ``endpoint_url``. Accepted sockets are held open until ``close`` (a closed socket would be an answer).
"""

from __future__ import annotations

import socket
import threading
from types import TracebackType


class BlackHole:
    """``with BlackHole() as hole: ... hole.url ...``; ``connections`` counts what it swallowed."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0), backlog=128)
        self._server.settimeout(0.2)  # so the accept loop sees ``close`` promptly
        self._held: list[socket.socket] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="black-hole", daemon=True)
        self.connections = 0

    @property
    def url(self) -> str:
        host, port = self._server.getsockname()[:2]
        return f"http://{host}:{port}"

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            self._held.append(conn)

    def __enter__(self) -> BlackHole:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        self._server.close()
        for conn in self._held:
            conn.close()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


__all__ = ["BlackHole"]
