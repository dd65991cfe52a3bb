"""The content model (compat/wheel_contents.py): what each pinned wheel brings, read from the wheel,
and the rules over it that the plan's CUDA and cuDNN claims come from (issue 29, item 1)."""

from __future__ import annotations

import pytest
from helpers import TODAY
from packaging.utils import canonicalize_name
from pyindex import LocalIndex

from buildkit_py import compat
from buildkit_py.compat import wheel_contents as wc
from buildkit_py.compat.index import IndexClient
from buildkit_py.pipeline import OFFLINE


# ----------------------------------------------------------------------------- what a file name says
@pytest.mark.parametrize(("filename", "machines", "python", "glibc"), [
    ("torch-2.5.1-cp312-cp312-manylinux1_x86_64.whl", {"x86_64"}, ("cp312",), "2.5"),
    ("torch-2.5.1-cp312-cp312-manylinux_2_28_aarch64.whl", {"aarch64"}, ("cp312",), "2.28"),
    ("triton-2.3.1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", {"x86_64"}, ("cp311",), "2.17"),
    ("bitsandbytes-0.41.1-py3-none-any.whl", {"any"}, ("py3",), None),
    ("nvidia_cublas_cu12-12.4.5.8-py3-none-manylinux2014_aarch64.whl", {"aarch64"}, ("py3",), "2.17"),
])
def test_file_facts(filename, machines, python, glibc):
    facts = wc.file_facts(filename)
    assert facts.machines == frozenset(machines)
    assert facts.python == python
    assert facts.glibc == glibc


def test_shared_libraries_are_the_lib_so_basenames():
    names = ["torch/lib/libcudart.so.11.0", "torch/lib/libtorch_cuda.so", "torch/_C.cpython-311-x86_64-linux-gnu.so",
             "nvidia/cudnn/lib/libcudnn.so.9", "torch/lib/libcudart.so.11.0", "torch/include/cuda.h",
             "triton/backends/nvidia/lib/cupti/libcupti.so.12", "torch/lib/libfoo.so.bak"]
    assert wc.shared_libraries(names) == ["libcudart.so.11.0", "libcudnn.so.9", "libcupti.so.12", "libtorch_cuda.so"]


def test_read_wheel_reads_the_zip_directory_by_range_not_the_whole_wheel(tmp_path):
    ix = LocalIndex(tmp_path / "index")
    big = ix.add_wheel("torch", "2.1.0", "cp311-cp311-manylinux_2_17_x86_64", padding=6 * 1024 * 1024,
                       requires_dist=["filelock", 'nvidia-cudnn-cu12==8.9.2.26; platform_machine == "x86_64"'],
                       files=["torch/lib/libtorch_cuda.so", "torch/lib/libcudart.so.12"])
    ix.add_wheel("torch", "2.1.0", "cp311-cp311-manylinux_2_28_aarch64", files=["torch/lib/libtorch_cpu.so"])
    ix.add_sdist("torch", "2.1.0")
    with ix:
        client = IndexClient(ix.url)
        project = client.project("torch")
        w = wc.read_wheel(client, project, "2.1.0", "x86_64", "2026-12-05")
        assert ix.bytes_sent < big.stat().st_size / 4
        arm = wc.read_wheel(client, project, "2.1.0", "aarch64", "2026-12-05")
    assert w is not None and arm is not None
    assert (w.glibc, w.python, w.sdist) == ("2.17", ("cp311",), True)
    assert w.libraries == ("libcudart.so.12", "libtorch_cuda.so")
    assert w.pins() == {"nvidia-cudnn-cu12": "8.9.2.26"}
    assert wc.bundles_cuda_runtime(w) and not wc.bundles_cuda_runtime(arm)
    assert arm.glibc == "2.28"


def test_a_release_of_pure_wheels_only_gets_one_any_row(tmp_path):
    """bitsandbytes before 0.43 shipped py3-none-any wheels holding x86_64 libraries: the row says
    "any" (what the file name says) and lists those libraries (what it holds)."""
    ix = LocalIndex(tmp_path / "index")
    ix.add_wheel("bitsandbytes", "0.41.1", files=["bitsandbytes/libbitsandbytes_cuda118.so"])
    with ix:
        client = IndexClient(ix.url)
        project = client.project("bitsandbytes")
        rows = {wc.read_wheel(client, project, "0.41.1", m, "2026-12-05") for m in wc.MACHINES}
    assert len(rows) == 1
    (row,) = rows
    assert (row.machine, row.glibc, row.libraries) == ("any", None, ("libbitsandbytes_cuda118.so",))


