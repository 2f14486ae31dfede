"""Device profiles: what computing and paging cost on a device, as data (``coop/configs/devices/*.toml``).

POET (Patil, Jain, Dutta, Stoica, Gonzalez, "POET: Training Neural Networks on Tiny Devices with
Integrated Rematerialization and Paging", ICML 2022) prices a schedule by a device profile: compute
speed and efficiency (FLOP/s, FLOP per joule) and, for a slower memory tier (flash on a
microcontroller, host RAM behind PCIe or NVLink-C2C on a GPU), page-in and page-out latency and
throughput and the power drawn while paging. Its model, which :class:`DeviceProfile` implements:

* computing a node once takes ``runtime_s`` (the graph's cost, seconds on the device) and
  ``runtime_s * flops_per_s / flops_per_joule`` joules (FLOPs / FLOP-per-joule, since FLOPs =
  runtime x FLOP/s);
* paging ``n`` bytes in takes ``pagein_latency_s + n / pagein_bytes_per_s`` seconds and that times
  ``memory_power_w`` joules; paging out likewise with the page-out fields.

A TOML file states every quantity once, in the unit its key names (``pagein_latency_us = 10`` or
``pagein_latency_s = 1e-5``; ``flops_tflops = 19.5`` or ``flops_per_s = 1.95e13``):
:data:`UNITS` is the one table that converts them to SI; each value must be positive and finite;
``source`` cites where the numbers come from. This module is on coop's ground floor (no torch).
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from coop.errors import CoopError

#: Where the profiles shipped with coop live (package data, installed with the package).
PROFILE_DIR = Path(__file__).resolve().parent / "configs" / "devices"

#: quantity -> {unit suffix of a TOML key: factor to the SI unit of the profile's field}.
UNITS: dict[str, dict[str, float]] = {
    "flops": {"per_s": 1.0, "gflops": 1e9, "tflops": 1e12},                 # -> FLOP/s
    "flops_per_joule": {"": 1.0, "gflops_per_w": 1e9},                     # -> FLOP/J
    "power": {"w": 1.0},                                                    # -> W
    "memory_power": {"w": 1.0},                                             # -> W
    "pagein_latency": {"s": 1.0, "ms": 1e-3, "us": 1e-6},                   # -> s
    "pageout_latency": {"s": 1.0, "ms": 1e-3, "us": 1e-6},                  # -> s
    "pagein": {"bytes_per_s": 1.0, "mb_per_s": 1e6, "gb_per_s": 1e9},      # -> B/s
    "pageout": {"bytes_per_s": 1.0, "mb_per_s": 1e6, "gb_per_s": 1e9},     # -> B/s
}

#: The SI field of :class:`DeviceProfile` each quantity lands in.
FIELD_OF = {
    "flops": "flops_per_s", "flops_per_joule": "flops_per_joule", "power": "power_w", "memory_power": "memory_power_w",
    "pagein_latency": "pagein_latency_s", "pageout_latency": "pageout_latency_s",
    "pagein": "pagein_bytes_per_s", "pageout": "pageout_bytes_per_s",
}

#: Keys a profile file may hold besides the quantities.
TEXT_KEYS = ("name", "device", "source", "notes", "host_tier", "bytes_per_element")


class DeviceProfile(BaseModel):
    """One device and its slower memory tier, every number in SI units (checked positive and finite)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    source: str                 # where the numbers come from (required: a profile cites its numbers)
    device: str = ""
    host_tier: str = "host memory"
    notes: str = ""
    bytes_per_element: int = 4
    flops_per_s: float          # peak compute rate, FLOP/s
    flops_per_joule: float      # compute efficiency, FLOP/J
    power_w: float              # the device's power as published (W); informative
    memory_power_w: float       # power drawn while paging (W)
    pagein_latency_s: float     # per page-in (s)
    pageout_latency_s: float    # per page-out (s)
    pagein_bytes_per_s: float   # page-in throughput (B/s)
    pageout_bytes_per_s: float  # page-out throughput (B/s)

    @field_validator("flops_per_s", "flops_per_joule", "power_w", "memory_power_w", "pagein_latency_s",
                     "pageout_latency_s", "pagein_bytes_per_s", "pageout_bytes_per_s", "bytes_per_element")
    @classmethod
    def _positive_finite(cls, value: float) -> float:
        if isinstance(value, bool) or not math.isfinite(value) or value <= 0:
            raise ValueError("must be a positive finite number")
        return value

    @property
    def compute_power_w(self) -> float:
        """Watts while computing, POET's model: joules per second of compute = FLOP/s / FLOP-per-J."""
        return self.flops_per_s / self.flops_per_joule

    def compute_j(self, runtime_s: float) -> float:
        """Joules to compute a node that runs ``runtime_s`` seconds on this device."""
        return runtime_s * self.compute_power_w

    def pagein_s(self, num_bytes: int) -> float:
        return self.pagein_latency_s + num_bytes / self.pagein_bytes_per_s

    def pageout_s(self, num_bytes: int) -> float:
        return self.pageout_latency_s + num_bytes / self.pageout_bytes_per_s

    def pagein_j(self, num_bytes: int) -> float:
        return self.pagein_s(num_bytes) * self.memory_power_w

    def pageout_j(self, num_bytes: int) -> float:
        return self.pageout_s(num_bytes) * self.memory_power_w


