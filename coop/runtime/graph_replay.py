"""CUDA-graph replay of a static plan (issue 23, item 1): the replay captured once, replayed as one graph.

**Opt-in and not yet measured on a GPU.** ``coop.plan(..., cuda_graph=True)`` / :meth:`Plan.use_cuda_graph
<coop.planner.plan.Plan.use_cuda_graph>` turn it on; the default is the ordinary replay. A static plan is a
fixed sequence of kernels on fixed shapes, so :class:`GraphReplay` captures the executor's program
(:meth:`coop.runtime.executor.Executor.run_flat`'s program, the same ops in the same order) once into a CUDA
graph and replays the graph every step, without the host launching each kernel.

**The graph API is injectable** (:class:`GraphAPI`; :class:`TorchCudaGraphs` is torch.cuda's), as the copy
stream's (:mod:`coop.runtime.copy_stream`): this machine's tests run it on CPU tensors with a recording fake
that refuses what a real capture refuses (``tests/test_graph_replay.py``). The capture follows the torch
documentation on CUDA graphs: a few warm-up runs on a side stream, then ``torch.cuda.graph(g, pool=...)``,
with one private memory pool per graph (``torch.cuda.graph_pool_handle``).

**Static inputs.** A graph replays fixed addresses. The batch tensors are copied, every step, into buffers
allocated once with the batch's shapes and dtypes on its devices; the model's parameters and buffers are read
in place, so they must be the very tensors, at the very addresses, they were at capture. Where one is not
(``model.to()``, ``load_state_dict(..., assign=True)``, ``p.data = ...``), the step is captured again, with a
warning naming the tensor.

**Delivery of outputs.** The graph's output tensors live in its pool and are overwritten by every replay, so
nothing handed to the caller may alias them (:meth:`GraphReplay.run_flat`): the loss is a copy; a gradient is
a copy of its own where the parameter's ``.grad`` is None (the first micro-batch, or after
``zero_grad(set_to_none=True)``), and the graph's own output otherwise, which
:meth:`Captured.write_back <coop.graph_capture.captured.Captured.write_back>` (still the one write-back) only
reads, adding it into ``.grad``. A ``.grad`` the caller holds is therefore never a graph output and never
overwritten by a later replay; new buffer values are copied into the model's buffers by the write-back.

**Random ops.** PyTorch registers the default CUDA generator with a graph: during capture a draw reads its seed
and offset from device tensors and advances an offset inside the graph only; each ``replay()`` first writes the
generator's current seed and offset into those tensors and then advances the generator by the whole graph's
increment. A replay therefore draws exactly what the same kernels would draw eagerly from the generator's
current state, and leaves it where eager would. Two things would still break eager's numbers, and both are
handled here:

- the warm-up runs draw eagerly and advance the generator: :class:`GraphReplay` saves the state of every
  generator the program draws from before the warm-up and sets it back after the capture (legal outside
  capture), so the first replay draws what the first eager step draws;
- a schedule that recomputes a random op replays it from a saved generator state (:mod:`coop.runtime.rng`:
  read the state before the first draw, set it before the recomputation, set the later state back after it).
  Whether those host-side state calls mean inside a graph what they mean eagerly depends on the torch build:
  older ones refuse them during capture (``Cannot call CUDAGeneratorImpl::... during CUDA graph capture``);
  where they are accepted, a captured draw may still take its philox offset from the graph's own counter, so
  that a "recomputed" draw would draw new numbers and the replay would advance the generator past eager's.
  One run on a lent H100 (torch 2.11) found GPT-2's recomputed dropout equal to eager's. coop does not assume
  either: before capturing such a schedule it captures a probe graph (:func:`generator_states_in_graphs`:
  draw, set the saved state, draw again, set the later state back, draw once more) through the same
  :class:`GraphAPI` and the same state functions the replay program calls, replays it twice and compares it
  with the same program run eagerly: every draw and the generator's state after each replay. Where they
  agree the schedule is captured; where they do not (or the capture raises) it is refused before capture
  (:func:`capture_refusal`) and runs the ordinary replay, with the one fallback warning naming the op and
  what the probe found. The probe draws ``torch.rand`` on the step's device only (no kernel on made-up data)
  and leaves the generator as it found it. A graph-safe alternative, where the probe fails: a recomputation
  captured as the same kernel with its philox offset pinned to that of the first draw (a generator
  ``register_generator_state``'d with the graph and ``graphsafe_set_state`` at capture); not built.

**Fallback.** Where a capture is impossible (the API raises during capture: a CPU sync such as ``.item()`` or
``.cpu()``, a data-dependent shape such as ``nonzero``, a host value read) or refused before it (replayed
random draws where the probe failed; a schedule that pages, whose host copies and pinned host buffers are not yet proven inside a
graph), the step runs the ordinary replay and keeps running it, with ONE warning naming the op: the capture
runs the program through :class:`NodeTracker`, which records the fx node being run when capture failed. The
generator states saved before the warm-up are set back, so the fallback draws what eager draws.

What a GPU run must still check (benchmarks/bench_cuda.py, ``cuda-graph`` rows): bit-identical gradients and
loss against eager with dropout (the generator restore and the graph's philox offsets), the step time, and the
graph pool's reserved bytes against the prediction (the pool holds the program's values and its outputs; it
must obey the ordinary replay's reserved-bytes rule), and that the ordinary replay runs after a failed capture.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import fx

from coop.errors import CoopError, NeedsCudaError
from coop.graph import Graph
from coop.graph_capture.captured import batch_positions
from coop.graph_capture.trace import is_random
from coop.runtime.executor import Executor, recorded_program
from coop.runtime.program_builder import SOURCE_NODE, replayed_draws
from coop.runtime.rng import (
    RngState,
    output_device,
    restore_generator_state,
    save_generator_state,
    swap_generator_state,
)

#: Warm-up runs on a side stream before the capture (the torch documentation's "a few"; DDP needs 11, coop's
#: program has no autograd or reducer, so the docs' example count is kept).
WARMUP_RUNS = 3


class GraphAPI(Protocol):
    """What coop needs from CUDA graphs (torch.cuda's, or a test's recording fake)."""

    def new_graph(self) -> Any:
        """A fresh, empty graph (``torch.cuda.CUDAGraph()``)."""

    def new_pool(self) -> Any:
        """A fresh private memory pool for one graph (``torch.cuda.graph_pool_handle()``)."""

    def capture(self, graph: Any, program: Callable[[], list[Any]], pool: Any, device: torch.device,
                warmup: int) -> list[Any]:
        """Run ``program`` ``warmup`` times on a side stream of ``device``, then capture one run of it into
        ``graph`` with ``pool``; returns the outputs of the captured run (the tensors every replay overwrites).
        Raises whatever the capture raises (an op illegal during capture)."""

    def replay(self, graph: Any) -> None:
        """Replay ``graph``: every captured kernel again, on the tensors it captured."""


class TorchCudaGraphs:
    """The default :class:`GraphAPI`: ``torch.cuda.CUDAGraph`` and ``torch.cuda.graph``, as the torch docs use them."""

    def new_graph(self) -> Any:
        return torch.cuda.CUDAGraph()

    def new_pool(self) -> Any:
        return torch.cuda.graph_pool_handle()

    def capture(self, graph: Any, program: Callable[[], list[Any]], pool: Any, device: torch.device,
                warmup: int) -> list[Any]:
        with torch.cuda.device(device):
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    program()
            compute = torch.cuda.current_stream(device)
            compute.wait_stream(side)
            try:
                with torch.cuda.graph(graph, pool=pool):
                    outputs = program()
            finally:  # torch.cuda.graph's __exit__ skips restoring the stream where capture_end raises
                torch.cuda.set_stream(compute)
        return outputs

    def replay(self, graph: Any) -> None:
        graph.replay()


def require_cuda_graph(graph: Graph) -> torch.device:
    """The CUDA device a graph of this step replays on, or a one-line NeedsCudaError saying why there is none.

    Parameters
    ----------
    graph : Graph
        The step's graph; its values' devices are read.

    Returns
    -------
    torch.device
        The step's first CUDA device.

    Raises
    ------
    NeedsCudaError
        When no value of the step lives on CUDA (CUDA graphs replay CUDA kernels only), or torch sees no CUDA device.
    """
    cuda = [d for d in graph.devices if d is not None and torch.device(d).type == "cuda"]
    if not cuda:
        where = ", ".join(d for d in graph.devices if d is not None) or "no device"
        raise NeedsCudaError(f"cuda_graph=True replays CUDA kernels only, and this step runs on {where}; drop cuda_graph "
                        "(or move the model and batch to CUDA)")
    if not torch.cuda.is_available():
        raise NeedsCudaError("cuda_graph=True needs CUDA, and this torch sees no CUDA device; drop cuda_graph")
    return torch.device(cuda[0])


def capture_refusal(executor: Executor, draws_in_graphs: str | None = None) -> str:
    """Why ``executor``'s program cannot be captured as it is ('' when it can be tried), naming the op.

    Parameters
    ----------
    executor : Executor
        The ordinary replay to capture.
    draws_in_graphs : str or None
        What :func:`generator_states_in_graphs` found on the capturing API: '' where a draw replayed from a
        saved generator state inside a graph equals eager's, else why not; None where it was not probed (a
        schedule with replayed draws is then refused).

    Returns
    -------
    str
        '' where capture may be tried; otherwise the reason, naming the first random op the schedule recomputes
        from a saved generator state (where the probe failed or did not run), or the first value it pages to
        the host.
    """
    captured = executor.captured
    replayed = sorted(replayed_draws(executor.graph, executor.schedule))
    if replayed and draws_in_graphs != "":
        name = _op_of(executor, replayed[0])
        more = f" (and {len(replayed) - 1} more)" if len(replayed) > 1 else ""
        why = draws_in_graphs if draws_in_graphs is not None else "no probe of this torch's CUDA graphs ran"
        return (f"the schedule recomputes random op {name}{more} from a saved generator state, and a saved state "
                f"is not replayed inside this torch's CUDA graphs ({why})")
    paged = [s.node for s in executor.schedule.steps
             if s.op == "page_out" and not captured.graph.node(s.node).caller_owned]
    if paged:
        return (f"the schedule pages {_op_of(executor, paged[0])} to the host, and host copies into pinned buffers "
                "are not yet proven inside a CUDA graph")
    return ""


#: Elements of each probe draw (:func:`generator_states_in_graphs`): several philox rounds, still one tiny kernel.
PROBE_DRAW = 1024


def generator_states_in_graphs(api: GraphAPI, device: torch.device) -> str:
    """Whether a draw replayed from a saved generator state inside a captured graph draws what eager draws.

    Captures, through ``api``, a probe program that calls the very state functions a replay program calls
    (:mod:`coop.runtime.rng`): save the state, draw, set the saved state, draw again (the "recomputation"),
    set the later state back, draw once more. The program is run eagerly from a fixed generator state, then
    captured, and the graph replayed twice from the same states; every draw and the generator's state after
    each replay must equal the eager run's. The generator is left as it was found.

    Parameters
    ----------
    api : GraphAPI
        The graph API the step will be captured with.
    device : torch.device
        The device whose default generator the step draws from.

    Returns
    -------
    str
        '' where the graph replays saved states as eager does; otherwise what differed (or what the capture raised).
    """
    user_state = RngState.save(device)

    def program() -> list[Any]:
        saved = save_generator_state(str(device))
        first = torch.rand(PROBE_DRAW, device=device)
        previous = swap_generator_state(saved)
        again = restore_generator_state(previous, saved, torch.rand(PROBE_DRAW, device=device))
        later = torch.rand(PROBE_DRAW, device=device)
        return [first, again, later]

    def eager_from(state: RngState) -> tuple[list[torch.Tensor], RngState]:
        swap_generator_state(state)
        outputs = [t.clone() for t in program()]
        return outputs, RngState.save(device)

    try:
        start = RngState.save(device)
        expected, after_one = eager_from(start)
        expected_two, after_two = eager_from(after_one)
        swap_generator_state(start)
        graph = api.new_graph()
        try:
            outputs = api.capture(graph, program, api.new_pool(), device, 1)
        except Exception as exc:  # noqa: BLE001 (a refused state call: the answer, named)
            return f"capturing a saved-state draw raised {type(exc).__name__}: {_first_line(exc)}"
        for want, state_after, label in ((expected, after_one, "first"), (expected_two, after_two, "second")):
            swap_generator_state(start if label == "first" else after_one)
            api.replay(graph)
            if not all(torch.equal(got, ref) for got, ref in zip(outputs, want, strict=True)):
                return f"a probe graph's {label} replay drew other numbers than the same program run eagerly"
            if not torch.equal(RngState.save(device).state, state_after.state):
                return f"a probe graph's {label} replay left the generator elsewhere than eager leaves it"
        return ""
    finally:
        swap_generator_state(user_state)


def _op_of(executor: Executor, node_id: int) -> str:
    """``name (aten.op)`` of Graph node ``node_id``'s storage-owning fx node."""
    names = executor.captured.fx_names.get(node_id) or [str(node_id)]
    by_name = {n.name: n for n in executor.captured.module.graph.nodes}
    node = by_name.get(names[0])
    return f"{names[0]} ({node.target})" if node is not None else names[0]


