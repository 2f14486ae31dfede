"""A compiled step's ops priced as its kernels run on this machine (coop.compiled.pricing).

Oracles: prices counted here by hand from the ops' shapes and hand-made rates (FLOPs 2 M N K, bytes read and written,
elements times a per-element price), and a brute force over every schedule that recomputes a subset of the forward
values right before their first backward reader: the solver must pick the cheapest one, which under the measured
rates recomputes the matmul instead of a random draw, and a plain pointwise op instead of a thin matmul (the
nominal model picks the other one in both cases).
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
import torch._inductor.inductor_prims  # registers prims.inductor_random
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

from coop.compiled.pricing import (
    DRAWS,
    compiled_rates,
    inlined_recomputations,
    op_seconds,
    predicted_overhead,
    predicted_step_seconds,
    recomputation_rates,
    recomputations_at_rates,
    reprice,
    unwritten_seconds,
)
from coop.errors import CoopError
from coop.formulations.core.registry import solve
from coop.graph import Graph
from coop.graph_capture.cost import analytic_seconds
from coop.graph_capture.host_cost import MachineRates
from coop.graph_capture.lower import Lowered
from coop.graph_nodes import Node
from coop.schedule import validate
from coop.schedule_steps import Schedule
from coop.simulator import Simulation

#: the 2-core EPYC's rates at one thread on a quiet core (BENCHMARKS.md), with a per-op host cost to be dropped
RATES = MachineRates(per_op_s=6.8e-6, flop_rate=6.6e10, bandwidth=5.9e10, parallel_s=3e-6, threads=1,
                     element_s={"aten.bernoulli": 18.3e-9, "aten.exp": 1.48e-9})


def _traced(fn, *shapes: tuple[int, ...]) -> dict[str, fx.Node]:
    """The call nodes of ``fn`` traced on fake tensors of ``shapes`` (each with its fake value), by target name."""
    gm = make_fx(fn, tracing_mode="fake")(*(torch.ones(s) for s in shapes))
    return {str(n.target.overloadpacket): n for n in gm.graph.nodes if n.op == "call_function"}


def _draw(x: torch.Tensor) -> torch.Tensor:
    seed = torch.zeros((), dtype=torch.int64)
    return torch.ops.prims.inductor_random.default(list(x.shape), seed, "rand")


def test_each_op_is_priced_by_hand_counted_flops_bytes_and_elements() -> None:
    nodes = _traced(lambda x, w: torch.exp(x @ w) + _draw(x @ w), (64, 32), (32, 16))
    rates = compiled_rates(RATES)
    assert rates.per_op_s == 0 and rates.parallel_s == 0
    mm, exp, draw, add = nodes["aten.mm"], nodes["aten.exp"], nodes["prims.inductor_random"], nodes["aten.add"]
    mm_flops = 2 * 64 * 32 * 16
    assert op_seconds(mm, mm_flops, rates) == pytest.approx(mm_flops / 6.6e10 + 4 * (64 * 32 + 32 * 16 + 64 * 16) / 5.9e10)
    # exp: 1,024 elements at 1.48 ns (1.5 us) against 8 kB moved (0.14 us): its elements
    assert op_seconds(exp, 0, rates) == pytest.approx(1024 * 1.48e-9)
    # the draw is priced as a Bernoulli draw per element; it reads one int64 seed
    assert op_seconds(draw, 0, rates) == pytest.approx(1024 * 18.3e-9)
    assert op_seconds(add, 0, rates) == pytest.approx(3 * 4 * 1024 / 5.9e10)  # no table entry: its bytes


def test_a_fused_groups_price_is_its_members_less_the_buffers_it_never_writes() -> None:
    """``exp(a) + b`` as one node (the exp fused into the add) costs the exp's elements and the add's bytes, less the
    exp's value written and read back, counted here."""
    nodes = _traced(lambda a, b: torch.exp(a) + b, (32, 32), (32, 32))
    exp, add = nodes["aten.exp"], nodes["aten.add"]
    graph = Graph(name="g", nodes=(Node(id=0, name="a", mem=4096, cost=0, kind="input"),
                                   Node(id=1, name="b", mem=4096, cost=0, kind="input"),
                                   Node(id=2, name="exp", inputs=(0,), mem=4096, cost=1.0),
                                   Node(id=3, name="add", inputs=(2, 1), mem=4096, cost=1.0)), outputs=(3,))
    lowered = Lowered(graph=graph, fx_names={0: ["a"], 1: ["b"], 2: [exp.name], 3: [add.name]},
                      owner_of={"a": 0, "b": 1, exp.name: 2, add.name: 3}, node_flops={})
    rates = compiled_rates(RATES)
    priced = reprice(lowered, {exp.name: exp, add.name: add}, rates).graph
    exp_s, add_s = 1024 * 1.48e-9, 3 * 4096 / 5.9e10
    assert [n.cost for n in priced.nodes] == pytest.approx([0, 0, exp_s, add_s])
    assert "compiled_rates" in priced.meta
    from coop.compiled.fusion import fuse_pointwise

    fused, new_id = fuse_pointwise(lowered, {exp.name: exp, add.name: add, "a": exp.args[0], "b": add.args[1]},
                                   set(), unwritten_seconds(rates))
    assert new_id[2] == new_id[3]
    (group,) = [n for n in fused.graph.nodes if not n.caller_owned]
    assert group.cost == pytest.approx(max(exp_s + add_s - 2 * 4096 / 5.9e10, (exp_s + add_s) / 2))