# ----------------------------------------------------------------------------- the rules over the model
def _row(project, version, *, libraries=(), requires=(), machine="x86_64") -> wc.WheelContents:
    return wc.WheelContents(canonicalize_name(project), version, machine, ("cp312",), "2.28", False, None,
                            tuple(requires), tuple(libraries), "a test row")


def test_pins_follow_the_markers_of_the_machine():
    torch = _row("torch", "2.4.0", requires=[
        'nvidia-cudnn-cu12==9.1.0.70; platform_system == "Linux" and platform_machine == "x86_64"',
        "filelock", "triton==3.0.0; platform_system == \"Linux\" and python_version < \"3.13\"",
        'optree>=0.11.0; extra == "optree"'])
    assert torch.pins() == {"nvidia-cudnn-cu12": "9.1.0.70", "triton": "3.0.0"}
    arm = _row("torch", "2.4.0", requires=torch.requires_dist, machine="aarch64")
    assert arm.pins() == {"triton": "3.0.0"}
    assert torch.pins(python="3.13") == {"nvidia-cudnn-cu12": "9.1.0.70"}


def test_image_libraries_follow_the_exact_pins_into_the_model():
    cudnn = _row("nvidia-cudnn-cu12", "9.1.0.70", libraries=["libcudnn.so.9", "libcudnn_ops.so.9"])
    model = wc.ContentModel({("nvidia-cudnn-cu12", "9.1.0.70", "x86_64"): cudnn}, "2026-12-05")
    torch = _row("torch", "2.4.0", libraries=["libtorch_cuda.so"], requires=["nvidia-cudnn-cu12==9.1.0.70"])
    libs = wc.image_libraries([torch], model)
    assert libs == {"libtorch_cuda.so", "libcudnn.so.9", "libcudnn_ops.so.9"}
    assert wc.cuda_libraries(libs) == {"cudnn"}
    assert wc.cudnn_major(libs) == "9"
    # a pin the model has no row for brings nothing it can name
    other = _row("torch", "2.4.0", requires=["nvidia-cudnn-cu12==9.9.9.9"])
    assert wc.image_libraries([other], model) == frozenset()


def test_cuda_libraries_name_the_tier_extras():
    libs = ["libcudart.so.11.0", "libcublasLt.so.11", "libnvrtc-builtins.so.11.8", "libnvToolsExt.so.1",
            "libgomp.so.1", "libcudnn_ops_infer.so.8", "libnccl.so.2"]
    assert wc.cuda_libraries(libs) == {"cudart", "cublas", "nvtx", "nccl"}
    assert wc.cudnn_major(libs) is None  # libcudnn_ops_infer is a part of cuDNN, libcudnn.so.N names its major
    assert wc.cudnn_major([*libs, "libcudnn.so.8"]) == "8"


# ----------------------------------------------------------------------------- the shipped data
def test_every_torch_release_has_its_pypi_wheel_recorded():
    m = wc.model()
    for release in compat.torch_releases():
        w = m.wheel("torch", release.version, "x86_64")
        assert w is not None, release.version
        assert w.file and w.requires_dist is not None and w.glibc
        assert any(lib.startswith("libtorch") for lib in w.libraries), release.version


def test_the_pypi_torch_pins_agree_with_torch_json():
    """Two reads of one METADATA (torch.json's refresh, this model's) must say the same."""
    m = wc.model()
    for release in compat.torch_releases():
        w = m.wheel("torch", release.version, "x86_64")
        assert w is not None
        for name, version in release.pypi_cuda_wheels.items():
            assert w.pins().get(canonicalize_name(name)) == version, (release.version, name)


def test_every_nvidia_wheel_torch_pins_is_recorded_with_its_libraries():
    m = wc.model()
    for release in compat.torch_releases():
        for name, version in release.pypi_cuda_wheels.items():
            if not name.startswith("nvidia-"):
                continue
            w = m.wheel(name, version, "x86_64")
            assert w is not None, (release.version, name, version)
            assert w.libraries, (name, version)


def test_each_row_names_a_source_and_a_date():
    raw = compat.tables.load_raw(wc.FILE)
    assert raw["as_of"]
    assert all(r["source"].strip() for r in raw["wheels"])


