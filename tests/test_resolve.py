"""Resolution: pins that fit resolve; clashing ones raise CompatibilityError naming both sides."""

import dataclasses
import re

import pytest
from helpers import TODAY, plan_of, write_recipe
from packaging.specifiers import SpecifierSet

from buildkit_py import compat
from buildkit_py.compat.resolve import resolve
from buildkit_py.errors import CompatibilityError
from buildkit_py.plan.build_plan import make_plan
from buildkit_py.recipe.model import load_recipe
from buildkit_py.render.dockerfile import render_dockerfile

BASE = """\
name: team/x
cuda:
  version: "{cuda}"
  source: {source}
{base}
python: "{python}"
{extra}
"""


def recipe(tmp_path, cuda="12.4", source="wheels", python="3.11", base="base: {image: debian:bookworm-slim}",
           extra=""):
    return load_recipe(write_recipe(tmp_path, BASE.format(cuda=cuda, source=source, python=python, base=base,
                                                          extra=extra)))


def clash(tmp_path, **kw) -> CompatibilityError:
    with pytest.raises(CompatibilityError) as info:
        resolve(recipe(tmp_path, **kw), today=TODAY)
    return info.value


def clash_all(tmp_path, **kw) -> list[CompatibilityError]:
    """Every problem of one run (a CompatibilityErrors' own, or the one)."""
    err = clash(tmp_path, **kw)
    return list(getattr(err, "errors", [err]))


def test_partial_cuda_resolves_to_newest_patch(tmp_path):
    res = resolve(recipe(tmp_path, cuda="12.4"), today=TODAY)
    assert res.cuda_version == "12.4.1"
    assert res.min_driver == "550.54.15"
    assert res.min_driver_compat == "525.60.13"


def test_torch_without_cuda_variant_is_refused_with_hint(tmp_path):
    err = clash(tmp_path, extra='torch: "2.1.2"')
    assert (err.component, err.version, err.other, err.other_version) == ("torch", "2.1.2", "cuda", "12.4.1")
    assert "cu118 and cu121" in err.message
    assert "cuda 12.1 (the nearest CUDA torch 2.1.2 has a build for)" in err.hint
    assert "torch 2.4.0 (the nearest release with cu124 for Python 3.11; the newest: 2.6.0)" in err.hint
    assert err.key == "torch" and err.line == 7


def test_torch_variant_and_index(tmp_path):
    res = resolve(recipe(tmp_path, extra='torch: "2.4.1"'), today=TODAY)
    assert res.torch_variant == "cu124" and res.torch_label == "2.4.1+cu124"
    assert res.torch_index_url == "https://download.pytorch.org/whl/cu124"


def test_torch_from_python_registry_when_its_variant_matches(tmp_path):
    res = resolve(recipe(tmp_path, cuda="12.1", extra='torch: "2.4.1"'), today=TODAY)
    assert res.torch_variant == "cu121" and res.torch_index_url is None


def test_torch_python_range(tmp_path):
    err = clash(tmp_path, python="3.13", base="base: {image: 'python:3.13-slim'}", extra='torch: "2.4.1"')
    assert err.other == "python" and err.other_version == "3.13"


def test_os_python_mismatch(tmp_path):
    err = clash(tmp_path, python="3.10")
    assert err.other == "os" and "debian12" in err.other_version
    assert "3.11" in err.hint


def test_ubuntu_python_via_deadsnakes(tmp_path):
    res = resolve(recipe(tmp_path, base="base: {image: 'ubuntu:22.04'}", python="3.11"), today=TODAY)
    assert res.python_provider == "deadsnakes"


def test_nvidia_source_image_tag(tmp_path):
    res = resolve(recipe(tmp_path, cuda="12.4.1", source="nvidia", python="3.10",
                         base="base: {os: ubuntu22.04}", extra=""), today=TODAY)
    assert res.base_image == "nvidia/cuda:12.4.1-runtime-ubuntu22.04"


def test_mirror_prefixes_base(tmp_path):
    res = resolve(recipe(tmp_path, base="base: {image: 'debian:bookworm-slim', mirror: '127.0.0.1:5000/mirror'}"),
                  today=TODAY)
    assert res.base_image == "127.0.0.1:5000/mirror/debian:bookworm-slim"


def test_require_cuda_for_wheels_is_minor_version_floor(tmp_path):
    res = resolve(recipe(tmp_path), today=TODAY)
    assert res.require_cuda == "cuda>=12.0"
    res = resolve(recipe(tmp_path / "jit", extra="runtime_compile: true"), today=TODAY)
    assert res.require_cuda == "cuda>=12.4"


def test_torch_on_nvidia_runtime_warns_about_cuda_twice(tmp_path):
    res = resolve(recipe(tmp_path, source="nvidia", python="3.10", base="base: {os: ubuntu22.04}",
                         extra='torch: "2.4.1"'), today=TODAY)
    assert [(w.code, w.key) for w in res.warnings] == [("cuda-twice", "torch"), ("eol-image", "cuda.version")]
    assert "a second time" in res.warnings[0].message


def test_devel_without_compile_warns(tmp_path):
    text = BASE.format(cuda="12.8", source="nvidia", python="3.10", base="base: {os: ubuntu22.04}", extra="")
    text = text.replace("source: nvidia", "source: nvidia\n  flavor: devel")
    res = resolve(load_recipe(write_recipe(tmp_path, text)), today=TODAY)
    assert [(w.code, w.key) for w in res.warnings] == [("devel-without-compile", "cuda.flavor")]


def test_end_of_life_nvidia_image_warns_with_its_dates(tmp_path):
    """12.4.1's images reached end of life on 2026-06-01 (NVIDIA's EOL chart: R535's end of life)."""
    res = resolve(recipe(tmp_path, source="nvidia", python="3.10", base="base: {os: ubuntu22.04}"), today=TODAY)
    (w,) = [w for w in res.warnings if w.code == "eol-image"]
    assert w.key == "cuda.version" and "12.4.1 images reached end of life on 2026-06-01" in w.message
    assert "from 2026-12-01" in w.message and "imgbuild mirror" in w.hint


