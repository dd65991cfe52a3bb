"""Shipped compatibility data: exact values from the sources, and the load-time invariants."""

from __future__ import annotations

import json

import pytest
from packaging.version import Version

from buildkit_py import compat
from buildkit_py.compat import tables
from buildkit_py.errors import CompatDataError


def test_all_files_validate_and_have_sources():
    compat.validate_all()
    srcs = compat.data_sources()
    assert set(srcs) == set(tables.DATA_FILES)
    assert all(s.strip() for s in srcs.values())


@pytest.mark.parametrize(("cuda", "linux", "windows"), [
    ("12.4.1", "550.54.15", "551.78"),
    ("12.4.0", "550.54.14", "551.61"),
    ("12.1.1", "530.30.02", "531.14"),
    ("11.8.0", "520.61.05", "520.06"),   # Table 3 (runfile bundles 522.06 for Windows)
    ("12.0.0", "525.60.13", "527.41"),
    ("12.2.2", "535.104.05", "537.13"),
    ("11.2.0", "460.27.03", "460.82"),   # Table 3 (runfile bundles 460.27.04)
    ("11.0.3", "450.51.06", "451.82"),
    ("13.0.0", "580.65.06", None),
    # Release Notes Table 3 (13.2 Update 2 edition), where the runfile-bundled driver differs
    ("12.8.0", "570.26", "570.65"),
    ("12.2.1", "535.86.09", "536.67"),
    ("11.7.1", "515.48.07", "516.31"),
    ("12.8.1", "570.124.06", "572.61"),
    ("12.9.1", "575.57.08", "576.57"),
    ("13.1.0", "590.44.01", None),
    ("13.2.2", "595.71.05", None),
])
def test_toolkit_drivers(cuda, linux, windows):
    t = compat.resolve_cuda(cuda)
    assert (t.version, t.linux_min_driver, t.windows_min_driver) == (cuda, linux, windows)


@pytest.mark.parametrize(("spec", "exact"), [("12.4", "12.4.1"), ("12.6", "12.6.3"), ("11.8", "11.8.0"), ("12.4.0", "12.4.0")])  # noqa: E501
def test_resolve_cuda(spec, exact):
    assert compat.resolve_cuda(spec).version == exact


@pytest.mark.parametrize("spec", ["12", "12.7", "12.4.9", "14.0", "latest", "12.4.1.1"])
def test_resolve_cuda_unknown(spec):
    with pytest.raises(LookupError, match="known near it"):
        compat.resolve_cuda(spec)


def test_toolkits_sorted_and_span():
    vs = [t.version for t in compat.toolkits()]
    assert vs == sorted(vs, key=Version) and len(set(vs)) == len(vs)
    assert vs[0].startswith("11.0") and vs[-1].startswith("13.")
    assert not any(v.startswith("12.7.") for v in vs)


@pytest.mark.parametrize(("major", "floor"), [(11, "450.80.02"), (12, "525.60.13"), (13, "580"), (10, None)])
def test_minor_compat_floor(major, floor):
    assert compat.minor_compat_floor(major) == floor


@pytest.mark.parametrize(("cuda", "branches"), [("12.4", ()), ("13.0", ()), ("13.5", ()), ("11.8", ()), ("11.0", ())])
def test_forward_compat_branches(cuda, branches):
    assert compat.forward_compat_branches(cuda) == branches


@pytest.mark.parametrize(("version", "variants", "pypi_variant"), [
    ("2.1.2", {"cu118": "11.8", "cu121": "12.1"}, "cu121"),
    ("2.4.1", {"cu118": "11.8", "cu121": "12.1", "cu124": "12.4"}, "cu121"),
    ("2.5.1", {"cu118": "11.8", "cu121": "12.1", "cu124": "12.4"}, "cu124"),
    ("2.8.0", {"cu126": "12.6", "cu128": "12.8", "cu129": "12.9"}, "cu128"),
    ("2.9.1", {"cu126": "12.6", "cu128": "12.8", "cu130": "13.0"}, "cu128"),
])
def test_torch_variants(version, variants, pypi_variant):
    r = compat.torch_release(version)
    assert r.variants == variants and r.pypi_variant == pypi_variant


def test_torch_pypi_pins_and_python():
    r = compat.torch_release("2.4.1")
    assert r.pypi_cuda_wheels["nvidia-cuda-runtime-cu12"] == "12.1.105"
    assert r.triton == "3.0.0"
    assert "3.11" in r.python and "3.7" not in r.python
    assert "3.9" not in compat.torch_release("2.9.0").python


def test_torch_unknown_and_index():
    with pytest.raises(LookupError):
        compat.torch_release("2.99.0")
    assert compat.torch_index_url("cu124") == "https://download.pytorch.org/whl/cu124"
    assert [r.version for r in compat.torch_releases()][0] == "1.13.0"


@pytest.mark.parametrize(("cuda", "flavor", "cudnn", "os", "tag"), [
    ("12.4.1", "runtime", "9", "ubuntu22.04", "12.4.1-cudnn-runtime-ubuntu22.04"),
    ("12.4", "devel", "9", "ubuntu22.04", "12.4.1-cudnn-devel-ubuntu22.04"),
    ("12.1.1", "runtime", "8", "ubuntu22.04", "12.1.1-cudnn8-runtime-ubuntu22.04"),
    ("11.8.0", "devel", "8", "ubuntu22.04", "11.8.0-cudnn8-devel-ubuntu22.04"),
    ("12.3.2", "devel", "9", "ubuntu20.04", "12.3.2-cudnn9-devel-ubuntu20.04"),
    ("12.6.3", "base", None, "ubuntu24.04", "12.6.3-base-ubuntu24.04"),
    ("12.5", "runtime", None, "ubuntu24.04", "12.5.1-runtime-ubuntu24.04"),
    # X.Y takes the newest patch that has this image for this OS, not the newest patch
    ("13.3", "runtime", "9", "ubuntu26.04", "13.3.1-cudnn-runtime-ubuntu26.04"),
    ("13.3", "runtime", None, "ubuntu26.04", "13.3.1-runtime-ubuntu26.04"),
    ("13.1", "devel", None, "ubuntu22.04", "13.1.2-devel-ubuntu22.04"),
])
def test_image_tags(cuda, flavor, cudnn, os, tag):
    assert compat.cuda_image_tag(cuda, flavor, cudnn, os) == tag