# ------------------------------------------------------------------------- issue 29's item-1 classes, over the model
@pytest.mark.parametrize(("version", "variant", "bundles"), [
    ("1.13.1", "cu116", True),    # download.pytorch.org: build_cuda.sh's 11.6 DEPS_SONAME
    ("2.0.1", "cu118", True),
    ("2.1.2", "cu118", True),
    ("2.1.2", "cu121", False),    # the PyPI build: its CUDA comes as nvidia-* wheels (its Requires-Dist)
    ("2.0.1", "cu117", False),
    ("2.4.0", "cu121", False),
])
def test_a_torch_build_that_bundles_its_cuda_runtime_is_read_from_its_libraries(version, variant, bundles):
    """Class 1: a large torch wheel on ``source: wheels`` got no CUDA runtime installed. Whether torch
    brings a runtime other packages can load is read from the wheel's recorded files, not a version rule."""
    release = compat.torch_release(version)
    assert compat.torch_bundles_cuda(release, variant) is bundles
    w = compat.torch_wheel(release, variant)
    assert w is not None
    if bundles:   # its CUDA sits in torch/lib, and it pins no nvidia-* wheel another package could load
        assert {"cudart", "cublas", "cudnn"} <= wc.cuda_libraries(w.libraries)
        assert w.requires_dist is None and "build_cuda.sh" in w.source
    else:
        assert not w.bundled("libcudart")
        assert any(n.startswith("nvidia-") for n in w.pins())


def test_a_torch_variant_the_data_does_not_record_is_not_claimed_to_bundle():
    """2.2.0's cu118 build is a small wheel (PR #114620) on an index not read here: no row, no claim."""
    release = compat.torch_release("2.2.0")
    assert compat.torch_wheel(release, "cu118") is None
    assert compat.torch_bundles_cuda(release, "cu118") is False


@pytest.mark.parametrize(("version", "variant", "major", "exact"), [
    ("2.1.2", "cu118", "8", None),              # libcudnn.so.8 in torch/lib
    ("2.1.2", "cu121", "8", "8.9.2.26"),        # its wheel requires nvidia-cudnn-cu12==8.9.2.26
    ("2.4.0", "cu121", "9", "9.1.0.70"),
])
def test_torchs_cudnn_is_read_from_its_wheel(version, variant, major, exact):
    from buildkit_py.compat.cudnn_source import _from_torch_wheel
    from buildkit_py.compat.torch_rule import TorchPart

    release = compat.torch_release(version)
    part = TorchPart(version=version, variant=variant, release=release)
    found = _from_torch_wheel(part, f"{version}+{variant}")
    assert found is not None and (found.major, found.version) == (major, exact)


def test_the_image_libraries_of_torchs_pypi_build_include_its_nvidia_wheels():
    """torch 2.4.0's wheel bundles no CUDA library; its exact nvidia-* pins bring cudart, cuBLAS, cuDNN, NCCL."""
    w = compat.torch_wheel(compat.torch_release("2.4.0"), "cu121")
    assert w is not None and not wc.cuda_libraries(w.libraries)
    libs = wc.image_libraries([w])
    assert {"cudart", "cublas", "cudnn", "nccl", "nvrtc"} <= wc.cuda_libraries(libs)
    assert wc.cudnn_major(libs) == "9"


def test_untabled_pins_get_their_machines_from_the_model():
    """Class 3: triton 2.3.1 has x86_64 wheels only and no sdist (the model's rows)."""
    m = wc.model()
    assert m.machines("triton", "2.3.1") == {"x86_64"}
    files = m.pin_files("triton")
    assert files is not None and files.of("2.3.1") == (frozenset({"x86_64"}), False)
    assert m.pin_files("no-such-project") is None


# ------------------------------------------------------------------------- the image's CUDA libraries (ImageCuda)
def test_a_large_torch_alone_brings_no_loadable_cuda_runtime():
    """Class 1 at the rule: libcudart of a large torch wheel is private to torch/lib; the runtime wheel
    the plan installs beside it is what bitsandbytes loads."""
    torch = compat.torch_wheel(compat.torch_release("2.1.2"), "cu118")
    alone = wc.image_cuda((), torch)
    assert "cudart" in alone.private and "cudart" not in alone.loadable and not alone.partial
    assert alone.cudnn == "8"
    ws = compat.cuda_wheel_set("11.8")
    with_runtime = wc.image_cuda(ws.pins("cudart"), torch)
    assert "cudart" in with_runtime.loadable


def test_cuda_13_torch_brings_its_libraries_through_the_cuda_toolkit_meta_package():
    release = compat.torch_release("2.15.0")
    image = wc.image_cuda((), compat.torch_wheel(release, release.pypi_variant))
    assert not image.partial
    # every extra torch asks cuda-toolkit for (CUDA 13's nvtx: libnvtx3interop.so.1)
    assert set(release.pypi_cuda_toolkit_extras) <= image.loadable
    assert image.cudnn == "9"


