"""Capture without weights: a model on the meta device, planned for the device it will run on.

A model built under ``torch.device("meta")`` (or moved there) has parameters with shapes and dtypes but no
data, so a 7B-parameter step can be captured on a laptop: tracing already runs on fake tensors, and the
Graph's bytes and analytic costs depend on shapes and dtypes only. The meta tensors are handed to the tracer
as fake tensors on the CPU (:func:`fake_cpu_state`), so the model's code runs as it does for a CPU model with
weights (a tensor it makes inside its forward, such as transformers' empty KV-cache tensor, is a CPU constant
there too) and the Graph is the one the real CPU model gives, node for node (tested). What a meta capture
cannot know is the device the step will run on, which the Graph records per value (contract 3's budgets are
bytes of that device): the caller names it (``coop.capture(..., device="cuda")``) and every value is recorded
there. Tracing on CPU is the one path on every machine (a fake CUDA tensor on a CPU-only build aborts the
process); where the real step on that device runs other ops (a fused attention kernel), the load check says
so. What needs data is refused in one line: profiling (timing kernels), the implementations whose
offer reads parameter values (``alternatives``), and a step (:func:`refuse_weightless_step`). A plan made so is
saved (``Plan.save``) and loaded on the real model (``coop.load_plan``), which captures the real step again and
checks that its graph has the same structure digest before it replays. Build the model under
``with torch.device("meta"):`` rather than moving it there: ``model.to("meta")`` makes new Parameters, which
unties tied weights (GPT-2's and BERT's embeddings and output layer), and the plan then describes another
model (``load_plan`` refuses it, naming the ``param`` counts that differ).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from coop.errors import CaptureError, CoopError
from coop.graph import Graph

META = "meta"


def weightless(model: nn.Module, tensors: Iterable[torch.Tensor] = ()) -> bool:
    """Whether the model's parameters or buffers, or a batch tensor, live on the meta device.

    Parameters
    ----------
    tensors : iterable of torch.Tensor
        The batch's tensors.

    Returns
    -------
    bool
        True where any of them is a meta tensor (no data).
    """
    state = (t for t in (*model.parameters(), *model.buffers()))
    return any(t.is_meta for t in (*state, *tensors))


def check_weightless_capture(model: nn.Module, tensors: tuple[torch.Tensor, ...], device: str | None, *,
                             profile: bool, alternatives: bool) -> bool:
    """Refuse, in one line, what a capture of this model cannot do; True where it is a weightless capture.

    Parameters
    ----------
    tensors : tuple of torch.Tensor
        The batch's tensors.
    device : str or None
        The device the plan will run on (``capture(device=...)``).
    profile, alternatives : bool
        The capture's options that read data.

    Returns
    -------
    bool
        Whether the model or batch is on the meta device.

    Raises
    ------
    CaptureError
        A meta model or batch without ``device``, with ``profile`` or ``alternatives``; ``device`` given for a
        model with weights; a ``device`` torch does not know.
    """
    meta = weightless(model, tensors)
    if device is not None:
        try:
            torch.device(device)
        except (RuntimeError, ValueError):
            raise CaptureError(f"device={device!r} is not a torch device; name the one the plan will run on "
                               "('cuda', 'cuda:0' or 'cpu')") from None
    if not meta:
        if device is not None:
            raise CaptureError("device= names where a model on the meta device will run; this model has weights, and "
                               "its step is captured where they are: drop device (or move the model)")
        return False
    if device is None:
        raise CaptureError("the model or batch is on the meta device (no weights): pass device='cuda' (or 'cpu'), the "
                           "device the plan will run on")
    if profile:
        raise CaptureError("profile=True times kernels on real data, and the model is on the meta device; capture "
                           "without profile (analytic costs)")
    if alternatives:
        raise CaptureError("alternatives=True reads parameter values, and the model is on the meta device; capture "
                           "without alternatives")
    return True


def fake_cpu_state(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], frozen: dict[str, torch.Tensor],
                   batch: tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
    """The tracer's arguments for a weightless step: every tensor a fake CPU tensor of one fake mode.

    Parameters
    ----------
    params, buffers, frozen : dict of str to torch.Tensor
        The model's trainable parameters, buffers and frozen parameters (meta or CPU tensors).
    batch : tuple of torch.Tensor
        The batch's tensors.

    Returns
    -------
    tuple
        ``(params, buffers, frozen, *batch)`` as fake tensors on the CPU, trainable ones requiring grad; a tensor
        given twice (``labels=input_ids``) becomes two fakes, two inputs of the step.
    """
    mode = FakeTensorMode()
    cpu = torch.device("cpu")

    def fake(tensor: torch.Tensor) -> torch.Tensor:
        shape = tensor.detach().to(META) if not tensor.is_meta else tensor.detach()
        made = FakeTensor(mode, torch.empty_strided(shape.size(), shape.stride(), dtype=shape.dtype, device=META), cpu)
        return made.requires_grad_(tensor.requires_grad) if tensor.requires_grad else made

    return ({k: fake(v) for k, v in params.items()}, {k: fake(v) for k, v in buffers.items()},
            {k: fake(v) for k, v in frozen.items()}, *(fake(t) for t in batch))


def on_device(graph: Graph, device: str) -> Graph:
    """``graph`` (of a weightless capture, traced on fake CPU tensors) with every value recorded on ``device``.

    Parameters
    ----------
    graph : Graph
        A graph captured from a weightless model.
    device : str
        The device the plan will run on.

    Returns
    -------
    Graph
        The same graph, its devices replaced (and ``graph.meta["captured_on"] = "meta"``) but for the host
        outputs of CUDA kernels (``graph.meta["host_outputs"]``: efficient attention's philox seed and offset).
    """
    target = str(torch.device(device))
    data = graph.model_dump()
    host = set((data.get("meta") or {}).get("host_outputs", ()))  # a kernel's host outputs stay there
    for node in data["nodes"]:
        if node.get("device") is not None and node["id"] not in host:
            node["device"] = target
    data["meta"] = {**(data.get("meta") or {}), "captured_on": META}
    return Graph.model_validate(data)


def refuse_weightless_step(devices: tuple[str, ...]) -> None:
    """Refuse, in one line, a training step of a model still on the meta device.

    Parameters
    ----------
    devices : tuple of str
        The devices of the model's tensors and the batch (``TrainingContext.devices``).

    Raises
    ------
    CoopError
        Where one of them is the meta device.
    """
    if META in devices:
        raise CoopError("the model or batch is on the meta device (no weights), so no step can run; save the plan "
                        "(plan.save) and load it on the real model with coop.load_plan")


__all__ = ["META", "check_weightless_capture", "fake_cpu_state", "on_device", "refuse_weightless_step", "weightless"]
