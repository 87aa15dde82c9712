"""The layering the repository promises: imports point down, and only records/layout know the campaign folder.

```
flows -> tasks -> pipelines_lib/stages -> core -> pipelines_lib/records -> storage/layout -> storage
bench, drills -> harness -> pipelines_lib
```
The library's floors are the table in docs/ARCHITECTURE.md §1, read here; the repository's packages stand on
``TREE_FLOORS``. Walked statically (``ast``), so a lazy import inside a function counts as much as a top-level
one; no module of the tree (``TREE``) imports another in a cycle.
"""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "pipelines_lib"
UPPER = ("prefect", "flows", "tasks", "bench", "drills", "harness")
"""Never imported by the library."""
TREE_FLOORS = {"pipelines_lib": 0, "harness": 1, "tasks": 1, "bench": 2, "drills": 2, "flows": 2}
"""The repository's packages: each imports only packages on lower floors (tests, beside the tree, import any)."""
TREE = tuple(TREE_FLOORS)
FOUNDATION = ("pipelines_lib.records", "pipelines_lib.storage", "pipelines_lib.settings", "pipelines_lib.utc",
              "pipelines_lib.hints", "pipelines_lib.configio")
"""The library's floors under its core (records, storage, process settings, time, hints, config parsing): flows and
tasks may use them beside the stage level, never the core itself (engine, rollout, train, audit, ...)."""
STAGE_LEVEL = ("pipelines_lib.stages", "pipelines_lib.config", "pipelines_lib.configdoc", "pipelines_lib.cli",
               "pipelines_lib.inspect_commands", "pipelines_lib.colocated_commands", "pipelines_lib.demo")
"""Modules that may see the whole campaign config; core modules never import them."""
RECORD_KEEPERS = {"pipelines_lib/storage/layout.py", "pipelines_lib/storage/store.py"} | {
    str(p.relative_to(ROOT)) for p in (ROOT / "pipelines_lib" / "records").glob("*.py")}
CAMPAIGN_PATH = re.compile(r"^(campaign\.json|(dataset|trajectories|train|weights|eval|runs|audit|rollout|telemetry)/"
                           r"(v\d|\d|[A-Z_]|checkpoints|consumed|$)|.*(LATEST|DONE|PUBLISHED)\.json)")
"""A string that spells (the start of) a campaign object's path; units like ``trajectories/s`` are not paths."""
JSON_PARSERS_ELSEWHERE = {
    "pipelines_lib/agents/parsers.py": "tool-call arguments in model output",
    "bench/tpu_ablation.py": "its own ledger of finished (arm, seed) runs",
    "bench/tpu_warm_start.py": "its own ledger of finished (candidate, seed) runs",
    "bench/ablation_plots.py": "a Perfetto trace it saved itself",
    "pipelines_lib/audit/campaign.py": "the committed groups it compressed itself while merging",
    "pipelines_lib/audit/pool.py": "answers of the audit's worker processes (JSON lines on a pipe)",
    "pipelines_lib/audit/worker.py": "work units from the audit's merging process (JSON lines on stdin)",
    "pipelines_lib/cli.py": "--storage-option values on the command line",
    "pipelines_lib/dataset.py": "rows of a JSONL dataset source and task metadata",
    "pipelines_lib/envs/base.py": "a task's metadata column",
    "pipelines_lib/envs/coding.py": "program output inside the sandbox",
    "pipelines_lib/envs/tools/bwrap.py": "bubblewrap's --info-fd report (the pid of the sandbox's init)",
    "pipelines_lib/model/tokenizer.py": "tokenizer files of a model folder",
    "pipelines_lib/model/weights.py": "model_config.json inside an Orbax folder",
    "pipelines_lib/model/hf_import.py": "a Hugging Face checkpoint's config and index",
    "pipelines_lib/trajectory/codec.py": "provenance metadata inside an Arrow shard",
    "pipelines_lib/trajectory/cursor.py": "the tail cursor, a string field of records",
    "pipelines_lib/telemetry/trace.py": "telemetry events (JSON lines), not records",
    "pipelines_lib/audit/export.py": "metadata of an exported Parquet file, outside the campaign folder",
    "pipelines_lib/audit/card.py": "the newest dataset card of an export, outside the campaign folder",
    "pipelines_lib/audit/verdicts.py": "the user's own kept shard verdicts, in the local cache",
    "flows/commands.py": "the repository's work-pool job templates (rollstream deploy)",
    "bench/runner.py": "bench/results.json of the repository",
    "drills/runner.py": "drills results of the repository",
    "drills/supervisor.py": "a child process's JSON output",
    "drills/fault_campaign.py": "arguments of the drill's child process",
    "drills/fuzz.py": "generated fuzz inputs",
    "drills/fuzz_campaign.py": "records of a copied campaign it damages by hand",
    "pipelines_lib/engine/vllm_supervisor.py": "the dtype in config.json of the model folder the server loads",
    "bench/realsize.py": "a child process's JSON output",
    "bench/scale.py": "a child process's JSON output and arguments",
    "bench/sql.py": "a child process's JSON output",
}
BAD_INPUT_PLANTERS = {
    "drills/poison.py": "plants junk under record paths (names no stage writes) to check that readers skip it",
    "drills/fuzz_campaign.py": "damages records of a copied campaign (what a restart trips on) to check the commands",
}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources(*packages: str) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


TREE_MODULES = {_module(p): p for p in _sources(*TREE)}
LIB_MODULES = {m: p for m, p in TREE_MODULES.items() if m.split(".")[0] == "pipelines_lib"}


