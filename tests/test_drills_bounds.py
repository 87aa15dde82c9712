"""The bounds drill: a black-hole storage endpoint, parser floods and hostile configs, each under a deadline.

The default suite covers each behaviour fast (tests/test_settings.py runs the five CLI commands against a black
hole; tests/test_parsers.py and tests/test_config.py the floods and configs); the whole drill is slow."""

from __future__ import annotations

from pathlib import Path

import pytest

from drills.bounds import (
    CONFIG_FILES,
    PARSER_FLOODS,
    BoundsCase,
    bounds_figures,
    render_bounds_section,
    run_bounds,
)


def _case(name: str, *, seconds: float = 1.0, code: int | None = 2, ok: bool = True,
          traceback: bool = False) -> BoundsCase:
    return BoundsCase(name=name, kind="url" if name.startswith(("cli_", "flow_")) else "parser", deadline_s=60.0,
                      seconds=seconds, exit_code=code, ok=ok, traceback=traceback, detail="x | y")


def test_hangs_count_every_case_and_tracebacks_only_cli_cases() -> None:
    cases = [_case("cli_audit", seconds=61.5), _case("cli_status", traceback=True), _case("cli_trace", ok=False),
             _case("flow_recover", traceback=True, code=1), _case("parser_flood", code=None, ok=False)]
    figures, details = bounds_figures(cases, quick=False)
    assert figures == {"reliability.hangs": 1.0, "reliability.cli_tracebacks": 2.0, "reliability.bounds_cases": 5.0,
                       "reliability.bounds_failed": 2.0, "reliability.blackhole_fail_s": 61.5}
    assert "blackhole_fail_s" not in str(bounds_figures(cases, quick=True)[0])  # quick budgets are not a user's
    section = "\n".join(render_bounds_section(details))
    assert "| parser_flood | 1.0 (60) | **HUNG** | **NO** | x \\| y |" in section
    assert "30 s per storage request, no retry after 60 s" in section


@pytest.mark.slow
def test_the_quick_bounds_drill_has_no_hang_no_traceback_and_every_answer_expected(tmp_path: Path) -> None:
    cases = run_bounds(tmp_path, quick=True)
    assert len(cases) == 6 + len(PARSER_FLOODS) + len(CONFIG_FILES)
    assert [c.name for c in cases if not c.ok or c.hung] == []
    figures, _ = bounds_figures(cases, quick=True)
    assert figures["reliability.hangs"] == figures["reliability.cli_tracebacks"] == 0
