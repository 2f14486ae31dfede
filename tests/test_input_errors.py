"""Every malformed input gets exit 2 and one line on stderr naming the node, link, field or step (issue 11).

One explicit case per corruption class: graph files (coop JSON and both networkx node-link layouts),
schedule files, budgets and sweep configs, through `coop info`, `solve`, `validate`, `simulate`,
`compare` and `plot`. The oracle is the text a user needs: the exit status, a single
``coop: error:`` line, and the id / field / step that is wrong in it.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coop.budget import parse_budget
from coop.cli import main
from coop.errors import BudgetError
from coop.graph import Graph

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------- valid documents
def coop_graph_doc() -> dict[str, Any]:
    """x (input) -> a -> b -> c, c also reads a; baseline peak 4 + 8 + 8 + 8 = 28 at c's step."""
    return {"format": "coop.graph", "version": 1, "name": "tiny", "nodes": [
        {"id": 0, "name": "x", "mem": 4, "cost": 0, "kind": "input"},
        {"id": 1, "name": "a", "inputs": [0], "mem": 8, "cost": 1.0,
         "impls": [{"name": "lean", "cost": 2.0, "mem": 4}]},
        {"id": 2, "name": "b", "inputs": [1], "mem": 8, "cost": 1.0},
        {"id": 3, "name": "c", "inputs": [2, 1], "mem": 8, "cost": 1.0},
    ], "outputs": [3], "order": [1, 2, 3]}


def checkmate_doc() -> dict[str, Any]:
    """Checkmate's node-link layout (ids, cost_cpu, cost_ram, source/target links)."""
    return {"directed": True, "multigraph": False, "graph": {"name": "cm"},
            "nodes": [{"id": i, "name": f"n{i}", "backward": i >= 2, "cost_cpu": 1, "cost_ram": 10} for i in range(4)],
            "links": [{"source": 0, "target": 1}, {"source": 1, "target": 2}, {"source": 2, "target": 3},
                      {"source": 0, "target": 3}]}


def layered_doc() -> dict[str, Any]:
    """The random layered layout (node id in 'name', links {"0": source, "1": target}, graph.order)."""
    return {"directed": True, "multigraph": False, "graph": {"name": "rl", "order": [0, 1, 2]},
            "nodes": [{"name": i, "out_cost": 5, "param_cost": 0, "duration": 1} for i in range(3)],
            "links": [{"0": 0, "1": 1}, {"0": 1, "1": 2}]}


def schedule_doc() -> dict[str, Any]:
    """A legal schedule of coop_graph_doc() (no graph digest: it is checked against any graph given)."""
    return {"format": "coop.schedule/1", "budget": 28, "formulation": "hand",
            "steps": [{"op": "compute", "node": 1}, {"op": "compute", "node": 2}, {"op": "compute", "node": 3}],
            "predicted": {"peak": 28}}


