"""Hints a person pastes (``audit it: …`` after a campaign, ``run them with: …`` under ``status``) run as printed:
from another directory, with the storage options the campaign was opened with, secrets left out and named."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines_lib.hints import PLACEHOLDER, hint_command, rollstream_command, secrets_note
from pipelines_lib.storage.store import Store
from tests.conftest import gcs_options

ROOT = Path(__file__).resolve().parents[1]


def _paste(line: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run a printed command line as a shell would, from ``cwd``, with this checkout importable (as an install
    of it would be)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(shlex.split(line), capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def _hint(summary: str, label: str) -> str:
    return next(line for line in summary.splitlines() if line.startswith(label)).removeprefix(label).strip()


def test_a_console_script_is_named_by_its_absolute_path_and_anything_else_by_this_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "bin" / "rollstream"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n")
    monkeypatch.chdir(tmp_path)
    assert rollstream_command("bin/rollstream") == [str(script)]
    assert rollstream_command("/somewhere/flows/campaign.py") == [sys.executable, "-m", "pipelines_lib.cli"]


def test_secret_options_are_replaced_and_named_while_auth_methods_and_endpoints_are_kept() -> None:
    options = {
        "endpoint_url": "http://127.0.0.1:4443",
        "token": "anon",
        "project": "p",
        "credentials": "/home/me/key.json",
        "session_token": "abc123",
    }
    line = hint_command(["audit", "gs://b/c"], options)
    args = shlex.split(line)
    assert args[-10:] == [
        "-o",
        "endpoint_url=http://127.0.0.1:4443",
        "-o",
        "token=anon",
        "-o",
        "project=p",
        "-o",
        f"credentials={PLACEHOLDER}",
        "-o",
        f"session_token={PLACEHOLDER}",
    ]
    assert "abc123" not in line and "key.json" not in line
    assert secrets_note(options) == (
        f"secret storage options not printed: credentials, session_token; replace "
        f"{PLACEHOLDER} in the commands above with your own"
    )
    assert secrets_note({"token": "anon"}) is None


def test_the_end_of_run_audit_hint_runs_as_printed_from_another_directory(
    demo_campaign: Store, tmp_path: Path
) -> None:
    from flows.campaign import summary

    printed = summary(demo_campaign, 1.0, {"ok": True, "report": "ok"})
    audit = _hint(printed, "audit it:")
    assert shlex.split(audit)[0] == sys.executable and demo_campaign.url in audit
    result = _paste(audit, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout


def test_the_status_recover_hint_names_the_campaign_and_its_options(
    demo_campaign: Store, tmp_path: Path
) -> None:
    # `status` itself through the same renderer: the command it prints differs from it only in the subcommand.
    status_line = hint_command(["status", demo_campaign.url])
    result = _paste(status_line, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == (
        f"to do: prep, warm_start, collect, train, evaluate, audit; run them with: "
        f"{hint_command(['recover', demo_campaign.url])}"
    )


def test_a_gs_campaign_hint_carries_the_endpoint_and_runs_as_printed(
    demo_campaign: Store, gcs_emulator: str, gcs_store: Store, tmp_path: Path
) -> None:
    from flows.campaign import summary

    for rel in demo_campaign.walk():
        gcs_store.create(rel, demo_campaign.read(rel))
    options = gcs_options(gcs_emulator)
    printed = summary(gcs_store, 1.0, {"ok": True, "report": "ok"}, storage_options=options)
    audit = _hint(printed, "audit it:")
    assert f"endpoint_url={gcs_emulator}" in shlex.split(audit)
    assert secrets_note(options) is None and "secret" not in printed
    result = _paste(audit, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout


def test_dict_valued_storage_options_are_hinted_and_a_service_account_token_is_never_printed() -> None:
    key = {"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----abc", "client_email": "a@b"}
    options = {"endpoint_url": "http://127.0.0.1:4443", "token": key, "session_kwargs": {}, "default_location": "EU",
               "retries": {"n": 3}}
    args = shlex.split(hint_command(["audit", "gs://b/c"], options))
    assert args[-10:] == ["-o", "endpoint_url=http://127.0.0.1:4443", "-o", f"token={PLACEHOLDER}",
                          "-o", f"session_kwargs={PLACEHOLDER}", "-o", "default_location=EU", "-o", 'retries={"n": 3}']
    assert "PRIVATE" not in " ".join(args)
    assert secrets_note(options).startswith("secret storage options not printed: token, session_kwargs;")


def test_status_of_a_gs_campaign_opened_with_a_dict_valued_option_prints_its_recover_hint(
    demo_campaign: Store, gcs_emulator: str, gcs_store: Store, tmp_path: Path
) -> None:
    for rel in ("campaign.json", *(r for r in demo_campaign.walk() if r.startswith("trajectories/"))):
        gcs_store.create(rel, demo_campaign.read(rel))
    options = [a for k, v in gcs_options(gcs_emulator).items() for a in ("-o", f"{k}={v}")]
    status = [*rollstream_command(), "status", gcs_store.url, *options, "-o", "session_kwargs={}"]
    result = subprocess.run(status, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    assert result.returncode == 0, result.stderr
    recover = shlex.split(_hint(result.stdout, "to do:").split("run them with:")[1])
    assert recover[len(rollstream_command()):][:2] == ["recover", gcs_store.url]
    assert f"session_kwargs={PLACEHOLDER}" in recover and f"endpoint_url={gcs_emulator}" in recover
    assert result.stdout.splitlines()[-1].startswith("secret storage options not printed: session_kwargs;")


def test_every_command_a_hint_prints_is_built_in_so_a_checkout_without_an_install_has_it() -> None:
    from pipelines_lib.cli import commands

    sources = [p for d in ("pipelines_lib", "flows", "tasks") for p in (ROOT / d).rglob("*.py")]
    hinted = {m for p in sources for m in re.findall(r"hint_command\(\s*\[\s*['\"]([a-z-]+)['\"]", p.read_text())}
    assert {"status", "recover", "audit", "trace"} <= hinted  # the scan reads the sources
    assert hinted <= set(commands(installed=()))
