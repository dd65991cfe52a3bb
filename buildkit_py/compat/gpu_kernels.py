"""The kernels side of GPU fit, as data: the GPUs and the PTX ISA versions each toolkit brings
(gpu_kernels.json), and the SASS and PTX read out of prebuilt wheels (wheel_kernels.json).
gpu_fit holds the rules that read them."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from buildkit_py.compat.tables import arch_key, bad_entry, check_ascending, load_raw
from buildkit_py.compat.torch_data import torch_release


# ----------------------------------------------------------------------------- GPUs and PTX (gpu_kernels.json)
@dataclass(frozen=True)
class Gpu:
    """A GPU model and the compute capability it reports (NVIDIA's CUDA GPUs list)."""
    name: str
    aliases: tuple[str, ...]
    capability: str  # "9.0"
    source: str


@dataclass(frozen=True)
class PtxIsa:
    """A PTX ISA version and the CUDA release that brought it: a driver of that CUDA or newer JIT-compiles it."""
    ptx: str
    cuda: str
    source: str


def _gpu_key(name: str) -> str:
    """How a GPU name is matched: case, spaces, dashes and an NVIDIA/GeForce/Tesla prefix do not count."""
    key = re.sub(r"[\s_-]+", "", name.lower())
    return re.sub(r"^(nvidia)?(geforce|tesla)?", "", key)


@functools.cache
def _gpu_kernels() -> tuple[dict[str, Gpu], tuple[Gpu, ...], dict[str, PtxIsa]]:
    f = "gpu_kernels.json"
    raw = load_raw(f)
    by_key: dict[str, Gpu] = {}
    rows = []
    for e in raw["gpus"]:
        gpu = Gpu(e["name"], tuple(e.get("aliases", ())), e["capability"], e["source"])
        rows.append(gpu)
        for key in {_gpu_key(n) for n in (gpu.name, *gpu.aliases)}:
            if key in by_key:
                raise bad_entry(f, gpu.name, f"name {key!r} is also {by_key[key].name}'s")
            by_key[key] = gpu
    ptx: dict[str, PtxIsa] = {}
    for e in raw["ptx_isa"]:
        if e["ptx"] in ptx:
            raise bad_entry(f, e["ptx"], "PTX version listed twice")
        ptx[e["ptx"]] = PtxIsa(e["ptx"], e["cuda"], e["source"])
    check_ascending(f, list(ptx))
    check_ascending(f, [p.cuda for p in ptx.values()])
    return by_key, tuple(rows), ptx


def gpus() -> tuple[Gpu, ...]:
    return _gpu_kernels()[1]


def gpu_named(name: str) -> Gpu | None:
    """The GPU of that name or alias ("H100", "rtx 5090", "GeForce RTX 4090"); None when unknown."""
    return _gpu_kernels()[0].get(_gpu_key(name))


def ptx_isa_cuda(ptx: str) -> PtxIsa | None:
    """The CUDA release that brought PTX ISA ``ptx`` ("9.0" -> 13.0); None for a version not recorded."""
    return _gpu_kernels()[2].get(ptx)


# ----------------------------------------------------------------------------- prebuilt wheels' kernels
@dataclass(frozen=True)
class WheelLibrary:
    """One CUDA library of a prebuilt wheel and the compute capabilities its code is for."""
    path: str
    sass: tuple[str, ...]  # "9.0", "9.0a" (arch-specific: that GPU only)
    ptx: tuple[str, ...]  # virtual architectures of its PTX
    decides: bool = True  # False: too little device code to be the library's kernels


@dataclass(frozen=True)
class WheelKernels:
    """What one prebuilt wheel (package, version, CUDA variant) carries, and where that was read."""
    package: str
    version: str
    variant: str  # torch's cuXYZ, bitsandbytes' per-CUDA library; "" for a wheel with one build
    libraries: tuple[WheelLibrary, ...]
    source: str


def _variant_key(package: str, version: str, variant: str) -> tuple[str, Version, str]:
    return package, Version(version), variant


@functools.cache
def _wheel_kernels() -> dict[tuple[str, Version, str], WheelKernels]:
    f = "wheel_kernels.json"
    out: dict[tuple[str, Version, str], WheelKernels] = {}
    for e in load_raw(f)["rows"]:
        name = f"{e['package']} {e['version']} {e['variant']}".strip()
        key = _variant_key(e["package"], e["version"], e["variant"])
        if key in out:
            raise bad_entry(f, name, "listed twice")
        libs = tuple(WheelLibrary(lib["path"], tuple(lib["sass"]), tuple(lib["ptx"]), lib.get("decides", True))
                     for lib in e["libraries"])
        for lib in libs:
            for what in (lib.sass, lib.ptx):
                if list(what) != sorted(set(what), key=arch_key):
                    raise bad_entry(f, name, f"{lib.path}: architectures not ascending and distinct")
        if e["package"] == "torch":
            try:
                variants = torch_release(e["version"]).variants
            except LookupError:
                raise bad_entry(f, name, "a torch release torch.json does not know") from None
            if e["variant"] not in variants:
                raise bad_entry(f, name, f"torch.json lists no {e['variant']!r} build of it ({', '.join(variants)})")
        out[key] = WheelKernels(e["package"], e["version"], e["variant"], libs, e["source"])
    return out


def wheel_kernels(package: str, version: str, variant: str = "") -> WheelKernels | None:
    """The kernels recorded for that prebuilt wheel; None where the data has no row for it."""
    try:
        return _wheel_kernels().get(_variant_key(package, version, variant))
    except InvalidVersion:
        return None


def wheel_kernel_rows(package: str) -> tuple[WheelKernels, ...]:
    """Every recorded wheel of ``package``, oldest release first."""
    return tuple(w for k, w in sorted(_wheel_kernels().items()) if k[0] == package)