def _two_choice_graph(kind: str, rates: MachineRates | None) -> tuple[Graph, dict[str, int]]:
    """A forward computing a matmul ``m`` and a second value ``p`` (a random draw, or an ``add`` of two inputs), both
    read by the backward after two 1 MiB temporaries (where keeping both is the peak); costs of ``m`` and ``p`` from
    the pricing under test (None: the nominal model)."""
    if kind == "draw":
        nodes = _traced(lambda x, w: _draw(x @ w) * (x @ w), (512, 128), (128, 512))
        second = nodes["prims.inductor_random"]
    else:  # a thin matmul (K = 16) beside a plain pointwise op
        nodes = _traced(lambda x, w, a, b: (x @ w) * (a + b), (512, 16), (16, 512), (512, 512), (512, 512))
        second = nodes["aten.add"]
    mm = nodes["aten.mm"]
    flops = 2 * mm.meta["val"].shape[0] * mm.args[0].meta["val"].shape[1] * mm.meta["val"].shape[1]
    price = (lambda n, f: analytic_seconds(n, f)) if rates is None else (lambda n, f: op_seconds(n, f, rates))
    big, small = 1 << 20, 4
    graph = Graph(name=kind, nodes=(
        Node(id=0, name="x", mem=mm.args[0].meta["val"].numel() * 4, cost=0, kind="input"),
        Node(id=1, name="w", mem=mm.args[1].meta["val"].numel() * 4, cost=0, kind="param"),
        Node(id=2, name="m", inputs=(0, 1), mem=big, cost=price(mm, flops)),
        Node(id=3, name="p", inputs=(0,), mem=big, cost=price(second, 0)),
        Node(id=4, name="y", inputs=(2, 3), mem=small, cost=1e-4),  # the product summed in one kernel
        Node(id=5, name="loss", inputs=(4,), mem=small, cost=1e-5),
        Node(id=6, name="tangent", inputs=(5,), mem=small, cost=0, kind="backward", recomputable=False),
        Node(id=7, name="g1", inputs=(6,), mem=big, cost=1e-4, kind="backward"),
        Node(id=8, name="g2", inputs=(7,), mem=big, cost=1e-4, kind="backward"),  # the peak: g1, g2 and what is kept
        Node(id=9, name="gm", inputs=(8, 3), mem=small, cost=1e-4, kind="backward"),
        Node(id=10, name="gp", inputs=(8, 2), mem=small, cost=1e-4, kind="backward"),
        Node(id=11, name="gw", inputs=(0, 9), mem=small, cost=1e-4, kind="backward"),
    ), outputs=(5, 10, 11), order=tuple(range(2, 12)))
    return graph, {"m": 2, "p": 3}


