"""Verdicts, table-driven; driver floors from the NVIDIA release notes / compatibility guide."""

from __future__ import annotations

import dataclasses
import json

import pytest

from buildkit_py.analysis.check import check_compat
from buildkit_py.compat import driver_floor, floor_from_labels, floor_labels
from buildkit_py.errors import UsageError


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
                 "floor_source": "data", "verdict": "native", "compatible": True, "message": j["message"]}
    assert set(check_compat("12.4", "450.80.02").to_json()) == {
        "cuda", "driver", "min_driver", "min_driver_compat", "floor_source", "verdict", "compatible", "message",
        "remedy"}


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


# ------------------------------------------------- issue 29: 2: the floors an image carries are its contract
IMAGE_LABELS = {"io.imgbuild.cuda.version": "12.4.1", "io.imgbuild.cuda.driver.min": "550.54.15",
                "io.imgbuild.cuda.driver.min-compat": "525.60.13"}


@pytest.fixture
def changed_data(monkeypatch, tmp_path):
    """imgbuild's data after a change to CUDA 12's floors (helpers.change_cuda12_floors)."""
    from helpers import change_cuda12_floors

    from buildkit_py.compat import tables

    change_cuda12_floors(monkeypatch, tmp_path)
    assert (driver_floor("12.4.1").native, driver_floor("12.4.1").minor_compat) == ("550.54.14", "535.154.05")
    yield
    tables.clear_caches()


@pytest.mark.parametrize(("driver", "by_labels", "by_data"), [
    ("550.54.14", "minor-version", "native"),        # the data lowered the native floor
    ("535.104.05", "minor-version", "incompatible"),  # the data raised the minor-version floor
    ("550.54.15", "native", "native"),
])
def test_an_images_labels_give_its_verdict_whatever_the_data_says_now(changed_data, driver, by_labels, by_data):
    floor = floor_from_labels(IMAGE_LABELS, "12.4.1")
    assert floor is not None and floor.source == "labels"
    r = check_compat("12.4.1", driver, floor=floor)
    assert (r.verdict, r.min_driver, r.min_driver_compat) == (by_labels, "550.54.15", "525.60.13")
    assert r.to_json()["floor_source"] == "labels"
    # the image's labels disagree with the data: followed, and the difference said
    assert len(r.warnings) == 1 and r.warnings[0].code == "floor-labels-differ"
    assert r.warnings[0].hint == f"to judge by the data instead: imgbuild check --cuda 12.4.1 --driver {driver}"
    assert r.warnings[0].message.startswith(
        "imgbuild's data now differs for CUDA 12.4.1: >= 550.54.14 native, >= 535.154.05 with minor-version "
        "compatibility (the image's labels say >= 550.54.15 native, >= 525.60.13 with minor-version compatibility)")
    assert (f"by the data it would be {by_data}" in r.warnings[0].message) is (by_data != by_labels)
    assert check_compat("12.4.1", driver).verdict == by_data  # what the tables alone say


def test_an_image_without_floor_labels_is_judged_by_the_data(changed_data):
    assert floor_from_labels({"io.imgbuild.cuda.version": "12.4.1"}, "12.4.1") is None
    r = check_compat("12.4.1", "550.54.14")
    assert (r.verdict, r.floor.source, r.warnings) == ("native", "data", ())


def test_labels_that_agree_with_the_data_bring_no_warning():
    r = check_compat("12.4.1", "535.104.05", floor=floor_from_labels(IMAGE_LABELS, "12.4.1"))
    assert (r.verdict, r.floor.source, r.warnings) == ("minor-version", "labels", ())


def test_an_unpublished_native_floor_is_carried_by_its_absence():
    """CUDA 13.3 images carry only the minor-version label: that is the whole contract; the driver
    known to run it natively (its installer's) is evidence from the data, not a floor."""
    labels = {"io.imgbuild.cuda.version": "13.3.1", "io.imgbuild.cuda.driver.min-compat": "580"}
    floor = floor_from_labels(labels, "13.3.1")
    assert floor is not None and (floor.native, floor.minor_compat) == (None, "580")
    assert floor.evidence == driver_floor("13.3.1").evidence and floor.evidence is not None
    assert [check_compat("13.3.1", d, floor=floor).verdict for d in ("575.51.03", "590.48.01", "610.43.02")] == [
        "incompatible", "minor-version", "native"]
    assert check_compat("13.3.1", "590.48.01", floor=floor).warnings == ()


def test_labels_of_a_cuda_the_data_does_not_know_still_give_a_verdict():
    """An image from a newer imgbuild (CUDA 13.9, unknown here): its labels answer; the warning says
    that nothing here backs them. Without labels such an image is an unknown CUDA (exit 2 in the CLI)."""
    labels = {"io.imgbuild.cuda.version": "13.9.0", "io.imgbuild.cuda.driver.min": "640.10.01",
              "io.imgbuild.cuda.driver.min-compat": "580"}
    floor = floor_from_labels(labels, "13.9.0")
    assert floor is not None
    assert [check_compat("13.9.0", d, floor=floor).verdict for d in ("575.51.03", "590.48.01", "640.10.01")] == [
        "incompatible", "minor-version", "native"]
    r = check_compat("13.9.0", "590.48.01", floor=floor)
    assert [(w.code, w.message) for w in r.warnings] == [
        ("floor-cuda-unknown",
         "imgbuild's data does not know CUDA 13.9.0: the verdict rests on the image's labels alone")]
    with pytest.raises(LookupError):
        check_compat("13.9.0", "590.48.01")