def test_minor_without_an_image_for_the_os_is_refused_naming_what_exists(tmp_path):
    err = clash(tmp_path, cuda="13.4", source="nvidia", python="3.10", base="base: {os: ubuntu22.04}")
    assert (err.key, err.line, err.component, err.version, err.other, err.other_version) == \
        ("cuda.version", 3, "cuda", "13.4", "base.os", "ubuntu22.04")
    assert err.reason == ("nvidia/cuda publishes 13.4.x runtime images for ubuntu24.04, ubuntu26.04; "
                          "for ubuntu22.04 the newest is 13.3.1")
    assert err.hint.startswith('use cuda: "13.3" on ubuntu22.04')


def test_minor_picks_the_newest_patch_with_the_image_for_the_os(tmp_path):
    """13.3 on ubuntu26.04 with cuDNN: 13.3.1 (13.3.0 has no cudnn tags for 26.04)."""
    text = BASE.format(cuda="13.3", source="nvidia", python="3.14", base="base: {os: ubuntu26.04}", extra="")
    res = resolve(load_recipe(write_recipe(tmp_path, text.replace("source: nvidia", 'source: nvidia\n  cudnn: "9"'))),
                  today=TODAY)
    assert res.base_image == "nvidia/cuda:13.3.1-cudnn-runtime-ubuntu26.04" and res.cuda_version == "13.3.1"


def test_cudnn_image_nvidia_never_published_is_refused(tmp_path):
    """12.5.1 has base/runtime/devel for ubuntu24.04 but no cudnn tags there (the plan used to say
    FROM nvidia/cuda:12.5.1-cudnn-runtime-ubuntu24.04)."""
    text = BASE.format(cuda="12.5", source="nvidia", python="3.12", base="base: {os: ubuntu24.04}", extra="")
    r = load_recipe(write_recipe(tmp_path, text.replace("source: nvidia", 'source: nvidia\n  cudnn: "9"')))
    with pytest.raises(CompatibilityError) as info:
        resolve(r, today=TODAY)
    err = info.value
    assert (err.key, err.other, err.other_version) == ("cuda.cudnn", "cuda.cudnn", "9 on ubuntu24.04")
    assert "for ubuntu24.04 the newest with cuDNN 9 is 13.4.2 (12.x: 12.9.2)" in err.reason
    exact = load_recipe(write_recipe(tmp_path / "exact", text.replace('"12.5"', '"12.5.1"')
                                     .replace("source: nvidia", 'source: nvidia\n  cudnn: "9"')))
    with pytest.raises(CompatibilityError, match="publishes 12.5.1 cuDNN 9 runtime images for ubuntu20.04"):
        resolve(exact, today=TODAY)


def test_unknown_cuda(tmp_path):
    err = clash(tmp_path, cuda="12.99")
    assert err.component == "cuda" and err.key == "cuda.version"


def test_flash_attn_needs_torch(tmp_path):
    err = clash(tmp_path, extra='pip: ["flash-attn==2.6.3"]')
    assert err.component == "flash-attn" and err.other == "torch"


def test_compile_adds_devel_builder_stage(tmp_path):
    r = recipe(tmp_path, base="base: {image: 'ubuntu:22.04'}", extra='torch: "2.4.1"\npip: ["flash-attn==2.6.3"]\n'
               'build: {from_source: [flash-attn], cuda_arch: ["8.0", "9.0"], jobs: 4}')
    plan = plan_of(r)
    assert [s.name for s in plan.stages] == ["builder", "final"]
    assert plan.stages[0].base == "nvidia/cuda:12.4.1-devel-ubuntu22.04"
    wheel_step = [s for s in plan.stages[0].steps if s.id == "wheels"][0]
    assert wheel_step.arch_list == "8.0 9.0" and wheel_step.jobs == 4
    assert plan.labels["io.imgbuild.cuda.arch"] == "8.0;9.0"
    assert "multi-stage" in plan.needs


def test_arch_not_supported_by_flash_attn(tmp_path):
    err = clash(tmp_path, base="base: {image: 'ubuntu:22.04'}", extra='torch: "2.4.1"\npip: ["flash-attn==2.6.3"]\n'
                'build: {cuda_arch: ["7.5"]}')
    assert err.component == "flash-attn" and err.other == "cuda_arch"


def test_flash_attn_prebuilt_wheel_url(tmp_path):
    res = resolve(recipe(tmp_path, base="base: {image: 'ubuntu:22.04'}", extra='torch: "2.4.1"\npip: ["flash-attn==2.6.3"]'),  # noqa: E501
                  today=TODAY)
    assert res.compile == ()
    assert dict(res.prebuilt_urls)["flash-attn"] == (
        "https://github.com/Dao-AILab/flash-attention/releases/download/v2.6.3/"
        "flash_attn-2.6.3+cu123torch2.4cxx11abiFALSE-cp311-cp311-linux_x86_64.whl")


def test_flash_attn_blackwell_takes_the_release_wheel_built_with_cuda_12_9(tmp_path):
    """2.8.3's release wheels were compiled with CUDA 12.9.1, whose nvcc setup.py lets emit sm_100
    and sm_120: a Blackwell recipe takes the wheel (it was refused as 'needs a source build')."""
    res = resolve(recipe(tmp_path, cuda="12.8", base="base: {image: 'ubuntu:22.04'}",
                         extra='torch: "2.7.1"\npip: ["flash-attn==2.8.3"]\nbuild: {cuda_arch: ["10.0", "12.0"]}'),
                             today=TODAY)
    assert res.compile == ()
    assert dict(res.prebuilt_urls)["flash-attn"] == (
        "https://github.com/Dao-AILab/flash-attention/releases/download/v2.8.3/"
        "flash_attn-2.8.3+cu12torch2.7cxx11abiTRUE-cp311-cp311-linux_x86_64.whl")


