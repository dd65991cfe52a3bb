"""Before building: which GPUs the prebuilt wheels a recipe installs run on (issue 30, item 4).
The rule over the data (compat.gpu_fit), the data against the real wheels this machine has, and
the refusals of ``plan --gpu`` and of a recipe's ``gpus:``."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest
from conftest import unavailable
from helpers import run_cli, write_recipe

from buildkit_py import compat
from buildkit_py.analysis.kernels import read_kernels
from buildkit_py.compat import gpu_fit
from buildkit_py.compat.gpu_fit import Coverage, GpuSpec, PackageKernels, gpu_spec, gpus_rule, package_fit
from buildkit_py.compat.gpu_kernels import WheelLibrary
from buildkit_py.errors import CompatibilityError, UsageError
from buildkit_py.pipeline import OFFLINE, plan_recipe
from buildkit_py.recipe.model import load_recipe

H100, B200, T4 = GpuSpec("H100", "9.0"), GpuSpec("B200", "10.0"), GpuSpec("T4", "7.5")


# ---------------------------------------------------------------- the rule
@pytest.mark.parametrize(("code", "gpu", "sass", "ptx"), [
    ("8.0", "8.6", True, True),      # same major, lower minor: runs
    ("8.6", "8.0", False, False),    # a higher minor never runs on a lower one
    ("8.0", "9.0", False, True),     # SASS never crosses a major; PTX JITs upward
    ("9.0a", "9.0", True, True),     # arch-specific: its own GPU
    ("9.0a", "10.0", False, False),  # and no other
    ("12.0", "10.0", False, False),
])
def test_sass_and_ptx_rules(code, gpu, sass, ptx):
    assert gpu_fit.sass_runs(code, gpu) is sass
    assert gpu_fit.ptx_jits(code, gpu) is ptx


@pytest.mark.parametrize(("text", "name", "cc"), [
    ("H100", "H100", "9.0"), ("rtx 5090", "RTX 5090", "12.0"), ("B200", "B200", "10.0"),
    ("sm_90a", "sm_90", "9.0"), ("10.0", "sm_100", "10.0"), ("sm_120", "sm_120", "12.0"),
])
def test_gpu_spec(text, name, cc):
    spec = gpu_spec(text)
    assert (spec.name, spec.capability) == (name, cc)


def test_gpu_spec_unknown_lists_the_known():
    with pytest.raises(UsageError, match="unknown GPU") as exc:
        gpu_spec("RTX 9999")
    assert "H100" in (exc.value.hint or "")


def _pk(*libs: tuple[tuple[str, ...], tuple[str, ...]], decides: bool = True) -> PackageKernels:
    return PackageKernels("pkg", "1.0", "", tuple(WheelLibrary(f"lib{i}.so", s, p, decides)
                                                  for i, (s, p) in enumerate(libs)), "test")


def test_the_worst_library_decides():
    fit = package_fit(_pk((("8.0", "9.0"), ()), (("8.0",), ())), H100)
    assert (fit.coverage, fit.library, fit.archs) == (Coverage.NONE, "lib1.so", ("8.0",))


def test_ptx_only_is_a_jit_not_a_refusal():
    fit = package_fit(_pk((("8.0",), ("8.0",))), H100)
    assert (fit.coverage, fit.using) == (Coverage.PTX, ("8.0",))


def test_a_library_with_no_real_kernels_does_not_decide():
    fit = package_fit(_pk((("7.5",), ()), decides=False), B200)
    assert fit.coverage == Coverage.SASS


def test_no_row_is_unknown_and_partial_never_a_refusal():
    fit = gpu_fit.gpu_fit(B200, [PackageKernels("torch", "2.9.0", "cu128", None, None)])
    assert fit.packages[0].coverage is None
    assert fit.partial and fit.verdict == Coverage.SASS and fit.deciding is None


# ---------------------------------------------------------------- the data
@pytest.mark.parametrize(("version", "variant", "gpu", "coverage"), [
    ("2.4.1", "cu121", H100, Coverage.SASS),
    ("2.4.1", "cu124", B200, Coverage.NONE),   # TORCH_CUDA_ARCH_LIST ends at 9.0
    ("2.0.1", "cu117", H100, Coverage.NONE),   # 9.0 only in the cu118 build
    ("2.0.1", "cu118", H100, Coverage.SASS),
    ("2.1.2", "cu118", GpuSpec("K80", "3.7"), Coverage.SASS),   # 3.7 kept for CUDA 11.8
    ("2.1.2", "cu121", GpuSpec("K80", "3.7"), Coverage.NONE),
    ("2.14.1", "cu130", B200, Coverage.SASS),
    ("2.14.1", "cu130", T4, Coverage.NONE),    # libtorch_cuda_linalg.so starts at sm_80
    ("2.15.0", "cu132", T4, Coverage.SASS),
    ("2.8.0", "cu128", GpuSpec("RTX 5090", "12.0"), Coverage.SASS),  # the first PyPI build with Blackwell
    ("2.7.1", "cu126", GpuSpec("RTX 5090", "12.0"), Coverage.NONE),
])
def test_torch_rows(version, variant, gpu, coverage):
    row = compat.wheel_kernels("torch", version, variant)
    assert row is not None and row.source
    fit = package_fit(PackageKernels("torch", version, variant, row.libraries, row.source), gpu)
    assert fit.coverage == coverage


@pytest.mark.parametrize(("version", "variant", "gpu", "hint"), [
    # another CUDA variant of the same release first
    ("2.0.1", "cu117", H100, "torch 2.0.1's cu118 build runs on H100 (compute capability 9.0): use that CUDA variant"),
    # else the nearest release recorded, its newest variant that runs
    ("2.4.1", "cu124", B200, "the nearest torch release imgbuild's data records with a kernel for B200 "
                             "(compute capability 10.0) is 2.8.0 (cu128)"),
    # 2.11-2.14's libtorch_cuda_linalg.so (cu130) starts at sm_80; 2.15.0's (cu132) has sm_75 again
    ("2.14.1", "cu130", T4, "the nearest torch release imgbuild's data records with a kernel for T4 "
                            "(compute capability 7.5) is 2.15.0 (cu132)"),
    ("2.10.0", "cu128", GpuSpec("P100", "6.0"), "the nearest torch release imgbuild's data records with a kernel "
                                                "for P100 (compute capability 6.0) is 2.7.1 (cu126)"),
])
def test_hint_for_a_torch_without_a_kernel(version, variant, gpu, hint):
    row = compat.wheel_kernels("torch", version, variant)
    fit = gpu_fit.gpu_fit(gpu, [PackageKernels("torch", version, variant, row.libraries, row.source)])
    assert fit.packages[0].hint == hint


def test_bitsandbytes_without_sm90_for_torchs_cuda_is_refused_with_a_release_that_has_it(tmp_path):
    """bitsandbytes 0.43.3's CUDA 11.8 build stops at sm_89 (read from its wheel); 0.45.5's has sm_90."""
    text = RECIPE.format(extra="pip: [bitsandbytes==0.43.3]\n").replace('"12.4.1"', '"11.8.0"')
    plan = plan_recipe(write_recipe(tmp_path, text), lookup=OFFLINE)
    assert plan.resolution.torch_variant == "cu118"
    with pytest.raises(CompatibilityError) as exc:
        gpus_rule(plan.recipe, plan.resolution, [("--gpu", "H100")])
    assert (exc.value.component, exc.value.version) == ("bitsandbytes", "0.43.3 (cu118)")
    assert exc.value.hint == ("the nearest bitsandbytes release imgbuild's data records with a kernel for H100 "
                              "(compute capability 9.0) is 0.45.5 (cu118)")


def test_every_torch_row_names_a_variant_torch_json_knows():
    for row in compat.wheel_kernel_rows("torch"):
        assert row.variant in compat.torch_release(row.version).variants


CACHE = Path(os.environ.get("IMGBUILD_TEST_WHEEL_CACHE", "/var/cache/imgbuild-test/wheels"))


@pytest.mark.parametrize(("wheel", "package", "version", "variant", "member"), [
    ("torch-2.14.1-*.whl", "torch", "2.14.1", "cu130", "torch/lib/libtorch_cuda_linalg.so"),
    ("bitsandbytes-0.50.2-*.whl", "bitsandbytes", "0.50.2", "cu128", "bitsandbytes/libbitsandbytes_cuda128.so"),
    ("nvidia_cublas-13.1.1.3-*.whl", "nvidia-cublas", "13.1.1.3", "", "nvidia/cu13/lib/libcublasLt.so.13"),
    ("nvidia_nccl_cu13-2.30.7-*.whl", "nvidia-nccl-cu13", "2.30.7", "", "nvidia/nccl/lib/libnccl.so.2"),
])
def test_rows_match_the_real_wheels(wheel, package, version, variant, member):
    """A row says what the wheel's own fat binaries say (the wheels test_kernels_cuobjdump keeps)."""
    found = sorted(CACHE.glob(wheel))
    if not found:
        unavailable(f"no {wheel} in {CACHE} (tests/test_kernels_cuobjdump.py downloads it)")
    with zipfile.ZipFile(found[0]) as zf:
        kernels = read_kernels(zf.read(member), member)
    assert kernels is not None
    row = compat.wheel_kernels(package, version, variant)
    assert row is not None
    lib = next(x for x in row.libraries if x.path == member)
    assert lib.sass == tuple(sorted({f"{a.capability}{'a' if a.specific else ''}" for a in kernels.sass_archs()},
                                    key=compat.arch_key))
    assert lib.ptx == tuple(sorted({f"{a.capability}{'a' if a.specific else ''}" for a, _ in kernels.ptx()},
                                   key=compat.arch_key))


