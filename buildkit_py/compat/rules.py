"""The resolver's rules: one function per component, each deciding its part of the resolution.

``resolve.resolve`` calls them in this order, each with the recipe and what the rules before it
decided; each returns a frozen part (with its own ``warnings``), or only warnings where it
decides nothing, and raises CompatibilityError at the recipe key that clashes:

1. ``cuda_rule``         the toolkit (and the wheel set a ``source: wheels`` recipe installs) (in ``cuda_rule``)
2. ``cudnn_rule``        cuda.cudnn against what NVIDIA publishes for that CUDA
3. ``python_rule``       the OS and who provides Python (OS, deadsnakes, a python image, a base)
4. ``torch_rule``        the torch build for that CUDA and Python, and where it comes from (in ``torch_rule``)
5. ``arch_rule``         build.cuda_arch against what nvcc targets
6. ``flash_attn_rule``   a flash-attn pin: a release wheel, or a source build (in ``flash_attn_rule``)
7. ``bitsandbytes_rule`` a bitsandbytes pin against CUDA, Python, torch and the architectures (in
                         ``bitsandbytes_rule``)
8. ``images_rule``       the final stage's FROM and the compile stage's (in ``image_rule``)
9. ``flavor_rule``       flavor and runtime_compile against what the recipe compiles
10. ``base_rule``        a base read from its registry: checked, then pinned by digest (in ``base_rule``)
11. ``cuda_wheels_rule`` the nvidia-* wheels the final stage installs (in ``cuda_wheels``)

A family with data of its own lives in a module beside that data (the ones marked "in"); this one
keeps the small rules and the helpers they all share. The version knowledge comes from the sourced
tables in ``compat``. A new rule goes in its subject's module, as one more function with its own
part, and is called from ``resolve``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from buildkit_py import compat
from buildkit_py import label_keys as K
from buildkit_py.compat import codes, cuda_base
from buildkit_py.compat.bases import BaseFacts
from buildkit_py.compat.bitsandbytes import BnbRelease
from buildkit_py.compat.codes import RecipeWarning
from buildkit_py.compat.flash_attn import FlashAttnRelease
from buildkit_py.compat.platforms import PinFiles
from buildkit_py.compat.torch_data import TorchRelease
from buildkit_py.compat.wheel_contents import WheelContents
from buildkit_py.errors import CompatibilityError, RecipeLocation
from buildkit_py.recipe.model import CudaSource, Recipe, pin_name
from buildkit_py.reference import is_registry_host
from buildkit_py.text_enum import TextEnum
from buildkit_py.versions import major_minor as _mm  # short: it sits in many messages

# The Python each OS ships as python3 (Debian and Ubuntu package archives).
OS_PYTHON = {
    "debian11": "3.9",
    "debian12": "3.11",
    "debian13": "3.13",
    "ubuntu20.04": "3.8",
    "ubuntu22.04": "3.10",
    "ubuntu24.04": "3.12",
    "ubuntu26.04": "3.14",  # packages.ubuntu.com resolute (26.04 LTS): python3 3.14.3-0ubuntu2, read 2026-12-03
}
# Image names whose OS imgbuild can tell without pulling them.
_OS_FROM_IMAGE = [
    (re.compile(r"(^|/)debian:(bookworm|12)\b"), "debian12"),
    (re.compile(r"(^|/)debian:(bullseye|11)\b"), "debian11"),
    (re.compile(r"(^|/)debian:(trixie|13)\b"), "debian13"),
    (re.compile(r"(^|/)ubuntu:(22\.04|jammy)\b"), "ubuntu22.04"),
    (re.compile(r"(^|/)ubuntu:(24\.04|noble)\b"), "ubuntu24.04"),
    (re.compile(r"(^|/)ubuntu:(26\.04|resolute)\b"), "ubuntu26.04"),
    (re.compile(r"(^|/)ubuntu:(20\.04|focal)\b"), "ubuntu20.04"),
]
PYTHON_IMAGE = re.compile(r"(^|/)python:(3\.\d+)")

# Packages that compile CUDA kernels when first used, so they need nvcc and headers at run
# time (DeepSpeed's op builder, NVIDIA Apex's JIT path, xFormers when built without wheels).
JIT_PACKAGES = frozenset({"deepspeed", "apex", "cupy", "pycuda"})
# Compute capabilities built for when a recipe compiles kernels but names none:
# Ampere, Ada and Hopper, the data-center and workstation GPUs rented today.
DEFAULT_BUILD_ARCHS = ("8.0", "8.6", "8.9", "9.0")

Warnings = tuple[RecipeWarning, ...]
# The releases of a package that fit a CUDA, Python and torch, ascending (fa_fits, bnb_fits).
FitsFn = Callable[[str, str, str | None], list[str]]
_Release = TypeVar("_Release", FlashAttnRelease, BnbRelease)


# ----------------------------------------------------------------------------- the parts
class PythonProvider(TextEnum):
    """Who provides the image's Python (python_rule)."""

    OS = "os"  # the OS's own python3
    DEADSNAKES = "deadsnakes"  # Ubuntu's deadsnakes PPA
    IMAGE = "image"  # a python:X.Y base image
    BASE = "base"  # an imgbuild base: Python and venv present