def test_flash_attn_wheel_without_blackwell_sass_builds_from_source(tmp_path):
    """2.7.4.post1's wheels were compiled with CUDA 12.4.1 (sm_80/sm_90 only): 9.0 takes the
    wheel, 10.0 builds from source with nvcc 12.8."""
    base = "base: {image: 'ubuntu:22.04'}"
    res = resolve(recipe(tmp_path, cuda="12.6", base=base,
                         extra='torch: "2.6.0"\npip: ["flash-attn==2.7.4.post1"]\nbuild: {cuda_arch: ["9.0"]}'),
                             today=TODAY)
    assert res.compile == () and "cu12torch2.6cxx11abiFALSE" in dict(res.prebuilt_urls)["flash-attn"]
    res = resolve(recipe(tmp_path / "bw", cuda="12.8", base=base,
                         extra='torch: "2.7.1"\npip: ["flash-attn==2.7.4.post1"]\nbuild: {cuda_arch: ["10.0"]}'),
                             today=TODAY)
    assert res.compile == ("flash-attn",) and res.prebuilt_urls == ()


@pytest.mark.parametrize(("cuda", "torch", "fa"), [
    ("13.2", "2.15.0", "2.8.3.post2"),
    ("13.0", "2.14.1", "2.8.3.post2"),
    ("13.0", "2.14.0", "2.8.3"),
])
def test_flash_attn_source_build_refused_where_torch_headers_need_cxx20(tmp_path, cuda, torch, fa):
    """torch >= 2.14's headers #error below C++20; every flash-attn setup.py compiles as C++17, so
    the source build would fail hours in: the plan refuses, naming the newest torch that fits."""
    err = clash(tmp_path, cuda=cuda, python="3.12", base="base: {image: 'ubuntu:24.04'}",
                extra=f'torch: "{torch}"\npip: ["flash-attn=={fa}"]')
    assert (err.component, err.version, err.other, err.other_version, err.key) == ("flash-attn", fa, "torch", torch,
                                                                                   "pip[0]")
    assert "-std=c++17" in err.message and "need C++20" in err.message
    assert err.hint.startswith("use torch 2.13.0, 2.12.1, 2.12.0 (the newest whose headers compile as C++17")
    assert "no flash-attn release imgbuild knows compiles as C++20" in err.hint


def test_flash_attn_source_build_with_torch_2_13_passes(tmp_path):
    res = resolve(recipe(tmp_path, cuda="13.2", python="3.12", base="base: {image: 'ubuntu:24.04'}",
                         extra='torch: "2.13.0"\npip: ["flash-attn==2.8.3.post2"]'), today=TODAY)
    assert res.compile == ("flash-attn",)


def test_flash_attn_source_build_needs_nvcc_that_compiles_the_arch(tmp_path, monkeypatch):
    """The SASS a source build gets is setup.py's -gencode list for the toolkit's nvcc: with
    sm_100 compiled only from nvcc 12.9 (a release saying so), CUDA 12.8 cannot serve 10.0."""
    from buildkit_py.compat import flash_attn
    real = flash_attn.flash_attn_release("2.8.3")
    later = dataclasses.replace(real, gencode=tuple((sm, SpecifierSet(">=12.9") if sm == "10.0" else spec)
                                                    for sm, spec in real.gencode), prebuilt=())
    monkeypatch.setattr(flash_attn, "_flash_attn", lambda: (later,))
    err = clash(tmp_path, cuda="12.8", base="base: {image: 'ubuntu:22.04'}",
                extra='torch: "2.7.1"\npip: ["flash-attn==2.8.3"]\nbuild: {cuda_arch: ["10.0"]}')
    assert (err.key, err.other, err.other_version) == ("build.cuda_arch[0]", "cuda", "12.8.2")
    assert "sm_80, sm_90, sm_120 with nvcc 12.8" in err.message


@pytest.mark.parametrize("fa", ["0.2.8", "2.0.0.post1"])
def test_flash_attn_known_from_the_index_only_is_refused(tmp_path, fa):
    err = clash(tmp_path, base="base: {image: 'ubuntu:22.04'}", extra=f'torch: "2.4.1"\npip: ["flash-attn=={fa}"]')
    assert (err.component, err.version, err.key) == ("flash-attn", fa, "pip[0]")
    assert "known from the package index only" in err.message
    assert err.hint == ("use flash-attn 2.8.3.post2, 2.8.3.post1, 2.8.3, 2.8.2 (the newest fully recorded that fit "
                        "torch 2.4.1, CUDA 12.4 and Python 3.11)")


def test_bitsandbytes_post_releases_are_known(tmp_path):
    res = resolve(recipe(tmp_path, cuda="12.2", extra='pip: ["bitsandbytes==0.41.3.post2"]'), today=TODAY)
    assert res.cuda_version.startswith("12.2")
    err = clash(tmp_path / "x", cuda="12.3", extra='pip: ["bitsandbytes==0.41.2.post2"]')
    assert err.other == "cuda" and "11.0, 11.1, 11.4, 11.5, 11.7, 11.8, 12.0, 12.1, 12.2" in err.message


def test_bitsandbytes_whose_loader_searches_libcudart_is_refused(tmp_path):
    err = clash(tmp_path, cuda="12.1", extra='pip: ["bitsandbytes==0.39.1"]')
    assert (err.component, err.version, err.key) == ("bitsandbytes", "0.39.1", "pip[0]")
    assert "libcudart.so" in err.message and err.hint == "use bitsandbytes==0.50.2 (the newest that fits CUDA 12.1)"