def test_a_floor_label_that_is_no_driver_version_is_refused():
    with pytest.raises(UsageError, match=r"io.imgbuild.cuda.driver.min='five fifty' is not a driver version"):
        floor_from_labels({**IMAGE_LABELS, "io.imgbuild.cuda.driver.min": "five fifty"}, "12.4.1")


def test_what_labels_stamp_is_what_check_reads_back_for_every_toolkit():
    """floor_labels and floor_from_labels are inverse for every toolkit the data knows."""
    from buildkit_py.compat import toolkits

    for t in toolkits():
        data = driver_floor(t.version)
        read = floor_from_labels({"io.imgbuild.cuda.version": t.version, **floor_labels(data)}, t.version)
        assert read is not None and dataclasses.replace(read, source=data.source) == data, t.version


def test_one_function_computes_a_driver_floor():
    """Every reader of the floors goes through compat.floors (issue 29: 2: there were three): outside
    it and the data's own loader and refresher, nothing reads a toolkit's linux_min_driver or
    composes a floor from minor_compat_floor / known_native_driver."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parent.parent / "buildkit_py"
    allowed = {"compat/floors.py", "compat/tables.py", "compat/refresh.py", "compat/__init__.py"}
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else \
                next((a.name for a in node.names if a.name in _FLOOR_PARTS), None) \
                if isinstance(node, ast.ImportFrom) else None
            if name in _FLOOR_PARTS:
                found.append(f"{rel}:{node.lineno}: {name}")
    assert found == []


_FLOOR_PARTS = {"linux_min_driver", "minor_compat_floor", "known_native_driver", "runfile_driver"}


@pytest.fixture
def image_with(monkeypatch):
    """`check IMAGE` on an image whose labels and env the test gives (the engine is not asked)."""
    from buildkit_py.cli import check as cli_check

    def use(labels: dict[str, str], env: dict[str, str] | None = None) -> None:
        monkeypatch.setattr(cli_check, "reading_engine", lambda args: None)
        monkeypatch.setattr(cli_check, "image_labels", lambda engine, target: (labels, env or {}))
    return use


def test_check_image_says_its_verdict_comes_from_its_labels(image_with, changed_data):
    from helpers import run_cli

    image_with(IMAGE_LABELS)
    code, out, err = run_cli("check", "team/app:1", "--driver", "535.104.05")
    assert code == 0, err
    assert out.splitlines()[:2] == [
        "image team/app:1: minor-version on driver 535.104.05",
        "  driver floors from the image's labels: >= 550.54.15 native, >= 525.60.13 with minor-version compatibility"]
    assert "  warning: [floor-labels-differ] imgbuild's data now differs for CUDA 12.4.1" in out
    assert "it would be incompatible (to judge by the data instead: imgbuild check --cuda 12.4.1 --driver 535.104.05)" \
        in out
    code, out, _ = run_cli("check", "team/app:1", "--driver", "535.104.05", "--json")
    data = json.loads(out)
    assert (code, data["verdict"], data["floor_source"], data["floors_from"]) == (
        0, "minor-version", "labels", "from the image's labels")
    assert data["warnings"][0]["code"] == "floor-labels-differ" and data["warnings"][0]["key"] is None
    assert data["warnings"][0]["message"].startswith("imgbuild's data now differs")


def test_check_image_without_floor_labels_says_it_used_the_data(image_with, changed_data):
    from helpers import run_cli

    image_with({}, {"CUDA_VERSION": "12.4.1"})  # e.g. an nvidia/cuda image
    code, out, _ = run_cli("check", "nvidia/cuda:12.4.1-base-ubuntu22.04", "--driver", "535.104.05", "--json")
    data = json.loads(out)
    assert (code, data["verdict"], data["floor_source"], data["floors_from"]) == (
        1, "incompatible", "data", "from imgbuild's data, the image carries no floor")
    assert "warnings" not in data
    code, out, _ = run_cli("check", "nvidia/cuda:12.4.1-base-ubuntu22.04", "--driver", "535.104.05")
    assert "  driver floors from imgbuild's data, the image carries no floor: >= 550.54.14 native, " \
           ">= 535.154.05 with minor-version compatibility" in out.splitlines()


def test_check_image_with_a_broken_floor_label_exits_2(image_with):
    from helpers import run_cli

    image_with({**IMAGE_LABELS, "io.imgbuild.cuda.driver.min-compat": "latest"})
    code, out, err = run_cli("check", "team/app:1", "--driver", "535.104.05")
    assert (code, out) == (2, "")
    assert "io.imgbuild.cuda.driver.min-compat='latest' is not a driver version" in err


def test_empty_floor_labels_are_no_floor():
    """A Dockerfile FROM an imgbuild image can only empty the labels it inherits: empty is none."""
    assert floor_from_labels({**IMAGE_LABELS, "io.imgbuild.cuda.driver.min": "",
                              "io.imgbuild.cuda.driver.min-compat": ""}, "12.4.1") is None
