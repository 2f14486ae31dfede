"""Capture: Graph peak == metered peak of the captured step, FLOPs == FlopCounterMode, replay == eager."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from coop import Graph, baseline_peak, capture
from coop.errors import CaptureError
from coop.runtime.meter import MemoryMeter
from coop.zoo import ZOO_NAMES, build

SMALL = {"gpt2": {"layers": 1, "hidden": 32, "seq": 16}, "bert": {"layers": 1, "hidden": 32, "seq": 16},
         "resnet": {"layers": 1, "hidden": 4, "image": 16}, "llama": {"layers": 1, "hidden": 32, "seq": 16},
         "vit": {"layers": 1, "hidden": 32, "image": 16}}


@pytest.fixture(scope="module", params=ZOO_NAMES)
def zoo_capture(request: pytest.FixtureRequest):
    name = request.param
    model, batch, loss_fn = build(name, **SMALL.get(name, {}))
    return name, model, batch, loss_fn, capture(model, batch, loss_fn)


def eager_loss(model: nn.Module, batch: tuple, loss_fn) -> torch.Tensor:
    out = loss_fn(model, *batch) if loss_fn is not None else model(*batch)
    return out if isinstance(out, torch.Tensor) else out.loss


def test_baseline_peak_matches_metered_peak(zoo_capture) -> None:
    name, model, batch, _, captured = zoo_capture
    flat = captured.flat_inputs(model, batch)
    with torch.random.fork_rng(), torch.no_grad(), MemoryMeter() as meter:
        meter.track(*flat, *captured.constants())
        captured.module(*flat)
    predicted = baseline_peak(captured.graph)
    assert abs(meter.peak_bytes - predicted) <= 0.02 * predicted, (name, meter.peak_bytes, predicted)


def test_flops_match_flop_counter_on_eager_step(zoo_capture) -> None:
    name, model, batch, loss_fn, captured = zoo_capture
    eager = copy.deepcopy(model)
    counter = FlopCounterMode(display=False)
    with counter:
        eager_loss(eager, batch, loss_fn).backward()
    assert captured.flops > 0
    assert captured.flops == counter.get_total_flops(), name
    assert captured.graph.meta["flops"] == captured.flops


def test_replay_equals_eager_bit_for_bit(zoo_capture) -> None:
    """Loss, every gradient and every new buffer value equal eager PyTorch under the same seed."""
    name, model, batch, loss_fn, captured = zoo_capture
    eager = copy.deepcopy(model)
    torch.manual_seed(7)
    loss = eager_loss(eager, batch, loss_fn)
    loss.backward()
    torch.manual_seed(7)
    outputs = captured.run(model, *batch)
    assert torch.equal(outputs[0], loss.detach()), name
    grads = dict(zip(captured.grad_names, outputs[captured.grad_slice], strict=True))
    for param_name, param in eager.named_parameters():
        assert torch.equal(grads[param_name], param.grad), (name, param_name)
    new_buffers = dict(zip(captured.buffer_names, outputs[captured.buffer_slice], strict=True))
    for buffer_name, buffer in eager.named_buffers():
        assert torch.equal(new_buffers[buffer_name], buffer), (name, buffer_name)


def test_graph_structure(zoo_capture) -> None:
    _, model, _, _, captured = zoo_capture
    graph = captured.graph
    kinds = {n.kind for n in graph.nodes}
    assert {"param", "input", "forward", "backward"} <= kinds
    assert graph.meta["mem_unit"] == "bytes" and "seconds" in graph.meta["cost_unit"]
    # every gradient and the loss are outputs; caller-owned nodes hold the real tensors' bytes
    assert len(graph.outputs) >= 1 + len(captured.grad_names) - 1
    params = {n.name: n for n in graph.nodes if n.kind == "param"}
    for param_name, param in model.named_parameters():
        assert params[param_name].mem == param.untyped_storage().nbytes()
    # a multi-output op's further outputs cost nothing of their own (the op's run made them; lower.py)
    assert all(n.cost > 0 for n in graph.nodes if not n.caller_owned and n.mem > 0 and n.output_of is None)
    assert all(n.cost == 0 for n in graph.nodes if n.output_of is not None)
    # fx_names: the storage-producing fx node first; every fx call node belongs to one Graph node
    fx_calls = {n.name for n in captured.module.graph.nodes if n.op in ("call_function", "placeholder", "get_attr")}
    assert set(captured.owner_of) == fx_calls
    for node_id, names in captured.fx_names.items():
        assert captured.owner_of[names[0]] == node_id
    assert Graph.model_validate_json(graph.to_json()).sha256 == graph.sha256


def test_random_ops_are_not_recomputable() -> None:
    model, batch, _ = build("mlp")
    graph = capture(model, batch).graph
    random_nodes = [n for n in graph.nodes if "bernoulli" in n.op or "dropout" in n.op]
    assert random_nodes and not any(n.recomputable for n in random_nodes)


def _tagged_seeded(op: str) -> bool:
    """Whether torch tags the op "namespace.name.overload" nondeterministic_seeded."""
    namespace, name, overload = op.split(".")
    try:
        target = getattr(getattr(getattr(torch.ops, namespace), name), overload)
    except (AttributeError, RuntimeError):
        return False
    return torch.Tag.nondeterministic_seeded in target.tags


@pytest.mark.parametrize("compact_masks", [True, False])
def test_capture_marks_exactly_the_random_ops(compact_masks: bool) -> None:
    """``Node.random`` is set from the traced op: every node whose op draws, and no other."""
    model, batch, _ = build("transformer")
    graph = capture(model, batch, compact_masks=compact_masks).graph
    marked = {n.id for n in graph.nodes if n.random}
    drawing = {n.id for n in graph.nodes if n.op.count(".") == 2 and _tagged_seeded(n.op)}
    expected_op = "coop.bernoulli_mask.default" if compact_masks else "aten.bernoulli.p"
    assert marked == drawing == {n.id for n in graph.nodes if n.op == expected_op}
    assert len(marked) == 6  # 2 blocks x 3 dropouts
    assert graph.random_draws == marked and not any(graph.node(v).recomputable for v in marked)
    # A version-1 file of this graph (no flags) reads back with the same random ops.
    data = graph.to_dict()
    data["version"] = 1
    for node in data["nodes"]:
        node.pop("random", None)
    assert Graph.model_validate(data) == graph


def test_the_version_1_table_is_torchs_seeded_tag() -> None:
    """coop.graph_upgrades reads version-1 files without torch: its table is the tag it stands for."""
    from coop.graph_upgrades import SEEDED_RANDOM_OPS

    known = set()
    for full_name in torch._C._dispatch_get_all_op_names():  # "aten::bernoulli.p", "coop::bernoulli_mask"
        namespace, _, name = full_name.partition("::")
        packet, _, overload = name.partition(".")
        known.add(f"{namespace}.{packet}.{overload or 'default'}")
    assert {op for op in known if _tagged_seeded(op)} <= SEEDED_RANDOM_OPS
    assert all(_tagged_seeded(op) for op in SEEDED_RANDOM_OPS & known)
    assert "coop.bernoulli_mask.default" in known & SEEDED_RANDOM_OPS


def test_batch_norm_buffers_are_outputs_and_in_place_ops_are_gone() -> None:
    model, batch, _ = build("cnn")
    captured = capture(model, batch)
    targets = [str(n.target) for n in captured.module.graph.nodes]
    assert not any(t.endswith("_.default") or "relu_" in t for t in targets)
    assert len(captured.buffer_names) == 6  # 2 BatchNorms x (mean, var, num_batches_tracked)
    buffer_ids = {captured.owner_of[n.name] for n in captured.module.graph.output_node().args[0][captured.buffer_slice]}
    assert buffer_ids <= set(captured.graph.outputs)
    assert all(not captured.graph.node(i).caller_owned for i in buffer_ids)


def test_tied_weights_get_one_gradient() -> None:
    model, batch, _ = build("transformer")
    captured = capture(model, batch)
    assert "embed.weight" in captured.grad_names and "head.weight" not in captured.grad_names


def test_profile_gives_measured_seconds() -> None:
    model, batch, _ = build("mlp", layers=1)
    state = torch.random.get_rng_state()
    graph = capture(model, batch, profile=True).graph
    assert torch.equal(torch.random.get_rng_state(), state)
    assert graph.meta["cost_unit"] == "seconds (profiled)"
    assert graph.baseline_cost > 0


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        if y.sum() > 0:  # data-dependent control flow
            y = y * 2
        return y.mean()


def test_data_dependent_control_flow_is_refused() -> None:
    with pytest.raises(CaptureError, match="cannot trace") as info:
        capture(Branchy(), (torch.randn(2, 4),))
    assert "\n" not in str(info.value)


def test_non_scalar_loss_is_refused() -> None:
    with pytest.raises(CaptureError, match="not a scalar"):
        capture(nn.Linear(4, 4), (torch.randn(2, 4),), loss_fn=lambda m, x: m(x))


def test_no_trainable_parameter_is_refused() -> None:
    model = nn.Linear(4, 1).requires_grad_(False)
    with pytest.raises(CaptureError, match="no parameter that requires grad"):
        capture(model, (torch.randn(2, 4),), loss_fn=lambda m, x: m(x).sum())


def test_output_without_loss_is_refused() -> None:
    with pytest.raises(CaptureError, match="pass loss_fn"):
        capture(nn.Linear(4, 4), (torch.randn(2, 4),), loss_fn=lambda m, x: (m(x),))


# ---------------------------------------------------------------- compact dropout masks
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("shape", [(3,), (8, 64), (2, 4, 33, 33), (4, 128, 768)])
def test_bool_mask_draws_the_same_numbers_as_the_float_draw(shape: tuple, dtype: torch.dtype) -> None:
    """The rewrite's premise: bernoulli into bool == bernoulli.p in the float dtype, RNG advanced alike."""
    torch.manual_seed(3)
    float_draw = torch.ops.aten.bernoulli.p(torch.empty(shape, dtype=dtype), 0.9)
    after_float = torch.rand(4)
    torch.manual_seed(3)
    mask = torch.ops.coop.bernoulli_mask(list(shape), 0.9, torch.device("cpu"))
    after_mask = torch.rand(4)
    assert mask.dtype == torch.bool
    assert torch.equal(mask.to(dtype), float_draw)
    assert torch.equal(after_mask, after_float)