def test_bitsandbytes_without_nocublaslt_library_refused_below_7_5(tmp_path):
    """0.40.1 ships libbitsandbytes_cuda118.so but no cuda118_nocublaslt.so, which its loader opens
    on GPUs below compute capability 7.5."""
    ok = resolve(recipe(tmp_path, cuda="11.8", extra='pip: ["bitsandbytes==0.40.1"]\nbuild: {cuda_arch: ["8.0"]}'),
                 today=TODAY)
    assert ok.cuda_arch == ("8.0",)
    err = clash(tmp_path / "old", cuda="11.8", extra='pip: ["bitsandbytes==0.40.1"]\nbuild: {cuda_arch: ["7.0"]}')
    assert (err.key, err.other, err.other_version) == ("build.cuda_arch[0]", "cuda_arch", "7.0")
    assert "libbitsandbytes_cuda118_nocublaslt.so" in err.message


def test_bitsandbytes_cuda_clash(tmp_path):
    err = clash(tmp_path, cuda="12.6", extra='pip: ["bitsandbytes==0.43.3"]')
    assert err.component == "bitsandbytes" and err.other_version == "12.6.3"


def test_cuda_12_8_floor_is_table3_not_the_runfile_driver(tmp_path):
    res = resolve(recipe(tmp_path, cuda="12.8"), today=TODAY)
    assert res.min_driver == "570.124.06"


def test_bitsandbytes_torch_floor_refused_with_hint(tmp_path):
    err = clash(tmp_path, cuda="12.1", extra='torch: "2.3.1"\npip: ["bitsandbytes==0.50.2"]')
    assert (err.component, err.other, err.other_version) == ("bitsandbytes", "torch", "2.3.1")
    assert ">=2.4" in err.message and "bitsandbytes==0.49.2" in err.hint


def test_bitsandbytes_compute_capability_floor(tmp_path):
    err = clash(tmp_path, cuda="12.4", extra='torch: "2.4.1"\npip: ["bitsandbytes==0.50.2"]\nbuild: {cuda_arch: ["5.2"]}')  # noqa: E501
    assert err.other == "cuda_arch" and "6.0" in err.message
    res = resolve(recipe(tmp_path, cuda="12.4", extra='torch: "2.4.1"\npip: ["bitsandbytes==0.50.2"]\n'
                         'build: {cuda_arch: ["7.0"]}'), today=TODAY)
    assert [(w.code, w.key) for w in res.warnings] == [("bitsandbytes-int8-arch", "build.cuda_arch[0]")]
    assert "LLM.int8() needs compute capability 7.5+" in res.warnings[0].message


def test_unknown_torch_newer_than_the_data_hints_the_newest_that_fits(tmp_path):
    """The newest the data knows is 2.15.0, which has no cu124 build: the hint names 2.6.0 (issue 29)."""
    err = clash(tmp_path, extra='torch: "2.99.0"')
    assert "newer than imgbuild's data (newest known: 2.15.0)" in err.message
    assert "torch 2.6.0 (the newest imgbuild knows with a cu124 build for Python 3.11)" in err.hint, err.hint


@pytest.mark.parametrize(("cuda", "extra", "hint"), [
    ("12.4", 'torch: "2.4.1"\npip: ["flash-attn==9.9.9"]', "use flash-attn==2.8.3 (the nearest release that fits "),
    ("12.4", 'pip: ["bitsandbytes==9.9.9"]', "use bitsandbytes==0.50.2 (the nearest release that fits "),
    # issue 29: the newest, 0.50.2, requires torch >= 2.4; 0.45.0 is the nearest that accepts torch 1.13.1
    ("12.4", 'torch: "1.13.1"\npip: ["bitsandbytes==0.50.9"]', "use bitsandbytes==0.45.0 (the nearest release "
                                                              "that fits CUDA 12.4, Python 3.11 and torch 1.13.1)"),
    # none accepts CUDA 13.0 with torch 2.1.2: none is offered
    ("13.0", 'torch: "2.1.2"\npip: ["bitsandbytes==0.50.9"]', "no bitsandbytes release imgbuild knows fits "
                                                             "CUDA 13.0, Python 3.11 and torch 2.1.2; its newest"),
])
def test_unknown_release_hints_the_nearest_that_fits(tmp_path, cuda, extra, hint):
    err = next(e for e in clash_all(tmp_path, cuda=cuda, extra=extra) if e.key == "pip[0]")
    assert "unknown" in err.message and err.hint.startswith(hint), err.hint


def test_unknown_cuda_hints_newest(tmp_path):
    err = clash(tmp_path, cuda="13.9")
    assert "13.5.0" in err.hint


def test_ubuntu_26_04_image_and_python(tmp_path):
    res = resolve(recipe(tmp_path, cuda="13.4", source="nvidia", python="3.14", base="base: {os: ubuntu26.04}"),
                  today=TODAY)
    assert res.base_image == "nvidia/cuda:13.4.2-runtime-ubuntu26.04" and res.python_provider == "os"


# --- no internal error on any gap -----------------------------------------------------------
def _sweep_specs():
    from buildkit_py import compat
    versions = [t.version for t in compat.toolkits()]
    return versions + sorted({t.major_minor for t in compat.toolkits()}) + ["12.7", "11.9", "13.99"]


