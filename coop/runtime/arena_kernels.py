"""How one op of an arena replay writes its result into its planned view, allocating nothing else.

Serves issue 15's arena execution: with ``arena=True`` every planned value of a step is a view of one
buffer per device at its planned offset (:mod:`coop.runtime.arena_replay` builds that program), and a
step may allocate only what the plan models. That holds only when each op computes straight into the
view it is given: computing into a fresh tensor and copying it in would hold the value twice at its
peak, which the simulator does not count. This module is that per-op knowledge (the op tables, the
functional ops' bodies written into a view, and the redispatch that hands a kernel's own output
allocations the planned views), kept apart from the program building and the buffers so that either
can change without the other.

How a value gets into its view was measured per op on the zoo models (torch 2.13 CPU; the arena
allocates nothing else when ``torch.profiler``'s memory events show no allocation of the output's
size and the result is ``torch.equal`` to the functional op):

* **Out kernels** (:data:`OUT_IN_PLACE`): ``op.out(..., out=view)`` where the ``.out`` overload is
  a native kernel that writes the given tensor. Many ``.out`` overloads (``convolution``,
  ``native_layer_norm``, ``native_batch_norm_backward``, ``embedding`` ...) are generated wrappers
  that call the functional op and copy its result, so they are not used.
* **Same arithmetic, in place** (:data:`COMPOSITES`, :data:`SCALAR_OUT`, :data:`COPIES`, :data:`FILLS`
  and the cases of :meth:`coop.runtime.arena_replay.ArenaProgramBuilder._rewrite`): the functional
  op's own body written into the view: ``masked_fill`` = copy + ``masked_fill_``,
  ``slice_backward``/``select_backward`` = zero + copy into the slice, ``constant_pad_nd`` = fill +
  copy, ``embedding`` = ``index_select.out``, ``embedding_dense_backward`` = zero + ``index_add_``
  (the CPU kernel's add of each index in order), ``_native_batch_norm_legit_functional`` = its
  in-place form ``_native_batch_norm_legit.out`` on copies of the running statistics,
  ``_safe_softmax`` = ``_softmax.out`` then zero the rows whose maximum is -inf (a few bytes of
  scratch per row), ``arange`` = ``arange.start_out``, copies and fills.
* **Kernels that allocate their own outputs** (:data:`KERNEL_OUTPUT_OPS`: oneDNN convolution forward and
  backward, layer norm forward and backward, batch norm backward; their ``.out`` overloads are
  wrappers): :func:`kernel_into` runs the op's own CPU kernel with :class:`KernelOutputs` active,
  which hands the kernel's output allocations the planned views, so the same kernel writes its
  result in place. The kernel's other allocations are its workspace, made as in eager PyTorch; at a
  call site's first call an output may land outside its view while the replay learns which
  allocation is which (batch norm backward allocates two temporaries of its input's size first): it
  is copied in and recorded in :data:`COPIES_MADE` (reported by ``ArenaProgram.kernel_copies``).
* **Compute, then copy** (:data:`WORKSPACE_OPS`, and any op none of the above covers): the op runs as in
  the ordinary replay and :func:`into_views` copies its result into the view; that allocation is the
  node's workspace, reported in ``ArenaProgram.transients`` (step, op, bytes) and added to
  ``predicted_peak``. On the zoo models (CPU) there is none.

What no op table can place is a kernel's own scratch: oneDNN's convolution forward and backward reorder
their input, output and gradients through blocked-layout buffers (up to twice an output whose channels
are not a multiple of the block, and a few times the input of a 3-channel stem), batch norm keeps small
statistics, ops with a Python-number operand wrap it in a 0-d tensor. Those allocations happen below the
dispatcher, in the same sizes eager PyTorch makes; no TorchDispatchMode (coop's memory meter included)
sees them, the CPU allocator's profiler events do. The planner measures them per plan on the example
batch and counts them in the arena plan's footprint (:func:`coop.runtime.arena_replay.measure_outside`).
Only CPU kernels are intercepted: on CUDA the planner does not use the arena replay.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch import fx
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

#: Functional op -> ``.out`` overload measured to write ``out`` in place and allocate nothing on CPU.
OUT_IN_PLACE: dict[Any, Any] = {
    aten._log_softmax.default: aten._log_softmax.out,
    aten._log_softmax_backward_data.default: aten._log_softmax_backward_data.out,
    aten._softmax.default: aten._softmax.out,
    aten._softmax_backward_data.default: aten._softmax_backward_data.out,
    aten.add.Tensor: aten.add.out,
    aten.addmm.default: aten.addmm.out,
    aten.bitwise_not.default: aten.bitwise_not.out,
    aten.bmm.default: aten.bmm.out,
    aten.cat.default: aten.cat.out,
    aten.cos.default: aten.cos.out,
    aten.div.Tensor: aten.div.out,
    aten.gather.default: aten.gather.out,
    aten.gelu.default: aten.gelu.out,
    aten.gelu_backward.default: aten.gelu_backward.grad_input,
    aten.hardtanh.default: aten.hardtanh.out,
    aten.hardtanh_backward.default: aten.hardtanh_backward.grad_input,
    aten.le.Tensor: aten.le.Tensor_out,
    aten.max_pool2d_with_indices.default: aten.max_pool2d_with_indices.out,
    aten.max_pool2d_with_indices_backward.default: aten.max_pool2d_with_indices_backward.grad_input,
    aten.mean.dim: aten.mean.out,
    aten.mm.default: aten.mm.out,
    aten.mul.Tensor: aten.mul.out,
    aten.neg.default: aten.neg.out,
    aten.nll_loss_backward.default: aten.nll_loss_backward.grad_input,
    aten.nll_loss_forward.default: aten.nll_loss_forward.output,
    aten.pow.Tensor_Scalar: aten.pow.Tensor_Scalar_out,
    aten.rsqrt.default: aten.rsqrt.out,
    aten.silu.default: aten.silu.out,
    aten.silu_backward.default: aten.silu_backward.grad_input,
    aten.sin.default: aten.sin.out,
    aten.sum.dim_IntList: aten.sum.IntList_out,
    aten.tanh.default: aten.tanh.out,
    aten.tanh_backward.default: aten.tanh_backward.grad_input,
    aten.threshold_backward.default: aten.threshold_backward.grad_input,
    aten.tril.default: aten.tril.out,
    aten.where.self: aten.where.self_out,
}

#: Ops whose CPU kernel allocates its own outputs and offers no native ``.out`` (measured): the kernel runs with
#: its output allocations handed the planned views (:class:`KernelOutputs`).
KERNEL_OUTPUT_OPS = frozenset({aten.convolution.default, aten.convolution_backward.default,
                               aten.native_layer_norm.default, aten.native_layer_norm_backward.default,
                               aten.native_batch_norm_backward.default})

#: Ops computed, then copied into their views (their allocation is the node's workspace): none on CPU now.
WORKSPACE_OPS: frozenset[Any] = frozenset()

#: Ops whose result is a plain copy of their (first) input: written with ``view.copy_(input)``.
COPIES = {aten.clone.default, aten.lift_fresh_copy.default, aten._to_copy.default}

#: Ops that make a constant tensor: written with ``view.fill_(value)``; the value from the op's arguments.
FILLS: dict[Any, Callable[[tuple, dict], Any]] = {
    aten.ones.default: lambda args, kwargs: 1,
    aten.ones_like.default: lambda args, kwargs: 1,
    aten.zeros.default: lambda args, kwargs: 0,
    aten.zeros_like.default: lambda args, kwargs: 0,
    aten.full.default: lambda args, kwargs: args[1],
    aten.scalar_tensor.default: lambda args, kwargs: args[0],
}

#: Ops with a Python-number operand whose functional form wraps the number and calls the tensor op's
#: kernel: written with that op's in-place ``.out`` kernel on the same wrapped number.
SCALAR_OUT = {aten.mul.Scalar: aten.mul.out, aten.div.Scalar: aten.div.out}


# ---------------------------------------------------------------- the functional ops' own bodies, into a view
def _masked_fill_into(out: torch.Tensor, x: torch.Tensor, mask: torch.Tensor, value: Any) -> torch.Tensor:
    """``masked_fill`` is ``clone`` + ``masked_fill_``."""
    return out.copy_(x).masked_fill_(mask, value)


def _slice_backward_into(out: torch.Tensor, grad: torch.Tensor, sizes: Any, dim: int, start: int, end: int,
                         step: int) -> torch.Tensor:
    """``slice_backward`` is ``zeros(sizes)`` with ``grad`` copied into the slice."""
    aten.slice.Tensor(out.zero_(), dim, start, end, step).copy_(grad)
    return out


def _select_backward_into(out: torch.Tensor, grad: torch.Tensor, sizes: Any, dim: int, index: int) -> torch.Tensor:
    """``select_backward`` is ``zeros(sizes)`` with ``grad`` copied into the selected slice."""
    aten.select.int(out.zero_(), dim, index).copy_(grad)
    return out


def _constant_pad_into(out: torch.Tensor, x: torch.Tensor, pad: list[int], value: Any = 0) -> torch.Tensor:
    """``constant_pad_nd`` (ATen's PadNd.cpp): fill with ``value``, copy the (narrowed) input into the middle."""
    source, target = x, out
    for k in range(len(pad) // 2):
        dim = x.dim() - 1 - k
        before, after = pad[2 * k], pad[2 * k + 1]
        if before < 0:
            source = source.narrow(dim, -before, source.size(dim) + before)
        elif before > 0:
            target = target.narrow(dim, before, target.size(dim) - before)
        if after < 0:
            source = source.narrow(dim, 0, source.size(dim) + after)
        elif after > 0:
            target = target.narrow(dim, 0, target.size(dim) - after)
    if target.numel() != out.numel():
        out.fill_(value)
    target.copy_(source)
    return out


def embedding_into(out: torch.Tensor, weight: torch.Tensor, indices: torch.Tensor, *_: Any) -> torch.Tensor:
    """``embedding`` into ``out``: ``weight.index_select(0, indices.reshape(-1)).view(...)``.

    Parameters
    ----------
    out : torch.Tensor
        The output's arena view, of shape ``indices.shape + (weight.size(1),)``.
    weight : torch.Tensor
        The embedding table (rows by embedding size).
    indices : torch.Tensor
        The rows to look up, any shape.
    *_ : Any
        The op's remaining arguments (padding index, sparse flags), not needed for the forward.

    Returns
    -------
    torch.Tensor
        ``out``, holding the looked-up rows.
    """
    aten.index_select.out(weight, 0, indices.reshape(-1), out=out.view(-1, weight.size(1)))
    return out


def embedding_backward_into(out: torch.Tensor, grad: torch.Tensor, indices: torch.Tensor, num_weights: int,
                             padding_idx: int, scale_grad_by_freq: bool) -> torch.Tensor:
    """``embedding_dense_backward`` on CPU, into ``out``.

    Zeros, then each index's gradient row added in index order (what ``index_add_`` does), the padding row left
    at zero.

    Parameters
    ----------
    out : torch.Tensor
        The weight gradient's arena view, ``num_weights`` rows.
    grad : torch.Tensor
        The gradient of the embedding's output.
    indices : torch.Tensor
        The indices the forward looked up.
    num_weights : int
        The number of rows of the table (unused: ``out`` has them).
    padding_idx : int
        The row whose gradient stays zero; negative for none.
    scale_grad_by_freq : bool
        The op's flag (unused by this kernel).

    Returns
    -------
    torch.Tensor
        ``out``, holding the weight gradient.
    """
    out.zero_().index_add_(0, indices.reshape(-1), grad.reshape(-1, out.size(1)))
    if padding_idx >= 0:
        out[padding_idx].zero_()
    return out


def batch_norm_into(outs: tuple[torch.Tensor, ...], x: torch.Tensor, weight: Any, bias: Any,
                    running_mean: torch.Tensor, running_var: torch.Tensor, training: bool, momentum: float,
                    eps: float) -> tuple[torch.Tensor, ...]:
    """``_native_batch_norm_legit_functional`` into ``outs``: its in-place form on copies of the running statistics.

    Parameters
    ----------
    outs : tuple of torch.Tensor
        The five output views: output, saved mean, saved inverse std, new running mean, new running variance.
    weight, bias : torch.Tensor or None
        The affine parameters.
    running_mean, running_var : torch.Tensor
        The running statistics, copied into the new-statistics views and updated there (left untouched).
    training : bool
        Whether batch statistics are used (and the running ones updated).
    momentum : float
        The running statistics' update factor.
    eps : float
        Added to the variance.

    Returns
    -------
    tuple of torch.Tensor
        ``outs``, filled.
    """
    out, save_mean, save_invstd, new_mean, new_var = outs
    new_mean.copy_(running_mean)
    new_var.copy_(running_var)
    aten._native_batch_norm_legit.out(x, weight, bias, new_mean, new_var, training, momentum, eps, out=out,
                                      save_mean=save_mean, save_invstd=save_invstd)
    return outs


def safe_softmax_into(out: torch.Tensor, row_max: torch.Tensor, masked: torch.Tensor, x: torch.Tensor,
                       dim: int) -> torch.Tensor:
    """``_safe_softmax`` into ``out``: softmax with rows that are all -inf set to 0.

    A row is all -inf exactly when its maximum is -inf (a NaN propagates through both tests).

    Parameters
    ----------
    out : torch.Tensor
        The output's arena view.
    row_max : torch.Tensor
        Scratch for the maximum along ``dim`` (kept dimension).
    masked : torch.Tensor
        Bool scratch, True on the rows whose maximum is -inf.
    dim : int
        The softmax dimension.

    Returns
    -------
    torch.Tensor
        ``out``, the softmax with all -inf rows zeroed.
    """
    aten._softmax.out(x, dim, False, out=out)
    aten.amax.out(x, [dim], True, out=row_max)
    aten.eq.Scalar_out(row_max, float("-inf"), out=masked)
    return out.masked_fill_(masked, 0)


def _identity_into(out: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:
    """``new_empty_strided``: uninitialized memory, which the view already is."""
    return out


def _copy_into(out: torch.Tensor, self_: torch.Tensor, src: torch.Tensor, *_: Any) -> torch.Tensor:
    """Functional ``copy`` is ``clone(self).copy_(src)``; ``src`` broadcast over every element."""
    return out.copy_(src)


#: Single-output ops written into their view by the functional op's own body (arguments: view, *op's arguments).
COMPOSITES: dict[Any, Callable[..., torch.Tensor]] = {
    aten.masked_fill.Scalar: _masked_fill_into,
    aten.slice_backward.default: _slice_backward_into,
    aten.select_backward.default: _select_backward_into,
    aten.constant_pad_nd.default: _constant_pad_into,
    aten.new_empty_strided.default: _identity_into,
    aten.copy.default: _copy_into,
}


_CPU_KERNEL = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_SITES = itertools.count()
_ALLOCATIONS = {aten.empty.memory_format, aten.empty_strided.default}


class KernelOutputs(TorchDispatchMode):
    """Run an op's own CPU kernel so that the allocations that become its outputs are the planned views.

    The op is redispatched straight to its CPU kernel with this mode active, so the ``at::empty`` calls
    the kernel makes come here (composites it calls are redispatched the same way). An allocation
    that becomes output k gets output k's view, reshaped as asked, and the kernel writes its result
    there: the same kernel on the same inputs, bit for bit the functional op. Which allocation becomes
    which output is learned at a call site's first call (``LEARNED``): there each allocation of an
    output's element count and dtype takes the first free view, and an output that lands elsewhere
    (the kernel allocated a temporary of the same size first, as batch norm backward does) is copied
    into its view and recorded in ``COPIES_MADE``. Every other allocation is the kernel's own
    workspace, made below the Python dispatch key as in eager PyTorch: no TorchDispatchMode sees those, the
    allocator's profiler events do (:func:`coop.runtime.arena_replay.measure_outside` counts them).
    """

    def __init__(self, views: tuple[torch.Tensor | None, ...], learned: dict[int, int] | None) -> None:
        super().__init__()
        self.views = views
        self.learned = learned  # allocation index -> output index, from the site's first call
        self.free = {k for k, v in enumerate(views) if v is not None and v.numel() and _dense(v)}
        self.count = 0
        self.claimed: dict[int, int] = {}  # allocation index -> output index whose view it got
        self.fresh: dict[int, int] = {}  # allocation index -> data pointer of an allocation made as asked

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _ALLOCATIONS:
            index, self.count = self.count, self.count + 1
            view = self._claim(index, func, args, kwargs)
            if view is not None:
                return view
            made = func.redispatch(_CPU_KERNEL, *args, **kwargs)
            self.fresh[index] = made.untyped_storage().data_ptr()
            return made
        if func is aten.resize_.default and args[0].numel() == 0:  # at::empty({0}) grown into an output
            return self._resize(args[0], list(args[1]), kwargs)
        if func.is_view or func is aten.as_strided.default:
            return func(*args, **kwargs)
        with self:
            return func.redispatch(_CPU_KERNEL, *args, **kwargs)

    def _claim(self, index: int, func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
        size = list(args[0])
        dtype = kwargs.get("dtype") or torch.get_default_dtype()
        candidates = sorted(self.free) if self.learned is None else [self.learned.get(index, -1)]
        for k in candidates:
            view = self.views[k] if k in self.free else None
            if view is not None and view.dtype == dtype and view.numel() == _numel(size):
                stride = list(args[1]) if func is aten.empty_strided.default else _strides(size, kwargs)
                self.free.discard(k)
                self.claimed[index] = k
                return view.as_strided(size, stride, view.storage_offset())
        return None

    def _resize(self, tensor: torch.Tensor, size: list[int], kwargs: dict) -> torch.Tensor:
        """An empty tensor the kernel grows: set onto an output's view when it becomes that output."""
        index, self.count = self.count, self.count + 1
        view = self._claim(index, aten.empty.memory_format, (size,), {"dtype": tensor.dtype, **kwargs})
        if view is not None:
            return aten.set_.source_Storage_storage_offset.redispatch(
                _CPU_KERNEL, tensor, view.untyped_storage(), view.storage_offset(), view.shape, view.stride())
        grown = aten.resize_.default.redispatch(_CPU_KERNEL, tensor, size, **kwargs)
        self.fresh[index] = grown.untyped_storage().data_ptr()
        return grown

    def learn(self, outputs: tuple[Any, ...]) -> dict[int, int]:
        """Allocation index -> output index, from where this call's outputs were made."""
        learned = {i: k for i, k in self.claimed.items() if outputs[k].data_ptr() == self.views[k].data_ptr()}
        for k, out in enumerate(outputs):
            if self.views[k] is not None and out is not None and k not in learned.values():
                learned.update({i: k for i, ptr in self.fresh.items() if ptr == out.untyped_storage().data_ptr()})
        return learned


#: Call site -> what KernelOutputs learned there; call site -> (op, bytes) copied at its first call.
LEARNED: dict[int, dict[int, int]] = {}
COPIES_MADE: dict[int, list[tuple[str, int]]] = {}


def forget_sites(sites: tuple[int, ...]) -> None:
    """Drop what :data:`LEARNED` and :data:`COPIES_MADE` hold for ``sites``.

    Called when the arena program that owns these call sites is collected.

    Parameters
    ----------
    sites : tuple of int
        Call-site ids (:func:`kernel_site`).

    Returns
    -------
    None
    """
    for site in sites:
        LEARNED.pop(site, None)
        COPIES_MADE.pop(site, None)


def kernel_into(site: int, op: Any, views: tuple[torch.Tensor | None, ...], *args: Any, **kwargs: Any) -> Any:
    """``op(*args, **kwargs)`` computed by its CPU kernel into ``views`` (:class:`KernelOutputs`) at call site ``site``.

    Which allocation is which output is learned at a site's first call (:data:`LEARNED`); an output the kernel
    put elsewhere is copied into its view and recorded in :data:`COPIES_MADE`.

    Parameters
    ----------
    site : int
        The call site's id (:func:`kernel_site`).
    op : Any
        The aten op overload, redispatched to its CPU kernel.
    views : tuple of (torch.Tensor or None)
        One arena view per output; None for an output left where the kernel puts it.
    *args, **kwargs : Any
        The op's arguments.

    Returns
    -------
    Any
        The op's result (a tensor, or a tuple like the op's), each placed output being its view.
    """
    mode = KernelOutputs(views, LEARNED.get(site))
    with mode:
        result = op.redispatch(_CPU_KERNEL, *args, **kwargs)
    outputs = result if isinstance(result, tuple) else (result,)
    if site not in LEARNED:
        LEARNED[site] = mode.learn(outputs)
    placed = []
    for out, view in zip(outputs, views, strict=True):
        if view is None or out is None or out.data_ptr() == view.data_ptr():
            placed.append(out)
        else:
            COPIES_MADE.setdefault(site, []).append((str(op), out.untyped_storage().nbytes()))
            placed.append(view.copy_(out))
    return tuple(placed) if isinstance(result, tuple) else placed[0]


def _numel(size: list[int]) -> int:
    count = 1
    for n in size:
        count *= n
    return count


def _strides(size: list[int], kwargs: dict) -> list[int]:
    """Strides of ``at::empty(size, memory_format=...)``."""
    memory_format = kwargs.get("memory_format")
    if memory_format not in (None, torch.contiguous_format):
        return list(torch.empty(size, device="meta", memory_format=memory_format).stride())
    strides, step = [], 1
    for n in reversed(size):
        strides.append(step)
        step *= max(n, 1)
    return strides[::-1]


def _dense(view: torch.Tensor) -> bool:
    return view_extent(view.shape, view.stride(), view.dtype) == view.numel() * view.element_size()


def view_extent(shape: Any, stride: Any, dtype: torch.dtype) -> int:
    """Bytes from a view's first element to its last (what its storage must hold past its offset).

    Parameters
    ----------
    shape : sequence of int
        The view's shape.
    stride : sequence of int
        The view's strides, in elements.
    dtype : torch.dtype
        The element type.

    Returns
    -------
    int
        The extent in bytes; 0 for a view with no elements.
    """
    if any(s == 0 for s in shape):
        return 0
    return dtype.itemsize * (1 + sum((s - 1) * st for s, st in zip(shape, stride, strict=True)))


def same_device_copy(node: fx.Node, fake: torch.Tensor) -> bool:
    """Whether a copy op's result is its same-shaped input on the same device (a plain ``view.copy_(input)``).

    Parameters
    ----------
    node : fx.Node
        The copy op's node; its first argument's ``meta["val"]`` is the source.
    fake : torch.Tensor
        The op's (fake) result.

    Returns
    -------
    bool
        True when the source is a tensor on ``fake``'s device with its shape and ``fake`` is strided.
    """
    source = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    return (isinstance(source, torch.Tensor) and source.device == fake.device and fake.layout == torch.strided
            and source.shape == fake.shape)


def bernoulli_mask_op() -> Any:
    """coop's bool dropout draw (:mod:`coop.graph_capture.random_ops`), registered when capture is imported."""
    return torch.ops.coop.bernoulli_mask.default


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    """The tensors of a value that is a tensor or a tuple/list of them (non-tensors left out).

    Parameters
    ----------
    value : Any
        A tensor, a tuple or list, or anything else.

    Returns
    -------
    list of torch.Tensor
        ``[value]`` for a tensor, the tensor items of a tuple or list, else empty.
    """
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def into_views(computed: Any, views: tuple[torch.Tensor | None, ...]) -> Any:
    """Copy a computed value (a tensor or a tuple) into its arena views; unplaced outputs stay as computed.

    Parameters
    ----------
    computed : Any
        A tensor, or a tuple of outputs.
    views : tuple of (torch.Tensor or None)
        One arena view per output; None leaves that output as computed.

    Returns
    -------
    Any
        The first view (for a tensor), or the tuple of views and unplaced outputs.
    """
    if isinstance(computed, torch.Tensor):
        return views[0].copy_(computed)
    return tuple(c if v is None or c is None else v.copy_(c) for v, c in zip(views, computed, strict=True))


def kernel_site() -> int:
    """A fresh call-site id for :func:`kernel_into` (what :data:`LEARNED` and :data:`COPIES_MADE` are keyed by)."""
    return next(_SITES)


__all__ = ["COMPOSITES", "COPIES", "COPIES_MADE", "FILLS", "KERNEL_OUTPUT_OPS", "LEARNED", "OUT_IN_PLACE",
           "SCALAR_OUT", "WORKSPACE_OPS", "KernelOutputs", "batch_norm_into", "bernoulli_mask_op",
           "embedding_backward_into", "embedding_into", "forget_sites", "into_views", "kernel_into", "kernel_site",
           "safe_softmax_into", "same_device_copy", "tensor_leaves", "view_extent"]
