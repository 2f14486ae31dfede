"""Shared fixtures: where the published benchmark graphs live."""

from __future__ import annotations

from pathlib import Path

import pytest

#: ../shared/graphs/moccasin next to the checkout (DESIGN.md: tests read them from there).
MOCCASIN_DIR = Path(__file__).resolve().parents[2] / "shared" / "graphs" / "moccasin"


@pytest.fixture(scope="session")
def moccasin_dir() -> Path:
    """The folder of published graphs; skips the test when the shared folder is absent."""
    if not MOCCASIN_DIR.is_dir():
        pytest.skip(f"published graphs not found at {MOCCASIN_DIR} (the shared folder is absent)")
    return MOCCASIN_DIR