@pytest.mark.parametrize("source", ["wheels", "nvidia"])
@pytest.mark.parametrize("flavor", ["base", "runtime", "devel"])
def test_every_cuda_flavor_source_plans_or_refuses_cleanly(tmp_path, source, flavor):
    """Every CUDA the data knows (exact and X.Y) x flavor x source x cuDNN/arch: a plan or a
    CompatibilityError at a recipe key with a hint, never another exception."""
    outcomes = {"plan": 0, "refused": 0}
    for i, spec in enumerate(_sweep_specs()):
        for j, extra in enumerate(["", 'build: {cuda_arch: ["8.0"]}', "cudnn"]):
            base = "base: {image: debian:bookworm-slim}" if source == "wheels" else "base: {os: ubuntu22.04}"
            text = BASE.format(cuda=spec, source=source, python="3.11" if source == "wheels" else "3.10",
                               base=base, extra="" if extra == "cudnn" else extra)
            text = text.replace(f"source: {source}", f"source: {source}\n  flavor: {flavor}"
                                + ('\n  cudnn: "9"' if extra == "cudnn" else ""))
            r = load_recipe(write_recipe(tmp_path / f"{i}-{j}", text))
            try:
                plan_of(r)
                outcomes["plan"] += 1
            except CompatibilityError as exc:
                assert exc.key and exc.line and exc.hint, (spec, extra, exc.message)  # noqa: PT017
                outcomes["refused"] += 1
    assert outcomes["plan"] > 0


def test_wheels_for_cuda_without_a_runtime_wheel_is_a_resolution_error(tmp_path):
    err = clash(tmp_path, cuda="11.6")
    assert err.key == "cuda.version" and "11.7.99" in err.message and "11.8" in err.hint


@pytest.mark.parametrize(("cuda", "pin"), [("11.8", "nvidia-cuda-runtime-cu11==11.8.89"),
                                       ("12.9", "nvidia-cuda-runtime-cu12==12.9.79"),
                                       ("13.2", "nvidia-cuda-runtime==13.2.86")])
def test_wheels_install_the_runtime_of_that_cuda(tmp_path, cuda, pin):
    text = BASE.format(cuda=cuda, source="wheels", python="3.11", base="base: {image: debian:bookworm-slim}", extra="")
    text = text.replace("source: wheels", "source: wheels\n  flavor: base")
    base = resolve(load_recipe(write_recipe(tmp_path, text)), today=TODAY)
    assert base.cuda_wheels == (pin,)  # NVIDIA's base tier: cudart
    runtime = resolve(recipe(tmp_path, cuda=cuda), today=TODAY)  # the default flavor, runtime: NVIDIA's runtime tier
    names = {re.sub(r"-cu1\d$", "", p.split("==")[0]) for p in runtime.cuda_wheels}
    assert pin in runtime.cuda_wheels
    assert {"nvidia-cublas", "nvidia-cufft", "nvidia-curand", "nvidia-cusolver", "nvidia-cusparse", "nvidia-npp",
            "nvidia-nvjpeg", "nvidia-cuda-nvrtc", "nvidia-nvtx", "nvidia-nccl"} <= names, names


def test_runtime_tier_with_torch_adds_only_what_torch_does_not_bring(tmp_path):
    """torch 2.4.1 (cu121, PyPI) pins cuBLAS, cuFFT, NCCL...: a runtime image adds NVIDIA's other runtime
    libraries (NPP, nvJPEG, OpenCL) and never a second copy of what torch pins (nor nvJitLink, which
    pip brings with torch's cuSPARSE)."""
    res = resolve(recipe(tmp_path, cuda="12.1", extra='torch: "2.4.1"'), today=TODAY)
    assert res.cuda_wheels == ("nvidia-cuda-opencl-cu12==12.1.105", "nvidia-npp-cu12==12.1.0.40",
                               "nvidia-nvjpeg-cu12==12.2.0.2")


def test_cudnn_from_wheels_is_installed(tmp_path):
    text = BASE.format(cuda="12.4", source="wheels", python="3.11", base="base: {image: debian:bookworm-slim}", extra="")  # noqa: E501
    res = resolve(load_recipe(write_recipe(tmp_path, text.replace("source: wheels", 'source: wheels\n  cudnn: "9"'))),
                  today=TODAY)
    assert "nvidia-cudnn-cu12==9.10.2.21" in res.cuda_wheels and "nvidia-cublas-cu12==12.4.5.8" in res.cuda_wheels


def _devel(tmp_path, cuda, extra=""):
    text = BASE.format(cuda=cuda, source="wheels", python="3.11", base="base: {image: debian:bookworm-slim}", extra=extra)  # noqa: E501
    return load_recipe(write_recipe(tmp_path, text.replace("source: wheels", "source: wheels\n  flavor: devel")))


def test_devel_from_wheels_refused_where_wheels_have_no_nvcc(tmp_path):
    with pytest.raises(CompatibilityError) as info:
        resolve(_devel(tmp_path, "12.4"), today=TODAY)
    assert info.value.key == "cuda.flavor" and "ptxas only" in info.value.message
    assert "cuda.source: nvidia" in info.value.hint and info.value.exit_status == 2


def test_devel_from_cuda13_wheels_has_nvcc_and_cuda_home(tmp_path):
    plan = plan_of(_devel(tmp_path, "13.0"))
    assert "nvidia-cuda-nvcc==13.0.88" in plan.resolution.cuda_wheels
    assert plan.resolution.cuda_wheel_home == "nvidia/cu13"
    ids = [s.id for s in plan.final.steps]
    assert ids.index("cuda") < ids.index("cuda-home")
    assert "g++" in plan.final.steps[0].packages


def test_cuda_kernel_source_build_needs_nvcc(tmp_path):
    extra = 'torch: "2.4.1"\npip: ["flash-attn==2.6.3"]\nbuild: {from_source: [flash-attn]}'
    err = clash(tmp_path, extra=extra)  # debian: no devel image, CUDA 12.4 wheels carry no nvcc
    assert err.key == "build.from_source" and "nvcc" in err.message and "Ubuntu" in err.hint


