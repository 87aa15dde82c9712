"""Task environments and tools.

- :mod:`.base`: the contract (``Task``, ``StepResult``, ``Tool``, ``ToolError``, ``BaseTaskEnv``).
- :mod:`.registry`: ``ENV_REGISTRY``/``TOOL_REGISTRY``, ``make_env``/``make_tool``.
- :mod:`.tools`: calculator, sandboxed Python, search, latency wrapper, ``run_tool``.
- Built-in envs: :mod:`.arithmetic` (the demo), :mod:`.twostep` (two calculator calls, the first result
  carried into the second), :mod:`.multihop` (search over :mod:`.knowledge`), :mod:`.coding` (``code``:
  functions checked in the sandbox).
- :mod:`.corpus`: ``all_text_for_tokenizer`` for the default tokenizer.

Importing this package imports every built-in env and tool so the registries are complete.
"""

from pipelines_lib.envs import arithmetic, coding, multihop, tools, twostep  # noqa: F401  (registers the built-ins)
from pipelines_lib.envs.base import (
    BaseTaskEnv,
    InfraError,
    Message,
    StepResult,
    Task,
    Tool,
    ToolError,
    hermes_tool_call,
)
from pipelines_lib.envs.corpus import all_text_for_tokenizer
from pipelines_lib.envs.registry import (
    ENV_REGISTRY,
    TOOL_REGISTRY,
    env_class,
    make_env,
    make_tool,
    register_env,
    register_tool,
)
from pipelines_lib.envs.tools import LatencyProfile, run_tool, with_latency

__all__ = [
    "ENV_REGISTRY",
    "TOOL_REGISTRY",
    "all_text_for_tokenizer",
    "BaseTaskEnv",
    "InfraError",
    "LatencyProfile",
    "Message",
    "StepResult",
    "Task",
    "Tool",
    "ToolError",
    "env_class",
    "hermes_tool_call",
    "make_env",
    "make_tool",
    "register_env",
    "register_tool",
    "run_tool",
    "with_latency",
]
