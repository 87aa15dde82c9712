"""The README as the entrance, and the commands it and the command reference show, each run by a test.

The README stays short (``README_MAX_LINES``), starts with ``make demo`` and ``make test`` (what CI runs), and links
every page of ``docs/``. ``readme_commands`` reads every ``rollstream`` command line in the code blocks of README.md
and docs/COMMANDS.md (``COMMAND_DOCS``): the subcommand and the flags it shows. ``commands_in_tests`` reads, from the tests' source, every command line a test runs: the argument lists
given to ``main``/``cli.main``, to a ``rollstream`` helper, or after ``-m pipelines_lib.cli`` (``flows.campaign``,
``flows.recover`` and ``flows.stages`` are ``run``, ``recover`` and ``stage``). Every subcommand and every flag the
README shows must be among them, or be in ``BELOW_THE_CLI``: a flag whose behaviour a named test pins through the
library call it maps to (checked to exist). The read-only commands also run here, on the demo campaign.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

from pipelines_lib.cli import build_parser, main
from pipelines_lib.storage.store import Store

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 300
COMMAND_DOCS = (ROOT / "README.md", ROOT / "docs" / "COMMANDS.md")
"""The documents whose ``rollstream`` command lines must each be run by a test: the entrance and the reference."""
MODULES = {"pipelines_lib.cli": None, "flows.campaign": "run", "flows.recover": "recover", "flows.stages": "stage"}
"""``python -m`` modules whose command line is ``rollstream``'s (None: the subcommand follows)."""
SHORT = {"-o": "--storage-option", "-v": "--verbose"}

BELOW_THE_CLI = {
    ("replay", "--dump"): "test_replay.py::test_replay_dump_holds_the_batch_with_per_token_terms",
    ("stage", "--worker-index"):
        "test_recovery_drills.py::test_recover_finishes_a_campaign_after_killed_trainer_and_worker_and_a_failed_evaluation",
    ("recover", "--use-deployments"):
        "test_flows_distributed.py::test_campaign_starts_every_stage_as_a_deployment_run_in_its_own_process",
}
"""README flags run below the command line: (command, flag) -> the test of the call they map to (``collect_flow``'s
``worker_index``; the ``Launcher`` with ``use_deployments`` that recover and run share; ``replay(dump=...)``)."""


def _subcommands() -> set[str]:
    return {*build_parser()._subparsers._group_actions[0].choices, "--version"}  # noqa: SLF001


def readme_commands(text: str) -> dict[str, set[str]]:
    """``{subcommand: flags}`` of every ``rollstream`` line in the README's shell and usage blocks."""
    commands: dict[str, set[str]] = {}
    for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
        if lang in ("yaml", "sql"):
            continue
        for line in body.splitlines():
            # A usage line's description starts after a wide gap; a shell comment after a '#'.
            for m in re.finditer(r"(?:^|[\s&;\"(])(?:\S*/)?rollstream\s+(--version|[a-z][a-z-]*)(.*?)(?=\s{3,}|#|$)",
                                 line):
                flags = re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", m.group(2))
                commands.setdefault(m.group(1), set()).update(flags)
    return commands


def _strings(node: ast.AST) -> list[str | None]:
    """The string constants of an argument (lists, tuples and starred parts flattened); None for anything else."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return [s for n in node.elts for s in _strings(n)]
    if isinstance(node, ast.Starred):
        return _strings(node.value)
    return [node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None]


def commands_in_tests(sources: dict[str, str], subcommands: set[str]) -> dict[str, set[str]]:
    """``{subcommand: flags}`` of every command line in the tests' source (see the module docstring)."""
    out: dict[str, set[str]] = {}
    for source in sources.values():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call):
                seq = [s for a in node.args for s in _strings(a)]
            elif isinstance(node, (ast.List, ast.Tuple)):
                seq = _strings(node)
            else:
                continue
            module = next((i for i, s in enumerate(seq) if s in MODULES), None)
            if module is not None:
                sub, rest = MODULES[seq[module]], seq[module + 1:]
                if sub is None:
                    sub, rest = (rest[0], rest[1:]) if rest else (None, [])
            else:
                while seq and seq[0] is None:  # a helper's leading non-string argument: _rollstream(env, "run", ...)
                    seq = seq[1:]
                if len(seq) < 2 and seq != ["--version"]:
                    continue
                sub, rest = seq[0], seq[1:]
            if sub in subcommands:
                flags = {SHORT.get(s, s).split("=")[0] for s in rest if s and s.startswith("-")}
                out.setdefault(sub, set()).update(flags)
    return out


