"""A Graph's parts (contract 1): :class:`Node`, :class:`Impl`, their field types and limits.

A node is one operation whose output value occupies ``mem`` bytes (or graph units for imported graphs)
and costs ``cost`` to compute; an implementation is one way of computing it (MONeT). The graph that
holds them, and checks how they fit together, is :mod:`coop.graph`; everything here is importable from
there too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

GRAPH_FORMAT = "coop.graph"
#: Version 2 added ``Node.random`` (set by the capture); version 3 added MONeT's implementation
#: links (``Impl.inputs``, ``Impl.inplace_of``, ``Impl.exact``/``tolerance``) and ``Node.optional``;
#: version 4 added ``Node.device``. Older files are upgraded on reading (:mod:`coop.graph_upgrades`).
GRAPH_VERSION = 4

NodeKind = Literal["input", "param", "buffer", "forward", "backward", "other"]
#: Values owned by the caller: resident for the whole step, never computed nor freed by a schedule.
CALLER_OWNED_KINDS: frozenset[str] = frozenset({"input", "param", "buffer"})

#: The largest value or workspace a node may declare (1 PiB). Anything larger is a unit mistake, and
#: sums of such values would overflow the 64-bit integers of the CP-SAT and MILP models.
MAX_MEM = 2**50
#: The largest cost a node may declare: sums of many such costs stay finite and exact enough.
MAX_COST = 1e15


def reject_bool_and_text(value: Any) -> Any:
    """Refuse JSON booleans and strings where a number belongs: pydantic's lax mode would turn
    ``true`` into 1 and ``"5"`` into 5, a silent repair of a malformed file.

    Parameters
    ----------
    value : object
        The raw field value, before pydantic converts it.

    Returns
    -------
    object
        ``value`` itself (ValueError for a boolean or text).
    """
    if isinstance(value, (bool, str, bytes)):
        raise ValueError(f"got {type(value).__name__} {value!r}, not a number")  # noqa: TRY004 (pydantic wants ValueError)
    return value


def reject_non_bool(value: Any) -> Any:
    """Refuse anything but a JSON boolean (lax mode would read ``"no"`` or ``0`` as False).

    Parameters
    ----------
    value : object
        The raw field value, before pydantic converts it.

    Returns
    -------
    object
        ``value`` itself (ValueError for anything but a boolean).
    """
    if not isinstance(value, bool):
        raise ValueError(f"got {type(value).__name__} {value!r}, not true or false")  # noqa: TRY004 (pydantic wants ValueError)
    return value


#: A node id: a non-negative integer (a boolean or a numeric string is refused, not converted).
NodeId = Annotated[int, BeforeValidator(reject_bool_and_text), Field(ge=0)]
#: Bytes (graph units for imported graphs): a non-negative integer no larger than MAX_MEM.
Bytes = Annotated[int, BeforeValidator(reject_bool_and_text), Field(ge=0, le=MAX_MEM)]
#: A compute cost: a finite non-negative number no larger than MAX_COST.
Cost = Annotated[float, BeforeValidator(reject_bool_and_text), Field(ge=0, le=MAX_COST, allow_inf_nan=False)]
Flag = Annotated[bool, BeforeValidator(reject_non_bool)]


def device_order(device: str | None) -> tuple[bool, str]:
    """Sort key of device names: None (an imported graph's one device) first, then by name.

    Parameters
    ----------
    device : str or None
        A device name, or None for an imported graph's one device.

    Returns
    -------
    tuple of (bool, str)
        The sort key.
    """
    return (device is not None, device or "")


class Impl(BaseModel):
    """One implementation of a node (MONeT, Shah et al. 2021): its own cost, output and workspace,
    the values it reads and whether it runs in place.

    * ``inputs``: the node ids this implementation reads instead of the node's ``inputs`` (None:
      the same). A ReLU backward that reads a compact mask names the mask node here, so its
      schedule need not keep the float activation. The ids may name ``optional`` nodes.
    * ``inplace_of``: one of the values it reads whose storage its output takes over (an in-place
      activation). The compute consumes that input's resident instance: no new bytes, the
      instance's bytes move to the new value, and no later step may read the consumed instance.
      Its ``mem`` must equal the input node's ``mem``.
    * ``exact``: False for different arithmetic (output-activated normalisation, a fused
      attention kernel) whose results differ from the default within ``tolerance`` (relative);
      plans solved with ``exact=True`` never choose it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    cost: Cost
    mem: Bytes
    workspace: Bytes = 0
    inputs: tuple[NodeId, ...] | None = None
    inplace_of: NodeId | None = None
    exact: Flag = True
    tolerance: Cost = 0.0


class Node(BaseModel):
    """One operation of the graph; its output value occupies ``mem`` and costs ``cost``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: NodeId
    name: str
    op: str = ""
    inputs: tuple[NodeId, ...] = ()
    mem: Bytes
    cost: Cost
    workspace: Bytes = 0
    kind: NodeKind = "forward"
    recomputable: Flag = True
    #: A seeded random op (dropout, bernoulli, rand*): it draws from a torch generator, so its first
    #: computes keep the baseline order and a recomputation must replay the saved generator state.
    #: The capture sets it from the traced op (``Tag.nondeterministic_seeded``).
    random: Flag = False
    impls: tuple[Impl, ...] = ()
    #: For an extra output of a multi-output op (batch norm's saved mean, a pooling's indices,
    #: a convolution backward's weight gradient): the id of the op node whose call produces it.
    #: Such a value exists from the op's first compute (contract 2); the op's ``workspace``
    #: covers it at the op's own step.
    output_of: NodeId | None = None
    #: A value that exists only to serve some implementations (a ReLU's compact mask): no schedule
    #: has to compute it, only a chosen implementation may read it (``Impl.inputs``), and it is
    #: not in ``Graph.order`` nor in the baseline (contract 2: every non-optional node is computed).
    optional: Flag = False
    #: The device the value lives on, as torch names it (``"cuda:0"``, ``"cpu"``), set by the capture from
    #: the traced value; None for imported graphs, whose values all live on the one device the graph
    #: describes. A captured CUDA step also holds host values (0-d CPU scalars, the RNG seeds an attention
    #: kernel returns): :meth:`Graph.pageable` tells which values may be paged.
    device: str | None = None

    @property
    def caller_owned(self) -> bool:
        """Inputs, parameters and buffers: resident for the whole step, owned by the caller."""
        return self.kind in CALLER_OWNED_KINDS

    def implementation(self, name: str | None) -> Impl | None:
        """The implementation called ``name`` (None for the default one, or when there is none)."""
        if name is None:
            return None
        return next((impl for impl in self.impls if impl.name == name), None)

    def reads(self, impl: Impl | None = None) -> tuple[int, ...]:
        """The node ids a compute of this node reads under ``impl`` (None: the default implementation)."""
        return self.inputs if impl is None or impl.inputs is None else impl.inputs