# ---------------------------------------------------------------- recipes: gpus: and plan --gpu
RECIPE = """\
name: t/gpus
cuda: {{version: "12.4.1", flavor: runtime, source: wheels}}
base: {{image: "ubuntu:22.04"}}
python: "3.11"
torch: "2.4.1"
{extra}"""


def test_recipe_gpus_are_refused_at_their_key(tmp_path):
    path = write_recipe(tmp_path, RECIPE.format(extra="gpus: [H100, B200]\n"))
    with pytest.raises(CompatibilityError) as exc:
        plan_recipe(path, lookup=OFFLINE)
    err = exc.value
    assert (err.key, err.line, err.component, err.version) == ("gpus[1]", 6, "torch", "2.4.1 (cu124)")
    assert "no kernel for B200" in err.reason and "SASS 5.0, 6.0, 7.0, 7.5, 8.0, 8.6, 9.0" in err.reason
    assert err.hint == ("the nearest torch release imgbuild's data records with a kernel for B200 "
                        "(compute capability 10.0) is 2.8.0 (cu128)")


def test_recipe_gpus_that_run_plan_and_change_the_digest(tmp_path):
    plain = load_recipe(write_recipe(tmp_path / "a", RECIPE.format(extra="")))
    targeted = write_recipe(tmp_path / "b", RECIPE.format(extra="gpus: [H100, sm_80]\n"))
    plan = plan_recipe(targeted, lookup=OFFLINE)
    assert plan.recipe.gpus == ("H100", "sm_80")
    assert plan.recipe.digest != plain.digest
    assert "gpus" not in plain.normalized()  # recipes without it keep their digest


