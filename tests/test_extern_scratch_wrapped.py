"""Measured extern calls matched through inductor's ``control_deps`` wrapper (coop.compiled.extern_scratch).

With eager's random kernels (``fallback_random``) inductor wraps every random op after the first in
``control_deps(deps, subgraph, *operands)`` to keep the draws in order; the generated code still calls the op. A
module like the one inductor compiles is built here by hand (a ``dropout_mask`` called directly, one wrapped, a
matmul, all marked with their joint values), and the measured calls are written by hand: the oracle is hand-counted
bytes (``dropout_mask`` of 8 x 16 floats: its lowering charges 2 x 512 B by construction).
"""

from __future__ import annotations

import torch
from torch import fx
from torch._inductor.fx_passes.control_dependencies import control_deps

import coop.graph_capture.random_ops  # noqa: F401 - registers coop::dropout_mask
from coop.compiled.extern_scratch import KernelCall, call_sites, match_calls, scratch_note
from coop.compiled.inductor_buffers import JOINT_VALUE

ROWS, COLS = 8, 16
#: the lowering's own charge for a dropout_mask of ROWS x COLS floats: native_dropout's float copy and output
KNOWN = 2 * ROWS * COLS * 4


def _module() -> fx.GraphModule:
    """``mask0 = dropout_mask(x)``, ``mask1 = control_deps((mask0,), subgraph, x)``, ``y = mm(x, w)``."""
    x_value = torch.empty(ROWS, COLS, device="meta")
    w_value = torch.empty(COLS, 4, device="meta")
    inner = fx.Graph()
    arg = inner.placeholder("arg_0")
    inner.output(inner.call_function(torch.ops.coop.dropout_mask.default, (arg, 0.1)))
    root = torch.nn.Module()
    root.subgraph_mask_1 = fx.GraphModule(torch.nn.Module(), inner)

    graph = fx.Graph()
    x = graph.placeholder("x")
    w = graph.placeholder("w")
    x.meta["val"], w.meta["val"] = x_value, w_value
    mask0 = graph.call_function(torch.ops.coop.dropout_mask.default, (x, 0.1))
    holder = graph.get_attr("subgraph_mask_1")
    mask1 = graph.call_function(control_deps, ((mask0,), holder, x))
    product = graph.call_function(torch.ops.aten.mm.default, (x, w))
    for node, joint in ((mask0, "mask_a"), (mask1, "mask_b"), (product, "mm_0")):
        node.meta[JOINT_VALUE] = joint
        node.meta["val"] = torch.empty(ROWS, COLS if joint != "mm_0" else 4, device="meta")
    graph.output((mask0, mask1, product))
    return fx.GraphModule(root, graph)


def test_a_wrapped_draw_is_matched_and_only_its_scratch_beyond_the_lowerings_charge_is_charged() -> None:
    calls = [[
        KernelCall("coop::dropout_mask", ((ROWS, COLS),), KNOWN),  # as charged by construction
        KernelCall("coop::dropout_mask", ((ROWS, COLS),), KNOWN + 512),  # the wrapped one: 512 B beyond
        KernelCall("aten::mm", ((ROWS, COLS), (COLS, 4)), 256),
        KernelCall("aten::bmm", ((2, 2, 2), (2, 2, 2)), 64),  # no such node
    ]]
    match = match_calls(calls, [call_sites(_module())])
    assert match.charged == {"mask_b": 512, "mm_0": 256}
    assert match.known == [("coop::dropout_mask", KNOWN), ("coop::dropout_mask", KNOWN)]
    assert match.unmatched == [("aten::bmm", 64)]
    note = scratch_note(match, 2)
    assert "2 calls of coop's own ops with 2,048 B charged by construction" in note
    assert "1 calls with 64 B of scratch matched no node and are not charged (aten::bmm)" in note


def test_the_call_sites_read_at_emission_survive_the_cache_clearing_the_modules_meta() -> None:
    """AOTAutograd's cache clears a compiled module's node meta (its ``serialize_graph_module``, after the
    backward's first run): the sites read before still name each call's joint value; read after, none matches."""
    module = _module()
    sites = call_sites(module)
    for node in module.graph.nodes:
        node.meta = {}
    calls = [[KernelCall("aten::mm", ((ROWS, COLS), (COLS, 4)), 256)]]
    assert match_calls(calls, [sites]).charged == {"mm_0": 256}
    after = match_calls(calls, [call_sites(module)])
    assert after.charged == {} and after.unmatched == [("aten::mm", 256)]