@dataclass(frozen=True)
class PythonPart:
    python: str
    provider: PythonProvider
    os: str | None


@dataclass(frozen=True)
class ArchPart:
    requested: tuple[str, ...]  # build.cuda_arch as written
    supported: tuple[str, ...]  # what nvcc of the toolkit targets (empty: not recorded)

    def for_build(self, compiles: bool) -> tuple[str, ...]:
        """What kernels are built for: the recipe's list, else the defaults nvcc targets."""
        if self.requested or not compiles:
            return self.requested
        return tuple(a for a in DEFAULT_BUILD_ARCHS if a in self.supported)


# ----------------------------------------------------------------------------- helpers
def refusal_at(recipe: Recipe, key: str, *args: str, hint: str | None = None,
               partial: bool = False) -> CompatibilityError:
    """The recipe refused at ``key`` (its file, line and key), ``args`` the clash as CompatibilityError
    words it (component, version, other component, version, reason)."""
    return CompatibilityError(*args, hint=hint, at=RecipeLocation(str(recipe.path), recipe.line_of(key), key),
                              partial=partial)


def newest_hint(what: str, known: list[str], fitting: str | None = None) -> str:
    """The newest releases the shipped data knows (the list is ascending), newest first; ``fitting``:
    what the rest of the recipe asks of a release, where none of them fits it (so none is offered as a fix)."""
    newest = ", ".join(sorted(known, key=Version, reverse=True)[:6])
    if fitting:
        return f"no {what} release imgbuild knows fits {fitting}; its newest are {newest}"
    return f"use a {what} release imgbuild knows; the newest are {newest}"


def fitting_words(cuda: str, python: str, torch: str | None) -> str:
    """What a pin must fit, in words: "CUDA 12.4, Python 3.11 and torch 2.4.1"."""
    return f"CUDA {_mm(cuda)}, Python {python}" + (f" and torch {torch}" if torch else "")


def unknown_release(recipe: Recipe, key: str, name: str, version: str, known: list[str],
                    fits: FitsFn) -> CompatibilityError:
    """A pin of a release the shipped table lacks (``known``: the table's versions, ascending): the hint
    names the nearest release that ``fits`` the recipe's CUDA, Python and torch as written (this runs before
    they are resolved), else says that none does. ``fits`` comes from the package's own rule family, so
    this stays one message for both without rules importing them."""
    cuda, python, torch = recipe.cuda.version, recipe.python, recipe.torch
    fitting, wanted = fits(cuda, python, torch), fitting_words(cuda, python, torch)
    hint = (f"use {name}=={compat.nearest_versions(version, fitting, n=1)[0]} (the nearest release that fits "
            f"{wanted})" if fitting else newest_hint(name, known, wanted))
    return refusal_at(recipe, key, name, version, f"imgbuild's {name} table", known[-1],
                      f"this {name} release is unknown", hint=hint)


