"""Does an image carry kernels for a GPU? Per CUDA library (every ELF file with fat binaries,
``analysis.kernels``): SASS that runs on it, PTX the driver can JIT-compile for it, or nothing,
which is the run-time "no kernel image is available for execution on the device".

The rules (CUDA C++ Programming Guide, "Binary Compatibility" and "Application Compatibility"):
a cubin for X.y runs on a GPU X.z with z >= y and on no other major (``compat.sass_runs_on``);
one for X.ya (arch-specific) only on X.y itself. PTX for compute_XY is JIT-compiled for any GPU
of capability >= X.Y, by a driver at least as new as the CUDA release of its PTX ISA version
(gpu_kernels.json); the driver caches the result, but the first start compiles it all.

A library whose fat binaries hold under ``TRIVIAL_BYTES`` of code does not decide the verdict:
cuFFT 12 ships one empty sm_75 cubin in .nv_fatbin and loads its real kernels at run time from
a store of its own, which neither this reader nor cuobjdump sees."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from buildkit_py import compat
from buildkit_py.analysis.kernels import Arch, CodeKind, FatbinEntry, FileKernels
from buildkit_py.compat import gpu_fit
from buildkit_py.compat.gpu_fit import Coverage, gpu_spec
from buildkit_py.errors import ImageMissing
from buildkit_py.sizes import human_size
from buildkit_py.text_table import TextTable

if TYPE_CHECKING:
    from buildkit_py.analysis.saved_image import KernelScan
    from buildkit_py.engine.base import Engine

TRIVIAL_BYTES = 4096  # inflated bytes of device code below which a library's fat binaries hold no real kernels
LARGE_JIT_BYTES = 8 << 20  # PTX past this takes minutes to JIT-compile at first start


@dataclass(frozen=True)
class GpuTarget:
    name: str  # "H100", or the sm_XY given
    capability: Arch  # never arch-specific: what the GPU reports
    source: str | None = None  # where the name's capability comes from

    @property
    def label(self) -> str:
        return f"{self.name} (compute capability {self.capability.capability})"


def resolve_gpu(text: str) -> GpuTarget:
    """``H100``, ``rtx 5090``, ``sm_90``, ``sm_90a`` or ``9.0`` -> the GPU's compute capability
    (compat.gpu_fit.gpu_spec). Raises UsageError, listing the known names, for anything else."""
    spec = gpu_spec(text)
    major, minor = spec.capability.split(".")
    return GpuTarget(spec.name, Arch(int(major), int(minor)), spec.source)


def sass_runs(code: Arch, gpu: Arch) -> bool:
    return gpu_fit.sass_runs(_spelled(code), gpu.capability)


def ptx_jits(code: Arch, gpu: Arch) -> bool:
    return gpu_fit.ptx_jits(_spelled(code), gpu.capability)


def _spelled(code: Arch) -> str:
    """9.0a: the data's spelling of an architecture (compat.gpu_fit decides on it)."""
    return f"{code.capability}{'a' if code.specific else ''}"


@dataclass(frozen=True)
class PtxNeed:
    """The driver a PTX ISA version needs to be JIT-compiled."""

    ptx: str
    cuda: str | None  # the CUDA release of that PTX ISA; None: a version gpu_kernels.json does not know
    driver: str | None  # the lowest Linux driver known to run that CUDA natively; None: not published

    def describe(self) -> str:
        if self.cuda is None:
            return f"PTX ISA {self.ptx}, newer than the CUDA releases known here: needs a driver at least as new"
        driver = f"driver >= {self.driver}" if self.driver else f"a driver of CUDA {self.cuda} or newer"
        return f"PTX ISA {self.ptx} needs {driver} (CUDA {self.cuda})"