def test_arch_variants_accepted(tmp_path):
    res = resolve(recipe(tmp_path, cuda="12.4", extra='build: {cuda_arch: ["9.0a"]}'), today=TODAY)
    assert res.cuda_arch == ("9.0a",)
    err = clash(tmp_path / "old", cuda="11.8", extra='build: {cuda_arch: ["9.0a"]}')
    assert err.key == "build.cuda_arch[0]"
    res = resolve(recipe(tmp_path / "f", cuda="12.9", extra='build: {cuda_arch: ["10.0f"]}'), today=TODAY)
    assert res.cuda_arch == ("10.0f",)


def test_cuda_kernel_source_build_on_debian_gets_nvcc_from_cuda13_wheels(tmp_path):
    r = recipe(tmp_path, cuda="13.0", extra='torch: "2.13.0"\npip: ["flash-attn==2.8.3"]\n'
               "build: {from_source: [flash-attn]}")
    plan = plan_of(r)
    builder = plan.stages[0]
    assert builder.name == "builder" and builder.base == "debian:bookworm-slim"
    ids = [s.id for s in builder.steps]
    assert ids.index("cuda") < ids.index("cuda-home") < ids.index("wheels")
    cuda_step = builder.steps[ids.index("cuda")]
    assert "nvidia-cuda-nvcc==13.0.88" in cuda_step.requirements
    assert "cuda-home" not in [s.id for s in plan.final.steps]  # nvcc stays in the compile stage


def test_runtime_compile_warning_does_not_send_users_to_a_ptxas_only_wheel(tmp_path):
    res = resolve(recipe(tmp_path, extra="runtime_compile: true"), today=TODAY)
    assert [w.code for w in res.warnings] == ["runtime-compile-without-nvcc"]
    text = " ".join(w.message for w in res.warnings)
    assert "flavor: devel" in text and "nvidia-cuda-nvcc-cu12" not in text


# ---------------------------------------------------------------- cuDNN: one rule for both sources (issue 21: 4)
def _with_cudnn(tmp_path, cuda, source, cudnn, extra="", python="3.11"):
    base = "base: {image: debian:bookworm-slim}" if source == "wheels" else "base: {os: ubuntu22.04}"
    text = BASE.format(cuda=cuda, source=source, python=python, base=base, extra=extra)
    text = text.replace(f"source: {source}", f'source: {source}\n  cudnn: "{cudnn}"')
    return load_recipe(write_recipe(tmp_path, text))


@pytest.mark.parametrize("source", ["wheels", "nvidia"])
@pytest.mark.parametrize(("cuda", "cudnn", "ok"), [
    ("12.2", "8", True), ("12.3", "8", False), ("12.8", "8", False), ("12.8", "9", True), ("13.0", "8", False),
])
def test_cudnn_support_matrix_is_one_rule(tmp_path, source, cuda, cudnn, ok):
    """cuDNN 8.9 for CUDA 12.x supports 12.0-12.2: the wheels path used to accept cuDNN 8 on 12.3-12.9
    (a wheel installs there) while the nvidia path refused it; both now give the same answer."""
    python = "3.10" if source == "nvidia" else "3.11"
    r = _with_cudnn(tmp_path, cuda, source, cudnn, python=python)
    if ok:
        # the label is as precise as the artifacts say: the wheel's version from wheels, the tag's major
        want = compat.cudnn_wheel(cuda, cudnn).version if source == "wheels" else cudnn
        assert resolve(r, today=TODAY).cudnn == want
        return
    with pytest.raises(CompatibilityError) as info:
        resolve(r, today=TODAY)
    err = info.value
    assert err.key == "cuda.cudnn" and "support matrix lists cuDNN 8 for CUDA 11.0-11.8 and 12.0-12.2" in err.message
    assert 'cuda.version "12.2"' in err.hint


def test_cudnn_label_never_names_a_cudnn_torch_does_not_bring(tmp_path):
    """torch 2.7.1 on CUDA 11.8 from wheels brings cuDNN 9 (every 2.4+ build does), and nothing else
    installs cuDNN: cuda.cudnn "8" would label a cuDNN the image lacks."""
    with pytest.raises(CompatibilityError) as info:
        resolve(_with_cudnn(tmp_path, "11.8", "wheels", "8", extra='torch: "2.7.1"'), today=TODAY)
    assert "brings cuDNN 9" in info.value.message and 'cudnn: "9"' in info.value.hint
    res = resolve(_with_cudnn(tmp_path, "11.8", "wheels", "9", extra='torch: "2.7.1"'), today=TODAY)
    assert (res.cudnn, res.torch_label) == ("9", "2.7.1+cu118")


# ---------------------------------------------------------------- source: nvidia needs a CUDA base (issue 21: 1)
def _nvidia_on(tmp_path, image, cuda="12.4", flavor="runtime", cudnn=None, base=None):
    text = (f'name: team/x\ncuda: {{version: "{cuda}", source: nvidia, flavor: {flavor}'
            + (f', cudnn: "{cudnn}"' if cudnn else "") + f'}}\nbase: {{image: "{image}"}}\npython: "3.10"\n')
    return resolve(load_recipe(write_recipe(tmp_path, text)), base=base, today=TODAY)


@pytest.mark.parametrize("cuda", ["11.2", "12.4", "13.0"])
def test_nvidia_source_on_a_plain_os_base_is_refused(tmp_path, cuda):
    """It used to plan with exit 0, render FROM debian with no CUDA and label cuda.version and a
    driver floor (for 11.0-11.6 too, which are otherwise refused)."""
    with pytest.raises(CompatibilityError) as info:
        _nvidia_on(tmp_path, "debian:bookworm-slim", cuda=cuda)
    err = info.value
    assert err.key == "base.image" and "plain OS image" in err.message and "cuda.source: wheels" in err.hint


