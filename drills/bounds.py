"""Bounded everything: inputs and endpoints that used to hang a command or take minutes, each run under a deadline.

Every case is a fresh process (so a hang can be killed and a traceback seen), watched until it ends or its
deadline passes. Three kinds:

| kind | what | passes when |
|---|---|---|
| ``url`` | ``rollstream audit/status/export/metrics/trace`` and ``python -m flows.recover`` with a ``BlackHole`` (accepts, never answers) as gcsfs's ``endpoint_url`` | it ends before its deadline; a CLI command exits 2 with one line naming the operation and URL, no traceback |
| ``parser`` | the floods and huge integers that once took a minute or raised | every parser returns (never raises) |
| ``config`` | the alias bomb, a non-UTF-8 file, duplicate keys, ``.nan``/``.inf``/out-of-range values | ``ConfigError`` naming the file |

The full drill gives the URL cases the settings every user gets (``Settings()``: 30 s per request, 60 s per
operation), so ``reliability.blackhole_fail_s`` is what a user waits; ``quick`` sets 1 s / 2 s through the same
``ROLLSTREAM_*`` variables. Figures: ``reliability.hangs`` (cases past their deadline) and
``reliability.cli_tracebacks`` (CLI cases with a traceback or without the one-line error): ``drills/runner.py`` adds
them to the same figures of other drills.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from drills.blackhole import BlackHole
from drills.fuzz import CONFIG_BOMB
from pipelines_lib.hints import storage_option_args
from pipelines_lib.settings import DEFAULTS, ENV_VARS, Settings

ROOT = Path(__file__).resolve().parents[1]
QUICK = Settings(storage_request_timeout_s=1.0, storage_deadline_s=2.0)
STARTUP_S = 60.0
"""Slack for interpreter start and imports on a loaded 2-core machine (Prefect's ephemeral server: three times)."""
CLI_COMMANDS = (("audit",), ("status",), ("metrics",), ("trace", "--out", "{scratch}/trace.json"),
                ("export", "{scratch}/export"))
CAMPAIGN = "gs://blackhole-bucket/campaigns/c1"

_PARSER_CASE = """
import sys
from pipelines_lib.agents.parsers import PARSER_REGISTRY, make_parser
tools = {"calculator": {"type": "object", "properties": {"expression": {"type": "string"}}}}
text = sys.stdin.read()
for name in PARSER_REGISTRY:
    make_parser(name).parse(text, tools)
print("parsed")
"""

_CONFIG_CASE = """
import sys
from pipelines_lib.config import CampaignConfig, ConfigError
try:
    CampaignConfig.from_yaml(sys.argv[1])
    print("LOADED")
except ConfigError as e:
    print("refused:", e)
"""

PARSER_FLOODS: dict[str, str] = {
    "hermes_unclosed_tags_20k": "<tool_call>" * 20_000,
    "hermes_unclosed_objects_20k": "<tool_call>{" * 20_000 + "</tool_call>",
    "hermes_int_5000_digits": '<tool_call>{"name": "calculator", "arguments": {"expression": ' + "9" * 5_000 + "}}"
                              "</tool_call>",
    "llama3_int_5000_digits": '{"name": "calculator", "parameters": {"k": -' + "9" * 5_000 + "}}",
    "llama3_calls_5000": "; ".join(['{"name": "calculator", "parameters": {"expression": "1"}}'] * 5_000),
    "gemma_calls_5000": "```tool_code\n" + "calculator(expression='1')\n" * 5_000 + "```",
    "gemma_list_2000": "[" + ", ".join(["calculator(expression='1')"] * 2_000) + "]",
    "gemma_unclosed_fences_20k": "```tool_code\n" * 20_000,
}
CONFIG_FILES: dict[str, bytes] = {
    "alias_bomb": CONFIG_BOMB.encode(),
    "not_utf8": "workers: 2 # caf\xe9\n".encode("latin-1"),
    "duplicate_keys": b"workers: 2\nworkers: 3\n",
    "temperature_nan": b"rollout:\n  temperature: .nan\n",
    "lr_1e999": b"trainer:\n  optim:\n    lr: 1e999\n",
    "group_size_1": b"rollout:\n  group_size: 1\n",
    "max_concurrency_4e11": b"rollout:\n  max_concurrency: 400000000000\n",
    "num_slots_1e9": b"engine:\n  num_slots: 1000000000\n",
    "data_timeout_inf": b"trainer:\n  data_timeout_s: .inf\n",
    "int_5000_digits": b"workers: " + b"9" * 5_000 + b"\n",
}


@dataclass(frozen=True, kw_only=True)
class BoundsCase:
    name: str
    kind: str
    """``url``, ``parser`` or ``config``."""
    deadline_s: float
    seconds: float
    exit_code: int | None
    """None: still running at the deadline (a hang), then killed."""
    ok: bool
    traceback: bool
    detail: str
    """The last line of the case's output (its error, for the URL and config cases)."""

    @property
    def hung(self) -> bool:
        return self.exit_code is None


@dataclass(frozen=True)
class _Started:
    name: str
    kind: str
    proc: subprocess.Popen[bytes]
    deadline_s: float
    started: float
    check: Any  # (exit_code, stdout, stderr) -> bool
    out: Path
    """Folder of the case's ``stdout``/``stderr`` files (files, not pipes: a full pipe would stall a case)."""


def _env(settings: Settings) -> dict[str, str]:
    """The drill's environment with ``settings`` as a user sets them (explicitly, even the defaults)."""
    values = {"storage_request_timeout_s": settings.storage_request_timeout_s,
              "storage_deadline_s": settings.storage_deadline_s}
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
            **{ENV_VARS[k]: str(v) for k, v in values.items()}}


