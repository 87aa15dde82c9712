"""The calculator: exact goldens, deterministic formatting, and bounded work on hostile input."""

from __future__ import annotations

import asyncio
import time

import pytest

from pipelines_lib.envs import ToolError, make_tool
from pipelines_lib.envs.tools.calculator import Calculator, CalculatorLimits, evaluate, format_number


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("37*48+129", "1905"),  # 1776 + 129
        ("2+3*4", "14"),  # precedence: 2 + 12
        ("(2+3)*4", "20"),
        ("10-4-3", "3"),  # left-associative: (10 - 4) - 3
        ("2**3**2", "512"),  # right-associative: 2 ** 9
        ("-2**2", "-4"),  # unary minus binds looser than **
        ("7//2", "3"),
        ("-7//2", "-4"),  # floor division rounds down
        ("-7%3", "2"),
        ("6/3", "2"),  # integral float prints as an integer
        ("7/2", "3.5"),
        ("1/3", "0.333333333333"),  # 12 significant digits
        ("2**-2", "0.25"),
        ("0.1+0.2", "0.3"),  # 0.30000000000000004 rounded to 12 digits
        ("12 × 3 ÷ 4", "9"),  # the symbols models write
        ("2^10", "1024"),  # ^ means power here, not xor
        ("  +5 ", "5"),
        ("123456789*987654321", "121932631112635269"),  # exact big integers
        ("(" * 60 + "1" + ")" * 60, "1"),  # parentheses add no AST depth
    ],
)
def test_calculator_goldens(expression: str, expected: str) -> None:
    assert asyncio.run(Calculator()({"expression": expression})) == expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("9**9**9", "result too large"),
        ("2**100000", "result too large"),
        ("2**(2**4000)", "result too large"),
        ("10**300*10**300*10**300*10**300*10**300", "result too large"),  # about 4983 bits
        ("1e308*10", "not a finite number"),
        ("2.0**10000", "result too large"),
        ("2**4000/3", "result too large"),  # too big to divide as a float
        ("1/0", "division by zero"),
        ("5%0", "division by zero"),
        ("0**-1", "zero cannot be raised"),
        ("(-8)**0.5", "not a real number"),
        ("x+1", "unknown name 'x'"),
        ("__import__('os').system('true')", "unsupported syntax"),
        ("(1).__class__", "unsupported syntax"),
        ("[1, 2]", "unsupported syntax"),
        ("'a'*3", "unsupported literal"),
        ("True+1", "unsupported literal"),
        ("1 if 1 else 2", "unsupported syntax"),
        ("1 < 2", "unsupported syntax"),
        ("3 & 1", "unsupported operator"),
        ("1+", "invalid expression"),
        ("", "empty expression"),
        ("1" * 41, "number too long"),
        ("1+" * 150 + "1", "too long"),
        ("-" * 40 + "1", "nested too deeply"),
        ("-(" * 35 + "1" + ")" * 35, "nested too deeply"),
        ("+".join(["1"] * 100), "too complex"),
    ],
)
def test_calculator_refuses_with_a_clear_message(expression: str, message: str) -> None:
    start = time.perf_counter()
    with pytest.raises(ToolError, match=message):
        evaluate(expression)
    assert time.perf_counter() - start < 0.05  # refused before doing the expensive work


def test_calculator_bad_arguments_are_tool_errors() -> None:
    calc = make_tool("calculator")
    with pytest.raises(ToolError, match="missing argument 'expression'"):
        asyncio.run(calc({}))
    with pytest.raises(ToolError, match="must be a string, got int"):
        asyncio.run(calc({"expression": 3}))


def test_format_number_is_deterministic() -> None:
    assert format_number(3) == "3"
    assert format_number(3.0) == "3"
    assert format_number(-0.5) == "-0.5"
    assert format_number(1e20) == "1e+20"  # integral but beyond exact float range: keep float form
    assert format_number(2**70) == "1180591620717411303424"


def test_limits_are_configurable_and_validated() -> None:
    assert evaluate("2**20", CalculatorLimits(max_int_bits=21)) == 1048576
    with pytest.raises(ToolError, match="more than 20 bits"):
        evaluate("2**20", CalculatorLimits(max_int_bits=20))
    with pytest.raises(ValueError, match="max_depth must be >= 1, got 0"):
        CalculatorLimits(max_depth=0)


def test_schema_is_a_function_schema() -> None:
    schema = Calculator().schema()
    assert schema["type"] == "function"
    assert schema["function"]["name"] == "calculator"
    assert schema["function"]["parameters"]["required"] == ["expression"]
