"""Per-layer checkpointing (coop.formulations.blocks.per_layer): torch.utils.checkpoint around each repeated layer.

Oracles: a three-layer chain built by hand, whose kept values, compute order, recompute cost and peak are counted
by hand below; and a captured GPT-2 of three layers (random weights, dropout off), checked against what
torch.utils.checkpoint itself does to the same model (the matmuls its backward re-runs under Hugging Face's
``gradient_checkpointing_enable``), its config (the layer input's bytes) and a metered replay of the schedule.
"""

from __future__ import annotations

import collections
import json
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from coop import capture
from coop.budget import baseline_peak
from coop.cli import main
from coop.errors import CoopError
from coop.formulations import solve
from coop.formulations.blocks.per_layer import per_layer_checkpoint
from coop.graph import Graph, Node
from coop.runtime.executor import Executor
from coop.runtime.meter import MemoryMeter
from coop.schedule import validate

# ---------------------------------------------------------------------------- a chain of three layers by hand
X, E, LOSS, GRAD_LOSS = 0, 1, 11, 12


def layer_ids(b: int) -> tuple[int, int, int]:
    """(a, c, h) of layer b: a = f(h_prev), c = g(a), h = h_prev + c (the residual stream out)."""
    return 2 + 3 * b, 3 + 3 * b, 4 + 3 * b


def gradient_ids(b: int) -> tuple[int, int, int]:
    """(dc, da, g) of layer b's backward, which runs layers 2, 1, 0."""
    first = 13 + 3 * (2 - b)
    return first, first + 1, first + 2


def three_layers() -> Graph:
    """x (input, 4 B) -> e (10 B, cost 1) -> three layers (a 20 B cost 2, c 30 B cost 3, h 10 B cost 1) -> loss
    (1 B) -> gl (reads loss and h2) -> per layer, from the last: dc (reads the incoming gradient and c), da (dc,
    a), g (da, the incoming gradient); every backward value 2 B, cost 1. Outputs: the loss and layer 0's g."""
    nodes = [{"id": X, "name": "x", "kind": "input", "mem": 4, "cost": 0, "recomputable": False},
             {"id": E, "name": "e", "op": "embed", "inputs": [X], "mem": 10, "cost": 1}]
    stream = E
    for b in range(3):
        a, c, h = layer_ids(b)
        nodes += [{"id": a, "name": f"a{b}", "op": "f", "inputs": [stream], "mem": 20, "cost": 2},
                  {"id": c, "name": f"c{b}", "op": "g", "inputs": [a], "mem": 30, "cost": 3},
                  {"id": h, "name": f"h{b}", "op": "add", "inputs": [stream, c], "mem": 10, "cost": 1}]
        stream = h
    nodes += [{"id": LOSS, "name": "loss", "op": "loss", "inputs": [stream], "mem": 1, "cost": 1},
              {"id": GRAD_LOSS, "name": "gl", "kind": "backward", "inputs": [LOSS, stream], "mem": 2, "cost": 1}]
    incoming = GRAD_LOSS
    for b in (2, 1, 0):
        a, c, _ = layer_ids(b)
        dc, da, g = gradient_ids(b)
        nodes += [{"id": dc, "name": f"dc{b}", "kind": "backward", "inputs": [incoming, c], "mem": 2, "cost": 1},
                  {"id": da, "name": f"da{b}", "kind": "backward", "inputs": [dc, a], "mem": 2, "cost": 1},
                  {"id": g, "name": f"g{b}", "kind": "backward", "inputs": [da, incoming], "mem": 2, "cost": 1}]
        incoming = g
    return Graph.model_validate({"name": "three_layers", "nodes": nodes, "outputs": [LOSS, gradient_ids(0)[2]]})


#: Hand-counted peak: computing c2 in the forward holds x 4, e 10, h0 10, h1 10 (the layers' inputs), a2 20 and
#: the new c2 30 = 84 (a and c of layers 0 and 1 were freed in the forward). The backward's highest step is dc2:
#: x, e, h0, loss 1, gl 2, the recomputed a2 and c2, and dc2 2 = 79 (h1 went after a2's recompute, h2 after gl).
HAND_PEAK = 84


