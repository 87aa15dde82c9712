"""The ``rollstream`` command as a user meets it: one line and exit 2 for every user error, never a traceback.

Each case runs the real command in a subprocess (``python -m pipelines_lib.cli``, and the ``python -m flows.*``
wrappers) and reads its stderr. The flows' commands (``run``, ``recover``, ``stage``) come through the
``rollstream.commands`` entry points; every user error here is caught before Prefect starts.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.fixtures import eval_result, trained_campaign
from pipelines_lib import cli
from pipelines_lib.cli import build_parser
from pipelines_lib.config import CampaignConfig
from pipelines_lib.hints import hint_command
from pipelines_lib.stages.campaign import campaign_status, render_status
from pipelines_lib.storage.store import Store

ROOT = Path(__file__).resolve().parents[1]


def rollstream(*args: str, module: str = "pipelines_lib.cli", cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env=env)


def _one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert all(n in last for n in needles), last


@pytest.mark.parametrize(("args", "needles"), [
    (("stauts", "x"), ("invalid choice: 'stauts'", "did you mean 'status'?")),
    (("bench", "--only", "storre"), ("rollstream bench: unknown benchmark 'storre'", "did you mean 'store'?")),
    (("bench", "--only", "ablation", "--arms", "sync,eta3"), ("unknown ablation arm(s) eta3", "eta4_nocorr")),
    (("bench", "--only", "learning", "--arms", "eta4"), ("--arms chooses the arms of ablation or tpu_ablation",)),
    (("bench", "--only", "tpu_ablation", "--arms", "eta8"), ("unknown tpu_ablation arm(s) eta8", "eta4_nocorr")),
    (("bench", "--only", "learning", "--seeds", "0"), ("argument --seeds: no seeds in '0'",)),
    (("bench", "--only", "tpu_ablation", "--seeds", "4..3"), ("argument --seeds: no seeds in '4..3'",)),
    (("bench", "--only", "tpu_ablation", "--budget-s", "0"), ("--budget-s must be > 0, got 0",)),
    (("bench", "--only", "learning", "--preset", "wdie"), ("unknown preset 'wdie'", "did you mean 'wide'?")),
    (("bench", "--only", "store", "--preset", "wide"), ("--preset chooses the learning benchmark's preset",)),
    (("run", "{tmp}/c", "--set", "trainer.max_step=4"), ("rollstream run: trainer.max_step", "'max_steps'")),
    (("run", "{tmp}/c", "--set", "trainer.max_steps"), ("--set expects key=value",)),
    (("run", "{tmp}/c", "--set", "init_from=null"), ("--set init_from=null:", "--config file")),
    (("run", "{tmp}/c", "--preset", "smok"), ("unknown preset 'smok'", "did you mean 'smoke'?")),
    (("run", "{tmp}/c", "--config", "{tmp}/missing.yaml"), ("rollstream run:", "missing.yaml")),
    (("stage", "tran", "{tmp}/c"), ("unknown stage 'tran'", "did you mean 'train'?")),
    (("stage", "train", "{tmp}/c", "--version", "2"), ("--version applies to the evaluate stage, not train",)),
    (("recover", "{tmp}"), ("no campaign.json: nothing to recover",)),
    (("status", "{tmp}/nowhere"), ("rollstream status:", "no campaign folder here")),
    (("metrics", "{tmp}/nowhere"), ("rollstream metrics:", "no campaign folder here")),
    (("export", "{tmp}/nowhere", "{tmp}/out"), ("rollstream export:", "no campaign folder here")),
    (("trace", "{tmp}/nowhere"), ("rollstream trace:", "no campaign folder here")),
])
def test_a_user_error_is_one_line_and_exit_2_without_a_traceback(tmp_path: Path, args: tuple[str, ...],
                                                                  needles: tuple[str, ...], capsys) -> None:
    # In-process (an exception escaping main would fail the test with its traceback); the subprocess test
    # below runs a sample of these cases the way a shell does.
    (tmp_path / "stray.txt").write_text("not a campaign")  # `recover` gets a folder that exists
    try:
        code = cli.main([a.replace("{tmp}", str(tmp_path)) for a in args])
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    err = capsys.readouterr().err
    _one_line_error(subprocess.CompletedProcess(args, code, "", err), *needles)


@pytest.mark.parametrize("args", [("stauts", "x"), ("bench", "--only", "storre"),
                                  ("run", "{tmp}/c", "--set", "trainer.max_step=4"), ("status", "{tmp}/nowhere")])
def test_the_same_errors_from_a_shell_are_one_line_on_stderr(tmp_path: Path, args: tuple[str, ...]) -> None:
    result = rollstream(*(a.replace("{tmp}", str(tmp_path)) for a in args))
    _one_line_error(result, "rollstream")


@pytest.mark.parametrize("module", ["flows.campaign", "flows.recover", "flows.stages"])
def test_python_dash_m_flows_are_the_rollstream_commands(module: str) -> None:
    command = {"flows.campaign": "run", "flows.recover": "recover", "flows.stages": "stage"}[module]
    helped = rollstream("--help", module=module)
    assert helped.returncode == 0 and f"usage: rollstream {command} " in helped.stdout, helped.stderr


def test_version_and_exit_codes_are_in_the_help() -> None:
    version = rollstream("--version")
    assert version.returncode == 0 and version.stdout.startswith("rollstream ")
    helped = rollstream("--help")
    assert "exit codes: 0 ok, 1" in " ".join(helped.stdout.split())
    names = set(build_parser()._subparsers._group_actions[0].choices)  # noqa: SLF001
    assert {"run", "recover", "stage", "status", "audit", "export", "sql", "view", "trace", "metrics", "bench",
            "drills"} <= names


def test_status_is_a_table_by_default_and_json_on_request(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "c"))
    trained_campaign(store, CampaignConfig.tiny().with_overrides({"eval.versions": "ends"}))
    eval_result(0).write(store)
    eval_result(2).write(store)
    table = rollstream("status", store.url)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split() == ["stage", "state", "detail"]
    rows = {line.split()[0]: line.split()[1:] for line in table.stdout.splitlines()[1:7]}
    assert rows["evaluate"][:2] == ["done", "evaluated"] and rows["audit"][:2] == ["to", "do"]
    assert table.stdout.strip().endswith(f"to do: audit; run them with: {hint_command(['recover', store.url])}")
    as_json = rollstream("status", store.url, "--json")
    assert json.loads(as_json.stdout)["todo"] == ["audit"]
    assert render_status(campaign_status(store), recover=hint_command(["recover", store.url])) == \
        table.stdout.rstrip("\n")


def test_a_stage_run_logs_each_line_with_its_run_name(prefect_api: str, campaign: Store,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # The library (Orbax's absl) is imported before the flow starts: its logging must not replace Prefect's format.
    monkeypatch.setenv("PREFECT_API_URL", prefect_api)
    result = rollstream("stage", "prep", campaign.url)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if "Finished in state" in line]
    assert lines and all("Task run 'prep" in line or "Flow run '" in line for line in lines), lines
    assert "INFO:prefect" not in result.stderr


def test_status_of_a_finished_campaign_loads_neither_jax_nor_the_model_code(tmp_path: Path) -> None:
    # With JAX and the model code `status` took seconds to start; without them it answers in well under one.
    store = Store(str(tmp_path / "c"))
    trained_campaign(store, CampaignConfig.tiny().with_overrides({"eval.versions": "ends"}))
    eval_result(0).write(store)
    eval_result(2).write(store)
    probe = ("import sys; from pipelines_lib.cli import main; code = main(['status', sys.argv[1]]); "
             "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'flax', 'orbax', 'transformers'}); "
             "print('loaded:', loaded, file=sys.stderr); sys.exit(code)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", probe, store.url], capture_output=True, text=True, timeout=120,
                            env=env)
    assert result.returncode == 0, result.stderr
    assert "evaluate    done" in result.stdout  # the evaluation stage's marker was read (eval.versions: ends)
    assert result.stderr.strip().splitlines()[-1] == "loaded: []"


def test_verbose_shows_the_stage_tasks_debug_lines_and_default_hides_them(prefect_api: str) -> None:
    from prefect import flow, get_run_logger, task

    from flows.commands import flow_logging

    @task
    def commit() -> None:
        get_run_logger().debug("committed a shard")
        get_run_logger().info("progress")

    @flow
    def stage() -> None:
        commit()

    class Lines(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage() in ("progress", "committed a shard"):  # not Prefect's own state lines
                self.lines.append(record.getMessage())

    logger = logging.getLogger("prefect.task_runs")
    level, lines = logger.level, Lines()
    logger.addHandler(lines)
    try:
        flow_logging(False)
        stage()
        assert lines.lines == ["progress"]
        flow_logging(True)
        stage()
        assert lines.lines == ["progress", "committed a shard", "progress"]
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
