"""The buffers inductor really keeps for a graph coop emitted, read from its scheduler after fusion.

Inductor inlines a pointwise value into the fused kernels that read it and realizes others (an extern kernel's
input, a value read by two kernels...). coop's Graph has one node per joint value, so which of them exist as
buffers, and how long they live, is inductor's decision, not coop's. :class:`BufferObserver` is a
``CustomSchedulerPass`` for ``torch._inductor.config._post_fusion_custom_pass``: inductor calls it with the
scheduler nodes after fusion (each a kernel, in the order the generated code runs them), and it records, without
changing anything, each kernel's output buffers (name, bytes, the joint value they hold: the ``JOINT_VALUE`` meta
the emitter put on every node it wrote, carried by the buffer's ``origin_node``; :func:`mark_joint_value`), which
kernels read each buffer,
and which are graph outputs. A buffer every reader of which is inside the kernel that writes it (and that is no
output) is never allocated: inductor's codegen keeps it in the kernel (``remove_kernel_local_buffers``), so it is
recorded as not materialized.

:meth:`ObservedGraph.peak` walks the kernels as the generated code runs them: a materialized buffer is allocated
at its kernel (in place of an input of the same size whose last reader is that kernel, as inductor's in-place
reuse does for loop kernels) and freed after its last reader, or held in a pool until a later allocation of its
size takes it where inductor's wrapper would (:meth:`ObservedGraph._walk`); outputs stay. :func:`step_peak` joins a
forward and its backward: the forward's outputs stay until the backward's last read of them (the backward's saved
inputs are freed as it goes), the forward's own outputs and the gradients stay.

The pass's :meth:`~BufferObserver.uuid` carries a fresh nonce, so inductor's FX graph cache never answers an
observed compilation from another's entry (which would run no scheduler, so nothing would be observed); coop's
partitioner already makes that cache miss (:meth:`coop.compiled.partitioner.CoopPartitioner.__getstate__`), and
the cache of compiled kernels still serves.

The kernels are read in the order fusion left them; inductor's ``reorder_for_peak_memory`` (on by default) runs
after this pass and may move them. On the models of ``tests/test_inductor_buffers.py`` the generated code runs
them in the order observed.
"""

from __future__ import annotations

import uuid as uuid_module
from dataclasses import dataclass, field
from typing import Any

from torch._inductor.custom_graph_pass import CustomSchedulerPass
from torch._inductor.virtualized import V

__all__ = ["COOP_GRAPH", "JOINT_VALUE", "BufferObserver", "ObservedBuffer", "ObservedGraph", "buffer_nbytes",
           "mark_joint_value", "observe", "step_peak"]

#: the meta key naming, on every node the emitter writes (computations and their views), the joint node it copies
JOINT_VALUE = "coop_joint_value"
#: inputs inductor's peak estimate leaves out (``torch._inductor.utils.is_nonfreeable_buffers``)
_NOT_FREEABLE = ("primals_", "arg", "fwd_rng_state", "bwd_rng_state", "tangents")
#: the meta key naming, on every node the emitter writes, the coop Graph it was planned in
COOP_GRAPH = "coop_graph"


def mark_joint_value(node: Any, name: str) -> None:
    """Name the joint value an emitted fx node computes, where inductor's passes keep it.

    ``JOINT_VALUE`` itself, and the same key inside ``meta["custom"]``: a post-grad pattern that replaces a node
    (``add(mm(a, b), c)`` becomes ``addmm(c, a, b)``) copies only torch.fx's ``_COPY_META_FIELDS`` to the new node,
    ``custom`` among them, so the buffer it writes still names the value it holds.
    """
    node.meta[JOINT_VALUE] = name
    node.meta["custom"] = {**(node.meta.get("custom") or {}), JOINT_VALUE: name}


@dataclass(frozen=True)
class ObservedBuffer:
    """One output buffer of one kernel after inductor's fusion."""

    name: str
    nbytes: int
    #: the joint fx node whose value it holds (None: an inductor temporary, e.g. a layer norm's statistics)
    joint_name: str | None
    #: index of the kernel that writes it
    kernel: int
    #: indices of the kernels that read it, in order
    readers: tuple[int, ...]
    output: bool
    #: allocated by the generated code (False: local to its fused kernel)
    materialized: bool
    dtype: str = ""
    #: the scheduler node that writes it and those that read it (inside fused kernels: their members)
    writer: str = ""
    reader_ops: tuple[str, ...] = ()
    #: a buffer of its own in inductor's schedule that codegen keeps inside its kernel (not materialized)
    local: bool = False

    @property
    def key(self) -> tuple[int, str]:
        """What inductor's buffer reuse matches: size and dtype."""
        return (self.nbytes, self.dtype)


