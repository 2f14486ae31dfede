"""Trace one training step (forward + backward) at aten level into an fx joint graph.

The step is the forward and ``torch.autograd.grad(loss, params)`` with ``create_graph=False``,
traced by ``make_fx`` on fake tensors (nothing is computed) with functionalization enabled below
autograd, as AOTAutograd traces its joint graphs: in-place ops (``relu_``, ``add_``,
``num_batches_tracked.add_``) become out-of-place ops. Buffers are explicit inputs of the step
and their values after the step are explicit outputs.

Why not ``torch.func.grad_and_value``: functorch's grad differentiates with create_graph
semantics, under which autograd picks the infinitely differentiable formula of a backward where
derivatives.yaml offers two (``GradMode::is_enabled() ? ... : ...``): SiLU's backward became
``sigmoid``/``sub``/``mul``/``add`` instead of eager's fused ``silu_backward`` kernel, Mish and
GroupNorm likewise, so a replay differed from eager ``loss.backward()`` in the last bits (Llama,
Qwen2 and Mistral through their SwiGLU MLPs); derivatives.yaml makes the same choice for the fused
RMSNorm, ``logit``, CUDA's ``native_dropout`` and weight norm. ``autograd.grad`` without
``create_graph`` records the very kernels eager's backward runs.

One mutation survives functionalization and is rewritten here, so that every node of the joint
graph is a pure function of its inputs (and may be recomputed): ``native_batch_norm`` in training
updates the running statistics of its buffer arguments in place; it becomes
``_native_batch_norm_legit_functional``, which returns the new statistics. Mutated inputs are not
written back (no trailing ``copy_``): the new buffer values are outputs of the step.

Any other op that writes into one of its arguments is refused with a CaptureError. Finally each
dropout draw is split into a bool mask (the only non-recomputable node) and a recomputable cast
(:mod:`coop.graph_capture.random_ops`).
"""

from __future__ import annotations

import contextlib
import logging
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from coop.errors import CaptureError, CoopError
from coop.graph_capture.attention import cuda_attention
from coop.graph_capture.batch import BatchLayout, positional_batch
from coop.graph_capture.batch_norm_ops import FUNCTIONAL_FORM
from coop.graph_capture.context import AUTOCAST_DEVICES
from coop.graph_capture.cuda_dispatch import cuda_dispatch
from coop.graph_capture.fsdp import (
    Sharding,
    hooks_suppressed,
    place_collectives,
    reduce_gradients,
    sharded_gradient_names,
    sharded_step_state,
)
from coop.graph_capture.meta import fake_cpu_state, weightless
from coop.graph_capture.random_ops import compact_random_masks

aten = torch.ops.aten
LossFn = Callable[..., torch.Tensor]


@dataclass
class TracedStep:
    """The joint GraphModule and the names of its flat inputs and outputs."""

    module: fx.GraphModule
    param_names: list[str]
    buffer_names: list[str]
    frozen_names: list[str]  # parameters that do not require grad: inputs, no gradient
    batch_size: int  # number of batch tensors
    output_grads: list[str]  # parameter name of each gradient output, in output order
    output_buffers: list[str]  # buffer name of each new-buffer output, in output order