def ptx_need(ptx: str) -> PtxNeed:
    row = compat.ptx_isa_cuda(ptx)
    if row is None:
        return PtxNeed(ptx, None, None)
    # each release's floors from the one function that computes them (compat.driver_floor)
    floors = [compat.driver_floor(t.version) for t in compat.toolkits() if t.major_minor == row.cuda]
    native = [f.native for f in floors if f.native]
    if native:
        return PtxNeed(ptx, row.cuda, min(native, key=_driver_key))
    later = [t for t in compat.toolkits() if _mm_key(t.major_minor) >= _mm_key(row.cuda)]
    evidence = compat.driver_floor(later[0].version).evidence if later else None
    return PtxNeed(ptx, row.cuda, evidence.driver if evidence else None)


def _driver_key(driver: str) -> tuple[int, ...]:
    return tuple(int(p) for p in driver.split(".") if p.isdigit())


def _mm_key(mm: str) -> tuple[int, int]:
    major, minor = mm.split(".")[:2]
    return int(major), int(minor)


@dataclass(frozen=True)
class LibraryCoverage:
    path: str
    coverage: Coverage
    sass: tuple[str, ...]  # the architectures of SASS that runs on the GPU
    ptx: tuple[str, ...]  # "compute_XY (PTX ISA V)" of PTX that can be JIT-compiled for it, when no SASS runs
    archs: tuple[str, ...]  # every SASS architecture the library carries
    ptx_bytes: int  # inflated bytes of that PTX: what the first start compiles
    need: PtxNeed | None  # the newest PTX ISA among the usable PTX and the driver it needs
    decides: bool  # False: too little device code to be the library's kernels (see TRIVIAL_BYTES)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "coverage": self.coverage, "sass": list(self.sass),
                               "ptx": list(self.ptx), "archs": list(self.archs), "decides": self.decides}
        if self.need is not None:
            out |= {"ptx_bytes": self.ptx_bytes, "ptx_isa": self.need.ptx, "ptx_cuda": self.need.cuda,
                    "ptx_min_driver": self.need.driver}
        return out


def library_coverage(kernels: FileKernels, gpu: Arch) -> LibraryCoverage:
    entries = kernels.runnable
    # dict.fromkeys: family code (sm_100f) is named sm_100 as cuobjdump names it, once
    archs = tuple(dict.fromkeys(a.name for a in kernels.sass_archs()))
    decides = sum(e.inflated_size for e in entries) >= TRIVIAL_BYTES
    sass = tuple(dict.fromkeys(a.name for a in kernels.sass_archs() if sass_runs(a, gpu)))
    if sass:
        return LibraryCoverage(kernels.path, Coverage.SASS, sass, (), archs, 0, None, decides)
    usable = [e for e in entries if e.kind == CodeKind.PTX and ptx_jits(e.arch, gpu)]
    if not usable:
        return LibraryCoverage(kernels.path, Coverage.NONE, (), (), archs, 0, None, decides)
    newest = max((e.ptx_version or "0.0" for e in usable), key=_mm_key)
    ptx = tuple(sorted({f"compute_{e.arch.number}{'a' if e.arch.specific else ''} (PTX ISA {e.ptx_version})"
                        for e in usable}))
    return LibraryCoverage(kernels.path, Coverage.PTX, (), ptx, archs, _ptx_bytes(usable), ptx_need(newest), decides)


def _ptx_bytes(usable: Iterable[FatbinEntry]) -> int:
    return sum(e.inflated_size for e in usable)