def test_a_pin_the_model_has_no_row_for_makes_the_set_partial():
    image = wc.image_cuda(("nvidia-cuda-runtime-cu12==12.99.1",))
    assert image.partial and image.unread == ("nvidia-cuda-runtime-cu12==12.99.1",)
    assert not wc.image_cuda(("six==1.16.0",)).partial  # not a CUDA wheel: nothing CUDA unknown


def _recipe(tmp_path, *, cuda, torch=None, source="wheels", pip=()):
    from helpers import write_recipe

    from buildkit_py.recipe.model import load_recipe
    base = "{image: debian:bookworm-slim}" if source == "wheels" else "{os: ubuntu22.04}"
    text = (f'name: team/x\ncuda: {{version: "{cuda}", source: {source}, flavor: base}}\nbase: {base}\n'
            'python: "3.11"\n' + (f'torch: "{torch}"\n' if torch else "")
            + (f"pip: [{', '.join(pip)}]\n" if pip else ""))
    return load_recipe(write_recipe(tmp_path, text))


@pytest.mark.parametrize(("cuda", "torch"), [("11.8", "2.1.2"), ("12.1", "2.4.1"), ("13.0", "2.14.0"), ("12.4", None)])
def test_every_wheels_plan_gets_a_loadable_cuda_runtime_and_its_cudnn_label_follows_the_model(tmp_path, cuda, torch):
    """What the property grid asserts of every passing plan (issue 29 item 3 (b)), here on a few."""
    from buildkit_py.compat.resolve import resolve

    res = resolve(_recipe(tmp_path, cuda=cuda, torch=torch), today=TODAY)
    image = res.image_cuda
    assert image is not None and not image.partial
    assert "cudart" in image.loadable
    assert image.cuda_minors == {res.cuda_major_minor}   # the cuda.version label names the runtime's CUDA
    if res.cudnn is not None:
        assert res.cudnn.split(".")[0] == image.cudnn
    else:
        assert image.cudnn is None


def test_the_plan_refuses_a_wheels_image_whose_only_runtime_is_private(tmp_path, monkeypatch):
    """The rule over the model itself: were the runtime wheel left out (what the old version rule did),
    resolve refuses instead of labelling an image with no CUDA runtime another package loads."""
    from buildkit_py.compat import cuda_wheels
    from buildkit_py.compat.resolve import resolve
    from buildkit_py.errors import CompatibilityError

    monkeypatch.setattr(cuda_wheels, "cuda_wheels_rule", lambda *a, **k: cuda_wheels.CudaWheelsPart())
    with pytest.raises(CompatibilityError) as info:
        resolve(_recipe(tmp_path, cuda="11.8", torch="2.1.2"), today=TODAY)
    assert info.value.key == "cuda.source"
    assert "no CUDA runtime another package can load (cublas, cudart, cudnn, nvrtc, nvtx only inside torch/lib)" \
        in info.value.reason


# ------------------------------------------------------------------------- a CUDA wheel the data lacks: read live
def test_a_cuda_wheel_pin_the_data_lacks_is_read_live_and_offline_is_partial(tmp_path):
    from buildkit_py.compat.resolve import resolve
    from buildkit_py.pipeline import lookups

    recipe = _recipe(tmp_path, cuda="12.4", pip=['"nvidia-cusparselt-cu12==0.99.1"'])
    warned: list[str] = []
    offline = lookups.looked_up(recipe, OFFLINE, warn=warned.append)
    assert warned == ["--offline: nvidia-cusparselt-cu12==0.99.1 not read: the CUDA libraries they bring are "
                      "known only in part"]
    image = resolve(recipe, looked_up=offline, today=TODAY).image_cuda
    assert image is not None and image.unread == ("nvidia-cusparselt-cu12==0.99.1",)

    ix = LocalIndex(tmp_path / "index")
    ix.add_wheel("nvidia-cusparselt-cu12", "0.99.1", "py3-none-manylinux_2_28_x86_64", pep658=True,
                 files=["nvidia/cusparselt/lib/libcusparseLt.so.0"])
    with ix:
        facts = lookups.looked_up(recipe, lookups.Lookup(index_url=ix.url), warn=warned.append)
    assert [w.libraries for w in facts.wheels] == [("libcusparseLt.so.0",)]
    image = resolve(recipe, looked_up=facts, today=TODAY).image_cuda
    assert image is not None and not image.partial and "cusparselt" in image.loadable


