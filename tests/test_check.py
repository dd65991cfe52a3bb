"""Verdicts, table-driven; driver floors from the NVIDIA release notes / compatibility guide."""

from __future__ import annotations

import pytest

from buildkit_py.check import check_compat


@pytest.mark.parametrize("cuda, driver, datacenter, verdict", [
    ("12.4.1", "550.54.15", None, "native"),           # Table 3: 12.4 Update 1 >= 550.54.15
    ("12.4.1", "560.35.03", None, "native"),
    ("12.4", "535.104.05", None, "minor-version"),     # >= 525.60.13 (CUDA 12.x minor compat floor)
    ("12.4", "525.60.13", None, "minor-version"),
    ("12.4", "525.60.11", None, "incompatible"),       # just below the floor, not a cuda-compat branch
    ("12.4", "470.82.01", True, "forward-compat"),     # R470 + cuda-compat, data-center GPU
    ("12.4", "470.82.01", False, "incompatible"),      # forward compat is data-center only
    ("12.4", "470.82.01", None, "incompatible"),       # GPU type unknown: not claimed compatible
    ("12.4", "450.80.02", True, "incompatible"),
    ("13.0", "535.104.05", True, "forward-compat"),    # R535 LTSB: CUDA 13 only via forward compat
    ("13.0", "535.104.05", False, "incompatible"),
    ("13.0", "580.65.06", None, "minor-version"),      # 13.0 resolves to newest 13.0.x (13.0.3, 580.126.20)
    ("13.0.0", "580.65.06", None, "native"),
    ("11.8.0", "520.61.05", None, "native"),
    ("11.8", "450.80.02", None, "minor-version"),
    ("11.8", "450.36.06", None, "incompatible"),
])
def test_verdicts(cuda, driver, datacenter, verdict):
    r = check_compat(cuda, driver, datacenter=datacenter)
    assert r.verdict == verdict
    assert r.compatible is (verdict in ("native", "minor-version"))


def test_minor_version_message_says_what_is_limited():
    r = check_compat("12.4", "535.104.05")
    assert r.min_driver == "550.54.15" and r.min_driver_compat == "525.60.13"
    assert "PTX" in r.message and "cudaErrorCallRequiresNewerDriver" in r.message
    assert "550.54.15" in r.remedy and "12.2.2" in r.remedy  # newest toolkit 535.104.05 runs natively


def test_forward_compat_remedy_names_package():
    r = check_compat("12.4", "470.82.01", datacenter=True)
    assert "cuda-compat-12-4" in r.remedy
    assert r.compatible is False


def test_incompatible_remedy_names_driver_and_native_toolkit():
    r = check_compat("12.4", "450.80.02")
    assert "525.60.13" in r.remedy and "11.0.3" in r.remedy


def test_to_json_keys():
    j = check_compat("12.4.1", "550.54.15").to_json()
    assert j == {"cuda": "12.4.1", "driver": "550.54.15", "min_driver": "550.54.15", "min_driver_compat": "525.60.13",
                 "verdict": "native", "compatible": True, "message": j["message"]}
    assert set(check_compat("12.4", "450.80.02").to_json()) == {
        "cuda", "driver", "min_driver", "min_driver_compat", "verdict", "compatible", "message", "remedy"}


def test_unknown_cuda_raises():
    with pytest.raises(LookupError):
        check_compat("12.7", "550.54.15")
