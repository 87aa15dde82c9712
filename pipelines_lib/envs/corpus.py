"""Representative text of every registered env, for training the default tokenizer.

The tokenizer builder trains on exactly what the model will read and write: system prompts, tool
schemas (the chat template may render them), prompts of both splits, perfect and flawed
demonstrations (tool calls, tool results, answers), and the fixed status texts tools and envs
produce (errors, timeouts, sandbox status lines, retry feedback).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

from pipelines_lib.envs.base import ToolError
from pipelines_lib.envs.coding import feedback_text
from pipelines_lib.envs.registry import ENV_REGISTRY, TOOL_REGISTRY, env_class
from pipelines_lib.envs.tools.calculator import evaluate
from pipelines_lib.envs.tools.runner import timeout_text
from pipelines_lib.envs.tools.sandbox import SandboxResult

# Inputs that make the calculator explain itself; their error texts are tool results models see.
_BAD_EXPRESSIONS: tuple[str, ...] = ("1/0", "9**9**9", "x+1", "1+", "(-8)**0.5", "1e308*10", "f(2)", "")


def status_texts() -> Iterator[str]:
    """Fixed texts produced by tools and envs rather than by task generators."""
    for expr in _BAD_EXPRESSIONS:
        try:
            evaluate(expr)
        except ToolError as e:
            yield f"Error: {e}"
    for name in sorted(TOOL_REGISTRY):
        yield timeout_text(name, 10.0)
    for exit_code, timed_out, truncated in (
        (1, False, False),
        (-9, True, False),
        (-9, False, True),
        (0, False, False),
    ):
        result = SandboxResult(
            stdout="", stderr="", exit_code=exit_code, timed_out=timed_out, truncated=truncated, wall_s=0.0
        )
        yield result.as_text(timeout_s=5.0)
    yield "[stderr]\nTraceback (most recent call last):"
    for failed in range(1, 6):
        yield feedback_text(failed=failed, total=5)


def all_text_for_tokenizer(
    seed: int, *, n_per_env: int = 200, error_rate: float = 0.3, env_names: Sequence[str] | None = None
) -> Iterator[str]:
    """Yield text of the envs (all registered ones by default): ``n_per_env`` train tasks each and a
    quarter as many held-out, then the fixed status texts.

    Deterministic in ``seed``. Each demonstration message is yielded as its own string.
    """
    for name in sorted(env_names if env_names is not None else ENV_REGISTRY):
        cls = env_class(name)
        env = cls()
        yield env.system_prompt
        for tool in env.tools().values():
            yield json.dumps(tool.schema())
        for split, n in (("train", n_per_env), ("heldout", max(1, n_per_env // 4))):
            for task in cls.generate_tasks(seed=seed, n=n, split=split):
                yield task.prompt
                for message in env.demonstration(task, error_rate=error_rate, seed=seed)[2:]:
                    yield message["content"]
    yield from status_texts()
