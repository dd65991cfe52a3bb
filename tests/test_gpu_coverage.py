"""check --gpu: which GPUs an image's kernels run on, on hand-built fat binaries (the reader's
agreement with cuobjdump is test_kernels_cuobjdump.py; an image end to end, test_e2e_gpu_check.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fatbin_bytes import PTX, SASS, SPECIFIC, elf, entry, fatbin
from helpers import run_cli

from buildkit_py import compat
from buildkit_py.analysis import gpu_coverage
from buildkit_py.analysis.gpu_coverage import (
    Coverage,
    gpu_report,
    loaded_alternatives,
    ptx_need,
    resolve_gpu,
)
from buildkit_py.analysis.kernels import FileKernels, read_kernels
from buildkit_py.errors import UsageError

BIG = b"k" * 8192  # past TRIVIAL_BYTES: real kernels


def lib(path: str, *entries: bytes) -> FileKernels:
    k = read_kernels(elf({".nv_fatbin": fatbin(*entries)}), path)
    assert k is not None
    return k


TORCH = lib("/venv/torch/lib/libtorch_cuda.so", entry(SASS, 80, payload=BIG), entry(SASS, 90, payload=BIG),
            entry(SASS, 100, payload=BIG))
HOPPER_ONLY = lib("/venv/fa/flash.so", entry(SASS, 80, payload=BIG),
                  entry(SASS, 90, payload=BIG, flags=0x11 | SPECIFIC))
WITH_PTX = lib("/venv/x/libx.so", entry(SASS, 80, payload=BIG), entry(PTX, 90, version=(9, 0), payload=BIG))
EMPTY_CUBIN = lib("/venv/nvidia/libcufft.so.12", entry(SASS, 75, payload=b"e" * 600))


@pytest.mark.parametrize(("name", "capability"), [
    ("H100", "9.0"), ("h200", "9.0"), ("B200", "10.0"), ("GB200", "10.0"), ("RTX 5090", "12.0"),
    ("GeForce RTX 5090", "12.0"), ("L4", "8.9"), ("A10G", "8.6"), ("T4", "7.5"), ("A100", "8.0"),
    ("L40S", "8.9"), ("RTX 4090", "8.9"), ("V100", "7.0"), ("sm_90", "9.0"), ("sm_100a", "10.0"), ("12.0", "12.0"),
    ("SM_121", "12.1"),
])
def test_gpu_names_and_architectures(name, capability):
    assert resolve_gpu(name).capability.capability == capability


def test_every_gpu_row_has_a_source_url():
    assert all("developer.nvidia.com/cuda-gpus" in g.source for g in compat.gpus())


def test_an_unknown_gpu_is_a_usage_error_listing_the_known_ones():
    with pytest.raises(UsageError, match="unknown GPU 'H1000'") as info:
        resolve_gpu("H1000")
    assert "H100" in (info.value.hint or "") and "RTX 5090" in (info.value.hint or "")


def test_sass_runs_on_the_same_major_with_a_lower_or_equal_minor():
    report = gpu_report("img", resolve_gpu("B300"), [TORCH])  # 10.3 runs sm_100
    assert report.verdict == Coverage.SASS and report.runs and report.decided_by is None
    assert report.libraries[0].sass == ("sm_100",)
    assert gpu_report("img", resolve_gpu("RTX 5090"), [TORCH]).verdict == Coverage.NONE  # 12.0: no sm_12x
    assert gpu_report("img", resolve_gpu("L4"), [TORCH]).libraries[0].sass == ("sm_80",)  # 8.9 runs 8.0


def test_arch_specific_sass_runs_only_on_its_own_gpu():
    assert gpu_report("img", resolve_gpu("H100"), [HOPPER_ONLY]).libraries[0].sass == ("sm_90a",)
    report = gpu_report("img", resolve_gpu("B200"), [TORCH, HOPPER_ONLY])
    assert report.verdict == Coverage.NONE and report.decided_by == "/venv/fa/flash.so"
    assert "no kernel for B200 (compute capability 10.0) in /venv/fa/flash.so" in report.message()
    assert "sm_80, sm_90a" in report.message()


def test_ptx_is_jit_compiled_on_newer_gpus_with_the_driver_it_needs():
    report = gpu_report("img", resolve_gpu("RTX 5090"), [WITH_PTX])
    assert report.verdict == Coverage.PTX and report.runs and report.decided_by == "/venv/x/libx.so"
    lib = report.libraries[0]
    assert lib.ptx == ("compute_90 (PTX ISA 9.0)",)
    assert lib.need is not None and (lib.need.cuda, lib.need.driver) == ("13.0", "580.65.06")
    assert "PTX ISA 9.0 needs driver >= 580.65.06 (CUDA 13.0)" in report.message()
    assert gpu_report("img", resolve_gpu("A100"), [WITH_PTX]).verdict == Coverage.SASS
    assert gpu_report("img", resolve_gpu("L4"), [WITH_PTX]).verdict == Coverage.SASS  # sm_80 SASS runs on 8.9
    assert gpu_report("img", resolve_gpu("T4"), [WITH_PTX]).verdict == Coverage.NONE  # PTX 9.0 is above 7.5


def test_a_large_jit_is_called_out(monkeypatch):
    monkeypatch.setattr(gpu_coverage, "LARGE_JIT_BYTES", 1000)
    assert "expect minutes at first start" in gpu_report("img", resolve_gpu("B200"), [WITH_PTX]).message()


def test_ptx_isa_versions_map_to_their_cuda_and_driver():
    assert (ptx_need("8.7").cuda, ptx_need("8.7").driver) == ("12.8", "570.26")
    assert ptx_need("9.3").cuda == "13.3" and ptx_need("9.3").driver == "610.43.02"  # floor unpublished: bundled
    unknown = ptx_need("12.4")
    assert unknown.cuda is None and "newer than the CUDA releases known here" in unknown.describe()


def test_a_library_without_real_kernels_does_not_decide():
    report = gpu_report("img", resolve_gpu("H100"), [TORCH, EMPTY_CUBIN])
    assert report.verdict == Coverage.SASS
    fft = next(x for x in report.libraries if "cufft" in x.path)
    assert fft.coverage == Coverage.NONE and not fft.decides


def test_the_build_for_the_images_cuda_is_the_one_counted():
    builds = [lib(f"/venv/bitsandbytes/libbitsandbytes_cuda{v}.so", entry(SASS, sm, payload=BIG))
              for v, sm in (("118", 90), ("130", 100))]
    assert [k.path for k in loaded_alternatives([TORCH, *builds], "13.0")] == [
        TORCH.path, "/venv/bitsandbytes/libbitsandbytes_cuda130.so"]
    assert len(loaded_alternatives(builds, None)) == 2
    assert len(loaded_alternatives(builds, "12.4")) == 2  # no build for it: all are candidates
    assert gpu_report("img", resolve_gpu("B200"), loaded_alternatives(builds, "13.0")).verdict == Coverage.SASS


def test_an_image_without_kernels_runs_anywhere():
    report = gpu_report("img", resolve_gpu("T4"), [])
    assert report.verdict == Coverage.SASS and "no CUDA kernels in the image" in report.message()


# ---------------------------------------------------------------- the command


@pytest.fixture
def image_kernels(monkeypatch):
    """check --gpu on an image whose files are these fat binaries (no engine)."""
    files: list[FileKernels] = []
    monkeypatch.setattr(gpu_coverage, "read_image_kernels", lambda engine, image: (files, [("/bad.so", "garbled")]))
    monkeypatch.setattr("buildkit_py.cli.check._cuda_of_target",
                        lambda _engine, target, _cache: ("13.0.3", f"image {target}"))
    return files


def test_check_gpu_text_and_exit_codes(image_kernels):
    image_kernels += [TORCH, HOPPER_ONLY]
    code, out, _ = run_cli("check", "img:1", "--gpu", "H100")
    assert code == 0
    assert "image img:1 on H100 (compute capability 9.0): sass" in out
    assert "sass      /venv/fa/flash.so: sm_90a" in out and "unreadable /bad.so: garbled" in out
    code, out, _ = run_cli("check", "img:1", "--gpu", "B200")
    assert code == 1
    assert "no-kernel" in out and "no kernel for B200 (compute capability 10.0) in /venv/fa/flash.so" in out


def test_check_gpu_json(image_kernels):
    image_kernels += [WITH_PTX]
    code, out, _ = run_cli("check", "img:1", "--gpu", "sm_120", "--json")
    data = json.loads(out)
    assert code == 0
    assert (data["verdict"], data["runs"], data["decided_by"], data["capability"]) == (
        "ptx-jit", True, "/venv/x/libx.so", "12.0")
    assert data["libraries"][0]["ptx_min_driver"] == "580.65.06"


def test_check_gpu_with_a_driver_too_old_for_the_ptx(image_kernels):
    image_kernels += [lib("/venv/x/liby.so", entry(PTX, 80, version=(9, 3), payload=BIG))]
    code, out, _ = run_cli("check", "img:1", "--gpu", "H100", "--driver", "580.65.06")
    assert code == 1
    assert "driver 580.65.06 is too old to JIT-compile the PTX of /venv/x/liby.so" in out
    assert run_cli("check", "img:1", "--gpu", "H100", "--driver", "610.43.02")[0] == 0


@pytest.mark.parametrize(("argv", "says"), [
    (("check", "img:1", "--gpu", "H1000"), "unknown GPU 'H1000'"),
    (("check", "--cuda", "12.4", "--gpu", "H100"), "--gpu checks an image's kernels"),
])
def test_check_gpu_usage_errors(image_kernels, argv, says):
    code, _, err = run_cli(*argv)
    assert code == 2 and says in err


# ---------------------------------------------------------------- inspect --kernels


def test_coverage_is_architectures_by_libraries_with_sass_bytes():
    from buildkit_py.analysis.gpu_coverage import coverage_table, kernel_coverage

    cov = kernel_coverage([HOPPER_ONLY, TORCH, WITH_PTX])
    assert cov.archs == ("sm_80", "sm_90", "sm_90a", "sm_100")
    assert cov.sass_bytes() == {"sm_80": 3 * 8192, "sm_90": 8192, "sm_90a": 8192, "sm_100": 8192}
    assert cov.libraries[2] == ("/venv/x/libx.so", {"sm_80": 8192}, ("compute_90 (9.0)",))
    table = coverage_table(cov)
    assert table.columns == ("library", "sm_80", "sm_90", "sm_90a", "sm_100", "ptx")
    assert table.rows[0] == ("flash.so", "8.0 KiB", "-", "8.0 KiB", "-", "-")
    assert table.rows[-1] == ("all libraries", "24.0 KiB", "8.0 KiB", "8.0 KiB", "8.0 KiB", "")
    assert cov.to_json()["sass_bytes"]["sm_80"] == 24576


def test_inspect_kernels_adds_the_table_and_json(monkeypatch):
    from buildkit_py.analysis import inspect as inspect_mod

    asked = []

    def inspect_image(engine, ref, options, progress=None):
        """the one pass: the CLI asks inspect_image for the kernels (tests/test_inspect.py reads them)"""
        asked.append(options.kernels)
        return inspect_mod.ImageReport(
            image="img:1", id="sha256:" + "a" * 64, size=1, blob_size=1, compressed_size=None, pull_seconds=None,
            bandwidth_mbps=1000.0, layers=(), labels={}, findings=(),
            kernels=gpu_coverage.kernel_coverage([TORCH]) if options.kernels else None)

    monkeypatch.setattr(inspect_mod, "inspect_image", inspect_image)
    code, out, _ = run_cli("inspect", "img:1", "--kernels", "--progress", "quiet")
    assert code == 0
    assert "CUDA kernels (bytes of SASS per architecture)" in out and "libtorch_cuda.so" in out
    code, out, _ = run_cli("inspect", "img:1", "--kernels", "--json", "--progress", "quiet")
    assert json.loads(out)["kernels"]["archs"] == ["sm_80", "sm_90", "sm_100"]
    code, out, _ = run_cli("inspect", "img:1", "--progress", "quiet")
    assert code == 0 and "CUDA kernels" not in out and asked == [True, True, False]


FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"


def _host(monkeypatch, fixture: str) -> None:
    """This host's GPUs as a recorded nvidia-smi answered (parsed by the real parser)."""
    from buildkit_py.analysis import driver

    host = driver.parse_smi_csv((FIXTURES / fixture).read_text(), with_cap=True)
    monkeypatch.setattr(driver, "read_host_driver", lambda **_: host)