@pytest.mark.parametrize("args", [
    ("12.5.1", "runtime", "9", "ubuntu24.04"),   # 12.5.1 on 24.04: base/runtime/devel only
    ("12.5.1", "devel", "9", "ubuntu24.04"),
    ("12.5", "runtime", "9", "ubuntu24.04"),
    ("13.1.0", "devel", "9", "ubuntu24.04"),     # 13.1.0 has no cudnn tags
    ("13.3.0", "runtime", "9", "ubuntu26.04"),   # 26.04 cudnn tags start at 13.3.1
    ("12.1.0", "runtime", "8", "ubuntu18.04"),
    ("13.4", "runtime", None, "ubuntu22.04"),    # no 13.4.x for 22.04
    ("11.6.1", "runtime", None, "ubuntu18.04"),  # deleted
    ("12.4.1", "runtime", "9", "ubuntu24.04"), ("12.4.1", "base", "9", "ubuntu22.04"),
    ("12.1.1", "runtime", "9", "ubuntu22.04"), ("10.2", "runtime", None, "ubuntu18.04"),
])
def test_image_tag_nvidia_never_published_is_refused(args):
    with pytest.raises(compat.ImageGap):
        compat.cuda_image_tag(*args)


def test_every_tag_is_one_the_data_records():
    """cuda_image_tag answers exactly the (release, OS, flavor, cuDNN) combinations images.json
    lists, read here straight from the file."""
    raw = json.loads(tables.data_dir().joinpath("images.json").read_text())
    oses = sorted({o for row in raw["images"] for o in row["os"]} | {"ubuntu26.04"})
    seen = 0
    for row in raw["images"]:
        for os_ in oses:
            for flavor in ("base", "runtime", "devel"):
                for cudnn in (None, "8", "9"):
                    listed = os_ in row["os"] and (cudnn is None or (cudnn in row["os"][os_] and flavor != "base"))
                    try:
                        tag = compat.cuda_image_tag(row["cuda"], flavor, cudnn, os_)
                    except compat.ImageGap:
                        tag = None
                    assert (tag is not None) == listed, (row["cuda"], os_, flavor, cudnn, tag)
                    if tag:
                        assert tag in compat.cuda_image_tags(row["cuda"]) and tag.endswith(f"-{flavor}-{os_}")
                        seen += 1
    assert seen > 300


def test_minor_on_an_os_without_it_names_what_exists():
    with pytest.raises(compat.ImageGap) as info:
        compat.image_release("13.4", "runtime", None, "ubuntu22.04")
    gap = info.value
    assert gap.reason == ("nvidia/cuda publishes 13.4.x runtime images for ubuntu24.04, ubuntu26.04; "
                          "for ubuntu22.04 the newest is 13.3.1")
    assert gap.hint.startswith('use cuda: "13.3" on ubuntu22.04 (the newest that fit: 13.3.1, 13.2.1, 13.1.2)')
    assert "base.os: ubuntu26.04 (13.4.2), ubuntu24.04 (13.4.2)" in gap.hint
    assert (gap.key, gap.other, gap.other_value) == ("cuda.version", "base.os", "ubuntu22.04")


def test_cudnn_missing_on_one_os_names_the_newest_of_both_majors():
    with pytest.raises(compat.ImageGap) as info:
        compat.image_release("12.5", "runtime", "9", "ubuntu24.04")
    gap = info.value
    assert gap.reason == ("nvidia/cuda publishes 12.5.x cuDNN 9 runtime images for ubuntu20.04, ubuntu22.04; "
                          "for ubuntu24.04 the newest with cuDNN 9 is 13.4.2 (12.x: 12.9.2)")
    assert '"12.9" (12.9.2) to stay on CUDA 12' in gap.hint
    assert (gap.key, gap.other_value) == ("cuda.cudnn", "9 on ubuntu24.04")


def test_image_oses_cudnn():
    assert compat.cuda_image_oses("12.4") == ("ubuntu20.04", "ubuntu22.04")
    assert compat.cudnn_versions("12.1") == ("8",) and compat.cudnn_versions("12.4") == ("9",)
    assert compat.cudnn_versions("12.5.1", "ubuntu24.04") == () and compat.cudnn_versions("13.1.0") == ()
    assert compat.newest_images("runtime", "9", "ubuntu26.04") == ("13.4.2", "13.3.1")


@pytest.mark.parametrize(("cuda", "before", "on", "deletion", "basis"), [
    ("12.4.1", "2026-05-31", "2026-06-01", "2026-12-01", "driver"),   # R535 EOL, NVIDIA's chart
    ("12.6.2", "2024-12-02", "2024-12-03", "2025-06-03", "chart"),
    ("11.0.3", "2023-06-30", "2023-07-01", "2024-01-01", "chart"),
    ("12.8.0", "2025-03-12", "2025-03-13", "2025-09-13", "newer-patch"),  # 12.8.1 released
    ("11.8.0", "2025-08-10", "2025-08-11", None, "major"),  # CUDA 13 out: two majors
    ("13.4.1", "2026-10-04", "2026-10-05", "2027-04-05", "newer-patch"),
])
def test_image_end_of_life_against_the_date(cuda, before, on, deletion, basis):
    import datetime
    day = datetime.date.fromisoformat
    assert compat.image_end_of_life(cuda, day(before)) is None
    eol = compat.image_end_of_life(cuda, day(on))
    assert eol is not None and (eol.date, eol.basis) == (day(on), basis)
    assert eol.deletion == (day(deletion) if deletion else None)
    assert compat.image_end_of_life(cuda, day("2099-01-01")) == eol  # and on every later day


@pytest.mark.parametrize("cuda", ["13.4.2", "13.3.1", "12.9.2", "13.2.2"])
def test_image_without_a_published_end_of_life(cuda):
    import datetime
    assert compat.image_end_of_life(cuda, datetime.date(2099, 1, 1)) is None