def _random_and_fixed(graph: Graph) -> tuple[list, int]:
    random_nodes = [n for n in graph.nodes if "bernoulli" in n.op]
    fixed = sum(n.mem for n in graph.nodes if not n.caller_owned and not n.recomputable)
    return random_nodes, fixed


def test_dropout_keeps_only_a_bool_mask_non_recomputable() -> None:
    model, batch, _ = build("transformer")
    compact = capture(model, batch)
    traced = capture(model, batch, compact_masks=False)
    masks, fixed_after = _random_and_fixed(compact.graph)
    draws, fixed_before = _random_and_fixed(traced.graph)
    assert len(masks) == len(draws) == 6  # 2 blocks x 3 dropouts, in the same program order
    assert all(n.op == "coop.bernoulli_mask.default" and not n.recomputable and not n.inputs for n in masks)
    assert sum(n.mem for n in masks) * 4 == sum(n.mem for n in draws)  # 1 byte per element instead of 4
    assert fixed_after == fixed_before - sum(n.mem for n in draws) + sum(n.mem for n in masks)
    for mask in masks:  # the cast back to float is an ordinary, recomputable node
        (cast,) = compact.graph.consumers[mask.id]
        assert compact.graph.node(cast).recomputable and compact.graph.node(cast).op == "aten._to_copy.default"
    assert baseline_peak(compact.graph) <= baseline_peak(traced.graph)


def test_recomputed_dropout_noise_replays_bit_for_bit() -> None:
    """checkpoint-all recomputes the float noise from the kept bool masks; the step still equals eager."""
    from coop.formulations import solve
    from coop.runtime.executor import Executor

    model, batch, loss_fn = build("transformer")
    captured = capture(model, batch, loss_fn)
    graph = captured.graph
    schedule = solve(graph, 10**12, "checkpoint-all").schedule
    casts = {c for n in graph.nodes if n.op == "coop.bernoulli_mask.default" for c in graph.consumers[n.id]}
    computes = [s.node for s in schedule.steps if s.op == "compute"]
    assert any(computes.count(c) > 1 for c in casts), "the schedule should recompute some dropout noise"
    executor = Executor(captured, schedule)
    eager = copy.deepcopy(model)
    torch.manual_seed(21)
    loss = eager_loss(eager, batch, loss_fn)
    loss.backward()
    torch.manual_seed(21)
    outputs = executor.run_flat(captured.flat_inputs(model, batch))
    assert torch.equal(outputs[0], loss.detach())
    grads = dict(zip(captured.grad_names, outputs[captured.grad_slice], strict=True))
    for param_name, param in eager.named_parameters():
        assert torch.equal(grads[param_name], param.grad), param_name