def data_gap(recipe: Recipe, key: str, exc: LookupError, component: str, version: str,
             hint: str | None = None) -> CompatibilityError:
    """A look-up the shipped data cannot answer, as a resolution error at the recipe key (``hint``: one
    that knows more of the recipe than the look-up's own)."""
    reason = getattr(exc, "reason", None) or str(exc).strip("'\"")
    nearest = getattr(exc, "nearest", ())
    if nearest:
        reason += f" (known near it: {', '.join(nearest)})"
    return refusal_at(recipe, key, component, version, "imgbuild's compatibility data", compat.data_as_of(), reason,
                      hint=hint or getattr(exc, "hint", None))


def pip_pin(recipe: Recipe, name: str) -> tuple[int, str] | None:
    for i, spec in enumerate(recipe.pip):
        if pin_name(spec) == name:
            return i, spec.split("==", 1)[1]
    return None


def cuda_in(supported: SpecifierSet | tuple[str, ...], cuda: str) -> bool:
    if isinstance(supported, SpecifierSet):
        return supported.contains(cuda) or supported.contains(_mm(cuda))
    return _mm(cuda) in supported or cuda in supported


def describe_cuda(supported: SpecifierSet | tuple[str, ...]) -> str:
    return str(supported) if isinstance(supported, SpecifierSet) else (", ".join(supported) or "no CUDA")


def detect_os(recipe: Recipe) -> str | None:
    if recipe.cuda.source == CudaSource.NVIDIA and not recipe.base.image:
        return recipe.base.os
    image = recipe.base.image or ""
    tagged = cuda_base.from_tag(image)
    if tagged is not None:
        return tagged.os
    for pattern, os_name in _OS_FROM_IMAGE:
        if pattern.search(image):
            return os_name
    if "os" in {k.split(".")[-1] for k in recipe.lines if k.startswith("base.")}:
        return recipe.base.os
    return None


def mirrored_ref(image: str, mirror: str | None) -> str:
    """Where base.mirror puts an image: R/mirror/nvidia/cuda:tag (upstream host dropped)."""
    if not mirror:
        return image
    path = image
    first, _, rest = image.partition("/")
    if rest and is_registry_host(first):
        path = rest  # drop the upstream registry host
    return f"{mirror.rstrip('/')}/{path}"


def nvidia_image(recipe: Recipe, cuda: str, flavor: str, os_name: str | None, *, any_patch: bool = False) -> str:
    """The nvidia/cuda image for that toolkit: only a tag the data records. any_patch: a compile
    stage may use another patch release of the same X.Y (nvcc X.Y.a output runs on the X.Y.b runtime)."""
    os_name = os_name or recipe.base.os
    try:
        release = compat.image_release(cuda, flavor, recipe.cuda.cudnn, os_name, any_patch=any_patch)
    except compat.ImageGap as gap:
        raise image_gap_refusal(recipe, gap, gap.value, os_name) from None
    return mirrored_ref(f"nvidia/cuda:{compat.cuda_image_tag(release, flavor, recipe.cuda.cudnn, os_name)}",
                        recipe.base.mirror)


def image_gap_refusal(recipe: Recipe, gap: compat.ImageGap, cuda: str, os_name: str) -> CompatibilityError:
    """An image the data does not record, blamed on the key that is wrong (base.os when no CUDA
    release has that image for the OS)."""
    component, value = ("base.os", os_name) if gap.key == "base.os" else ("cuda", cuda)
    return refusal_at(recipe, gap.key, component, value, gap.other, gap.other_value, gap.reason, hint=gap.hint)