@pytest.mark.parametrize(("cuda", "has", "lacks"), [
    ("12.4", ("5.0", "9.0"), ("3.5", "10.0")),
    ("12.8", ("5.0", "10.0", "12.0"), ("3.5",)),
    ("13.0", ("7.5", "10.0", "12.0"), ("5.0", "6.1", "7.0")),
    ("11.8", ("3.5", "9.0"), ("10.0",)),
])
def test_cuda_archs(cuda, has, lacks):
    archs = compat.cuda_archs(cuda)
    assert all(a in archs for a in has) and not any(a in archs for a in lacks)


def test_cuda_runtime_wheels():
    assert compat.cuda_runtime_wheels("12.4")["nvidia-cuda-runtime-cu12"] == "12.4.127"
    assert compat.cuda_runtime_wheels("12.1.1")["nvidia-cuda-runtime-cu12"] == "12.1.105"
    assert compat.cuda_runtime_wheels("12.3")["nvidia-cuda-runtime-cu12"] == "12.3.101"


@pytest.mark.parametrize(("cuda", "toolkit", "runtime"), [
    ("11.8", "11.8.0", "nvidia-cuda-runtime-cu11==11.8.89"),
    ("12.0", "12.0.1", "nvidia-cuda-runtime-cu12==12.0.146"),
    ("12.9", "12.9.2", "nvidia-cuda-runtime-cu12==12.9.79"),
    ("13.0", "13.0.3", "nvidia-cuda-runtime==13.0.96"),  # CUDA 13: no suffix
    ("13.5", "13.5.0", "nvidia-cuda-runtime==13.5.37"),
])
def test_wheel_sets_per_cuda(cuda, toolkit, runtime):
    ws = compat.cuda_wheel_set(cuda)
    assert ws.toolkit == toolkit and ws.pins("cudart") == (runtime,)
    assert ws.naming == ("unsuffixed" if cuda.startswith("13") else "suffixed")
    assert ws.meta_package.startswith("cuda-toolkit==" + toolkit)


def test_every_toolkit_minor_has_wheels_or_a_reason():
    for t in compat.toolkits():
        try:
            compat.cuda_wheel_set(t.major_minor)
        except compat.CompatGap as gap:
            assert "11.7.99" in gap.reason and gap.hint and "11.8" in gap.hint  # 11.0-11.6: none on PyPI  # noqa: PT017


def test_wheel_gap_names_nearest_and_newest_fit():
    with pytest.raises(compat.CompatGap) as info:
        compat.cuda_wheel_set("12.4.5")
    assert info.value.nearest[:2] == ("12.4.0", "12.4.1") and '"12.4.1"' in info.value.hint


def test_devel_from_wheels_only_where_nvcc_is_in_them():
    assert {"nvcc", "crt", "nvvm", "cudart", "cccl", "cublas"} <= set(compat.devel_wheel_extras("13.0"))
    assert compat.cuda_wheel_home("13.2") == "nvidia/cu13"
    with pytest.raises(compat.CompatGap, match="ptxas only"):
        compat.devel_wheel_extras("12.9")


def test_cudnn_wheels():
    assert compat.cudnn_wheel("12.4.1", "9").wheel == "nvidia-cudnn-cu12"
    assert compat.cudnn_wheel("13.1.0", "9").wheel == "nvidia-cudnn-cu13"
    with pytest.raises(compat.CompatGap) as info:
        compat.cudnn_wheel("13.0.0", "8")
    assert info.value.hint == 'use cudnn: "9"'


def test_arch_variants():
    assert "9.0a" in compat.cuda_archs("12.0") and "9.0a" not in compat.cuda_archs("11.8")
    assert {"10.0a", "12.0a"} <= set(compat.cuda_archs("12.8")) and "10.0f" not in compat.cuda_archs("12.8")
    assert {"10.0f", "12.0f", "10.3a"} <= set(compat.cuda_archs("12.9"))
    assert compat.cuda_archs("11.0")[-1] == "8.0" and compat.cuda_archs("11.4")[-1] == "8.7"
    assert sorted(["10.0", "9.0a", "9.0"], key=compat.arch_key) == ["9.0", "9.0a", "10.0"]
    assert compat.arch_base("10.0f+PTX") == "10.0"


def test_flash_attn_and_bnb():
    fa = compat.flash_attn_release("2.6.3")
    assert fa.archs == ("8.0", "8.6", "8.9", "9.0") and "3.8" in fa.python
    assert "3.9" in compat.bitsandbytes_release("0.46.0").python and "3.8" not in compat.bitsandbytes_release("0.46.0").python  # noqa: E501
    with pytest.raises(LookupError):
        compat.flash_attn_release("9.9.9")


@pytest.mark.parametrize(("version", "torch", "cuda", "python", "archs"), [
    # flash-attn sdists (setup.py nvcc check, FLASH_ATTN_CUDA_ARCHS, PKG-INFO Requires-Python, README)
    ("2.5.8", ">=1.12", ">=11.6", ">=3.7", ("8.0", "8.6", "8.9", "9.0")),
    ("2.6.3", ">=1.12", ">=11.6", ">=3.8", ("8.0", "8.6", "8.9", "9.0")),
    ("2.7.4.post1", ">=2.2", ">=11.7", ">=3.9", ("8.0", "8.6", "8.9", "9.0", "10.0", "12.0")),
    ("2.8.3", ">=2.2", ">=11.7", ">=3.9", ("8.0", "8.6", "8.9", "9.0", "10.0", "12.0")),
])
def test_flash_attn_requirements(version, torch, cuda, python, archs):
    r = compat.flash_attn_release(version)
    assert (str(r.torch), str(r.cuda), str(r.python), r.archs) == (torch, cuda, python, archs)


