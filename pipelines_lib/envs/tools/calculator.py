"""A safe arithmetic calculator: ``ast`` parsing over a node whitelist, never ``eval``.

Only numbers (int/float literals), ``+ - * / // % **``, unary ``+``/``-`` and parentheses are
accepted; ``×``, ``÷`` and ``^`` are read as ``*``, ``/`` and ``**`` because models write them.
Every way to burn CPU or memory is bounded before it is computed: the expression length, AST
depth and size, literal length, the size of every intermediate integer (powers are estimated
before they are evaluated), so a call finishes in microseconds or fails with a clear message.
Results print deterministically: integers (and integral floats) as integers, other floats with
12 significant digits.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipelines_lib.envs.base import Tool, ToolError, require_str_arg
from pipelines_lib.envs.registry import register_tool

_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


@dataclass(frozen=True, kw_only=True)
class CalculatorLimits:
    """Resource bounds; the defaults keep any call well under a millisecond."""

    max_chars: int = 200
    """Longest accepted expression."""
    max_depth: int = 30
    """Deepest AST nesting (parentheses, chained operators)."""
    max_nodes: int = 200
    """Most AST nodes."""
    max_literal_digits: int = 40
    """Longest numeric literal."""
    max_int_bits: int = 4096
    """Largest intermediate integer (about 1233 decimal digits)."""

    def __post_init__(self) -> None:
        for f in ("max_chars", "max_depth", "max_nodes", "max_literal_digits", "max_int_bits"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1, got {getattr(self, f)}")


def format_number(value: int | float) -> str:
    """Deterministic text of a result: ``2.0 -> "2"``, ``1/3 -> "0.333333333333"``."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    if isinstance(value, float):
        return format(value, ".12g")
    return str(value)


def evaluate(expression: str, limits: CalculatorLimits = CalculatorLimits()) -> int | float:
    """Value of ``expression``; raises :class:`ToolError` for anything outside the whitelist/limits."""
    expr = expression.replace("×", "*").replace("÷", "/").replace("^", "**").strip()
    if not expr:
        raise ToolError("empty expression")
    if len(expr) > limits.max_chars:
        raise ToolError(f"expression too long ({len(expr)} > {limits.max_chars} characters)")
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError) as e:
        raise ToolError(f"invalid expression: {getattr(e, 'msg', str(e))}") from None
    except RecursionError:
        raise ToolError("expression nested too deeply") from None
    n_nodes = sum(1 for _ in ast.walk(tree))
    if n_nodes > limits.max_nodes:
        raise ToolError(f"expression too complex ({n_nodes} > {limits.max_nodes} parts)")
    return _eval(tree.body, limits, depth=0)


def _check_int(value: int | float, limits: CalculatorLimits) -> int | float:
    if isinstance(value, int) and value.bit_length() > limits.max_int_bits:
        raise ToolError(f"result too large (more than {limits.max_int_bits} bits)")
    if isinstance(value, complex):
        raise ToolError("result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("result is not a finite number")
    return value


def _pow(base: int | float, exp: int | float, limits: CalculatorLimits) -> int | float:
    # Estimate the size before computing: 9**9**9 would otherwise take minutes and gigabytes.
    # |base| >= 2 makes the result at least `exp` bits, so the first test also keeps the float
    # conversion in the second one from overflowing.
    if (
        isinstance(base, int)
        and isinstance(exp, int)
        and abs(base) > 1
        and (exp > limits.max_int_bits or exp * math.log2(abs(base)) > limits.max_int_bits)
    ):
        raise ToolError(f"result too large (more than {limits.max_int_bits} bits)")
    try:
        return base**exp
    except ZeroDivisionError:
        raise ToolError("zero cannot be raised to a negative power") from None
    except OverflowError:
        raise ToolError("result too large") from None


def _eval(node: ast.AST, limits: CalculatorLimits, *, depth: int) -> int | float:
    if depth > limits.max_depth:
        raise ToolError(f"expression nested too deeply (more than {limits.max_depth} levels)")
    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ToolError(f"unsupported literal {v!r}; only numbers are allowed")
        if len(repr(v).lstrip("-")) > limits.max_literal_digits:
            raise ToolError(f"number too long (more than {limits.max_literal_digits} digits)")
        return _check_int(v, limits)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand, limits, depth=depth + 1))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left = _eval(node.left, limits, depth=depth + 1)
        right = _eval(node.right, limits, depth=depth + 1)
        if isinstance(node.op, ast.Pow):
            return _check_int(_pow(left, right, limits), limits)
        try:
            return _check_int(_BINOPS[type(node.op)](left, right), limits)
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        except OverflowError:
            raise ToolError("result too large") from None
    if isinstance(node, ast.Name):
        raise ToolError(f"unknown name {node.id!r}; only numbers and + - * / // % ** ( ) are allowed")
    if isinstance(node, ast.BinOp):
        raise ToolError("unsupported operator; only + - * / // % ** are allowed")
    raise ToolError(
        f"unsupported syntax ({type(node).__name__}); only numbers and + - * / // % ** ( ) are allowed"
    )


@register_tool("calculator")
class Calculator(Tool):
    """Evaluates an arithmetic expression; see the module docstring for what is accepted."""

    # Terse: the schema is rendered into every prompt of the tiny demo model (256-token context).
    description = "Evaluate an arithmetic expression."
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    }

    def __init__(self, *, limits: CalculatorLimits = CalculatorLimits()) -> None:
        self.limits = limits

    async def __call__(self, arguments: dict[str, Any]) -> str:
        expression = require_str_arg(arguments, "expression", max_len=self.limits.max_chars * 4)
        return format_number(evaluate(expression, self.limits))
