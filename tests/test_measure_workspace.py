"""Each op's internal scratch measured on the real step (coop.graph_capture.cost.measure_workspace).

Oracle: hand-counted bytes. The fx graphs below call Python functions that allocate a known scratch, give it
back and return a known output; the measured workspace must be exactly the scratch, whatever the output.
"""

from __future__ import annotations

import torch
from torch import fx

from coop.graph_capture.cost import measure_workspace


def with_scratch(x: torch.Tensor, scratch_floats: int) -> torch.Tensor:
    """A copy of ``x`` (its output, allocated first) and a temporary of ``scratch_floats`` floats, freed before
    returning."""
    out = x.clone()
    scratch = torch.empty(scratch_floats)
    scratch.fill_(1.0)
    del scratch
    return out


def keeps_two(x: torch.Tensor) -> torch.Tensor:
    """Two temporaries alive at once (4,000 + 8,000 bytes), then a third (2,000) after both are freed; the output
    (a copy of ``x``) is allocated last."""
    a, b = torch.empty(1000), torch.empty(2000)
    del a, b
    c = torch.empty(500)
    del c
    return x.clone()


def graph_of(*calls: tuple) -> fx.GraphModule:
    graph = fx.Graph()
    value = graph.placeholder("x")
    for function, *args in calls:
        value = graph.call_function(function, (value, *args))
    graph.output(value)
    return fx.GraphModule(torch.nn.Module(), graph)


def test_a_nodes_scratch_is_its_peak_above_what_it_leaves_allocated() -> None:
    module = graph_of((with_scratch, 3000), (keeps_two,), (with_scratch, 10))
    names = [n.name for n in module.graph.nodes if n.op == "call_function"]
    measured = measure_workspace(module, [torch.randn(64)])  # outputs of 256 bytes each
    # 12,000 above the output; 12,000 at once, and the 256-byte output only after both are freed: 12,000 - 256;
    # 40 above the output
    assert measured == {names[0]: 12000, names[1]: 12000 - 256, names[2]: 40}


def test_an_op_without_scratch_measures_zero() -> None:
    """No Python scalar operands: ``x * 3.0`` would wrap 3.0 in a 0-d double and cast it (12 bytes of scratch)."""
    module = graph_of((torch.neg,), (torch.clone,))
    assert set(measure_workspace(module, [torch.randn(256)]).values()) == {0}


def test_nothing_is_measured_while_another_profiler_runs() -> None:
    module = graph_of((with_scratch, 100))
    with torch.profiler.profile():
        assert measure_workspace(module, [torch.randn(4)]) is None


def test_a_profiled_capture_has_the_structure_of_an_unprofiled_one() -> None:
    """Workspace is measured, like cost: a plan made on a profiled capture loads on a capture without profiling
    (``load_plan`` compares structure digests)."""
    from coop import capture
    from coop.zoo import build

    model, batch, loss_fn = build("cnn")
    profiled, plain = capture(model, batch, loss_fn, profile=True).graph, capture(model, batch, loss_fn).graph
    assert any(node.workspace > other.workspace for node, other in zip(profiled.nodes, plain.nodes, strict=True))
    assert profiled.structure_sha256 == plain.structure_sha256