@pytest.mark.parametrize(("version", "cuda", "torch", "python", "wheel_cuda"), [
    # wheel label: cu{major}{minor} through 2.6.x (setup.py maps CUDA 12 -> 12.2 / 12.3), cu{major} from 2.7
    ("2.5.8", "12.4", "2.3", "3.11", "12.2"),
    ("2.6.3", "12.4", "2.4", "3.11", "12.3"),
    ("2.6.3", "12.1", "2.4", "3.12", "12.3"),
    ("2.5.9.post1", "11.8", "1.12", "3.10", "11.8"),
    ("2.7.4.post1", "12.6", "2.6", "3.13", "12"),
    ("2.7.4.post1", "12.4", "2.4", "3.9", "12"),
    ("2.8.3", "12.8", "2.8", "3.13", "12"),
    ("2.8.3", "12.9", "2.7", "3.10", "12"),
    ("2.8.3", "12.4", "2.4", "3.12", "12"),
    # not published / not verified -> None (build from source)
    ("2.5.8", "12.4", "2.3", "3.12", None),   # issue #935: no cp312 wheel for 2.5.8
    ("2.8.3", "12.8", "2.9", "3.12", None),   # issues #2008/#2212: no cu12torch2.9 x86_64 wheel
    ("2.8.3", "13.0", "2.8", "3.12", None),   # no cu13 wheel
    ("2.8.3", "12.4", "2.4", "3.13", None),   # torch 2.4 has no Python 3.13
    ("2.7.4.post1", "12.6", "2.7", "3.12", None),
])
def test_flash_attn_prebuilt_matrix(version, cuda, torch, python, wheel_cuda):
    w = compat.flash_attn_prebuilt(version, cuda, torch, python)
    assert (w.cuda if w else None) == wheel_cuda


def test_flash_attn_prebuilt_abi_matches_pypi_torch():
    # PyPI torch is cxx11abi FALSE through 2.6 and TRUE from 2.7: every recorded wheel must exist in that ABI
    for v in ("2.5.8", "2.5.9.post1", "2.6.3", "2.7.4.post1", "2.8.3"):
        for w in compat.flash_attn_release(v).prebuilt:
            wanted = Version(w.torch) >= Version("2.7")
            assert wanted in w.cxx11abi, (v, w)


@pytest.mark.parametrize(("version", "cuda", "ok"), [
    # libbitsandbytes_cudaXYZ.so set in each PyPI wheel; exact match needed before 0.50.0
    ("0.41.1", "11.0", True), ("0.41.1", "12.2", True), ("0.41.1", "12.3", False),
    ("0.42.0", "12.3", True), ("0.42.0", "11.2", False),
    ("0.43.0", "11.6", False), ("0.43.0", "12.4", False), ("0.43.1", "12.4", True),
    ("0.43.3", "12.5", True), ("0.44.1", "12.6", False),
    ("0.45.0", "12.6", True), ("0.45.2", "12.8", False), ("0.45.3", "12.8", True),
    ("0.45.5", "11.7", True), ("0.46.0", "11.7", False), ("0.46.0", "12.9", False),
    ("0.46.1", "12.9", True), ("0.47.0", "13.0", False), ("0.48.0", "13.0", True),
    ("0.49.2", "13.1", False), ("0.49.2", "12.7.0", False),
    # 0.50.0+: same-major fallback in the loader
    ("0.50.0", "13.1", True), ("0.50.2", "12.9", True), ("0.50.2", "11.8", True),
])
def test_bitsandbytes_cuda_binaries(version, cuda, ok):
    from buildkit_py.compat.rules import cuda_in
    assert cuda_in(compat.bitsandbytes_release(version).cuda, cuda) is ok


def test_bitsandbytes_cuda_list_is_validated(monkeypatch, tmp_path):
    _with_data(monkeypatch, tmp_path, "bitsandbytes.json", lambda o: o["releases"][0].__setitem__("cuda", ["12.7"]))
    with pytest.raises(CompatDataError, match="known toolkit"):
        tables.validate_all()


# ---------------------------------------------------------------- invariants on broken data
def _torch_row(obj: dict) -> dict:
    """wheel_kernels.json's first torch row (1.13.0, cu116)."""
    return next(r for r in obj["rows"] if r["package"] == "torch")


def _with_data(monkeypatch, tmp_path, name: str, mutate):
    """Serve a mutated copy of one data file to the loaders."""
    from importlib import resources
    real = resources.files("buildkit_py.compat").joinpath("data")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    for f in tables.DATA_FILES:
        (data_dir / f).write_text(real.joinpath(f).read_text())
    obj = json.loads((data_dir / name).read_text())
    mutate(obj)
    (data_dir / name).write_text(json.dumps(obj))
    monkeypatch.setattr(tables.resources, "files", lambda pkg: tmp_path)
    tables.clear_caches()


@pytest.fixture(autouse=True)
def _clear_caches():
    yield
    tables.clear_caches()


def _swap_first_two(o):
    o["toolkits"][0], o["toolkits"][1] = o["toolkits"][1], o["toolkits"][0]


def _fa_row(o, version):
    return next(r for r in o["releases"] if r["version"] == version)


def _drop(version):
    return lambda o: o.__setitem__("toolkits", [t for t in o["toolkits"] if t["version"] != version])


def _set_img(cuda, key, value):
    """Set (None: remove) one key of images.json's row for ``cuda``."""
    def m(o):
        for row in o["images"]:
            if row["cuda"] == cuda:
                if value is None:
                    row.pop(key, None)
                else:
                    row[key] = value
    return m


def _set_tk(version, key, value):
    def m(o):
        for t in o["toolkits"]:
            if t["version"] == version:
                t[key] = value
    return m


