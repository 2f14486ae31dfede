"""Extern kernels' scratch, measured on the real step of a compiled module (coop.compiled.extern_scratch).

The extern kernel here is a custom op whose scratch is counted by hand: it allocates ``SCRATCH`` bytes inside
itself (a float32 tensor of ``SCRATCH // 4`` elements) and frees them before it returns, so neither the Graph nor
inductor's buffers know them. Oracles: that hand count, and the CPU allocator's peak of the step read by the
test's own meter (``tests/independent_meter.py``: the allocator's events, weights and batch counted by storage).
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

import coop
from coop.compiled.extern_scratch import KernelCall, call_sites, match_calls, profiled_calls
from coop.compiled.inductor_buffers import ObservedBuffer, ObservedGraph
from coop.compiled.observed import observe_round
from coop.graph import Graph, Node
from tests.independent_meter import HeldBytes

ROWS, WIDTH = 128, 128
#: the bytes the custom op allocates inside itself and gives back (hand-counted: float32 elements x 4)
SCRATCH = 1024 * 1024
ACTIVATION = ROWS * WIDTH * 4


@torch.library.custom_op("coop_test_scratch::doubled", mutates_args=())
def doubled(x: torch.Tensor) -> torch.Tensor:
    """``2 x``, computed with a scratch buffer of SCRATCH bytes alive while the output is allocated."""
    scratch = torch.empty(SCRATCH // 4)
    out = x + x
    del scratch
    return out


@doubled.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _doubled_backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
    return grad + grad


doubled.register_autograd(_doubled_backward)


class Scratchy(nn.Module):
    """``lin2(doubled(a * a))`` with ``a = lin1(x)``: at the custom op's step the square's input ``a`` (saved for
    its backward) is live with the scratch; a plan that recomputes ``a`` in the backward holds less there."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1 = nn.Linear(WIDTH, WIDTH, bias=False)
        self.lin2 = nn.Linear(WIDTH, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.lin1(x)
        return self.lin2(doubled(a * a)).sum()


def test_the_calls_of_a_real_step_are_read_and_matched_to_the_joint_value_by_op_and_shapes() -> None:
    """On a plain fx module run under the profiler inside a ``## Call CompiledFxGraph`` range of its own making:
    the custom op's scratch is the hand count, and it is matched to the node with its op and input shapes."""
    x = torch.ones(ROWS, WIDTH)

    def run() -> None:
        with torch._C._profiler._RecordFunctionFast("## Call CompiledFxGraph test ##"):
            torch.ops.aten.mm.default(x, x)
            doubled(x)

    calls = profiled_calls(run)
    assert calls is not None and len(calls) == 1
    by_op = {c.op: c for c in calls[0]}
    assert by_op["coop_test_scratch::doubled"].scratch == SCRATCH
    assert by_op["aten::mm"].scratch == 0
    graph = torch.fx.Graph()
    placeholder = graph.placeholder("x")
    placeholder.meta["val"] = torch.empty(ROWS, WIDTH, device="meta")
    other = graph.call_function(torch.ops.coop_test_scratch.doubled.default, (placeholder,))
    other.meta["coop_joint_value"] = "doubled_wrong_shape"
    other.meta["val"] = placeholder.meta["val"]
    module = torch.fx.GraphModule({}, graph)
    wrong = KernelCall(op="coop_test_scratch::doubled", shapes=((ROWS, 2 * WIDTH),), scratch=SCRATCH)
    match = match_calls([[wrong, by_op["coop_test_scratch::doubled"]]], [call_sites(module)])
    assert match.charged == {"doubled_wrong_shape": SCRATCH}
    assert match.unmatched == [("coop_test_scratch::doubled", SCRATCH)]  # the call of other shapes


def test_the_scratch_measured_on_the_step_is_charged_and_the_next_round_holds_within_the_budget() -> None:
    """Round 0 (no scratch known) holds more than the budget by the allocator's count; the custom op's scratch
    measured on that real step is charged as exactly the hand count, and the round planned with it holds within
    the budget, by this test's own meter of the returned module's step."""
    torch.manual_seed(0)
    model = Scratchy()
    batch = torch.randn(ROWS, WIDTH)
    owned = 2 * WIDTH * WIDTH * 4 + ROWS * WIDTH * 4  # the two weights and the batch
    # at the custom op's step: the batch and weights, a (saved for the square's backward), the square, the op's
    # output and its scratch, half an activation above the budget; without a (recomputed in the backward), half an
    # activation below it
    budget = owned + SCRATCH + 2 * ACTIVATION + ACTIVATION // 2
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = coop.compile(copy.deepcopy(model), budget, example_batch=batch, rounds=2, time_limit=10)
    record = compiled.coop_record
    first = record.rounds[0]
    assert first.measured_peak is not None and first.measured_peak > budget, record.summary()
    assert f"charged {SCRATCH:,} B" in first.reason, record.summary()
    kept = record.plans[-1]  # the plan of the round returned: one within the budget
    op_node = next(n for n in kept.joint.graph.nodes if "doubled" in n.op)
    assert op_node.workspace == SCRATCH, record.summary()  # round 0's Graph gave the op no workspace
    assert min(r.measured_peak for r in record.rounds if r.measured_peak is not None) <= budget, record.summary()
    module = compiled._orig_mod
    for _ in range(2):
        compiled(batch).backward()
    module.zero_grad(set_to_none=True)
    with HeldBytes(held=[*module.parameters(), batch]) as meter:
        compiled(batch).backward()
    assert meter.peak_bytes <= budget, record.summary()


def _observed(buffers: list[tuple[str, str | None, int, tuple[int, ...]]], extern: list[bool]) -> ObservedGraph:
    """A forward of hand-built kernels: (buffer, joint value or None, kernel, readers), all materialized."""
    return ObservedGraph(coop_graph="g", backward=False, kernels=[f"k{i}" for i in range(len(extern))], extern=extern,
                         buffers=[ObservedBuffer(name=b, nbytes=64, joint_name=j, kernel=k, readers=r, output=not r,
                                                 materialized=True, dtype="torch.float32") for b, j, k, r in buffers])


def test_a_value_an_extern_kernel_reads_from_a_nameless_copy_is_not_inlined_but_one_folded_into_it_is() -> None:
    """x -> mm -> sq (pointwise) -> op (extern) and mm -> add(mm, x) run as one addmm: sq's buffer, written for the
    extern op, names no joint value (hand-built as inductor leaves an extern input's copy), so sq is not taken for
    a value never written; the mm folded into the addmm has no buffer at all and is inlined."""
    nodes = [Node(id=0, name="x", mem=64, cost=0, kind="input"), Node(id=1, name="mm", inputs=(0,), mem=64, cost=1),
             Node(id=2, name="sq", inputs=(1,), mem=64, cost=1), Node(id=3, name="op", inputs=(2,), mem=64, cost=1),
             Node(id=4, name="mm2", inputs=(0,), mem=64, cost=1), Node(id=5, name="add", inputs=(4, 0), mem=64, cost=1)]
    graph = Graph(name="g", nodes=nodes, outputs=(3, 5))
    fx_names = {n.id: [n.name] for n in nodes}
    forward = _observed([("buf0", "mm", 0, (1,)), ("buf1", None, 1, (2,)), ("buf2", "op", 2, ()),
                         ("buf3", "add", 3, ())], extern=[True, False, True, True])
    backward = ObservedGraph(coop_graph="g", backward=True)
    observation = observe_round(graph, fx_names, {"mm", "sq", "op", "mm2", "add"}, forward, backward)
    assert observation.inline == {"mm2"}
