"""Device profiles (coop.device_profiles): shipped as package data, checked, converted in one place.

Oracles: POET's own exported profiles (graphs/poet/platforms.json, numbers as published) and the
per-node energies POET's code wrote into its graphs (compute_j, pagein_j, pageout_j), recomputed here from
the profile by the README's formulas through coop's one conversion.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from coop.device_profiles import (
    PROFILE_DIR,
    DeviceProfile,
    DeviceProfileError,
    known_profiles,
    load_device_profile,
    profile_from_dict,
)
from coop.formulations.poet.milp import node_price

POET_DIR = Path(__file__).resolve().parents[1] / "graphs" / "poet"
POET_PROFILES = ("m0", "m4", "a72", "a72nocache", "jetsontx2")
GPU_PROFILES = ("a100-pcie4", "h100-sxm-pcie5", "gh200-nvlink-c2c")


@pytest.fixture(scope="module")
def poet_dir() -> Path:
    if not POET_DIR.is_dir():
        pytest.skip(f"POET's exported graphs not found at {POET_DIR} (graphs/poet of the checkout)")
    return POET_DIR


def test_every_named_profile_ships_with_a_source_and_checked_units() -> None:
    assert set(POET_PROFILES + GPU_PROFILES) <= set(known_profiles())
    for name in known_profiles():
        profile = load_device_profile(name)
        assert profile.name == name and len(profile.source) > 20, name
        numbers = [profile.flops_per_s, profile.flops_per_joule, profile.memory_power_w, profile.pagein_latency_s,
                   profile.pageout_latency_s, profile.pagein_bytes_per_s, profile.pageout_bytes_per_s]
        assert all(math.isfinite(x) and x > 0 for x in numbers), name


def test_profiles_are_package_data() -> None:
    """`pip install .` copies coop/configs/devices/*.toml only if pyproject.toml lists them as package data."""
    import tomllib

    assert PROFILE_DIR.parent.parent.name == "coop"
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert "configs/devices/*.toml" in pyproject["tool"]["setuptools"]["package-data"]["coop"]


def test_poet_profiles_equal_the_published_numbers(poet_dir: Path) -> None:
    published = json.loads((poet_dir / "platforms.json").read_text())
    for name in POET_PROFILES:
        raw, profile = published[name], load_device_profile(name)
        pairs = [("pagein_latency", profile.pagein_latency_s), ("pageout_latency", profile.pageout_latency_s),
                 ("pagein_throughput", profile.pagein_bytes_per_s), ("pageout_throughput", profile.pageout_bytes_per_s),
                 ("memory_power", profile.memory_power_w), ("power", profile.power_w), ("flops", profile.flops_per_s),
                 ("flops_per_watt", profile.flops_per_joule)]
        for key, value in pairs:
            if key in raw:  # jetsontx2 has no flops fields as published (coop fills them from NVIDIA's spec)
                assert value == pytest.approx(raw[key], rel=1e-12), (name, key)


@pytest.mark.parametrize("model", ["linear", "transformer", "vgg16_cifar"])
def test_energies_follow_from_runtime_bytes_and_profile(poet_dir: Path, model: str) -> None:
    """POET wrote each node's joules into its graphs: coop's conversion gives the same numbers."""
    for platform in ("m0", "m4", "a72", "a72nocache"):
        data = json.loads((poet_dir / f"poet_{model}_{platform}_b1.json").read_text())
        profile = load_device_profile(platform)
        for node in data["nodes"]:
            price = node_price(node["runtime_s"], node["cost_ram"], profile)
            assert price.compute_j == pytest.approx(node["compute_j"], rel=1e-9, abs=1e-18)
            assert price.pagein_j == pytest.approx(node["pagein_j"], rel=1e-9)
            assert price.pageout_j == pytest.approx(node["pageout_j"], rel=1e-9)
            assert price.pagein_s == pytest.approx(node["pagein_s"], rel=1e-9)


def test_units_are_converted_in_one_place() -> None:
    base = {"source": "test", "flops_per_s": 1e9, "flops_per_joule": 1e8, "power_w": 10.0, "memory_power_w": 2.0,
            "pagein_latency_s": 1e-5, "pageout_latency_s": 1e-5, "pagein_bytes_per_s": 3.2e10,
            "pageout_bytes_per_s": 3.2e10}
    vendor = {"source": "test", "flops_gflops": 1.0, "flops_per_joule_gflops_per_w": 0.1, "power_w": 10.0, "memory_power_w": 2.0,
              "pagein_latency_us": 10.0, "pageout_latency_ms": 0.01, "pagein_gb_per_s": 32.0, "pageout_mb_per_s": 32000.0}
    si, converted = profile_from_dict(base).model_dump(), profile_from_dict(vendor).model_dump()
    for key, value in si.items():
        assert converted[key] == (pytest.approx(value, rel=1e-12) if isinstance(value, float) else value), key
    profile = profile_from_dict(vendor)
    # 1 GB in over 32 GB/s after 10 us: 31.26 ms, times 2 W.
    assert profile.pagein_s(10**9) == pytest.approx(1e-5 + 1 / 32)
    assert profile.pagein_j(10**9) == pytest.approx(2 * (1e-5 + 1 / 32))
    assert profile.compute_power_w == pytest.approx(10.0)


@pytest.mark.parametrize(("change", "needle"), [
    ({"pagein_bytes_per_s": 0.0}, "pagein_bytes_per_s"),
    ({"memory_power_w": -1.0}, "memory_power_w"),
    ({"pagein_latency_s": float("inf")}, "pagein_latency_s"),
    ({"flops_per_s": "fast"}, "flops_per_s"),
    ({"pagein_gb_per_s": 32.0}, "given twice"),
    ({"pagein_bandwith_gb_per_s": 32.0}, "unknown key 'pagein_bandwith_gb_per_s'"),
])
def test_a_bad_value_is_one_line_naming_it(change: dict, needle: str) -> None:
    data = {"source": "test", "flops_per_s": 1e9, "flops_per_joule": 1e8, "power_w": 10.0, "memory_power_w": 2.0,
            "pagein_latency_s": 1e-5, "pageout_latency_s": 1e-5, "pagein_bytes_per_s": 3.2e10,
            "pageout_bytes_per_s": 3.2e10, **change}
    with pytest.raises(DeviceProfileError) as caught:
        profile_from_dict(data, origin="my.toml")
    assert needle in str(caught.value) and "\n" not in str(caught.value) and "my.toml" in str(caught.value)


def test_a_missing_quantity_names_its_spellings() -> None:
    with pytest.raises(DeviceProfileError, match="pagein_latency is missing; give exactly one of pagein_latency_s"):
        profile_from_dict({"flops_per_s": 1.0, "flops_per_joule": 1.0, "power_w": 1.0, "memory_power_w": 1.0,
                           "pageout_latency_s": 1.0, "pagein_bytes_per_s": 1.0, "pageout_bytes_per_s": 1.0})


def test_a_profile_cites_its_source() -> None:
    with pytest.raises(DeviceProfileError, match="source is missing"):
        profile_from_dict({"flops_per_s": 1.0, "flops_per_joule": 1.0, "power_w": 1.0, "memory_power_w": 1.0,
                           "pagein_latency_s": 1.0, "pageout_latency_s": 1.0, "pagein_bytes_per_s": 1.0,
                           "pageout_bytes_per_s": 1.0})


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(DeviceProfileError) as caught:
        load_device_profile("tpu-v9")
    message = str(caught.value)
    assert "\n" not in message and "'tpu-v9'" in message and all(name in message for name in POET_PROFILES)


def test_a_profile_file_by_path(tmp_path: Path) -> None:
    path = tmp_path / "board.toml"
    path.write_text('source = "my bench"\nflops_per_s = 1e6\nflops_per_joule = 1e6\npower_w = 1\nmemory_power_w = 0.5\n'
                    'pagein_latency_ms = 1\npageout_latency_ms = 2\npagein_mb_per_s = 4\npageout_mb_per_s = 2\n')
    profile = load_device_profile(path)
    assert isinstance(profile, DeviceProfile) and profile.name == "board"
    assert profile.pageout_s(2_000_000) == pytest.approx(0.002 + 1.0)
    path.write_text("flops_per_s = [")
    with pytest.raises(DeviceProfileError, match="cannot read it"):
        load_device_profile(path)