def _start(name: str, kind: str, argv: list[str], *, scratch: Path, env: dict[str, str], deadline_s: float,
           check: Any, stdin: str | None = None, prefect_home: Path | None = None) -> _Started:
    if prefect_home is not None:
        env = {**env, "PREFECT_HOME": str(prefect_home)}
    folder = scratch / name
    folder.mkdir(parents=True)
    (folder / "stdin").write_text(stdin or "")
    with open(folder / "stdin", "rb") as i, open(folder / "stdout", "wb") as o, open(folder / "stderr", "wb") as e:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=i, stdout=o, stderr=e, start_new_session=True)
    return _Started(name, kind, proc, deadline_s, time.monotonic(), check, folder)


def _finish(case: _Started) -> BoundsCase:
    try:
        case.proc.wait(timeout=max(0.0, case.deadline_s - (time.monotonic() - case.started)))
        code: int | None = case.proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(case.proc.pid, signal.SIGKILL)
        case.proc.wait(timeout=30)
        code = None
    out = (case.out / "stdout").read_text(errors="replace")
    err = (case.out / "stderr").read_text(errors="replace")
    seconds = round(time.monotonic() - case.started, 2)
    lines = [line for line in (err + out).splitlines() if line.strip()]
    # The last line naming the campaign (a flow's error among Prefect's log lines), else the last line.
    last = ([line for line in lines if CAMPAIGN in line] or lines or [""])[-1]
    return BoundsCase(name=case.name, kind=case.kind, deadline_s=case.deadline_s, seconds=seconds, exit_code=code,
                      ok=code is not None and bool(case.check(code, out, err)), detail=last[:400],
                      traceback=any(line.startswith("Traceback") for line in lines))


def run_bounds(scratch: Path | None = None, *, quick: bool = False) -> list[BoundsCase]:
    """The URL cases all at once (they mostly wait on the black hole), the parser and config cases one after the
    other meanwhile; each in its own process under its deadline. Returns them in start order."""
    scratch = scratch or Path(tempfile.mkdtemp(prefix="rollstream-bounds-"))
    settings = QUICK if quick else DEFAULTS
    env = _env(settings)
    url_deadline = settings.storage_deadline_s + settings.storage_request_timeout_s + STARTUP_S
    with BlackHole() as hole, ThreadPoolExecutor(len(CLI_COMMANDS) + 1) as waiting:
        options = ["-o", f"endpoint_url={hole.url}", "-o", "token=anon", "-o", "project=drill"]
        url_cases = []
        for command in CLI_COMMANDS:
            argv = [c.replace("{scratch}", str(scratch)) for c in command]

            def one_line(code: int, out: str, err: str, cmd: str = command[0]) -> bool:
                last = (err.strip().splitlines() or [""])[-1]
                return code == 2 and last.startswith(f"rollstream {cmd}: storage ") and CAMPAIGN in last

            url_cases.append(_start(f"cli_{command[0]}", "url", [sys.executable, "-m", "pipelines_lib.cli", argv[0],
                                                                 CAMPAIGN, *argv[1:], *options],
                                    scratch=scratch, env=env, deadline_s=url_deadline, check=one_line))
        storage = storage_option_args({"endpoint_url": hole.url, "token": "anon", "project": "drill"})
        url_cases.append(_start("flow_recover", "url", [sys.executable, "-m", "flows.recover", CAMPAIGN, *storage],
                                scratch=scratch, env=env, deadline_s=url_deadline + 2 * STARTUP_S,
                                prefect_home=scratch / "prefect",
                                check=lambda code, out, err: code != 0 and CAMPAIGN in err))
        ended = [waiting.submit(_finish, case) for case in url_cases]
        local = []
        for name, text in PARSER_FLOODS.items():
            local.append(_finish(_start(f"parser_{name}", "parser", [sys.executable, "-c", _PARSER_CASE],
                                        scratch=scratch, env=env, deadline_s=STARTUP_S, stdin=text,
                                        check=lambda code, out, err: code == 0 and out.split() == ["parsed"])))
        for name, data in CONFIG_FILES.items():
            path = scratch / f"{name}.yaml"
            path.write_bytes(data)
            local.append(_finish(_start(f"config_{name}", "config", [sys.executable, "-c", _CONFIG_CASE, str(path)],
                                        scratch=scratch, env=env, deadline_s=STARTUP_S,
                                        check=lambda code, out, err, p=str(path): code == 0 and out.startswith(
                                            f"refused: {p}: "))))
        return [*(f.result() for f in ended), *local]


