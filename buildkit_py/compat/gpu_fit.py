"""Before building: does what a recipe installs carry kernels for a GPU? Per package (torch, the
nvidia-* CUDA libraries, flash-attn, bitsandbytes), from the kernels recorded for its prebuilt
wheel (wheel_kernels.json) or, for what the compile stage builds, from the targets its build
compiles. The same rules decide as for an image's files (analysis.gpu_coverage, which calls
these): SASS for X.y runs on X.z with z >= y (``sass_runs_on``), arch-specific X.ya only on X.y;
PTX for compute_XY is JIT-compiled by the driver for any GPU of capability >= X.Y.

A package whose wheel the data has no row for is "unknown": the answer is partial, and never a
refusal."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from packaging.version import InvalidVersion, Version

from buildkit_py.compat import codes, flash_attn, gpu_kernels, tables
from buildkit_py.compat.codes import RecipeWarning
from buildkit_py.compat.gpu_kernels import WheelLibrary
from buildkit_py.compat.tables import arch_base, arch_key, sass_runs_on
from buildkit_py.errors import CompatibilityError, CompatibilityErrors, RecipeLocation, UsageError
from buildkit_py.recipe.model import pin_name
from buildkit_py.text_enum import TextEnum
from buildkit_py.versions import major_minor

if TYPE_CHECKING:
    from buildkit_py.compat.resolve import Resolution
    from buildkit_py.recipe.model import Recipe


class Coverage(TextEnum):
    """How a GPU gets a library's kernels, best first."""

    SASS = "sass"  # machine code for this GPU: runs as it is
    PTX = "ptx-jit"  # only PTX: the driver compiles it at first use
    NONE = "no-kernel"  # "no kernel image is available for execution on the device"

    @property
    def runs(self) -> bool:
        return self is not Coverage.NONE

    @property
    def rank(self) -> int:
        return {Coverage.SASS: 0, Coverage.PTX: 1, Coverage.NONE: 2}[self]


def sass_runs(code: str, capability: str) -> bool:
    """SASS for ``code`` ("9.0", "9.0a") on a GPU of ``capability`` ("9.0")."""
    if code.endswith("a"):
        return arch_key(arch_base(code))[:2] == arch_key(capability)[:2]
    return sass_runs_on(code, capability)


def ptx_jits(code: str, capability: str) -> bool:
    """PTX for virtual architecture ``code`` JIT-compiled for a GPU of ``capability``."""
    if code.endswith("a"):
        return arch_key(arch_base(code))[:2] == arch_key(capability)[:2]
    return arch_key(arch_base(code))[:2] <= arch_key(capability)[:2]


@dataclass(frozen=True)
class GpuSpec:
    name: str  # "H100", or the sm_XY given
    capability: str  # "9.0": what the GPU reports, never arch-specific
    source: str | None = None  # where the name's capability comes from

    @property
    def label(self) -> str:
        return f"{self.name} (compute capability {self.capability})"


_SM = re.compile(r"(?:sm_?)?(\d{1,2})(\d)[af]?|(\d{1,2})\.(\d)", re.IGNORECASE)


def gpu_spec(text: str) -> GpuSpec:
    """``H100``, ``rtx 5090``, ``sm_90``, ``sm_90a`` or ``9.0`` -> the GPU's compute capability
    (gpu_kernels.json). Raises UsageError, listing the known names, for anything else."""
    spec = text.strip()
    m = _SM.fullmatch(spec)
    if m and (spec.lower().startswith("sm") or "." in spec):
        major, minor = (m[1], m[2]) if m[1] else (m[3], m[4])
        return GpuSpec(f"sm_{major}{minor}", f"{int(major)}.{minor}")
    gpu = gpu_kernels.gpu_named(spec)
    if gpu is None:
        known = ", ".join(g.name for g in gpu_kernels.gpus())
        raise UsageError(f"unknown GPU {text!r}", hint=f"give one of {known}, or its compute capability as sm_XY")
    return GpuSpec(gpu.name, gpu.capability, gpu.source)