def _schedules(chosen: tuple[int, ...]) -> list[Schedule]:
    """Every schedule that runs the forward, then the backward in order, with the nodes ``chosen`` recomputed at any
    backward position before their readers (a schedule that recomputes too late is illegal and left to validate)."""
    forward, backward = [2, 3, 4, 5], [6, 7, 8, 9, 10, 11]
    schedules = []
    for places in itertools.product(*[range(len(backward))] * len(chosen)):  # inserted before backward[slot]
        order = list(forward)
        for index, step in enumerate(backward):
            order += [node for node, slot in zip(chosen, places, strict=True) if slot == index]
            order.append(step)
        schedules.append(Schedule.from_order(order))
    return schedules


def _lowest_peak(graph: Graph, chosen: tuple[int, ...]) -> int:
    return min(v.peak for v in (validate(graph, s) for s in _schedules(chosen)) if v.ok)


def _brute_force(graph: Graph, budget: int) -> frozenset[int]:
    """The recomputed set of the cheapest legal schedule within ``budget`` of :func:`_schedules`' over every subset
    of {m, p}."""
    best: tuple[float, frozenset[int]] | None = None
    for count in range(3):
        for chosen in itertools.combinations((2, 3), count):
            for schedule in _schedules(chosen):
                verdict = validate(graph, schedule, budget)
                if verdict.ok and (best is None or verdict.cost < best[0] - 1e-12):
                    best = (verdict.cost, frozenset(chosen))
    assert best is not None
    return best[1]


def _recomputed(graph: Graph, schedule: Schedule) -> frozenset[int]:
    counts: dict[int, int] = {}
    for step in schedule.steps:
        if step.op == "compute":
            counts[step.node] = counts.get(step.node, 0) + 1
    return frozenset(n for n, c in counts.items() if c > 1)


@pytest.mark.parametrize(("kind", "measured", "nominal"), [("draw", "m", "p"), ("pointwise", "p", "m")])
def test_the_measured_prices_recompute_what_the_brute_force_finds_cheapest(kind: str, measured: str,
                                                                          nominal: str) -> None:
    """A budget that keeps only one of the matmul and the other value into the backward: the brute force's cheapest
    schedule recomputes the draw's matmul (a draw of 262,144 elements costs 4.8 ms, the 67 MFLOP product 1.0 ms) and
    the pointwise op (3 MiB at 59 GB/s) before the thin matmul, where the nominal model says the opposite; the
    solver's plan recomputes the same."""
    for rates, expected in ((compiled_rates(RATES), measured), (None, nominal)):
        graph, ids = _two_choice_graph(kind, rates)
        budget = max(_lowest_peak(graph, (ids["m"],)), _lowest_peak(graph, (ids["p"],)))
        assert _lowest_peak(graph, ()) > budget  # one of m and p must be recomputed
        cheapest = _brute_force(graph, budget)
        assert cheapest == {ids[expected]}
        result = solve(graph, budget, "checkmate", time_limit=20)
        assert result.schedule is not None and validate(graph, result.schedule, budget).ok
        assert _recomputed(graph, result.schedule) == cheapest


