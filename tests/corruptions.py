"""Corrupt a valid JSON document (a graph or a schedule) in every way a user's file can be broken.

Shared by the fuzz tests (tests/test_fuzz_inputs.py) and the fuzz benchmark (benchmarks/bench_fuzz.py,
which puts tests/ on sys.path)::

    from corruptions import MUST_FAIL, corruptions
    for name, data in corruptions(valid_doc, random.Random(seed)):
        path.write_bytes(data)   # then load / run the CLI on it

:func:`corruptions` knows three layouts: coop graph JSON (``format: coop.graph``), networkx
node-link graphs (both published layouts: ``source``/``target`` or ``"0"``/``"1"`` links) and coop
schedules (``format: coop.schedule/1``). Every layout gets the generic corruptions (truncation,
random bytes, a flipped byte, a wrong top-level type, an empty file, and at a random place in the
document: a dropped field, a wrong type, NaN, infinity, a huge or a negative number); each layout
adds its structural ones (dangling and duplicate links, duplicate ids, self-loops, cycles, unknown
outputs, a non-topological order; unknown ops and nodes in a schedule).

Names in :data:`MUST_FAIL` always break the document: the command that reads it (with the graph,
for a schedule) must refuse it with one line. Any other corruption may happen to leave a valid
document (dropping an optional field, say), so it may succeed or fail, but never with a traceback.
"""

from __future__ import annotations

import copy
import json
import math
import random
from collections.abc import Iterator
from typing import Any

#: Corruptions that always make the document invalid for the command that reads it.
MUST_FAIL: frozenset[str] = frozenset({
    "truncated", "empty_file", "random_bytes", "top_level_list", "top_level_number", "not_json",
    # graphs
    "dangling_input", "dangling_link", "duplicate_id", "duplicate_link", "self_loop", "cycle", "nan_mem",
    "nan_cost", "inf_cost", "negative_mem", "huge_mem", "negative_id", "unknown_output",
    "order_not_topological", "no_nodes",
    # schedules
    "unknown_op", "unknown_step_node", "negative_step_node", "step_node_text", "wrong_format", "no_steps_field",
    "step_not_object", "unknown_impl",
})

Path = tuple[Any, ...]


def corruptions(valid_doc: dict[str, Any], rng: random.Random) -> Iterator[tuple[str, bytes]]:
    """Yield ``(name, file bytes)`` for every corruption of ``valid_doc`` (deterministic given ``rng``).

    ``valid_doc`` is not modified. Structural corruptions are yielded only where the document has
    what they need (a cycle needs two connected computed nodes, say).
    """
    yield from _generic(valid_doc, rng)
    if valid_doc.get("format") == "coop.graph":
        yield from _coop_graph(valid_doc, rng)
    elif isinstance(valid_doc.get("links"), list):
        yield from _node_link_graph(valid_doc, rng)
    elif isinstance(valid_doc.get("steps"), list):
        yield from _schedule(valid_doc, rng)


def encode(doc: Any) -> bytes:
    """JSON bytes as Python writes them (NaN and Infinity included: the files users produce)."""
    return json.dumps(doc, allow_nan=True).encode()


# ------------------------------------------------------------------------------------------ generic
def _generic(doc: dict[str, Any], rng: random.Random) -> Iterator[tuple[str, bytes]]:
    text = encode(doc)
    yield "truncated", text[: rng.randrange(1, len(text) - 1)]
    yield "empty_file", b""
    yield "random_bytes", b"\xff" + rng.randbytes(rng.randrange(1, 64))  # 0xff never starts UTF-8 text
    flipped = bytearray(text)
    flipped[rng.randrange(len(flipped))] = rng.randrange(256)
    yield "flipped_byte", bytes(flipped)
    yield "top_level_list", encode([doc])
    yield "top_level_number", b"42"
    yield "not_json", b"nodes: [1, 2]\n"
    yield "deep_nesting", b"[" * 100_000 + b"]" * 100_000
    paths = list(_paths(doc))
    for name, mutate in _VALUE_MUTATIONS.items():
        path = rng.choice(paths)
        yield name, encode(_replaced(doc, path, mutate(_get(doc, path), rng)))
    yield "drop_field", encode(_dropped(doc, rng.choice([p for p in paths if isinstance(p[-1], str)])))