def library_fit(lib: WheelLibrary, capability: str) -> tuple[Coverage, tuple[str, ...]]:
    """The library's coverage of a GPU and what gives it (the SASS that runs, else the PTX)."""
    sass = tuple(a for a in lib.sass if sass_runs(a, capability))
    if sass:
        return Coverage.SASS, sass
    ptx = tuple(a for a in lib.ptx if ptx_jits(a, capability))
    return (Coverage.PTX, ptx) if ptx else (Coverage.NONE, ())


@dataclass(frozen=True)
class PackageKernels:
    """The kernels one package of a recipe brings: its prebuilt wheel's recorded libraries, or
    what its source build compiles; ``libraries`` None where the data has no row (unknown)."""

    package: str
    version: str
    variant: str  # the wheel's CUDA build (cu130), "" for a wheel with one build
    libraries: tuple[WheelLibrary, ...] | None
    source: str | None
    compiled: bool = False  # built in the compile stage, not a prebuilt wheel
    nvcc: str | None = None  # the CUDA whose nvcc compiles it, where that decides (flash-attn)

    @property
    def label(self) -> str:
        return f"{self.package} {self.version}" + (f" ({self.variant})" if self.variant else "")


@dataclass(frozen=True)
class PackageFit:
    kernels: PackageKernels
    coverage: Coverage | None  # None: unknown (no recorded kernels)
    library: str | None = None  # the library whose coverage is the package's (the worst)
    archs: tuple[str, ...] = ()  # that library's SASS
    using: tuple[str, ...] = ()  # the SASS that runs, or the PTX that JIT-compiles
    hint: str | None = None

    def describe(self, gpu: GpuSpec) -> str:
        return f"{self.kernels.label}: {self.reason(gpu)}"

    def reason(self, gpu: GpuSpec) -> str:
        k = self.kernels
        if self.coverage is None:
            return "unknown (imgbuild's data records no kernels for this wheel)"
        if self.coverage == Coverage.SASS:
            return f"SASS {', '.join(self.using) or '(no CUDA code)'} runs on {gpu.label}"
        where = f" in {self.library}" if self.library and len(k.libraries or ()) > 1 else ""
        if self.coverage == Coverage.PTX:
            return (f"no SASS for {gpu.name}{where}; the driver JIT-compiles its PTX for compute "
                    f"{', '.join(self.using)} at first start")
        how = "is compiled here for" if k.compiled else "carries"
        return f"no kernel for {gpu.name}{where}: it {how} SASS {', '.join(self.archs) or 'none'} and no PTX for it"

    def to_json(self, gpu: GpuSpec) -> dict[str, Any]:
        k = self.kernels
        return {"package": k.package, "version": k.version, "variant": k.variant, "compiled": k.compiled,
                "coverage": str(self.coverage) if self.coverage else "unknown", "library": self.library,
                "archs": list(self.archs), "using": list(self.using), "source": k.source, "hint": self.hint,
                "message": self.describe(gpu)}


def package_fit(kernels: PackageKernels, gpu: GpuSpec) -> PackageFit:
    if kernels.libraries is None:
        return PackageFit(kernels, None)
    fits = [(lib, *library_fit(lib, gpu.capability)) for lib in kernels.libraries if lib.decides]
    if not fits:  # no CUDA code that decides (the CUDA runtime): nothing for the GPU to lack
        return PackageFit(kernels, Coverage.SASS)
    lib, coverage, using = max(fits, key=lambda f: f[1].rank)
    return PackageFit(kernels, coverage, lib.path, lib.sass, using)


def runs_on(kernels: PackageKernels, gpu: GpuSpec) -> bool:
    cov = package_fit(kernels, gpu).coverage
    return cov is not None and cov.runs