def test_nvidia_source_takes_cuda_flavor_and_os_from_an_nvidia_tag(tmp_path):
    res = _nvidia_on(tmp_path, "nvidia/cuda:12.4.0-runtime-ubuntu22.04")
    assert (res.cuda_version, res.os, res.min_driver) == ("12.4.0", "ubuntu22.04", "550.54.14")
    res = _nvidia_on(tmp_path, "127.0.0.1:5000/mirror/nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04", cudnn="9")
    assert (res.cuda_version, res.cudnn) == ("12.4.1", "9")


@pytest.mark.parametrize(("image", "kw", "key", "text"), [
    ("nvidia/cuda:12.4.1-devel-ubuntu22.04", {}, "cuda.flavor", "the devel tier"),
    ("nvidia/cuda:12.1.1-runtime-ubuntu22.04", {}, "cuda.version", "carries CUDA 12.1.1"),
    ("nvidia/cuda:12.4.1-runtime-ubuntu22.04", {"cudnn": "9"}, "cuda.cudnn", "carries no cuDNN"),
    ("nvidia/cuda:11.8.0-cudnn8-runtime-ubuntu22.04", {"cudnn": "9", "cuda": "11.8"}, "cuda.cudnn", "carries cuDNN 8"),
    ("nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04", {"cudnn": "8"}, "cuda.cudnn", "support matrix"),
])
def test_nvidia_source_checks_the_tag_against_the_recipe(tmp_path, image, kw, key, text):
    with pytest.raises(CompatibilityError) as info:
        _nvidia_on(tmp_path, image, **kw)
    assert info.value.key == key and text in info.value.message


def test_nvidia_source_reads_a_registry_base_config(tmp_path):
    from buildkit_py.compat.bases import BaseFacts

    ref = "127.0.0.1:5000/team/base:1"
    plain = BaseFacts(ref, "sha256:" + "a" * 64, {}, {"PATH": "/usr/bin"})
    with pytest.raises(CompatibilityError) as info:
        _nvidia_on(tmp_path, ref, base=plain)
    assert "carries no CUDA" in info.value.message and "no CUDA_VERSION env" in info.value.message
    nvidia_env = {"CUDA_VERSION": "12.4.1", "NV_LIBCUBLAS_VERSION": "12.4.5.8-1", "NV_CUDNN_VERSION": "9.1.0.70-1"}
    with_cuda = BaseFacts(ref, "sha256:" + "a" * 64, {"io.imgbuild.os": "ubuntu22.04"}, nvidia_env)
    res = _nvidia_on(tmp_path, ref, cudnn="9", base=with_cuda)
    assert (res.cuda_version, res.cudnn, res.base_digest) == ("12.4.1", "9", "sha256:" + "a" * 64)


# ---------------------------------------------------------------- every source build gets nvcc (issue 21: 6)
@pytest.mark.parametrize(("cuda", "base", "builder", "nvcc_from_wheels"), [
    ("13.0", "base: {image: debian:bookworm-slim}", "debian:bookworm-slim", True),
    ("12.4", "base: {image: ubuntu:22.04}", "nvidia/cuda:12.4.1-devel-ubuntu22.04", False),
])
def test_a_package_outside_any_list_builds_with_the_devel_toolchain(tmp_path, cuda, base, builder, nvcc_from_wheels):
    """pycuda used to compile in a builder with no nvcc and no cuda.h while plan and the cuda.arch
    label said it compiled for 8.0-9.0."""
    res = resolve(recipe(tmp_path, cuda=cuda, base=base,
                         extra='pip: ["pycuda==2024.1.2"]\nbuild: {from_source: [pycuda]}'), today=TODAY)
    assert res.compile == ("pycuda",) and res.builder_image == builder
    assert any(p.startswith("nvidia-cuda-nvcc") for p in res.builder_cuda_wheels) is nvcc_from_wheels
    assert res.cuda_arch == ("8.0", "8.6", "8.9", "9.0")


def test_a_source_build_without_a_devel_toolchain_is_refused(tmp_path):
    err = clash(tmp_path, extra='pip: ["pycuda==2024.1.2"]\nbuild: {from_source: [pycuda]}')
    assert err.key == "build.from_source" and "devel toolchain" in err.message and "ptxas only" in err.message
    assert "Ubuntu" in err.hint and "CUDA >= 13.0" in err.hint


# ---------------------------------------------------------------- hints and partial rows (issue 21: 9, 10)
def test_a_typo_in_an_old_torch_is_not_called_newer(tmp_path):
    """torch "2.4.7" was called "newer than the data" and sent to "plan without --offline"."""
    err = clash(tmp_path, extra='torch: "2.4.7"')
    assert "newer" not in err.message and "offline" not in err.hint
    assert "known near it: 2.4.0, 2.4.1" in err.message and err.hint.startswith("use torch 2.4.1 (the nearest release")


@pytest.mark.parametrize(("cuda", "torch", "python", "hint"), [
    # the newest with cu130, not 2.9.0 (the oldest)
    ("13.0", "2.15.0", "3.11", "torch 2.14.1 (the nearest release with cu130 for Python 3.11)"),
    # cu124: 2.6.0 fits, not 2.4.0
    ("12.4", "2.7.1", "3.11", "torch 2.6.0 (the nearest release with cu124 for Python 3.11)"),
    # 12.6 is the CUDA 2.9.1 has nearest to 12.4, not 12.8 or 13.0
    ("12.4", "2.9.1", "3.11", "use cuda 12.6 (the nearest CUDA torch 2.9.1 has a build for)"),
])
def test_torch_hints_name_the_nearest_release_that_fits(tmp_path, cuda, torch, python, hint):
    err = clash(tmp_path, cuda=cuda, python=python, extra=f'torch: "{torch}"')
    assert hint in err.hint, err.hint


