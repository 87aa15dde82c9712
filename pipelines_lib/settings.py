"""Process settings: what an entry point reads from the environment, once, and passes down.

The campaign config (``CampaignConfig``) says what a campaign computes and travels with it in ``campaign.json``;
``Settings`` say how *this process* reaches the outside world: storage timeouts, the Orbax deadline, the local
cache. Each entry point (the ``rollstream`` CLI, the flows, a stage process) does, before anything imports gcsfs
or Prefect::

    apply_process_defaults(os.environ)          # third-party libraries' variables (explicit values win)
    settings = Settings.from_env(os.environ)    # ROLLSTREAM_* knobs; a bad value names its variable
    store = settings.store(url, storage_options)

and hands ``settings`` (or the ``Store`` it built) down. Nothing below the entry points reads ``os.environ``.

| variable                              | field                       | default |
|---------------------------------------|-----------------------------|---------|
| ``ROLLSTREAM_STORAGE_REQUEST_TIMEOUT_S`` | ``storage_request_timeout_s`` | 30      |
| ``ROLLSTREAM_STORAGE_DEADLINE_S``     | ``storage_deadline_s``      | 60      |
| ``ROLLSTREAM_ORBAX_DEADLINE_S``       | ``orbax_deadline_s``        | 600     |
| ``ROLLSTREAM_CACHE``                  | ``cache``                   | the checkout's ``build/`` |

``apply_process_defaults`` also turns on JAX's persistent compilation cache (``compilation_cache_dir``): a
second process compiling the same programs (an engine's warm-up, a trainer's step) loads them from disk.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines_lib.storage.retry import RetryPolicy
from pipelines_lib.storage.store import Store

PROCESS_DEFAULTS: Mapping[str, str] = {
    # Prefect's ephemeral API server starts slowly on a busy 2-core machine, near its own default wait (20 s).
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    # gcsfs probes for zonal buckets over gRPC (read when gcsfs is imported), which stalls for a minute or more against
    # emulators and private endpoints.
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
    # No phoning home: the only network a campaign uses is its storage.
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    # tensorstore (Orbax) sets no request timeout: a stalled GCS request would wait for TCP to give up.
    "TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS": "60",
    "TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES": "1",
    # transformers (the tokenizer's only use of it) warns at import that PyTorch is missing, which rollstream never
    # needs: one line in every stage's log that reads like a fault. Its "advisory" warnings are only such notes.
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}
"""Environment defaults of the libraries underneath (gcsfs, Prefect, tensorstore), set by every entry point."""

_DEFAULT_RETRY = RetryPolicy()


COMPILATION_CACHE_VAR = "ROLLSTREAM_COMPILATION_CACHE"
"""Folder of JAX's persistent compilation cache, or ``off``; see ``compilation_cache_dir``."""


def compilation_cache_dir(environ: Mapping[str, str]) -> str | None:
    """Where this process's JAX keeps compiled programs for later processes, or None for nowhere.

    An explicit ``JAX_COMPILATION_CACHE_DIR`` wins; else ``ROLLSTREAM_COMPILATION_CACHE`` (a folder, or
    ``off``); else ``$XDG_CACHE_HOME/rollstream/jax``, else ``~/.cache/rollstream/jax``: a folder the user
    owns, shared by every campaign on the machine, since compiled programs depend only on shapes, code and
    the XLA version (JAX keys its entries on all three)."""
    if environ.get("JAX_COMPILATION_CACHE_DIR", "").strip():
        return environ["JAX_COMPILATION_CACHE_DIR"]
    chosen = environ.get(COMPILATION_CACHE_VAR, "").strip()
    if chosen.lower() == "off":
        return None
    if chosen:
        return os.path.expanduser(chosen)
    home = environ.get("HOME") or os.path.expanduser("~")
    base = environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(home, ".cache")
    return os.path.join(base, "rollstream", "jax")


def apply_process_defaults(environ: MutableMapping[str, str]) -> None:
    """Set ``PROCESS_DEFAULTS`` that ``environ`` lacks, and ``JAX_COMPILATION_CACHE_DIR`` (from
    ``compilation_cache_dir``). Call it before gcsfs, Prefect or JAX is imported: each reads its settings from
    the environment once, at import; stage processes inherit them."""
    for key, value in PROCESS_DEFAULTS.items():
        environ.setdefault(key, value)
    cache = compilation_cache_dir(environ)
    if cache is not None:
        environ["JAX_COMPILATION_CACHE_DIR"] = cache