@dataclass(frozen=True)
class GpuFit:
    """Every package's coverage of one GPU; the verdict is the worst known one."""

    gpu: GpuSpec
    packages: tuple[PackageFit, ...]

    @property
    def verdict(self) -> Coverage:
        known = [p.coverage for p in self.packages if p.coverage is not None]
        return max(known, key=lambda c: c.rank, default=Coverage.SASS)

    @property
    def partial(self) -> bool:
        return any(p.coverage is None for p in self.packages)

    @property
    def deciding(self) -> PackageFit | None:
        worst = [p for p in self.packages if p.coverage == self.verdict]
        return worst[0] if worst and self.verdict != Coverage.SASS else None

    def message(self) -> str:
        unknown = [p.kernels.label for p in self.packages if p.coverage is None]
        tail = f"; {len(unknown)} package(s) with no recorded kernels: unknown" if unknown else ""
        if self.deciding is not None:
            return self.deciding.describe(self.gpu) + tail
        if not self.packages:
            return f"nothing it installs carries CUDA kernels: nothing to check for {self.gpu.label}"
        known = len(self.packages) - len(unknown)
        return f"{known} package(s) carry SASS that runs on {self.gpu.label}{tail}"

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu.name, "capability": self.gpu.capability, "verdict": str(self.verdict),
                "runs": self.verdict.runs, "partial": self.partial,
                "decided_by": self.deciding.kernels.package if self.deciding else None, "message": self.message(),
                "packages": [p.to_json(self.gpu) for p in self.packages]}


def gpu_fit(gpu: GpuSpec, packages: Iterable[PackageKernels]) -> GpuFit:
    """Each package's coverage of ``gpu``, with a hint on each that has no kernel for it."""
    fits = []
    for k in packages:
        fit = package_fit(k, gpu)
        if fit.coverage == Coverage.NONE:
            fit = PackageFit(fit.kernels, fit.coverage, fit.library, fit.archs, fit.using, nearest_hint(k, gpu))
        fits.append(fit)
    return GpuFit(gpu, tuple(fits))


# --------------------------------------------------------------------------- hints


def _distance(a: str, b: str) -> tuple[int, int]:
    """How far release ``a`` is from ``b``: by major.minor, the newer one first on a tie."""
    try:
        va, vb = Version(a), Version(b)
    except InvalidVersion:
        return (1 << 30, 0)
    return abs((va.major * 1000 + va.minor) - (vb.major * 1000 + vb.minor)), 0 if va >= vb else 1


def nearest_hint(kernels: PackageKernels, gpu: GpuSpec) -> str | None:
    """The nearest recorded build of the package that runs on ``gpu``: another CUDA variant of
    the same release first, else the nearest release (of the same variant where there is one)."""
    if kernels.package == "flash-attn":
        return _flash_attn_hint(kernels, gpu)
    rows = [r for r in gpu_kernels.wheel_kernel_rows(kernels.package)
            if runs_on(PackageKernels(r.package, r.version, r.variant, r.libraries, r.source), gpu)]
    if kernels.package == "bitsandbytes":  # its library follows torch's CUDA: a release with that build
        rows = [r for r in rows if r.variant == kernels.variant] or rows
    same = [r for r in rows if r.version == kernels.version]
    if same:
        return (f"{kernels.package} {kernels.version}'s {same[0].variant} build runs on {gpu.label}: "
                f"use that CUDA variant")
    if not rows:
        return f"no {kernels.package} build imgbuild's data records runs on {gpu.label}"
    best = min(rows, key=lambda r: (_distance(r.version, kernels.version), -_as_number(r.version),
                                    r.variant != kernels.variant, -int(r.variant[2:] or 0)))
    variant = f" ({best.variant})" if best.variant else ""
    return (f"the nearest {kernels.package} release imgbuild's data records with a kernel for {gpu.label} is "
            f"{best.version}{variant}")


# --------------------------------------------------------------------------- what a recipe installs


