"""Host driver reading, with a fake nvidia-smi written into tmp_path and put on PATH."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest
from helpers import fake_nvidia_smi

from buildkit_py.analysis import driver as drv
from buildkit_py.analysis.driver import Gpu, HostDriver, read_nvidia_smi
from buildkit_py.errors import DriverCheckError

FIX = Path(__file__).parent / "fixtures" / "nvidia-smi"


def fake_smi(tmp_path: Path, monkeypatch, *, new: tuple[int, str], old: tuple[int, str] | None = None) -> None:
    """Write an nvidia-smi that answers the compute_cap query with ``new`` and the old query with ``old``."""
    new_rc, new_file = new
    old_rc, old_file = old or (2, "old_invalid_field.txt")
    script = tmp_path / "nvidia-smi"
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"new_rc, new_file, old_rc, old_file = {new_rc}, {str(FIX / new_file)!r}, {old_rc}, {str(FIX / old_file)!r}\n"
        "rc, f = (new_rc, new_file) if any('compute_cap' in a for a in sys.argv) else (old_rc, old_file)\n"
        "sys.stdout.write(open(f).read())\n"
        "sys.exit(rc)\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(tmp_path))


def test_several_gpus(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, new=(0, "multi_h100.csv"))
    host = read_nvidia_smi()
    assert host == HostDriver("550.54.15", (Gpu("NVIDIA H100 80GB HBM3", "9.0", True),) * 4, "nvidia-smi")
    assert host.datacenter is True


def test_consumer_gpu(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, new=(0, "single_rtx4090.csv"))
    host = read_nvidia_smi()
    assert host.version == "535.104.05"
    assert host.gpus == (Gpu("NVIDIA GeForce RTX 4090", "8.9", False),)
    assert host.datacenter is False


def test_old_nvidia_smi_without_compute_cap(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, new=(2, "old_invalid_field.txt"), old=(0, "old_no_compute_cap.csv"))
    host = read_nvidia_smi()
    assert host.version == "470.82.01"
    assert host.gpus == (Gpu("Tesla T4", None, True),) * 2


def test_missing_binary(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DriverCheckError, match="not found on PATH") as exc:
        read_nvidia_smi()
    assert exc.value.hint


@pytest.mark.parametrize(("fixture", "expect"), [
    ("driver_error.txt", "couldn't communicate with the NVIDIA driver"),
    ("no_devices.txt", "No devices were found"),
])
def test_driver_error_exit(tmp_path, monkeypatch, fixture, expect):
    fake_smi(tmp_path, monkeypatch, new=(9, fixture), old=(9, fixture))
    with pytest.raises(DriverCheckError, match="exit code 9") as exc:
        read_nvidia_smi()
    assert expect in exc.value.message


@pytest.mark.parametrize("text", ["garbage", "550.54.15\n", "abc, NVIDIA A100, 8.0\n", "", "550.54.15, A, 8.0\n535.104.05, B, 8.0\n"])  # noqa: E501
def test_garbage_output(text):
    with pytest.raises(DriverCheckError):
        drv.parse_smi_csv(text, with_cap=True)


def test_na_compute_cap_is_none():
    host = drv.parse_smi_csv("550.54.15, NVIDIA A100-SXM4-80GB, [N/A]\n", with_cap=True)
    assert host.gpus == (Gpu("NVIDIA A100-SXM4-80GB", None, True),)


@pytest.mark.parametrize(("name", "expect"), [
    ("NVIDIA H100 80GB HBM3", True), ("Tesla V100-SXM2-32GB", True), ("NVIDIA A10G", True), ("NVIDIA L40S", True),
    ("NVIDIA GeForce RTX 3090", False), ("NVIDIA RTX A6000", False), ("Quadro RTX 8000", False), ("Some New GPU", None),
])
def test_classify_datacenter(name, expect):
    assert drv.classify_datacenter(name) is expect


def test_nvml_path(monkeypatch):
    class FakeNvml:
        def nvmlInit(self): pass
        def nvmlShutdown(self): pass
        def nvmlSystemGetDriverVersion(self): return b"535.104.05"
        def nvmlDeviceGetCount(self): return 2
        def nvmlDeviceGetHandleByIndex(self, i): return i
        def nvmlDeviceGetName(self, h): return "NVIDIA A100-SXM4-80GB"
        def nvmlDeviceGetCudaComputeCapability(self, h): return (8, 0)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    host = drv.read_host_driver()
    assert host == HostDriver("535.104.05", (Gpu("NVIDIA A100-SXM4-80GB", "8.0", True),) * 2, "nvml")


def test_falls_back_to_smi_without_pynvml(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    fake_smi(tmp_path, monkeypatch, new=(0, "single_rtx4090.csv"))
    assert drv.read_host_driver().source == "nvidia-smi"


BANNER = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
"""


@pytest.mark.parametrize(("text", "cuda"), [
    (BANNER, "12.4"),
    ("Driver Version                            : 580.95.05\nCUDA Version                              : 13.0\n",
     "13.0"),   # nvidia-smi -q
    ("| NVIDIA-SMI 470.82.01    Driver Version: 470.82.01    CUDA Version: N/A      |", None),
    ("", None),
])
def test_driver_cuda_version_from_nvidia_smi(text, cuda):
    assert drv.parse_smi_cuda_version(text) == cuda


def test_nvidia_smi_reports_the_drivers_cuda(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(fake_nvidia_smi(tmp_path, FIX / "multi_h100.csv", BANNER)))
    assert read_nvidia_smi().cuda_version == "12.4"


def test_nvml_reports_the_drivers_cuda(monkeypatch):
    class FakeNvml:
        def nvmlInit(self): pass
        def nvmlShutdown(self): pass
        def nvmlSystemGetDriverVersion(self): return "580.95.05"
        def nvmlSystemGetCudaDriverVersion(self): return 13000
        def nvmlDeviceGetCount(self): return 1
        def nvmlDeviceGetHandleByIndex(self, i): return i
        def nvmlDeviceGetName(self, h): return "NVIDIA H200"
        def nvmlDeviceGetCudaComputeCapability(self, h): return (9, 0)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    assert drv.read_host_driver().cuda_version == "13.0"
