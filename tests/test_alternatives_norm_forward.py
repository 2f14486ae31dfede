"""Batch norm's forward written over its input in channel blocks (``forward_inplace``, MONeT / in-place ABN), and
batch norm's backward from its output offered by capture itself (it now passes the real parameters).

Oracles: the fused aten kernel eager PyTorch runs (``_native_batch_norm_legit_functional``,
``native_batch_norm``) compared as raw bits; eager autograd training with AdamW (losses, gradients, parameters
and running statistics bit for bit); bytes counted by hand from the model's shapes; the memory meter.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import fx, nn
from torch.nn import functional as F

from coop import capture
from coop.budget import min_budget
from coop.errors import CoopError
from coop.graph import Graph
from coop.graph_capture.alternatives import BATCH_NORM_FROM_OUTPUT_TOLERANCE
from coop.graph_capture.alternatives.norm import CHANNEL_BLOCKS, forward_inplace_program
from coop.planner.plan import exact_only, plan
from coop.runtime.executor import Executor, replay_graph
from coop.runtime.meter import MemoryMeter
from coop.schedule import Schedule, Step, simulate
from tests.eager_oracle import assert_steps_equal_eager
from tests.test_alternatives import conv_bn_model
from tests.test_alternatives_conv import call_node, small_cnn

aten = torch.ops.aten
FUNCTIONAL = aten._native_batch_norm_legit_functional.default


def _raw(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int64 if t.element_size() == 8 else torch.int32)


def _same_bits(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(_raw(x), _raw(y)) for x, y in zip(a, b, strict=True))


# -------------------------------------------------------------------- (a) bits
SHAPES = [(2, 3, 8, 8), (1, 1, 30, 30), (4, 20, 7, 7), (16, 2, 33, 17), (3, 5, 1, 2), (2, 7, 3, 3, 3), (8, 40, 6, 6),
          (2, 33, 4, 4), (5, 17, 9)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_inplace_is_bit_identical_to_the_fused_kernel(threads: int, dtype: torch.dtype) -> None:
    """All five outputs (y, save_mean, save_rstd, new running mean and var), raw bits, odd channel counts (blocks of
    unequal sizes, more and fewer channels than CHANNEL_BLOCKS), subnormal and huge magnitudes, 1 and 2 threads (with
    2, where the kernel splits the channels between threads, two magnitudes keep the test short on a loaded machine)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for shape in SHAPES:
            generator = torch.Generator().manual_seed(sum(shape))
            channels = shape[1]
            weight, bias = torch.randn(channels, generator=generator), torch.randn(channels, generator=generator)
            mean, var = torch.randn(channels, generator=generator), torch.rand(channels, generator=generator) + 0.5
            per_channel = [t.to(dtype) for t in (weight, bias, mean, var)]
            program = None
            for scale in (1.0, 1e-20, 1e15, 1e-38) if threads == 1 else (1.0, 1e-38):  # 2 threads: the split
                x = ((torch.randn(shape, generator=generator) * 30 + 5) * scale).to(dtype)
                args = (x, *per_channel, True, 0.1, 1e-5)
                eager = FUNCTIONAL(*args)
                program = program or forward_inplace_program(call_node(FUNCTIONAL, *args))  # one program per shape
                assert len(program.reads) == 5  # x, weight, bias, running mean and var
                values = [a.clone() for a in args[:5]]
                result = fx.GraphModule(nn.Module(), program.graph)(*values)
                assert _same_bits(result, eager), (shape, scale)
                assert result[0].untyped_storage().data_ptr() == values[0].untyped_storage().data_ptr()  # over x
                assert torch.equal(_raw(values[3]), _raw(per_channel[2]))  # the running stats are read, not mutated
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("affine", [True, False])
def test_forward_inplace_of_native_batch_norm_without_running_stats_is_bit_identical(affine: bool) -> None:
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(6, 19, 5, 7, generator=generator) * 1e3
    weight, bias = torch.randn(19, generator=generator), torch.randn(19, generator=generator)
    weight, bias = (weight, bias) if affine else (None, None)
    args = (x, weight, bias, None, None, True, 0.1, 1e-5)
    eager = aten.native_batch_norm(*args)
    node = call_node(aten.native_batch_norm.default, *args)
    program = forward_inplace_program(node)
    written = x.clone()
    result = fx.GraphModule(nn.Module(), program.graph)(written, *([weight, bias] if affine else []))
    assert _same_bits(result, eager) and result[0].untyped_storage().data_ptr() == written.untyped_storage().data_ptr()


# -------------------------------------------------------------------- (b) what capture offers
class Offers(nn.Module):
    """Batch norm over the caller's batch (caller-owned: never overwritten), over a conv (offered), and BatchNorm1d
    over a linear output (one element per sample and channel: the kernel's bits are not proven blockwise)."""

    def __init__(self) -> None:
        super().__init__()
        self.n0, self.conv, self.n1 = nn.BatchNorm2d(3), nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.fc, self.n2, self.head = nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.n1(self.conv(self.n0(x)))).mean((2, 3))
        return F.cross_entropy(self.head(F.relu(self.n2(self.fc(h)))), target)


