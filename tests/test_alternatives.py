"""Captured operator implementations (MONeT): what capture finds, their bits, their replay, a plan.

Oracles: bytes and counts are counted by hand from the model's shapes; the implementations' bits
are compared with the aten kernels eager PyTorch runs (``threshold_backward``,
``hardtanh_backward``, the out-of-place activations) on edge cases, as raw integers; replays are
compared with the captured program run in its own order and with eager training; peaks with the
memory meter.
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
from coop.graph_capture.alternatives import BATCH_NORM_FROM_OUTPUT_TOLERANCE, IN_PLACE_VARIANTS, add_alternatives
from coop.planner.plan import exact_only, implementations_used, load_plan, plan
from coop.runtime.arena_replay import build_arena_program
from coop.runtime.executor import Executor, replay_graph
from coop.runtime.meter import MemoryMeter
from coop.schedule import Schedule, Step, simulate
from coop.zoo import build
from tests.eager_oracle import assert_steps_equal_eager

aten = torch.ops.aten
BATCH, WIDTH = 512, 32


class TwoActivations(nn.Module):
    """Linear -> ReLU -> Linear -> ReLU6 -> Linear -> cross entropy: activations dominate the memory."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, 4)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        x = F.relu6(self.b(torch.relu(self.a(x))))
        return F.cross_entropy(self.head(x), target)


def hand_model() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return TwoActivations(), (torch.randn(BATCH, WIDTH), torch.randint(0, 4, (BATCH,)))


@pytest.fixture(scope="module")
def hand() -> tuple[nn.Module, tuple, object]:
    model, batch = hand_model()
    return model, batch, capture(model, batch, alternatives=True)


def _fx_node(captured, target) -> fx.Node:
    return next(n for n in captured.module.graph.nodes if n.target is target)


# -------------------------------------------------------------------- what capture finds
def test_capture_finds_masks_and_in_place_activations_with_hand_counted_bytes(hand) -> None:
    _, _, captured = hand
    graph = captured.graph
    activation = BATCH * WIDTH * 4  # one float32 activation: 65,536 bytes
    mask = BATCH * WIDTH  # one bool per element: 16,384 bytes
    # relu and relu6 (hardtanh): one optional mask each, a mask and an in-place-masked backward each,
    # an in-place forward each, and hardtanh's backward from its output; cross entropy's log-softmax backward
    # written over its incoming gradient (coop.graph_capture.alternatives.softmax)
    assert graph.meta["alternatives"] == {"mask": 2, "mask_inplace": 2, "from_output": 1, "inplace": 2, "split": 0,
                                          "grad_inplace": 1, "from_indices": 0, "inplace_other": 0, "from_packed": 0,
                                          "forward_inplace": 0, "optional": 2}
    optional = [graph.node(i) for i in graph.optional_ids]
    assert [n.mem for n in optional] == [mask, mask]
    # le(v, 0) has no intermediate; le(v, 0) | ge(v, 6) holds two bool intermediates while it runs
    assert sorted(n.workspace for n in optional) == [0, 2 * mask]
    for node in graph.nodes:
        names = {impl.name for impl in node.impls}
        if node.op in ("aten.relu.default", "aten.hardtanh.default"):
            (impl,) = node.impls
            assert impl.name == "inplace" and impl.mem == activation == node.mem
            assert impl.inplace_of == node.inputs[0] and graph.node(impl.inplace_of).op == "aten.addmm.default"
        elif node.op in ("aten.threshold_backward.default", "aten.hardtanh_backward.default"):
            assert names >= {"mask", "mask_inplace"}
            masked = node.implementation("mask")
            grad, saved = node.inputs
            assert masked.inputs[0] == grad and graph.node(masked.inputs[1]).optional and saved not in masked.inputs
            assert masked.mem == activation and node.implementation("mask_inplace").inplace_of == grad
        elif node.op == "aten._log_softmax_backward_data.default":
            (impl,) = node.impls
            assert impl.name == "grad_inplace" and impl.inplace_of == node.inputs[0] and impl.mem == node.mem
        else:
            assert not names
        assert all(impl.exact for impl in node.impls)


def test_alternatives_leave_the_remat_only_graph_as_captured_without_them(hand) -> None:
    model, batch, captured = hand
    plain = capture(model, batch).graph
    assert captured.graph.remat_only().nodes == plain.nodes
    assert captured.graph.order == plain.order and captured.graph.outputs == plain.outputs
    assert not plain.has_impls and not plain.optional_ids


