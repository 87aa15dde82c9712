"""``arithmetic``: the embedded demo task. "What is 37*48?" solved with one calculator call.

The language is tiny and regular on purpose (digits, ``+ - *``, three prompt phrasings, one answer
format) so the default tokenizer stays small and a tiny model learns the loop in minutes: call
``calculator`` with the expression from the prompt, copy the result into ``<answer>...</answer>``.
Difficulty grows with :attr:`ArithmeticConfig.operand_digits` and :attr:`ArithmeticConfig.n_ops`.

Flawed demonstrations (``demonstration(task, error_rate=...)``) make one of the mistakes a weak policy
makes (:data:`MISTAKES`): the right number written as a float (``<answer>2332.0</answer>``: the exact-match
reward wants an integer), a guess without calling the tool, a mistyped expression (the tool answers the wrong
question), or a wrong copy of the tool result. Each scores 0. The default is the float answer. On the
tiny model a warm start on mostly float answers still learns to copy the tool's result, because every
demonstration puts those digits at the same place, and the flaw is one token after them that reward alone fixes
(GRPO learns the format in a few steps, then copying sharpens: the ``learning`` benchmark). Flaws that change the
answer's digits or what precedes them (a guess without the tool, even as a minority of the demonstrations; a
missing answer tag; copy mistakes) keep it from learning to copy at all within the warm start.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pipelines_lib.envs.base import (
    BaseTaskEnv,
    Message,
    Task,
    answer_text,
    draw_unique_tasks,
    extract_answers,
    hermes_tool_call,
    task_id_for,
)
from pipelines_lib.envs.registry import register_env
from pipelines_lib.envs.tools.calculator import Calculator, CalculatorLimits, evaluate, format_number

MISTAKES: tuple[str, ...] = ("float_answer", "no_tool", "wrong_expression", "wrong_copy")
"""Kinds of flawed demonstration, see the module docstring."""

PROMPTS: tuple[str, ...] = ("What is {expr}?", "Compute {expr}.", "Calculate {expr}.")

# Short on purpose: the tiny demo model's context is 256 tokens (tool schemas included).
SYSTEM_PROMPT = "Use the calculator tool. Give the final answer as <answer>NUMBER</answer>."


@dataclass(frozen=True, kw_only=True)
class ArithmeticConfig:
    operand_digits: int = 2
    """Digits of every operand (2 -> 10..99)."""
    n_ops: int = 1
    """Binary operators per expression (1 -> ``a*b``, 2 -> ``a*b+c``). Measured on the tiny model: one
    operator is copied reliably after ~150 warm-start steps, two need more than 300 and stay fragile."""
    operators: str = "+-*"
    """Operators to draw from; ``*`` binds tighter, as in Python."""
    heldout_fraction: float = 0.2
    """Share of the task space (by expression) reserved for the held-out split."""
    max_turns: int = 3
    """Assistant messages per episode: one tool call and the answer, plus one spare."""
    mistakes: tuple[str, ...] = ("float_answer",)
    """Kinds of flawed demonstration drawn from (see :data:`MISTAKES` and the module docstring)."""

    def __post_init__(self) -> None:
        if not 1 <= self.operand_digits <= 6:
            raise ValueError(f"operand_digits must be in 1..6, got {self.operand_digits}")
        if not 1 <= self.n_ops <= 6:
            raise ValueError(f"n_ops must be in 1..6, got {self.n_ops}")
        if not self.operators or set(self.operators) - set("+-*"):
            raise ValueError(f"operators must be a non-empty subset of '+-*', got {self.operators!r}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if not self.mistakes or set(self.mistakes) - set(MISTAKES):
            raise ValueError(f"mistakes must be a non-empty subset of {MISTAKES}, got {self.mistakes!r}")

    @classmethod
    def tiny(cls) -> ArithmeticConfig:
        """The CPU demo: one operation on two 2-digit numbers."""
        return cls()


@register_env("arithmetic")
class ArithmeticEnv(BaseTaskEnv):
    """Tasks are expressions to evaluate with the calculator. A variant (``twostep``) subclasses it with its own
    config (``config_class``), expressions (``draw_expression``), calculator limits and demonstrations."""

    system_prompt = SYSTEM_PROMPT
    config_class: ClassVar[type] = ArithmeticConfig
    calculator_limits: ClassVar[CalculatorLimits] = CalculatorLimits()

    def __init__(self, *, config: Any = None) -> None:
        """``config``: an instance of ``config_class`` (its defaults when None)."""
        config = config or self.config_class()
        super().__init__(max_turns=config.max_turns)
        self.config = config
        self._set_tools([Calculator(limits=self.calculator_limits)])

    @classmethod
    def draw_expression(cls, config: Any, rng: random.Random) -> str:
        """One expression of ``config`` (``n_ops`` operators between ``operand_digits``-digit operands)."""
        lo, hi = 10 ** (config.operand_digits - 1), 10**config.operand_digits - 1
        expr = str(rng.randint(lo, hi))
        for _ in range(config.n_ops):
            expr += rng.choice(config.operators) + str(rng.randint(lo, hi))
        return expr

    @classmethod
    def generate_tasks(cls, *, seed: int, n: int, split: str, config: Any = None) -> list[Task]:
        cfg = config or cls.config_class()

        def draw(rng: random.Random) -> tuple[str, Callable[[], Task]]:
            expr = cls.draw_expression(cfg, rng)
            prompt = rng.choice(PROMPTS).format(expr=expr)
            return expr, lambda: Task(
                task_id=task_id_for(cls.name, expr),
                env_name=cls.name,
                prompt=prompt,
                answer=format_number(evaluate(expr)),
                meta={"expression": expr},
            )

        return draw_unique_tasks(
            env_name=cls.name, seed=seed, n=n, split=split, heldout_fraction=cfg.heldout_fraction, draw=draw
        )

    def reward(self, task: Task, response: str) -> tuple[float, dict[str, float]]:
        answers = extract_answers(response)
        correct = float(bool(answers) and answers[-1] == task.answer)
        return correct, {"correct": correct, "format": float(len(answers) == 1)}

    def _demonstration(self, task: Task, *, corrupt: bool, rng: random.Random) -> list[Message]:
        expr = task.meta["expression"]
        mistake = rng.choice(self.config.mistakes) if corrupt else None
        if mistake == "no_tool":
            return [{"role": "assistant", "content": answer_text(_near_miss(task.answer, rng))}]
        if mistake == "wrong_expression":
            expr = _mistype(expr, task.answer, rng)
        result = format_number(evaluate(expr))
        final = result
        if mistake == "wrong_copy":
            final = _near_miss(result, rng)
        elif mistake == "float_answer":
            final = f"{result}.0"  # the right number, but the exact-match reward wants an integer
        return [
            {"role": "assistant", "content": hermes_tool_call("calculator", {"expression": expr})},
            {"role": "tool", "name": "calculator", "content": result},
            {"role": "assistant", "content": answer_text(final)},
        ]


def _near_miss(answer: str, rng: random.Random) -> str:
    """A plausible wrong integer: off by 1 or 10."""
    return str(int(answer) + rng.choice((-10, -1, 1, 10)))


def _mistype(expr: str, answer: str, rng: random.Random) -> str:
    """``expr`` with one digit changed, chosen so that its value differs from ``answer``."""
    digits = [i for i, c in enumerate(expr) if c.isdigit()]
    while True:
        i = rng.choice(digits)
        new = str((int(expr[i]) + rng.randint(1, 9)) % 10)
        starts_number = i == 0 or not expr[i - 1].isdigit()
        if new == "0" and starts_number and i + 1 < len(expr) and expr[i + 1].isdigit():
            continue  # no leading zeros: "07" is a syntax error in Python
        candidate = expr[:i] + new + expr[i + 1 :]
        if format_number(evaluate(candidate)) != answer:
            return candidate
