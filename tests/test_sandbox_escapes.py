"""The sandbox escape catalogue (drills/sandbox_escapes.py), one attempt per test, against a prepared host."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from drills.sandbox_escapes import DRILL_SANDBOX, ESCAPES, PLANTED_VALUE, Escape, Host, attempt, prepared_host


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    with prepared_host(tmp_path_factory.mktemp("escapes")) as h:
        yield h


@pytest.mark.parametrize("escape", ESCAPES, ids=[e.name for e in ESCAPES])
def test_escape_attempt_is_contained_and_leaves_the_host_clean(escape: Escape, host: Host) -> None:
    outcome = attempt(escape, host)
    assert outcome.contained, f"{escape.name}: {outcome.problems}\n{outcome.result}"


def test_the_containment_check_detects_a_leaked_credential(host: Host) -> None:
    # The control: a program that prints the planted value would count as an escape.
    leak = Escape(name="control", code=f"print({PLANTED_VALUE!r})")
    outcome = attempt(leak, host)
    assert not outcome.contained
    assert outcome.problems == ("the parent's planted credential appears in the result",)


def test_the_host_is_restored_after_the_drill(tmp_path: Path) -> None:
    import os
    import tempfile

    before = tempfile.tempdir
    prior = os.environ.get("ROLLSTREAM_DRILL_API_TOKEN")  # a module fixture's host may be active around us
    with prepared_host(tmp_path) as h:
        assert os.environ.get("ROLLSTREAM_DRILL_API_TOKEN") == PLANTED_VALUE
        assert h.secret.exists()
    assert os.environ.get("ROLLSTREAM_DRILL_API_TOKEN") == prior
    assert tempfile.tempdir == before


@pytest.mark.parametrize("name", ["hook_off_read_secret", "hook_frame_off_read_secret", "hook_off_write_outside",
                                  "hook_off_proc_lists_only_the_sandbox"])
def test_attacks_on_the_audit_hook_do_escape_without_os_isolation(name: str, host: Host) -> None:
    # The control for the mechanism attacks: with isolation "none" the audit hook is all there is, and these
    # programs really do neutralise it; only the namespaces stop them under the default backend.
    escape = next(e for e in ESCAPES if e.name == name)
    outcome = attempt(escape, host, dataclasses.replace(DRILL_SANDBOX, isolation="none"))
    assert not outcome.contained
    assert "HOOK-DISABLED" in outcome.result
    for leftover in host.outside.iterdir():
        if leftover != host.secret:
            leftover.unlink()
