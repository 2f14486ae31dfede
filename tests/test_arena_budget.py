"""Issue 22: a plan holds every storage of a step within its budget, by an independent meter: the arena replay
(``coop.plan(..., arena=True)``) and the ordinary replay alike, on CPU kernels' internal scratch included.

Oracles: :mod:`tests.independent_meter` (the CPU allocator's own allocation and free events through
``torch.profiler``, plus the storages that exist before the step: parameters, buffers, batch, and from the
second step on the plan's arena buffer; nothing of coop's accounting) and eager PyTorch (a deep copy of the
model trained side by side with AdamW: loss and every gradient ``torch.equal`` after each step).

The budget is 0.6 of each model's baseline peak. The sizes are the smallest at which a step's activations
outweigh what no schedule can shrink at 0.6 (the parameters and gradients, oneDNN's convolution scratch; on
a smaller model 0.6 is below ``min_budget`` or leaves no room for the scratch, and the plan refuses in one
line, as :func:`test_an_arena_budget_nothing_meets_is_refused_with_its_footprint_itemised` checks).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

import coop
from coop.budget import parse_budget
from coop.errors import InfeasibleError, LastResortWarning
from coop.runtime.meter import MemoryMeter
from coop.zoo import ZOO_NAMES, build
from tests.eager_oracle import assert_step_equals_eager
from tests.held_sizes import FRACTION, SIZES
from tests.independent_meter import HeldBytes, storage_bytes

#: The DistilBERT of issue 22 (4 layers, dim 256, b16 s128) and a small one that overflowed the same way.
DISTILBERT = {"layers": 4, "dim": 256, "hidden": 1024, "batch": 16, "seq": 128, "vocab": 30522}
SMALL_DISTILBERT = {"layers": 2, "dim": 64, "hidden": 256, "batch": 8, "seq": 32, "vocab": 2000}


@pytest.fixture(autouse=True)
def two_threads() -> Iterator[None]:
    """The plan measures what a step allocates beside its arenas at the thread count it runs with (oneDNN's scratch
    depends on it a little): plan and steps share one setting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------ the meter itself
def test_meter_counts_hand_counted_bytes() -> None:
    before = torch.empty(1000)  # 4,000 bytes held when the block starts, named twice (one storage)
    with HeldBytes(held=[before, before[:10]]) as meter:
        a = torch.empty(1000)  # 4,000
        b = torch.empty(2500)  # 10,000: 14,000 held, the block's peak
        del a
        c = torch.empty(100)  # 400: 10,400
        del b, c
        d = torch.empty(3000, dtype=torch.float64)  # 24,000: a new peak, kept past the block
    assert meter.held_bytes == 4000
    assert meter.allocations == [4000, 10000, 400, 24000]
    assert meter.block_peak_bytes == 24000 and meter.peak_bytes == 28000
    assert storage_bytes([d, d[1:], before]) == 28000


def test_meter_sees_a_kernels_internal_scratch_that_coops_meter_cannot() -> None:
    """oneDNN's convolution computes into a blocked-layout buffer and reorders it into the output: allocations
    made inside the kernel, below the dispatcher, which only the allocator's own events show (torch 2.13 CPU)."""
    image, weight = torch.randn(4, 3, 16, 16), torch.randn(8, 3, 3, 3)
    with HeldBytes() as meter, MemoryMeter(use_cuda=False) as coops:
        out = torch.nn.functional.conv2d(image, weight, padding=1)
    output = out.untyped_storage().nbytes()
    assert coops.peak_bytes == output
    assert meter.block_peak_bytes > output and output in meter.allocations
    assert sum(meter.allocations) > output


