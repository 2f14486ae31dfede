"""Sweep configs (TOML, read with :mod:`tomllib`) validated by pydantic models.

A config names the graphs (a file, a glob of files, or a zoo model and its size, captured on the
fly), the budgets (contract 3 specs), the static formulations and online policies to compare and
the solver time limit::

    name = "gpt2-small"
    budgets = ["90%", 0.7, 0.5]
    formulations = ["store-all", "chen-greedy"]   # or "all" (default)
    policies = ["dtr", "dte", "coop"]             # or "all" (default)
    time_limit = 30

    [[graphs]]
    zoo = "gpt2"
    size = { layers = 2, hidden = 64, batch = 2, seq = 32 }

Relative paths and globs are resolved against the config file's folder. A malformed config
raises :class:`ConfigError` with one line naming the file, the field and the fix.
"""

from __future__ import annotations

import glob
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from coop.budget import check_budget_syntax
from coop.errors import BudgetError, CoopError
from coop.formulations import FORMULATIONS
from coop.graph import Graph
from coop.graph_files import load_graph
from coop.online.policies import POLICIES


class ConfigError(CoopError):
    """A sweep config that cannot be read or does not validate."""


class GraphSource(BaseModel):
    """Where one graph comes from: ``path`` (a graph file), ``glob`` (many) or ``zoo`` (+ ``size``)."""

    # Strict: TOML has real types, so "10" for a number or 1 for a flag is a mistake to name, not convert.
    model_config = ConfigDict(extra="forbid", strict=True)

    path: str | None = None
    glob: str | None = None
    zoo: str | None = None
    size: dict[str, Annotated[int, Field(gt=0)]] = Field(default_factory=dict)
    profile: bool = False

    @model_validator(mode="after")
    def _exactly_one_source(self) -> GraphSource:
        given = [k for k in ("path", "glob", "zoo") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError("each [[graphs]] entry needs exactly one of path, glob or zoo")
        if self.size and not self.zoo:
            raise ValueError("size applies to zoo models only")
        return self


class SweepConfig(BaseModel):
    """One comparison sweep: graphs x budgets x (formulations + policies)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = "sweep"
    graphs: list[GraphSource] = Field(min_length=1)
    budgets: list[str | float | int] = Field(min_length=1)
    formulations: list[str] | Literal["all"] = "all"
    policies: list[str] | Literal["all"] = "all"
    time_limit: float = Field(default=10.0, gt=0)
    output_dir: str = "results"
    solver_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    base_dir: Path = Field(default=Path("."), exclude=True)

    @field_validator("budgets")
    @classmethod
    def _budget_syntax(cls, value: list[str | float | int]) -> list[str | float | int]:
        """Budgets are checked when the config is read, not after the first graph was solved."""
        for spec in value:
            try:
                check_budget_syntax(spec)
            except BudgetError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("formulations")
    @classmethod
    def _known_formulations(cls, value: list[str] | str) -> list[str] | str:
        return _known_names(value, FORMULATIONS, "formulation")

    @field_validator("policies")
    @classmethod
    def _known_policies(cls, value: list[str] | str) -> list[str] | str:
        return _known_names(value, POLICIES, "policy")

    @property
    def formulation_names(self) -> list[str] | None:
        return None if self.formulations == "all" else list(self.formulations)

    @property
    def policy_names(self) -> list[str] | None:
        return None if self.policies == "all" else list(self.policies)

    def graph_paths(self) -> list[Path]:
        """Files named by ``path`` and ``glob`` entries, resolved against the config's folder."""
        return [p for source in self.graphs if not source.zoo for p in self._source_paths(source)]

    def load_graphs(self) -> list[Graph]:
        """Every graph of the sweep, in config order (zoo models are built and captured here)."""
        graphs: list[Graph] = []
        for source in self.graphs:
            if source.zoo:
                graphs.append(_capture_zoo(source))
            else:
                graphs.extend(load_graph(p) for p in self._source_paths(source))
        return graphs

    def _source_paths(self, source: GraphSource) -> list[Path]:
        if source.path:
            path = self._resolve(source.path)
            if not path.is_file():
                raise ConfigError(f"config {self.name!r}: graph file {path} does not exist")
            return [path]
        matches = sorted(glob.glob(str(self._resolve(str(source.glob)))))
        if not matches:
            raise ConfigError(f"config {self.name!r}: glob {source.glob!r} matches no file under {self.base_dir}")
        return [Path(m) for m in matches]

    def _resolve(self, text: str) -> Path:
        path = Path(text).expanduser()
        return path if path.is_absolute() else (self.base_dir / path)


def _capture_zoo(source: GraphSource) -> Graph:
    from coop.graph_capture import capture  # lazy: a sweep of graph files stays torch-free
    from coop.zoo import build  # lazy: a sweep of graph files stays torch-free

    model, batch, loss_fn = build(str(source.zoo), **source.size)
    return capture(model, batch, loss_fn=loss_fn, profile=source.profile).graph


def load_config(path: str | Path) -> SweepConfig:
    """Read and validate a TOML sweep config (ConfigError with one line on any problem).

    Parameters
    ----------
    path : str or Path
        The TOML file; relative paths in it are taken from its folder.

    Returns
    -------
    SweepConfig
        The validated config.

    Raises
    ------
    ConfigError
        When the path is a folder or cannot be read, is not UTF-8 or not valid TOML, or the config is invalid.
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config {path} is a directory: give the path of a TOML file")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config {path} is not UTF-8 text (byte {exc.start}); is it a TOML file?") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {path} is not valid TOML: {exc}") from None
    return parse_config(data, base_dir=path.resolve().parent, origin=str(path))


def parse_config(data: dict[str, Any], base_dir: Path | str = ".", origin: str = "config") -> SweepConfig:
    """Validate a config dict (as read from TOML).

    Parameters
    ----------
    data : dict of str to Any
        The config's tables and keys.
    base_dir : Path or str
        The folder relative paths in the config are taken from.
    origin : str
        What the config is called in error messages (its file's path).

    Returns
    -------
    SweepConfig
        The validated config.

    Raises
    ------
    ConfigError
        With one line describing what is invalid.
    """
    try:
        return SweepConfig.model_validate({**data, "base_dir": Path(base_dir)})
    except ValidationError as exc:
        raise ConfigError(f"{origin}: {_describe(exc)}") from None


def _describe(exc: ValidationError) -> str:
    """pydantic's first error as 'field: problem; fix' on one line."""
    error = exc.errors()[0]
    # Union members add their type names to the location (budgets.0.str); the user wrote no such key.
    parts = [str(p) for p in error["loc"] if not (isinstance(p, str) and p in _UNION_TAGS)]
    where = ".".join(parts) or "(top level)"
    message = " ".join(str(error["msg"]).removeprefix("Value error, ").split())
    if error["type"] == "extra_forbidden":
        message = "unknown field; remove it or check its spelling"
    elif error["type"] == "missing":
        message = "field required; add it"
    elif error["type"] not in ("value_error", "assertion_error"):
        message = f"{message} (got {error['input']!r:.40})"
    return f"{where}: {message}"


_UNION_TAGS = frozenset({"str", "float", "int", "list[str]", "literal['all']", "function-after[_exactly_one_source(), GraphSource]"})


__all__ = ["ConfigError", "GraphSource", "SweepConfig", "load_config", "parse_config"]


def _known_names(value: list[str] | str, known: Iterable[str], what: str) -> list[str] | str:
    """``value`` when it is a keyword (e.g. "all") or a list of names that are all ``known``."""
    known = list(known)
    for name in value if isinstance(value, list) else []:
        if name not in known:
            raise ValueError(f"unknown {what} {name!r} (choose from {', '.join(known)})")
    return value