@dataclass(frozen=True)
class GpuReport:
    image: str
    gpu: GpuTarget
    verdict: Coverage
    decided_by: str | None  # the library whose coverage is the verdict
    libraries: tuple[LibraryCoverage, ...]
    unreadable: tuple[tuple[str, str], ...] = field(default=())  # (path, why) of fat binaries not read

    @property
    def runs(self) -> bool:
        return self.verdict.runs

    @property
    def jit_bytes(self) -> int:
        return sum(lib.ptx_bytes for lib in self.libraries if lib.coverage == Coverage.PTX)

    def message(self) -> str:
        gpu = self.gpu.label
        if not self.libraries:
            return f"no CUDA kernels in the image: nothing it runs needs {gpu}"
        if self.verdict == Coverage.SASS:
            return f"every CUDA library carries SASS that runs on {gpu}"
        if self.verdict == Coverage.PTX:
            lib = next(x for x in self.libraries if x.path == self.decided_by)
            need = lib.need.describe() if lib.need else ""
            large = " (a large JIT: expect minutes at first start)" if self.jit_bytes > LARGE_JIT_BYTES else ""
            jit = self.jit_libraries()
            names = ", ".join(x.path.rsplit("/", 1)[-1] for x in jit)
            sass = sum(1 for x in self.libraries if x.coverage == Coverage.SASS)
            return (f"runs on {gpu}: {sass} librar{'y' if sass == 1 else 'ies'} from SASS, {len(jit)} only through "
                    f"PTX JIT ({names}): {human_size(self.jit_bytes)} of PTX compiled at first start{large}; {need}")
        return (f"no kernel for {gpu} in {self.decided_by}: it carries SASS for "
                f"{', '.join(self._lib(self.decided_by).archs) or 'nothing'} and no PTX that compiles for it")

    def jit_libraries(self) -> list[LibraryCoverage]:
        return [x for x in self.libraries if x.coverage == Coverage.PTX]

    def _lib(self, path: str | None) -> LibraryCoverage:
        return next(x for x in self.libraries if x.path == path)

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image, "gpu": self.gpu.name, "capability": self.gpu.capability.capability,
                "verdict": self.verdict, "runs": self.runs, "decided_by": self.decided_by, "message": self.message(),
                "jit_bytes": self.jit_bytes, "libraries": [x.to_json() for x in self.libraries],
                "unreadable": [{"path": p, "error": e} for p, e in self.unreadable]}


_PER_CUDA = re.compile(r"^(.*_cuda)(\d{3})(\D.*)$")  # libbitsandbytes_cuda130.so: one build per CUDA, one loaded


def loaded_alternatives(files: Iterable[FileKernels], cuda: str | None) -> list[FileKernels]:
    """Of a set of builds of one library per CUDA version side by side (bitsandbytes ships
    libbitsandbytes_cuda118.so ... _cuda132.so and loads the one of torch's CUDA), the one for
    ``cuda`` (the image's CUDA, "13.0"); every build where that is unknown or not among them."""
    files = list(files)
    if not cuda:
        return files
    major, minor = (cuda.split(".") + ["0"])[:2]
    groups: dict[str, list[FileKernels]] = {}
    for k in files:
        if m := _PER_CUDA.match(k.path):
            groups.setdefault(m[1] + m[3], []).append(k)
    drop: set[str] = set()
    for builds in groups.values():
        match = [k for k in builds if (m := _PER_CUDA.match(k.path)) and m[2] == f"{major}{minor}"]
        if match:
            drop |= {k.path for k in builds if k not in match}
    return [k for k in files if k.path not in drop]


def gpu_report(image: str, gpu: GpuTarget, files: Iterable[FileKernels],
               unreadable: Iterable[tuple[str, str]] = ()) -> GpuReport:
    libs = tuple(library_coverage(k, gpu.capability) for k in sorted(files, key=lambda k: k.path) if k.runnable)
    deciding = [x for x in libs if x.decides]
    worst = max(deciding, key=lambda x: (x.coverage.rank, x.ptx_bytes), default=None)
    if worst is None or worst.coverage == Coverage.SASS:  # every library alike: none decides
        return GpuReport(image, gpu, Coverage.SASS, None, libs, tuple(sorted(unreadable)))
    return GpuReport(image, gpu, worst.coverage, worst.path, libs, tuple(sorted(unreadable)))


