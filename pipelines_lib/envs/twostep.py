"""``twostep``: "What is 7*8+5?" with a calculator that does one operation per call.

The calculator here refuses any expression with more than one binary operation, so a task takes two calls and
the first call's result has to be carried into the second: ``calculator(7*8) -> 56``, then
``calculator(56+5) -> 61``, then ``<answer>61</answer>``. The first operation is ``+`` or ``*`` (so the carried
number is positive and the second call is one operation), the second ``+`` or ``-``; by precedence the prompt's
expression is exactly those two steps.

Unlike ``arithmetic``, where the warm start's flaw is how the answer is written, a policy here fails for what it
does: it answers the intermediate result after one call (``stop_early``), or carries a wrong number into the
second call (``wrong_carry``). Both answers are well-formed integers, so the ``format`` reward part (exactly one
``<answer>`` holding an integer) separates "cannot write the answer" from "cannot do the task".

Operands have one digit by default. On the tiny model, with two-digit operands a long warm start on mostly clean
demonstrations still fails at the carry and at looking the third operand back up in the prompt (too little
reward for GRPO to start from); with one digit, a shorter one on mostly clean demonstrations solves every held-out
task greedily. The ``twostep`` recipe (``recipes/twostep.yaml``) sits between: one digit, a
shorter warm start, 60 % flawed demonstrations.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from pipelines_lib.envs.arithmetic import ArithmeticEnv
from pipelines_lib.envs.base import Message, Task, answer_text, extract_answers, hermes_tool_call
from pipelines_lib.envs.registry import register_env
from pipelines_lib.envs.tools.calculator import CalculatorLimits, evaluate, format_number

MISTAKES: tuple[str, ...] = ("stop_early", "wrong_carry")
"""Kinds of flawed demonstration: answer the first call's result, or carry a wrong number into the second call."""

ONE_OPERATION = CalculatorLimits(max_nodes=7)
"""``a*b`` parses to 5 AST nodes and ``-5+12`` to 7 (a signed operand); any second operation takes 8 or more."""

SYSTEM_PROMPT = "Use the calculator tool, one operation per call. Give the final answer as <answer>NUMBER</answer>."

_INTEGER_RE = re.compile(r"-?\d+")


@dataclass(frozen=True, kw_only=True)
class TwoStepConfig:
    operand_digits: int = 1
    """Digits of every operand (1 -> 1..9, 2 -> 10..99)."""
    first_ops: str = "+*"
    """Operators of the first step (a subset of ``+*``: the carried number stays positive)."""
    second_ops: str = "+-"
    """Operators of the second step (a subset of ``+-``: lower precedence, so it applies to the first result)."""
    heldout_fraction: float = 0.2
    """Share of the task space (by expression) reserved for the held-out split."""
    max_turns: int = 4
    """Assistant messages per episode: two tool calls and the answer, plus one spare."""
    mistakes: tuple[str, ...] = MISTAKES
    """Kinds of flawed demonstration drawn from (see :data:`MISTAKES`)."""

    def __post_init__(self) -> None:
        if not 1 <= self.operand_digits <= 4:
            raise ValueError(f"operand_digits must be in 1..4, got {self.operand_digits}")
        if not self.first_ops or set(self.first_ops) - set("+*"):
            raise ValueError(f"first_ops must be a non-empty subset of '+*', got {self.first_ops!r}")
        if not self.second_ops or set(self.second_ops) - set("+-"):
            raise ValueError(f"second_ops must be a non-empty subset of '+-', got {self.second_ops!r}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        if self.max_turns < 3:
            raise ValueError(f"max_turns must be >= 3 (two calls and the answer), got {self.max_turns}")
        if not self.mistakes or set(self.mistakes) - set(MISTAKES):
            raise ValueError(f"mistakes must be a non-empty subset of {MISTAKES}, got {self.mistakes!r}")


def steps_of(expression: str) -> tuple[str, str]:
    """The two one-operation calls that compute ``a op1 b op2 c``: ``("a op1 b", "<a op1 b> op2 c")``."""
    m = re.fullmatch(r"(\d+[+*]\d+)([+-]\d+)", expression)
    if m is None:
        raise ValueError(f"not a two-step expression: {expression!r}")
    first = m.group(1)
    return first, format_number(evaluate(first)) + m.group(2)


@register_env("twostep")
class TwoStepEnv(ArithmeticEnv):
    """``arithmetic`` with a one-operation calculator and two-step expressions; rewards insist on an integer."""

    system_prompt = SYSTEM_PROMPT
    config_class: ClassVar[type] = TwoStepConfig
    calculator_limits: ClassVar[CalculatorLimits] = ONE_OPERATION

    @classmethod
    def draw_expression(cls, config: Any, rng: random.Random) -> str:
        """``a op1 b op2 c`` with ``op1`` from ``first_ops`` and ``op2`` from ``second_ops``."""
        lo, hi = 10 ** (config.operand_digits - 1), 10**config.operand_digits - 1
        a, b, c = (rng.randint(lo, hi) for _ in range(3))
        return f"{a}{rng.choice(config.first_ops)}{b}{rng.choice(config.second_ops)}{c}"

    def reward(self, task: Task, response: str) -> tuple[float, dict[str, float]]:
        """``arithmetic``'s, except that ``format`` is 1 only when the one answer is an integer."""
        correct, parts = super().reward(task, response)
        answers = extract_answers(response)
        well_formed = float(len(answers) == 1 and _INTEGER_RE.fullmatch(answers[0]) is not None)
        return correct, parts | {"format": well_formed}

    def _demonstration(self, task: Task, *, corrupt: bool, rng: random.Random) -> list[Message]:
        first, second = steps_of(task.meta["expression"])
        mistake = rng.choice(self.config.mistakes) if corrupt else None
        r1 = format_number(evaluate(first))
        messages: list[Message] = [
            {"role": "assistant", "content": hermes_tool_call("calculator", {"expression": first})},
            {"role": "tool", "name": "calculator", "content": r1},
        ]
        if mistake == "stop_early":
            return [*messages, {"role": "assistant", "content": answer_text(r1)}]
        if mistake == "wrong_carry":
            second = str(int(r1) + rng.choice((-10, -1, 1, 10))) + second[len(r1):]
        r2 = format_number(evaluate(second))
        return [
            *messages,
            {"role": "assistant", "content": hermes_tool_call("calculator", {"expression": second})},
            {"role": "tool", "name": "calculator", "content": r2},
            {"role": "assistant", "content": answer_text(r2)},
        ]