# ------------------------------------------------------------------ the arena plans
def _distilbert(layers: int, dim: int, hidden: int, batch: int, seq: int, vocab: int) -> tuple:
    """DistilBERT for sequence classification from a config (no download), a token batch and its labels."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    torch.manual_seed(0)
    config = DistilBertConfig(n_layers=layers, dim=dim, hidden_dim=hidden, n_heads=4, vocab_size=vocab,
                              max_position_embeddings=max(seq, 32), num_labels=2)
    model = DistilBertForSequenceClassification(config).train()
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (batch, seq), generator=generator)
    labels = torch.randint(0, 2, (batch,), generator=generator)

    def loss_fn(net: nn.Module, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return net(input_ids=tokens, labels=labels).loss

    return model, (tokens, labels), loss_fn


def _assert_within_budget_and_eager(model: nn.Module, batch: tuple, loss_fn: Callable | None,
                                    time_limit: float, arena: bool = True, profile: bool = False) -> None:
    """Plan at FRACTION (with ``arena``, ``profile``); two AdamW steps metered (an arena plan's first step allocates
    its arena), each step's held peak within the budget and its loss and gradients equal to eager PyTorch's."""
    eager = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a plan whose measured step overflows its budget warns
        # a schedule no solver had time to search is still a schedule within the budget: what this test checks
        warnings.simplefilter("ignore", LastResortWarning)
        plan = coop.plan(model, FRACTION, batch, loss_fn=loss_fn, arena=arena, time_limit=time_limit, profile=profile)
    # of the graph the fraction was read on: the profiled capture, or (a re-solved plan holds a graph with the
    # measured scratch) the plain one
    budget = parse_budget(FRACTION, plan.captured.graph if profile else coop.capture(model, batch, loss_fn).graph)
    program = plan.executor.arena_program
    assert plan.budget == budget, plan.note
    if arena:
        assert plan.arena_footprint <= budget and "arena footprint" in plan.summary()["note"], plan.note
    else:
        assert plan.step_footprint <= budget and "held" in plan.summary()["note"], plan.note
    optimizer, eager_optimizer = torch.optim.AdamW(model.parameters()), torch.optim.AdamW(eager.parameters())
    for step in range(2):
        buffers = [*program.buffers.values()] if arena else []
        held = [*model.parameters(), *model.buffers(), *batch, *plan.captured.constants(), *buffers]
        torch.manual_seed(step)
        with HeldBytes(held) as meter:
            loss = plan.step(*batch)
        assert meter.peak_bytes <= budget, (step, meter.peak_bytes, budget, plan.note)
        if arena and step == 0:  # the first step allocates the buffer; the second finds it
            assert program.total_buffer_bytes in meter.allocations and meter.held_bytes < program.total_buffer_bytes
        elif arena:
            assert program.total_buffer_bytes not in meter.allocations
        torch.manual_seed(step)
        eager_loss = loss_fn(eager, *batch) if loss_fn is not None else eager(*batch)
        eager_loss.backward()
        assert_step_equals_eager(loss, eager_loss, model, eager, step)
        optimizer.step(), eager_optimizer.step()
        optimizer.zero_grad(), eager_optimizer.zero_grad()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), eager.parameters(), strict=True))


#: MobileNet's and the ResNet's plans (60-86 s and 27-77 s each on 2 cores: their smallest sizes that outweigh the
#: scratch at 0.6, SIZES), the ViT's and Llama's (7-12 s each) run in the slow tier (`make test-all`), with the other
#: zoo models but two per plan (tests/conftest.py SLOW_SIBLINGS): the fast tier keeps, through the same plans, meter
#: and eager oracle, the CNN (convolutions with oneDNN's scratch, batch norm) and one attention model (the zoo
#: transformer or GPT-2: attention, layer norm, embeddings) for each plan
SLOW_ZOO = ("mobilenet", "resnet", "vit", "llama")
ZOO = [pytest.param(name, marks=pytest.mark.slow) if name in SLOW_ZOO else name for name in ZOO_NAMES]


@pytest.mark.parametrize("name", ZOO)
def test_every_zoo_arena_plan_holds_within_its_budget(name: str) -> None:
    size, time_limit = SIZES[name]
    _assert_within_budget_and_eager(*build(name, **size), time_limit)


@pytest.mark.parametrize("name", ZOO)
def test_every_zoo_ordinary_plan_captured_with_profile_holds_within_its_budget(name: str) -> None:
    """The ordinary replay of a profiled capture: each node's scratch is measured (coop.graph_capture.cost
    measure_workspace) and the schedule counts it. Without it the independent meter read 1.097x the budget on
    the CNN, 1.016x on GPT-2 and 1.008x on the ResNet (oneDNN's scratch, counted nowhere)."""
    size, time_limit = SIZES[name]
    _assert_within_budget_and_eager(*build(name, **size), time_limit, arena=False, profile=True)


@pytest.mark.parametrize("name", ZOO)
def test_every_zoo_ordinary_plan_holds_within_its_budget_without_profiling(name: str) -> None:
    """Without profiling the graph knows no kernel's scratch; the plan measures its step on the example batch and,
    where it holds more than the budget, re-solves with each op's scratch measured on its own replay (no eager
    step) as workspace. Before: the CNN held 1.097x, the MobileNet 1.027x and the ResNet 1.006x the budget."""
    size, time_limit = SIZES[name]
    _assert_within_budget_and_eager(*build(name, **size), time_limit, arena=False)


def test_an_ordinary_plan_whose_step_still_holds_more_than_its_budget_warns_with_the_fix() -> None:
    """The zoo CNN at its default size at 0.75 of its baseline peak: oneDNN's scratch outweighs its activations, so
    no schedule of the graph with the measured scratch fits; the plan keeps its schedule, says what it holds and
    warns."""
    model, batch, loss_fn = build("cnn")
    budget = parse_budget(0.75, coop.capture(model, batch, loss_fn).graph)
    with pytest.warns(UserWarning, match=r"above the budget .*profile=True") as caught:
        plan = coop.plan(model, budget, batch, loss_fn=loss_fn, time_limit=1)
    overflow = [w for w in caught if not issubclass(w.category, LastResortWarning)]  # not "no time to search"
    assert len(overflow) == 1 and "\n" not in str(overflow[0].message)
    held = [*model.parameters(), *model.buffers(), *batch, *plan.captured.constants()]
    with HeldBytes(held) as meter:
        plan.step(*batch)
    assert plan.predicted_peak <= budget < meter.peak_bytes == plan.summary()["step_footprint"], plan.note


def test_small_distilbert_arena_plan_holds_within_its_budget() -> None:
    _assert_within_budget_and_eager(*_distilbert(**SMALL_DISTILBERT), 1)


@pytest.mark.slow
def test_issue_distilbert_arena_plan_holds_within_its_budget() -> None:
    """The issue's model: 4 layers, dim 256, b16 s128 (on HEAD it held 1.380x its budget at 0.6)."""
    _assert_within_budget_and_eager(*_distilbert(**DISTILBERT), 20)


def test_an_arena_budget_nothing_meets_is_refused_with_its_footprint_itemised() -> None:
    """The zoo CNN at its default size: 0.6 leaves no room beside oneDNN's convolution scratch (measured), so no
    live-bytes budget down to min_budget gives a footprint within it."""
    model, batch, loss_fn = build("cnn")
    with pytest.raises(InfeasibleError) as error:  # the baselines: no solver time in the rounds
        coop.plan(model, FRACTION, batch, loss_fn=loss_fn, arena=True, formulation="checkpoint-all")
    message = str(error.value)
    assert "\n" not in message and "caller-owned" in message and "allocated beside them" in message
    assert "measured on the example batch" in message