def test_the_kept_values_are_the_layer_inputs_and_what_outside_the_layers_needs() -> None:
    graph = three_layers()
    result = per_layer_checkpoint(graph, 10**6)
    h0, h1, h2 = (layer_ids(b)[2] for b in range(3))
    assert result.extra["checkpoints"] == [E, h0, h1]  # what checkpoint(layer_b, hidden) saves
    assert result.extra["layers"] == 3 and result.extra["groups"] == [(3, 3)]
    resident: set[int] = set()  # after the forward, by walking the schedule's own steps
    for step in result.schedule.steps:
        if step.node == GRAD_LOSS:
            break
        (resident.add if step.op == "compute" else resident.discard)(step.node)
    assert resident == {E, h0, h1, h2, LOSS}  # h2: the last layer's output, which the loss's backward reads


def test_each_layer_is_rerun_once_right_before_its_backward() -> None:
    graph = three_layers()
    result = per_layer_checkpoint(graph, 10**6)
    computes = [s.node for s in result.schedule.steps if s.op == "compute"]
    backward: list[int] = [GRAD_LOSS]
    for b in (2, 1, 0):
        a, c, _ = layer_ids(b)
        backward += [a, c, *gradient_ids(b)]
    assert computes == list(range(E, LOSS + 1)) + backward
    # each layer's a and c recomputed once; h, the next layer's kept input, is not: 3 x (2 + 3) = 15
    simulation = result.simulation
    assert simulation.recomputations == 6
    assert simulation.cost - simulation.baseline_cost == pytest.approx(15.0)
    assert result.objective == pytest.approx(simulation.baseline_cost + 15.0)


def test_the_peak_is_the_hand_counted_one_and_validates() -> None:
    graph = three_layers()
    result = per_layer_checkpoint(graph, HAND_PEAK)
    assert result.status == "heuristic" and result.message == ""
    assert result.extra["fits"] and result.simulation.peak == result.extra["peak"] == HAND_PEAK
    check = validate(graph, result.schedule, HAND_PEAK)
    assert check.ok and check.peak == HAND_PEAK
    assert HAND_PEAK < baseline_peak(graph)


def test_a_budget_below_its_peak_returns_the_schedule_and_says_it_does_not_fit() -> None:
    graph = three_layers()
    result = solve(graph, HAND_PEAK - 1, "per-layer")
    assert result.status == "heuristic" and result.schedule is not None
    assert result.extra["fits"] is False
    assert result.message == (f"per-layer: peak {HAND_PEAK} exceeds the budget {HAND_PEAK - 1}; the schedule does "
                              "not fit (extra['fits'] is False)")
    assert not validate(graph, result.schedule, HAND_PEAK - 1).ok


def test_the_registry_runs_it_with_the_common_options() -> None:
    """The options contract's own test runs on a chain without repeated layers, so it skips per-layer."""
    graph = three_layers()
    result = solve(graph, 10**6, "per-layer", time_limit=5, threads=1, progress=None, hint=None, captured=None)
    assert result.formulation == "per-layer" and validate(graph, result.schedule, 10**6).ok
    with pytest.raises(CoopError, match="has no option 'grid_size'"):
        solve(graph, 10**6, "per-layer", grid_size=4)


def test_a_graph_without_repeated_layers_is_refused_in_one_line() -> None:
    nodes = [{"id": 0, "name": "x", "kind": "input", "mem": 1, "cost": 0, "recomputable": False}]
    nodes += [{"id": i, "name": f"f{i}", "inputs": [i - 1], "mem": i, "cost": 1} for i in range(1, 12)]
    nodes.append({"id": 12, "name": "g", "kind": "backward", "inputs": [11, 5], "mem": 1, "cost": 1})
    graph = Graph.model_validate({"name": "distinct", "nodes": nodes, "outputs": [12]})
    with pytest.raises(CoopError) as caught:
        per_layer_checkpoint(graph, 10**6)
    assert str(caught.value) == ("per-layer checkpointing found no repeated layers in graph 'distinct': use "
                                 "chen-sqrt or chen-greedy")


