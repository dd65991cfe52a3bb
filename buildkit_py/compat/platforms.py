"""Per-architecture compatibility: which pins of a resolved recipe exist for each platform it
builds (linux/amd64, linux/arm64), from data/platforms.json (the package index's own file
lists and wheel METADATA, written by scripts/arch_wheels.py).

The rest of the compatibility data describes the x86_64 wheels and images; this rule checks what
differs on another architecture, after the recipe resolved: the CUDA wheels of the flavor's
tier, torch's aarch64 wheel (a CUDA build, and of which CUDA, or CPU only), bitsandbytes and
flash-attn wheels, and the platforms a looked-up base's index carries. Every problem of every
platform is raised at once, each at the recipe key that pins it, with the newest release that fits.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from packaging.utils import canonicalize_name
from packaging.version import Version

from buildkit_py.compat import tables
from buildkit_py.compat.bases import BaseFacts
from buildkit_py.errors import CompatDataError, CompatibilityError, CompatibilityErrors, RecipeLocation
from buildkit_py.recipe.model import DEFAULT_PLATFORMS, PLATFORMS, CudaSource, Recipe, pin_name
from buildkit_py.versions import major_minor

FILE = "platforms.json"
SUPPORTED = PLATFORMS  # what recipes may name (the recipe schema's enum); the data must cover each


@dataclass(frozen=True)
class Platform:
    name: str          # linux/arm64
    wheel_arch: str    # aarch64: the wheel tag's machine
    nvidia_arch: str   # sbsa: NVIDIA's name (NVARCH, apt repository path)
    debian_arch: str   # arm64


@dataclass(frozen=True)
class TorchBuild:
    version: str
    cuda: str | None   # the CUDA major.minor the index's aarch64 wheel is built for; None: a CPU build
    wheel: str | None  # None: no aarch64 wheel at all
    source: str


@dataclass(frozen=True)
class PlatformData:
    platforms: dict[str, Platform]
    wheels: dict[str, dict[str, frozenset[str]]]  # package -> wheel arch -> releases with a wheel
    torch: dict[str, TorchBuild]
    as_of: str


@dataclass(frozen=True)
class PinFiles:
    """What the package index serves of one pinned distribution (read at plan time by
    pipeline.lookups for a pin platforms.json has no row for): for each release, the machines its
    Linux wheels are built for ("x86_64", "aarch64"; "any" for a pure-Python wheel) and whether an
    sdist is there to build from."""
    name: str  # canonical
    releases: tuple[tuple[str, frozenset[str], bool], ...]  # (version, machines, has an sdist), ascending
    source: str  # the index it was read from

    def of(self, version: str) -> tuple[frozenset[str], bool] | None:
        for v, machines, sdist in self.releases:
            if Version(v) == Version(version):
                return machines, sdist
        return None

    def nearest_with(self, version: str, machine: str) -> str | None:
        """The release nearest ``version`` (newest on a tie) with a wheel for ``machine`` or a pure one."""
        fits = [v for v, machines, _ in self.releases if machine in machines or "any" in machines]
        if not fits:
            return None
        return tables.nearest_versions(version, fits, n=1)[0]


@functools.cache
def data() -> PlatformData:
    raw = tables.load_raw(FILE)
    platforms = {name: Platform(name, p["wheel_arch"], p["nvidia_arch"], p["debian_arch"])
                 for name, p in raw["platforms"].items()}
    if set(platforms) != set(SUPPORTED):
        raise CompatDataError(f"compat data {FILE}: platforms {sorted(platforms)} are not {sorted(SUPPORTED)}")
    wheels = {name: {arch: frozenset(row.get(arch, ())) for arch in ("x86_64", "aarch64")}
              for name, row in raw["wheels"].items()}
    torch = {}
    for row in raw["torch"]:
        build = row.get("aarch64") or {}
        torch[row["version"]] = TorchBuild(row["version"], build.get("cuda"), build.get("wheel"), row["source"])
    return PlatformData(platforms, wheels, torch, raw["as_of"])



def platform(name: str) -> Platform:
    return data().platforms[name]


def has_wheel(package: str, version: str, arch: str) -> bool | None:
    """Does ``package==version`` have a Linux wheel for ``arch``? None: the data does not cover it."""
    releases = data().wheels.get(package)
    if releases is None:
        return None
    return any(Version(v) == Version(version) for v in releases.get(arch, ()))


def pin_available(pin: str, arch: str) -> bool | None:
    """``has_wheel`` of a ``name==version`` pin."""
    name, _, version = pin.partition("==")
    return has_wheel(name, version, arch)


def torch_build(version: str) -> TorchBuild | None:
    return data().torch.get(version.split("+", 1)[0])


# ----------------------------------------------------------------------------- the rule
def platforms_rule(recipe: Recipe, *, cuda: str, cuda_wheels: tuple[str, ...], torch: str | None,
                   torch_cuda: str | None, compile_: tuple[str, ...], python: str,
                   base: BaseFacts | None) -> None:
    """Refuse, for each platform of ``recipe.platforms`` other than linux/amd64 (the one the rest
    of the data describes), every pin that has no build for it; ``torch_cuda``: the CUDA
    major.minor of the torch variant the recipe resolved to."""
    problems: list[CompatibilityError] = []
    base_platforms = base.platforms if base is not None else ()
    for name in recipe.platforms:
        if base_platforms and not any(bp == name or bp.startswith(name + "/") for bp in base_platforms):
            problems.append(_fail(recipe, "base.image", "base.image", base.ref if base else "", name,
                                  f"the base image's index has no {name} manifest (it has {', '.join(base_platforms)})",
                                  hint=f"push a {name} image of the base under the same tag (an index of both), "
                                       f"or leave {name} out of platforms"))
        if name == "linux/amd64":
            continue
        p = platform(name)
        if recipe.cuda.source == CudaSource.NVIDIA and not base_platforms:
            # NVIDIA's tags are not looked up (Docker Hub is not asked), and images.json records amd64 only
            problems.append(_fail(recipe, "cuda.source", "cuda.source", "nvidia", name,
                                  f"imgbuild's data does not record which nvidia/cuda tags carry a {name} "
                                  f"({p.nvidia_arch}) image, and this base's index is not read",
                                  hint="use cuda.source: wheels, or mirror the tag into your registry "
                                       "(imgbuild mirror IMAGE --to-mirror R/mirror, base.mirror: R/mirror) so its "
                                       "index is read and checked", partial=True))
        problems += _cuda_wheel_problems(recipe, p, cuda, cuda_wheels)
        if torch:
            problems += _torch_problems(recipe, p, torch, torch_cuda)
        problems += _pip_problems(recipe, p, cuda, python, torch, compile_)
    if problems:
        raise problems[0] if len(problems) == 1 else CompatibilityErrors(problems)


def _fail(recipe: Recipe, key: str, component: str, version: str, name: str, reason: str, *,
          hint: str | None, partial: bool = False) -> CompatibilityError:
    return CompatibilityError(component, version, "platform", name, reason, hint=hint, partial=partial,
                              at=RecipeLocation(str(recipe.path), recipe.line_of(key), key))


def _cuda_wheel_problems(recipe: Recipe, p: Platform, cuda: str, pins: tuple[str, ...]) -> list[CompatibilityError]:
    missing = [pin for pin in pins if pin_available(pin, p.wheel_arch) is False]
    if not missing:
        return []
    flavor = recipe.cuda.flavor
    key = "cuda.flavor" if flavor != "base" and _fits(tables.cuda_wheel_set(cuda), "base", p) else "cuda.version"
    return [_fail(recipe, key, "cuda", cuda, p.name,
                  f"the {flavor} tier's wheel{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                  f"{'have' if len(missing) > 1 else 'has'} no Linux {p.wheel_arch} build on the package index",
                  hint=_cuda_hint(cuda, flavor, p))]


def _fits(ws: tables.WheelSet, flavor: str, p: Platform) -> bool:
    try:
        extras = tables.tier_extras(flavor, ws.toolkit)
    except LookupError:
        return False
    pins = ws.pins(*extras)
    if flavor != "base":
        pins += (tables.nccl_pin(ws.toolkit),)
    return all(pin_available(pin, p.wheel_arch) is not False for pin in pins)


def _cuda_hint(cuda: str, flavor: str, p: Platform) -> str:
    """The newest CUDA release whose wheels of this flavor all exist for the platform (the same
    major first), else the flavor that fits this CUDA."""
    sets = [ws for t in tables.toolkits() for ws in tables.cuda_wheel_sets(t.version)]
    fitting = sorted({ws.toolkit for ws in sets if _fits(ws, flavor, p)}, key=Version)
    same_major = [t for t in fitting if t.split(".", maxsplit=1)[0] == cuda.split(".", maxsplit=1)[0]]
    hint = ""
    if same_major or fitting:
        newest = (same_major or fitting)[-1]
        hint = f"cuda.version \"{major_minor(newest)}\" is the newest with {flavor} wheels for {p.name}"
    if flavor != "base" and _fits(tables.cuda_wheel_set(cuda), "base", p):
        hint += ("; or " if hint else "") + f"cuda.flavor: base (cudart only) has {p.wheel_arch} wheels for CUDA {cuda}"
    return hint or f"leave {p.name} out of platforms"


def _torch_problems(recipe: Recipe, p: Platform, torch: str, torch_cuda: str | None) -> list[CompatibilityError]:
    build = torch_build(torch)
    with_cuda = sorted((b.version for b in data().torch.values() if b.cuda), key=Version)
    newest = f"torch {with_cuda[-1]} (CUDA {data().torch[with_cuda[-1]].cuda})" if with_cuda else ""
    hint = f"the newest torch whose {p.wheel_arch} wheel on the index is a CUDA build is {newest}" if newest \
        else f"leave {p.name} out of platforms"
    if build is None:
        return [_fail(recipe, "torch", "torch", torch, p.name, f"imgbuild's {FILE} does not record torch {torch}",
                      hint=hint, partial=True)]
    if build.wheel is None:
        return [_fail(recipe, "torch", "torch", torch, p.name, f"the index has no Linux {p.wheel_arch} wheel of it",
                      hint=hint)]
    if build.cuda is None:
        # PyTorch's own per-CUDA index (not read here) may hold an sbsa CUDA build: unknown, not "no"
        return [_fail(recipe, "torch", "torch", torch, p.name,
                      f"its {p.wheel_arch} wheel on the package index is a CPU build (no CUDA); PyTorch's own "
                      f"per-CUDA index is not recorded", hint=hint, partial=True)]
    if torch_cuda and build.cuda != torch_cuda:
        return [_fail(recipe, "torch", "torch", torch, p.name,
                      f"its {p.wheel_arch} wheel is a CUDA {build.cuda} build, the recipe resolved CUDA {torch_cuda}",
                      hint=f"cuda.version \"{build.cuda}\" for torch {torch} on {p.name}; {hint}")]
    return []


def _pip_problems(recipe: Recipe, p: Platform, cuda: str, python: str, torch: str | None,
                  compile_: tuple[str, ...]) -> list[CompatibilityError]:
    out = []
    for i, spec in enumerate(recipe.pip):
        name = pin_name(spec)
        version = spec.split("==", 1)[1] if "==" in spec else ""
        if name == "flash-attn":
            out.append(_fail(
                recipe, f"pip[{i}]", name, version, p.name,
                f"no flash-attn release has a Linux {p.wheel_arch} wheel (the release wheels are linux_x86_64, "
                f"the package index has sdists only) and imgbuild does not compile it under emulation",
                hint=f"leave {p.name} out of platforms for a flash-attn image"))
        elif name == "bitsandbytes" and version and has_wheel(name, version, p.wheel_arch) is False:
            arm = data().wheels[name][p.wheel_arch]
            from buildkit_py.compat import bitsandbytes_rule  # noqa: PLC0415 - its rules import this module's callers

            fits = [v for v in bitsandbytes_rule.bnb_fits(cuda, python, torch) if v in arm]
            hint = (f"use bitsandbytes=={fits[-1]} (the newest with a Linux {p.wheel_arch} wheel that fits CUDA "
                    f"{major_minor(cuda)})") if fits else f"leave {p.name} out of platforms"
            out.append(_fail(recipe, f"pip[{i}]", name, version, p.name,
                             f"the index has no Linux {p.wheel_arch} wheel of it", hint=hint))
    for name in compile_:
        if name != "flash-attn" and name in {pin_name(s) for s in recipe.pip}:
            i = [pin_name(s) for s in recipe.pip].index(name)
            out.append(_fail(recipe, f"pip[{i}]", name, recipe.pip[i].split("==", 1)[-1], p.name,
                             "build.from_source compiles CUDA code, which imgbuild does not do under emulation",
                             hint=f"leave {p.name} out of platforms, or install a released wheel"))
    return out


def untabled_pins_rule(recipe: Recipe, compile_: tuple[str, ...], pin_files: tuple[PinFiles, ...]) -> None:
    """For each platform of the recipe but linux/amd64, the pins platforms.json has no row for (the
    rest of platforms_rule's), judged by the files the index serves of them."""
    problems = [e for name in recipe.platforms if name != "linux/amd64"
                for e in _untabled_pin_problems(recipe, platform(name), compile_, pin_files)]
    if problems:
        raise problems[0] if len(problems) == 1 else CompatibilityErrors(problems)


def _untabled_pin_problems(recipe: Recipe, p: Platform, compile_: tuple[str, ...],
                           pin_files: tuple[PinFiles, ...]) -> list[CompatibilityError]:
    """A pin platforms.json has no row for, judged by the files the index serves of it (read at plan
    time by pipeline.lookups): no wheel for the platform's machine, no pure wheel and no sdist is a build
    that fails under emulation (triton 2.3.1: x86_64 wheels only). A pin that was not read (--offline,
    or the index did not answer) is not judged here; the look-up says so as it happens."""
    files = {f.name: f for f in pin_files}
    out = []
    for i, spec in enumerate(recipe.pip):
        name = canonicalize_name(pin_name(spec))
        read = files.get(name)
        if "==" not in spec or read is None or not untabled(name) or name in compile_:
            continue
        version = spec.split("==", 1)[1].strip()
        nearest = read.nearest_with(version, p.wheel_arch)
        use = f"use {name}=={nearest} (the nearest release with a Linux {p.wheel_arch} wheel)" if nearest else None
        got = read.of(version)
        if got is None:
            out.append(_fail(recipe, f"pip[{i}]", name, version, p.name,
                             f"the package index ({read.source}) lists no {name} {version}",
                             hint=use or f"check the {name} pin"))
            continue
        machines, sdist = got
        if p.wheel_arch in machines or "any" in machines or sdist:
            continue
        out.append(_fail(recipe, f"pip[{i}]", name, version, p.name,
                         f"the package index has Linux wheels of {name} {version} for "
                         f"{', '.join(sorted(machines)) or 'no machine'} only and no sdist to build for {p.wheel_arch}",
                         hint=use or f"leave {p.name} out of platforms"))
    return out


def untabled(name: str) -> bool:
    """Is pin ``name`` one whose platforms the data does not record (flash-attn has a rule of its own)?"""
    name = canonicalize_name(name)
    return name not in data().wheels and name != "flash-attn"


__all__ = ["DEFAULT_PLATFORMS", "SUPPORTED", "PinFiles", "Platform", "PlatformData", "TorchBuild", "data", "has_wheel",
           "platform", "platforms_rule", "torch_build", "untabled", "untabled_pins_rule"]
