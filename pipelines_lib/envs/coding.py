"""``code``: write a small Python function; scored by running hidden tests in the sandbox.

Problems come from parameterised families ("... the sum of the numbers in xs that are divisible by
7"); each family has a reference solution template, and a task's tests are inputs drawn from the
task's key with expected outputs computed by running that (trusted, in-repo) reference in-process.

Scoring runs the model's code plus a harness in :class:`PythonSandbox`. Only the test *inputs*
enter the sandbox; the harness swallows the code's own output and prints the function's outputs on
one line tagged with a fresh random nonce, and the comparison with the expected outputs happens
here. So printing cannot hide the result line, and tampering with the harness (it shares the
code's process) cannot pass a test without computing its answer. The reward is the fraction of
tests passed (``correct`` is 1 only when all pass). With ``max_attempts > 1`` a failed answer gets
a feedback message and another try.

The model may use the ``python`` tool (same sandbox) to try its code first; demonstrations do that
once, printing the function's result on one test input, then answer with the function in
``<answer>...</answer>``. Flawed demonstrations use the family's template with other parameters.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipelines_lib.envs.base import (
    BaseTaskEnv,
    Message,
    StepResult,
    Task,
    answer_text,
    draw_unique_tasks,
    extract_answers,
    hermes_tool_call,
    task_id_for,
)
from pipelines_lib.envs.registry import register_env
from pipelines_lib.envs.tools.sandbox import PythonSandbox, PythonTool, SandboxConfig

LETTERS = "abcde"


@dataclass(frozen=True)
class Family:
    """One problem family: prompt and reference body are ``str.format`` templates over ``params``."""

    arg: str
    """``xs`` (list of ints), ``s`` (string) or ``n`` (int)."""
    prompt: str
    body: str
    params: tuple[dict[str, Any], ...]
    """Every parameter setting of the family; one task each."""


def _a(values: Any) -> tuple[dict[str, Any], ...]:
    return tuple({"a": v} for v in values)


def _ab(pairs: Any) -> tuple[dict[str, Any], ...]:
    return tuple({"a": a, "b": b} for a, b in pairs)


FAMILIES: dict[str, Family] = {
    "sum_divisible": Family("xs", "returns the sum of the numbers in xs that are divisible by {a}",
                            "return sum(x for x in xs if x % {a} == 0)", _a(range(2, 21))),
    "count_greater": Family("xs", "returns how many numbers in xs are greater than {a}",
                            "return sum(1 for x in xs if x > {a})", _a(range(-9, 21))),
    "times": Family("xs", "returns a list with every number in xs multiplied by {a}",
                    "return [x * {a} for x in xs]", _a(range(2, 21))),
    "plus": Family("xs", "returns a list with {a} added to every number in xs",
                   "return [x + {a} for x in xs]", _a(range(1, 21))),
    "drop_equal": Family("xs", "returns xs without the numbers equal to {a}",
                         "return [x for x in xs if x != {a}]", _a(range(-5, 11))),
    "square_sum_below": Family("xs", "returns the sum of the squares of the numbers in xs that are less than {a}",
                               "return sum(x * x for x in xs if x < {a})", _a(range(-5, 16))),
    "sum_between": Family("xs", "returns the sum of the numbers in xs that are at least {a} and at most {b}",
                          "return sum(x for x in xs if {a} <= x <= {b})",
                          _ab((a, b) for a in range(-10, 11) for b in range(a + 2, 21))),
    "affine": Family("xs", "returns a list with every number in xs multiplied by {a} and then increased by {b}",
                     "return [x * {a} + {b} for x in xs]", _ab((a, b) for a in range(2, 10) for b in range(1, 21))),
    "count_either": Family("xs", "returns how many numbers in xs are divisible by {a} or by {b}",
                           "return sum(1 for x in xs if x % {a} == 0 or x % {b} == 0)",
                           _ab((a, b) for a in range(2, 13) for b in range(a + 1, 13))),
    "repeat": Family("s", "returns the string s repeated {a} times", "return s * {a}", _a(range(2, 10))),
    "prefix": Family("s", "returns the first {a} characters of s", "return s[:{a}]", _a(range(1, 10))),
    "count_letter": Family("s", "returns how many times the letter {a} appears in s",
                           "return s.count('{a}')", _a(LETTERS)),
    "remove_letter": Family("s", "returns s with every letter {a} removed",
                            "return s.replace('{a}', '')", _a(LETTERS)),
    "mod": Family("n", "returns the remainder of n divided by {a}", "return n % {a}", _a(range(2, 21))),
    "multiple": Family("n", "returns True if n is divisible by {a} and False otherwise",
                       "return n % {a} == 0", _a(range(2, 21))),
    "linear": Family("n", "returns n multiplied by {a} plus {b}", "return n * {a} + {b}",
                     _ab((a, b) for a in range(2, 21) for b in range(1, 31))),
}  # fmt: skip

SYSTEM_PROMPT = "You can test code with the python tool. Give the final answer as <answer>CODE</answer>."

FENCE_RE = re.compile(r"^```(?:python)?\n(.*?)\n?```$", re.DOTALL)


@dataclass(frozen=True, kw_only=True)
class CodeConfig:
    n_tests: int = 5
    """Hidden tests per task."""
    heldout_fraction: float = 0.2
    max_turns: int = 4
    """Assistant messages per episode (tool runs, answers and retries together)."""
    max_attempts: int = 1
    """Answers scored per episode; > 1 turns failures into feedback and another try."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)

    def __post_init__(self) -> None:
        if self.n_tests < 1:
            raise ValueError(f"n_tests must be >= 1, got {self.n_tests}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")

    @classmethod
    def tiny(cls) -> CodeConfig:
        return cls(n_tests=3, sandbox=SandboxConfig.tiny())


