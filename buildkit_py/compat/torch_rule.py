"""The torch rule (the 4th of ``rules``): the torch build for the CUDA and Python, and where it comes
from; a torch pin against the releases the data knows (or the look-up found); the data it reads is
compat/torch_data.py."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from buildkit_py import compat
from buildkit_py.compat import codes
from buildkit_py.compat.codes import RecipeWarning
from buildkit_py.compat.rules import (
    OS_PYTHON,
    PYTHON_IMAGE,
    LookedUp,
    Warnings,
    detect_os,
    nvidia_image_os,
    refusal_at,
)
from buildkit_py.compat.torch_data import TorchRelease
from buildkit_py.errors import CompatibilityError
from buildkit_py.recipe.model import CudaFlavor, CudaSource, Recipe
from buildkit_py.versions import major_minor as _mm  # short: it sits in many messages


@dataclass(frozen=True)
class TorchPart:
    version: str | None = None
    variant: str | None = None
    index_url: str | None = None  # None: the Python registry's default wheel
    warnings: Warnings = ()
    release: TorchRelease | None = None  # its facts: the CUDA wheels it brings

    @property
    def label(self) -> str | None:
        return f"{self.version}+{self.variant}" if self.version else None


def _variant_cuda(variant: str) -> str:
    """cu124 -> 12.4, cu118 -> 11.8."""
    digits = variant[2:]
    return f"{digits[:-1]}.{digits[-1]}"


def torch_cxx11_abi(torch_version: str) -> bool:
    """torch._C._GLIBCXX_USE_CXX11_ABI of torch's Linux wheels: True from 2.7 (manylinux_2_28 builds)."""
    return Version(torch_version) >= Version("2.7")


def torch_rule(recipe: Recipe, cuda: str, python: str, looked_up: LookedUp | None = None) -> TorchPart:
    """torch: the build for the CUDA's variant (cu124), which must exist and accept the Python;
    taken from the Python registry when its default wheel is that variant, else from
    PyTorch's per-CUDA index."""
    if not recipe.torch:
        return TorchPart()
    release = torch_release_rule(recipe, looked_up)
    warnings: list[RecipeWarning] = []
    if release.from_cache:
        warnings.append(RecipeWarning(
            codes.TORCH_FROM_INDEX, "torch",
            f"torch {release.version} is newer than imgbuild's shipped data: its CUDA variant, pins "
            f"and Python range come from the package index ({release.source}; cached in "
            f"{release.from_cache}); only its PyPI build ({release.pypi_variant}) is known"))
    wanted = "cu" + _mm(cuda).replace(".", "")
    if wanted not in release.variants:
        raise _torch_variant_error(recipe, release, wanted, cuda, python)
    if python not in release.python:
        raise refusal_at(recipe, "python", "torch", release.version, "python", python,
                         f"torch {release.version} publishes wheels for Python {release.python}",
                         hint=_torch_python_hint(recipe, release, wanted, python))
    if recipe.cuda.source == CudaSource.NVIDIA and recipe.cuda.flavor != CudaFlavor.BASE:
        major = cuda.split(".", maxsplit=1)[0]
        warnings.append(RecipeWarning(
            codes.CUDA_TWICE, "torch",
            f"torch {release.version}+{wanted} brings its own CUDA libraries as nvidia-*-cu{major} "
            f"wheels; the nvidia/cuda {recipe.cuda.flavor} base carries them a second time (several GB). "
            "Use cuda.source: wheels (or flavor: base) unless you need the base's toolkit."))
    # The Python registry's Linux wheel is one CUDA variant; take it from there when it is
    # the one wanted (it is the same build), else from PyTorch's per-CUDA index.
    index = compat.torch_index_url(wanted) if release.pypi_variant != wanted else None
    return TorchPart(release.version, wanted, index, tuple(warnings), release)