def test_a_recomputed_pointwise_value_is_priced_without_the_buffers_inductor_fuses_away() -> None:
    """``e = exp(a)``, ``s = sin(a)``, ``c = cos(a)`` and ``t = tan(a)`` in the forward, the first three read by one
    forward ``add`` (a loop op: a value not saved need not be written), ``t`` by a forward ``mm`` (an extern kernel
    reads a buffer); the backward reads ``e`` in one ``mul`` (a loop op: a recomputed ``e`` is computed inside it,
    never written), ``s`` and ``t`` in an ``mm`` and ``c`` in two nodes. Hand-counted at 59 GB/s on 4 kB values:
    ``e`` is priced down by its forward write and its backward write and read (3 x 4 kB), ``s`` and ``c`` by their
    forward write (4 kB), ``t`` not at all; the four discounts are recorded, and a plan's predicted overhead is its
    extra cost over the baseline with them added back."""
    nodes = _traced(lambda a, b: (torch.exp(a) * b, torch.sin(a) @ b, torch.cos(a) + b, torch.cos(a) * b,
                                  torch.tan(a)), (32, 32), (32, 32))
    names = {"e": nodes["aten.exp"], "s": nodes["aten.sin"], "c": nodes["aten.cos"], "t": nodes["aten.tan"],
             "mul": nodes["aten.mul"], "mm": nodes["aten.mm"], "add": nodes["aten.add"]}
    graph = Graph(name="g", nodes=(
        Node(id=0, name="a", mem=4096, cost=0, kind="input"),
        Node(id=1, name="e", inputs=(0,), mem=4096, cost=2e-6),
        Node(id=2, name="s", inputs=(0,), mem=4096, cost=2e-6),
        Node(id=3, name="c", inputs=(0,), mem=4096, cost=2e-6),
        Node(id=9, name="t", inputs=(0,), mem=4096, cost=2e-6),
        Node(id=10, name="tmm", inputs=(9,), mem=4096, cost=1e-6),
        Node(id=4, name="loss", inputs=(1, 2, 3, 10), mem=4, cost=1e-6),
        Node(id=5, name="mul", inputs=(4, 1), mem=4096, cost=1e-6, kind="backward"),
        Node(id=6, name="mm", inputs=(4, 2, 9), mem=4096, cost=1e-6, kind="backward"),
        Node(id=7, name="add", inputs=(4, 3), mem=4096, cost=1e-6, kind="backward"),
        Node(id=8, name="mul2", inputs=(7, 3), mem=4096, cost=1e-6, kind="backward"),
    ), outputs=(4, 5, 6, 8))
    fx_names = {1: [names["e"].name], 2: [names["s"].name], 3: [names["c"].name], 9: [names["t"].name],
                10: [names["mm"].name], 4: [names["add"].name], 5: [names["mul"].name], 6: [names["mm"].name],
                7: [names["add"].name], 8: [names["mul"].name]}
    lowered = Lowered(graph=graph, fx_names=fx_names, owner_of={}, node_flops={})
    priced = inlined_recomputations(lowered, {n.name: n for n in names.values()}, 5.9e10).graph
    assert priced.meta["inlined_recomputations"] == [1, 2, 3]
    cost = {n.name: n.cost for n in priced.nodes}
    assert cost["e"] == pytest.approx(2e-6 - 3 * 4096 / 5.9e10)
    assert cost["s"] == cost["c"] == pytest.approx(2e-6 - 4096 / 5.9e10)
    assert cost["t"] == 2e-6 and cost["tmm"] == 1e-6 and cost["mul2"] == 1e-6
    assert priced.meta["first_compute_discount_s"] == pytest.approx(5 * 4096 / 5.9e10)
    simulation = Simulation(peak=0, cost=priced.baseline_cost + 1e-6, baseline_cost=priced.baseline_cost,
                            memory=[], instances=[], recomputations=1)
    assert predicted_overhead(priced, simulation) == pytest.approx(1e-6 / graph.baseline_cost)
    assert predicted_overhead(priced, None) == 0.0