@dataclass
class ObservedGraph:
    """The kernels of one compiled graph, in run order, and their buffers."""

    coop_graph: str | None
    backward: bool
    kernels: list[str] = field(default_factory=list)
    #: whether each kernel is an extern kernel (matmul, convolution: no in-place reuse)
    extern: list[bool] = field(default_factory=list)
    buffers: list[ObservedBuffer] = field(default_factory=list)
    #: the graph's inputs (placeholder names: primals, saved joint names, tangents) -> the kernels reading them
    input_readers: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: the graph's input names in order, and per output (in order) the buffer or input it is (a view: its base)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str | None] = field(default_factory=list)
    #: the graph's freeable inputs read by its kernels (saved values, not primals or tangents) -> their bytes
    #: (inductor's peak estimate counts them until their last reader)
    input_bytes: dict[str, int] = field(default_factory=dict)

    def materialized(self) -> list[ObservedBuffer]:
        """The buffers the generated code allocates."""
        return [b for b in self.buffers if b.materialized]

    def joint_bytes(self) -> dict[str, int]:
        """Joint fx name -> bytes of the materialized buffers holding its value (summed over recomputations)."""
        held: dict[str, int] = {}
        for buffer in self.materialized():
            if buffer.joint_name is not None:
                held[buffer.joint_name] = held.get(buffer.joint_name, 0) + buffer.nbytes
        return held

    def peak(self, resident: dict[tuple[str, ...], int] | None = None) -> int:
        """Peak bytes of this graph's buffers while it runs (module docstring), plus ``resident`` inputs.

        Parameters
        ----------
        resident : dict or None
            Input names -> the bytes they share (a backward's saved values: views of one forward buffer share
            it), freed after the last reader of any of them; they count from the start.

        Returns
        -------
        int
            The largest sum of live bytes at any kernel.
        """
        return self._walk(resident or {})[0]

    def allocated(self) -> list[ObservedBuffer]:
        """The materialized buffers that get memory of their own (not written in place of a dying input)."""
        return self._walk({})[1]

    def _walk(self, resident: dict[tuple[str, ...], int]) -> tuple[int, list[ObservedBuffer]]:
        """Run the kernels as the generated code does: the peak of the live bytes and the fresh allocations.

        A buffer whose last reader is a loop kernel that writes a buffer of the same size and dtype becomes that
        buffer (in-place reuse). A buffer that dies otherwise goes to a pool keyed by size and dtype; a later
        allocation of that key may take the most recent one (inductor's ``ReuseLine``), and the memory then stays
        held from the death to the reuse; one never reused is freed at its death (``FreeIfNotReusedLine``).
        Inductor's wrapper takes a pooled buffer only when the kernel right after its death allocates it, or when
        holding it in between keeps its own estimate of the graph's peak (``AllocateLine.should_reuse_buffer``:
        every buffer of its schedule, kernel-local ones included, from its kernel to its last reader, no in-place
        reuse); the walk decides the same way on that profile, raised by each reuse it takes.
        """
        input_frees: dict[int, int] = {}
        for names, nbytes in resident.items():
            readers = [r for name in names for r in self.input_readers.get(name, ())]
            if readers:
                input_frees[max(readers)] = input_frees.get(max(readers), 0) + nbytes
        held = sum(resident.values())
        inputs = [0] * len(self.kernels)
        for index in range(len(self.kernels)):
            inputs[index] = held
            held -= input_frees.get(index, 0)
        # inductor's estimate: its inputs until their last reader, every buffer of its schedule from its kernel to
        # its last reader
        profile = [0] * len(self.kernels)
        for name, nbytes in self.input_bytes.items():
            for index in range(max(self.input_readers.get(name, ()), default=-1) + 1):
                profile[index] += nbytes
        for buffer in self.buffers:
            if buffer.materialized or buffer.local:
                last = len(self.kernels) - 1 if buffer.output else max(buffer.readers, default=buffer.kernel)
                for index in range(buffer.kernel, last + 1):
                    profile[index] += buffer.nbytes
        blocks, fresh = self._blocks(pool_from=profile)
        return max(_live(blocks, inputs), default=0), fresh

    def _blocks(self, pool_from: list[int] | None) -> tuple[list[list[int]], list[ObservedBuffer]]:
        """The memory blocks of one walk ([bytes, first kernel, last kernel]) and the buffers that got fresh ones.

        ``pool_from``: the live bytes per kernel without pooled reuse, against which a pooled reuse is decided
        (and which each reuse taken raises); None: no pooled reuse at all.
        """
        writes: dict[int, list[ObservedBuffer]] = {}
        deaths: dict[int, list[ObservedBuffer]] = {}
        for buffer in self.materialized():
            writes.setdefault(buffer.kernel, []).append(buffer)
            if not buffer.output:
                deaths.setdefault(max(buffer.readers, default=buffer.kernel), []).append(buffer)
        overall = max(pool_from, default=0) if pool_from is not None else 0
        block_of: dict[str, int] = {}  # buffer name -> index of the memory block it occupies
        blocks: list[list[int]] = []  # [bytes, first kernel, last kernel (-1 while open)]
        pool: dict[tuple[int, str], list[int]] = {}
        fresh: list[ObservedBuffer] = []
        for index in range(len(self.kernels)):
            dying = list(deaths.get(index, []))
            for buffer in writes.get(index, []):
                match = next((d for d in dying if not self.extern[index] and d.key == buffer.key
                              and d.name in block_of and buffer.writer in d.reader_ops), None)
                if match is not None:  # in place of an input read for the last time
                    dying.remove(match)
                    block_of[buffer.name] = block_of[match.name]
                    continue
                candidates = pool.get(buffer.key)
                if pool_from is not None and candidates:
                    freed = blocks[candidates[-1]][2]
                    between = pool_from[freed + 1:index]
                    if freed + 1 == index or buffer.nbytes + max(between, default=0) <= overall:
                        block_of[buffer.name] = candidates.pop()
                        blocks[block_of[buffer.name]][2] = -1  # held from its last death on, open again
                        for kernel in range(freed + 1, index):
                            pool_from[kernel] += buffer.nbytes
                        continue
                block_of[buffer.name] = len(blocks)
                blocks.append([buffer.nbytes, index, -1])
                fresh.append(buffer)
            for buffer in dying:
                block = block_of[buffer.name]
                blocks[block][2] = index  # freed here unless a later allocation reuses it
                pool.setdefault(buffer.key, []).append(block)
        ends = len(self.kernels) - 1
        for block in blocks:
            if block[2] < 0:
                block[2] = ends
        return blocks, fresh