def test_check_gpu_host_uses_the_hosts_compute_capability_and_driver(image_kernels, monkeypatch):
    _host(monkeypatch, "single_rtx4090.csv")  # 8.9
    image_kernels += [TORCH]
    code, out, _ = run_cli("check", "img:1", "--gpu", "host")
    assert "on NVIDIA GeForce RTX 4090 (compute capability 8.9): sass" in out and "libtorch_cuda.so: sm_80" in out
    # the host's driver, checked against the image's CUDA (13.0.3 here) as check does: too old, so exit 1
    assert code == 1 and "driver 535.104.05: incompatible" in out
    _host(monkeypatch, "multi_h100.csv")  # four H100s: one check for their one compute capability
    code, out, _ = run_cli("check", "img:1", "--gpu", "host", "--json")
    data = json.loads(out)
    assert (data["capability"], data["verdict"], data["driver"]["driver"]) == ("9.0", "sass", "550.54.15")


def test_check_gpu_host_without_a_gpu_says_to_name_one(image_kernels, monkeypatch):
    from buildkit_py.analysis import driver
    from buildkit_py.errors import DriverCheckError

    def no_gpu(**_):
        raise DriverCheckError("nvidia-smi not found")

    monkeypatch.setattr(driver, "read_host_driver", no_gpu)
    code, _, err = run_cli("check", "img:1", "--gpu", "host")
    assert code == 3 and "cannot read this host's GPUs" in err and "--gpu H100" in err  # 3: the environment


def test_check_gpu_refuses_a_malformed_driver_before_reading_the_image(image_kernels):
    image_kernels += [TORCH]
    code, out, err = run_cli("check", "img:1", "--gpu", "H100", "--driver", "x")
    assert code == 2 and out == ""
    assert "bad driver version 'x'" in err and "580.65.06" in err and "Traceback" not in err