def _test_sources() -> dict[str, str]:
    """The tests' source; of this file only its functions (the table above names commands that run elsewhere)."""
    sources = {p.name: p.read_text() for p in sorted((ROOT / "tests").glob("test_*.py"))}
    me = Path(__file__).name
    sources[me] = "\n".join(ast.get_source_segment(sources[me], node) or "" for node in ast.parse(sources[me]).body
                            if isinstance(node, ast.FunctionDef))
    return sources


def _command_docs() -> str:
    return "\n".join(doc.read_text() for doc in COMMAND_DOCS)


def test_the_readme_is_an_entrance_under_its_line_limit() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move a topic to docs/ (limit {README_MAX_LINES})"


def test_make_demo_and_make_test_are_the_readme_first_commands_and_ci_runs_make_test() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```bash\n(.*?)```", readme, re.S)
    assert first_block is not None, "README.md has no shell block"
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines() if line.strip()]
    assert commands[:2] == ["make demo", "make test"], commands
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert ci[-1] == "make test", ci


def readme_links(text: str) -> set[str]:
    """Repository paths the README links to: ``[text](path)``, anchors and web addresses left out."""
    return {m.split("#")[0] for m in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"\w+://|#", m)}


def test_every_page_of_docs_is_linked_from_the_readme() -> None:
    links = readme_links((ROOT / "README.md").read_text())
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages - links == set(), f"pages of docs/ the README does not link: {sorted(pages - links)}"
    assert [link for link in links if not (ROOT / link).exists()] == []


def test_the_link_scan_reads_paths_and_leaves_out_anchors_and_addresses() -> None:
    text = "[a](docs/A.md) [b](docs/B.md#part) [c](#contents) [d](https://example.com/x.md)"
    assert readme_links(text) == {"docs/A.md", "docs/B.md"}


def test_the_readme_names_the_commands_and_flags_it_shows() -> None:
    commands = readme_commands(_command_docs())
    assert {"run", "status", "recover", "deploy", "sql", "view", "audit", "--version"} <= set(commands)
    assert commands["run"] >= {"--preset", "--set", "--config", "--workers", "--use-deployments"}
    assert set(commands) <= _subcommands(), set(commands) - _subcommands()  # the README shows no stale command


def test_every_readme_command_and_flag_is_run_by_a_test() -> None:
    readme = readme_commands(_command_docs())
    sources = _test_sources()
    tested = commands_in_tests(sources, _subcommands())
    untested = {f"rollstream {sub} {flag}".rstrip() for sub, flags in readme.items()
                for flag in ["", *sorted(flags)]
                if sub not in tested or (flag and flag not in tested[sub] and (sub, flag) not in BELOW_THE_CLI)}
    assert not untested, sorted(untested)
    for (sub, flag), where in BELOW_THE_CLI.items():
        assert flag in readme.get(sub, set()) and flag not in tested.get(sub, set()), (sub, flag)  # no stale entry
        file, name = where.split("::")
        assert f"def {name}(" in sources[file], where


def test_the_scan_finds_command_lines_in_each_form_tests_write_them() -> None:
    source = '''
main(["audit", url, "--jobs", "2"])
_rollstream(env, "sql", url, "SELECT 1", "--json")
subprocess.run([sys.executable, "-m", "flows.recover", url, "-o", "token=anon"])
cases = [("trace", "{tmp}/x", "--until=5")]
'''
    found = commands_in_tests({"t.py": source}, _subcommands())
    assert found == {"audit": {"--jobs"}, "sql": {"--json"}, "recover": {"--storage-option"}, "trace": {"--until"}}