def _live(blocks: list[list[int]], inputs: list[int]) -> list[int]:
    """Bytes live at each kernel: the blocks spanning it and the resident inputs not yet freed."""
    live = list(inputs)
    for nbytes, first, last in blocks:
        for index in range(first, last + 1):
            live[index] += nbytes
    return live


def step_peak(forward: ObservedGraph, backward: ObservedGraph, saved: int) -> int:
    """Peak bytes of a forward then its backward (module docstring), caller-owned inputs not counted.

    Parameters
    ----------
    forward, backward
        The two observed graphs of one planned step.
    saved : int
        How many tensors the forward saves for the backward: its last outputs, the backward's first inputs
        (AOTAutograd's layout).

    Returns
    -------
    int
        The larger of the forward's peak and the backward's with the forward's outputs resident (a saved buffer
        until the backward's last read of it, any other output throughout).
    """
    own = {b.name: b.nbytes for b in forward.materialized() if b.output}
    shared: dict[str, list[str]] = {}  # forward buffer -> the backward inputs that are it (or views of it)
    if saved:
        for base, name in zip(forward.outputs[-saved:], backward.inputs[:saved], strict=False):
            if base in own:
                shared.setdefault(base, []).append(name)
    kept = sum(nbytes for name, nbytes in own.items() if name not in shared)
    resident = {tuple(names): own[base] for base, names in shared.items()}
    return max(forward.peak(), kept + backward.peak(resident))


class BufferObserver(CustomSchedulerPass):
    """Records each compiled graph's kernels and buffers after fusion; returns the nodes unchanged."""

    def __init__(self) -> None:
        self.graphs: list[ObservedGraph] = []
        #: what went wrong reading a graph (inductor's scheduler IR is a prototype): that graph is not observed
        self.errors: list[str] = []
        self.nonce = uuid_module.uuid4().hex

    def __call__(self, nodes: list[Any]) -> list[Any]:
        try:
            self.graphs.append(observe(nodes))
        except Exception as exc:  # noqa: BLE001 -- an observer never fails the compilation it watches
            self.errors.append(f"{type(exc).__name__}: {exc}")
        return nodes

    def uuid(self) -> str:
        """A fresh key per observer: an observed compilation is never answered from the FX graph cache."""
        return f"coop-inductor-buffers-{self.nonce}"

    def of(self, coop_graph: str) -> tuple[ObservedGraph | None, ObservedGraph | None]:
        """The latest observed forward and backward of the coop Graph named ``coop_graph``."""
        forward = backward = None
        for graph in self.graphs:
            if graph.coop_graph == coop_graph:
                if graph.backward:
                    backward = graph
                else:
                    forward = graph
        return forward, backward

    def __getstate__(self) -> dict[str, Any]:
        """Pickled into inductor's cache keys: the nonce, not what was observed."""
        return {"graphs": [], "errors": [], "nonce": self.nonce}