# ----------------------------------------------------------------------------- 2. cuDNN
def cudnn_rule(recipe: Recipe, cuda: str) -> str | None:
    """cuda.cudnn: with source: wheels an nvidia-cudnn wheel of that major must exist for the
    CUDA (installed by imgbuild, or pinned by torch: checked in ``torch_rule``); with nvidia,
    an image with that cuDNN."""
    cudnn = recipe.cuda.cudnn
    if cudnn is None:
        return None
    if not compat.cudnn_supported(cuda, cudnn):  # one rule for both sources: NVIDIA's support matrix
        raise cudnn_unsupported(recipe, cudnn, cuda)
    if recipe.cuda.source == CudaSource.WHEELS:
        try:
            compat.cudnn_wheel(cuda, cudnn)
        except LookupError as exc:
            raise data_gap(recipe, "cuda.cudnn", exc, "cudnn", cudnn) from None
        return cudnn
    available = compat.cudnn_versions(cuda)
    if cudnn.split(".")[0] not in available:
        raise refusal_at(recipe, "cuda.cudnn", "cudnn", cudnn, "cuda", cuda,
                         f"cuDNN {cudnn} is not published for CUDA {cuda} "
                         f"(available: {', '.join(available) or 'none'})",
                         hint=f"use cudnn: \"{available[-1]}\"" if available else "drop cuda.cudnn")
    return cudnn


def cudnn_unsupported(recipe: Recipe, cudnn: str, cuda: str) -> CompatibilityError:
    """A cuDNN major NVIDIA's support matrix does not list for this CUDA: name the CUDAs it does
    support and the cuDNN majors this CUDA has."""
    major = cudnn.split(".", maxsplit=1)[0]
    rows = compat.cudnn_support(major)
    spans = [_minors_in(r.cuda) for r in rows]
    supports = " and ".join(s for s in spans if s) or "no CUDA imgbuild knows"
    here = compat.cudnn_majors_for(cuda)
    newest_cuda = max((t.version for t in compat.toolkits() for r in rows if Version(_mm(t.version)) in r.cuda),
                      key=Version, default=None)
    options = [f'cudnn: "{here[-1]}" (the newest cuDNN for CUDA {_mm(cuda)})'] if here else []
    if newest_cuda:
        options.append(f'cuda.version "{_mm(newest_cuda)}" (the newest CUDA cuDNN {major} supports)')
    return refusal_at(recipe, "cuda.cudnn", "cudnn", cudnn, "cuda", cuda,
                      f"NVIDIA's cuDNN support matrix lists cuDNN {major} for CUDA {supports} only",
                      hint="use " + " or ".join(options) if options else "drop cuda.cudnn")


def _minors_in(spec: SpecifierSet) -> str:
    """The known CUDA minors a range covers, as "12.0-12.2" (empty when none)."""
    minors = sorted({_mm(t.version) for t in compat.toolkits() if Version(_mm(t.version)) in spec}, key=Version)
    if not minors:
        return ""
    return minors[0] if len(minors) == 1 else f"{minors[0]}-{minors[-1]}"


# ----------------------------------------------------------------------------- 3. OS and Python
def python_rule(recipe: Recipe, base: BaseFacts | None) -> PythonPart:
    """Who provides ``python``: an imgbuild base (its label), a python:X.Y image, the OS's own
    python3, or deadsnakes on Ubuntu. Anything else is refused."""
    facts = base
    os_name = detect_os(recipe)
    if os_name is None and facts is not None:
        os_name = facts.labels.get(K.OS)
    python = recipe.python
    base_python = facts.labels.get(K.PYTHON_VERSION) if facts is not None else None
    py_image = PYTHON_IMAGE.search(recipe.base.image or "")
    if facts is not None and base_python:
        if base_python != python:
            raise refusal_at(recipe, "python", "python", python, "base.image", f"{facts.ref} (python {base_python})",
                             f"the base image was built with Python {base_python}",
                             hint=f"use python: \"{base_python}\" or a base built for Python {python}")
        return PythonPart(python, PythonProvider.BASE, os_name)
    if py_image:
        if py_image.group(2) != python:
            raise refusal_at(recipe, "python", "python", python, "base.image", recipe.base.image or "",
                             f"the image ships Python {py_image.group(2)}",
                             hint=f"use python: \"{py_image.group(2)}\" or a python:{python} image")
        return PythonPart(python, PythonProvider.IMAGE, os_name)
    return PythonPart(python, _os_python_provider(recipe, os_name), os_name)


