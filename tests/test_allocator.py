"""The CUDA allocator assumption of a plan (coop.runtime.allocator), on hand-built graphs with CUDA values.

No GPU is needed: the decision reads the Graph's devices and the user's environment, and the setter is
injected, so the tests see exactly what would be set on a CUDA machine.
"""

from __future__ import annotations

import pytest

from coop.graph import Graph, Node
from coop.runtime.allocator import DEFAULT_LARGE_PAGE_BYTES, SMALL_PAGE_BYTES, prepare_allocator, user_settings

MiB = 1024 * 1024


def _graph(*devices: str | None) -> Graph:
    """A parameter and a chain of activations on the given devices (the first device holds the parameter)."""
    nodes = [Node(id=0, name="w", mem=4096, cost=0.0, kind="param", recomputable=False, device=devices[0])]
    for index, device in enumerate(devices, start=1):
        nodes.append(Node(id=index, name=f"a{index}", inputs=(index - 1,), mem=1024, cost=1.0, device=device))
    return Graph(nodes=tuple(nodes), outputs=(len(devices),))


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, setting: str) -> None:
        self.calls.append(setting)


def test_a_cpu_step_sets_nothing_and_keeps_no_headroom() -> None:
    setter = Recorder()
    assumption = prepare_allocator(_graph("cpu", "cpu"), environ={}, set_settings=setter)
    assert setter.calls == [] and assumption.headroom == 0 and assumption.expandable_segments is None
    assert assumption.source == "not applicable"


def test_a_cuda_step_without_user_settings_turns_expandable_segments_on_and_keeps_one_page_per_pool() -> None:
    setter = Recorder()
    assumption = prepare_allocator(_graph("cuda:0", "cuda:0", "cpu"), environ={}, set_settings=setter)
    assert setter.calls == ["expandable_segments:True"]
    assert assumption.expandable_segments is True and assumption.source == "coop"
    assert assumption.headroom == 20 * MiB + 2 * MiB  # one large-pool page (20 MB) and one small-pool page (2 MiB)


def test_headroom_counts_every_cuda_device_and_stream() -> None:
    two_devices = _graph("cuda:0", "cuda:1", "cpu")
    assumption = prepare_allocator(two_devices, streams=2, environ={}, set_settings=Recorder())
    assert assumption.headroom == 2 * 2 * (DEFAULT_LARGE_PAGE_BYTES + SMALL_PAGE_BYTES)


@pytest.mark.parametrize("variable", ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"])
def test_a_users_expandable_setting_is_respected_either_way(variable: str) -> None:
    setter = Recorder()
    on = prepare_allocator(_graph("cuda:0"), environ={variable: "expandable_segments:True"}, set_settings=setter)
    off = prepare_allocator(_graph("cuda:0"), environ={variable: "max_split_size_mb:128,expandable_segments:False"},
                            set_settings=setter)
    assert setter.calls == []
    assert (on.expandable_segments, on.source) == (True, variable) and on.headroom > 0
    assert (off.expandable_segments, off.source, off.headroom) == (False, variable, 0)
    assert "not bounded" in off.note


def test_a_users_large_segment_size_sets_the_headroom() -> None:
    environ = {"PYTORCH_ALLOC_CONF": "expandable_segments:True,large_segment_size_mb:64"}
    assert prepare_allocator(_graph("cuda:0"), environ=environ, set_settings=Recorder()).headroom == 64 * MiB + 2 * MiB


def test_another_backend_is_left_alone_and_said() -> None:
    setter = Recorder()
    assumption = prepare_allocator(_graph("cuda:0"), environ={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
                                   set_settings=setter)
    assert setter.calls == [] and assumption.expandable_segments is None and "cudaMallocAsync" in assumption.note


def test_the_newer_variable_wins_and_brackets_stay_whole() -> None:
    environ = {"PYTORCH_ALLOC_CONF": "roundup_power2_divisions:[64:8,>:1],expandable_segments:true",
               "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}
    variable, settings = user_settings(environ)
    assert variable == "PYTORCH_ALLOC_CONF"
    assert settings == {"roundup_power2_divisions": "[64:8,>:1]", "expandable_segments": "true"}


def test_an_imported_graph_is_not_a_cuda_step() -> None:
    assert prepare_allocator(_graph(None, None), environ={}, set_settings=Recorder()).headroom == 0


def test_the_planner_solves_within_the_budget_less_the_headroom_and_names_the_least_budget() -> None:
    from coop.budget import min_budget
    from coop.errors import BudgetError
    from coop.planner.plan import within_allocator_headroom

    graph = _graph("cuda:0", "cuda:0")
    assumption = prepare_allocator(graph, environ={}, set_settings=Recorder())
    budget = 64 * MiB
    assert within_allocator_headroom(budget, assumption, graph) == budget - 22 * MiB
    least = min_budget(graph) + assumption.headroom
    with pytest.raises(BudgetError, match=f"below min_budget .*; use at least {least}$"):
        within_allocator_headroom(least - 1, assumption, graph)


def test_a_cpu_plan_says_the_allocator_assumption_does_not_apply() -> None:
    import torch

    import coop
    from tests.models import build

    model, batch, loss_fn = build("mlp")
    plan = coop.plan(model, 1.0, batch, loss_fn=loss_fn)
    assert plan.summary()["allocator"]["source"] == "not applicable"
    assert plan.summary()["allocator"]["headroom"] == 0 and isinstance(plan.step(*batch), torch.Tensor)


def test_the_default_setter_is_torchs_own_and_takes_the_setting() -> None:
    """The setter a CUDA plan calls is torch's run-time allocator setting (no GPU needed to call it): it accepts
    the setting coop passes and reports it back (on a CPU build nothing allocates through it)."""
    import torch

    assumption = prepare_allocator(_graph("cuda:0"), environ={})
    assert assumption.source == "coop"
    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    if getter is not None:
        assert "expandable_segments:True" in getter()