@pytest.mark.parametrize(("name", "mutate", "match"), [
    ("toolkits.json", _swap_first_two, "ascending"),
    ("toolkits.json", lambda o: o["toolkits"].append(dict(o["toolkits"][-1])), "ascending"),
    ("toolkits.json", _drop("12.2.1"), None),  # 12.2.x still present via 12.2.0 and 12.2.2
    ("toolkits.json", lambda o: o["toolkits"].__setitem__(slice(None), [t for t in o["toolkits"] if not t["version"].startswith("12.5.")]), "gap"),  # noqa: E501
    ("toolkits.json", _set_tk("12.4.1", "linux_min_driver", "500.00"), "lower than"),
    ("toolkits.json", _set_tk("12.4.1", "linux_min_driver", "five fifty"), "malformed"),
    ("toolkits.json", _set_tk("12.4.1", "source", ""), "source"),
    ("toolkits.json", lambda o: o.__setitem__("schema", 2), "schema"),
    ("toolkits.json", _set_tk("13.5.0", "linux_min_driver", "610.43.02"), "'unpublished' floor must be null"),
    ("toolkits.json", _set_tk("13.2.2", "linux_min_driver", None), "only an 'unpublished' floor may be null"),
    ("toolkits.json", _set_tk("13.5.0", "min_driver_basis", "minor-compat"), "min_driver_basis"),
    ("toolkits.json", _set_tk("12.8.2", "linux_min_driver", "570.211.01"), "same-minor"),
    ("toolkits.json", _set_tk("12.8.2", "min_driver_basis", "runfile"), "min_driver_basis"),
    ("toolkits.json", _set_tk("12.8.2", "read", "yesterday"), "YYYY-MM-DD"),
    ("bitsandbytes.json", lambda o: o["releases"][-1].__setitem__("min_compute_capability", "sm60"), "malformed"),
    ("forward_compat.json", lambda o: o["entries"][-1].__setitem__("branches", ["535"]), "end of life"),
    ("forward_compat.json", lambda o: o["entries"][-1].pop("none_supported"), "none_supported"),
    ("torch.json", lambda o: o["releases"][0]["variants"].__setitem__("cu107", "10.7"), "known toolkit"),
    ("torch.json", lambda o: o["releases"][0]["variants"].__setitem__("cu118", "12.1"), "does not spell"),
    ("images.json", lambda o: o["images"][0].__setitem__("cuda", "11.0.9"), "known toolkit"),
    ("archs.json", lambda o: o["entries"][0]["archs"].append("sm_90"), "malformed"),
    ("archs.json", lambda o: o["entries"][0]["archs"].reverse(), "ascending"),
    ("flash_attn.json", lambda o: o["releases"][-1].__setitem__("archs", ["9.0", "8.0"]), "ascending"),
    ("flash_attn.json", lambda o: o["releases"][-1].pop("cxx_std"), "no cxx_std: a row without them must say why"),
    ("flash_attn.json", lambda o: _fa_row(o, "2.8.3")["prebuilt"][0].__setitem__("torch", "2.5"), "named torch2.5"),
    ("flash_attn.json", lambda o: _fa_row(o, "2.8.3")["prebuilt"][0].__setitem__("build_cuda", "13.0.2"), "named cu12"),
    ("flash_attn.json", lambda o: _fa_row(o, "2.8.3")["gencode"].reverse(), "ascending"),
    ("cxx_std.json", lambda o: o["torch"].pop(), "torch 2.14.0 falls in 0 ranges"),
    ("cxx_std.json", lambda o: o["torch"][1].__setitem__("torch", ">=2.1"), "torch 2.14.0 falls in 2 ranges"),
    ("cxx_std.json", lambda o: o["torch"][0].__setitem__("cxx_std", 15), "15 is not one of 11, 14, 17, 20"),
    ("bitsandbytes.json", lambda o: o["releases"][-1].__setitem__("cuda_nocublaslt", ["12.1"]),
     "goes with a cuda list"),
    ("bitsandbytes.json", lambda o: o["releases"][0].pop("partial"), "must say why"),
    ("wheels.json", lambda o: o["absent"].pop("11.3"), "wheels.json.*11.3.*absent"),
    ("wheels.json", lambda o: o["absent"]["11.3"].pop("reason"), "reason"),
    ("wheels.json", lambda o: o["releases"][-1]["extras"]["cudart"].__setitem__("nvidia-cuda-runtime", "13.4.92"), "same major.minor"),  # noqa: E501
    ("wheels.json", lambda o: o["families"]["13"].__setitem__("naming", "cu13"), "naming"),
    ("archs.json", lambda o: o["entries"].pop(0), "archs.json.*11.0.2.*architecture list"),
    ("archs.json", lambda o: o["entries"][-1]["archs"].__setitem__(slice(None), ["9.0a", "9.0"]), "ascending"),
    ("images.json", lambda o: o["absent"].pop("13.5.0"), "images.json.*13.5.*absent"),
    ("wheels.json", lambda o: o["cudnn"][2].__setitem__("cuda", ">=12.0,<13"), "outside cuDNN 8's support matrix"),
    ("cudnn.json", lambda o: o["majors"][0].__setitem__("cudnn", "eight"), "cuDNN major"),
    ("cudnn.json", lambda o: o["majors"][0].__setitem__("cuda", ">=11.0,<<12"), "not a specifier"),
    ("images.json", lambda o: o["images"].insert(1, o["images"][1]), "ascending and unique"),
    ("images.json", _set_img("13.0.0", "end_of_life", None), "13.0.1 supersedes it"),
    ("images.json", _set_img("13.2.1", "end_of_life_unknown", None), "13.2.2 supersedes it"),
    ("images.json", _set_img("13.4.2", "end_of_life", {"date": "2027-01-01", "basis": "newer-patch", "source": "x",
                                                       "read": "2026-12-04"}), "no newer patch"),
    ("images.json", _set_img("12.4.1", "end_of_life", {"date": "2026-06-01", "basis": "driver",
                                                       "deletion": "2026-01-01", "source": "x",
                                                       "read": "2026-12-04"}), "deletion 2026-01-01 before"),
    ("images.json", _set_img("12.4.1", "end_of_life", {"date": "2026-06-01", "basis": "guess", "source": "x",
                                                       "read": "2026-12-04"}), "is not one of chart"),
    ("images.json", _set_img("12.4.1", "cudnn_tag", None), "no cudnn_tag"),
    ("images.json", _set_img("12.4.1", "os", {"ubuntu20.04": ["8"], "ubuntu22.04": ["9"]}), "tags would clash"),
    ("images.json", _set_img("12.3.2", "cudnn_tag", "cudnn8"), "another cuDNN major"),
    ("images.json", _set_img("12.4.1", "os", {"ubuntu2204": ["9"]}), "not an OS of nvidia/cuda tags"),
    ("images.json", _set_img("12.4.1", "os", {}), "images.json"),
    ("wheel_kernels.json", lambda o: o["rows"].append(o["rows"][0]), "listed twice"),
    ("wheel_kernels.json", lambda o: o["rows"][0]["libraries"][0]["sass"].reverse(), "ascending and distinct"),
    ("wheel_kernels.json", lambda o: _torch_row(o).__setitem__("variant", "cu130"), "no 'cu130' build"),
    ("wheel_kernels.json", lambda o: _torch_row(o).__setitem__("version", "0.9.9"), "torch.json does not know"),
    ("wheel_kernels.json", lambda o: o["rows"][0]["libraries"][0]["ptx"].append("9.0+PTX"), "wheel_kernels.json"),
])
def test_invariants(monkeypatch, tmp_path, name, mutate, match):
    _with_data(monkeypatch, tmp_path, name, mutate)
    if match is None:
        tables.validate_all()
        return
    with pytest.raises(CompatDataError, match=match) as exc:
        tables.validate_all()
    assert name in exc.value.message