def recipe_kernels(recipe: Recipe, res: Resolution) -> tuple[PackageKernels, ...]:
    """The packages of a resolved recipe that carry CUDA kernels: torch (its CUDA variant), the
    nvidia-* wheels torch's index build, the flavor and the recipe's pins bring, flash-attn (its release wheel, or
    what the compile stage builds) and bitsandbytes (its library for torch's CUDA)."""
    out: list[PackageKernels] = []
    if res.torch:
        out.append(_recorded("torch", res.torch, res.torch_variant or ""))
    nvidia = _nvidia_pins(res) | {n: v for n, v in _pins(recipe) if n.startswith("nvidia-")}
    out += [_recorded(name, version) for name, version in sorted(nvidia.items())]
    for name, version in _pins(recipe):
        if name == "flash-attn":
            out.append(_flash_attn(version, res))
        elif name == "bitsandbytes":
            variant = res.torch_variant or "cu" + res.cuda_major_minor.replace(".", "")
            out.append(_recorded(name, version, variant))
    return tuple(out)


def _pins(recipe: Recipe) -> list[tuple[str, str]]:
    return [(pin_name(spec), spec.split("==", 1)[1]) for spec in recipe.pip if "==" in spec]


def _recorded(package: str, version: str, variant: str = "") -> PackageKernels:
    row = gpu_kernels.wheel_kernels(package, version, variant)
    if row is None:
        return PackageKernels(package, version, variant, None, None)
    return PackageKernels(package, version, variant, row.libraries, row.source)


def _nvidia_pins(res: Resolution) -> dict[str, str]:
    """name -> version of the nvidia-* wheels the image installs: those pip resolves for torch's
    index build (torch_cuda_pins.json; other variants' pins are not recorded) and the flavor's."""
    from buildkit_py.compat.torch_pins import torch_cuda_pins  # noqa: PLC0415  # it reads tables too

    pins: dict[str, str] = {}
    row = torch_cuda_pins(res.torch) if res.torch else None
    if row is not None and row.variant == res.torch_variant:
        pins |= {w.name: w.version for w in row.cuda_wheels}
    pins |= {pin_name(p): p.split("==", 1)[1] for p in res.cuda_wheels if "==" in p}
    return {n: v for n, v in pins.items() if n.startswith("nvidia-")}


def _flash_attn(version: str, res: Resolution) -> PackageKernels:
    """flash-attn's kernels follow from its setup.py's gencode list (flash_attn.json): what the
    nvcc of its release wheel's build compiled, or, built here, what the build's nvcc compiles
    of what FLASH_ATTN_CUDA_ARCHS asks for (every gencode where the build does not set it)."""
    from buildkit_py.compat.torch_rule import torch_cxx11_abi  # noqa: PLC0415  # rules imports this module's callers

    try:
        rel = flash_attn.flash_attn_release(version)
    except LookupError:
        return PackageKernels("flash-attn", version, "", None, None, nvcc=res.cuda_version)
    compiled = "flash-attn" in res.compile
    if compiled:
        sms = rel.sms(res.cuda_version)
        wanted = dict(res.build_env).get(flash_attn.flash_attn_arch_env())
        if wanted is not None:
            sms = tuple(sm for sm in sms if sm.replace(".", "") in wanted.split(";"))
        source = f"flash_attn.json gencode of {version}, compiled by nvcc {res.cuda_version}"
        return PackageKernels("flash-attn", version, "", (WheelLibrary("flash_attn_2_cuda", sms, ()),), source,
                              compiled=True, nvcc=res.cuda_version)
    wheel = flash_attn.flash_attn_prebuilt(version, res.cuda_major_minor, major_minor(res.torch or ""), res.python,
                                       archs=tuple(arch_base(a) for a in res.cuda_arch),
                                       cxx11abi=torch_cxx11_abi(res.torch) if res.torch else None)
    if wheel is None:
        return PackageKernels("flash-attn", version, "", None, None)
    source = f"flash_attn.json gencode of {version}, its release wheel built by nvcc {wheel.build_cuda}"
    return PackageKernels("flash-attn", version, f"cu{wheel.cuda.replace('.', '')}",
                          (WheelLibrary("flash_attn_2_cuda", rel.sms(wheel.build_cuda), ()),), source,
                          nvcc=res.cuda_version)