def _forwards(captured) -> list[fx.Node]:
    return captured.module.graph.find_nodes(op="call_function", target=FUNCTIONAL)


def test_capture_offers_forward_inplace_only_where_its_bits_are_proven() -> None:
    torch.manual_seed(0)
    model, batch = Offers(), (torch.randn(4, 3, 6, 6), torch.randint(0, 4, (4,)))
    captured = capture(model, batch, alternatives=True)
    graph = captured.graph
    offered = {f.args[0].target if f.args[0].op == "call_function" else "batch":
               graph.node(captured.owner_of[f.name]).implementation("forward_inplace") for f in _forwards(captured)}
    assert set(offered) == {"batch", aten.convolution.default, aten.addmm.default}
    assert offered["batch"] is None and offered[aten.addmm.default] is None
    conv_forward = next(f for f in _forwards(captured) if f.args[0].target is aten.convolution.default)
    impl = offered[aten.convolution.default]
    assert impl is not None and impl.inplace_of == captured.owner_of[conv_forward.args[0].name] and impl.exact
    assert graph.meta["alternatives"]["forward_inplace"] == 1


ACTIVATION = 4 * 8 * 16 * 16 * 4  # the small CNN's first float32 activation: 32,768 bytes
STATS = 8 * 4  # one per-channel float32 vector: 32 bytes


@pytest.fixture(scope="module")
def cnn():
    model, batch = small_cnn()
    return model, batch, capture(model, batch, alternatives=True)


def test_capture_offers_the_forward_in_place_and_the_backward_from_output_on_the_small_cnn(cnn) -> None:
    _, _, captured = cnn
    graph = captured.graph
    forwards = [graph.node(captured.owner_of[f.name]) for f in _forwards(captured)]
    assert len(forwards) == 2
    for node in forwards:
        impl = node.implementation("forward_inplace")
        assert impl.exact and impl.mem == node.mem and impl.inplace_of == node.inputs[0]
        assert graph.node(impl.inplace_of).op == "aten.convolution.default" and impl.inputs is None
        # the workspace: two channel blocks (the copy and the block's output; 8 channels <= CHANNEL_BLOCKS: one
        # channel a block), the four per-channel statistics and one block's (4 floats), far below an activation
        assert 8 <= CHANNEL_BLOCKS and impl.workspace == 2 * node.mem // 8 + 4 * STATS + 4 * 4
    # capture passes the real parameters: batch norm's backward from its output is offered (every gamma is 1)
    backwards = [n for n in graph.nodes if n.op == "aten.native_batch_norm_backward.default"]
    assert len(backwards) == 2
    assert all(not n.implementation("from_output").exact for n in backwards)
    assert all(i.exact for n in exact_only(graph).nodes for i in n.impls)
    assert {i.name for n in exact_only(graph).nodes for i in n.impls} >= {"forward_inplace", "grad_inplace"}