def read_image_kernels(engine: Engine, image: str) -> tuple[list[FileKernels], list[tuple[str, str]]]:
    """The fat binaries of every ELF file in ``image``'s file system as a container sees it, and
    the files whose fat binaries could not be read. A local image is read as one streamed export
    of its file system (``Engine.filesystem``, as ``sbom`` reads it); one only in a registry, layer
    blob by layer blob, stacked (``saved_image.stack_kernel_scans``)."""
    import io  # noqa: PLC0415

    from buildkit_py.analysis.saved_image import IterStream, scan_kernels  # noqa: PLC0415
    from buildkit_py.errors import ImgbuildError  # noqa: PLC0415
    from buildkit_py.reference import names_registry  # noqa: PLC0415

    try:
        info = engine.image(image)
    except ImgbuildError:
        if not names_registry(image):
            raise
        info = None  # no engine here: the registry may still have it
    if info is not None:
        with engine.filesystem(info.id) as chunks:
            scan = scan_kernels(io.BufferedReader(IterStream(chunks), 1 << 20))
    elif names_registry(image):
        scan = _registry_kernels(image)
    else:
        raise ImageMissing(f"no image {image!r} in the engine",
                           hint="build or pull it, or name it with its registry to read it from there")
    return list(scan.kernels.values()), sorted(scan.errors.items())


def _registry_kernels(image: str) -> KernelScan:
    from buildkit_py import oci  # noqa: PLC0415
    from buildkit_py.analysis.saved_image import scan_kernels, stack_kernel_scans  # noqa: PLC0415
    from buildkit_py.analysis.sbom import layer_blob  # noqa: PLC0415
    from buildkit_py.errors import ManifestNotFound  # noqa: PLC0415

    ref = oci.parse_reference(image)
    client = oci.Client()
    try:
        manifest = oci.read_manifest(ref, client=client)
    except ManifestNotFound as exc:
        raise ImageMissing(f"no image {image}: {exc.message}", hint="check the name and tag") from None
    scans = []
    for desc in manifest.layers:
        with layer_blob(ref, desc, client) as tar:
            scans.append(scan_kernels(tar))
    return stack_kernel_scans(scans)


# ---------------------------------------------------------------- what inspect --kernels shows


@dataclass(frozen=True)
class KernelCoverage:
    """Architectures x libraries: the bytes of SASS each library stores per architecture (what
    a narrower cuda_arch would save) and its PTX."""

    archs: tuple[str, ...]  # every SASS architecture in the image, oldest first
    libraries: tuple[tuple[str, dict[str, int], tuple[str, ...]], ...]  # (path, arch -> bytes, PTX)

    def sass_bytes(self) -> dict[str, int]:
        return {a: sum(b.get(a, 0) for _, b, _ in self.libraries) for a in self.archs}

    def to_json(self) -> dict[str, Any]:
        return {"archs": list(self.archs), "sass_bytes": self.sass_bytes(),
                "libraries": [{"path": p, "sass_bytes": b, "ptx": list(x)} for p, b, x in self.libraries]}


def kernel_coverage(files: Iterable[FileKernels]) -> KernelCoverage:
    libraries = []
    archs: dict[str, Arch] = {}
    for k in sorted(files, key=lambda k: k.path):
        if not k.runnable:
            continue
        by_name: dict[str, int] = {}
        for arch, n in k.sass_bytes().items():
            by_name[arch.name] = by_name.get(arch.name, 0) + n
            archs.setdefault(arch.name, Arch(arch.major, arch.minor, arch.specific))
        ptx = tuple(f"compute_{a.number}{'a' if a.specific else ''} ({v})" for a, v in k.ptx())
        libraries.append((k.path, by_name, ptx))
    return KernelCoverage(tuple(sorted(archs, key=lambda n: archs[n])), tuple(libraries))


def coverage_table(cov: KernelCoverage) -> TextTable:
    """The table inspect --kernels prints: one row per library, one column per architecture."""
    rows = [(p.rsplit("/", 1)[-1], *(human_size(b[a]) if a in b else "-" for a in cov.archs), ", ".join(x) or "-")
            for p, b, x in cov.libraries]
    total = cov.sass_bytes()
    rows.append(("all libraries", *(human_size(total[a]) for a in cov.archs), ""))
    return TextTable("CUDA kernels (bytes of SASS per architecture)", ("library", *cov.archs, "ptx"), tuple(rows),
                     right=frozenset(cov.archs))
