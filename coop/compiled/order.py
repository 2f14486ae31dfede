"""Keep coop's order where inductor's post-grad patterns would move a computation: the ``addmm`` fold.

Inductor's post-grad pattern pass rewrites ``add(mm(a, b), c)`` into ``addmm(c, a, b)``, one kernel that runs where
the ``add`` was. When coop's schedule computes the ``mm`` early and the ``add`` late (a weight read twice, so its
gradient is the sum of two products: GPT-2's tied embedding and language-model head), the fold moves the product to
the end, and its operands (there the logits' gradient, 2 MB on the benchmark's GPT-2) stay alive through the whole
backward, where coop's schedule freed them right after the product. Measured on the benchmark's GPT-2 at 0.5
(one schedule, kept fixed): the compiled step held 18,081,480 B with the fold and the plan predicted 17,412,292 B.

:class:`KeepMatmulsInPlace` is a ``torch._inductor.config.post_grad_custom_post_pass``: it runs after the pattern
passes and undoes each such fold whose ``mm`` coop emitted before some other computation that precedes the ``add``:
the product is written back where coop's schedule put it (right after the last computation coop ran before it, and
after its operands), and the ``addmm`` becomes the ``add``. A fold of an ``mm`` coop ran right before its ``add``
moves nothing and is kept. The emitter records, on every computation it writes, its rank in its phase
(:data:`ORDER`) and, on an ``add`` reading products, their joint names and ranks (:data:`MATMULS`); the pattern pass
copies ``meta["custom"]`` to the ``addmm`` it writes, so the ranks survive the fold. The folded product is the one
of them that is not the ``addmm``'s addend (an ``add`` of two products folds one, either).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch._inductor.custom_graph_pass import CustomGraphPass

from coop.compiled.inductor_buffers import JOINT_VALUE

__all__ = ["MATMULS", "ORDER", "KeepMatmulsInPlace", "mark_order", "matmuls_read_by"]

#: ``meta["custom"]`` key: the rank of an emitted computation among its phase's computations
ORDER = "coop_order"
#: ``meta["custom"]`` key on an emitted ``add`` reading emitted ``mm`` s: ((joint name, rank), ...) of the products
MATMULS = "coop_matmuls"

aten = torch.ops.aten


def mark_order(node: fx.Node, rank: int, matmuls: list[fx.Node] | tuple[fx.Node, ...] = ()) -> None:
    """Record ``node``'s rank in its phase and, for an ``add`` reading products, their joint names and ranks."""
    custom = dict(node.meta.get("custom") or {})
    custom[ORDER] = rank
    ranked = []
    for matmul in matmuls:
        matmul_custom = matmul.meta.get("custom") or {}
        if ORDER in matmul_custom:
            ranked.append((matmul_custom.get(JOINT_VALUE), matmul_custom[ORDER]))
    if ranked:
        custom[MATMULS] = tuple(ranked)
    node.meta["custom"] = custom


def matmuls_read_by(node: fx.Node) -> list[fx.Node]:
    """The ``mm`` s an ``add`` reads (the operands inductor's fold may take into it)."""
    if node.op != "call_function" or node.target not in (aten.add.Tensor, aten.add.default):
        return []
    return [a for a in node.args if isinstance(a, fx.Node) and a.target is aten.mm.default]