def split_state(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Trainable parameters, buffers and frozen parameters (tied tensors listed once).

    Returns
    -------
    tuple of three dicts of str to torch.Tensor
        Parameters that require grad, buffers, and parameters that do not require grad, by name.
    """
    params = {k: v for k, v in model.named_parameters() if v.requires_grad}
    frozen = {k: v for k, v in model.named_parameters() if not v.requires_grad}
    buffers = dict(model.named_buffers())
    return params, buffers, frozen


@contextlib.contextmanager
def autocast_off() -> Iterator[None]:
    """Autocast disabled on every device type where it is enabled now (``torch.autocast(device, enabled=False)``)."""
    with contextlib.ExitStack() as stack:
        for device in AUTOCAST_DEVICES:
            if torch.is_autocast_enabled(device):
                stack.enter_context(torch.autocast(device, enabled=False))
        yield


def trace_step(model: nn.Module, batch: tuple[torch.Tensor, ...], loss_fn: LossFn | None,
               compact_masks: bool = True, layout: BatchLayout | None = None,
               device: str | None = None, sharding: Sharding | None = None) -> TracedStep:
    """Trace forward + backward of ``model`` on ``batch`` into a pure fx joint graph.

    Traced with fake tensors (``make_fx``), functionalized, batch norm made functional and dead code dropped.

    Parameters
    ----------
    model : nn.Module
        The model; at least one parameter must require grad.
    batch : tuple of torch.Tensor
        The batch's tensors (the step's inputs).
    loss_fn : LossFn or None
        ``loss_fn(model, *args, **kwargs)`` gives the loss; None: ``model(*args, **kwargs)`` does (``args`` and
        ``kwargs``: ``layout`` filled with ``batch``).
    compact_masks : bool
        With it each dropout draw becomes a bool mask plus a recomputable cast
        (:mod:`coop.graph_capture.random_ops`); without it the float draw is kept as traced.
    layout : BatchLayout or None
        How the model is called from the tensors (:mod:`coop.graph_capture.batch`: keyword arguments, nested
        containers, non-tensor values as constants of the program); None: ``model(*batch)``.
    device : str or None
        For a weightless model (:mod:`coop.graph_capture.meta`), the device the plan will run on: on a CUDA
        device attention, dropout and batch norm run the kernels CUDA would (:func:`coop.graph_capture.attention.cuda_attention`,
        :func:`coop.graph_capture.cuda_dispatch.cuda_dispatch`).
    sharding : Sharding or None
        The model's FSDP units (:func:`coop.graph_capture.fsdp.find_sharding`): the parameters' placeholders are
        the rank's shards, each unit is all-gathered before its first use and its gradients reduce-scattered after
        the last one (:mod:`coop.graph_capture.fsdp`); the gradient outputs are then one per unit.

    Returns
    -------
    TracedStep
        The fx module (flat inputs; loss, gradients and new buffers as outputs) and the names of the parameters,
        buffers and frozen parameters.

    Raises
    ------
    CaptureError
        When no parameter requires grad, a batch element is not a tensor, the loss is not a scalar or does not
        depend on a trainable parameter, the traced step still mutates a tensor in place, or tracing fails (the
        first line of the error, with a hint for data-dependent control flow).
    """
    params, buffers, frozen = split_state(model)
    if not params:
        raise CaptureError(f"{type(model).__name__} has no parameter that requires grad; nothing to train")
    for index, tensor in enumerate(batch):
        if not isinstance(tensor, torch.Tensor):
            raise CaptureError(f"batch element {index} is a {type(tensor).__name__}; pass tensors only")
    call = layout if layout is not None else positional_batch(batch).layout

    def loss_of(params: dict, buffers: dict, frozen: dict, *batch: torch.Tensor) -> tuple[torch.Tensor, dict]:
        state = {**params, **frozen, **buffers}
        with torch.nn.utils.stateless._reparametrize_module(model, state, tie_weights=True, strict=False):
            out = call.call(loss_fn, (model,), batch) if loss_fn is not None else call.call(model, (), batch)
            new_buffers = {name: _get(model, name) for name in buffers}
        return _scalar_loss(out, loss_fn), new_buffers

    def step(params: dict, buffers: dict, frozen: dict, *batch: torch.Tensor) -> tuple:
        by_unit: dict[int, list[str]] = {}
        with torch.enable_grad():
            if sharding is not None:  # the placeholders are shards: gather each unit (coop.graph_capture.fsdp)
                full, by_unit = sharded_step_state(sharding, {**params, **frozen}, set(params))
                params, frozen = {n: full[n] for n in params}, {n: full[n] for n in frozen}
            loss, new_buffers = loss_of(params, buffers, frozen, *batch)
        if not loss.requires_grad:
            raise CaptureError(f"the loss of {type(model).__name__} does not depend on any trainable parameter "
                               "(computed under no_grad or detached?); compute it from the model's output")
        # create_graph=False, as in eager loss.backward(): autograd then calls the kernels eager
        # calls (silu_backward, not torch.func.grad's infinitely differentiable formula). An ambient
        # autocast covers the forward only, as PyTorch's AMP recipe runs it (backward outside autocast):
        # backward under autocast casts some grad kernels' inputs again (GPT-2 in bfloat16 on CPU: other
        # gradient bits than the recipe's)
        # a parameter the loss does not reach gets no gradient (None), as eager leaves its .grad untouched: a zero
        # gradient would change what an optimizer does with it (AdamW decays and moves a parameter with a zero grad)
        with autocast_off():
            grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        named = dict(zip(params, grads, strict=True))
        if sharding is not None:
            named = reduce_gradients(sharding, named, by_unit)
        return loss, named, new_buffers

    if sharding is not None:
        shards = sharding.shard_state()
        params, frozen = {n: shards[n] for n in params}, {n: shards[n] for n in frozen}

    names = call.tensor_paths
    try:
        with hooks_suppressed(sharding), tracing_logs_silenced():
            if weightless(model, batch):  # meta tensors: traced as fake CPU tensors (coop.graph_capture.meta)
                target = step if device is None or torch.device(device).type != "cuda" else _with_cuda_kernels(step)
                module = _traced(target, *fake_cpu_state(params, buffers, frozen, batch))
            else:
                module = _traced(step, params, buffers, frozen, *_distinct_storages(batch))
    except CoopError:
        raise
    except Exception as exc:  # noqa: BLE001 - tracing fails with many types; report the first line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        hint = "data-dependent control flow (a Python branch on a tensor value) cannot be captured; " if _data_dependent(exc) else ""
        dtypes = _batch_dtype_mismatch(batch, names, params) if _names_dtypes(exc) else ""
        raise CaptureError(f"cannot trace the training step of {type(model).__name__}: {hint}{type(exc).__name__}: "
                           f"{first}{f' ({dtypes})' if dtypes else ''}") from None
    _refuse_mixed_dtypes(module.graph, type(model).__name__, names, params, batch)
    _make_pure(module, compact_masks, sharding)
    return TracedStep(
        module=module,
        param_names=list(params),
        buffer_names=list(buffers),
        frozen_names=list(frozen),
        batch_size=len(batch),
        output_grads=list(params) if sharding is None else sharded_gradient_names(sharding, set(params)),
        output_buffers=list(buffers),
    )


def _make_pure(module: fx.GraphModule, compact_masks: bool, sharding: Sharding | None) -> None:
    """The traced step made a pure joint graph (:func:`trace_step`'s last passes): batch norm functional, no
    in-place mutation left (CaptureError otherwise), compact dropout masks, dead code dropped, an FSDP step's
    collectives placed; flat inputs and a flat list of outputs."""
    _functionalize_batch_norm(module.graph)
    _functionalize_vendor_batch_norm(module.graph)
    _refuse_mutations(module.graph)
    if compact_masks:
        compact_random_masks(module.graph)
    _drop_dead_code(module.graph)
    if sharding is not None:
        place_collectives(module.graph)
    module.graph._codegen = fx.graph.CodeGen()  # flat inputs, flat list of outputs
    module.graph.lint()
    module.recompile()


#: The loggers of torch's tracing machinery: a meta function that raises is logged there with its whole traceback
#: (``failed while attempting to run meta for aten.mm.default``, ~20 lines) before the error reaches coop, which
#: reports it in one line.
TRACING_LOGGERS = ("torch._subclasses", "torch.fx.experimental", "torch._functorch", "torch._prims_common",
                   "torch._refs", "torch._decomp")


@contextlib.contextmanager
def tracing_logs_silenced() -> Iterator[None]:
    """torch's tracing loggers (:data:`TRACING_LOGGERS` and their children) above CRITICAL while inside, then as
    they were: a failed trace is reported once, by coop, in one line."""
    manager = logging.Logger.manager
    names = {name for name in manager.loggerDict if name.startswith(TRACING_LOGGERS)} | set(TRACING_LOGGERS)
    loggers = [logging.getLogger(name) for name in sorted(names)]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


#: Ops whose floating-point tensor arguments must share one dtype in eager PyTorch ("mat1 and mat2 must have the same
#: dtype"); their meta functions do not all check it, so a fake trace passes where the real step fails.
SAME_DTYPE_OPS = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
                            aten.addbmm.default, aten.mv.default, aten.addmv.default, aten.dot.default,
                            aten.vdot.default, aten.convolution.default, aten._convolution.default})


def _floating_dtypes(node: fx.Node) -> list[torch.dtype]:
    """The dtypes of ``node``'s floating-point tensor arguments, in order (from the traced values)."""
    dtypes = []
    for arg in node.all_input_nodes:
        value = arg.meta.get("val")
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            dtypes.append(value.dtype)
    return dtypes


def _refuse_mixed_dtypes(graph: fx.Graph, model_name: str, names: list[str], params: dict[str, torch.Tensor],
                         batch: tuple[torch.Tensor, ...]) -> None:
    """Refuse in one line a step whose matrix product or convolution reads two floating dtypes (a float64 batch into
    a float32 model), naming the batch input that brings the other dtype, as eager PyTorch would fail at that op."""
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in SAME_DTYPE_OPS:
            continue
        dtypes = _floating_dtypes(node)
        if len(set(dtypes)) < 2:
            continue
        reaching = _batch_inputs_reaching(graph, node, len(batch))
        mismatch = _batch_dtype_mismatch(batch, names, params, only=reaching) or _batch_dtype_mismatch(batch, names,
                                                                                                      params)
        if not mismatch:
            mismatch = f"{node.target} reads {' and '.join(_dtype_name(d) for d in dict.fromkeys(dtypes))} values"
        raise CaptureError(f"cannot trace the training step of {model_name}: {mismatch}")


def _batch_inputs_reaching(graph: fx.Graph, node: fx.Node, batch_size: int) -> set[int]:
    """The indices of the batch tensors that ``node`` reads, directly or through other nodes (the batch's
    placeholders are the graph's last ``batch_size``)."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    index = {n: i for i, n in enumerate(placeholders[len(placeholders) - batch_size:])} if batch_size else {}
    reached: set[int] = set()
    seen: set[fx.Node] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if current in index:
            reached.add(index[current])
        stack.extend(current.all_input_nodes)
    return reached


def _batch_dtype_mismatch(batch: tuple[torch.Tensor, ...], names: list[str], params: dict[str, torch.Tensor], *,
                          only: set[int] | None = None) -> str:
    """``"batch[0] is float64 but the model's parameters are float32: ..."`` when floating batch tensors (those of
    ``only``, by index, where given) differ in dtype from the model's (one) floating parameter dtype; '' otherwise."""
    model_dtypes = {p.dtype for p in params.values() if p.is_floating_point()}
    if len(model_dtypes) != 1:
        return ""
    model_dtype = next(iter(model_dtypes))
    odd = [(name, tensor.dtype) for i, (name, tensor) in enumerate(zip(names, batch, strict=False))
           if (only is None or i in only) and isinstance(tensor, torch.Tensor) and tensor.is_floating_point()
           and tensor.dtype != model_dtype]
    if not odd:
        return ""
    inputs = ", ".join(f"{name} is {_dtype_name(dtype)}" for name, dtype in odd)
    return (f"{inputs} but the model's parameters are {_dtype_name(model_dtype)}: cast the batch "
            f"(.to(torch.{_dtype_name(model_dtype)})) or the model (model.to(torch.{_dtype_name(odd[0][1])}))")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _names_dtypes(exc: Exception) -> bool:
    text = str(exc).lower()
    return "dtype" in text or "scalar type" in text or ("type" in text and "should be the same" in text)


def _with_cuda_kernels(step: Callable[..., Any]) -> Callable[..., Any]:
    """``step`` with attention, dropout and batch norm calling the kernels a CUDA device would
    (:mod:`coop.graph_capture.attention`, :mod:`coop.graph_capture.cuda_dispatch`)."""

    def on_cuda(*args: Any) -> Any:
        with cuda_attention(), cuda_dispatch():
            return step(*args)

    return on_cuda


def _distinct_storages(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The batch for tracing, each tensor with a storage of its own: a tensor passed twice (transformers'
    ``labels=input_ids``) would be one fake value read by two placeholders. Tracing reads no data, so a repeat is
    replaced by an uninitialised tensor of its shape, strides and dtype; the replay reads each as given."""
    seen: set[int] = set()
    distinct = []
    for tensor in batch:
        storage = tensor.untyped_storage().data_ptr()
        if storage in seen and tensor.untyped_storage().nbytes():
            tensor = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device=tensor.device)
        seen.add(storage)
        distinct.append(tensor)
    return tuple(distinct)


def _traced(step: Callable[..., Any], *args: Any) -> fx.GraphModule:
    """``step`` traced on fake tensors (``args``' own fake mode where they are fake already); where the model
    branches on a batch value, traced again the way ``torch.export`` traces (``torch.compiler.is_compiling()``
    true), which libraries read to skip such branches (transformers' check that an attention mask has no
    padding)."""

    def trace() -> fx.GraphModule:
        return make_fx(_functionalized(step), tracing_mode="fake")(*args)

    try:
        return trace()
    except CoopError:
        raise
    except Exception as exc:  # retried only for a data-dependent branch, else re-raised
        if not _data_dependent(exc):
            raise
    previous = torch.compiler._is_compiling_flag
    torch.compiler._is_compiling_flag = True
    try:
        return trace()
    finally:
        torch.compiler._is_compiling_flag = previous


def _functionalized(step: Callable[..., Any]) -> Callable[..., Any]:
    """``step`` with in-place ops replaced by out-of-place ones, and autograd still running inside.

    ``torch.func.functionalize`` is a functorch transform, inside which autograd cannot start
    (no ``requires_grad`` leaves), and ``torch.func.grad`` differentiates with create_graph
    semantics, which records other kernels than eager's backward. So this enables functionalization
    below autograd directly, as AOTAutograd's joint tracing does: each input becomes a functional
    wrapper with the input's autograd metadata, autograd differentiates those leaves, and the
    functionalization layer underneath turns every mutation (``relu_``, ``add_`` on a buffer)
    into an out-of-place op. New buffer values are outputs of the step, so mutated inputs are not
    written back.
    """
    def functional_step(*args: Any) -> Any:
        flat, spec = pytree.tree_flatten(args)
        torch._enable_functionalization(reapply_views=True)
        try:
            wrapped = [_to_functional(a) if isinstance(a, torch.Tensor) else a for a in flat]
            outputs = step(*pytree.tree_unflatten(wrapped, spec))
            return pytree.tree_map_only(torch.Tensor, _from_functional, outputs)
        finally:
            torch._disable_functionalization()

    return functional_step


def _to_functional(tensor: torch.Tensor) -> torch.Tensor:
    wrapper = torch._to_functional_tensor(tensor)
    torch._mirror_autograd_meta_to(tensor, wrapper)  # requires_grad leaves stay leaves for autograd
    return wrapper


def _from_functional(tensor: torch.Tensor) -> torch.Tensor:
    if not torch._is_functional_tensor(tensor):
        return tensor
    torch._sync(tensor)
    return torch._from_functional_tensor(tensor)


def _get(model: nn.Module, dotted: str) -> torch.Tensor:
    owner_name, _, leaf = dotted.rpartition(".")
    owner = model.get_submodule(owner_name) if owner_name else model
    return getattr(owner, leaf)


def _scalar_loss(out: Any, loss_fn: LossFn | None) -> torch.Tensor:
    loss = out
    if not isinstance(out, torch.Tensor):
        loss = getattr(out, "loss", None)
        if loss is None and isinstance(out, dict):
            loss = out.get("loss")
    if not isinstance(loss, torch.Tensor):
        who = "loss_fn" if loss_fn is not None else "the model"
        if loss is None and (hasattr(out, "loss") or isinstance(out, dict) and "loss" in out):
            raise CaptureError(f"{who} returned {type(out).__name__} with loss None (no labels in the batch?); pass "
                               "labels in the batch, or a loss_fn")
        raise CaptureError(f"{who} returned {type(out).__name__}, not a scalar tensor or an object with .loss; pass loss_fn")
    if loss.dim() != 0:
        raise CaptureError(f"the loss has shape {tuple(loss.shape)}, not a scalar; reduce it (e.g. .mean()) in loss_fn")
    return loss


def _data_dependent(exc: Exception) -> bool:
    text = f"{type(exc).__name__} {exc}".lower()
    return any(key in text for key in ("data-dependent", "data dependent", "datadependent", "dynamic output shape"))


def _functionalize_batch_norm(graph: fx.Graph) -> None:
    """native_batch_norm(training) -> _native_batch_norm_legit_functional, new stats as values."""
    for node in list(graph.nodes):
        if node.target is not aten.native_batch_norm.default:
            continue
        x, weight, bias, running_mean, running_var, training, momentum, eps = node.args
        if not training or running_mean is None or running_var is None:
            continue
        _with_statistics_as_values(graph, node, aten._native_batch_norm_legit_functional.default,
                                   (x, weight, bias, running_mean, running_var, True, momentum, eps), 3)


def _functionalize_vendor_batch_norm(graph: fx.Graph) -> None:
    """cudnn/miopen_batch_norm(training, running stats) -> coop's functional form, new stats as values.

    The vendor kernels update the running statistics in place without their schema saying so; their functional
    forms (:mod:`coop.graph_capture.batch_norm_ops`) run the same kernel on clones and return them, so that a
    recomputation cannot update the buffers twice and later readers, the step's new buffer values among them,
    read the new statistics as values."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in FUNCTIONAL_FORM:
            continue
        x, weight, bias, running_mean, running_var, training, momentum, eps = node.args
        if not training or running_mean is None or running_var is None:
            continue  # eval mode reads the statistics only
        functional_op, kernel_outputs = FUNCTIONAL_FORM[node.target]
        _with_statistics_as_values(graph, node, functional_op,
                                   (x, weight, bias, running_mean, running_var, momentum, eps), kernel_outputs)


def _with_statistics_as_values(graph: fx.Graph, node: fx.Node, functional_op: Any, args: tuple,
                               kernel_outputs: int) -> None:
    """Replace the batch norm ``node`` (args: x, weight, bias, running_mean, running_var, ...) by ``functional_op``
    on ``args``, whose outputs are ``node``'s first ``kernel_outputs`` and then the new running mean and variance,
    each taken by a getitem that later readers of the old statistics read instead."""
    running_mean, running_var = node.args[3], node.args[4]
    with graph.inserting_after(node):
        functional = graph.call_function(functional_op, args)
    node.replace_all_uses_with(functional)
    fake_mean, fake_var = running_mean.meta["val"].clone(), running_var.meta["val"].clone()
    functional.meta = {**node.meta, "val": (*node.meta["val"][:kernel_outputs], fake_mean, fake_var)}
    graph.erase_node(node)
    with graph.inserting_after(functional):
        new_mean = graph.call_function(operator.getitem, (functional, kernel_outputs))
    with graph.inserting_after(new_mean):
        new_var = graph.call_function(operator.getitem, (functional, kernel_outputs + 1))
    new_mean.meta["val"], new_var.meta["val"] = fake_mean, fake_var
    # Readers after this op saw the mutated statistics: they now read the new values.
    _redirect_later_uses(graph, running_mean, new_mean, after=new_var)
    _redirect_later_uses(graph, running_var, new_var, after=new_var)


def _redirect_later_uses(graph: fx.Graph, old: fx.Node, new: fx.Node, after: fx.Node) -> None:
    seen_after = False
    for node in graph.nodes:
        if node is after:
            seen_after = True
            continue
        if seen_after and old in node.all_input_nodes:
            node.replace_input_with(old, new)


def _mutates(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return False
    return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def _refuse_mutations(graph: fx.Graph) -> None:
    for node in graph.nodes:
        if node.op == "call_function" and _mutates(node):
            raise CaptureError(
                f"the training step mutates a tensor in place with {node.target} ({node.name}), which coop cannot "
                "replay soundly; use the out-of-place op"
            )


def is_random(node: fx.Node) -> bool:
    """Random ops (dropout, bernoulli, rand*): replaying them must not draw new numbers.

    The one definition of a random op: the lowering marks the Graph node it creates (``Node.random``),
    and everything that reads the Graph reads that flag.

    Parameters
    ----------
    node : fx.Node
        A node of a traced step.

    Returns
    -------
    bool
        Whether its target is tagged ``nondeterministic_seeded``.
    """
    tags = getattr(node.target, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


def _drop_dead_code(graph: fx.Graph) -> None:
    """Remove unused pure nodes; unused random ops stay, since they advance the RNG like eager."""
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and not node.users and not is_random(node):
            graph.erase_node(node)


def flat_names(params: dict, buffers: dict, frozen: dict, batch_size: int) -> list[tuple[str, str]]:
    """(kind, name) of each flat placeholder, in the order make_fx lays them out.

    Parameters
    ----------
    params : dict
        Trainable parameters by name (kind ``"param"``).
    buffers : dict
        Buffers by name (kind ``"buffer"``).
    frozen : dict
        Frozen parameters by name (kind ``"frozen"``).
    batch_size : int
        The number of batch tensors (kind ``"input"``, named ``batch[i]``).

    Returns
    -------
    list of (str, str)
        ``(kind, name)`` per placeholder.
    """
    structure = ({k: ("param", k) for k in params}, {k: ("buffer", k) for k in buffers},
                 {k: ("frozen", k) for k in frozen}, *[("input", f"batch[{i}]") for i in range(batch_size)])
    leaves, _ = pytree.tree_flatten(structure, is_leaf=lambda x: isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str))
    return leaves