@dataclass(frozen=True, kw_only=True)
class Settings:
    """How this process reaches storage and where it caches; read once per entry point (``from_env``)."""

    storage_request_timeout_s: float = _DEFAULT_RETRY.request_timeout_s
    """``ROLLSTREAM_STORAGE_REQUEST_TIMEOUT_S``: longest one storage request may take before it counts as a
    transient timeout and is retried (an explicit ``requests_timeout`` storage option wins)."""
    storage_deadline_s: float = _DEFAULT_RETRY.deadline_s
    """``ROLLSTREAM_STORAGE_DEADLINE_S``: no retry of a storage operation starts after this many seconds, so an
    operation on unreachable storage fails within this plus one request timeout, naming the operation and URL."""
    orbax_deadline_s: float = 600.0
    """``ROLLSTREAM_ORBAX_DEADLINE_S``: longest an Orbax save or restore of weights or a checkpoint may take
    before the stage fails naming the operation and URL (tensorstore retries a stalled request for minutes)."""
    cache: Path = field(default_factory=lambda: Path(__file__).resolve().parents[1] / "build")
    """``ROLLSTREAM_CACHE``: folder of local caches (the default tokenizer is built there on first use)."""

    def __post_init__(self) -> None:
        for name in ("storage_request_timeout_s", "storage_deadline_s", "orbax_deadline_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not (value > 0 and math.isfinite(value)):
                raise ValueError(f"Settings.{name} ({ENV_VARS[name]}) must be a finite number of seconds > 0, "
                                 f"got {value!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        """The settings ``environ`` sets, defaults for the rest; a bad value raises ``ValueError`` naming it."""
        values: dict[str, Any] = {}
        for name, var in ENV_VARS.items():
            text = environ.get(var, "").strip()
            if not text:
                continue
            if name == "cache":
                values[name] = Path(text).expanduser()
                continue
            try:
                values[name] = float(text)
            except ValueError:
                raise ValueError(f"{var} must be a number of seconds, got {text!r}") from None
        return cls(**values)

    def retry(self) -> RetryPolicy:
        """The storage retry budget these settings give."""
        return dataclasses.replace(_DEFAULT_RETRY, deadline_s=self.storage_deadline_s,
                                   request_timeout_s=self.storage_request_timeout_s)

    def store(self, url: str, storage_options: Mapping[str, Any] | None = None) -> Store:
        """A ``Store`` at ``url`` with these settings' timeouts and deadlines."""
        return Store(url, storage_options=dict(storage_options or {}), retry=self.retry(),
                     external_deadline_s=self.orbax_deadline_s)

    @staticmethod
    def orbax_environment(url: str, storage_options: Mapping[str, Any] | None) -> dict[str, str]:
        """Variables that point Orbax's GCS clients at a ``gs://`` campaign's endpoint (empty for Google's own).

        Orbax writes through tensorstore (reads ``TENSORSTORE_GCS_HTTP_URL``) and etils' gcsfs (reads
        ``STORAGE_EMULATOR_HOST``); neither sees our storage options, so an entry point exports these, taken from
        the same options gcsfs gets, before a stage runs."""
        options = storage_options or {}
        endpoint = options.get("endpoint_url")
        if not (url.startswith(("gs://", "gcs://")) and endpoint):
            return {}
        env = {"TENSORSTORE_GCS_HTTP_URL": str(endpoint), "STORAGE_EMULATOR_HOST": str(endpoint)}
        if options.get("token") == "anon":
            env["GOOGLE_AUTH_TOKEN_FOR_TESTING"] = "anon"
        return env


DEFAULTS = Settings()
"""The settings of a process whose environment sets none of ``ENV_VARS`` (a REPL, a test calling a stage)."""

ENV_VARS: Mapping[str, str] = {
    "storage_request_timeout_s": "ROLLSTREAM_STORAGE_REQUEST_TIMEOUT_S",
    "storage_deadline_s": "ROLLSTREAM_STORAGE_DEADLINE_S",
    "orbax_deadline_s": "ROLLSTREAM_ORBAX_DEADLINE_S",
    "cache": "ROLLSTREAM_CACHE",
}
"""Settings field -> the environment variable that sets it."""


__all__ = ["COMPILATION_CACHE_VAR", "DEFAULTS", "ENV_VARS", "PROCESS_DEFAULTS", "Settings", "apply_process_defaults",
           "compilation_cache_dir"]