def _os_python_provider(recipe: Recipe, os_name: str | None) -> PythonProvider:
    python = recipe.python
    if os_name is None:
        raise refusal_at(recipe, "base.image", "base.image", recipe.base.image or "", "python", python,
                         "imgbuild cannot tell which OS (and so which Python) this image has",
                         hint="set base.os (e.g. debian12, ubuntu22.04) for this image")
    if OS_PYTHON.get(os_name) == python:
        return PythonProvider.OS
    if os_name.startswith("ubuntu"):
        return PythonProvider.DEADSNAKES  # Ubuntu's PPA packages every maintained Python for each LTS
    if os_name not in OS_PYTHON:  # not "ships Python ?" with a hint of python: "None"
        known = ", ".join(f"{o} ({v})" for o, v in OS_PYTHON.items() if not o.startswith("ubuntu"))
        raise refusal_at(recipe, "python", "python", python, "os", os_name,
                         f"imgbuild does not know which Python {os_name} ships (its data has {known})",
                         hint=f"use a python:{python} base image, an OS imgbuild knows, or an Ubuntu base",
                         partial=True)
    shipped = OS_PYTHON[os_name]
    image = f"a python:{python} base image"
    refused = _torch_refuses_python(recipe, shipped)
    raise refusal_at(recipe, "python", "python", python, "os", os_name,
                     f"{os_name} ships Python {shipped} and no other",
                     hint=f"use an Ubuntu base or {image} ({refused})" if refused else
                     f'use python: "{shipped}", an Ubuntu base, or {image}')


def _torch_refuses_python(recipe: Recipe, python: str) -> str | None:
    """Why the recipe's torch pin has no wheel for ``python`` (None: it has one, or the release is
    unknown, which torch_rule refuses): a hint must not offer a Python that clashes with the torch pin."""
    try:
        release = compat.torch_release(recipe.torch) if recipe.torch else None
    except LookupError:
        return None
    if release is None or python in release.python:
        return None
    return f"torch {release.version} has no wheel for Python {python}: {release.python}"


# ----------------------------------------------------------------------------- 4. torch: what the look-up found
@dataclass(frozen=True)
class LookedUp:
    """Facts the plan-time look-up found beyond the shipped data, passed in (the resolver reads no
    cache): ``torch`` releases newer than the data (read from the package index, ``from_cache`` set),
    and what the look-up of a pin the data lacks did: never asked (``offline``), or asked and failed
    (``failure``: the index's answer). The default: nothing looked up."""
    torch: tuple[TorchRelease, ...] = ()
    offline: bool = False
    failure: str | None = None
    # the files the index serves of each pin platforms.json has no row for (multi-platform recipes)
    pin_files: tuple[PinFiles, ...] = ()
    # the index answered that the torch pin is no release of it: its releases, and its URL
    index_releases: tuple[str, ...] = ()
    index_url: str | None = None
    # what the CUDA wheels pinned beside the data's bring, read live (wheel_contents.read_wheel)
    wheels: tuple[WheelContents, ...] = ()


def pinned_release(recipe: Recipe, key: str, name: str, version: str, find: Callable[[str], _Release],
                   table: Callable[[], Sequence[_Release]], fits: FitsFn) -> _Release:
    """The pinned release's row (``find``), else the refusal of a release the table lacks, whose hint
    names the nearest that ``fits`` (flash-attn's and bitsandbytes' checks, one message)."""
    try:
        return find(version)
    except LookupError:
        raise unknown_release(recipe, key, name, version, [r.version for r in table()], fits) from None


