"""Property tests in two tiers: `make test` draws fewer hypothesis examples, the slow tier (`make test-all`) the full
count, through the same property and the same oracle.

    @examples(50, 150)
    def test_something(examples: int) -> None:
        check(_something, examples, PROPERTY, data=st.data())

where ``_something(data)`` is the property (what ``@given`` decorated before) and ``PROPERTY`` the module's settings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings


def examples(fast: int, full: int) -> pytest.MarkDecorator:
    """Parametrize a property test's ``examples``: ``fast`` draws in the fast tier, ``full`` (marked slow) in the slow
    tier."""
    return pytest.mark.parametrize("examples", [fast, pytest.param(full, marks=pytest.mark.slow)],
                                   ids=["fast", "full"])


def check(prop: Callable[..., None], examples: int, base: settings, **strategies: Any) -> None:
    """Run ``prop`` as a hypothesis test over ``examples`` draws of ``strategies``, with ``base``'s other settings (and
    the suite's profile: derandomized, tests/conftest.py)."""
    settings(base, max_examples=examples)(given(**strategies)(prop))()
