"""Verdicts, table-driven; driver floors from the NVIDIA release notes / compatibility guide."""

from __future__ import annotations

import pytest

from buildkit_py.analysis.check import check_compat


@pytest.mark.parametrize(("cuda", "driver", "datacenter", "verdict"), [
    ("12.4.1", "550.54.15", None, "native"),           # Table 3: 12.4 Update 1 >= 550.54.15
    ("12.4.1", "560.35.03", None, "native"),
    ("12.4", "535.104.05", None, "minor-version"),     # >= 525.60.13 (CUDA 12.x minor compat floor)
    ("12.4", "525.60.13", None, "minor-version"),
    ("12.4", "525.60.11", None, "incompatible"),       # just below the floor, not a cuda-compat branch
    ("12.4", "470.82.01", True, "incompatible"),       # R470 ended July 2024: no forward compat any more
    ("12.4", "470.82.01", False, "incompatible"),      # forward compat is data-center only
    ("12.4", "470.82.01", None, "incompatible"),       # GPU type unknown: not claimed compatible
    ("12.4", "450.80.02", True, "incompatible"),
    ("13.0", "535.104.05", True, "incompatible"),      # R535 LTSB ended June 2026
    ("13.0", "535.104.05", False, "incompatible"),
    ("13.0", "580.65.06", None, "minor-version"),      # 13.0 resolves to 13.0.3 (floor 13.0.2's 580.95.05)
    ("13.0", "580.95.05", None, "native"),             # not the 13.0.3 runfile's 580.126.20
    ("13.5", "580.65.06", None, "minor-version"),      # no Table 3 row for 13.5: only the 13.x floor
    ("13.5", "620.10.01", None, "minor-version"),
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


def test_end_of_life_branch_is_named():
    r = check_compat("13.0", "535.104.05", datacenter=True)
    assert "R535 reached end of life (June 2026)" in r.message and r.compatible is False


def test_forward_compat_remedy_names_package(monkeypatch, tmp_path):
    """A supported forward-compat branch (served from a data file that lists one) gets the cuda-compat remedy."""
    import json
    from importlib import resources

    from buildkit_py.compat import tables
    real = resources.files("buildkit_py.compat").joinpath("data")
    (tmp_path / "data").mkdir()
    for f in tables.DATA_FILES:
        (tmp_path / "data" / f).write_text(real.joinpath(f).read_text())
    fc = json.loads((tmp_path / "data" / "forward_compat.json").read_text())
    fc["entries"][1]["branches"] = ["520"]
    (tmp_path / "data" / "forward_compat.json").write_text(json.dumps(fc))
    monkeypatch.setattr(tables.resources, "files", lambda pkg: tmp_path)
    tables._forward_compat.cache_clear()
    try:
        r = check_compat("12.4", "520.61.05", datacenter=True)
        assert r.verdict == "forward-compat" and "cuda-compat-12-4" in r.remedy
        assert r.compatible is False
    finally:
        tables._forward_compat.cache_clear()


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


# ---------------------------------------------------------------- unpublished native floors (issue 21: 2)
@pytest.mark.parametrize(("cuda", "driver", "verdict"), [
    ("13.3", "575.51.03", "incompatible"),   # below the 13.x minor-version floor
    ("13.3", "580.65.06", "minor-version"),  # native floor unknown: only minor-version is claimed
    ("13.3", "605.10.01", "minor-version"),
    ("13.3", "610.43.02", "native"),         # the driver NVIDIA's own 13.3 installer bundles
    ("13.4", "620.10.01", "minor-version"),  # no installer driver recorded: never claimed native
])
def test_unpublished_floor_verdicts(cuda, driver, verdict):
    r = check_compat(cuda, driver)
    assert (r.verdict, r.min_driver, r.min_driver_compat) == (verdict, None, "580")
    if verdict == "minor-version":
        assert r.message.startswith("native floor unknown") and ">= 580" in r.message


def test_unpublished_floor_remedy_names_the_bundled_driver():
    assert "610.43.02" in check_compat("13.3", "580.65.06").remedy
    assert "released with or after CUDA 13.4" in check_compat("13.4", "580.65.06").remedy


@pytest.mark.parametrize(("cuda", "driver_cuda", "verdict"), [
    ("13.4", "13.4", "native"),        # the driver's own word: it runs CUDA 13.4
    ("13.4", "13.5", "native"),
    ("13.4", "13.3", "minor-version"),
    ("12.4", "12.2", "minor-version"),  # 535 reports 12.2: below 12.4's floor as Table 3 says
])
def test_driver_reported_cuda_decides_native(cuda, driver_cuda, verdict):
    driver = "535.104.05" if cuda.startswith("12") else "600.10.01"
    assert check_compat(cuda, driver, driver_cuda=driver_cuda).verdict == verdict