def test_profiled_alternatives_are_timed() -> None:
    model, batch = hand_model()
    captured = capture(model, batch, profile=True, alternatives=True)
    graph = captured.graph
    assert graph.meta["cost_unit"] == "seconds (profiled)"
    assert all(graph.node(i).cost > 0 for i in graph.optional_ids)
    assert all(impl.cost > 0 for node in graph.nodes for impl in node.impls)


# -------------------------------------------------------------------- bits
EDGES = [0.0, -0.0, float("nan"), -float("nan"), float("inf"), -float("inf"), 6.0, -6.0, 1e-45, -1e-45, 1e-38,
         -1e-38, 5.999999, 6.000001, 1.0, -1.0, 0.5]


def _edge_tensor(generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """BATCH x WIDTH values: every edge value next to every other (grads and inputs pair them up), then random."""
    edges = torch.tensor(EDGES, dtype=torch.float64)
    pairs = torch.cartesian_prod(edges, edges)[:, 0]
    values = torch.randn(BATCH * WIDTH, generator=generator, dtype=torch.float64) * 4
    values[: len(pairs)] = pairs
    return values.reshape(BATCH, WIDTH).to(dtype)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    integer = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(integer), b.view(integer))


def _run(program, *inputs: torch.Tensor) -> torch.Tensor:
    return fx.GraphModule(nn.Module(), program.graph)(*inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_mask_backwards_are_bit_identical_to_the_aten_kernels(hand, dtype: torch.dtype) -> None:
    _, _, captured = hand
    generator = torch.Generator().manual_seed(1)
    grad = _edge_tensor(generator, dtype)
    saved = _edge_tensor(generator, dtype).T.contiguous().T.contiguous()  # other edge pairings than grad's
    saved = saved.flip(0)
    checked = 0
    for node_id, by_impl in captured.impl_fx.items():
        backward = captured.module.graph.find_nodes(op="call_function", target=aten.threshold_backward.default) + \
            captured.module.graph.find_nodes(op="call_function", target=aten.hardtanh_backward.default)
        owner = next((n for n in backward if captured.owner_of[n.name] == node_id), None)
        if owner is None:
            continue
        reference = owner.target(grad, saved, *owner.args[2:])
        mask_id = captured.graph.node(node_id).implementation("mask").inputs[1]
        mask = _run(captured.optional_fx[mask_id], saved)
        assert mask.dtype == torch.bool
        assert _same_bits(_run(by_impl["mask"], grad, mask), reference)
        overwritten = grad.clone()
        result = _run(by_impl["mask_inplace"], overwritten, mask)
        assert _same_bits(result, reference) and result.data_ptr() == overwritten.data_ptr()
        if "from_output" in by_impl:  # hardtanh's backward from clamp(x) instead of x
            assert _same_bits(_run(by_impl["from_output"], grad, aten.hardtanh(saved, *owner.args[2:])), reference)
        checked += 1
    assert checked == 2
    # the reference does zero some and pass some gradients, NaN included
    assert reference.isnan().any() and (reference == 0).any()


@pytest.mark.parametrize("op", list(IN_PLACE_VARIANTS), ids=lambda op: str(op))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_in_place_activations_are_bit_identical(op, dtype: torch.dtype) -> None:
    x = _edge_tensor(torch.Generator().manual_seed(2), dtype)
    extra = (0.0, 6.0) if op is aten.hardtanh.default else ()
    reference = op(x, *extra)
    overwritten = x.clone()
    assert _same_bits(IN_PLACE_VARIANTS[op](overwritten, *extra), reference)
    assert _same_bits(overwritten, reference)


# -------------------------------------------------------------------- replay
def _with(graph: Graph, choice: dict[int, str]) -> Schedule:
    """The baseline order with ``choice``'s implementations, each read mask right after its value."""
    masks = {m for v, name in choice.items() for m in graph.node(v).reads(graph.node(v).implementation(name))
             if graph.node(m).optional}
    steps = []
    for v in graph.order:
        steps.append(Step(op="compute", node=v, impl=choice.get(v)))
        steps += [Step(op="compute", node=m) for m in sorted(masks) if graph.node(m).inputs[0] == v]
    return Schedule(steps=tuple(steps))


def _metered(executor: Executor, flat: list[torch.Tensor], captured) -> tuple[list, MemoryMeter]:
    with MemoryMeter() as meter:
        meter.track(*flat, *captured.constants())
        outputs = executor.run_flat(flat)
    return outputs, meter


# MobileNet (one choice of each of the 8 kinds; 60-86 s on 2 cores) runs in the slow tier; the fast tier replays every
# implementation of the hand model and the CNN here, and the split, grad_inplace, forward_inplace and from_output
# kinds on small CNNs in tests/test_alternatives_conv.py, test_alternatives_norm_forward.py and below
@pytest.mark.parametrize("name", ["hand", "cnn", pytest.param("mobilenet", marks=pytest.mark.slow)])
def test_every_implementation_replays_bit_identically_within_its_prediction(name: str, hand) -> None:
    if name == "hand":
        model, batch, captured = hand
    else:
        model, batch, loss_fn = build(name, **({"layers": 1} if name == "cnn" else {"image": 16}))
        captured = capture(model, batch, loss_fn, alternatives=True)
    graph = captured.graph
    flat = captured.flat_inputs(model, batch)
    torch.manual_seed(5)
    reference = captured.run(model, *batch)
    # exact implementations only: batch norm's backward from its output (inexact, offered now that capture passes
    # the real weights) is tested within its tolerance below
    choices = [{v: impl.name} for v in graph.order for impl in graph.node(v).impls if impl.exact]
    # every activation in place and every mask backward in place (grad_inplace, tested in test_alternatives_conv,
    # is refused where its incoming gradient is read again, e.g. by a residual branch)
    everything = {v: next(i.name for i in graph.node(v).impls if i.name in ("inplace", "mask_inplace"))
                  for v in graph.order if any(i.name in ("inplace", "mask_inplace") for i in graph.node(v).impls)}
    if name == "mobilenet":  # one of each kind keeps the test short; all of them at once below
        choices = list({next(iter(c.values())): c for c in choices}.values())
        # inplace, inplace_other (an add), mask, mask_inplace, from_output, split, grad_inplace, forward_inplace
        assert len(choices) == 8
    refused = []
    for choice in [*choices, everything]:
        schedule = _with(graph, choice)
        try:
            simulate(graph, schedule)
        except CoopError:  # an in-place choice whose input is read later: the semantics refuse it
            refused.append(choice)
            continue
        executor = Executor(captured, schedule)
        torch.manual_seed(5)
        outputs, meter = _metered(executor, flat, captured)
        assert all(torch.equal(a, b) for a, b in zip(outputs, reference, strict=True)), choice
        assert meter.peak_bytes <= executor.simulation.peak, (choice, meter.peak_op)
    assert everything not in refused and len(refused) < len(choices)
    # hardtanh's default backward reads hardtanh's input: overwriting that input in place is refused,
    # unless the backward reads a mask instead (as in ``everything``); ReLU's backward reads its output. Batch
    # norm's forward in place is refused alike: its default backward reads the overwritten input (replayed with
    # the input recomputed in tests/test_alternatives_norm_forward.py)
    assert all(graph.node(v).op == "aten.hardtanh.default" and impl == "inplace" or impl == "forward_inplace"
               for c in refused for v, impl in c.items())
    if name == "hand":
        assert len(refused) == 1


def test_an_implementation_without_its_program_is_refused(hand) -> None:
    model, batch, _ = hand
    plain = capture(model, batch)
    graph = hand[2].graph
    node = next(n for n in graph.nodes if n.impls and n.impls[0].name == "inplace")
    schedule = _with(graph, {node.id: "inplace"})
    plain.graph = graph  # a graph with implementations but a capture without their fx programs
    with pytest.raises(CoopError, match="no fx program.*alternatives=True"):
        Executor(plain, schedule)


def test_arena_replay_refuses_implementations_in_one_line(hand) -> None:
    _, _, captured = hand
    graph = replay_graph(captured)
    node = next(n for n in graph.nodes if n.impls and n.impls[0].name == "inplace")
    schedule = _with(graph, {node.id: "inplace"})
    with pytest.raises(CoopError, match="arena replay does not run operator implementations"):
        build_arena_program(captured, graph, schedule, simulate(graph, schedule), set(), None)


# -------------------------------------------------------------------- a plan
# 25-28 s on 2 loaded cores (monet proves its optimum within 60 s); the fast tier keeps a monet plan below the
# remat-only bound trained like eager, saved and loaded with its implementations, on the conv net
# (tests/test_alternatives_conv.py::test_monet_plan_below_the_remat_only_floor_trains_like_eager)
@pytest.mark.slow
def test_monet_plan_below_the_remat_only_bound_trains_like_eager(hand, tmp_path) -> None:
    model, batch = hand_model()
    eager = copy.deepcopy(model)
    graph = replay_graph(hand[2])
    remat_bound = min_budget(graph.remat_only())
    budget = (min_budget(graph) + remat_bound) // 2  # no schedule without implementations fits: proven bound
    trained = plan(model, budget, batch, formulation="monet", time_limit=60)
    summary = trained.summary()
    assert trained.formulation == "monet" and trained.predicted_peak <= budget < remat_bound
    assert any(name.split(":")[1] in ("mask", "mask_inplace", "inplace") for name in summary["implementations"])
    assert summary["inexact_implementations"] == []
    assert_steps_equal_eager(trained, model, eager, batch)
    trained.save(tmp_path / "plan.json")  # a saved plan with implementations loads with its alternatives
    loaded = load_plan(tmp_path / "plan.json", model)
    assert loaded.schedule == trained.schedule and loaded.predicted_peak == trained.predicted_peak


def test_exact_plans_drop_inexact_implementations_and_summaries_name_them() -> None:
    graph = Graph.model_validate({"name": "hand", "outputs": [2], "nodes": [
        {"id": 0, "name": "x", "kind": "input", "mem": 10, "cost": 0},
        {"id": 3, "name": "a", "inputs": [0], "mem": 10, "cost": 1},
        {"id": 1, "name": "norm", "inputs": [3], "mem": 10, "cost": 1, "impls": [
            {"name": "fused", "cost": 1, "mem": 4, "exact": False, "tolerance": 1e-6},
            {"name": "inplace", "cost": 1, "mem": 10, "inplace_of": 3}]},
        {"id": 2, "name": "out", "inputs": [1], "mem": 1, "cost": 1}]})
    schedule = Schedule(steps=(Step(op="compute", node=3), Step(op="compute", node=1, impl="fused"),
                               Step(op="compute", node=2)))
    assert implementations_used(graph, schedule) == {"implementations": ["1:fused"],
                                                     "inexact_implementations": ["1:fused (tolerance 1e-06)"]}
    assert [impl.name for impl in exact_only(graph).node(1).impls] == ["inplace"]
    with pytest.raises(CoopError):
        simulate(exact_only(graph), schedule)


# -------------------------------------------------------------------- batch norm from its output
class ConvBnRelu(nn.Module):
    """Two conv -> batch norm -> ReLU blocks, pooled into a linear head: batch norm's backward reads the conv output."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
        self.conv2, self.bn2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
        self.head = nn.Linear(channels, 4)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))
        return F.cross_entropy(self.head(x.mean((2, 3))), target)


def conv_bn_model() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    model = ConvBnRelu()
    with torch.no_grad():  # trained-looking affine parameters, none zero
        for bn in (model.bn1, model.bn2):
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.normal_()
    return model, (torch.randn(8, 3, 16, 16), torch.randint(0, 4, (8,)))


def capture_with_values(model: nn.Module, batch: tuple, loss_fn=None):
    """A capture with alternatives whose batch norm weights were checked on the real tensors (``coop.capture``
    passes the real placeholder values to ``add_alternatives``)."""
    return capture(model, batch, loss_fn, alternatives=True)


def _bn_backwards(captured) -> list[fx.Node]:
    return captured.module.graph.find_nodes(op="call_function", target=aten.native_batch_norm_backward.default)


@pytest.fixture(scope="module")
def conv_bn() -> tuple[nn.Module, tuple, object]:
    model, batch = conv_bn_model()
    return model, batch, capture_with_values(model, batch)


def _term_scales(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> list[float]:
    """The declared tolerance's denominators: the size of each gradient's terms (see BATCH_NORM_FROM_OUTPUT_TOLERANCE)."""
    dims = [d for d in range(x.dim()) if d != 1]
    var, mean = torch.var_mean(x, dims, correction=0, keepdim=True)
    invstd = (var + 1e-5).rsqrt()
    x_hat = (x - mean) * invstd
    return [float((weight.view(1, -1, 1, 1) * invstd).abs().max() * grad.abs().max()),
            float((grad * x_hat).abs().sum(dims).max()), float(grad.abs().sum(dims).max())]


def test_batch_norm_from_output_is_within_its_declared_tolerance_of_eager(conv_bn) -> None:
    _, _, captured = conv_bn
    checked = 0
    generator = torch.Generator().manual_seed(3)
    for backward in _bn_backwards(captured):
        node = captured.graph.node(captured.owner_of[backward.name])
        impl = node.implementation("from_output")
        assert not impl.exact and impl.tolerance == BATCH_NORM_FROM_OUTPUT_TOLERANCE
        program = captured.impl_fx[node.id]["from_output"]
        shape = backward.args[1].meta["val"].shape
        for trial in range(20):
            scale, offset = float(torch.rand(1, generator=generator)) * 10, float(torch.randn(1, generator=generator)) * 3
            x = (torch.randn(shape, generator=generator) * scale + offset).requires_grad_()
            sign = torch.where(torch.rand(shape[1], generator=generator) < 0.5, -1.0, 1.0)
            weight = ((torch.rand(shape[1], generator=generator) * 1.9 + 0.1) * sign).requires_grad_()
            bias = torch.randn(shape[1], generator=generator).requires_grad_()
            grad = torch.randn(shape, generator=generator)
            y = F.batch_norm(x, None, None, weight, bias, training=True, eps=1e-5)  # the oracle: eager autograd
            expected = torch.autograd.grad(y, (x, weight, bias), grad)
            invstd = (torch.var(x.detach(), (0, 2, 3), correction=0) + 1e-5).rsqrt()
            got = _run(program, grad, y.detach(), weight.detach(), bias.detach(), invstd)
            for a, b, term in zip(got, expected, _term_scales(grad, x.detach(), weight.detach()), strict=True):
                assert a.shape == b.shape and float((a - b).abs().max()) <= impl.tolerance * term, trial
            checked += 1
    assert checked == 40


def test_zoo_cnn_capture_offers_batch_norm_from_output_on_each_backward() -> None:
    model, batch, loss_fn = build("cnn", layers=2)
    captured = capture_with_values(model, batch, loss_fn)
    graph = captured.graph
    backwards = _bn_backwards(captured)
    assert len(backwards) == 2
    for backward in backwards:
        node = graph.node(captured.owner_of[backward.name])
        impl = node.implementation("from_output")
        conv_output = captured.owner_of[backward.args[1].name]
        forward = captured.owner_of[backward.args[6].args[0].name]  # the batch norm whose invstd it reads
        assert conv_output in node.inputs and conv_output not in impl.inputs and forward in impl.inputs
        assert graph.node(forward).op == "aten._native_batch_norm_legit_functional.default"
        assert impl.mem == node.mem and not impl.exact and impl.tolerance > 0


def test_batch_norm_from_output_is_not_offered_at_a_zero_weight() -> None:
    model, batch = conv_bn_model()
    with torch.no_grad():
        model.bn1.weight[3] = 0.0
    captured = capture_with_values(model, batch)
    offered = [captured.graph.node(captured.owner_of[b.name]).implementation("from_output") for b in _bn_backwards(captured)]
    assert sum(impl is not None for impl in offered) == 1  # only bn2's: bn1 has a zero gamma
    # without the real weights nothing can be checked, so nothing is offered
    plain = add_alternatives(captured.module, captured.graph.remat_only(), captured.fx_names, captured.owner_of).graph
    assert all(plain.node(captured.owner_of[b.name]).implementation("from_output") is None for b in _bn_backwards(captured))


def test_a_schedule_with_batch_norm_from_output_replays_within_tolerance_and_its_prediction(conv_bn) -> None:
    # min_budget(graph) == min_budget(graph.remat_only()) on this model (and within 64 bytes on the zoo
    # resnet): reading y instead of x is the same bytes, so a fixed schedule is tested instead of a plan
    model, batch, captured = conv_bn
    graph = captured.graph
    choice = {captured.owner_of[b.name]: "from_output" for b in _bn_backwards(captured)}
    schedule = _with(graph, choice)
    simulate(graph, schedule)
    flat = captured.flat_inputs(model, batch)
    torch.manual_seed(5)
    reference = captured.run(model, *batch)
    outputs, meter = _metered(Executor(captured, schedule), flat, captured)
    assert meter.peak_bytes <= Executor(captured, schedule).simulation.peak
    assert torch.equal(outputs[0], reference[0])  # the loss: the forward is untouched
    for got, expected in zip(outputs[1:], reference[1:], strict=True):
        scale = float(expected.abs().max()) or 1.0
        assert float((got - expected).abs().max()) <= BATCH_NORM_FROM_OUTPUT_TOLERANCE * 100 * scale
    assert any(not torch.equal(a, b) for a, b in zip(outputs, reference, strict=True))  # it did run the other arithmetic
    used = implementations_used(graph, schedule)
    assert sorted(used["inexact_implementations"]) == sorted(
        f"{v}:from_output (tolerance {BATCH_NORM_FROM_OUTPUT_TOLERANCE:g})" for v in choice)
    exact = exact_only(graph)
    assert all(i.exact for n in exact.nodes for i in n.impls)
    with pytest.raises(CoopError):
        simulate(exact, schedule)