def test_a_partial_torch_row_makes_an_unknown_not_a_no(tmp_path):
    """torch 2.15.0's data records only its PyPI build (cu132): cu130 is unknown, not refused as a fact."""
    err = clash(tmp_path, cuda="13.0", extra='torch: "2.15.0"')
    assert err.partial is True and err.to_json()["partial"] is True
    assert "whether torch 2.15.0 has a cu130 build is unknown" in err.message and "partial" in err.message
    assert "cuda 13.2" in err.hint and "torch 2.14.1" in err.hint
    assert resolve(recipe(tmp_path, cuda="13.2", extra='torch: "2.15.0"'), today=TODAY).torch_label == "2.15.0+cu132"
    full = clash(tmp_path, cuda="12.4", extra='torch: "2.1.2"')
    assert full.partial is False


# ---------------------------------------------------------------- every problem in one pass (issue 21: 11)
def test_independent_problems_come_together(tmp_path):
    from buildkit_py.errors import CompatibilityErrors

    r = recipe(tmp_path, cuda="12.99", python="3.10", extra='torch: "2.4.7"\npip: ["bitsandbytes==9.9.9"]')
    with pytest.raises(CompatibilityErrors) as info:
        resolve(r, today=TODAY)
    keys = [(e.key, e.line) for e in info.value.errors]
    assert keys == [("cuda.version", 3), ("python", 6), ("torch", 7), ("pip[0]", 8)]
    rendered = info.value.render()
    assert rendered.count("conflicts with") == 4 and rendered.count("hint:") == 4
    assert [e["key"] for e in info.value.to_json()["errors"]] == ["cuda.version", "python", "torch", "pip[0]"]


def test_a_wrong_base_os_is_blamed_on_base_os(tmp_path):
    err = clash(tmp_path, source="nvidia", base="base: {os: debian12}", python="3.11")
    assert (err.key, err.line, err.component, err.version) == ("base.os", 5, "base.os", "debian12")
    assert "no release has one for debian12" in err.message and "ubuntu22.04" in err.hint


def test_an_os_whose_python_is_not_recorded_is_said_so_never_python_none(tmp_path):
    """issue 29: base.os debian10 was described as shipping "Python ?" with a hint of python: "None"."""
    err = clash(tmp_path, base='base: {image: "debian:buster-slim", os: debian10}')
    assert err.key == "python" and err.partial
    assert err.reason.startswith("imgbuild does not know which Python debian10 ships (its data has debian11 (3.9)")
    assert "None" not in (err.hint or "") and "?" not in err.message
    assert err.hint == "use a python:3.11 base image, an OS imgbuild knows, or an Ubuntu base"


@pytest.mark.parametrize(("fa", "archs", "env", "label"), [
    ("2.8.3", '["8.6", "9.0"]', (("FLASH_ATTN_CUDA_ARCHS", "80;90"),), "8.0;9.0"),  # sm_80 runs on 8.6
    ("2.8.3", '["9.0"]', (("FLASH_ATTN_CUDA_ARCHS", "90"),), "9.0"),
    ("2.8.3", "[]", (("FLASH_ATTN_CUDA_ARCHS", "80;90"),), "8.0;9.0"),  # the default archs the label names
    # before 2.7.3 setup.py compiles its own gencode list, reading no setting: the label says so
    ("2.6.3", '["9.0"]', (), "8.0;9.0"),
    ("2.8.3", '["9.0+PTX"]', (("FLASH_ATTN_CUDA_ARCHS", "90"),), "9.0"),  # setup.py writes no PTX
])
def test_a_flash_attn_source_build_is_told_the_archs_the_label_names(tmp_path, fa, archs, env, label):
    """issue 30: build.cuda_arch reached only TORCH_CUDA_ARCH_LIST, while flash-attn >= 2.7.3 compiles
    what FLASH_ATTN_CUDA_ARCHS says (80;90;100;120 unless told): the cuda.arch label was false."""
    r = recipe(tmp_path, cuda="12.8" if fa == "2.8.3" else "12.4", base="base: {image: ubuntu:22.04}",
               extra=f'torch: "{"2.7.1" if fa == "2.8.3" else "2.4.1"}"\npip: ["flash-attn=={fa}"]\n'
                     f"build: {{from_source: [flash-attn], cuda_arch: {archs}}}")
    res = resolve(r, today=TODAY)
    assert res.build_env == env
    assert make_plan(r, resolution=res).labels["io.imgbuild.cuda.arch"] == label
    text = render_dockerfile(make_plan(r, resolution=res))
    assert ("FLASH_ATTN_CUDA_ARCHS=" in text) == bool(env)


def test_the_arch_label_names_what_every_source_build_compiles_and_nothing_when_none_does(tmp_path):
    """issue 30: io.imgbuild.cuda.arch is the union of what each from-source package compiles (flash-attn
    its gencodes, a torch extension TORCH_CUDA_ARCH_LIST with its +PTX); without a compile stage nothing
    imgbuild compiled carries kernels, so no label claims any."""
    r = recipe(tmp_path, cuda="12.8", base="base: {image: ubuntu:22.04}",
               extra='torch: "2.7.1"\npip: ["flash-attn==2.8.3", "pycuda==2024.1.2"]\n'
                     'build: {from_source: [flash-attn, pycuda], cuda_arch: ["8.6", "9.0+PTX"]}')
    res = resolve(r, today=TODAY)
    assert res.cuda_arch == ("8.6", "9.0+PTX")  # what TORCH_CUDA_ARCH_LIST says
    assert res.compiled_arch == ("8.0", "8.6", "9.0+PTX")  # flash-attn: sm_80, sm_90; the other: TORCH_CUDA_ARCH_LIST
    assert make_plan(r, resolution=res).labels["io.imgbuild.cuda.arch"] == "8.0;8.6;9.0+PTX"
    plain = recipe(tmp_path, cuda="12.8", base="base: {image: ubuntu:22.04}",
                   extra='torch: "2.7.1"\nbuild: {cuda_arch: ["9.0"]}')
    assert "io.imgbuild.cuda.arch" not in plan_of(plain).labels