class DeviceProfileError(CoopError):
    """An unknown profile name or a malformed profile file."""


def known_profiles() -> tuple[str, ...]:
    """The names of the profiles shipped with coop, sorted."""
    return tuple(sorted(path.stem for path in PROFILE_DIR.glob("*.toml")))


def load_device_profile(name_or_path: str | Path | DeviceProfile) -> DeviceProfile:
    """A shipped profile by name (``"m4"``, ``"a100-pcie4"``), or a TOML file by path; a profile passes through.

    Parameters
    ----------
    name_or_path : str or Path or DeviceProfile
        A shipped profile's name, the path of a ``.toml`` profile, or a profile.

    Returns
    -------
    DeviceProfile
        The checked profile (``name_or_path`` itself when it is one).

    Raises
    ------
    DeviceProfileError
        When the name is no shipped profile and no file, the file cannot be read or is not TOML, or
        its content is refused by :func:`profile_from_dict`.
    """
    if isinstance(name_or_path, DeviceProfile):
        return name_or_path
    text = str(name_or_path)
    path = Path(text)
    if not (text.endswith(".toml") or path.is_file()):
        path = PROFILE_DIR / f"{text}.toml"
        if not path.is_file():
            raise DeviceProfileError(f"unknown device profile {text!r}: choose one of {', '.join(known_profiles())} "
                                     "or give the path of a .toml profile")
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise DeviceProfileError(f"device profile {path}: cannot read it ({exc}); fix the file") from None
    return profile_from_dict(data, origin=str(path), default_name=path.stem)


def profile_from_dict(data: dict[str, Any], origin: str = "device profile", default_name: str = "custom") -> DeviceProfile:
    """Convert a profile's keys (each quantity in the unit its key names) to a checked SI profile.

    Parameters
    ----------
    data : dict
        The profile's keys: the text keys and one key per quantity, its unit in its name.
    origin : str
        What the data came from (a file's path), for messages.
    default_name : str
        The profile's name when ``data`` has none.

    Returns
    -------
    DeviceProfile
        The profile, each quantity converted to SI units.

    Raises
    ------
    DeviceProfileError
        When a key is unknown, a quantity is missing or given twice, a value is not a number, or the
        profile fails its validation.
    """
    fields: dict[str, Any] = {key: data[key] for key in TEXT_KEYS if key in data}
    fields.setdefault("name", default_name)
    for key in data:
        if key not in TEXT_KEYS and _quantity_of(key) is None:
            raise DeviceProfileError(f"{origin}: unknown key {key!r}; a profile holds {', '.join(TEXT_KEYS)} and "
                                     f"one key per quantity: {', '.join(_spellings())}")
    for quantity, units in UNITS.items():
        given = [(key, factor) for unit, factor in units.items() if (key := _key(quantity, unit)) in data]
        if len(given) != 1:
            spellings = " or ".join(_key(quantity, unit) for unit in units)
            problem = "is missing" if not given else "is given twice"
            raise DeviceProfileError(f"{origin}: {quantity} {problem}; give exactly one of {spellings}")
        key, factor = given[0]
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise DeviceProfileError(f"{origin}: {key} = {value!r}; it must be a positive finite number")
        fields[FIELD_OF[quantity]] = float(value) * factor
    try:
        return DeviceProfile(**fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"])
        if error["type"] == "missing":
            raise DeviceProfileError(f"{origin}: {field} is missing; add {field} = \"...\"") from None
        raise DeviceProfileError(f"{origin}: {field} = {error.get('input')!r}: {error['msg']}; fix the file") from None


def _key(quantity: str, unit: str) -> str:
    return f"{quantity}_{unit}" if unit else quantity


def _quantity_of(key: str) -> str | None:
    for quantity, units in UNITS.items():
        if any(_key(quantity, unit) == key for unit in units):
            return quantity
    return None


def _spellings() -> list[str]:
    return [_key(quantity, unit) for quantity, units in UNITS.items() for unit in units]


__all__ = ["PROFILE_DIR", "UNITS", "DeviceProfile", "DeviceProfileError", "known_profiles", "load_device_profile",
           "profile_from_dict"]