def test_a_pointwise_value_is_priced_down_to_no_less_than_a_tenth() -> None:
    """A cheap ``exp`` of 4 kB priced 0.1 us (below the 0.21 us of the traffic it saves) keeps a tenth of its
    price."""
    nodes = _traced(lambda a: torch.exp(a) * a, (32, 32))
    exp, mul = nodes["aten.exp"], nodes["aten.mul"]
    graph = Graph(name="g", nodes=(
        Node(id=0, name="a", mem=4096, cost=0, kind="input"),
        Node(id=1, name="e", inputs=(0,), mem=4096, cost=1e-7),
        Node(id=2, name="loss", inputs=(1,), mem=4, cost=1e-6),
        Node(id=3, name="mul", inputs=(2, 1), mem=4096, cost=1e-6, kind="backward"),
    ), outputs=(2, 3))
    lowered = Lowered(graph=graph, fx_names={1: [exp.name], 2: [mul.name], 3: [mul.name]}, owner_of={}, node_flops={})
    priced = inlined_recomputations(lowered, {exp.name: exp, mul.name: mul}, 5.9e10).graph
    assert priced.nodes[1].cost == pytest.approx(1e-8)
    # and the 4-byte ``loss`` (a ``mul``, read by the backward's one ``mul``) by its backward write and read
    assert priced.meta["first_compute_discount_s"] == pytest.approx(9e-8 + 2 * 4 / 5.9e10)


def test_the_draws_pricing_prices_only_the_draws_at_the_measured_rates() -> None:
    """``pricing="draws"``: the draw's node costs its elements at the table's Bernoulli price, the matmul's its
    nominal ``flops / 1e11 + bytes / 2e10``, counted here."""
    nodes = _traced(lambda x, w: _draw(x @ w), (64, 32), (32, 16))
    mm, draw = nodes["aten.mm"], nodes["prims.inductor_random"]
    graph = Graph(name="g", nodes=(Node(id=0, name="mm", mem=4096, cost=1.0), Node(id=1, name="draw", mem=4096, cost=1.0)),
                  outputs=(0, 1))
    lowered = Lowered(graph=graph, fx_names={0: [mm.name], 1: [draw.name]}, owner_of={}, node_flops={},
                      fx_flops={mm.name: 2 * 64 * 32 * 16})
    priced = reprice(lowered, {mm.name: mm, draw.name: draw}, compiled_rates(RATES), only=DRAWS).graph
    nominal_mm = 2 * 64 * 32 * 16 / 1e11 + 4 * (64 * 32 + 32 * 16 + 64 * 16) / 2e10
    assert [n.cost for n in priced.nodes] == pytest.approx([nominal_mm, 1024 * 18.3e-9])


@pytest.mark.parametrize("draw", ["dropout_mask", "float8_dropout_mask"])
def test_coops_own_mask_draws_are_priced_as_the_tables_mask_draw(draw: str) -> None:
    """With eager's draws a dropout reaches the partitioner as coop's mask draw, which ``pricing="draws"`` prices
    like inductor's: its 2,048 elements at the table's bool mask price (hand-counted), not its bytes."""
    import coop.graph_capture.random_ops  # noqa: F401 - registers coop's ops

    op = getattr(torch.ops.coop, draw).default
    gm = make_fx(lambda x: op(x, 0.1), tracing_mode="fake")(torch.ones(64, 32))
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    rates = compiled_rates(dataclasses.replace(RATES, element_s={**RATES.element_s, "coop.bernoulli_mask": 11e-9}))
    assert op_seconds(node, 0, rates) == pytest.approx(2048 * 11e-9)
    graph = Graph(name="g", nodes=(Node(id=0, name="draw", mem=2048, cost=1.0),), outputs=(0,))
    lowered = Lowered(graph=graph, fx_names={0: [node.name]}, owner_of={}, node_flops={})
    assert reprice(lowered, {node.name: node}, rates, only=DRAWS).graph.nodes[0].cost == pytest.approx(2048 * 11e-9)