def _torch_python_hint(recipe: Recipe, release: TorchRelease, wanted: str, python: str) -> str:
    """The nearest Python torch has wheels for that the recipe's OS provides (Debian: its own python3
    only; Ubuntu: deadsnakes), and the nearest torch release with a ``wanted`` build for the Python asked."""
    os_name = detect_os(recipe)
    if os_name and os_name.startswith("ubuntu"):
        offered = sorted(set(OS_PYTHON.values()), key=Version)
    else:  # a python:X.Y image or a base brings one Python; Debian ships one
        offered = [OS_PYTHON[os_name]] if os_name in OS_PYTHON and not PYTHON_IMAGE.search(recipe.base.image or "") \
            else []
    options = []
    pythons = [p for p in offered if p in release.python]
    if pythons:
        options.append(f'python: "{compat.nearest_versions(python, pythons, n=1)[0]}" (the nearest Python torch '
                       f"{release.version} has wheels for that {os_name} provides)")
    fits = [r.version for r in compat.torch_releases() if wanted in r.variants and python in r.python]
    if fits:
        options.append(f"torch {compat.nearest_versions(release.version, fits, n=1)[0]} (the nearest release with a "
                       f"{wanted} build for Python {python})")
    return "use " + " or ".join(options) if options else f"use a Python in {release.python} (and a base that has it)"


def torch_release_rule(recipe: Recipe, looked_up: LookedUp | None = None) -> TorchRelease:
    """The torch pin's release from the shipped data or the look-up cache. Unknown: a release near
    known ones is most likely a typo (never "newer than the data"); one newer than the data could
    not be looked up, and the hint says why (offline, or the index's answer)."""
    version = recipe.torch or ""
    looked_up = looked_up or LookedUp()
    try:
        return compat.torch_release(version, extra=looked_up.torch)
    except LookupError:
        pass
    known = [r.version for r in compat.torch_releases()]
    newest = known[-1]
    fitting = _torch_fits(recipe)
    wanted = f"a {_variant(recipe.cuda.version)} build for Python {recipe.python}"
    # where no release fits the CUDA and Python as written, none is offered as the fix
    none_fits = f"no torch release imgbuild knows has {wanted} (change cuda.version or python too)"
    near = compat.nearest_versions(version, known)
    try:
        newer = Version(version) > Version(newest)
    except InvalidVersion:
        newer = False
    if not newer:
        nearest = compat.nearest_versions(version, fitting or known, n=1)[0]
        raise refusal_at(recipe, "torch", "torch", version, "imgbuild's torch data", compat.data_as_of(),
                         f"{version} is not a torch release imgbuild knows (known near it: {', '.join(near)})",
                         hint=f"use torch {nearest} (the nearest release with {wanted}), or the newest, {fitting[-1]}"
                         if fitting else f"{none_fits}; the nearest release is {nearest}")
    if looked_up.index_releases:  # the index was asked and has no such version: it does not exist
        nearest = compat.nearest_versions(version, [*looked_up.index_releases, *known], n=1)[0]
        raise refusal_at(recipe, "torch", "torch", version, "the package index", looked_up.index_url or "",
                         f"torch {version} is not a release: the package index has no such version (its newest: "
                         f"{', '.join(looked_up.index_releases[-3:])})",
                         hint=f"use torch {nearest} (the nearest release)")
    if looked_up.offline:
        why = "--offline: the package index was not asked"
        how = "plan without --offline (the index reachable) to look it up"
    elif looked_up.failure:
        why, how = f"the package index could not answer: {looked_up.failure}", "check the version"
    else:
        why, how = "it is not in the look-up cache", "plan with the package index reachable to look it up"
    raise refusal_at(recipe, "torch", "torch", version, "imgbuild's torch data", compat.data_as_of(),
                     f"torch {version} is newer than imgbuild's data (newest known: {newest}), and {why}",
                     hint=f"{how}, or use torch {fitting[-1]} (the newest imgbuild knows with {wanted})" if fitting else
                     f"{how}; {none_fits}")


def _variant(cuda: str) -> str:
    """12.4.1 -> cu124: the torch variant of a CUDA as written."""
    return "cu" + _mm(cuda).replace(".", "")


