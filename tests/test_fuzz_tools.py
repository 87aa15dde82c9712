"""Hostile model output against every tool-call parser and the calculator (contracts: drills/fuzz.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings

from drills.fuzz import calculator_inputs, check_calculator, check_parsers, parser_inputs


@settings(max_examples=500, deadline=None)
@given(parser_inputs())
def test_parsers_turn_any_model_output_into_calls_or_clear_errors(text: str) -> None:
    check_parsers(text)


@settings(max_examples=500, deadline=None)
@given(calculator_inputs())
def test_calculator_answers_or_refuses_hostile_expressions_quickly(case: str | dict[str, Any]) -> None:
    check_calculator(case)
