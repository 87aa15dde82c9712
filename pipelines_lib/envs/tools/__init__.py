"""Built-in tools: calculator, sandboxed Python, knowledge-base search; plus the latency wrapper and
``run_tool`` (the single place tool failures become statuses). Importing this package registers the
tools in :data:`pipelines_lib.envs.registry.TOOL_REGISTRY` and the sandbox's isolation backends in
:data:`pipelines_lib.envs.tools.sandbox.ISOLATION_BACKENDS` (``bwrap`` from :mod:`.bwrap`, ``none``)."""

from pipelines_lib.envs.tools import bwrap  # noqa: F401  (registers the default isolation backend)
from pipelines_lib.envs.tools.calculator import Calculator, CalculatorLimits
from pipelines_lib.envs.tools.latency import LatencyProfile, LatencyTool, with_latency
from pipelines_lib.envs.tools.runner import ToolErrorKind, run_tool
from pipelines_lib.envs.tools.sandbox import PythonSandbox, PythonTool, SandboxConfig, SandboxResult
from pipelines_lib.envs.tools.search import SearchTool

__all__ = [
    "Calculator",
    "CalculatorLimits",
    "LatencyProfile",
    "LatencyTool",
    "PythonSandbox",
    "PythonTool",
    "SandboxConfig",
    "SandboxResult",
    "SearchTool",
    "ToolErrorKind",
    "run_tool",
    "with_latency",
]
