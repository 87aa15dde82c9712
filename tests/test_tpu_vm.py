"""The operator's commands where a TPU VM has them: a checkout on ``PYTHONPATH``, the package not installed and
Prefect not importable. ``status``, ``recover``, ``audit`` and ``export`` run there on a real campaign folder, and
every command they print runs as printed, from another directory, with nothing on ``PYTHONPATH``."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from harness.fixtures import seed_trainer_campaign, small_trainer_config

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = re.compile(r"^(rollstream|__editable__|prefect|pipelines_lib|flows|tasks|bench|drills)\b|\.pth$", re.I)
"""What a TPU VM's interpreter lacks of this one's site-packages: the installed project and Prefect."""


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment, and beside it a folder with this one's packages except rollstream (no install,
    no entry points) and Prefect: a TPU VM's interpreter and the folder ``scripts/tpu_setup.sh`` installs the
    library's needs into, both on ``PYTHONPATH`` after the checkout."""
    root = tmp_path_factory.mktemp("tpuvm")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
    python = root / "venv" / "bin" / "python"
    shared = root / "shared"
    shared.mkdir()
    for entry in Path(sysconfig.get_path("purelib")).iterdir():
        if not HIDDEN.search(entry.name):
            (shared / entry.name).symlink_to(entry)
    return python


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This repository as a TPU VM's clone of it: its files, not what an install left in it (an egg-info)."""
    clone = tmp_path_factory.mktemp("clone")
    for entry in ROOT.iterdir():
        if not entry.name.startswith(".") and not entry.name.endswith(".egg-info"):
            (clone / entry.name).symlink_to(entry)
    return clone


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "JAX_PLATFORMS": "cpu", **extra}


def _run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=cwd, env=_env(**env))


def _pythonpath(python: Path, checkout: Path) -> str:
    """The TPU VM recipe's ``PYTHONPATH``: the checkout, then the folder of the library's needs."""
    return os.pathsep.join([str(checkout), str(python.parents[2] / "shared")])


def _cli(python: Path, checkout: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m pipelines_lib.cli ARGS`` as the TPU VM's recipe runs it."""
    return _run([str(python), "-m", "pipelines_lib.cli", *args], cwd, PYTHONPATH=_pythonpath(python, checkout))


def _paste(line: str, cwd: Path) -> subprocess.CompletedProcess:
    """A printed command as a shell runs it: from ``cwd``, nothing on ``PYTHONPATH``."""
    return _run(shlex.split(line), cwd)


def test_the_interpreter_has_neither_prefect_nor_the_installed_package(
        bare_python: Path, checkout: Path, tmp_path: Path) -> None:
    probe = ("import importlib.metadata as m, importlib.util as u\n"
             "print(u.find_spec('prefect'), u.find_spec('pyarrow') is not None, "
             "len(m.entry_points(group='rollstream.commands')))")
    assert _cli(bare_python, checkout, cwd=tmp_path).returncode == 2  # the parser's usage line: the checkout imports
    found = _run([str(bare_python), "-c", probe], tmp_path,
                 PYTHONPATH=_pythonpath(bare_python, checkout)).stdout.split()
    assert found == ["None", "True", "0"]


def test_status_recover_audit_and_export_run_without_prefect_and_every_printed_command_runs_as_printed(
        bare_python: Path, checkout: Path, tmp_path: Path) -> None:
    config = dataclasses.replace(small_trainer_config(2), placement="colocated", workers=1)
    config = dataclasses.replace(config, eval=dataclasses.replace(config.eval, n_tasks=2, samples=1))
    url = str(tmp_path / "campaign")
    seed_trainer_campaign(url, config, 4)  # a colocated campaign stopped before its dataset, steps and evaluation
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    status = _cli(bare_python, checkout, "status", url, cwd=elsewhere)
    assert status.returncode == 0, status.stderr
    todo, recover = status.stdout.strip().splitlines()[-1].split("; run them with: ")
    assert todo == "to do: prep, collect, train, evaluate, audit"
    assert shlex.split(recover) == ["env", f"PYTHONPATH={_pythonpath(bare_python, checkout)}", str(bare_python),
                                    "-m", "pipelines_lib.cli", "recover", f"file://{url}"]
    recovered = _paste(recover, elsewhere)
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    summary = json.loads(recovered.stdout.strip().splitlines()[-1])
    assert summary["audit_ok"] and set(summary["greedy_success"]) == {"0", "1"}
    assert _cli(bare_python, checkout, "status", url, cwd=elsewhere).stdout.strip().splitlines()[-1] == "to do: nothing"

    audit = _cli(bare_python, checkout, "audit", url, cwd=elsewhere)
    assert audit.returncode == 0, audit.stderr
    assert "verdict: OK" in audit.stdout
    export = _cli(bare_python, checkout, "export", url, str(tmp_path / "export"), "--jobs", "1", cwd=elsewhere)
    assert export.returncode == 0, export.stderr
    assert {r["status"] for r in json.loads(export.stdout)} == {"written"}


def test_recover_without_prefect_names_the_command_for_a_campaign_of_separate_stages(
        bare_python: Path, checkout: Path, tmp_path: Path) -> None:
    url = str(tmp_path / "separate")
    seed_trainer_campaign(url, small_trainer_config(2), 0)
    recover = _cli(bare_python, checkout, "recover", url, cwd=tmp_path)
    assert recover.returncode == 2
    assert recover.stderr.startswith(f"rollstream recover: file://{url}: placement 'separate': its stages run as "
                                     "separate processes, which only the recover flow starts (through Prefect)")
    assert f"{bare_python} -m pip install -e {checkout}" in recover.stderr
    assert not (tmp_path / "separate" / "dataset").exists()  # nothing was run
