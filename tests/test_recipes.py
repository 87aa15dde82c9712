"""The presets are recipes: ``recipes/<name>.yaml`` over ``CampaignConfig.tiny()`` or the recipe it ``extends``.

Every recipe in the folder is selectable by name and loads; each opens with a header saying what it is for and
which benchmark keys record it; the folder is found from a checkout on ``PYTHONPATH`` and from an installed
package (built here with setuptools' ``build_py``, what a wheel holds).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.registry import load_benches
from pipelines_lib.config import RECIPES, CampaignConfig, ConfigError, preset_names

ROOT = Path(__file__).resolve().parents[1]
RECORDED = re.compile(r"^# Recorded by: (?P<what>.+)$", re.MULTILINE)
BENCH_KEY = re.compile(r"\b([a-z0-9_]+\.[a-z0-9_.*]+)")
"""A benchmark key or key pattern in a header: ``learning.*``, ``tpu.campaign_*``."""


def test_the_recipes_folder_is_the_repository_s_and_holds_the_embedded_default_and_every_preset() -> None:
    assert RECIPES == ROOT / "recipes"
    assert {"tiny", "smoke", "wide", "tpu_demo", "tpu_real", "twostep"} <= set(preset_names())
    assert CampaignConfig.preset("tiny") == CampaignConfig.tiny()
    # config.py keeps no preset: the embedded default is the only one spelled in code
    assert [name for name in preset_names() if name != "tiny" and hasattr(CampaignConfig, name)] == []


@pytest.mark.parametrize("name", preset_names())
def test_every_recipe_in_the_folder_is_a_selectable_preset_that_loads(name: str) -> None:
    config = CampaignConfig.build(preset=name, overrides={"trainer.max_steps": 2})
    assert config.trainer.max_steps == 2
    assert config.with_overrides({}) == config  # validated, and round-trips through its mapping


@pytest.mark.parametrize("name", preset_names())
def test_every_recipe_opens_with_what_it_is_for_and_the_benchmark_keys_that_record_it(name: str) -> None:
    text = (RECIPES / f"{name}.yaml").read_text()
    assert text.startswith(f"# {name}: "), f"recipes/{name}.yaml: the first line says what the recipe is for"
    recorded = RECORDED.search(text)
    assert recorded, f"recipes/{name}.yaml: no '# Recorded by:' line in its header"
    figures = json.loads((ROOT / "bench" / "results.json").read_text())["figures"]
    # a benchmark registered but not yet run where the record was made (tpu_real: a chip) is known by its goals
    declared = [goal.key for bench in load_benches().values() for goal in bench.goals]
    unknown = [key for key in BENCH_KEY.findall(recorded["what"]) if not fnmatch.filter([*figures, *declared], key)]
    assert unknown == [], (f"recipes/{name}.yaml names benchmark keys that bench/results.json does not record and "
                           "no registered benchmark's goals name")


def test_the_twostep_recipe_the_benchmarks_run_is_selectable() -> None:
    config = CampaignConfig.build(preset="twostep")
    assert (config.env.name, config.dataset.source, config.engine.max_seq_len) == ("twostep", "builtin:twostep", 256)


def test_a_recipe_overlays_the_recipe_it_extends_and_tiny_by_default(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("# base: a test recipe\ntrainer:\n  max_steps: 7\n")
    (tmp_path / "child.yaml").write_text("# child: a test recipe\nextends: base\nrollout:\n  eta: 2\n")
    base = CampaignConfig.preset("base", folder=tmp_path)
    assert base == dataclasses.replace(CampaignConfig.tiny(), trainer=dataclasses.replace(
        CampaignConfig.tiny().trainer, max_steps=7))
    child = CampaignConfig.preset("child", folder=tmp_path)
    assert child == dataclasses.replace(base, rollout=dataclasses.replace(base.rollout, eta=2))
    assert preset_names(tmp_path) == ("base", "child")


@pytest.mark.parametrize(("recipes", "message"), [
    ({"a": "extends: b\n", "b": "extends: a\n"}, "recipe 'a' extends itself: a -> b -> a"),
    ({"a": "extends: nope\n"}, "unknown preset 'nope' (extended by 'a'); valid: a"),
    ({"a": "extends: [b]\n"}, "a.yaml: extends: expected a recipe's name, got list ['b']"),
    ({"a": "trainer:\n  max_stepz: 3\n"}, "a.yaml: trainer.max_stepz"),
    ({"a": "- 1\n"}, "a.yaml: top level must be a mapping, got list"),
])
def test_a_bad_recipe_is_refused_naming_the_file_or_the_chain(tmp_path: Path, recipes: dict[str, str],
                                                              message: str) -> None:
    for name, text in recipes.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        CampaignConfig.preset("a", folder=tmp_path)


def _installed(tmp_path: Path) -> Path:
    """The packages as a wheel would install them: ``pyproject.toml``'s packages and package data."""
    source, lib = tmp_path / "source", tmp_path / "lib"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "tests", "runs", "build", "*.egg-info", "__pycache__", "*.png"))
    subprocess.run([sys.executable, "-c", "import setuptools; setuptools.setup()", "-q", "build_py", "-d", str(lib)],
                   cwd=source, check=True, capture_output=True, timeout=120)
    shutil.rmtree(source)  # nothing of the checkout left to find
    return lib


@pytest.mark.parametrize("layout", ["checkout on PYTHONPATH", "installed package"])
def test_the_recipes_are_found_from_a_checkout_and_from_an_installed_package(tmp_path: Path, layout: str) -> None:
    path = ROOT if layout == "checkout on PYTHONPATH" else _installed(tmp_path)
    code = ("import json; from pipelines_lib.config import RECIPES, CampaignConfig, preset_names; "
            "print(json.dumps([str(RECIPES), [CampaignConfig.preset(n).to_json() for n in preset_names()]]))")
    env = {**os.environ, "PYTHONPATH": str(path)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300, check=True)
    folder, configs = json.loads(out.stdout)
    assert folder == str(path / "recipes")
    assert configs == [CampaignConfig.preset(name).to_json() for name in preset_names()]