def reference_solution(family: str, params: dict[str, Any]) -> str:
    f = FAMILIES[family]
    return f"def f({f.arg}):\n    {f.body.format(**params)}\n"


def _reference(source: str) -> Any:
    # Trusted in-repo templates (FAMILIES), never model output: model code only runs in the sandbox.
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    return namespace["f"]


def _expected(fn: Callable[..., Any], args: list[Any]) -> Any:
    """A reference function's result as the harness compares it (after a JSON round trip)."""
    return json.loads(json.dumps(fn(*args)))


def _draw_input(arg: str, rng: random.Random) -> Any:
    if arg == "xs":
        return [rng.randint(-10, 20) for _ in range(rng.randint(0, 7))]
    if arg == "s":
        return "".join(rng.choice(LETTERS) for _ in range(rng.randint(0, 9)))
    return rng.randint(-50, 200)


_HARNESS = """
import contextlib, io, json
CODE = json.loads({code})
INPUTS = json.loads({inputs})
outputs = []
sink = io.StringIO()
try:
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        namespace = {{"__name__": "solution"}}
        exec(compile(CODE, "solution.py", "exec"), namespace)
        fn = namespace["f"]
        for args in INPUTS:
            try:
                outputs.append([json.dumps(fn(*args))])
            except Exception:
                outputs.append(None)
except Exception:
    pass
print({nonce} + json.dumps(outputs))
"""


def feedback_text(*, failed: int, total: int) -> str:
    """The user message after a failed attempt (when ``max_attempts > 1``)."""
    return f"Your function failed {failed} of {total} tests. Try again."


def _decodes_to(output: Any, expected: Any) -> bool:
    """Whether a harness output cell (``[json text]`` or None) holds ``expected``."""
    if not (isinstance(output, list) and len(output) == 1 and isinstance(output[0], str)):
        return False
    try:
        return json.loads(output[0]) == expected
    except ValueError:
        return False


def extract_code(response: str) -> str | None:
    """The code of the last ``<answer>``, without a Markdown fence if there is one."""
    answers = extract_answers(response)
    if not answers:
        return None
    m = FENCE_RE.match(answers[-1])
    return m.group(1) if m else answers[-1]


