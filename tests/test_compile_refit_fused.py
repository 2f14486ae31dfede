"""What a fused kernel pulls ahead of its earliest member, charged in the next round's Graph (coop.compiled.observed).

Inductor numbers its operations in the emitted module's order, places a fused loop kernel at its earliest member
and runs everything its members read before it. On ResNet at 0.7 (issue 41) the schedule ran a batch norm's
weight-gradient sum (reading the saved convolution) early in the backward and recomputed the convolution late for
its statistics; inductor fused the sum with the statistics, so the recomputation ran early and its input lived
from there. Here that round is hand-built:

* Graph: ``x`` (caller-owned, 64 B) -> ``r`` (1024 B) -> ``c`` (64 B); ``g`` (64 B) from ``x``; ``A = sum(g, c)``,
  ``s = stats(c)``, ``B = A * s`` (8 B each, B the output).
* The round's plan saved ``c``, ran ``A`` early (op1) and recomputed ``r`` and ``c`` late (op2, op3) for ``s``
  (op4) and ``B`` (op5); inductor fused op1, op4 and op5 into one kernel and ran op2 and op3 before it.

Oracles, counted by hand: the plan's peak is 1,160 B (x, A, the recomputed r and c); inductor held 1,280 B (x, g
and the saved c still live while r and the recomputed c are written); a Graph in which ``A`` reads ``r`` has no
schedule below x + r + g + c + A = 1,224 B at A's step.
"""

from __future__ import annotations

from coop.budget import min_budget
from coop.compiled.inductor_buffers import ObservedBuffer, ObservedGraph
from coop.compiled.observed import Observation, fused_reads, inline_unbuffered, observe_round
from coop.graph import Graph, Node
from coop.graph_capture.lower import Lowered
from coop.schedule import Schedule, Step, validate

X, R, C, G, A, S, B = range(7)
NAMES = ["x", "r", "c", "g", "A", "s", "B"]
FX_NAMES = {i: [n] for i, n in enumerate(NAMES)}
NODE_OF = {n: i for i, n in enumerate(NAMES)}
MEM = {"x": 64, "r": 1024, "c": 64, "g": 64, "A": 8, "s": 8, "B": 8}
#: hand counts (module docstring)
PLANNED = 64 + 8 + 1024 + 64
HELD_BY_INDUCTOR = 64 + 64 + 64 + 1024 + 64
TIED_FLOOR = 64 + 1024 + 64 + 64 + 8


def _graph(order: tuple[int, ...] = ()) -> Graph:
    def node(i: int, inputs: tuple[int, ...]) -> Node:
        return Node(id=i, name=NAMES[i], inputs=inputs, mem=MEM[NAMES[i]], cost=1)

    nodes = [Node(id=X, name="x", mem=64, cost=0, kind="input"), node(R, (X,)), node(C, (R,)), node(G, (X,)),
             node(A, (G, C)), node(S, (C,)), node(B, (A, S))]
    return Graph(name="g", nodes=nodes, outputs=(B,), order=order)


def _backward() -> ObservedGraph:
    """Kernels as inductor ran them: g (op0), the pulled r (op2) and c (op3, extern), then op1_op4_op5 (A, s, B);
    the saved c is an input read by the fused kernel."""

    def buffer(name: str, kernel: int, writer: str, readers: tuple[int, ...], reader_ops: tuple[str, ...]) -> ObservedBuffer:
        return ObservedBuffer(name=f"buf_{name}", nbytes=MEM[name], joint_name=name, kernel=kernel, readers=readers,
                              output=not readers, materialized=True, dtype="torch.float32", writer=writer,
                              reader_ops=reader_ops)

    return ObservedGraph(coop_graph="g", backward=True, kernels=["op0", "op2", "op3", "op1_op4_op5"],
                         extern=[False, False, True, False],
                         buffers=[buffer("g", 0, "op0", (3,), ("op1",)), buffer("r", 1, "op2", (2,), ("op3",)),
                                  buffer("c", 2, "op3", (3,), ("op4",)), buffer("A", 3, "op1", (3,), ("op5",)),
                                  buffer("s", 3, "op4", (3,), ("op5",)), buffer("B", 3, "op5", (), ())],
                         input_readers={"c": (3,)}, inputs=["c"])


def test_a_fused_member_is_charged_what_the_kernel_pulled_ahead_of_it() -> None:
    """A (op1) is fused with s (op4), which reads the c written by op3: pulled ahead of A. A reads the saved c
    itself, so what the recomputation of c reads, r, is charged to A; s and B come after op3 and get nothing."""
    assert fused_reads(_graph(), FX_NAMES, NODE_OF, _backward()) == {"A": {"r"}}


def test_the_next_graph_has_no_schedule_below_what_the_pulled_kernel_holds() -> None:
    """The round's early-A schedule is legal at 1,160 B on the round's Graph (inductor held 1,280 B running it);
    on the Graph rebuilt from the observation it is not legal (A reads r, not live), and no schedule holds less
    than the hand-counted 1,224 B."""
    graph = _graph()
    early = Schedule(steps=(Step(op="compute", node=R), Step(op="compute", node=C), Step(op="free", node=R),
                            Step(op="compute", node=G), Step(op="compute", node=A), Step(op="free", node=G),
                            Step(op="free", node=C), Step(op="compute", node=R), Step(op="compute", node=C),
                            Step(op="free", node=R), Step(op="compute", node=S), Step(op="free", node=C),
                            Step(op="compute", node=B), Step(op="free", node=A), Step(op="free", node=S)))
    planned = validate(graph, early, PLANNED)
    assert planned.ok and planned.peak == PLANNED < HELD_BY_INDUCTOR, planned.reason
    observation = observe_round(graph, FX_NAMES, set(NAMES[1:]), ObservedGraph(coop_graph="g", backward=False),
                                _backward())
    assert dict(observation.together) == {"A": ("r",)}
    lowered = Lowered(graph=graph, fx_names=FX_NAMES, owner_of=NODE_OF, node_flops={})
    rebuilt = inline_unbuffered(lowered, {}, observation, set()).lowered.graph
    assert not validate(rebuilt, early).ok
    assert min_budget(graph) < TIED_FLOOR == min_budget(rebuilt)
    assert validate(rebuilt, Schedule.from_order(rebuilt.order)).ok


def test_reads_accumulate_over_rounds() -> None:
    """The previous observation's reads stay beside this round's."""
    previous = Observation(together=(("B", ("g",)),))
    seen = observe_round(_graph(), FX_NAMES, set(NAMES[1:]), ObservedGraph(coop_graph="g", backward=False),
                         _backward(), previous)
    assert dict(seen.together) == {"A": ("r",), "B": ("g",)}