def test_coop_solve_takes_per_layer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph_file, out_file = tmp_path / "three.json", tmp_path / "schedule.json"
    three_layers().save(graph_file)
    status = main(["solve", str(graph_file), "--budget", str(HAND_PEAK), "-f", "per-layer", "-o", str(out_file),
                   "--json"])
    capsys.readouterr()
    assert status == 0
    written = json.loads(out_file.read_text())
    assert written["formulation"] == "per-layer" and written["predicted"]["peak"] == HAND_PEAK
    assert written["solver"]["status"] == "heuristic"


# ---------------------------------------------------------------------------- a captured GPT-2
BATCH, SEQ, HIDDEN, LAYERS = 2, 32, 64, 3
#: The ops that compute (not views): those whose re-runs torch's checkpoint and the schedule are compared on.
COMPUTING_OPS = ("addmm", "add", "mul", "pow", "tanh", "native_layer_norm", "_scaled_dot_product_flash_attention_for_cpu")


def gpt2() -> torch.nn.Module:
    """GPT-2 of three layers with random weights, no dropout and no key/value cache (gradient checkpointing turns
    the cache off, so both runs compute the same ops)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=LAYERS, n_embd=HIDDEN, n_head=4, vocab_size=128, n_positions=SEQ, use_cache=False,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config).train()


def language_model_loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    return model(input_ids=tokens, labels=tokens).loss


class CountOps(TorchDispatchMode):
    """Counts the aten ops run under it by name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def ops_rerun_by_torch_checkpoint(tokens: torch.Tensor) -> collections.Counter[str]:
    """The ops the backward runs with Hugging Face's gradient checkpointing beyond those it runs without."""
    counts = []
    for checkpointed in (False, True):
        model = gpt2()
        if checkpointed:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # renamed activation_checkpointing_enable in v5
                model.gradient_checkpointing_enable()  # Transformers 5: non-reentrant torch.utils.checkpoint
        loss = language_model_loss(model, tokens)
        with CountOps() as counter:
            loss.backward()
        counts.append(counter.counts)
    return counts[1] - counts[0]


def op_name(node: Node) -> str:
    """``aten.addmm.default`` -> ``addmm``, as the dispatcher names the op."""
    return node.op.split(".")[1] if node.op.startswith("aten.") else node.op


