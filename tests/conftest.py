"""Shared fixtures: where the published benchmark graphs live."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# The suite draws the same examples on every run (CI stays reproducible: a failure is a bug, not a
# draw); `HYPOTHESIS_PROFILE=explore` draws new ones, and benchmarks/bench_fuzz explores at scale.
settings.register_profile("reproducible", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "reproducible"))

# Plain `pytest` (not `python -m pytest`) does not put the checkout on sys.path; the tests import
# `coop` and `tests.strategies` from it without an install.
_CHECKOUT = str(Path(__file__).resolve().parents[1])
if _CHECKOUT not in sys.path:
    sys.path.insert(0, _CHECKOUT)

#: The published Moccasin/Checkmate graphs shipped with the project (graphs/moccasin/README.md names their source).
MOCCASIN_DIR = Path(__file__).resolve().parents[1] / "graphs" / "moccasin"


@pytest.fixture(scope="session")
def moccasin_dir() -> Path:
    """The folder of published graphs (graphs/moccasin); skips the test when it is absent."""
    if not MOCCASIN_DIR.is_dir():
        pytest.skip(f"published graphs not found at {MOCCASIN_DIR} (graphs/moccasin of the checkout)")
    return MOCCASIN_DIR
