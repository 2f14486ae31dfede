"""A dynamic step that cannot run within its budget says, in one line, from which budget its policy runs."""

from __future__ import annotations

import copy
import re

import pytest

from coop.budget import baseline_peak, min_budget
from coop.errors import InfeasibleError
from coop.graph_capture import capture
from coop.runtime.fallback import run_dynamic
from coop.schedule import validate
from coop.zoo import build


@pytest.fixture(scope="module")
def cnn():
    model, batch, loss_fn = build("cnn")
    return model, batch, capture(model, batch, loss_fn=loss_fn)


@pytest.mark.parametrize("policy", ["coop", "dtr"])
def test_the_error_names_a_budget_at_which_the_step_runs(cnn, policy: str) -> None:
    model, batch, captured = cnn
    graph = captured.graph
    failed = min_budget(graph)  # the bound: the online engines run out of evictable room there
    with pytest.raises(InfeasibleError) as raised:
        run_dynamic(captured, copy.deepcopy(model), batch, failed, policy)
    message = str(raised.value)
    assert "\n" not in message
    found = re.search(rf"the simulator runs {policy} without thrashing: ([\d,]+) B", message)
    assert found, message
    least = int(found.group(1).replace(",", ""))
    assert failed < least <= baseline_peak(graph)

    # Independent check: the real step runs at the named budget, and the static validator accepts what it did.
    _, stats = run_dynamic(captured, copy.deepcopy(model), batch, least, policy)
    assert stats.peak <= least and stats.overhead <= 2.0
    verdict = validate(graph.with_random_replay(), stats.schedule, least)
    assert verdict.ok, verdict.reason