# ---------------------------------------------------------------- current data (issue 14)
@pytest.mark.parametrize(("cuda", "floor", "basis", "runfile"), [
    ("12.8", "570.124.06", "same-minor", "570.211.01"),   # 12.8.2: no Table 3 row; the runfile's driver is no floor
    ("12.8.1", "570.124.06", "table3", None),
    ("13.0.3", "580.95.05", "same-minor", "580.126.20"),
    ("13.3.1", None, "unpublished", "610.43.02"),   # no Table 3 row for 13.3: the native floor is unknown
    ("13.4", None, "unpublished", None),
    ("13.5", None, "unpublished", None),
])
def test_toolkit_floor_basis(cuda, floor, basis, runfile):
    t = compat.resolve_cuda(cuda)
    assert (t.linux_min_driver, t.min_driver_basis, t.runfile_driver) == (floor, basis, runfile)


@pytest.mark.parametrize(("cuda", "driver"), [
    ("13.3.0", "610.43.02"),   # the driver NVIDIA's 13.3.0 installer bundles runs 13.3 natively
    ("13.3.1", "610.43.02"),   # ... and every 13.3.x (one driver API version per minor)
    ("13.4", None),            # no installer driver, no later published floor: unknown
    ("13.2.2", None),          # published floor: no evidence needed
])
def test_known_native_driver(cuda, driver):
    got = compat.known_native_driver(cuda)
    assert (got.driver if got else None) == driver


def test_toolkits_through_13_5():
    assert [t.version for t in compat.toolkits() if t.major_minor in ("13.4", "13.5")] == [
        "13.4.1", "13.4.2", "13.4.3", "13.5.0"]


@pytest.mark.parametrize(("version", "variants", "pypi_variant", "toolkit"), [
    ("2.11.0", {"cu126", "cu128", "cu130"}, "cu130", "13.0.2"),
    ("2.12.1", {"cu126", "cu130", "cu132"}, "cu130", "13.0.2"),
    ("2.14.0", {"cu126", "cu130", "cu132"}, "cu130", "13.0.3"),
    ("2.14.1", {"cu126", "cu130", "cu132"}, "cu130", "13.0.3"),
    ("2.15.0", {"cu132"}, "cu132", "13.2.2"),
])
def test_torch_current_releases(version, variants, pypi_variant, toolkit):
    r = compat.torch_release(version)
    assert set(r.variants) == variants and r.pypi_variant == pypi_variant
    assert r.pypi_cuda_wheels["cuda-toolkit"] == toolkit and "cudart" in r.pypi_cuda_toolkit_extras
    assert "cu129" not in compat.torch_release("2.12.0").variants


def test_torch_2_15_python_floor():
    r = compat.torch_release("2.15.0")
    assert "3.10" not in r.python and "3.11" in r.python and "3.15" in r.python


def test_every_row_has_a_read_date_in_owned_files():
    """Each file's "as of" is the newest date one of its rows was read."""
    for name, rows_key in [("toolkits.json", "toolkits"), ("torch.json", "releases"), ("flash_attn.json", "releases"),
                           ("bitsandbytes.json", "releases"), ("minor_compat.json", "floors"),
                           ("cxx_std.json", "torch")]:
        raw = tables.load_raw(name)
        assert all(r.get("read") for r in raw[rows_key]), name
        assert raw["as_of"] == max(r["read"] for r in raw[rows_key]), name


def test_flash_attn_post_releases_and_fa3():
    r = compat.flash_attn_release("2.8.3.post2")
    assert r.prebuilt == () and "8.0" in r.archs
    assert compat.flash_attn_prebuilt("2.8.3.post1", "12.8", "2.8", "3.12").cuda == "12"
    assert compat.flash_attn_prebuilt("2.8.3.post1", "13.0", "2.9", "3.12") is None
    assert tables.load_raw("flash_attn.json")["fa3"]["published_wheels"] == []


@pytest.mark.parametrize(("version", "torch_ok", "torch_bad", "cc"), [
    ("0.47.0", "2.2.0", "2.1.2", "5.0"),
    ("0.48.0", "2.3.1", "2.2.2", "6.0"),
    ("0.50.2", "2.4.1", "2.3.1", "6.0"),
])
def test_bitsandbytes_floors(version, torch_ok, torch_bad, cc):
    r = compat.bitsandbytes_release(version)
    assert torch_ok in r.torch and torch_bad not in r.torch
    assert r.min_compute_capability == cc and r.int8_compute_capability == "7.5"


@pytest.mark.parametrize(("cuda", "os_"), [("12.5.1", "ubuntu24.04"), ("13.0.2", "ubuntu24.04"), ("13.3.1", "ubuntu26.04"),  # noqa: E501
                                       ("13.4", "ubuntu26.04"), ("13.4", "ubuntu24.04")])
def test_current_image_oses(cuda, os_):
    assert os_ in compat.cuda_image_oses(cuda)


def test_image_absent_names_its_reason():
    with pytest.raises(LookupError, match="no nvidia/cuda 13.5.0 tag seen"):
        compat.cuda_image_tag("13.5", "runtime", None, "ubuntu24.04")


# ---------------------------------------------------------------- the schema (compat.schema.json)
@pytest.mark.parametrize("name", [*tables.DATA_FILES, "torch_cuda_pins.json"])
def test_shipped_data_follows_its_schema_for_both_validators(name):
    from importlib import resources

    import jsonschema

    from buildkit_py import schemas

    data = json.loads(resources.files("buildkit_py.compat").joinpath("data", name).read_text())
    schema = schemas.load_schema("compat")
    assert name in schema["$defs"]
    assert schemas.validate(data, {"$ref": f"#/$defs/{name}"}, root=schema) == []
    assert [e.message for e in jsonschema.Draft202012Validator({**schema, "$ref": f"#/$defs/{name}"})
            .iter_errors(data)] == []