def known_release(recipe: Recipe, key: str, name: str, version: str,
                  table: Callable[[], Sequence[FlashAttnRelease | BnbRelease]], fits: FitsFn) -> str:
    known = [r.version for r in table()]
    if not any(Version(v) == Version(version) for v in known):
        raise unknown_release(recipe, key, name, version, known, fits)
    return version


def nvidia_image_os(recipe: Recipe, cuda: str) -> str | None:
    """The OS ``cuda`` would find its image on: with source: nvidia and no base.image imgbuild picks
    the nvidia/cuda tag, so base.os where NVIDIA publishes one of the recipe's flavor and cuDNN, else
    the newest OS it does (None: none). Any other recipe names its base, whose CUDA other rules check."""
    if recipe.cuda.source != CudaSource.NVIDIA or recipe.base.image:
        return recipe.base.os
    for os_name in (recipe.base.os, *reversed(compat.cuda_image_oses(cuda))):
        try:
            compat.image_release(cuda, recipe.cuda.flavor, recipe.cuda.cudnn, os_name)
        except compat.ImageGap:
            continue
        return os_name
    return None


# ----------------------------------------------------------------------------- 5. architectures
def arch_rule(recipe: Recipe, cuda: str) -> ArchPart:
    """build.cuda_arch: each must be a target of that CUDA's nvcc."""
    archs = tuple(recipe.build.cuda_arch)
    try:
        supported = compat.cuda_archs(cuda)
    except LookupError as exc:
        if archs:
            raise data_gap(recipe, "build.cuda_arch", exc, "cuda", cuda) from None
        supported = ()
    for i, arch in enumerate(archs):
        if arch.replace("+PTX", "") not in supported:
            raise refusal_at(recipe, f"build.cuda_arch[{i}]", "cuda_arch", arch, "cuda", cuda,
                             f"nvcc {_mm(cuda)} targets {', '.join(supported)}",
                             hint="drop that architecture or pick a CUDA that supports it")
    return ArchPart(archs, supported)


# ----------------------------------------------------------------------------- 9. flavor
def flavor_rule(recipe: Recipe, compile_: frozenset[str]) -> Warnings:
    """Warnings only: a devel flavor that nothing uses, JIT packages without runtime_compile,
    runtime_compile without nvcc in the final image."""
    warnings = []
    source, flavor = recipe.cuda.source, recipe.cuda.flavor
    if flavor == "devel" and not compile_ and not recipe.runtime_compile:
        warnings.append(RecipeWarning(
            codes.DEVEL_WITHOUT_COMPILE, "cuda.flavor",
            "cuda.flavor devel ships nvcc, headers and static libraries (several GB) but this "
            "recipe compiles nothing at run time; use flavor: runtime (extensions still build "
            "in a devel stage)" if source == "nvidia" else
            "cuda.flavor devel installs nvcc, headers and the math libraries from wheels (GBs) but "
            "this recipe compiles nothing at run time; use flavor: runtime"))
    jit = sorted((pin[0], name) for name in JIT_PACKAGES if (pin := pip_pin(recipe, name)))
    if jit and not recipe.runtime_compile:
        warnings.append(RecipeWarning(
            codes.JIT_WITHOUT_RUNTIME_COMPILE, f"pip[{jit[0][0]}]",
            f"{', '.join(sorted(name for _, name in jit))} compile(s) CUDA kernels at run time, which needs nvcc and "
            "headers in the final image: set runtime_compile: true if you use that path"))
    if recipe.runtime_compile and flavor != "devel":
        # the cu11/cu12 nvidia-cuda-nvcc wheels hold ptxas only; CUDA 13's hold nvcc (flavor: devel)
        warnings.append(RecipeWarning(
            codes.RUNTIME_COMPILE_WITHOUT_NVCC, "runtime_compile",
            "runtime_compile with cuda.source: wheels needs nvcc in the image: use flavor: devel "
            "(CUDA 13+: nvcc from wheels) or source: nvidia with flavor: devel" if source == "wheels" else
            "runtime_compile needs nvcc and headers: the final image must use flavor: devel"))
    return tuple(warnings)