def test_the_readme_read_only_commands_on_a_campaign(demo_campaign: Store, tmp_path: Path, capsys) -> None:
    url = demo_campaign.url
    assert main(["audit", url, "--jobs", "2", "--keep"]) == 0
    assert "verdict: OK" in capsys.readouterr().out
    assert main(["audit", url, "--since", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert main(["export", url, str(tmp_path / "parquet"), "--jobs", "2"]) == 0
    assert sorted(p.name for p in (tmp_path / "parquet").iterdir())


def test_view_serve_serves_the_report_on_loopback(demo_campaign: Store) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "pipelines_lib.cli", "view", demo_campaign.url, "--serve",
                             "--port", "0", "--max-groups", "5"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(300, proc.kill)  # a server that never announces itself fails the test, not the suite
    watchdog.start()
    try:
        lines = []
        for line in proc.stderr:  # type: ignore[union-attr]
            lines.append(line)
            if "serving on " in line:
                break
        address = re.search(r"serving on (http://127\.0\.0\.1:\d+/)", "".join(lines))
        assert address, "".join(lines)
        with urllib.request.urlopen(address.group(1), timeout=30) as page:
            assert page.status == 200 and b"<html" in page.read(4096)
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C, as the command says
        _, err = proc.communicate(timeout=60)
        watchdog.cancel()
    assert proc.returncode == 0 and "Traceback" not in err, err


DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "RELIABILITY.md", *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "infra" / "README.md"]
REPO_DIRS = ("pipelines_lib", "flows", "tasks", "bench", "drills", "recipes", "tests", "docs", "infra", "scripts")
"""Top-level folders of the repository: a path starting with one is a repository path, not a campaign object's."""
FILE_NAME = re.compile(r"[\w-]+\.(py|md|ya?ml|toml|sh|cfg|json|txt)")


def _named_paths(doc: Path) -> list[str]:
    """Repository paths a document names in backticks: with a file extension (``stages/table.py``,
    ``prefect.yaml``) or under a top-level folder (``pipelines_lib/trajectory/``). Campaign objects
    (``train/DONE.json``) are told apart by the extension of the files the repository holds."""
    out = []
    for path in re.findall(r"`([\w.-]+(?:/[\w.-]+)*/?)`", doc.read_text()):
        last = path.rstrip("/").rsplit("/", 1)[-1]
        if FILE_NAME.fullmatch(last) and not last.endswith(".json") or path.split("/")[0] in REPO_DIRS and "/" in path:
            out.append(path)
    return out


def _exists(path: str, doc: Path) -> bool:
    """``path`` from the repository root, the library (``stages/resources.py``) or the document's folder; a bare
    file name anywhere in the repository."""
    name = path.rstrip("/")
    if "/" not in name:
        return any(".venv" not in p.parts for p in ROOT.rglob(name))
    return any((base / path).exists() for base in (ROOT, ROOT / "pipelines_lib", doc.parent))


def _layout_names(readme: str) -> list[str]:
    """The files and folders the README's Layout tree names: cells (split at wide gaps) made only of names
    ending in ``/`` or ``.py``, and ``*.py`` names inside its descriptions; under ``pipelines_lib/`` when
    indented."""
    block = re.search(r"## Layout\n\n```\n(.*?)```", readme, re.S).group(1)
    out = []
    for line in block.splitlines():
        base = "pipelines_lib/" if line.startswith("  ") else ""
        for cell in re.split(r"\s{2,}", line.strip()):
            parts = [p.strip() for p in cell.split(",")]
            if all(re.fullmatch(r"[\w-]+(/|\.py)", p) for p in parts):
                out += [base + p if p != "pipelines_lib/" else p for p in parts]
        out += [base + name for name in re.findall(r"[(+ ]([\w]+\.py)\b", line)]
    return out


def test_the_docs_name_only_paths_that_exist() -> None:
    missing = [f"{doc.relative_to(ROOT)}: {path}" for doc in DOCS for path in _named_paths(doc)
               if not _exists(path, doc)]
    assert missing == []


def test_the_readme_layout_names_only_paths_that_exist_and_every_library_package() -> None:
    names = _layout_names((ROOT / "README.md").read_text())
    assert "pipelines_lib/stages/" in names and "pipelines_lib/mesh.py" in names  # the scan reads the tree
    assert [n for n in names if not (ROOT / n).exists()] == []
    packages = {f"pipelines_lib/{p.name}/" for p in (ROOT / "pipelines_lib").iterdir()
                if (p / "__init__.py").exists()}
    assert packages - set(names) == set()


def _resolves(dotted: str) -> bool:
    """Whether ``pipelines_lib.a.b.c`` is a module, or an attribute path below the longest importable module."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_the_docs_name_only_library_modules_and_objects_that_exist() -> None:
    named = {(doc, name) for doc in DOCS for name in re.findall(r"`(pipelines_lib(?:\.\w+)+)", doc.read_text())}
    assert len(named) > 10  # the scan reads the docs
    assert sorted(f"{doc.relative_to(ROOT)}: {name}" for doc, name in named if not _resolves(name)) == []


def test_make_demo_runs_the_demo_preset_the_learning_benchmark_measures() -> None:
    # The learning figures the README quotes for `make demo` are the benchmark's, which runs DEMO_PRESET: the
    # Makefile's demo command and the README's account of it must name that preset.
    from pipelines_lib.config import DEMO_PRESET

    recipe = re.search(r"^demo:.*\n\t(.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe is not None, "Makefile has no demo target"
    assert f"--preset {DEMO_PRESET} " in recipe.group(1)
    assert f"rollstream run runs/demo-<time> --preset {DEMO_PRESET}" in (ROOT / "README.md").read_text()