def test_a_runtime_pin_of_another_cuda_minor_the_data_lacks_is_refused_from_its_wheel(tmp_path):
    """Class 4: a pip pin of a CUDA wheel of another minor passed without a word where wheels.json does
    not record that version. Read live, the wheel brings libcudart at version 12.1.77: CUDA 12.1's."""
    from buildkit_py.compat.resolve import resolve
    from buildkit_py.errors import CompatibilityError
    from buildkit_py.pipeline import lookups

    recipe = _recipe(tmp_path, cuda="12.4", pip=['"nvidia-cuda-runtime-cu12==12.1.77"'])
    ix = LocalIndex(tmp_path / "index")
    ix.add_wheel("nvidia-cuda-runtime-cu12", "12.1.77", "py3-none-manylinux2014_x86_64", pep658=True,
                 files=["nvidia/cuda_runtime/lib/libcudart.so.12"])
    with ix:
        facts = lookups.looked_up(recipe, lookups.Lookup(index_url=ix.url))
    with pytest.raises(CompatibilityError) as info:
        resolve(recipe, looked_up=facts, today=TODAY)
    err = info.value
    assert (err.key, err.other, err.other_version) == ("pip[0]", "cuda", "12.4.1")
    assert "is the CUDA 12.1 runtime" in err.reason
    want = compat.cuda_wheel_set("12.4").pins("cudart")[0]
    assert err.hint == f"use {want} (CUDA 12.4's) or drop pip[0]"
    fixed = _recipe(tmp_path, cuda="12.4", pip=[f'"{want}"'])   # the hint, applied
    assert resolve(fixed, looked_up=lookups.looked_up(fixed, OFFLINE),
                   today=TODAY).image_cuda.cuda_minors == {"12.4"}


@pytest.mark.parametrize("cuda", ["11.8", "12.1", "12.4", "12.8", "13.0"])
def test_a_runtime_tier_of_wheels_brings_every_runtime_library(tmp_path, cuda):
    """cuda.flavor: runtime on source: wheels, read back from the wheels' own files: every library of
    NVIDIA's runtime tier that the toolkit ships as a wheel is in the image (npp, nvjpeg, OpenCL included)."""
    from buildkit_py.compat.resolve import resolve

    text = (f'name: team/x\ncuda: {{version: "{cuda}", source: wheels, flavor: runtime}}\n'
            'base: {image: debian:bookworm-slim}\npython: "3.11"\n')
    from helpers import write_recipe

    from buildkit_py.recipe.model import load_recipe
    res = resolve(load_recipe(write_recipe(tmp_path, text)), today=TODAY)
    image = res.image_cuda
    assert image is not None and not image.partial
    extras = compat.tier_extras("runtime", res.cuda_version)
    assert image.lacks(extras) == frozenset()
    assert "nccl" in image.loadable
    assert image.lacks(["cudart", "cufft"]) == frozenset()
    assert wc.image_cuda(()).lacks(extras) >= {"cudart", "npp"}


# --- build.from_source needs the release's sdist (bitsandbytes publishes wheels only after 0.42.0) -----

def _from_source_recipe(tmp_path, bnb: str):
    from buildkit_py.recipe.model import parse_recipe

    text = (f'name: s\nversion: "1"\ncuda: {{version: "12.4", source: nvidia, flavor: devel}}\n'
            f'base: {{os: ubuntu22.04}}\npython: "3.10"\npip: ["bitsandbytes=={bnb}"]\n'
            "build: {from_source: [bitsandbytes]}\n")
    return parse_recipe(text, tmp_path / "recipe.yaml")


def test_a_source_build_of_a_release_without_an_sdist_is_refused_at_its_key(tmp_path):
    from buildkit_py.compat.resolve import source_builds_rule
    from buildkit_py.errors import CompatibilityError

    model = wc.model().pin_files("bitsandbytes")
    assert model is not None
    by_version = {v: sdist for v, _, sdist in model.releases}
    assert by_version["0.42.0"] is True and by_version["0.45.5"] is False  # as PyPI lists them
    with pytest.raises(CompatibilityError) as info:
        source_builds_rule(_from_source_recipe(tmp_path, "0.45.5"))
    err = info.value
    assert err.key == "build.from_source[0]" and err.line == 7
    assert "no source distribution" in err.message
    assert err.hint.startswith("drop bitsandbytes from build.from_source") and "0.42.0" in err.hint
    source_builds_rule(_from_source_recipe(tmp_path, "0.42.0"))  # it has one: the build may go on