# -------------------------------------------------------------------- (c) the floor it lowers
class FrozenStem(nn.Module):
    """A linear probe over a frozen conv stem whose batch norm still trains its running statistics: the batch
    norm forward (the conv output and its own output, two activations) is the widest step of the step."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("stem", torch.randn(8, 3, 3, 3) / 5)  # frozen conv weights
        self.norm = nn.BatchNorm2d(8, affine=False)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(F.relu(self.norm(F.conv2d(x, self.stem, padding=1))).mean((2, 3))), target)


def frozen_stem() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return FrozenStem(), (torch.randn(4, 3, 16, 16), torch.randint(0, 4, (4,)))


def _without(graph: Graph, name: str) -> Graph:
    data = graph.model_dump()
    for node in data["nodes"]:
        node["impls"] = [impl for impl in node["impls"] if impl["name"] != name]
    return Graph.model_validate(data)


def test_forward_inplace_lowers_the_floor_by_a_hand_counted_activation() -> None:
    model, batch = frozen_stem()
    captured = capture(model, batch, alternatives=True)
    graph = replay_graph(captured)
    always = graph.caller_owned_bytes
    # without it: the batch norm forward holds the conv output and its own output, and allocates its four
    # per-channel statistics (saved mean and rstd, new running mean and var)
    floor = always + 2 * ACTIVATION + 4 * STATS
    assert min_budget(graph.remat_only()) == min_budget(_without(graph, "forward_inplace")) == floor
    # with it: the conv output only (the output takes its storage), two one-channel blocks (the copy and its
    # output), the four statistics and one block's four statistics (one channel: 4 floats)
    (node,) = [n for n in graph.nodes if n.implementation("forward_inplace") is not None]
    assert node.implementation("forward_inplace").workspace == 2 * ACTIVATION // 8 + 4 * STATS + 4 * 4
    assert min_budget(graph) == always + ACTIVATION + 2 * ACTIVATION // 8 + 4 * STATS + 4 * 4
    assert floor - min_budget(graph) == ACTIVATION - ACTIVATION // 4 - 4 * 4  # 24,560 bytes


def test_a_monet_plan_below_the_floor_without_it_trains_like_eager() -> None:
    """Below the floor without the forward in place (proven: no schedule fits there without it), monet's plan
    replays bit for bit against eager autograd over three AdamW steps, running statistics included."""
    model, batch = frozen_stem()
    eager = copy.deepcopy(model)
    captured = capture(model, batch, alternatives=True)
    budget = min_budget(_without(replay_graph(captured), "forward_inplace")) - 1
    trained = plan(model, budget, batch, formulation="monet", alternatives=True, exact=True, time_limit=8)
    assert trained.predicted_peak <= budget
    assert any(name.endswith(":forward_inplace") for name in trained.summary()["implementations"])
    assert_steps_equal_eager(trained, model, eager, batch)
    assert all(torch.equal(a, b) for a, b in zip(model.buffers(), eager.buffers(), strict=True))


# -------------------------------------------------------------------- (d) replays on the small CNN
def _schedule(graph: Graph, captured, backward_impl: str | None) -> Schedule:
    """The baseline order with both batch norm forwards in place; before each batch norm backward its conv is
    recomputed (``backward_impl`` None: the backward reads x again) or the backward reads y (``from_output``)."""
    forwards = {captured.owner_of[f.name]: captured.owner_of[f.args[0].name] for f in _forwards(captured)}
    backwards = {v: v_in for v in graph.order for v_in in forwards.values()
                 if graph.node(v).op == "aten.native_batch_norm_backward.default" and v_in in graph.node(v).inputs}
    steps = []
    for v in graph.order:
        if v in backwards and backward_impl is None:
            steps.append(Step(op="compute", node=backwards[v]))  # the conv again: x was overwritten
        impl = "forward_inplace" if v in forwards else backward_impl if v in backwards else None
        steps.append(Step(op="compute", node=v, impl=impl))
    return Schedule(steps=tuple(steps))


def _metered(captured, schedule: Schedule, model, batch):
    flat = captured.flat_inputs(model, batch)
    executor = Executor(captured, schedule)
    with MemoryMeter() as meter:
        meter.track(*flat, *captured.constants())
        outputs = executor.run_flat(flat)
    return outputs, meter.peak_bytes, executor.simulation.peak


def test_forward_inplace_with_the_conv_recomputed_replays_bit_identically_within_its_prediction(cnn) -> None:
    model, batch, captured = cnn
    graph = replay_graph(captured)
    alone = Schedule(steps=tuple(Step(op="compute", node=v, impl="forward_inplace" if graph.node(v).implementation(
        "forward_inplace") else None) for v in graph.order))
    with pytest.raises(CoopError, match=r"compute %\d+\): input \d+ is not resident"):
        simulate(graph, alone)  # the forward in place alone: the backward would read the overwritten conv output
    schedule = _schedule(graph, captured, None)
    computes = [s.node for s in schedule.steps]
    assert sum(s.impl == "forward_inplace" for s in schedule.steps) == 2 and len(computes) == len(graph.order) + 2
    reference = captured.run(model, *batch)
    outputs, metered, predicted = _metered(captured, schedule, model, batch)
    assert all(torch.equal(a, b) for a, b in zip(outputs, reference, strict=True))
    assert metered <= predicted


def test_forward_inplace_with_the_backward_from_output_replays_within_tolerance() -> None:
    model, batch = conv_bn_model()  # no conv bias: its gradient would cancel to ~0, below any relative tolerance
    captured = capture(model, batch, alternatives=True)
    graph = replay_graph(captured)
    schedule = _schedule(graph, captured, "from_output")
    reference = captured.run(model, *batch)
    outputs, metered, predicted = _metered(captured, schedule, model, batch)
    assert metered <= predicted
    assert torch.equal(outputs[0], reference[0])  # the loss: the forward in place is exact
    for got, expected in zip(outputs[1:], reference[1:], strict=True):
        scale = float(expected.abs().max()) or 1.0
        assert float((got - expected).abs().max()) <= BATCH_NORM_FROM_OUTPUT_TOLERANCE * 100 * scale
    with pytest.raises(CoopError, match="no implementation .from_output."):
        simulate(exact_only(graph), schedule)  # exact=True: the inexact backward is not there to choose


def test_exact_monet_and_exact_plans_never_see_the_backward_from_output() -> None:
    """Capture now offers ``from_output`` (inexact): monet's ``exact=True`` projection and ``plan(exact=True)``'s
    graph drop it and keep the exact forward in place; without ``exact`` monet may choose it."""
    from coop.formulations.monet.milp import _project

    model, batch = conv_bn_model()
    graph = replay_graph(capture(model, batch, alternatives=True))
    budget = min_budget(graph) * 2

    def names(exact: bool) -> set[str | None]:
        return {choice.name for row in _project(graph, budget, exact).choices for choice in row}

    assert {"from_output", "forward_inplace"} <= names(exact=False)
    assert "from_output" not in names(exact=True) and "forward_inplace" in names(exact=True)
    assert "from_output" not in {i.name for n in exact_only(graph).nodes for i in n.impls}