def observe(nodes: list[Any]) -> ObservedGraph:
    """The kernels and buffers of the graph inductor is scheduling (``V.graph``), from its fused nodes."""
    graph = V.graph
    tags = {n.meta.get(COOP_GRAPH) for n in graph.graph.nodes} - {None}
    observed = ObservedGraph(coop_graph=next(iter(tags)) if len(tags) == 1 else None,
                             backward=bool(getattr(graph, "is_backward", False)))
    outputs = set(_output_names(graph)) - {None}
    kernel_of: dict[str, int] = {}  # scheduler node name -> kernel index
    unit_of: dict[str, int] = {}  # scheduler node name -> the loop nest it is generated in
    for index, node in enumerate(nodes):
        observed.kernels.append(node.get_name())
        observed.extern.append(type(node).__name__ == "ExternKernelSchedulerNode")
        for member in node.get_nodes():
            kernel_of[member.get_name()] = index
        # the CPU backend's outer-loop fusion generates each of its parts as a loop nest of its own, and a buffer
        # one part writes and another reads is allocated (measured against the generated code)
        for part in getattr(node, "outer_fused_nodes", None) or [node]:
            for member in part.get_nodes():
                unit_of[member.get_name()] = id(part)
    inputs = set(graph.graph_inputs)
    input_readers: dict[str, set[int]] = {name: set() for name in inputs}
    for index, node in enumerate(nodes):
        for dep in node.read_writes.reads:
            if dep.name in input_readers:
                input_readers[dep.name].add(index)
    observed.input_readers = {name: tuple(sorted(readers)) for name, readers in input_readers.items()}
    observed.input_bytes = {name: buffer_nbytes(graph.graph_inputs[name]) for name, readers in input_readers.items()
                            if readers and not name.startswith(_NOT_FREEABLE)}
    observed.inputs = list(graph.graph_inputs)
    observed.outputs = _output_names(graph)
    for index, node in enumerate(nodes):
        for buffer in node.get_outputs():
            readers = sorted({kernel_of[u.node.get_name()] for u in buffer.users
                              if not u.is_weak and u.node.get_name() in kernel_of})
            is_output = buffer.get_name() in outputs or any(
                not u.is_weak and u.node.get_name() not in kernel_of for u in buffer.users)
            own = unit_of[buffer.defining_op_name()]
            local = not is_output and all(not u.is_weak and unit_of.get(u.node.get_name()) == own for u in buffer.users)
            observed.buffers.append(ObservedBuffer(
                name=buffer.get_name(), nbytes=buffer_nbytes(buffer.node), joint_name=_joint_name(buffer.node),
                kernel=index, readers=tuple(readers), output=is_output,
                materialized=not local and _allocates(buffer.node), dtype=_dtype(buffer.node),
                local=local and _allocates(buffer.node),
                writer=buffer.defining_op_name(),
                reader_ops=tuple(u.node.get_name() for u in buffer.users if not u.is_weak)))
    return observed


def _output_names(graph: Any) -> list[str | None]:
    """Per graph output, the buffer or input it is (a view: the buffer it views); None for a constant."""
    names: list[str | None] = []
    for out in graph.graph_outputs:
        try:
            names.append(out.get_name())
        except (NotImplementedError, AttributeError):
            names.append(None)
    return names


def buffer_nbytes(node: Any) -> int:
    """An ir buffer's bytes; 0 for a multi-output holder (``MultiOutputLayout``), whose parts are buffers of their
    own."""
    try:
        return int(node.get_layout().storage_size()) * node.get_dtype().itemsize
    except (AttributeError, NotImplementedError, TypeError):
        return 0


def _dtype(node: Any) -> str:
    """An ir buffer's dtype as text; empty for a multi-output holder."""
    try:
        return str(node.get_dtype())
    except (AttributeError, NotImplementedError):
        return ""


def _allocates(node: Any) -> bool:
    """Whether an ir buffer is a fresh allocation (not a view, a mutation of another buffer or a multi-output
    holder)."""
    try:
        layout = node.get_layout()
    except NotImplementedError:
        return False
    return type(layout).__name__ in ("FixedLayout", "FlexibleLayout")


def _joint_name(node: Any) -> str | None:
    origin = node.get_origin_node() if hasattr(node, "get_origin_node") else None
    if origin is None:
        return None
    if JOINT_VALUE in origin.meta:
        return origin.meta[JOINT_VALUE]
    custom = origin.meta.get("custom")
    return custom.get(JOINT_VALUE) if isinstance(custom, dict) else None