def _target(name: str) -> str | None:
    """The module of the tree an imported name lives in (``pipelines_lib.records.Publication``: the package)."""
    while name and name not in TREE_MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _graph(modules: dict[str, Path] = LIB_MODULES) -> dict[str, set[str]]:
    return {name: {t for i in _imports(path) if (t := _target(i)) is not None and t != name}
            for name, path in modules.items()}


def _is_stage_level(module: str) -> bool:
    return any(module == s or module.startswith(s + ".") for s in STAGE_LEVEL)


def test_no_module_of_the_tree_imports_another_in_a_cycle() -> None:
    assert {m.split(".")[0] for m in TREE_MODULES} == set(TREE)  # the walk reads every package
    try:
        tuple(graphlib.TopologicalSorter(_graph(TREE_MODULES)).static_order())
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


def test_the_repository_s_packages_import_only_packages_on_lower_floors() -> None:
    up = sorted(f"{m} imports {t}" for m, targets in _graph(TREE_MODULES).items() for t in targets
                if (a := m.split(".")[0]) != (b := t.split(".")[0]) and not TREE_FLOORS[b] < TREE_FLOORS[a])
    assert up == []


def test_flows_and_tasks_reach_the_library_only_through_the_stage_level() -> None:
    reach = sorted(f"{m} imports {t}" for m, targets in _graph(TREE_MODULES).items()
                   if m.split(".")[0] in ("flows", "tasks") for t in targets
                   if t.startswith("pipelines_lib.") and not _is_stage_level(t)
                   and not any(t == f or t.startswith(f + ".") for f in FOUNDATION))
    assert reach == []


def test_the_library_never_imports_orchestration_or_the_harness() -> None:
    bad = sorted(f"{m} imports {i}" for m, p in LIB_MODULES.items() for i in _imports(p)
                 if i.split(".")[0] in UPPER)
    assert bad == []


def _floors() -> dict[str, int]:
    """``{package or top-level module of pipelines_lib: floor}`` from the floors table of docs/ARCHITECTURE.md."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    return {name: int(floor) for floor, cell in re.findall(r"^\| (\d+) \| (.*) \|$", text, re.M)
            for name in re.findall(r"`(\w+)`", cell)}


def _top(module: str) -> str:
    return module.split(".")[1]


def test_every_library_package_has_a_floor() -> None:
    floors = _floors()
    assert floors["storage"] == 0 and "trajectory" in floors  # the table is read
    assert sorted({_top(m) for m in LIB_MODULES if m != "pipelines_lib"} - set(floors)) == []


def test_imports_between_library_packages_point_down_the_floors() -> None:
    floors = _floors()
    top = max(floors.values())
    up = sorted(f"{m} (floor {floors[_top(m)]}) imports {t} (floor {floors[_top(t)]})"
                for m, targets in _graph().items() if m != "pipelines_lib"
                for t in targets if t != "pipelines_lib" and _top(t) != _top(m)
                and not floors[_top(t)] < floors[_top(m)] and not floors[_top(t)] == floors[_top(m)] == top)
    assert up == []


def test_core_modules_never_import_the_stages_or_the_campaign_config() -> None:
    bad = sorted(f"{m} imports {t}" for m, targets in _graph().items() if not _is_stage_level(m)
                 for t in targets if _is_stage_level(t))
    assert bad == []


def _code_strings(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants that are not docstrings, with their line; f-strings give their literal parts."""
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    attribute_docs = {id(b.value) for n in ast.walk(tree) if isinstance(n, ast.ClassDef | ast.Module)
                      for b in n.body if isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings | attribute_docs]


def test_only_records_and_layout_spell_campaign_paths() -> None:
    found = []
    for path in _sources("pipelines_lib", "flows", "tasks", "bench", "drills"):
        rel = str(path.relative_to(ROOT))
        if rel in RECORD_KEEPERS or rel in BAD_INPUT_PLANTERS:
            continue
        for line, text in _code_strings(ast.parse(path.read_text())):
            if CAMPAIGN_PATH.match(text):
                found.append(f"{rel}:{line}: {text!r}")
    assert found == []


def test_only_records_parse_campaign_json() -> None:
    found = []
    for path in _sources("pipelines_lib", "flows", "tasks", "bench", "drills"):
        rel = str(path.relative_to(ROOT))
        if rel in RECORD_KEEPERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                name = node.func.attr
                owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
                by_hand = name in ("read_json", "create_json", "read_pointer", "advance_pointer")
                if by_hand or (owner == "json" and name in ("loads", "load") and rel not in JSON_PARSERS_ELSEWHERE):
                    found.append(f"{rel}:{node.lineno}: {owner or '...'}.{name}")
    assert found == []


MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80
"""Sizes a reader can hold at once; a module or function past them is split along a seam it already has."""


def test_every_library_module_and_function_stays_small_enough_to_read() -> None:
    too_big = []
    for name, path in LIB_MODULES.items():
        source = path.read_text()
        if (lines := len(source.splitlines())) > MAX_MODULE_LINES:
            too_big.append(f"module {name}: {lines} lines (max {MAX_MODULE_LINES})")
        too_big += [f"function {name}.{node.name} (line {node.lineno}): {length} lines (max {MAX_FUNCTION_LINES})"
                    for node in ast.walk(ast.parse(source))
                    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                    and (length := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES]
    assert not too_big, "\n".join(too_big)