@pytest.fixture(scope="module")
def captured_gpt2():
    """The model, a batch, its capture and the schedule on the graph with random draws replayable (the graph the
    executor and compare plan on; nothing is random here, but the fused attention is tagged as seeded)."""
    model = gpt2()
    tokens = torch.randint(0, 128, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    captured = capture(model, (tokens,), language_model_loss)
    graph = captured.graph.with_random_replay()
    return model, tokens, captured, graph, solve(graph, baseline_peak(graph), "per-layer")


def layer_norms(graph: Graph) -> list[int]:
    """The forward's layer norms in order: ln_1 and ln_2 of each layer, then ln_f."""
    norms = [v for v in graph.order if graph.node(v).op == "aten.native_layer_norm.default"]
    assert len(norms) == 2 * LAYERS + 1
    return norms


def test_gpt2_keeps_each_layers_hidden_input_as_torch_checkpoint_saves(captured_gpt2) -> None:
    _, _, _, graph, result = captured_gpt2
    checkpoints = result.extra["checkpoints"]
    assert result.extra["layers"] == LAYERS
    # checkpoint(block, hidden_states, attention_mask, ...) holds the hidden states, batch x seq x hidden float32,
    # which ln_1 reads, and the causal mask the model builds once before the layers (batch x seq x seq bool)
    norms = layer_norms(graph)
    hidden = [graph.node(norms[2 * b]).inputs[0] for b in range(LAYERS)]
    assert all(graph.node(v).mem == BATCH * SEQ * HIDDEN * 4 for v in hidden)
    (mask,) = set(checkpoints) - set(hidden)
    assert checkpoints == [hidden[0], mask, *hidden[1:]]  # forward order: the mask is built after the embeddings
    assert graph.order.index(mask) < graph.order.index(norms[0]) and graph.node(mask).mem == BATCH * SEQ * SEQ
    assert sum(mask in graph.node(v).inputs for v in graph.order) == LAYERS  # read once by every layer
    # what else of the layers outlives the forward: the last layer's output (ln_f reads it) and the small extra
    # outputs of forward ops (layer norms' mean and rstd, attention's logsumexp), which the graph cannot recompute
    layers = set(graph.order[graph.order.index(norms[0]):graph.order.index(norms[-1])])
    resident: set[int] = set()
    for step in result.schedule.steps:
        if graph.node(step.node).kind == "backward" and graph.node(step.node).output_of is None:
            break
        (resident.add if step.op == "compute" else resident.discard)(step.node)
    others = (resident & layers) - set(checkpoints) - {graph.node(norms[-1]).inputs[0]}
    assert others and all(graph.node(v).output_of is not None for v in others)
    assert sum(graph.node(v).mem for v in others) < 0.15 * sum(graph.node(v).mem for v in checkpoints)
    assert validate(graph, result.schedule, result.simulation.peak).ok
    assert result.simulation.peak < baseline_peak(graph)


def test_gpt2_reruns_the_ops_torch_checkpoint_reruns(captured_gpt2) -> None:
    _, tokens, _, graph, result = captured_gpt2
    computes = collections.Counter(s.node for s in result.schedule.steps if s.op == "compute")
    assert max(computes.values()) == 2  # each layer re-run once, nothing twice
    rerun = collections.Counter(op_name(graph.node(v)) for v, times in computes.items() if times == 2)
    by_torch = ops_rerun_by_torch_checkpoint(tokens)
    # non-reentrant checkpoint stops the re-run at the last value the backward saved: per layer c_attn,
    # attn.c_proj and mlp.c_fc again, not mlp.c_proj nor the last residual add, whose outputs no backward reads
    assert by_torch["addmm"] == 3 * LAYERS
    assert {op: rerun[op] for op in COMPUTING_OPS} == {op: by_torch[op] for op in COMPUTING_OPS}


def test_gpt2_recomputes_about_one_forward_of_the_layers(captured_gpt2) -> None:
    _, _, _, graph, result = captured_gpt2
    norms = layer_norms(graph)
    layers = [v for v in graph.order[graph.order.index(norms[0]):graph.order.index(norms[-1])]
              if graph.node(v).kind == "forward"]
    computes = collections.Counter(s.node for s in result.schedule.steps if s.op == "compute")
    not_rerun = [v for v in layers if computes[v] == 1]
    assert collections.Counter(op_name(graph.node(v)) for v in not_rerun) == {"addmm": LAYERS, "add": LAYERS}
    layers_cost = sum(graph.node(v).cost for v in layers)
    recomputed = result.simulation.cost - result.simulation.baseline_cost
    assert recomputed == pytest.approx(layers_cost - sum(graph.node(v).cost for v in not_rerun))
    assert 0.75 * layers_cost < recomputed < layers_cost  # mlp.c_proj is about 13 % of a layer


def test_gpt2_replays_bit_exactly_within_the_predicted_peak(captured_gpt2) -> None:
    model, tokens, captured, _, result = captured_gpt2
    executor = Executor(captured, result.schedule)
    flat = captured.flat_inputs(model, (tokens,))
    with MemoryMeter() as meter:
        meter.track(*flat, *captured.constants())
        outputs = executor.run_flat(flat)
    reference = captured.run(model, tokens)
    assert all(torch.equal(a, b) for a, b in zip(outputs, reference, strict=True))
    assert meter.peak_bytes == result.simulation.peak