def test_unknown_gpu_in_a_recipe_is_an_error_at_its_line(tmp_path):
    path = write_recipe(tmp_path, RECIPE.format(extra="gpus:\n  - H100\n  - RTX 9999\n"))
    with pytest.raises(CompatibilityError) as exc:
        plan_recipe(path, lookup=OFFLINE)
    assert (exc.value.key, exc.value.line) == ("gpus[1]", 8)
    assert "H100" in (exc.value.hint or "")


def test_empty_gpus_is_a_schema_error(tmp_path):
    code, _, err = run_cli("plan", str(write_recipe(tmp_path, RECIPE.format(extra="gpus: []\n"))))
    assert code == 2 and "gpus" in err


def test_flash_attn_release_wheel_without_sm100_is_refused_with_the_release_that_has_it(tmp_path):
    path = write_recipe(tmp_path, RECIPE.format(extra="pip: [flash-attn==2.6.3]\n"))
    plan = plan_recipe(path, lookup=OFFLINE)
    with pytest.raises(CompatibilityError) as exc:
        gpus_rule(plan.recipe, plan.resolution, [("--gpu", "H100"), ("--gpu", "B200")])
    errors = getattr(exc.value, "errors", [exc.value])
    by = {e.component: e for e in errors}
    assert set(by) == {"torch", "flash-attn"}
    assert by["flash-attn"].hint == ("flash-attn 2.7.4.post1 compiles SASS for B200 (compute capability 10.0) "
                                     "with nvcc >=12.8: pin it with that CUDA")


def test_cli_plan_gpu_refuses_with_exit_2(tmp_path):
    path = write_recipe(tmp_path, RECIPE.format(extra=""))
    code, _, err = run_cli("plan", str(path), "--gpu", "B200")
    assert code == 2
    assert "torch 2.4.1 (cu124) conflicts with gpu B200 (compute capability 10.0)" in err
    assert "hint: the nearest torch release imgbuild's data records with a kernel for B200" in err


def test_cli_plan_gpu_json(tmp_path):
    path = write_recipe(tmp_path, RECIPE.format(extra="gpus: [L4]\n"))
    code, out, _ = run_cli("plan", str(path), "--gpu", "sm_90", "--json")
    assert code == 0
    data = json.loads(out)
    assert [g["gpu"] for g in data["gpus"]] == ["L4", "sm_90"]
    assert all(g["verdict"] == "sass" and g["runs"] for g in data["gpus"])
    torch = next(p for p in data["gpus"][1]["packages"] if p["package"] == "torch")
    assert (torch["coverage"], torch["using"]) == ("sass", ["9.0"])