class KeepMatmulsInPlace(CustomGraphPass):
    """Undoes inductor's ``addmm`` fold where it would move coop's product (module docstring)."""

    def __init__(self) -> None:
        #: how many folds each call undid, in call order (one call per compiled graph)
        self.undone: list[int] = []

    def __call__(self, graph: fx.Graph) -> None:
        ranked = [(node, (node.meta.get("custom") or {}).get(ORDER)) for node in graph.nodes]
        ranked = [(node, rank) for node, rank in ranked if rank is not None]
        undone = 0
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not aten.addmm.default or node.kwargs:
                continue
            position = {n: index for index, n in enumerate(graph.nodes)}
            custom = node.meta.get("custom") or {}
            inp, mat1, mat2 = node.args
            folded = _folded_product(custom, inp)
            rank = custom.get(ORDER)
            if rank is None or folded is None or rank - folded[1] <= 1:
                continue
            matmul_name, matmul_rank = folded
            if _extended_bytes(node, (mat1, mat2), position) <= _nbytes(node):
                continue  # the fold keeps no operand alive longer than coop's product would live: it costs nothing
            before = [n for n, r in ranked if r < matmul_rank and n in position]
            anchors = [n for n in (*before[-1:], mat1, mat2) if isinstance(n, fx.Node)]
            anchor = max(anchors, key=position.__getitem__)
            if anchor.op == "placeholder":  # the graph's inputs lead it: the product goes after the last of them
                anchor = [n for n in graph.nodes if n.op == "placeholder"][-1]
            if position[anchor] >= position[node]:
                continue
            with graph.inserting_after(anchor):
                product = graph.call_function(aten.mm.default, (mat1, mat2))
            product.meta["val"] = _fake(aten.mm.default, mat1, mat2)
            product.meta["custom"] = {JOINT_VALUE: matmul_name, ORDER: matmul_rank}
            product.meta[JOINT_VALUE] = matmul_name
            with graph.inserting_before(node):
                total = graph.call_function(aten.add.Tensor, (inp, product))
            total.meta = dict(node.meta)
            node.replace_all_uses_with(total)
            graph.erase_node(node)
            undone += 1
        self.undone.append(undone)

    def uuid(self) -> str:
        """Inductor's cache key: the pass's behaviour, which has no options."""
        return "coop-keep-matmuls-in-place-2"

    def __getstate__(self) -> dict[str, Any]:
        """Pickled into inductor's cache keys: nothing of what was undone."""
        return {"undone": []}


def _folded_product(custom: dict[str, Any], addend: Any) -> tuple[str, int] | None:
    """The (joint name, rank) of the product an ``addmm`` folded: of the ``add``'s products, the one that is not
    its addend; None when that is not one product."""
    kept = ((getattr(addend, "meta", None) or {}).get("custom") or {}).get(JOINT_VALUE)
    candidates = [(name, rank) for name, rank in custom.get(MATMULS, ()) if name != kept]
    return candidates[0] if len(candidates) == 1 else None


#: graph inputs that live through the step whatever reads them (the weights, the batch, the output's gradient)
_RESIDENT_INPUTS = ("primals", "tangents")
#: an op whose output shares its first input's storage though its schema does not say it is a view (torch's own
#: ``OpOverload.is_view`` says it for the others)
_UNMARKED_VIEWS = (aten._unsafe_view.default,)


def _is_view(target: Any) -> bool:
    """Whether an op's output is a view of its first input's storage."""
    return getattr(target, "is_view", False) or target in _UNMARKED_VIEWS


def _extended_bytes(fold: fx.Node, operands: tuple[Any, ...], position: dict[fx.Node, int]) -> int:
    """Bytes of the operands' storages that the fold keeps alive past their last other reader: those read by nothing
    at or after ``fold`` but the fold itself (views followed to the storage they view)."""
    extended = 0
    bases = {_base(a) for a in operands if isinstance(a, fx.Node)}
    for base in bases:
        if base.op == "placeholder" and base.name.startswith(_RESIDENT_INPUTS):
            continue
        readers = _readers(base) - {fold}
        if all(position.get(r, -1) < position[fold] for r in readers):
            extended += _nbytes(base)
    return extended


def _base(node: fx.Node) -> fx.Node:
    while node.op == "call_function" and _is_view(node.target) and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def _readers(node: fx.Node) -> set[fx.Node]:
    """The nodes reading ``node``'s storage: its users and, through views, theirs."""
    found: set[fx.Node] = set()
    for user in node.users:
        if user.op == "call_function" and _is_view(user.target):
            found |= _readers(user)
        else:
            found.add(user)
    return found


def _nbytes(node: fx.Node) -> int:
    value = node.meta.get("val")
    return int(value.numel() * value.element_size()) if isinstance(value, torch.Tensor) else 0


def _fake(target: Any, *args: fx.Node) -> Any:
    """The fake value of ``target`` on the fake values of ``args`` (None where one has none)."""
    values = [a.meta.get("val") for a in args]
    if any(v is None for v in values):
        return None
    return target(*values)
