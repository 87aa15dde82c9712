"""Module docstrings name only code that exists, and docs/STAGES.md states the stage functions' own signatures.

``code_references`` reads the backquoted dotted names of a module docstring that point at code: a name starting
with one of the repository's packages (``pipelines_lib.publish.publish_weights``), with a package or module of the
library or of the docstring's own package (``train.trainer.Trainer``), or with a class the repository defines
(``CampaignConfig.preset``). Names of other kinds that share the dotted form are left out: config keys
(``trainer.max_steps``), figures of ``bench/results.json`` (``tpu.campaign_wall_s``) and file names. Each reference
must resolve by import and attribute lookup, relative to the library, the docstring's package, or the module that
defines the class.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from pipelines_lib.config import CampaignConfig
from pipelines_lib.configdoc import rows

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipelines_lib", "flows", "tasks", "bench", "drills")
DOTTED = re.compile(r"``?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?``?")
FILE_SUFFIXES = {"py", "json", "md", "yaml", "yml", "arrow", "txt", "html", "png", "jsonl", "toml", "parquet", "sh",
                 "safetensors"}
SKIPPED = {"pipelines_lib/engine/vllm_server/rollstream_vllm.py": "runs inside the vLLM server's own interpreter"}
"""Modules whose docstrings are not read, and why (importing them here is not possible)."""


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _package(module: str) -> str:
    """The package a module's siblings are in: a package's own ``__init__`` is inside it."""
    return module if (ROOT / module.replace(".", "/") / "__init__.py").exists() else module.rsplit(".", 1)[0]


@cache
def _classes() -> dict[str, str]:
    """Class name -> the module defining it, over the repository's packages (a name defined twice is left out)."""
    found: dict[str, list[str]] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, []).append(_module_name(path))
    return {name: modules[0] for name, modules in found.items() if len(modules) == 1}


@cache
def _other_namespaces() -> frozenset[str]:
    """Dotted names that are not code: config keys and recorded figures."""
    keys = {key for key, *_ in rows(CampaignConfig.tiny())}
    record = json.loads((ROOT / "bench" / "results.json").read_text())
    return frozenset(keys | set(record.get("figures", {})) | set(record.get("labels", {})))


def _library_names() -> set[str]:
    return {p.stem if p.suffix == ".py" else p.name for p in (ROOT / "pipelines_lib").iterdir()
            if p.suffix == ".py" or (p / "__init__.py").exists()}


def code_references(docstring: str, module: str) -> list[str]:
    """The dotted names of ``docstring`` (of ``module``) that point at code (see the module docstring)."""
    package = _package(module)
    siblings = {p.stem for p in (ROOT / package.replace(".", "/")).glob("*.py")} | {
        p.name for p in (ROOT / package.replace(".", "/")).iterdir() if (p / "__init__.py").exists()}
    firsts = set(PACKAGES) | _library_names() | siblings | set(_classes())
    out = []
    for name in dict.fromkeys(DOTTED.findall(docstring)):
        if name.rsplit(".", 1)[1] in FILE_SUFFIXES or name in _other_namespaces():
            continue
        if name.split(".")[0] in firsts:
            out.append(name)
    return out


def _member(obj: Any, attr: str) -> bool:
    """An attribute, or, of a class, a dataclass field or a constructor argument (both instances' attributes)."""
    if hasattr(obj, attr):
        return True
    if not inspect.isclass(obj):
        return False
    try:
        parameters = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        parameters = {}
    return attr in getattr(obj, "__dataclass_fields__", {}) or attr in parameters


def _walk(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not _member(obj, attr):
                return False
            obj = getattr(obj, attr, None)
        return True
    return False


def resolves(name: str, module: str) -> bool:
    """Whether ``name``, named in ``module``'s docstring, is a module or an attribute path (see the docstring)."""
    first = name.split(".")[0]
    if first in PACKAGES:
        return _walk(name)
    package, stem = _package(module), module.rsplit(".", 1)[-1]
    # A module names its own members bare (``Trainer.run``), never through its own name: ``evaluate.evaluate`` in
    # tasks/evaluate.py means the library's function, not the task module's import of it.
    candidates = [f"pipelines_lib.{name}", f"{module}.{name}", *([f"{package}.{name}"] if first != stem else [])]
    if first in _classes():
        candidates.append(f"{_classes()[first]}.{name}")
    return any(_walk(c) for c in candidates)


def test_module_docstrings_name_only_modules_and_objects_that_exist() -> None:
    stale = []
    count = 0
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if str(path.relative_to(ROOT)) in SKIPPED:
                continue
            docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
            module = _module_name(path)
            for name in code_references(docstring, module):
                count += 1
                if not resolves(name, module):
                    stale.append(f"{path.relative_to(ROOT)}: {name}")
    assert count > 100  # the scan reads the docstrings
    assert stale == []


def test_the_scan_tells_code_from_config_keys_figures_and_file_names() -> None:
    doc = ("Runs ``train.trainer.StreamingTrainer`` (``pipelines_lib.publish.publish_weights``, `CampaignConfig.preset`) up to "
           "``trainer.max_steps``; its figure ``tpu.campaign_wall_s`` lands in ``results.json``.")
    assert code_references(doc, "tasks.train") == ["train.trainer.StreamingTrainer", "pipelines_lib.publish.publish_weights",
                                                   "CampaignConfig.preset"]
    assert resolves("train.trainer.StreamingTrainer", "tasks.train") and resolves("TrainerConfig.mesh", "bench.x")
    assert not resolves("train.trainer.train", "tasks.train")
    assert not resolves("evaluate.evaluate", "tasks.evaluate")


def documented_signatures(text: str) -> dict[str, list[str]]:
    """``{dotted function: parameter names}`` of the ``pipelines_lib.…(…)`` signatures in a document's table."""
    out = {}
    for name, params in re.findall(r"`(pipelines_lib(?:\.\w+)+)\(([^`]*?)\)(?: -> [^`]*)?`", text):
        while re.search(r"\[[^\[\]]*\]", params):
            params = re.sub(r"\[[^\[\]]*\]", "", params)  # type arguments hold commas of their own
        out[name] = [p.split(":")[0].split("=")[0].strip() for p in params.split(",") if p.strip() not in ("", "*")]
    return out


def test_the_stage_signatures_docs_stages_states_are_the_functions_own() -> None:
    documented = documented_signatures((ROOT / "docs" / "STAGES.md").read_text())
    assert len(documented) >= 9, documented  # every stage of the table, status and fork
    wrong = []
    for dotted, names in documented.items():
        module, func = dotted.rsplit(".", 1)
        params = inspect.signature(getattr(importlib.import_module(module), func)).parameters
        required = [n for n, p in params.items() if p.default is inspect.Parameter.empty]
        if not set(names) <= set(params) or not set(required) <= set(names):
            wrong.append(f"{dotted}: documented {names}, defined {list(params)} (required {required})")
    assert wrong == []


def test_the_signature_scan_reads_names_past_type_arguments() -> None:
    text = "| x | `pipelines_lib.a.f(store, config, *, opts: dict[str, Any] | None = None) -> dict` |"
    assert documented_signatures(text) == {"pipelines_lib.a.f": ["store", "config", "opts"]}