def test_every_data_file_has_its_schema():
    from importlib import resources

    from buildkit_py import schemas

    shipped = {p.name for p in resources.files("buildkit_py.compat").joinpath("data").iterdir()
               if p.name.endswith(".json")}
    defs = {k for k in schemas.load_schema("compat")["$defs"] if k.endswith(".json")}
    assert shipped == defs


def test_schema_errors_are_all_reported_at_file_line_and_key(monkeypatch, tmp_path):
    def mutate(o):
        o["toolkits"][3]["linux_min_driver"] = "five fifty"
        o["toolkits"][5]["read"] = "yesterday"
        o["toolkits"][7]["sorce"] = "typo"

    _with_data(monkeypatch, tmp_path, "toolkits.json", mutate)
    path = tmp_path / "data" / "toolkits.json"
    obj = json.loads(path.read_text())
    text = json.dumps(obj, indent=1)  # one key a line, as the shipped files are written
    path.write_text(text)
    with pytest.raises(CompatDataError) as exc:
        tables.validate_all()
    lines = text.splitlines()
    found = [ln for ln in exc.value.message.splitlines() if ln.startswith(str(path))]
    assert len(found) == 3, exc.value.message
    for entry, key, words in [(3, "linux_min_driver", "malformed driver version"), (5, "read", "YYYY-MM-DD"),
                              (7, "sorce", "unknown key (did you mean 'source'?)")]:
        issue = next(f for f in found if f".toolkits[{entry}].{key}:" in f or f": toolkits[{entry}].{key}:" in f)
        line = int(issue[len(str(path)) + 1:].split(":", 1)[0])
        assert f'"{key}"' in lines[line - 1] and words in issue, (issue, lines[line - 1])
    assert exc.value.exit_status == 1 and "bug in the shipped data" in exc.value.hint


# ---------------------------------------------------------------- issue 21: flash-attn and bitsandbytes releases
# Every release https://pypi.org/simple/flash-attn/ and .../bitsandbytes/ list (read 2026-12-04; flash-attn 1.0.3
# is yanked there). The data had 7 and 29 of them.
FLASH_ATTN_ON_PYPI = """
0.2.0 0.2.1 0.2.2 0.2.3 0.2.4 0.2.5 0.2.6.post1 0.2.7 0.2.8 1.0.0 1.0.1 1.0.2 1.0.3.post0 1.0.4 1.0.5 1.0.6 1.0.7 1.0.8
1.0.9 2.0.0.post1 2.0.1 2.0.2 2.0.3 2.0.4 2.0.5 2.0.6 2.0.6.post2 2.0.7 2.0.8 2.0.9 2.1.0 2.1.1 2.1.2.post3 2.2.0 2.2.1
2.2.2 2.2.3.post2 2.2.4 2.2.4.post1 2.2.5 2.3.0 2.3.1.post1 2.3.2 2.3.3 2.3.4 2.3.5 2.3.6 2.4.0.post1 2.4.1 2.4.2
2.4.3.post1 2.5.0 2.5.1.post1 2.5.2 2.5.3 2.5.4 2.5.5 2.5.6 2.5.7 2.5.8 2.5.9.post1 2.6.0.post1 2.6.1 2.6.2 2.6.3
2.7.0.post2 2.7.1.post4 2.7.2.post1 2.7.3 2.7.4.post1 2.8.0.post2 2.8.1 2.8.2 2.8.3 2.8.3.post1 2.8.3.post2""".split()
BNB_ON_PYPI = """
0.31.8 0.32.0 0.32.2 0.32.3 0.33.0 0.34.0 0.35.0 0.35.2 0.35.3 0.35.4 0.36.0 0.36.0.post2 0.37.0 0.37.1 0.37.2 0.38.0
0.38.0.post1 0.38.0.post2 0.38.1 0.39.0 0.39.1 0.40.0 0.40.0.post1 0.40.0.post2 0.40.0.post3 0.40.0.post4 0.40.1
0.40.1.post1 0.40.2 0.41.0 0.41.1 0.41.2 0.41.2.post1 0.41.2.post2 0.41.3 0.41.3.post1 0.41.3.post2 0.42.0 0.43.0 0.43.1
0.43.2 0.43.3 0.44.0 0.44.1 0.45.0 0.45.1 0.45.2 0.45.3 0.45.4 0.45.5 0.46.0 0.46.1 0.47.0 0.48.0 0.48.1 0.48.2 0.49.0
0.49.1 0.49.2 0.50.0 0.50.1 0.50.2""".split()


def test_every_release_on_the_index_is_known():
    assert (len(FLASH_ATTN_ON_PYPI), len(BNB_ON_PYPI)) == (76, 62)
    assert [r.version for r in compat.flash_attn_releases()] == FLASH_ATTN_ON_PYPI
    assert [r.version for r in compat.bitsandbytes_releases()] == BNB_ON_PYPI


def test_partial_rows_are_the_ones_the_sources_cannot_settle():
    # flash-attn: no tag in the repository (0.2.0, 0.2.6.post1, 2.0.0.post1) or a README without the PyTorch and
    # CUDA floors (0.2.x); bitsandbytes: every release whose loader finds CUDA by a libcudart.so search (< 0.40.1)
    assert [r.version for r in compat.flash_attn_releases() if r.partial] == [
        "0.2.0", "0.2.1", "0.2.2", "0.2.3", "0.2.4", "0.2.5", "0.2.6.post1", "0.2.7", "0.2.8", "2.0.0.post1"]
    assert [r.version for r in compat.bitsandbytes_releases() if r.partial] == BNB_ON_PYPI[:26]
    assert BNB_ON_PYPI[26] == "0.40.1" and "libcudart.so" in compat.bitsandbytes_release("0.40.0.post4").partial


@pytest.mark.parametrize(("version", "wheels"), [
    # python x torch x CUDA x cxx11abi of the tag's publish.yml, minus its excludes
    ("2.5.8", 74), ("2.6.3", 84), ("2.7.3", 100), ("2.7.4.post1", 44), ("2.8.0.post2", 38), ("2.8.3", 48),
    ("2.8.3.post1", 48), ("2.8.3.post2", 0), ("2.0.6", 72), ("2.0.5", 0),
])
def test_flash_attn_release_wheels_per_publish_matrix(version, wheels):
    r = compat.flash_attn_release(version)
    assert sum(len(w.python) * len(w.cxx11abi) for w in r.prebuilt) == wheels


