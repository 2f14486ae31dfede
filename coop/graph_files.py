"""Reading graph files: coop JSON and the two networkx node-link layouts of the published graphs.

``load_graph`` dispatches on the layout: coop's own JSON (``format`` tag, any version that
:mod:`coop.graph` reads), Checkmate's node-link files (``cost_cpu``, ``cost_ram``, ``backward``)
and the random layered graphs of Gagrani et al. 2022 (whose README, published with the
graphs, gives their semantics). A file that is missing, not JSON, or malformed ends in one :class:`~coop.errors.GraphError`
line naming the node, link or field and the fix. The IR itself lives in :mod:`coop.graph`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from coop.errors import CoopError, GraphError
from coop.graph import GRAPH_FORMAT, Graph
from coop.text import first_line, json_type_name, short_repr


def load_graph(path: str | Path) -> Graph:
    """Read a graph file: coop JSON, or either networkx node-link layout of the published graphs.

    Parameters
    ----------
    path : str or Path
        The graph file; its stem names a graph whose document has no name.

    Returns
    -------
    Graph
        The graph, as :func:`graph_from_dict` builds it.

    Raises
    ------
    GraphError
        When the file cannot be read as JSON (:func:`read_json_file`) or holds no graph.

    Examples
    --------
    One of the published graphs shipped in ``graphs/moccasin`` (run from the repository root):

    >>> from coop import baseline_peak, load_graph, min_budget
    >>> graph = load_graph("graphs/moccasin/random_layered_n100_w0.27_nlv0.75_ed0.2_scd0.14.json")
    >>> len(graph.nodes), len(graph.order)
    (100, 100)
    >>> min_budget(graph), baseline_peak(graph)
    (20020, 46319)
    """
    path = Path(path)
    return graph_from_dict(read_json_file(path, "graph", GraphError), default_name=path.stem)


def read_json_file(path: Path, what: str, error: type[CoopError]) -> Any:
    """The JSON document in ``path``; ``error`` (one line naming the file and the fix) when there is none.

    Shared by the graph and schedule loaders: a missing file, a folder, bytes that are not UTF-8,
    truncated or non-JSON text and absurdly deep nesting all end here, never in a traceback.

    Parameters
    ----------
    path : Path
        The file to read.
    what : str
        What the file should hold (``"graph"``, ``"schedule"``), for messages.
    error : type of CoopError
        The error class to raise.

    Returns
    -------
    Any
        The parsed JSON document.

    Raises
    ------
    CoopError
        An ``error`` when the path is a directory, cannot be read, is not UTF-8, is empty, or is not
        readable JSON.
    """
    if path.is_dir():
        raise error(f"{what} file {path} is a directory: give the path of a JSON file")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read {what} file {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} file {path} is not UTF-8 text (byte {exc.start}); is it a JSON {what} file?") from None
    if not text.strip():
        raise error(f"{what} file {path} is empty: write the {what} JSON into it")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path} is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                    f"is the file truncated?") from None
    except (ValueError, RecursionError) as exc:  # ints beyond Python's digit limit, absurd nesting
        raise error(f"{path} is not a readable JSON {what}: {first_line(exc)}") from None


def graph_from_dict(data: Any, default_name: str = "graph") -> Graph:
    """Dispatch on the layout: coop JSON, Checkmate node-link, or random layered node-link.

    Parameters
    ----------
    data : Any
        The parsed JSON document.
    default_name : str
        The graph's name when a node-link document has none.

    Returns
    -------
    Graph
        The validated graph.

    Raises
    ------
    GraphError
        When ``data`` is not an object, has an unknown format tag, has nodes but no links, or has no
        recognised layout (and from the layout's own checks).
    """
    if not isinstance(data, dict):
        raise GraphError(f"a graph file must hold a JSON object, not {json_type_name(data)}: "
                         "write coop JSON or networkx node-link JSON")
    if data.get("format") == GRAPH_FORMAT:
        return Graph.model_validate(data)
    if "format" in data:
        raise GraphError(f"unknown graph format {short_repr(data['format'])} (coop reads {GRAPH_FORMAT!r} and networkx "
                         "node-link)")
    if "nodes" in data and "links" in data:
        nodes, links = _node_link_lists(data)
        if _is_random_layered(nodes, links):
            return _from_random_layered(data, nodes, links, default_name)
        return _from_checkmate(data, nodes, links, default_name)
    if "nodes" in data:
        raise GraphError(f"graph file has 'nodes' but neither 'links' nor a format tag: add \"format\": {GRAPH_FORMAT!r} "
                         "(coop JSON) or the 'links' list (networkx node-link)")
    raise GraphError("unrecognised graph file: expected coop JSON (\"format\": \"coop.graph\") or networkx node-link "
                     "with 'nodes' and 'links'")


def _node_link_lists(data: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``nodes`` and ``links`` lists of a node-link file, each entry checked to be an object."""
    for key in ("nodes", "links"):
        if not isinstance(data[key], list):
            raise GraphError(f"graph field {key!r} must be a list, not {json_type_name(data[key])}")
        for index, entry in enumerate(data[key]):
            if not isinstance(entry, dict):
                what = "node" if key == "nodes" else "link"
                raise GraphError(f"{what} at position {index}: must be a JSON object, not {json_type_name(entry)}")
    graph_attrs = data.get("graph", {})
    if graph_attrs is not None and not isinstance(graph_attrs, dict):
        raise GraphError(f"graph field 'graph' (the graph's attributes) must be an object, not {json_type_name(graph_attrs)}")
    return data["nodes"], data["links"]


def _is_random_layered(nodes: list[dict[str, Any]], links: list[dict[str, Any]]) -> bool:
    """Gagrani et al.'s layout names its link ends "0" and "1" and its nodes carry ``out_cost``."""
    if links:
        return "0" in links[0] or "1" in links[0]
    return bool(nodes) and "out_cost" in nodes[0] and "cost_ram" not in nodes[0]


def _node_ids(nodes: list[dict[str, Any]], id_field: str) -> list[int]:
    """Each node's id (``id_field``), checked present, an integer and unique, in node order."""
    ids: list[int] = []
    seen: set[int] = set()
    for index, raw in enumerate(nodes):
        if id_field not in raw:
            raise GraphError(f"node at position {index}: field {id_field!r} (its id) is missing; give every node an id")
        node_id = raw[id_field]
        if isinstance(node_id, bool) or not isinstance(node_id, int) or node_id < 0:
            raise GraphError(f"node at position {index}: field {id_field!r} is {short_repr(node_id)}; "
                             "a node id must be a non-negative integer")
        if node_id in seen:
            raise GraphError(f"node {node_id} (position {index}): duplicate node id; give every node its own id")
        seen.add(node_id)
        ids.append(node_id)
    return ids


def _inputs_from_links(links: list[dict[str, Any]], ids: list[int], source_key: str,
                       target_key: str) -> dict[int, list[int]]:
    """Each node's inputs from the links; a link to a node that does not exist, a self-loop or a repeat
    is an error naming the link (never dropped in silence)."""
    known = set(ids)
    inputs: dict[int, list[int]] = {}
    first_seen: dict[tuple[int, int], int] = {}
    for index, link in enumerate(links):
        ends = []
        for key in (source_key, target_key):
            if key not in link:
                raise GraphError(f"link at position {index}: field {key!r} is missing; a link needs "
                                 f"{source_key!r} and {target_key!r}")
            end = link[key]
            if isinstance(end, bool) or not isinstance(end, int):
                raise GraphError(f"link at position {index}: field {key!r} is {short_repr(end)}, not a node id")
            ends.append(end)
        source, target = ends
        where = f"link at position {index} ({source} -> {target})"
        for role, end in (("source", source), ("target", target)):
            if end not in known:
                raise GraphError(f"{where}: {role} {end} is not a node id; add node {end} or remove the link")
        if source == target:
            raise GraphError(f"{where}: a self-loop (node {source} reads its own output); remove the link")
        if (source, target) in first_seen:
            raise GraphError(f"{where}: repeats the link at position {first_seen[source, target]}; remove one")
        first_seen[source, target] = index
        inputs.setdefault(target, []).append(source)
    return inputs


def _required(raw: dict[str, Any], node_id: int, fields: tuple[str, ...]) -> None:
    for field in fields:
        if field not in raw:
            name = f" ({raw['name']})" if isinstance(raw.get("name"), str) else ""
            raise GraphError(f"node {node_id}{name}: field {field!r} is missing; add it to the node")


def _from_checkmate(data: dict[str, Any], raw_nodes: list[dict[str, Any]], links: list[dict[str, Any]],
                    default_name: str) -> Graph:
    """Checkmate's layout: nodes {id, name, backward, cost_cpu, cost_ram}, links {source, target}."""
    ids = _node_ids(raw_nodes, "id")
    inputs = _inputs_from_links(links, ids, "source", "target")
    nodes = []
    for node_id, raw in zip(ids, raw_nodes, strict=True):
        _required(raw, node_id, ("cost_ram", "cost_cpu"))
        nodes.append(
            {
                "id": node_id,
                "name": str(raw.get("name", node_id)),
                "op": str(raw.get("name", "")),
                "inputs": inputs.get(node_id, []),
                "mem": raw["cost_ram"],
                "cost": raw["cost_cpu"],
                "kind": "backward" if raw.get("backward") else "forward",
            }
        )
    graph_attrs = data.get("graph") or {}
    title = graph_attrs.get("name", default_name)
    return Graph.model_validate(
        {
            "name": default_name,
            "nodes": nodes,
            "meta": {"source": "checkmate", "title": title if isinstance(title, str) else default_name,
                     "mem_unit": "bytes", "cost_unit": "profiled units"},
        }
    )


def _from_random_layered(data: dict[str, Any], raw_nodes: list[dict[str, Any]], links: list[dict[str, Any]],
                         default_name: str) -> Graph:
    """Gagrani et al.'s layout: nodes {name, out_cost, duration}, links {"0": src, "1": dst}."""
    ids = _node_ids(raw_nodes, "name")
    inputs = _inputs_from_links(links, ids, "0", "1")
    nodes = []
    for node_id, raw in zip(ids, raw_nodes, strict=True):
        _required(raw, node_id, ("out_cost", "duration"))
        nodes.append(
            {
                "id": node_id,
                "name": str(node_id),
                "inputs": inputs.get(node_id, []),
                "mem": raw["out_cost"],
                "cost": raw["duration"],
            }
        )
    graph_attrs = data.get("graph") or {}
    name = graph_attrs.get("name", default_name)
    return Graph.model_validate(
        {
            "name": name if isinstance(name, str) else default_name,
            "nodes": nodes,
            "order": graph_attrs.get("order", []),
            "meta": {"source": "random_layered", "mem_unit": "units", "cost_unit": "units"},
        }
    )


