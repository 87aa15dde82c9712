"""The results record both harnesses write, ``bench/results.json``: flat figures, text labels and one run record
per writer (a benchmark, or ``reliability`` for the drills).

``bench.runner`` and ``drills.runner`` each merge their figures with ``merge_results`` (a writer's keys replaced
whole, everything else kept), stamp their run with ``machine_info`` and write the file with ``write_atomically``
(a reader never sees half of it).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

RESULTS = Path("bench/results.json")


def machine_info() -> dict[str, Any]:
    """What the figures depend on: CPU, memory, load (other jobs share small machines), library versions."""
    import numpy
    import pyarrow

    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "load_1min": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "pyarrow": pyarrow.__version__,
        "numpy": numpy.__version__,
    }


def merge_results(previous: Mapping[str, Any], name: str, run: Mapping[str, Any], *, figures: Mapping[str, float],
                  labels: Mapping[str, str] | None = None,
                  owner: Callable[[str], str] | None = None) -> dict[str, Any]:
    """``previous`` with writer ``name``'s figures, labels and run record replaced by these (pure). ``run`` is the
    run's record as stored; ``owner(key)`` names the writer a key belongs to (default: the part before its first
    dot)."""
    owner = owner or (lambda key: key.split(".", 1)[0])
    merged = {k: v for k, v in previous.get("figures", {}).items() if owner(k) != name}
    merged.update({k: float(v) for k, v in figures.items()})
    texts = {k: v for k, v in previous.get("labels", {}).items() if owner(k) != name} | dict(labels or {})
    runs = {**previous.get("runs", {}), name: dict(run)}
    return {"figures": dict(sorted(merged.items())), **({"labels": dict(sorted(texts.items()))} if texts else {}),
            "runs": dict(sorted(runs.items()))}


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