@pytest.mark.parametrize(("version", "nvcc", "sms"), [
    ("2.8.3", "12.9.1", ("8.0", "9.0", "10.0", "12.0")),   # its wheels' toolkit
    ("2.7.4.post1", "12.4.1", ("8.0", "9.0")),              # its wheels' toolkit: no Blackwell SASS
    ("2.7.4.post1", "12.8.1", ("8.0", "9.0", "10.0", "12.0")),
    ("2.6.3", "12.8", ("8.0", "9.0")),
    ("2.5.8", "11.7", ("8.0",)),
    ("2.2.4", "12.2", ("8.0",)),   # sm_90 commented out in that tag's setup.py
])
def test_flash_attn_gencode(version, nvcc, sms):
    assert compat.flash_attn_release(version).sms(nvcc) == sms


def test_flash_attn_archs_follow_gencode():
    assert compat.flash_attn_release("2.2.4").archs == ("8.0", "8.6", "8.9")
    assert compat.flash_attn_release("2.7.3").archs == ("8.0", "8.6", "8.9", "9.0", "10.0", "12.0")
    assert compat.flash_attn_release("1.0.9").archs == ("7.5", "8.0", "8.6", "8.9", "9.0")


@pytest.mark.parametrize(("version", "cuda", "torch", "python", "archs", "abi", "wheel_cuda"), [
    ("2.8.3", "12.8", "2.7", "3.11", ("10.0", "12.0"), True, "12"),   # built with CUDA 12.9.1
    ("2.8.0.post2", "12.8", "2.7", "3.12", ("12.0",), True, "12"),    # built with CUDA 12.9.0
    ("2.7.4.post1", "12.6", "2.6", "3.11", ("9.0",), False, "12"),
    ("2.7.4.post1", "12.6", "2.6", "3.11", ("10.0",), False, None),   # built with CUDA 12.4.1
    ("2.7.3", "11.8", "2.5", "3.11", (), False, "11"),
    ("2.6.3", "12.4", "2.4", "3.11", ("8.6", "8.9"), False, "12.3"),  # 8.x runs the sm_80 cubin
    ("2.6.3", "12.4", "2.4", "3.11", (), True, "12.3"),               # both ABIs built
    # 2.2.x built cu116/cu117/cu118/cu122: setup.py asks for torch's own CUDA, no other
    ("2.2.2", "11.7", "2.0", "3.10", (), False, "11.7"),
    ("2.2.2", "11.8", "2.0", "3.10", (), False, "11.8"),
    ("2.2.2", "12.1", "2.1", "3.10", (), False, None),                # torch 2.1 wheels: built on a 2.1 nightly
    ("2.5.8", "12.4", "2.4", "3.11", (), False, None),                # torch 2.4 wheels: built on 2.4.0.dev20240407
    ("2.5.8", "12.4", "2.3", "3.11", (), False, "12.2"),
])
def test_flash_attn_prebuilt_by_sass_label_and_abi(version, cuda, torch, python, archs, abi, wheel_cuda):
    w = compat.flash_attn_prebuilt(version, cuda, torch, python, archs=archs, cxx11abi=abi)
    assert (w.cuda if w else None) == wheel_cuda


@pytest.mark.parametrize(("sm", "arch", "runs"), [
    ("8.0", "8.0", True), ("8.0", "8.6", True), ("8.0", "8.9", True), ("8.6", "8.0", False), ("8.0", "9.0", False),
    ("9.0", "9.0a", True), ("10.0", "10.3", True), ("10.0", "12.0", False), ("12.0", "10.0", False),
])
def test_sass_runs_on_same_major_same_or_newer_minor(sm, arch, runs):
    assert compat.sass_runs_on(sm, arch) is runs


@pytest.mark.parametrize(("torch", "std"), [
    ("1.13.0", 14), ("2.0.1", 14), ("2.1.0", 17), ("2.12.0", 17), ("2.13.0", 17), ("2.14.0", 20), ("2.14.1", 20),
    ("2.15.0", 20), ("2.16.0", 20),
])
def test_torch_cxx_std_from_its_header_guards(torch, std):
    assert compat.torch_cxx_std(torch) == std


def test_every_flash_attn_release_compiles_as_cxx17():
    """setup.py passes -std=c++17 to nvcc and the host compiler at every tag, 2.8.3.post2's sdist too."""
    assert {r.cxx_std for r in compat.flash_attn_releases() if not r.partial} == {17}


@pytest.mark.parametrize(("version", "cuda", "nocublaslt"), [
    ("0.40.1", ["11.0", "11.1", "11.3", "11.4", "11.5", "11.7", "11.8", "12.0", "12.1", "12.2"],
     ["11.0", "11.1", "11.3", "11.4", "11.5", "11.7", "12.0", "12.1", "12.2"]),
    ("0.41.3.post2", ["11.0", "11.1", "11.4", "11.5", "11.7", "11.8", "12.0", "12.1", "12.2"], None),
    ("0.36.0", [], ["11.0", "11.1", "11.2", "11.3", "11.4", "11.5", "11.6", "11.7", "11.8", "12.0"]),
])
def test_bitsandbytes_cuda_libraries_from_the_wheel(version, cuda, nocublaslt):
    r = compat.bitsandbytes_release(version)
    assert list(r.cuda) == cuda
    assert (list(r.cuda_nocublaslt) if r.cuda_nocublaslt is not None else None) == nocublaslt


def test_refresh_validates_the_files_it_would_write_not_the_shipped_ones():
    """`data refresh` loads the files it is about to write in a child process, from a folder
    passed as its argument (no $IMGBUILD_COMPAT_DATA read: issue 32, 4): broken ones are refused,
    the shipped ones pass."""
    from buildkit_py.compat import refresh

    raw = json.loads(tables.data_dir().joinpath("toolkits.json").read_text())
    refresh.validate_files({"toolkits.json": refresh.dump(raw)})
    _swap_first_two(raw)
    with pytest.raises(CompatDataError, match="refreshed data would not load: .*ascending"):
        refresh.validate_files({"toolkits.json": refresh.dump(raw)})
