"""What the CUDA caching allocator holds beyond a plan's live bytes, and the setting that bounds it.

A plan's budget must bound what the process takes from the device (``max_memory_reserved``: what
decides an out-of-memory error), not only the live bytes the simulator counts. Measured on an H100
(torch 2.11): with the allocator's default settings a ResNet-50 replay reserved 1.25x-1.56x
its prediction while allocating 0.97-0.99x of it: blocks of many sizes, freed in the schedule's
order, leave segments that no later request fits (fragmentation). With expandable segments
(``expandable_segments:True``: one virtual range per stream and pool, grown and shrunk by mapping
pages) the same replays reserved 1.01-1.03x.

So for a step that holds CUDA values :func:`prepare_allocator` turns expandable segments on, unless
the user's configuration (``PYTORCH_ALLOC_CONF``, or its older name ``PYTORCH_CUDA_ALLOC_CONF``)
already says ``expandable_segments`` either way or picks another backend (``cudaMallocAsync``):
a user's setting is respected, and the plan reports what it assumed (:class:`AllocatorAssumption`,
``Plan.summary()["allocator"]``). It also names the bytes the planner keeps free of the budget:
with expandable segments, each stream's pool maps whole pages, so a step may hold up to one
partly used page of the large pool (``large_segment_size_mb``, 20 MiB by default) and one of the
small pool (2 MiB) beyond its live bytes, per CUDA device and stream (the copy stream is a second
stream). The planner plans within the budget minus this headroom, so that live bytes plus page
rounding stay within the budget. Without expandable segments no headroom bounds fragmentation,
and the assumption says so instead of pretending.

A step with no CUDA value needs none of this (the CPU allocator returns every storage to the
system allocator): the same function returns "not applicable" with no headroom, which is how the
tests on machines without a GPU take this path. The setter is injectable so that they can check
what would be set.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from coop.graph import Graph

#: Pages of the small pool (allocations up to 1 MiB): ``kSmallBuffer`` in c10/core/AllocatorConfig.h.
SMALL_PAGE_BYTES = 2 * 1024 * 1024
#: Pages of the large pool by default: ``large_segment_size_`` in c10/core/AllocatorConfig.h (20 MB).
DEFAULT_LARGE_PAGE_BYTES = 20 * 1024 * 1024
#: The environment variables the allocator reads, the newer name first (it wins when both are set).
CONF_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
EXPANDABLE = "expandable_segments:True"


@dataclass(frozen=True)
class AllocatorAssumption:
    """What a plan assumed of the CUDA allocator, and the bytes it kept free of the budget for it.

    ``expandable_segments``: True or False as the process runs, None where it does not apply (no
    CUDA value, or a backend other than the native caching allocator); ``source``: who chose it
    ("coop", the variable that set it, "not applicable"); ``headroom``: bytes subtracted from the
    budget before solving; ``note``: one line for the plan's summary.
    """

    expandable_segments: bool | None
    source: str
    headroom: int
    note: str

    def as_dict(self) -> dict[str, object]:
        return {"expandable_segments": self.expandable_segments, "source": self.source, "headroom": self.headroom,
                "note": self.note}


def cuda_devices(graph: Graph) -> tuple[str, ...]:
    """The CUDA devices the step's values live on (``Node.device``).

    Parameters
    ----------
    graph : Graph
        The captured step; its ``devices`` are read.

    Returns
    -------
    tuple of str
        The graph's devices whose name starts with ``"cuda"`` (None devices left out), in ``graph.devices`` order.
    """
    return tuple(device for device in graph.devices if device is not None and device.startswith("cuda"))


def user_settings(environ: Mapping[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """The allocator configuration the user set, with lower-cased keys.

    The variables of :data:`CONF_VARIABLES` are read in order, the newer name first: the first one set to a
    non-blank value is parsed (``key:value,key:[a:b,c:d]``, brackets kept whole).

    Parameters
    ----------
    environ : Mapping of str to str or None
        The environment to read; None reads ``os.environ``.

    Returns
    -------
    tuple of (str, dict of str to str)
        The variable's name and its settings (key -> value); ``("", {})`` if none is set.
    """
    environ = os.environ if environ is None else environ
    for variable in CONF_VARIABLES:
        text = environ.get(variable, "").strip()
        if text:
            return variable, _parse(text)
    return "", {}


def _parse(text: str) -> dict[str, str]:
    """``key:value,key:[a:b,c:d]`` -> {key: value}; brackets kept whole (roundup_power2_divisions)."""
    settings: dict[str, str] = {}
    depth, start = 0, 0
    for index, char in enumerate(text + ","):
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            key, _, value = text[start:index].partition(":")
            if key.strip():
                settings[key.strip().lower()] = value.strip()
            start = index + 1
    return settings


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("true", "1", "yes", "on")


def _set_allocator_settings(setting: str) -> None:
    """Apply an allocator setting at run time (takes effect for segments made afterwards)."""
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is None:  # torch before the accelerator API
        setter = torch.cuda.memory._set_allocator_settings
    setter(setting)


def prepare_allocator(graph: Graph, *, streams: int = 1, environ: Mapping[str, str] | None = None,
                      set_settings: Callable[[str], None] = _set_allocator_settings) -> AllocatorAssumption:
    """Turn on expandable segments for a step with CUDA values unless the user configured them; say what was assumed.

    A step without CUDA values gets "not applicable" with no headroom; a user's ``expandable_segments`` setting
    (either way) or another backend is respected and reported, not overridden.

    Parameters
    ----------
    graph : Graph
        The captured step; its CUDA devices (:func:`cuda_devices`) decide whether anything applies.
    streams : int
        The CUDA streams the replay allocates on (2 with the copy stream), each with its own pools.
    environ : Mapping of str to str or None
        The environment the user's setting is read from (:func:`user_settings`); None reads ``os.environ``.
    set_settings : callable
        Applies an allocator setting string at run time; called with :data:`EXPANDABLE` only when coop turns
        expandable segments on (injectable so that tests can check what would be set).

    Returns
    -------
    AllocatorAssumption
        What was assumed (on, off, or None where it does not apply), who chose it, the headroom in bytes kept free
        of the budget (one large and one small page per CUDA device and stream, 0 unless expandable segments are
        on), and a one-line note.
    """
    devices = cuda_devices(graph)
    if not devices:
        return AllocatorAssumption(None, "not applicable", 0, "no CUDA value in the step: the CPU allocator holds "
                                   "exactly the live storages")
    variable, settings = user_settings(environ)
    large_page = DEFAULT_LARGE_PAGE_BYTES
    if "large_segment_size_mb" in settings:
        large_page = int(float(settings["large_segment_size_mb"]) * 1024 * 1024)
    headroom = len(devices) * streams * (large_page + SMALL_PAGE_BYTES)
    if settings.get("backend", "native").lower() != "native":
        return AllocatorAssumption(None, variable, 0, f"{variable} selects the {settings['backend']} backend: coop "
                                   "cannot bound what it reserves; the budget bounds allocated bytes only")
    if "expandable_segments" in settings:
        if _truthy(settings["expandable_segments"]):
            return AllocatorAssumption(True, variable, headroom, f"expandable segments on ({variable}); "
                                       f"{headroom:,} B of the budget kept for page rounding")
        return AllocatorAssumption(False, variable, 0, f"expandable segments off ({variable}): fragmentation is not "
                                   "bounded, reserved bytes may exceed the budget (1.25-1.56x measured on ResNet-50); "
                                   "remove that setting to let coop bound them")
    set_settings(EXPANDABLE)
    return AllocatorAssumption(True, "coop", headroom, f"expandable segments turned on by coop (set "
                               f"PYTORCH_ALLOC_CONF=expandable_segments:False to refuse); {headroom:,} B of the "
                               "budget kept for page rounding")


__all__ = ["AllocatorAssumption", "cuda_devices", "prepare_allocator", "user_settings"]