class ScaledSine(torch.nn.Module):
    """``sum(sin(linear(x)) * scale)``: a matmul, a pointwise value the backward reads in one loop op, no draw."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.scale = torch.nn.Linear(16, 64), torch.nn.Parameter(torch.randn(64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.sin(self.up(x)) * self.scale).sum()


def _scaled_sine_joint() -> tuple[fx.GraphModule, int, list[int]]:
    from tests.test_compile import _joint_graph

    torch.manual_seed(0)
    return _joint_graph(ScaledSine(), torch.randn(8, 16))


def test_the_fused_pricing_lowers_only_the_pointwise_values_it_names_and_records_what_it_took(monkeypatch) -> None:
    """A scaled sine's joint graph on a step without measured rates (as a CUDA step), lowered nominally and with
    ``pricing="fused"`` (no draw in it): the same nodes, bytes and order; each node the fused pricing names costs
    less than its nominal price and no less than a tenth of it, every other node costs the same, and the recorded
    discount is the nominal baseline less the fused one."""
    from coop.compiled import joint
    from coop.compiled.joint import lower_joint

    monkeypatch.setattr(joint, "step_rates", lambda placeholders, device: None)
    gm, num_fwd, static = _scaled_sine_joint()
    nominal = lower_joint(gm, num_fwd, static, pricing="nominal").graph
    fused = lower_joint(gm, num_fwd, static, pricing="fused").graph
    named = set(fused.meta["inlined_recomputations"])
    assert named and [n.mem for n in fused.nodes] == [n.mem for n in nominal.nodes]
    for before, after in zip(nominal.nodes, fused.nodes, strict=True):
        if before.id in named:
            assert before.cost / 10 <= after.cost < before.cost
        else:
            assert after.cost == before.cost
    assert fused.meta["first_compute_discount_s"] == pytest.approx(nominal.baseline_cost - fused.baseline_cost)


def test_the_recomputation_rates_keep_the_draws_table_and_price_every_other_op_by_its_flops_and_bytes() -> None:
    """At the recomputation rates an ``exp`` of 1,024 floats costs its 8 kB at 59 GB/s (0.14 us), not the table's
    1.48 ns an element (1.5 us); the draw keeps its 18.3 ns an element and a convolution its fitted rates."""
    rates = dataclasses.replace(compiled_rates(RATES), fitted={"aten.convolution": (5e-5, 1e-11)})
    nodes = _traced(lambda x, w: torch.exp(x @ w) + _draw(x @ w), (64, 32), (32, 16))
    recompute = recomputation_rates(rates)
    assert op_seconds(nodes["aten.exp"], 0, recompute) == pytest.approx(2 * 4096 / 5.9e10)
    assert op_seconds(nodes["prims.inductor_random"], 0, recompute) == pytest.approx(1024 * 18.3e-9)
    assert recompute.fitted == rates.fitted and recompute.flop_rate == 6.6e10


def test_a_recomputation_is_priced_at_the_rates_and_the_step_as_before() -> None:
    """Two pricings of one hand-built Graph: each recomputable node takes the second's cost, the input and the tangent
    keep theirs, the discount grows by the difference (2 - 0.5 + 1 - 0.25 on top of the 0.5 recorded), so that the
    step is priced as before (5.5 = 3 + 2.5) while a recomputation of ``m`` costs 0.5; Graphs of different sizes are
    refused."""
    def graph(m: float, e: float, meta: dict) -> Graph:
        return Graph(name="g", nodes=(
            Node(id=0, name="x", mem=4, cost=0, kind="input"),
            Node(id=1, name="m", inputs=(0,), mem=4, cost=m),
            Node(id=2, name="e", inputs=(1,), mem=4, cost=e),
            Node(id=3, name="tangent", inputs=(2,), mem=4, cost=0.0, kind="backward", recomputable=False),
            Node(id=4, name="g", inputs=(3, 1), mem=4, cost=2.0, kind="backward"),
        ), outputs=(2, 4), meta=meta)

    priced = Lowered(graph=graph(2.0, 1.0, {"first_compute_discount_s": 0.5}), fx_names={}, owner_of={}, node_flops={})
    at_rates = graph(0.5, 0.25, {"compiled_rates": {"bandwidth": 1.0}})
    result = recomputations_at_rates(priced, at_rates).graph
    assert [n.cost for n in result.nodes] == [0.0, 0.5, 0.25, 0.0, 2.0]
    assert result.meta["first_compute_discount_s"] == pytest.approx(0.5 + 1.5 + 0.75)
    assert result.meta["recomputation_rates"] == {"bandwidth": 1.0}
    simulation = Simulation(peak=0, cost=result.baseline_cost + 0.5, baseline_cost=result.baseline_cost, memory=[],
                            instances=[], recomputations=1)
    assert predicted_step_seconds(result, simulation) == pytest.approx(2.0 + 1.0 + 2.0 + 0.5)
    assert predicted_overhead(result, simulation) == pytest.approx(0.5 / 5.5)
    shorter = Graph(name="g", nodes=at_rates.nodes[:3], outputs=(2,))
    with pytest.raises(CoopError, match="fused it differently"):
        recomputations_at_rates(Lowered(graph=graph(2.0, 1.0, {}), fx_names={}, owner_of={}, node_flops={}), shorter)


def test_the_fused_pricing_prices_a_cpu_steps_recomputations_at_the_measured_rates(monkeypatch) -> None:
    """The scaled sine's joint graph at the hand-made rates: the forward ``addmm`` (16,384 FLOPs; bias, input and
    weight read, 8 x 64 floats written) costs what the rates say, counted here, the ``sin`` its inlined tenth of
    its 8 kB at 59 GB/s; the step (baseline plus discount) is priced as on a step without rates."""
    from coop.compiled import joint
    from coop.compiled.joint import lower_joint

    gm, num_fwd, static = _scaled_sine_joint()
    monkeypatch.setattr(joint, "step_rates", lambda placeholders, device: None)
    without = lower_joint(gm, num_fwd, static, pricing="fused").graph
    monkeypatch.setattr(joint, "step_rates", lambda placeholders, device: compiled_rates(RATES))
    fused = lower_joint(gm, num_fwd, static, pricing="fused").graph
    cost = {n.name: n.cost for n in fused.nodes}
    assert cost["addmm"] == pytest.approx(16384 / 6.6e10 + 4 * (64 + 8 * 16 + 16 * 64 + 8 * 64) / 5.9e10)
    assert cost["sin"] == pytest.approx(2 * 4 * 8 * 64 / 5.9e10 / 10)
    assert (fused.baseline_cost + fused.meta["first_compute_discount_s"]
            == pytest.approx(without.baseline_cost + without.meta["first_compute_discount_s"]))


def test_the_overhead_of_the_timed_step_is_the_predicted_extra_over_the_step_without_it() -> None:
    """A plan predicted to add 10 ms to a compiled step timed at 110 ms adds 10 % to the 100 ms step without its
    recomputations (hand-counted); no timed step, or one no longer than the extra, gives no such share."""
    from types import SimpleNamespace

    from coop.compiled.partitioner import CompiledPlan

    share = CompiledPlan.overhead_of_step.fget
    assert share(SimpleNamespace(step_s=0.110, extra_s=0.010)) == pytest.approx(0.10)
    assert share(SimpleNamespace(step_s=None, extra_s=0.010)) is None
    assert share(SimpleNamespace(step_s=0.010, extra_s=0.010)) is None


def test_a_timed_step_takes_at_least_what_its_forward_sleeps_and_puts_the_gradients_back() -> None:
    """A module whose forward sleeps 20 ms: the median step is no shorter, and its gradient is as it was."""
    import time

    from coop.compiled.measure import step_seconds

    class Sleepy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            time.sleep(0.02)
            return (self.w * x).sum()

    module = Sleepy()
    module.w.grad = torch.full((4,), 7.0)
    assert step_seconds(module, torch.ones(4), None, steps=3) >= 0.02
    assert torch.equal(module.w.grad, torch.full((4,), 7.0))