# ---------------------------------------------------------------------------- helpers
def run(argv: list[Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def the_error_line(stderr: str) -> str:
    """The one line of stderr (notes aside), which must be a coop error and carry no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("coop: note:")]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("coop: error: "), stderr
    return lines[0]


def write(path: Path, content: Any) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(json.dumps(content))
    return path


def changed(doc: dict[str, Any], change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    result = copy.deepcopy(doc)
    change(result)
    return result


def node(index: int, **fields: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda doc: doc["nodes"][index].update(fields)


def without(index: int, field: str) -> Callable[[dict[str, Any]], Any]:
    return lambda doc: doc["nodes"][index].pop(field)


# ---------------------------------------------------------------------------- graph files
_COOP = coop_graph_doc()
_CM = checkmate_doc()
_RL = layered_doc()

#: (case, file content, fragments the one error line must contain)
GRAPH_CASES: list[tuple[str, Any, tuple[str, ...]]] = [
    ("input naming a missing node", changed(_COOP, node(2, inputs=[7])), ("node 2 (b)", "unknown input id 7")),
    ("duplicate id", changed(_COOP, node(2, id=1)), ("node 1", "duplicate node id")),
    ("name with a line break", changed(_COOP, node(2, name="b\nsecond line", inputs=[7])),
     ("node 2 (b second line)", "unknown input id 7")),
    ("self-loop", changed(_COOP, node(2, inputs=[2])), ("node 2 (b)", "own output")),
    ("cycle", changed(_COOP, node(1, inputs=[0, 3])), ("lies on a cycle",)),
    ("negative mem", changed(_COOP, node(2, mem=-8)), ("node 2 (b)", "'mem'", "-8")),
    ("NaN cost", '{"format":"coop.graph","nodes":[{"id":0,"name":"a","mem":1,"cost":NaN}]}', ("node 0 (a)", "'cost'", "nan")),
    ("infinite cost", '{"format":"coop.graph","nodes":[{"id":0,"name":"a","mem":1,"cost":Infinity}]}',
     ("node 0 (a)", "'cost'", "inf")),
    ("infinite mem", '{"format":"coop.graph","nodes":[{"id":0,"name":"a","mem":-Infinity,"cost":1}]}', ("node 0 (a)", "'mem'")),
    ("huge mem", changed(_COOP, node(3, mem=10**400)), ("node 3 (c)", "'mem'", "2**50")),
    ("text cost", changed(_COOP, node(1, cost="fast")), ("node 1 (a)", "'cost'", "'fast'")),
    ("boolean mem", changed(_COOP, node(1, mem=True)), ("node 1 (a)", "'mem'")),
    ("fractional mem", changed(_COOP, node(1, mem=1.5)), ("node 1 (a)", "'mem'", "1.5")),
    ("negative impl cost", changed(_COOP, node(1, impls=[{"name": "lean", "cost": -1, "mem": 4}])),
     ("node 1 (a)", "'impls[0].cost'")),
    ("missing mem", changed(_COOP, without(2, "mem")), ("node 2 (b)", "field 'mem' is missing")),
    ("missing id", changed(_COOP, without(2, "id")), ("node at position 2", "'id'", "missing")),
    ("missing nodes", changed(_COOP, lambda d: d.pop("nodes")), ("'nodes'", "missing")),
    ("unknown field", changed(_COOP, node(1, colour="red")), ("node 1 (a)", "unknown field 'colour'")),
    ("negative id", changed(_COOP, node(3, id=-3)), ("'id'", "-3")),
    ("output naming an unknown node", changed(_COOP, lambda d: d.update(outputs=[3, 9])), ("output 9", "not a node id")),
    ("order naming an unknown node", changed(_COOP, lambda d: d.update(order=[1, 2, 3, 9])), ("order", "9")),
    ("order not topological", changed(_COOP, lambda d: d.update(order=[2, 1, 3])), ("order", "node 2 (b)", "input 1")),
    ("empty graph", changed(_COOP, lambda d: d.update(nodes=[], outputs=[], order=[])), ("empty",)),
    ("truncated file", json.dumps(_COOP)[:60], ("not JSON", "truncated")),
    ("not JSON", "nodes: [a, b]", ("not JSON",)),
    ("binary file", b"\xff\xfe\x00garbage", ("not UTF-8",)),
    ("empty file", "", ("empty",)),
    ("top level is a list", [_COOP], ("JSON object", "JSON list")),
    ("top level is a number", "42", ("JSON object", "JSON number")),
    ("unknown format", changed(_COOP, lambda d: d.update(format="onnx")), ("unknown graph format 'onnx'",)),
    ("node is not an object", changed(_COOP, lambda d: d["nodes"].__setitem__(2, 7)), ("node at position 2",)),
    # Checkmate's node-link layout
    ("link to a missing node", changed(_CM, lambda d: d["links"].append({"source": 3, "target": 5})),
     ("link at position 4", "target 5", "not a node id")),
    ("link from a missing node", changed(_CM, lambda d: d["links"].append({"source": 9, "target": 1})),
     ("link at position 4", "source 9")),
    ("duplicate link", changed(_CM, lambda d: d["links"].append({"source": 1, "target": 2})),
     ("link at position 4", "repeats the link at position 1")),
    ("self-loop link", changed(_CM, lambda d: d["links"].append({"source": 2, "target": 2})),
     ("link at position 4", "self-loop")),
    ("cycle of links", changed(_CM, lambda d: d["links"].append({"source": 3, "target": 0})), ("lies on a cycle",)),
    ("duplicate node-link id", changed(_CM, node(3, id=1)), ("node 1", "duplicate node id")),
    ("missing cost_ram", changed(_CM, without(2, "cost_ram")), ("node 2 (n2)", "'cost_ram'", "missing")),
    ("NaN cost_cpu", json.dumps(changed(_CM, node(1, cost_cpu=float("nan")))), ("node 1 (n1)", "'cost'")),
    ("text id", changed(_CM, node(1, id="one")), ("node at position 1", "'id'", "'one'")),
    ("link missing its target", changed(_CM, lambda d: d["links"].append({"source": 1})), ("link at position 4", "'target'")),
    ("link is not an object", changed(_CM, lambda d: d["links"].append([1, 2])), ("link at position 4",)),
    ("links is not a list", changed(_CM, lambda d: d.update(links=3)), ("'links'", "list")),
    ("empty node-link graph", changed(_CM, lambda d: d.update(nodes=[], links=[])), ("empty",)),
    # the random layered layout
    ("layered link to a missing node", changed(_RL, lambda d: d["links"].append({"0": 2, "1": 8})),
     ("link at position 2", "target 8")),
    ("layered order naming an unknown node", changed(_RL, lambda d: d["graph"].update(order=[0, 1, 2, 5])),
     ("order", "5")),
    ("layered order not topological", changed(_RL, lambda d: d["graph"].update(order=[1, 0, 2])),
     ("order", "node 1", "input 0")),
    ("layered missing duration", changed(_RL, without(1, "duration")), ("node 1", "'duration'", "missing")),
    ("layered negative out_cost", changed(_RL, node(2, out_cost=-5)), ("node 2", "'mem'", "-5")),
]


@pytest.mark.parametrize(("case", "content", "fragments"), GRAPH_CASES, ids=[c[0] for c in GRAPH_CASES])
@pytest.mark.parametrize("command", ["info", "solve"])
def test_malformed_graph_is_one_line_naming_the_culprit(case: str, content: Any, fragments: tuple[str, ...],
                                                        command: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "graph.json", content)
    argv: list[Any] = ["info", path] if command == "info" else ["solve", path, "-b", "100%", "-f", "store-all"]
    status, _, err = run(argv, capsys)
    line = the_error_line(err)
    assert status == 2, line
    for fragment in fragments:
        assert fragment in line, f"{case}: {fragment!r} not in {line!r}"


def test_unreadable_graph_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(["info", tmp_path / "missing.json"], capsys)
    assert status == 2 and "No such file" in the_error_line(err)
    status, _, err = run(["info", tmp_path], capsys)
    assert status == 2 and "is a directory" in the_error_line(err)


def test_valid_node_link_files_still_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The strict checks refuse broken files only: the intact layouts load with their links as inputs."""
    for doc, edges in ((_CM, 4), (_RL, 2), (_COOP, 4)):
        status, out, err = run(["info", write(tmp_path / "g.json", doc), "--json"], capsys)
        assert status == 0, err
        assert json.loads(out)["edges"] == edges


# ---------------------------------------------------------------------------- coop info on a valid graph
def test_info_prints_every_fact_of_a_graph_without_forward_and_backward(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # One node of 7 bytes and no forward/backward split: no baseline applies and the bisection has no room, yet
    # every fact is known (peak 7: the node alone); this crashed `coop info` once.
    path = write(tmp_path / "one.json", {"nodes": [{"id": 0, "name": "a", "cost_cpu": 3, "cost_ram": 7}], "links": []})
    status, out, err = run(["info", path, "--json"], capsys)
    assert status == 0, err
    facts = json.loads(out)
    assert (facts["nodes"], facts["edges"], facts["baseline_peak"], facts["baseline_cost"]) == (1, 0, 7, 3.0)
    assert facts["min_budget"] == 7
    assert facts["constructed_budget"] == 7  # the one schedule there is: the baseline order
    status, out, err = run(["info", path], capsys)
    assert status == 0, err
    assert "baseline peak" in out and "min budget (lower bound)" in out and "constructed budget (upper bound)" in out


# ---------------------------------------------------------------------------- schedule files
_SCHEDULE = schedule_doc()


def step(index: int, **fields: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda doc: doc["steps"][index].update(fields)


SCHEDULE_CASES: list[tuple[str, Any, tuple[str, ...]]] = [
    ("unknown op", changed(_SCHEDULE, step(1, op="explode")), ("step 1", "'op'", "'explode'", "compute")),
    ("node not in the graph", changed(_SCHEDULE, step(2, node=77)), ("step 2", "node 77", "not in graph")),
    ("negative node", changed(_SCHEDULE, step(0, node=-1)), ("step 0", "node -1")),
    ("node as text", changed(_SCHEDULE, step(1, node="2")), ("step 1", "'node'", "'2'")),
    ("node as boolean", changed(_SCHEDULE, step(1, node=True)), ("step 1", "'node'")),
    ("missing op", changed(_SCHEDULE, lambda d: d["steps"][2].pop("op")), ("step 2", "'op'", "missing")),
    ("missing node", changed(_SCHEDULE, lambda d: d["steps"][0].pop("node")), ("step 0", "'node'", "missing")),
    ("unknown step field", changed(_SCHEDULE, step(1, when=3)), ("step 1", "unknown field 'when'")),
    ("step is not an object", changed(_SCHEDULE, lambda d: d["steps"].__setitem__(1, 5)), ("step 1",)),
    ("unknown implementation", changed(_SCHEDULE, step(0, impl="fastest")), ("step 0", "no implementation 'fastest'", "lean")),
    ("implementation on a free", changed(_SCHEDULE, lambda d: d["steps"].append({"op": "free", "node": 2, "impl": "lean"})),
     ("step 3", "impl")),
    ("steps is not a list", changed(_SCHEDULE, lambda d: d.update(steps={"op": "compute"})), ("'steps'", "list")),
    ("steps missing", changed(_SCHEDULE, lambda d: d.pop("steps")), ("'steps'", "missing")),
    ("wrong format tag", changed(_SCHEDULE, lambda d: d.update(format="coop.schedule/9")), ("coop.schedule/1",)),
    ("no format tag", changed(_SCHEDULE, lambda d: d.pop("format")), ("no 'format'",)),
    ("budget as text", changed(_SCHEDULE, lambda d: d.update(budget="lots")), ("'budget'", "'lots'")),
    ("negative budget", changed(_SCHEDULE, lambda d: d.update(budget=-3)), ("'budget'", "-3")),
    ("graph is not an object", changed(_SCHEDULE, lambda d: d.update(graph=[1])), ("'graph'",)),
    ("predicted peak as text", changed(_SCHEDULE, lambda d: d.update(predicted={"peak": "x"})), ("'predicted.peak'",)),
    ("truncated schedule", json.dumps(_SCHEDULE)[:50], ("not JSON",)),
    ("binary schedule", b"\x89PNG\r\n\x1a\n", ("not UTF-8",)),
    ("schedule is a list", [_SCHEDULE], ("not a coop schedule", "JSON list")),
]


@pytest.mark.parametrize(("case", "content", "fragments"), SCHEDULE_CASES, ids=[c[0] for c in SCHEDULE_CASES])
@pytest.mark.parametrize("command", ["validate", "plot"])
def test_malformed_schedule_is_one_line_naming_the_step(case: str, content: Any, fragments: tuple[str, ...],
                                                        command: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    graph = write(tmp_path / "graph.json", _COOP)
    schedule = write(tmp_path / "schedule.json", content)
    argv: list[Any] = [command, graph, schedule] + (["-o", tmp_path / "plot.png"] if command == "plot" else [])
    status, _, err = run(argv, capsys)
    line = the_error_line(err)
    assert status == 2, line
    for fragment in fragments:
        assert fragment in line, f"{case}: {fragment!r} not in {line!r}"
    assert not (tmp_path / "plot.png").exists()


def test_the_valid_schedule_validates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The schedule the cases above corrupt is legal: each case fails for its corruption alone."""
    graph = write(tmp_path / "graph.json", _COOP)
    status, out, err = run(["validate", graph, write(tmp_path / "s.json", _SCHEDULE), "--json"], capsys)
    assert status == 0, err
    assert json.loads(out)["peak"] == 28  # hand-counted: x 4 + a 8 + b 8 + c 8 at c's step


def test_illegal_order_of_legal_steps_is_a_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 1 (not 2) when the file is well-formed but the schedule breaks the memory semantics."""
    graph = write(tmp_path / "graph.json", _COOP)
    swapped = changed(_SCHEDULE, lambda d: d["steps"].reverse())
    status, _, err = run(["validate", graph, write(tmp_path / "s.json", swapped)], capsys)
    line = the_error_line(err)
    assert status == 1 and "invalid schedule" in line and "step 0" in line


# ---------------------------------------------------------------------------- budgets
@pytest.mark.parametrize(("spec", "fragment"), [
    ("lots", "'lots' is not understood"), ("", "'' is not understood"), ("-5", "'-5' must be positive"),
    ("-5MB", "'-5MB' must be positive"), ("0", "must be positive"), ("0%", "positive fraction"),
    ("nan", "not understood"), ("inf", "not understood"), ("5 MBB", "unknown unit 'MBB'"), ("12 Gigs", "unknown unit"),
    ("1e400MB", "larger than coop accepts"), ("1e5", "a fraction above 1"), ("150%", "at most 1.0 (100%)"),
])
@pytest.mark.parametrize("command", ["solve", "simulate", "compare", "validate"])
def test_bad_budget_is_one_line(spec: str, fragment: str, command: str, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    graph = write(tmp_path / "graph.json", _COOP)
    argv: list[Any] = {
        "solve": ["solve", graph, "-b", spec, "-f", "store-all"],
        "simulate": ["simulate", graph, "-p", "dtr", "-b", spec],
        "compare": ["compare", graph, "--budgets", f"90%,{spec}" if spec else " ", "--formulations", "store-all",
                    "--policies", "dtr"],
        "validate": ["validate", graph, write(tmp_path / "s.json", _SCHEDULE), "-b", spec],
    }[command]
    status, _, err = run(argv, capsys)
    line = the_error_line(err)
    assert status == 2, line
    assert fragment in line or (command == "compare" and not spec and "--budgets is empty" in line), line


def test_budget_fractions_above_one_are_refused_and_tiny_ones_are_sizes() -> None:
    graph = Graph.model_validate(coop_graph_doc())
    assert parse_budget("100%", graph, check=False) == 28  # the hand-counted peak: a fraction is at most 1.0
    for spec in ("150%", 1.5, "2.0"):
        with pytest.raises(BudgetError, match=r"fraction above 1: fractions are of the baseline peak, at most 1\.0"):
            parse_budget(spec, graph, check=False)
    assert parse_budget(42, graph, check=False) == 42  # above the peak in graph units (bytes): no error
    assert parse_budget(1e-12, graph, check=False) == 1  # rounded up, never to 0
    with pytest.raises(BudgetError, match="below min_budget"):
        parse_budget(1e-12, graph)


# ---------------------------------------------------------------------------- sweep configs
CONFIG_CASES: list[tuple[str, str, tuple[str, ...]]] = [
    ("bad TOML", "budgets = [\n", ("not valid TOML",)),
    ("unknown key", 'budgets = ["90%"]\nbudget = 3\n[[graphs]]\npath = "g.json"\n', ("budget", "unknown field")),
    ("wrong type", 'budgets = ["90%"]\ntime_limit = "10"\n[[graphs]]\npath = "g.json"\n', ("time_limit", "'10'")),
    ("bad budget", 'budgets = ["lots"]\n[[graphs]]\npath = "g.json"\n', ("budgets", "'lots'")),
    ("boolean budget", 'budgets = [true]\n[[graphs]]\npath = "g.json"\n', ("budgets.0",)),
    ("missing graphs", 'budgets = ["90%"]\n', ("graphs", "required")),
    ("two sources", 'budgets = ["90%"]\n[[graphs]]\npath = "g.json"\nzoo = "mlp"\n', ("graphs.0", "exactly one")),
    ("negative size", 'budgets = ["90%"]\n[[graphs]]\nzoo = "mlp"\nsize = {layers = -1}\n', ("graphs.0.size.layers",)),
    ("unknown policy", 'budgets = ["90%"]\npolicies = ["lru"]\n[[graphs]]\npath = "g.json"\n', ("unknown policy 'lru'",)),
    ("missing graph file", 'budgets = ["90%"]\n[[graphs]]\npath = "nope.json"\n', ("nope.json", "does not exist")),
]


@pytest.mark.parametrize(("case", "text", "fragments"), CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_bad_config_is_one_line(case: str, text: str, fragments: tuple[str, ...], tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "g.json", _COOP)
    config = write(tmp_path / "sweep.toml", text)
    status, _, err = run(["compare", "--config", config, "-o", tmp_path / "out"], capsys)
    line = the_error_line(err)
    assert status == 2, line
    for fragment in fragments:
        assert fragment in line, f"{case}: {fragment!r} not in {line!r}"


def test_unreadable_configs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for path, fragment in ((tmp_path / "missing.toml", "cannot read"), (tmp_path, "directory"),
                           (write(tmp_path / "bin.toml", b"\xff\x00"), "not UTF-8")):
        status, _, err = run(["compare", "--config", path], capsys)
        assert status == 2 and fragment in the_error_line(err)


# ---------------------------------------------------------------------------- other bad arguments
def test_unknown_policy_is_bad_input_not_a_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(["simulate", write(tmp_path / "g.json", _COOP), "-p", "lru", "-b", "50%"], capsys)
    assert status == 2 and "unknown eviction policy 'lru'" in the_error_line(err)


# ---------------------------------------------------------------------------- end to end, in a process
@pytest.mark.parametrize(("case", "content"), [
    ("dangling link", {"nodes": [{"id": 0, "name": "a", "cost_cpu": 1, "cost_ram": 2}], "links": [{"source": 0, "target": 5}]}),
    ("binary", b"\xff\xd8\xff\xe0"),
])
def test_console_script_prints_one_line(case: str, content: Any, tmp_path: Path) -> None:
    """The issue's own example, end to end: no traceback reaches stderr, exit 2, the link is named."""
    path = write(tmp_path / "g.json", content)
    for argv in (["info", str(path)], ["solve", str(path), "-b", "100%", "-f", "store-all"]):
        done = subprocess.run([sys.executable, "-m", "coop", *argv], capture_output=True, text=True, cwd=REPO,
                              timeout=120, check=False)
        assert done.returncode == 2, done.stderr
        line = the_error_line(done.stderr)
        assert ("target 5" in line) if case == "dangling link" else ("not UTF-8" in line)


@pytest.mark.parametrize(("argv", "fragment"), [
    (["solve", "{graph}", "-b", "100%", "-f", "store-all", "--time-limit", "-1"], "--time-limit -1.0"),
    (["solve", "{graph}", "-b", "100%", "-f", "checkmate", "--time-limit", "nan"], "--time-limit nan"),
    (["solve", "{graph}", "-b", "100%", "-f", "moccasin", "--threads", "0"], "--threads"),
    (["compare", "{graph}", "--budgets", "90%", "--time-limit", "0"], "--time-limit 0.0"),
    (["solve", "{graph}", "-b", "100%", "-f", "magic"], "unknown formulation 'magic'"),
    (["capture", "--model", "mlp", "--layers", "-2", "-o", "{graph}.out"], "--layers"),
])
def test_bad_solver_arguments_are_usage_errors(argv: list[str], fragment: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    graph = write(tmp_path / "graph.json", _COOP)
    status, _, err = run([a.replace("{graph}", str(graph)) for a in argv], capsys)
    line = the_error_line(err)
    assert status == 2 and fragment in line, line
