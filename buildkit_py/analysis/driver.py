"""Read the host NVIDIA driver: NVML (nvidia-ml-py) when importable, else ``nvidia-smi``."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from buildkit_py.errors import DriverCheckError

_QUERY_NEW = ["--query-gpu=driver_version,name,compute_cap", "--format=csv,noheader"]
_QUERY_OLD = ["--query-gpu=driver_version,name", "--format=csv,noheader"]
_DRIVER_RE = re.compile(r"^\d{3}(\.\d{1,3}){1,2}$")
_CAP_RE = re.compile(r"^\d{1,2}\.\d$")
# nvidia-smi's banner ("| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4 |") and
# `nvidia-smi -q` ("CUDA Version                              : 12.4") both say it this way.
_SMI_CUDA_RE = re.compile(r"CUDA Version\s*:\s*(\d{1,2}\.\d{1,2})\b")
# Name fragments of NVIDIA data-center products (forward compatibility applies to these).
_DATACENTER = re.compile(r"\b(Tesla|A100|A800|A30|A40|A10G?|A16|A2|H100|H200|H800|H20|GH200|B100|B200|B300|GB200"
                         r"|GB300|L4|L40S?|L20|T4|V100|P100|P40|K80)\b")
_CONSUMER = re.compile(r"\b(GeForce|TITAN|Quadro|RTX \d{4}|RTX A\d{4})\b")


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_cap: str | None
    datacenter: bool | None


@dataclass(frozen=True)
class HostDriver:
    version: str
    gpus: tuple[Gpu, ...]
    source: Literal["nvidia-smi", "nvml"]
    # The CUDA version the driver itself says it runs natively ("12.4"): NVML's
    # nvmlSystemGetCudaDriverVersion, nvidia-smi's "CUDA Version"; None where it could not be read.
    cuda_version: str | None = None

    @property
    def datacenter(self) -> bool | None:
        """True if every GPU is a data-center part, False if any is not, None if unknown."""
        flags = [g.datacenter for g in self.gpus]
        if not flags or any(f is None for f in flags):
            return None if not any(f is False for f in flags) else False
        return all(flags)


def classify_datacenter(name: str) -> bool | None:
    if _CONSUMER.search(name):
        return False
    if _DATACENTER.search(name):
        return True
    return None


def parse_smi_csv(text: str, *, with_cap: bool) -> HostDriver:
    rows = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not rows:
        raise DriverCheckError("nvidia-smi printed no GPUs", hint="is an NVIDIA GPU visible to this host/container?")
    versions, gpus = set(), []
    for row in rows:
        cells = [c.strip() for c in row.split(",")]
        want = 3 if with_cap else 2
        if len(cells) != want:
            raise DriverCheckError(f"unexpected nvidia-smi output line: {row!r}",
                                   hint="expected 'driver_version, name[, compute_cap]' CSV")
        ver, name = cells[0], cells[1]
        if not _DRIVER_RE.match(ver):
            raise DriverCheckError(f"unexpected driver version {ver!r} in nvidia-smi output line {row!r}")
        cap = cells[2] if with_cap else None
        if cap is not None and not _CAP_RE.match(cap):
            cap = None  # e.g. "[N/A]"
        versions.add(ver)
        gpus.append(Gpu(name, cap, classify_datacenter(name)))
    if len(versions) != 1:
        raise DriverCheckError(f"nvidia-smi reports several driver versions: {sorted(versions)}")
    return HostDriver(versions.pop(), tuple(gpus), "nvidia-smi")


def _tail(text: str, n: int = 3) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])


def read_nvidia_smi(*, binary: str = "nvidia-smi", timeout: float = 20.0,
                    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> HostDriver:
    path = shutil.which(binary)
    if path is None:
        raise DriverCheckError(f"{binary} not found on PATH",
                               hint="install the NVIDIA driver, or run where the GPU is visible "
                                    "(e.g. docker run --gpus all)")

    def call(args: list[str]) -> subprocess.CompletedProcess[str]:
        try:
            return run([path, *args], capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DriverCheckError(f"could not run {path}: {exc}") from exc

    proc = call(_QUERY_NEW)
    if proc.returncode == 0:
        return _with_cuda(parse_smi_csv(proc.stdout, with_cap=True), call)
    out = (proc.stdout or "") + "\n" + (proc.stderr or "")
    if "compute_cap" in out or "not a valid field" in out.lower() or "Field" in out:
        old = call(_QUERY_OLD)  # nvidia-smi older than ~510 does not know compute_cap
        if old.returncode == 0:
            return _with_cuda(parse_smi_csv(old.stdout, with_cap=False), call)
        out = (old.stdout or "") + "\n" + (old.stderr or "")
        proc = old
    raise DriverCheckError(f"{binary} failed with exit code {proc.returncode}: {_tail(out)}",
                           hint="check that the NVIDIA kernel module is loaded and matches the user-space driver")


def parse_smi_cuda_version(text: str) -> str | None:
    """The driver's CUDA version from nvidia-smi's banner, or None when it does not say one."""
    m = _SMI_CUDA_RE.search(text or "")
    return m.group(1) if m else None


def _with_cuda(host: HostDriver, call: Callable[[list[str]], subprocess.CompletedProcess[str]]) -> HostDriver:
    """Add what the driver says it runs natively (nvidia-smi's banner); unknown when it cannot say."""
    try:
        proc = call([])
    except DriverCheckError:
        return host
    cuda = parse_smi_cuda_version(proc.stdout) if proc.returncode == 0 else None
    return dataclasses.replace(host, cuda_version=cuda)


def _cuda_from_int(value: int) -> str:
    """NVML's CUDA driver version 12040 -> "12.4"."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def read_nvml() -> HostDriver:
    try:
        import pynvml  # optional: the nvml extra  # noqa: PLC0415
    except ImportError as exc:
        raise DriverCheckError("pynvml (nvidia-ml-py) is not installed") from exc
    try:
        pynvml.nvmlInit()
        try:
            ver = pynvml.nvmlSystemGetDriverVersion()
            ver = ver.decode() if isinstance(ver, bytes) else str(ver)
            try:
                cuda: str | None = _cuda_from_int(int(pynvml.nvmlSystemGetCudaDriverVersion()))
            except Exception:  # NVML older than the call
                cuda = None
            gpus = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(h)
                name = name.decode() if isinstance(name, bytes) else str(name)
                try:
                    mj, mn = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                    cap = f"{mj}.{mn}"
                except Exception:  # old NVML without this call
                    cap = None
                gpus.append(Gpu(name, cap, classify_datacenter(name)))
        finally:
            pynvml.nvmlShutdown()
    except DriverCheckError:
        raise
    except Exception as exc:  # pynvml.NVMLError and friends
        raise DriverCheckError(f"NVML query failed: {exc}") from exc
    if not gpus:
        raise DriverCheckError("NVML reports no GPUs")
    return HostDriver(ver, tuple(gpus), "nvml", cuda)


def read_host_driver(*, prefer_nvml: bool = True) -> HostDriver:
    """NVML when pynvml is importable and works, otherwise nvidia-smi."""
    if prefer_nvml:
        try:
            import pynvml  # optional: the nvml extra  # noqa: F401, PLC0415
        except ImportError:
            pass
        else:
            try:
                return read_nvml()
            except DriverCheckError as nvml_err:
                try:
                    return read_nvidia_smi()
                except DriverCheckError as smi_err:
                    raise DriverCheckError(f"{nvml_err.message}; and {smi_err.message}", hint=smi_err.hint) from smi_err
    return read_nvidia_smi()
