"""How a batch reaches the model: positional and keyword arguments, nested containers, tensors and flags.

People pass batches in three forms: a dict of keyword arguments (``model(**batch)``, what a transformers
data collator yields), a tuple or list of positional arguments (``model(*batch)``), or a single tensor
(``model(batch)``). Each argument may nest tensors in dicts, tuples and lists, beside non-tensor values
(flags such as ``output_attentions=False``, ``None``). :func:`read_batch` reads one into a :class:`Batch`: its
tensors (the step's inputs, in a fixed order) and its :class:`BatchLayout` (the containers, with every
non-tensor value in place). The traced step calls the model through the layout, so the non-tensor values are
constants of the captured program: they are part of a plan's signature, like the tensors' shapes.

``plan.step`` reads its arguments against the plan's layout (:func:`read_step_batch`): the batch as it was
given to ``coop.plan`` (``plan.step(batch)``) or spread as the model takes it (``plan.step(*batch)``,
``plan.step(**batch)``). Another structure (other keys, a tensor where the plan had a flag or the other way
round) is refused in one line; other flag values are a new layout, which the planner re-plans for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch.utils import _pytree as pytree

from coop.errors import CaptureError, CoopError

#: The non-tensor values a batch may hold: they are baked into the captured program and compared between steps.
FLAG_TYPES: tuple[type, ...] = (type(None), bool, int, float, str)


class _TensorSlot:
    """The place of a tensor among a layout's leaves (the tensors themselves are the step's inputs)."""

    def __repr__(self) -> str:
        return "<tensor>"

    def __reduce__(self) -> str:  # copies and pickles stay the one slot that ``is TENSOR`` recognises
        return "TENSOR"


TENSOR = _TensorSlot()


@dataclass(frozen=True)
class BatchLayout:
    """The structure of a batch without its tensors: how ``model(*args, **kwargs)`` is called from them.

    ``spec`` is the pytree structure of ``(args, kwargs)`` (keyword arguments in key order); ``leaves`` holds,
    per leaf, :data:`TENSOR` or the non-tensor value found there.
    """

    spec: pytree.TreeSpec
    leaves: tuple[Any, ...]

    @cached_property
    def key(self) -> tuple:
        """What a captured step is specific to: the structure and every non-tensor value with its type (so that
        ``True`` and ``1`` differ)."""
        return (self.spec, tuple(leaf if leaf is TENSOR else (type(leaf), leaf) for leaf in self.leaves))

    @cached_property
    def paths(self) -> tuple[str, ...]:
        """Each leaf's name as the user wrote it: ``batch['input_ids']``, ``batch[0]``, ``batch['pixel'][1]``."""
        return _paths(self.spec)

    @property
    def tensor_paths(self) -> list[str]:
        """The names of the tensor leaves, in input order."""
        return [path for path, leaf in zip(self.paths, self.leaves, strict=True) if leaf is TENSOR]

    @cached_property
    def keywords(self) -> tuple[str, ...] | None:
        """The keys of a batch of keyword arguments that nests nothing (a collator's dict), in key order; else
        None."""
        args, kwargs = pytree.tree_unflatten(list(self.leaves), self.spec)
        if args or any(isinstance(value, (Mapping, tuple, list)) for value in kwargs.values()):
            return None
        return tuple(kwargs)

    @cached_property
    def positional_only(self) -> bool:
        """Whether the batch is positional arguments of tensors alone (coop's original ``model(*batch)``)."""
        args, kwargs = pytree.tree_unflatten(list(self.leaves), self.spec)
        return not kwargs and all(arg is TENSOR for arg in args)

    def arguments(self, tensors: tuple[Any, ...] | list[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` with ``tensors`` (or proxies of them) in the tensor slots, in order.

        Parameters
        ----------
        tensors : tuple or list
            One value per tensor leaf, in input order.

        Returns
        -------
        tuple of (tuple, dict)
            The positional and keyword arguments of the model's call.
        """
        values = iter(tensors)
        leaves = [next(values) if leaf is TENSOR else leaf for leaf in self.leaves]
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return tuple(args), dict(kwargs)

    def call(self, function: Callable[..., Any], prefix: tuple[Any, ...], tensors: tuple[Any, ...]) -> Any:
        """``function(*prefix, *args, **kwargs)`` for this layout filled with ``tensors``.

        Parameters
        ----------
        function : callable
            The model, or a ``loss_fn`` (then ``prefix`` is ``(model,)``).
        prefix : tuple
            Positional arguments before the batch's own.
        tensors : tuple
            One value per tensor leaf, in input order.

        Returns
        -------
        Any
            What ``function`` returns.
        """
        args, kwargs = self.arguments(tensors)
        return function(*prefix, *args, **kwargs)

    def flag_difference(self, other: BatchLayout) -> str:
        """'' when ``other`` holds the same non-tensor values; else the first that differs, in words.

        Parameters
        ----------
        other : BatchLayout
            A layout of the same structure (:func:`read_step_batch` refuses any other).

        Returns
        -------
        str
            E.g. ``"batch['output_attentions'] is True, the plan was made with False"``.
        """
        if other is self:
            return ""
        for index, (mine, theirs) in enumerate(zip(self.leaves, other.leaves, strict=True)):
            if mine is not TENSOR and (type(mine), mine) != (type(theirs), theirs):
                return f"{self.paths[index]} is {theirs!r}, the plan was made with {mine!r}"
        return ""

    def to_dict(self) -> dict[str, Any]:
        """The layout as JSON-ready data (a saved plan's ``layout``): :func:`layout_from_dict` reads it back."""
        return {"spec": pytree.treespec_dumps(self.spec),
                "tensor": [leaf is TENSOR for leaf in self.leaves],
                "values": [None if leaf is TENSOR else leaf for leaf in self.leaves]}


@dataclass(frozen=True)
class Batch:
    """A batch as coop read it: its tensors, in input order, and its layout."""

    layout: BatchLayout
    tensors: tuple[torch.Tensor, ...]

    @property
    def key(self) -> tuple:
        """The layout's key and every tensor's shape and dtype: what a captured step is specific to."""
        return (self.layout.key, tuple((tuple(t.shape), t.dtype) for t in self.tensors))


def positional_batch(tensors: tuple[torch.Tensor, ...]) -> Batch:
    """``tensors`` as positional arguments, ``model(*tensors)``.

    Parameters
    ----------
    tensors : tuple of torch.Tensor
        The batch's tensors.

    Returns
    -------
    Batch
        The batch read as a tuple (:func:`read_batch`).
    """
    return read_batch(tuple(tensors))


def read_batch(example_batch: Any) -> Batch:
    """Read a batch as ``coop.plan`` and ``coop.capture`` take it.

    A dict (any mapping) is keyword arguments (``model(**batch)``), a tuple or list positional ones
    (``model(*batch)``), anything else one positional argument (``model(batch)``); a :class:`Batch` is returned
    as it is. Arguments may nest tensors in dicts, tuples and lists, beside ``None`` and bool, int, float or str
    values (:data:`FLAG_TYPES`).

    Returns
    -------
    Batch
        Its tensors and layout.

    Raises
    ------
    CaptureError
        When a leaf is neither a tensor nor a flag, naming where it is and the fix.
    """
    if isinstance(example_batch, Batch):
        return example_batch
    return _read(*_as_arguments(example_batch))


def read_step_batch(args: tuple[Any, ...], kwargs: dict[str, Any], planned: BatchLayout) -> Batch:
    """Read ``plan.step(*args, **kwargs)`` against the plan's layout.

    The arguments are the batch spread as the model takes it (``plan.step(*batch)``, ``plan.step(**batch)``) or,
    as one argument, the batch as it was given to ``coop.plan`` (``plan.step(batch)``); the reading whose
    structure is the plan's is taken.

    Parameters
    ----------
    args : tuple
        ``plan.step``'s positional arguments.
    kwargs : dict
        ``plan.step``'s keyword arguments.
    planned : BatchLayout
        The layout the plan was captured with.

    Returns
    -------
    Batch
        The step's tensors and layout: the plan's structure, its non-tensor values possibly other than the
        plan's (:meth:`BatchLayout.flag_difference`; the planner re-plans for them).

    Raises
    ------
    CoopError
        When the batch's structure is not the plan's (other keys or lengths, a tensor where the plan has a
        non-tensor value or the other way round), or it holds a value that is neither a tensor nor a flag.
    """
    if not kwargs and len(args) == 1 and isinstance(args[0], Batch):
        return args[0]
    if not kwargs and planned.positional_only and len(args) == len(planned.leaves) and \
            all(isinstance(arg, torch.Tensor) for arg in args):
        return Batch(planned, tuple(args))  # model(*batch): no containers to read
    readings = [(tuple(args), dict(kwargs))]
    if not kwargs and len(args) == 1 and isinstance(args[0], (Mapping, tuple, list)):
        readings.insert(0, _as_arguments(args[0]))  # as coop.plan reads its example batch
    leaves, spec = _flat_keywords(readings, planned)
    for reading in readings if spec is None else ():
        leaves, spec = _flatten(*reading)
        if spec == planned.spec:
            break
    else:
        if spec is None:
            leaves, spec = _flatten(*readings[0])
    if spec != planned.spec:
        layout = _layout(leaves, spec, "plan.step: ")
        raise CoopError(_structure_difference(layout, planned))
    tensors = []
    for index, (now, then) in enumerate(zip(leaves, planned.leaves, strict=True)):
        if isinstance(now, torch.Tensor) != (then is TENSOR):
            _check_leaf(now, planned.paths[index], "plan.step: ")
            what = "a tensor" if isinstance(now, torch.Tensor) else f"{now!r} ({type(now).__name__})"
            planned_what = "a tensor" if then is TENSOR else f"the value {then!r}"
            raise CoopError(f"plan.step got {what} at {planned.paths[index]}, where the plan has {planned_what}; "
                            "pass the batch as coop.plan got it, or make a new plan with coop.plan for this batch")
        if then is TENSOR:
            tensors.append(now)
        elif (type(now), now) != (type(then), then):  # another flag: a layout of its own (the planner re-plans)
            return Batch(_layout(leaves, spec, "plan.step: "), tuple(t for t in leaves if isinstance(t, torch.Tensor)))
    return Batch(planned, tuple(tensors))


def layout_from_dict(data: Mapping[str, Any]) -> BatchLayout:
    """The layout :meth:`BatchLayout.to_dict` wrote.

    Parameters
    ----------
    data : Mapping
        ``{"spec", "paths", "tensor", "values"}``.

    Returns
    -------
    BatchLayout
        The layout.

    Raises
    ------
    CoopError
        When the data is not a layout.
    """
    try:
        spec = pytree.treespec_loads(data["spec"])
        leaves = tuple(TENSOR if is_tensor else value
                       for is_tensor, value in zip(data["tensor"], data["values"], strict=True))
    except (KeyError, TypeError, ValueError) as exc:
        raise CoopError(f"the saved batch layout cannot be read ({type(exc).__name__}: {exc}); make a new plan "
                        "with coop.plan") from None
    if spec.num_leaves != len(leaves):
        raise CoopError("the saved batch layout is inconsistent; make a new plan with coop.plan")
    return BatchLayout(spec, leaves)


def _as_arguments(batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(batch, Mapping):
        keys = list(batch)
        if not all(isinstance(key, str) for key in keys):
            bad = next(key for key in keys if not isinstance(key, str))
            raise CaptureError(f"the batch is a mapping with the key {bad!r}, not a str: a dict batch is the "
                               "model's keyword arguments; use str keys, or pass a tuple")
        return (), dict(batch)
    if isinstance(batch, (tuple, list)):
        return tuple(batch), {}
    return (batch,), {}


def _sorted(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments in key order: ``model(**batch)`` ignores their order, so one signature serves every order."""
    return {key: kwargs[key] for key in sorted(kwargs)}


def _is_leaf(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def _flatten(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], pytree.TreeSpec]:
    return pytree.tree_flatten((args, _sorted(kwargs)), is_leaf=_is_leaf)


def _flat_keywords(readings: list[tuple[tuple[Any, ...], dict[str, Any]]],
                   planned: BatchLayout) -> tuple[list[Any], pytree.TreeSpec | None]:
    """The plan's leaves read straight from a dict that nests nothing, as the plan's does (no pytree walk on
    every step); ``([], None)`` where no reading is such a dict."""
    if planned.keywords is None:
        return [], None
    for args, kwargs in readings:
        if not args and len(kwargs) == len(planned.keywords) and all(key in kwargs for key in planned.keywords):
            leaves = [kwargs[key] for key in planned.keywords]
            if not any(isinstance(leaf, (Mapping, tuple, list)) for leaf in leaves):
                return leaves, planned.spec
    return [], None


def _read(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Batch:
    leaves, spec = _flatten(args, kwargs)
    return Batch(_layout(leaves, spec, ""), tuple(leaf for leaf in leaves if isinstance(leaf, torch.Tensor)))


def _layout(leaves: list[Any], spec: pytree.TreeSpec, where: str) -> BatchLayout:
    """The layout of flattened leaves; a leaf that is neither a tensor nor a flag is refused, named by its path."""
    layout = BatchLayout(spec, tuple(TENSOR if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves))
    for index, leaf in enumerate(leaves):
        _check_leaf(leaf, "", where, layout, index)
    return layout


def _check_leaf(leaf: Any, path: str, where: str, layout: BatchLayout | None = None, index: int = 0) -> None:
    if isinstance(leaf, (torch.Tensor, *FLAG_TYPES)):
        return
    name = path or (layout.paths[index] if layout is not None else "a batch value")
    error = CoopError if where else CaptureError
    raise error(f"{where}{name} holds a {type(leaf).__name__}, which coop cannot pass to the model; put a tensor "
                "there (torch.as_tensor), or None, a bool, int, float or str, in dicts, tuples or lists")


def _paths(spec: pytree.TreeSpec) -> tuple[str, ...]:
    """``batch[0]`` for a positional argument, ``batch['input_ids']`` for a keyword one, then the nesting."""
    slots = pytree.tree_unflatten([object() for _ in range(spec.num_leaves)], spec)
    with_paths, _ = pytree.tree_flatten_with_path(slots)
    names = []
    for keys, _ in with_paths:
        _, argument, *inner = keys  # (args, kwargs) -> which of them, then the argument's index or key
        names.append("batch" + pytree.keystr((argument, *inner)))
    return tuple(names)


def _structure_difference(layout: BatchLayout, planned: BatchLayout) -> str:
    got, want = layout.tensor_paths, planned.tensor_paths
    if len(got) != len(want):
        return (f"plan.step got {len(got)} batch tensors ({', '.join(got) or 'none'}), the plan was made for "
                f"{len(want)} ({', '.join(want)}); pass the batch as coop.plan got it, or make a new plan with "
                "coop.plan for this batch")
    return (f"plan.step got a batch laid out as {', '.join(layout.paths) or 'nothing'}, the plan was made for "
            f"{', '.join(planned.paths)}; pass the batch as coop.plan got it, or make a new plan with coop.plan "
            "for this batch")


__all__ = ["FLAG_TYPES", "TENSOR", "Batch", "BatchLayout", "layout_from_dict", "positional_batch", "read_batch",
           "read_step_batch"]
