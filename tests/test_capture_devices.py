"""Every value's device is where the kernel put it, not where a fake value says (issue 22, seen again on an H200).

A fake tensor follows its op's inputs to their device where the op's meta function answers ``meta``: efficient
attention's philox seed and offset came out as CUDA values in the Graph while the kernel returns them on the host,
and DELTA's first GPT-2 step then paged a CPU value on the CUDA copy stream (torch: "Expected a cuda device, but
got: cpu"). The profiled step records each output's real device; without a profile a table names the known ones.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import coop
from coop import graph_capture
from coop.graph_capture.cost import profile_nodes
from coop.graph_capture.lower import _real_devices
from coop.zoo import build


def test_the_profiled_kernels_devices_replace_the_fake_values(monkeypatch) -> None:
    model, batch, loss_fn = build("mlp")
    moved_node: list[str] = []

    def profile_that_moves_one_output(module, flat, *args, **kwargs):
        profiled = profile_nodes(module, flat, *args, **kwargs)
        name = next(n.name for n in module.graph.nodes  # a matmul: it owns a new storage (a view would fold)
                    if n.op == "call_function" and "mm" in str(n.target) and profiled.devices.get(n.name))
        profiled.devices[name] = ["meta"] * len(profiled.devices[name])  # as if the kernel put it elsewhere
        moved_node.append(name)
        return profiled

    monkeypatch.setattr(graph_capture, "profile_nodes", profile_that_moves_one_output)
    captured = coop.capture(model, batch, loss_fn=loss_fn, profile=True)
    node_id = captured.owner_of[moved_node[0]]
    assert captured.graph.node(node_id).device == "meta"
    assert [m["fx_node"] for m in captured.graph.meta["devices_moved"]] == moved_node
    others = [n.device for n in captured.graph.nodes if n.id != node_id and n.device is not None]
    assert others and set(others) == {"cpu"}


def test_an_unprofiled_capture_puts_efficient_attentions_seed_and_offset_on_the_host() -> None:
    with FakeTensorMode():
        out = torch.empty(2, 4, 8, 16, device="cuda")
        lse = torch.empty(2, 4, 8, device="cuda")
        seed = torch.empty((), dtype=torch.long, device="cuda")  # what the fake says (the meta function: "meta")
        offset = torch.empty((), dtype=torch.long, device="cuda")
    attention = SimpleNamespace(name="attn", target=torch.ops.aten._scaled_dot_product_efficient_attention.default)
    moved: list = []
    assert _real_devices(attention, [out, lse, seed, offset], None, moved) == ["cuda:0", "cuda:0", "cpu", "cpu"]
    other = SimpleNamespace(name="mm", target=torch.ops.aten.mm.default)
    assert _real_devices(other, [seed], None, moved) == ["cuda:0"]
    # a profiled step's devices win, and each difference is noted
    assert _real_devices(attention, [out, lse, seed, offset], ["cuda:0"] * 4, moved) == ["cuda:0"] * 4
    assert _real_devices(other, [seed], ["cpu"], moved) == ["cpu"] and moved == [
        {"fx_node": "mm", "op": "aten.mm.default", "output": 0, "fake": "cuda:0", "real": "cpu"}]
