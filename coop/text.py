"""Short text for messages: JSON type names, cut reprs, first lines and binary sizes.

Shared by every loader and message of the ground floor (graph, graph files, schedule, budget);
imports nothing of coop.
"""

from __future__ import annotations

from typing import Any


def json_type_name(value: Any) -> str:
    """'a JSON list', 'a JSON number', ...: the JSON type of a value, with its article, for messages.

    Parameters
    ----------
    value : Any
        The value read from a JSON document.

    Returns
    -------
    str
        ``"a JSON <type>"``; a value of no JSON type is named by its Python type's name.
    """
    names = {bool: "boolean", int: "number", float: "number", str: "string", list: "list", tuple: "list",
             dict: "object", type(None): "null"}
    return f"a JSON {names.get(type(value), type(value).__name__)}"


def short_repr(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters: a message stays one short line.

    Parameters
    ----------
    limit : int
        The most characters of the result; a longer repr is cut and ends in ``"..."``.

    Returns
    -------
    str
        The repr with its runs of whitespace joined into single spaces, at most ``limit`` long.
    """
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def first_line(value: Any) -> str:
    """The first line of a value's text (an exception's message), or its type's name when empty.

    Parameters
    ----------
    value : Any
        The value (usually an exception) whose ``str`` is read.

    Returns
    -------
    str
        The first line of the stripped text, or the type's name when the text is empty.
    """
    lines = str(value).strip().splitlines()
    return lines[0] if lines else type(value).__name__


def format_bytes(num: float) -> str:
    """Human-readable binary size: 1536 -> '1.5KiB'.

    Parameters
    ----------
    num : float
        The size in bytes.

    Returns
    -------
    str
        The size in the first unit from B to TiB in which it is below 1024 (TiB at most): whole bytes,
        else one decimal.
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(num) < 1024 or unit == "TiB":
            return f"{num:.0f}{unit}" if unit == "B" else f"{num:.1f}{unit}"
        num /= 1024
    raise AssertionError("unreachable")
