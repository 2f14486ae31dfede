"""Import a script of benchmarks/ as a module, for the tests that check a benchmark's own logic."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported under a private module name (registered in ``sys.modules`` first: a
    benchmark's dataclasses look their module up while being defined).

    Parameters
    ----------
    name : str
        The script's file name without ``.py`` (``"bench_delta"``).

    Returns
    -------
    ModuleType
        The imported script.
    """
    spec = importlib.util.spec_from_file_location(f"coop_benchmark_{name}_under_test", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
