"""Commands printed for a person to paste (``audit it: …``, ``run it with: …``): ``hint_command`` renders one.

A hint runs as printed from any directory of the same machine: it names the running ``rollstream`` by its absolute
path (the console script this process was started as, else this interpreter with ``-m pipelines_lib.cli``, with
``env PYTHONPATH=<checkout>`` before it when the package is not installed: a checkout used through ``PYTHONPATH``,
as on a TPU VM), the campaign by its absolute URL, and carries the storage options the user gave (``-o
endpoint_url=…``), without which a ``gs://`` campaign on another endpoint is unreachable. Every command a hint
names is built into ``pipelines_lib.cli``, so it is there wherever the hint was printed. A secret option (a token, key, password, credentials) is not
printed: its value becomes ``<secret>`` and ``secrets_note`` names the options to fill in.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import site
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from importlib.metadata import distributions
from pathlib import Path
from typing import Any

SECRET_KEY = re.compile(r"token|key|secret|password|passwd|credential|auth|session", re.IGNORECASE)
"""Storage option names whose value may be a credential."""
AUTH_METHODS = frozenset({"anon", "google_default", "cloud", "browser"})
"""gcsfs ``token`` values that name a way to authenticate rather than carry a credential: printed as given."""
PLACEHOLDER = "<secret>"
CHECKOUT = Path(os.path.abspath(__file__)).parents[1]
"""The folder this package is imported from (as named, links not followed): the first ``PYTHONPATH`` entry of a
checkout that is not installed."""


def storage_option_args(options: Mapping[str, Any] | None) -> list[str]:
    """``{"token": "anon"}`` -> ``["-o", "token=anon"]``: storage options as a command's arguments."""
    return [
        a
        for k, v in (options or {}).items()
        for a in ("-o", f"{k}={v if isinstance(v, str) else json.dumps(v)}")
    ]


def secret_options(options: Mapping[str, Any] | None) -> list[str]:
    """The names of the options in ``options`` whose values are not printed in a hint. A value may be any JSON
    (a service account's ``token`` is a mapping): only a string can name an auth method."""
    return [k for k, v in (options or {}).items()
            if SECRET_KEY.search(k) and not (isinstance(v, str) and v in AUTH_METHODS)]


def installed() -> bool:
    """Whether the ``rollstream`` distribution is installed in this interpreter's site-packages. Otherwise the
    package was found through ``PYTHONPATH`` or the current directory, which a pasted command does not carry (a
    checkout's own ``rollstream.egg-info``, left by an editable install into another interpreter, is no install)."""
    sites = [*site.getsitepackages(), site.getusersitepackages()]
    return any(True for _ in distributions(name="rollstream", path=sites))


def rollstream_command(argv0: str | None = None) -> list[str]:
    """The running ``rollstream`` as an absolute command line: its console script when this process is one
    (``argv0``, default ``sys.argv[0]``), else this interpreter running ``-m pipelines_lib.cli`` (``python -m
    flows.campaign``, a test, a REPL), given ``search_path()`` as ``PYTHONPATH`` when the package is not installed."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    if os.path.basename(argv0) == "rollstream" and os.path.isfile(argv0):
        return [os.path.abspath(argv0)]
    module = [os.path.abspath(sys.executable), "-m", "pipelines_lib.cli"]
    return module if installed() else ["env", f"PYTHONPATH={os.pathsep.join(search_path())}", *module]


def search_path() -> list[str]:
    """What a pasted command needs on ``PYTHONPATH`` to import what this process imports: ``CHECKOUT``, then the
    entries of ``sys.path`` before the standard library (where the interpreter put ``PYTHONPATH``: on a TPU VM
    also the folder ``scripts/tpu_setup.sh`` installed the library's needs into). The directory the process
    started from is left out: a hint runs from anywhere."""
    stdlib = {os.path.normpath(p) for p in (sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib"))}
    archive = f"python{sys.version_info.major}{sys.version_info.minor}.zip"
    out = [str(CHECKOUT)]
    for entry in sys.path[1:]:
        if os.path.basename(entry) == archive or os.path.normpath(entry) in stdlib:
            break
        if entry and os.path.abspath(entry) not in out:
            out.append(os.path.abspath(entry))
    return out


def hint_command(args: Sequence[str], options: Mapping[str, Any] | None = None) -> str:
    """``rollstream ARGS -o k=v …`` as one shell line that runs from any directory; ``args`` name the
    subcommand and its arguments (the campaign as an absolute URL: ``Store.url``). Secret options get
    ``PLACEHOLDER`` (``secrets_note`` says which)."""
    secrets = secret_options(options)
    shown = {k: PLACEHOLDER if k in secrets else v for k, v in (options or {}).items()}
    return shlex.join([*rollstream_command(), *args, *storage_option_args(shown)])


def secrets_note(options: Mapping[str, Any] | None) -> str | None:
    """The line to print under hints whose secret options were left out, or None when none were."""
    secrets = secret_options(options)
    if not secrets:
        return None
    return (
        f"secret storage options not printed: {', '.join(secrets)}; replace {PLACEHOLDER} in the commands "
        "above with your own"
    )


__all__ = ["CHECKOUT", "hint_command", "installed", "rollstream_command", "search_path", "secret_options",
           "secrets_note", "storage_option_args"]