@register_env("code")
class CodeEnv(BaseTaskEnv):
    system_prompt = SYSTEM_PROMPT
    runs_code = True

    def __init__(self, *, config: CodeConfig = CodeConfig(), sandbox: PythonSandbox | None = None) -> None:
        super().__init__(max_turns=config.max_turns)
        self.config = config
        self._tool = PythonTool(sandbox=sandbox) if sandbox is not None else PythonTool(config=config.sandbox)
        self._set_tools([self._tool])
        self._attempts = 0

    @property
    def sandbox(self) -> PythonSandbox:
        """The python tool's sandbox, started at its first use rather than with the env."""
        return self._tool.sandbox

    @classmethod
    def generate_tasks(cls, *, seed: int, n: int, split: str, config: CodeConfig | None = None) -> list[Task]:
        cfg = config or CodeConfig()
        names = sorted(FAMILIES)

        def draw(rng: random.Random) -> tuple[str, Callable[[], Task]]:
            family = rng.choice(names)
            fam = FAMILIES[family]
            params = rng.choice(fam.params)
            prompt = f"Write a Python function f({fam.arg}) that {fam.prompt.format(**params)}."

            def build() -> Task:
                source = reference_solution(family, params)
                fn = _reference(source)
                test_rng = random.Random(f"tests/{prompt}")  # the tests depend on the task only
                inputs = [[_draw_input(fam.arg, test_rng)] for _ in range(cfg.n_tests)]
                return Task(
                    task_id=task_id_for(cls.name, prompt),
                    env_name=cls.name,
                    prompt=prompt,
                    answer=source,
                    meta={
                        "family": family,
                        "params": params,
                        "tests": [[a, _expected(fn, a)] for a in inputs],
                    },
                )

            return prompt, build

        return draw_unique_tasks(
            env_name=cls.name, seed=seed, n=n, split=split, heldout_fraction=cfg.heldout_fraction, draw=draw
        )

    async def reset(self, task: Task) -> list[Message]:
        self._attempts = 0
        return await super().reset(task)

    async def step(self, response: str) -> StepResult:
        self._attempts += 1
        reward, parts = await self.score(self.task, response)
        if parts["correct"] == 1.0 or self._attempts >= self.config.max_attempts:
            return StepResult(reward=reward, done=True, reward_parts=parts)
        n = len(self.task.meta["tests"])
        failed = n - round(parts["tests_passed"] * n)
        feedback = feedback_text(failed=failed, total=n)
        return StepResult(
            reward=reward, done=False, reward_parts=parts, messages=[{"role": "user", "content": feedback}]
        )

    async def score(self, task: Task, response: str) -> tuple[float, dict[str, float]]:
        code = extract_code(response)
        tests = task.meta["tests"]
        passed = await self._run_tests(code, tests) if code is not None else [False] * len(tests)
        fraction = sum(passed) / len(tests)
        parts = {
            "correct": float(all(passed)),
            "tests_passed": fraction,
            "format": float(code is not None),
            "used_tool": float(self.tool_calls > 0),
        }
        return fraction, parts

    def reward(self, task: Task, response: str) -> tuple[float, dict[str, float]]:
        """Synchronous scoring for scripts; inside an event loop use ``await env.score(...)``."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            reward, parts = asyncio.run(self.score(task, response))
            return reward, {k: v for k, v in parts.items() if k != "used_tool"}
        raise RuntimeError(
            "CodeEnv.reward runs the sandbox; inside an event loop use `await env.score(task, response)`"
        )

    async def _run_tests(self, code: str, tests: list[Any]) -> list[bool]:
        # Only the inputs enter the sandbox and the comparison happens here, so code that tampers
        # with the harness (it shares its process) cannot pass without computing the right outputs.
        nonce = "RESULT-" + secrets.token_hex(8) + " "
        inputs = [args for args, _ in tests]
        program = _HARNESS.format(
            code=json.dumps(json.dumps(code)), inputs=json.dumps(json.dumps(inputs)), nonce=json.dumps(nonce)
        )
        if len(program) > self.sandbox.config.max_code_chars:
            return [False] * len(tests)  # an over-long answer fails its tests; it is not an env error
        result = await self.sandbox.run(program)
        outputs: list[Any] = []
        for line in reversed(result.stdout.splitlines()):
            if line.startswith(nonce):
                with contextlib.suppress(ValueError):
                    outputs = json.loads(line[len(nonce) :])
                break
        if not isinstance(outputs, list):
            outputs = []
        return [
            _decodes_to(outputs[i] if i < len(outputs) else None, exp) for i, (_, exp) in enumerate(tests)
        ]

    def _demonstration(self, task: Task, *, corrupt: bool, rng: random.Random) -> list[Message]:
        source = self._wrong_solution(task, rng) if corrupt else task.answer
        fn = _reference(source)
        # Try the function on a test input whose printed result is not empty (clearer to read).
        inputs = [args[0] for args, _ in task.meta["tests"]]
        shown = next((x for x in inputs if str(fn(x))), inputs[0])
        return [
            {
                "role": "assistant",
                "content": hermes_tool_call("python", {"code": source + f"print(f({shown!r}))\n"}),
            },
            {"role": "tool", "name": "python", "content": str(fn(shown))},
            {"role": "assistant", "content": answer_text("\n" + source)},
        ]

    def _wrong_solution(self, task: Task, rng: random.Random) -> str:
        """A plausible solution (the family's template, other parameters) that fails a hidden test."""
        fam = FAMILIES[task.meta["family"]]
        candidates = [p for p in fam.params if p != task.meta["params"]]
        rng.shuffle(candidates)
        for params in candidates:
            source = reference_solution(task.meta["family"], params)
            fn = _reference(source)
            if any(_expected(fn, args) != expected for args, expected in task.meta["tests"]):
                return source
        return f"def f({fam.arg}):\n    return None\n"
