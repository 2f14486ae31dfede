"""Reading older coop graph files: version 2 added ``Node.random``, versions 3 and 4 only optional fields.

Version 1 had no field that marked a seeded random op; coop decided it from a node's ``op`` name
by asking torch whether that op carries ``Tag.nondeterministic_seeded``. Version 2 lets the
capture mark the node (:mod:`coop.graph_capture.lower`), so the ground floor needs no torch. A
version-1 file is upgraded on reading with the table below: every op registered with torch's
dispatcher that was tagged ``nondeterministic_seeded`` when version 1 was current (torch 2.13,
inductor's prims and coop's own ``coop.bernoulli_mask`` included), and the named-tensor overloads of
``rand``/``randn`` that torch 2.10 (coop's oldest supported) still tags. Nothing here imports torch or
another part of coop.
"""

from __future__ import annotations

from typing import Any

#: "namespace.name" -> its overloads that draw from a generator (Tag.nondeterministic_seeded).
_SEEDED_OVERLOADS: dict[str, str] = {
    "aten._cudnn_attention_backward": "default",
    "aten._cudnn_attention_forward": "default",
    "aten._cudnn_init_dropout_state": "default out",
    "aten._cudnn_rnn": "default out",
    "aten._efficient_attention_forward": "default",
    "aten._fill_mem_eff_dropout_mask_": "default",
    "aten._flash_attention_forward": "default quantized",
    "aten._flash_attention_forward_no_dropout_inplace": "default",
    "aten._fused_dropout": "default out",
    "aten._fused_sdp_choice": "default",
    "aten._lstm_mps": "default out",
    "aten._nested_tensor_softmax_with_shape": "default",
    "aten._sample_dirichlet": "default out",
    "aten._scaled_dot_product_attention_math": "default",
    "aten._scaled_dot_product_attention_math_for_mps": "default",
    "aten._scaled_dot_product_cudnn_attention": "default",
    "aten._scaled_dot_product_cudnn_attention_backward": "default",
    "aten._scaled_dot_product_efficient_attention": "default",
    "aten._scaled_dot_product_efficient_attention_backward": "default",
    "aten._scaled_dot_product_flash_attention": "default quantized",
    "aten._scaled_dot_product_flash_attention_for_cpu": "default",
    "aten._scaled_dot_product_fused_attention_overrideable": "default",
    "aten._standard_gamma": "default out",
    "aten._triton_scaled_dot_attention": "default out",
    "aten.alpha_dropout": "default",
    "aten.alpha_dropout_": "default",
    "aten.bernoulli": "Tensor Tensor_out default float_out out p",
    "aten.bernoulli_": "Tensor float",
    "aten.binomial": "default out",
    "aten.cauchy": "default out",
    "aten.cauchy_": "default",
    "aten.dropout": "default",
    "aten.dropout_": "default",
    "aten.exponential": "default out",
    "aten.exponential_": "default",
    "aten.feature_alpha_dropout": "default",
    "aten.feature_alpha_dropout_": "default",
    "aten.feature_dropout": "default",
    "aten.feature_dropout_": "default",
    "aten.geometric": "default out",
    "aten.geometric_": "default",
    "aten.gru": "data input",
    "aten.log_normal": "default out",
    "aten.log_normal_": "default",
    "aten.lstm": "data input",
    "aten.miopen_rnn": "default out",
    "aten.multinomial": "default out",
    "aten.native_dropout": "default out",
    "aten.normal": "Tensor_Tensor Tensor_Tensor_out Tensor_float Tensor_float_out "
                   "float_Tensor float_Tensor_out float_float float_float_out out",
    "aten.normal_": "default",
    "aten.normal_functional": "default",
    "aten.poisson": "default out",
    "aten.rand": "default generator generator_out generator_with_names generator_with_names_out names names_out out",
    "aten.rand_like": "default generator generator_out out",
    "aten.randint": "default generator generator_out low low_generator low_generator_out low_out out",
    "aten.randint_like": "Tensor Tensor_generator Tensor_generator_out Tensor_out default generator "
                         "generator_out low_dtype low_dtype_out low_generator_dtype low_generator_dtype_out out",
    "aten.randn": "default generator generator_out generator_with_names generator_with_names_out names names_out out",
    "aten.randn_like": "default generator generator_out out",
    "aten.random": "default from from_out out to to_out",
    "aten.random_": "default from to",
    "aten.randperm": "default generator generator_out out",
    "aten.rnn_relu": "data input",
    "aten.rnn_tanh": "data input",
    "aten.rrelu": "default",
    "aten.rrelu_": "default",
    "aten.rrelu_with_noise": "default out",
    "aten.rrelu_with_noise_": "default",
    "aten.rrelu_with_noise_functional": "default",
    "aten.scaled_dot_product_attention": "default",
    "aten.uniform": "default out",
    "aten.uniform_": "default",
    "coop.bernoulli_mask": "default",
    "coop.dropout_mask": "default",
    "coop.float8_dropout_mask": "default",
    "prims.inductor_rand_eager_offset": "default",
    "prims.inductor_rand_eager_offsets": "default",
    "prims.inductor_seed": "default",
    "prims.inductor_seeds": "default",
    "prims.normal": "default",
    "prims.uniform": "default",
    "rngprims.philox_rand": "default",
}

#: Every "namespace.name.overload" that version 1 read as a seeded random op.
SEEDED_RANDOM_OPS: frozenset[str] = frozenset(
    f"{packet}.{overload}" for packet, overloads in _SEEDED_OVERLOADS.items() for overload in overloads.split()
)


def is_seeded_random_op(op: str) -> bool:
    """Whether a version-1 node with this ``op`` is a seeded random op (free-text ops never are).

    Parameters
    ----------
    op : str
        The node's op name.

    Returns
    -------
    bool
        True when ``op`` is one of ``SEEDED_RANDOM_OPS``.
    """
    return op in SEEDED_RANDOM_OPS


def upgrade_v1(data: dict[str, Any], current_version: int) -> dict[str, Any]:
    """A version-1 graph document as the current version: each node's ``random`` from its op name.

    Only what is well formed is touched; anything else is left for the Graph's validation to name.

    Parameters
    ----------
    data : dict
        The version-1 graph document; it is not modified.
    current_version : int
        The version to tag the result with.

    Returns
    -------
    dict
        A new document with the current version and, for each node that is a dict with a string op
        and no ``random``, ``random`` set by :func:`is_seeded_random_op`.
    """
    nodes = data.get("nodes")
    if not isinstance(nodes, (list, tuple)):
        return {**data, "version": current_version}
    upgraded = []
    for node in nodes:
        if isinstance(node, dict) and "random" not in node and isinstance(node.get("op"), str):
            node = {**node, "random": is_seeded_random_op(node["op"])}
        upgraded.append(node)
    return {**data, "version": current_version, "nodes": upgraded}


def upgrade_v2(data: dict[str, Any], current_version: int) -> dict[str, Any]:
    """A version-2 or version-3 graph document as the current version.

    Versions 3 and 4 only added fields whose defaults are the older meaning (an implementation reads
    the node's inputs, runs out of place and is exact; no node is optional; every value lives on the
    graph's one device), so only the tag changes.

    Parameters
    ----------
    data : dict
        The version-2 or version-3 graph document; it is not modified.
    current_version : int
        The version to tag the result with.

    Returns
    -------
    dict
        A copy of ``data`` with ``version`` set to ``current_version``.
    """
    return {**data, "version": current_version}