def bounds_figures(cases: list[BoundsCase], *, quick: bool) -> tuple[dict[str, float], dict[str, Any]]:
    """``reliability.*`` figures and JSON details of ``run_bounds``'s cases."""
    cli = [c for c in cases if c.name.startswith("cli_")]
    figures = {
        "reliability.hangs": float(sum(c.hung for c in cases)),
        "reliability.cli_tracebacks": float(sum(c.traceback or not c.ok for c in cli)),
        "reliability.bounds_cases": float(len(cases)),
        "reliability.bounds_failed": float(sum(not c.ok for c in cases)),
    }
    if not quick:  # the settings every user gets: what a person at the terminal waits for
        figures["reliability.blackhole_fail_s"] = max(c.seconds for c in cli)
    settings = QUICK if quick else DEFAULTS
    return figures, {"settings": {"storage_request_timeout_s": settings.storage_request_timeout_s,
                                  "storage_deadline_s": settings.storage_deadline_s},
                     "cases": [{**asdict(c), "hung": c.hung} for c in cases]}


BOUNDS_MEASURED = {
    "reliability.hangs": "Cases still running at their deadline (killed): the bounds drill's black-hole endpoint, "
                         "parser-flood and config-bomb cases, plus any other drill's cases that count hangs.",
    "reliability.cli_tracebacks": "`rollstream` commands (audit, status, metrics, trace, export) against a "
                                  "black-hole endpoint that printed a traceback or did not exit 2 with one line "
                                  "naming the operation and URL; plus any other drill's CLI cases.",
    "reliability.bounds_cases": "Cases in the bounds drill: 5 CLI commands and `flows.recover` against a "
                                "black-hole endpoint, 8 parser floods and huge integers, 10 hostile config files.",
    "reliability.bounds_failed": "Bounds cases that ended without their expected answer (exit 2 naming op and URL; "
                                 "the parsers returning; `ConfigError` naming the file).",
    "reliability.blackhole_fail_s": "Seconds until the slowest of the five `rollstream` commands failed against an "
                                    "endpoint that accepts connections and never answers, with the settings every "
                                    "user gets (30 s per request, no retry after 60 s), process start included.",
}


def render_bounds_section(details: dict[str, Any]) -> list[str]:
    """RELIABILITY.md's "Bounds" section from ``bounds_figures``'s details (pure)."""
    s = details["settings"]
    out = ["## Bounds: black-hole endpoint, parser floods, hostile configs", "",
           f"Settings: {s['storage_request_timeout_s']:g} s per storage request, no retry after "
           f"{s['storage_deadline_s']:g} s.", "", "| case | seconds (deadline) | ended | as expected | last line |",
           "|---|---|---|---|---|"]
    for c in details["cases"]:
        detail = " ".join(str(c["detail"]).split())[:200].replace("|", "\\|").replace("`", "'")
        out.append(f"| {c['name']} | {c['seconds']} ({c['deadline_s']:g}) | {'**HUNG**' if c['hung'] else 'yes'} | "
                   f"{'yes' if c['ok'] else '**NO**'} | {detail} |")
    return [*out, ""]


__all__ = ["BOUNDS_MEASURED", "CONFIG_FILES", "PARSER_FLOODS", "BoundsCase", "bounds_figures",
           "render_bounds_section", "run_bounds"]