def _flash_attn_hint(kernels: PackageKernels, gpu: GpuSpec) -> str:
    """The nearest flash-attn release whose gencode list has SASS for ``gpu`` with the recipe's
    nvcc, else the nvcc the nearest one needs for it."""
    nvcc = kernels.nvcc or "0"
    runs = [r for r in flash_attn.flash_attn_releases() if not r.partial
            and any(sass_runs(sm, gpu.capability) for sm in r.sms(nvcc))]
    if runs:
        best = min(runs, key=lambda r: (_distance(r.version, kernels.version), -_as_number(r.version)))
        return (f"flash-attn {best.version} compiles SASS for {gpu.label} with nvcc {nvcc}: pin it "
                "(built from source where no release wheel has it)")
    needs = [(r, str(spec)) for r in flash_attn.flash_attn_releases() if not r.partial for sm, spec in r.gencode
             if sass_runs(sm, gpu.capability)]
    if needs:
        best, spec = min(needs, key=lambda n: (_distance(n[0].version, kernels.version), -_as_number(n[0].version)))
        return f"flash-attn {best.version} compiles SASS for {gpu.label} with nvcc {spec}: pin it with that CUDA"
    return f"no flash-attn release imgbuild knows compiles SASS for {gpu.label}"


def _as_number(version: str) -> float:
    try:
        v = Version(version)
    except InvalidVersion:
        return 0.0
    return v.major * 1e6 + v.minor * 1e3 + v.micro




# --------------------------------------------------------------------------- the plan-time rule


def gpus_rule(recipe: Recipe, res: Resolution,
              gpus: Sequence[tuple[str, str]] | None = None) -> tuple[tuple[GpuFit, ...], tuple[RecipeWarning, ...]]:
    """Each target GPU (``(key, name)``: the recipe's ``gpus[i]``, or ``--gpu``) against what the
    recipe installs. A package with no kernel that runs on one is refused, every such problem at
    once (CompatibilityErrors), before anything is built; PTX only is a warning, and a package the
    data has no row for is a warning (unknown), never a refusal."""
    targets = [(f"gpus[{i}]", g) for i, g in enumerate(recipe.gpus)] if gpus is None else list(gpus)
    packages = recipe_kernels(recipe, res)
    problems: list[CompatibilityError] = []
    fits: list[GpuFit] = []
    warnings: list[RecipeWarning] = []
    for key, text in targets:
        at = RecipeLocation(str(recipe.path), recipe.line_of(key) if key.startswith("gpus") else None, key)
        try:
            gpu = gpu_spec(text)
        except UsageError as exc:
            problems.append(CompatibilityError("gpu", text, "imgbuild's GPU list", tables.data_as_of(),
                                               "an unknown GPU name", hint=exc.hint, at=at))
            continue
        fit = gpu_fit(gpu, packages)
        fits.append(fit)
        for p in fit.packages:
            k = p.kernels
            if p.coverage == Coverage.NONE:
                problems.append(CompatibilityError(
                    k.package, k.version + (f" ({k.variant})" if k.variant else ""), "gpu", gpu.label,
                    p.reason(gpu), hint=p.hint, at=at))
            elif p.coverage == Coverage.PTX:
                warnings.append(RecipeWarning(codes.GPU_PTX_JIT, key, p.describe(gpu)))
    for k in {p.kernels.label: p.kernels for f in fits for p in f.packages if p.coverage is None}.values():
        warnings.append(RecipeWarning(codes.GPU_KERNELS_UNKNOWN, targets[0][0] if targets else None,
                                      f"{k.label}: no recorded kernels; whether it runs on "
                                      f"{', '.join(f.gpu.name for f in fits)} is unknown",
                                      hint="scripts/wheel_kernels.py reads them from the wheel"))
    if problems:
        raise problems[0] if len(problems) == 1 else CompatibilityErrors(problems)
    return tuple(fits), tuple(warnings)