def test_cli_plan_gpu_unknown_row_is_partial_not_refused(tmp_path):
    """torch 2.9.0: its build script is in pytorch/pytorch, not read here, and no wheel was read."""
    path = write_recipe(tmp_path, RECIPE.format(extra="").replace('"12.4.1"', '"12.8.1"').replace(
        '"2.4.1"', '"2.9.0"'))
    code, out, _ = run_cli("plan", str(path), "--gpu", "B200", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["gpus_partial"] is True and data["gpus"][0]["partial"] is True
    torch = next(p for p in data["gpus"][0]["packages"] if p["package"] == "torch")
    assert torch["coverage"] == "unknown"
    assert any(w["code"] == "gpu-kernels-unknown" and "torch 2.9.0" in w["message"] for w in data["warnings"])


def test_cli_plan_gpu_text_shows_each_gpu(tmp_path):
    path = write_recipe(tmp_path, RECIPE.format(extra=""))
    code, out, _ = run_cli("plan", str(path), "--gpu", "H100")
    assert code == 0
    assert "  gpu       H100 (compute capability 9.0): sass" in out


# ---------------------------------------------------------------- the label and the image tests
def test_the_label_records_the_gpus_as_nvidia_names_them(tmp_path):
    from buildkit_py.plan.labels import static_labels

    path = write_recipe(tmp_path, RECIPE.format(extra="gpus: [h100, sm_80]\n"))
    plan = plan_recipe(path, lookup=OFFLINE)
    assert static_labels(plan.recipe, plan.resolution)["io.imgbuild.gpus"] == "H100;sm_80"


def test_no_gpus_no_label(tmp_path):
    from buildkit_py.plan.labels import static_labels

    plan = plan_recipe(write_recipe(tmp_path, RECIPE.format(extra="")), lookup=OFFLINE)
    assert "io.imgbuild.gpus" not in static_labels(plan.recipe, plan.resolution)


def _lib(path: str, *entries: bytes):
    from fatbin_bytes import elf, fatbin

    k = read_kernels(elf({".nv_fatbin": fatbin(*entries)}), path)
    assert k is not None
    return k


def test_gpus_label_checked_against_the_image_kernels():
    from fatbin_bytes import PTX, SASS, entry

    from buildkit_py.analysis.image_checks import gpus_label_checks

    big = b"k" * 8192
    files = [_lib("/venv/torch/lib/libtorch_cuda.so", entry(SASS, 80, payload=big), entry(SASS, 90, payload=big)),
             _lib("/venv/x/libx.so", entry(SASS, 90, payload=big), entry(PTX, 80, version=(8, 0), payload=big))]
    results = {r.name: r for r in gpus_label_checks("H100;A100;B200;nonsense", files)}
    assert results["label io.imgbuild.gpus: H100"].status == "passed"
    a100 = results["label io.imgbuild.gpus: A100"]
    assert a100.status == "passed" and "PTX JIT" in a100.detail  # libx runs there only through its PTX
    b200 = results["label io.imgbuild.gpus: B200"]
    assert b200.status == "failed" and "libtorch_cuda.so" in b200.detail
    assert results["label io.imgbuild.gpus: nonsense"].status == "failed"


def test_a_matrix_drops_the_variants_whose_torch_has_no_kernel_for_its_gpus(tmp_path):
    """torch 2.0.1: its cu117 build stops at sm_86, its cu118 build has sm_90."""
    from buildkit_py.pipeline import load_matrix

    text = RECIPE.format(extra='gpus: [H100]\nmatrix:\n  cuda.version: ["11.7", "11.8"]\n')
    path = write_recipe(tmp_path, text.replace('"2.4.1"', '"2.0.1"').replace('"12.4.1"', '"11.8.0"'))
    matrix = load_matrix(path, lookup=OFFLINE)
    assert [v.values["cuda.version"] for v in matrix.variants] == ["11.8"]
    [dropped] = matrix.dropped
    assert dropped.values["cuda.version"] == "11.7"
    assert (dropped.error.key, dropped.error.component, dropped.error.version) == ("gpus[0]", "torch",
                                                                                   "2.0.1 (cu117)")
    assert dropped.error.hint == ("torch 2.0.1's cu118 build runs on H100 (compute capability 9.0): "
                                  "use that CUDA variant")