def _wrong_type(value: Any, rng: random.Random) -> Any:
    options: list[Any] = ["text", 3, 2.5, True, None, [1, 2], {"a": 1}]
    return rng.choice([o for o in options if type(o) is not type(value)])


_VALUE_MUTATIONS = {
    "wrong_type": _wrong_type,
    "nan_anywhere": lambda value, rng: math.nan,
    "inf_anywhere": lambda value, rng: rng.choice([math.inf, -math.inf]),
    "huge_anywhere": lambda value, rng: rng.choice([10**30, 10**400, 1e308]),
    "negative_anywhere": lambda value, rng: -value if isinstance(value, (int, float)) and value else -rng.randrange(1, 10**6),
}


def _paths(doc: Any, prefix: Path = ()) -> Iterator[Path]:
    """Every path (keys and indices) to a value inside ``doc``, the value itself excluded."""
    children = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in children:
        yield (*prefix, key)
        yield from _paths(value, (*prefix, key))


def _get(doc: Any, path: Path) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _replaced(doc: dict[str, Any], path: Path, value: Any) -> dict[str, Any]:
    result = copy.deepcopy(doc)
    _get(result, path[:-1])[path[-1]] = value
    return result


def _dropped(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    result = copy.deepcopy(doc)
    del _get(result, path[:-1])[path[-1]]
    return result


# ------------------------------------------------------------------------------------------ graphs
def _coop_graph(doc: dict[str, Any], rng: random.Random) -> Iterator[tuple[str, bytes]]:
    nodes = doc["nodes"]
    ids = [n["id"] for n in nodes]
    computed = [i for i, n in enumerate(nodes) if n.get("kind", "forward") not in ("input", "param", "buffer")]
    at = rng.choice(computed)
    missing = max(ids) + 1 + rng.randrange(100)
    yield "dangling_input", encode(_with_node(doc, at, inputs=[*nodes[at].get("inputs", []), missing]))
    yield "self_loop", encode(_with_node(doc, at, inputs=[*nodes[at].get("inputs", []), nodes[at]["id"]]))
    other = rng.choice([i for i in range(len(nodes)) if i != at] or [at])
    if other != at:
        yield "duplicate_id", encode(_with_node(doc, other, id=nodes[at]["id"]))
    edge = _computed_edge(nodes, computed, rng)
    if edge is not None:  # the computed input it reads now also reads it: a two-node cycle
        reader, source = edge
        yield "cycle", encode(_with_node(doc, source, inputs=[*nodes[source].get("inputs", []), nodes[reader]["id"]]))
    for name, field, value in (("nan_mem", "mem", math.nan), ("nan_cost", "cost", math.nan),
                               ("inf_cost", "cost", math.inf), ("negative_mem", "mem", -1 - rng.randrange(100)),
                               ("huge_mem", "mem", 10 ** rng.randrange(20, 400))):
        yield name, encode(_with_node(doc, rng.randrange(len(nodes)), **{field: value}))
    yield "negative_id", encode(_renamed(doc, rng.choice(ids), -1 - rng.randrange(100)))
    yield "unknown_output", encode({**doc, "outputs": [*doc.get("outputs", []), missing]})
    order = doc.get("order") or []
    if edge is not None and len(order) >= 2:
        yield "order_not_topological", encode({**doc, "order": list(reversed(order))})
    yield "no_nodes", encode({**doc, "nodes": []})


def _node_link_graph(doc: dict[str, Any], rng: random.Random) -> Iterator[tuple[str, bytes]]:
    nodes, links = doc["nodes"], doc["links"]
    source_key, target_key = ("0", "1") if links and "0" in links[0] else ("source", "target")
    id_key = "name" if source_key == "0" else "id"
    ids = [n[id_key] for n in nodes]
    missing = max(ids) + 1 + rng.randrange(100)
    pick = rng.choice(ids)
    dangling = {source_key: pick, target_key: missing} if rng.random() < 0.5 else {source_key: missing, target_key: pick}
    yield "dangling_link", encode({**doc, "links": [*links, dangling]})
    yield "self_loop", encode({**doc, "links": [*links, {source_key: pick, target_key: pick}]})
    if links:
        link = rng.choice(links)
        yield "duplicate_link", encode({**doc, "links": [*links, dict(link)]})
        yield "cycle", encode({**doc, "links": [*links, {source_key: link[target_key], target_key: link[source_key]}]})
    if len(nodes) >= 2:
        at, other = rng.sample(range(len(nodes)), 2)
        yield "duplicate_id", encode(_with_node(doc, other, **{id_key: nodes[at][id_key]}))
    yield "negative_id", encode(_with_node(doc, rng.randrange(len(nodes)), **{id_key: -1 - rng.randrange(100)}))
    mem_key, cost_key = ("out_cost", "duration") if id_key == "name" else ("cost_ram", "cost_cpu")
    for name, field, value in (("nan_mem", mem_key, math.nan), ("nan_cost", cost_key, math.nan),
                               ("inf_cost", cost_key, math.inf), ("negative_mem", mem_key, -1 - rng.randrange(100)),
                               ("huge_mem", mem_key, 10 ** rng.randrange(20, 400))):
        yield name, encode(_with_node(doc, rng.randrange(len(nodes)), **{field: value}))
    yield "no_nodes", encode({**doc, "nodes": [], "links": []})


def _with_node(doc: dict[str, Any], index: int, **fields: Any) -> dict[str, Any]:
    result = copy.deepcopy(doc)
    result["nodes"][index].update(fields)
    return result


def _renamed(doc: dict[str, Any], old: int, new: int) -> dict[str, Any]:
    """Node ``old`` renamed ``new`` everywhere it is named (so only the id's sign is wrong)."""
    result = copy.deepcopy(doc)
    for node in result["nodes"]:
        node["id"] = new if node["id"] == old else node["id"]
        node["inputs"] = [new if i == old else i for i in node.get("inputs", [])]
        if node.get("output_of") == old:
            node["output_of"] = new
    for key in ("outputs", "order"):
        result[key] = [new if i == old else i for i in result.get(key, [])]
    return result


def _computed_edge(nodes: list[dict[str, Any]], computed: list[int], rng: random.Random) -> tuple[int, int] | None:
    """(reader, source) positions of a computed node reading another computed node, if there is one."""
    position = {nodes[i]["id"]: i for i in computed}
    edges = [(i, position[j]) for i in computed for j in nodes[i].get("inputs", []) if j in position]
    return rng.choice(edges) if edges else None


# ------------------------------------------------------------------------------------------ schedules
def _schedule(doc: dict[str, Any], rng: random.Random) -> Iterator[tuple[str, bytes]]:
    steps = doc["steps"]
    if not steps:
        return
    at = rng.randrange(len(steps))
    node_ids = {s["node"] for s in steps}
    yield "unknown_op", encode(_with_step(doc, at, op=rng.choice(["explode", "COMPUTE", "", "recompute"])))
    yield "unknown_step_node", encode(_with_step(doc, at, node=max(node_ids) + 1 + rng.randrange(100)))
    yield "negative_step_node", encode(_with_step(doc, at, node=-1 - rng.randrange(100)))
    yield "step_node_text", encode(_with_step(doc, at, node=str(steps[at]["node"])))
    yield "unknown_impl", encode(_with_step(doc, at, op="compute", impl="no-such-impl"))
    yield "wrong_format", encode({**doc, "format": rng.choice(["coop.schedule/2", "coop.graph", None, 1])})
    yield "no_steps_field", encode({k: v for k, v in doc.items() if k != "steps"})
    result = copy.deepcopy(doc)
    result["steps"][at] = rng.choice([5, "compute 3", None, [1]])
    yield "step_not_object", encode(result)
    shuffled = copy.deepcopy(doc)
    rng.shuffle(shuffled["steps"])
    yield "shuffled_steps", encode(shuffled)
    dropped = copy.deepcopy(doc)
    del dropped["steps"][at]
    yield "dropped_step", encode(dropped)


def _with_step(doc: dict[str, Any], index: int, **fields: Any) -> dict[str, Any]:
    result = copy.deepcopy(doc)
    result["steps"][index].update(fields)
    return result