def _torch_fits(recipe: Recipe) -> list[str]:
    """The torch releases the data knows that have a build for the recipe's CUDA as written and its
    Python, ascending: what a hint for an unknown torch pin names, so that it fits the rest of the recipe
    (torch_release_rule runs before the CUDA is resolved, so the minor written stands for it)."""
    wanted = _variant(recipe.cuda.version)
    return [r.version for r in compat.torch_releases() if wanted in r.variants and recipe.python in r.python]


def _torch_variant_error(recipe: Recipe, release: TorchRelease, wanted: str, cuda: str,
                         python: str) -> CompatibilityError:
    """No torch build for that CUDA: name the nearest CUDA this torch has a build for and the newest
    torch that has this CUDA and this Python. On a row known to be partial, the build is unknown,
    not missing: the refusal says so."""
    variants = sorted(release.variants, key=lambda v: Version(_variant_cuda(v)))

    def distance(variant: str) -> tuple[int, int]:
        a, b = Version(_variant_cuda(variant)), Version(_mm(cuda))
        return abs((a.major * 100 + a.minor) - (b.major * 100 + b.minor)), -(a.major * 100 + a.minor)

    # source: wheels needs NVIDIA's runtime wheels of that CUDA on PyPI (none before 11.7): a CUDA
    # without them would be refused next
    variants = [v for v in variants
                if recipe.cuda.source != CudaSource.WHEELS or compat.cuda_wheel_sets(_variant_cuda(v))] or variants
    usable = [v for v in variants if nvidia_image_os(recipe, _variant_cuda(v)) == recipe.base.os]
    nearest = min(usable or variants, key=distance) if variants else None
    fits = [r.version for r in compat.torch_releases() if wanted in r.variants and python in r.python]
    options = []
    has = "is known to have a build for" if release.unknown_variants else "has a build for"
    if nearest and usable:
        options.append(f"cuda {_variant_cuda(nearest)} (the nearest CUDA torch {release.version} {has}"
                       + (f" and nvidia/cuda has a {recipe.cuda.flavor} image on {recipe.base.os} for)"
                          if len(usable) < len(variants) else ")"))
    elif nearest and (os_name := nvidia_image_os(recipe, _variant_cuda(nearest))):
        options.append(f'cuda: "{_variant_cuda(nearest)}" on {os_name} (the nearest CUDA torch {release.version} '
                       f"{has}; nvidia/cuda has no {recipe.cuda.flavor} image of it on {recipe.base.os})")
    if fits:
        close = compat.nearest_versions(release.version, fits, n=1)[0]
        also = f"; the newest: {fits[-1]}" if fits[-1] != close else ""
        options.append(f"torch {close} (the nearest release with {wanted} for Python {python}{also})")
    hint = "use " + " or ".join(options) if options else None
    if release.unknown_variants:
        return refusal_at(recipe, "torch", "torch", release.version, "cuda", cuda,
                          f"whether torch {release.version} has a {wanted} build is unknown: imgbuild's data for it is "
                          f"partial ({release.unknown_variants})", hint=hint, partial=True)
    return refusal_at(recipe, "torch", "torch", release.version, "cuda", cuda,
                      f"torch {release.version} has CUDA wheels only for "
                      + (f"{', '.join(variants[:-1])} and {variants[-1]}" if len(variants) > 1 else "".join(variants)),
                      hint=hint)


def torch_cudnn_major(release: TorchRelease) -> str | None:
    """The cuDNN major of a torch release: its PyPI wheel's nvidia-cudnn pin. PyTorch builds every
    CUDA variant of a release against one cuDNN major (RELEASE.md's compatibility matrix: 2.1-2.3
    cuDNN 8 on cu118 and cu121, 2.4+ cuDNN 9 on every variant), so it holds for the other variants."""
    pins = [v for n, v in release.pypi_cuda_wheels.items() if n.startswith("nvidia-cudnn")]
    return pins[0].split(".")[0] if pins else None