class NodeTracker(fx.Interpreter):
    """Runs a replay program node by node, remembering the node being run and the first error it raised.

    The capture runs the program through it (once: a graph's replays run no Python), so a capture that fails
    names the fx node whose op the capture refused.

    Parameters
    ----------
    module : fx.GraphModule
        The replay program.
    """

    def __init__(self, module: fx.GraphModule) -> None:
        super().__init__(module, garbage_collect_values=True)
        self.extra_traceback = False
        self.current: fx.Node | None = None
        self.failed: tuple[fx.Node, BaseException] | None = None

    def run_node(self, n: fx.Node) -> Any:
        self.current = n
        try:
            return super().run_node(n)
        except Exception as exc:
            if self.failed is None:
                self.failed = (n, exc)
            raise


class GraphReplay:
    """The replay of an :class:`Executor`'s program as one CUDA graph, captured at the first step.

    ``run_flat`` takes and returns what :meth:`Executor.run_flat` does (flat inputs in; loss, gradients, new
    buffer values out) and its outputs are delivered as eager's (the module docstring). ``fallback`` is why the
    step runs the ordinary replay instead (None while the graph replay is on); ``captures`` counts captures.

    Parameters
    ----------
    executor : Executor
        The ordinary replay to capture (no arena, no copy stream).
    api : GraphAPI or None
        The graph API; None: torch.cuda's (:class:`TorchCudaGraphs`), refused in one line for a step with no
        CUDA value (:func:`require_cuda_graph`). A given API decides its devices itself (a test's fake on CPU
        tensors standing for CUDA).
    warmup : int
        Warm-up runs before the capture.
    """

    def __init__(self, executor: Executor, api: GraphAPI | None = None, warmup: int = WARMUP_RUNS) -> None:
        if executor.arena_program is not None or executor.copy_stream is not None:
            raise CoopError("cuda_graph=True does not combine with an arena replay or a copy stream; drop one of them")
        self.device = require_cuda_graph(executor.graph) if api is None else _stand_in_device(executor)
        self.executor = executor
        self.api: GraphAPI = api if api is not None else TorchCudaGraphs()
        self.warmup = warmup
        self.fallback: str | None = None
        self.captures = 0
        self._refusal = capture_refusal(executor, draws_in_graphs="")  # paging; replayed draws: probed at capture
        self._replays_draws = bool(replayed_draws(executor.graph, executor.schedule))
        captured = executor.captured
        self._batch = batch_positions(captured.placeholders)
        self._owned = [i for i, (kind, _) in enumerate(captured.placeholders) if kind != "input"]
        position = {name: i for i, (kind, name) in enumerate(captured.placeholders) if kind == "param"}
        self._grad_params = [position[name] for name in captured.grad_names]
        self._random_devices = sorted({str(output_device(n)) for n in executor.module.graph.nodes if is_random(n)})
        self._graph: Any = None
        self._static: list[Any] = []
        self._addresses: list[tuple[Any, int]] = []
        self._outputs: list[Any] = []

    @property
    def status(self) -> str:
        """What the step runs: ``"captured"``, ``"not captured yet"`` or ``"fell back to the ordinary replay: ..."``."""
        if self.fallback is not None:
            return f"fell back to the ordinary replay: {self.fallback}"
        return "captured" if self._graph is not None else "not captured yet"

    def run_flat(self, flat_inputs: list[torch.Tensor]) -> list[Any]:
        """Run one step on flat inputs: [loss, *gradients, *new buffer values], none aliasing the graph's outputs
        where the caller keeps it (the loss; a gradient where its parameter's ``.grad`` is None).

        Parameters
        ----------
        flat_inputs : list of torch.Tensor
            The captured step's flat inputs (:meth:`Captured.flat_inputs`).

        Returns
        -------
        list
            The flat outputs, delivered as the module docstring says.
        """
        if self.fallback is not None:
            return self.executor.run_flat(flat_inputs)
        if (self._graph is None or self._moved(flat_inputs)) and not self._capture(flat_inputs):
            return self.executor.run_flat(flat_inputs)
        for position in self._batch:
            self._static[position].copy_(flat_inputs[position])
        self.api.replay(self._graph)
        return self._deliver(flat_inputs)

    # ---------------------------------------------------------------- capture
    def _moved(self, flat_inputs: list[Any]) -> bool:
        """Whether a parameter or buffer is no longer the tensor, at the address, it was at capture (warns once)."""
        for position, (tensor, address) in zip(self._owned, self._addresses, strict=True):
            value = flat_inputs[position]
            if value is not tensor or value.data_ptr() != address:
                _, name = self.executor.captured.placeholders[position]
                warnings.warn(f"cuda_graph: {name} is no longer the tensor the graph was captured on (moved by "
                              "model.to(), load_state_dict(assign=True) or a .data assignment); capturing the step "
                              "again", stacklevel=4)
                return True
        return False

    def _capture(self, flat_inputs: list[Any]) -> bool:
        """Capture the program on static inputs; False (with the one warning, ``fallback`` set) where it cannot."""
        saved = [RngState.save(device) for device in self._random_devices]  # the warm-up draws; set back after
        static = list(flat_inputs)
        for position in self._batch:
            static[position] = flat_inputs[position].clone()
        tracker = NodeTracker(self.executor.module)

        def program() -> list[Any]:
            with torch.no_grad(), recorded_program():
                return list(tracker.run(*static))

        graph = None
        try:
            refusal = self._refusal
            if not refusal and self._replays_draws:
                probed = [generator_states_in_graphs(self.api, torch.device(d)) for d in self._random_devices]
                refusal = capture_refusal(self.executor, draws_in_graphs=next((p for p in probed if p), ""))
            if refusal:
                raise _Refused(refusal)
            graph, pool = self.api.new_graph(), self.api.new_pool()
            outputs = self.api.capture(graph, program, pool, self.device, self.warmup)
        except _Refused as refused:
            self._fall_back(str(refused), saved)
            return False
        except Exception as exc:  # noqa: BLE001 (any error of the capture means: no graph; named in the warning)
            self._fall_back(_why_capture_failed(tracker, exc), saved)
            return False
        for state in saved:
            swap_generator_state(state)
        self._graph, self._static, self._outputs = graph, static, outputs
        self._addresses = [(flat_inputs[p], flat_inputs[p].data_ptr()) for p in self._owned]
        self.captures += 1
        return True

    def _fall_back(self, why: str, saved: list[RngState]) -> None:
        for state in saved:
            swap_generator_state(state)
        self.fallback = why
        self._graph = None
        self._static, self._outputs = [], []
        warnings.warn(f"cuda_graph: {why}; running the ordinary replay instead", stacklevel=5)

    # ---------------------------------------------------------------- delivery
    def _deliver(self, flat_inputs: list[Any]) -> list[Any]:
        """The graph's outputs as the write-back may keep them: the loss and each first ``.grad`` as copies."""
        outputs = list(self._outputs)
        loss = outputs[0]
        outputs[0] = loss.clone() if isinstance(loss, torch.Tensor) else loss
        for index, position in enumerate(self._grad_params, start=1):
            grad = outputs[index]
            if isinstance(grad, torch.Tensor) and flat_inputs[position].grad is None:
                outputs[index] = grad.clone()
        return outputs


class _Refused(Exception):
    """A program refused before capture (:func:`capture_refusal`)."""


def _why_capture_failed(tracker: NodeTracker, exc: BaseException) -> str:
    """The failing op and the first line of its error (or the capture's own error where no op failed)."""
    failed = tracker.failed
    if failed is None:
        return f"capturing the step failed outside its ops: {type(exc).__name__}: {_first_line(exc)}"
    node, error = failed
    source = node.meta.get(SOURCE_NODE, node.name)
    return (f"capturing the step failed at node {source} ({node.target}): {type(error).__name__}: "
            f"{_first_line(error)}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"


def _stand_in_device(executor: Executor) -> torch.device:
    """The device a given API captures on: the step's first accelerator, else the CPU (standing in for it)."""
    devices = [d for d in executor.graph.devices if d not in (None, "cpu")]
    return torch.device(devices[0]) if devices else torch.device("cpu")


__all__ = ["PROBE_DRAW", "WARMUP_RUNS", "GraphAPI", "GraphReplay", "NodeTracker", "TorchCudaGraphs", "capture_refusal",
           "generator_states_in_graphs", "require_cuda_graph"]
