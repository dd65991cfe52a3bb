"""Recipe pins -> a ``Resolution``: what fits together, or a CompatibilityError that says why not.

Only rules live here; the version knowledge comes from the sourced tables in ``compat``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import Version

from buildkit_py import compat
from buildkit_py.compat import codes
from buildkit_py.compat.codes import RecipeWarning
from buildkit_py.errors import CompatibilityError
from buildkit_py.recipe.model import Recipe, pin_name

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
_PYTHON_IMAGE = re.compile(r"(^|/)python:(3\.\d+)")

# Packages that compile CUDA kernels when first used, so they need nvcc and headers at run
# time (DeepSpeed's op builder, NVIDIA Apex's JIT path, xFormers when built without wheels).
JIT_PACKAGES = frozenset({"deepspeed", "apex", "cupy", "pycuda"})
# Pins whose wheels are large and change rarely: they get a layer of their own, before
# the other pins, so a change to a small pin does not re-download them.
HEAVY_PACKAGES = frozenset({
    "flash-attn", "flash_attn", "bitsandbytes", "xformers", "vllm", "triton", "deepspeed",
    "tensorflow", "jax", "jaxlib", "onnxruntime-gpu", "tensorrt", "cupy-cuda12x", "cupy-cuda11x",
})
# Compute capabilities built for when a recipe compiles kernels but names none:
# Ampere, Ada and Hopper, the data-center and workstation GPUs rented today.
DEFAULT_BUILD_ARCHS = ("8.0", "8.6", "8.9", "9.0")
# What flash-attn's GitHub release wheels are compiled for (its publish workflow builds with
# CUDA 12.3/12.4 toolchains, which predate Blackwell).
FLASH_ATTN_WHEEL_ARCHS = frozenset({"8.0", "8.6", "8.9", "9.0"})
# Packages whose source build compiles CUDA kernels, so the compile stage needs nvcc.
CUDA_KERNEL_PACKAGES = frozenset({"flash-attn", "flash_attn", "xformers", "apex"})


@dataclass(frozen=True)
class Resolution:
    cuda_version: str  # full toolkit version, e.g. 12.4.1
    cuda_flavor: str
    cuda_source: str
    min_driver: str
    min_driver_compat: str | None
    cudnn: str | None
    python: str
    python_provider: str  # os | deadsnakes | image | base (an imgbuild base: Python and venv present)
    os: str | None
    base_image: str  # FROM of the final stage
    builder_image: str | None  # FROM of the compile stage, when one is needed
    require_cuda: str  # NVIDIA_REQUIRE_CUDA
    torch: str | None = None  # e.g. 2.4.1
    torch_variant: str | None = None  # e.g. cu124
    torch_index_url: str | None = None  # None: the Python registry's default wheel
    cuda_wheels: tuple[str, ...] = ()  # nvidia-* pins (cu11/cu12 suffixed, CUDA 13 unsuffixed) the final stage installs
    # CUDA 13 wheels install one toolkit tree under site-packages (nvidia/cu13): where a devel
    # flavor or a compile stage gets nvcc from wheels, that tree becomes CUDA_HOME
    cuda_wheel_home: str | None = None
    builder_cuda_wheels: tuple[str, ...] = ()  # nvcc and headers from wheels for the compile stage
    compile: tuple[str, ...] = ()  # pins built from source in the builder stage
    prebuilt_urls: tuple[tuple[str, str], ...] = ()  # (package, wheel URL) taken instead of building
    cuda_arch: tuple[str, ...] = ()
    warnings: tuple[RecipeWarning, ...] = ()
    base_digest: str | None = None  # the final stage's base, pinned (shared bases, mirrors)

    @property
    def cuda_major_minor(self) -> str:
        return ".".join(self.cuda_version.split(".")[:2])

    @property
    def torch_label(self) -> str | None:
        if not self.torch:
            return None
        return f"{self.torch}+{self.torch_variant}" if self.torch_variant else self.torch


def _mm(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _variant_cuda(variant: str) -> str:
    """cu124 -> 12.4, cu118 -> 11.8."""
    digits = variant[2:]
    return f"{digits[:-1]}.{digits[-1]}"


def _fail(recipe: Recipe, key: str, *args, hint: str | None = None) -> CompatibilityError:
    return CompatibilityError(*args, hint=hint, file=str(recipe.path), line=recipe.line_of(key), key=key)


def _newest_hint(what: str, known: list[str]) -> str:
    """The newest releases the shipped data knows (the list is ascending), newest first."""
    newest = sorted(known, key=Version, reverse=True)[:6]
    return f"use a {what} release imgbuild knows; the newest are {', '.join(newest)}"


def _gap(recipe: Recipe, key: str, exc: LookupError, component: str, version: str) -> CompatibilityError:
    """A look-up the shipped data cannot answer, as a resolution error at the recipe key."""
    reason = getattr(exc, "reason", None) or str(exc).strip("'\"")
    nearest = getattr(exc, "nearest", ())
    if nearest:
        reason += f" (known near it: {', '.join(nearest)})"
    return _fail(recipe, key, component, version, "imgbuild's compatibility data", compat.data_as_of(), reason,
                 hint=getattr(exc, "hint", None))


def _pin(recipe: Recipe, name: str) -> tuple[int, str] | None:
    for i, spec in enumerate(recipe.pip):
        if pin_name(spec) == name:
            return i, spec.split("==", 1)[1]
    return None


def detect_os(recipe: Recipe) -> str | None:
    if recipe.cuda.source == "nvidia" and not recipe.base.image:
        return recipe.base.os
    image = recipe.base.image or ""
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
    first = image.split("/", maxsplit=1)[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        path = image.split("/", 1)[1]  # drop the upstream registry host
    return f"{mirror.rstrip('/')}/{path}"


def resolve(recipe: Recipe, base=None) -> Resolution:  # noqa: C901
    """``base``: BaseFacts of the final stage's base read from its registry (see compat/bases.py),
    or None where it is not looked up."""
    warnings: list[RecipeWarning] = []
    try:
        toolkit = compat.resolve_cuda(recipe.cuda.version)
    except LookupError as exc:
        raise _gap(recipe, "cuda.version", exc, "cuda", recipe.cuda.version) from None
    if recipe.cuda.source == "nvidia" and not recipe.base.image and recipe.cuda.version.count(".") == 1:
        toolkit = _newest_with_image(recipe, toolkit)
    # source: wheels installs the toolkit's own wheels unless torch (which pins its own) or an
    # imgbuild base (which has them) brings them; then the toolkit is one PyPI has wheels for.
    from_imgbuild_base = base is not None and not base.error and base.built_by_imgbuild
    wheel_set = None
    if recipe.cuda.source == "wheels" and not from_imgbuild_base and (not recipe.torch or recipe.cuda.flavor == "devel"):  # noqa: E501
        try:
            wheel_set = compat.cuda_wheel_set(recipe.cuda.version if recipe.cuda.version.count(".") == 2
                                              else toolkit.major_minor)
        except LookupError as exc:
            raise _gap(recipe, "cuda.version", exc, "cuda", recipe.cuda.version) from None
        toolkit = compat.resolve_cuda(wheel_set.toolkit)
    cuda = toolkit.version
    major = int(cuda.split(".")[0])
    floor = compat.minor_compat_floor(major)

    # --- cuDNN ---------------------------------------------------------------------
    cudnn = recipe.cuda.cudnn
    if cudnn is not None and recipe.cuda.source == "wheels":
        _check_wheel_cudnn(recipe, cuda, cudnn)
    elif cudnn is not None:
        available = compat.cudnn_versions(cuda)
        if cudnn.split(".")[0] not in available:
            raise _fail(recipe, "cuda.cudnn", "cudnn", cudnn, "cuda", cuda,
                        f"cuDNN {cudnn} is not published for CUDA {cuda} "
                        f"(available: {', '.join(available) or 'none'})",
                        hint=f"use cudnn: \"{available[-1]}\"" if available else "drop cuda.cudnn")

    # --- OS and Python ---------------------------------------------------------------
    os_name = detect_os(recipe)
    if os_name is None and base is not None and not base.error:
        os_name = base.labels.get("io.imgbuild.os")
    python = recipe.python
    py_image = _PYTHON_IMAGE.search(recipe.base.image or "")
    base_python = base.labels.get("io.imgbuild.python.version") if base is not None and not base.error else None
    if base_python:
        if base_python != python:
            raise _fail(recipe, "python", "python", python, "base.image", f"{base.ref} (python {base_python})",
                        f"the base image was built with Python {base_python}",
                        hint=f"use python: \"{base_python}\" or a base built for Python {python}")
        provider = "base"
    elif py_image:
        if py_image.group(2) != python:
            raise _fail(recipe, "python", "python", python, "base.image", recipe.base.image,
                        f"the image ships Python {py_image.group(2)}",
                        hint=f"use python: \"{py_image.group(2)}\" or a python:{python} image")
        provider = "image"
    elif os_name is None:
        raise _fail(recipe, "base.image", "base.image", recipe.base.image or "", "python", python,
                    "imgbuild cannot tell which OS (and so which Python) this image has",
                    hint="set base.os (e.g. debian12, ubuntu22.04) for this image")
    elif OS_PYTHON.get(os_name) == python:
        provider = "os"
    elif os_name.startswith("ubuntu"):
        provider = "deadsnakes"  # Ubuntu's PPA packages every maintained Python for each LTS
    else:
        raise _fail(recipe, "python", "python", python, "os", os_name,
                    f"{os_name} ships Python {OS_PYTHON.get(os_name, '?')} and no other",
                    hint=f"use python: \"{OS_PYTHON.get(os_name)}\", an Ubuntu base, or a python:{python} base image")

    # --- torch -----------------------------------------------------------------------
    torch_version = torch_variant = torch_index = None
    if recipe.torch:
        try:
            release = compat.torch_release(recipe.torch)
        except LookupError:
            known = [r.version for r in compat.torch_releases()]
            raise _fail(recipe, "torch", "torch", recipe.torch, "imgbuild's torch table", known[-1],
                        f"this torch release is unknown to the shipped data ({compat.data_as_of()}) and to the "
                        "look-up cache",
                        hint=_newest_hint("torch", known) + "; or plan without --offline, with the package index "
                        "reachable, to look a newer release up") from None
        if release.from_cache:
            warnings.append(RecipeWarning(
                codes.TORCH_FROM_INDEX, "torch",
                f"torch {release.version} is newer than imgbuild's shipped data: its CUDA variant, pins "
                f"and Python range come from the package index ({release.source}; cached in "
                f"{release.from_cache}); only its PyPI build ({release.pypi_variant}) is known"))
        torch_version = release.version
        wanted = "cu" + _mm(cuda).replace(".", "")
        if wanted not in release.variants:
            variants = sorted(release.variants, key=lambda v: Version(_variant_cuda(v)))
            newer = [r.version for r in compat.torch_releases() if wanted in r.variants]
            options = [f"cuda {_variant_cuda(v)}" for v in variants[-2:]]
            if newer:
                first = min(newer, key=Version)
                options.append(f"torch >= {first}" if Version(first) > Version(release.version) else f"torch {first}")
            raise _fail(recipe, "torch", "torch", release.version, "cuda", cuda,
                        f"torch {release.version} has CUDA wheels only for {' and '.join(variants)}",
                        hint="use " + " or ".join(options))
        if python not in release.python:
            raise _fail(recipe, "python", "torch", release.version, "python", python,
                        f"torch {release.version} publishes wheels for Python {release.python}",
                        hint="pick a Python in that range")
        torch_variant = wanted
        torch_cudnn = _torch_cudnn(release, wanted)
        if cudnn and recipe.cuda.source == "wheels" and torch_cudnn and torch_cudnn != cudnn.split(".")[0]:
            raise _fail(recipe, "cuda.cudnn", "cudnn", cudnn, "torch", f"{release.version}+{wanted}",
                        f"torch {release.version}+{wanted} pins cuDNN {torch_cudnn} wheels",
                        hint=f"use cudnn: \"{torch_cudnn}\" (or drop cuda.cudnn: torch brings its own)")
        # The Python registry's Linux wheel is one CUDA variant; take it from there when it is
        # the one wanted (it is the same build), else from PyTorch's per-CUDA index.
        if release.pypi_variant != wanted:
            torch_index = compat.torch_index_url(wanted)
        if recipe.cuda.source == "nvidia" and recipe.cuda.flavor != "base":
            warnings.append(RecipeWarning(
                codes.CUDA_TWICE, "torch",
                f"torch {release.version}+{wanted} brings its own CUDA libraries as nvidia-*-cu{major} wheels; "
                f"the nvidia/cuda {recipe.cuda.flavor} base carries them a second time (several GB). "
                "Use cuda.source: wheels (or flavor: base) unless you need the base's toolkit."))

    # --- flash-attn, bitsandbytes --------------------------------------------------------
    from_source = set(recipe.build.from_source)
    prebuilt: list[tuple[str, str]] = []
    archs = tuple(recipe.build.cuda_arch)
    try:
        supported_archs = compat.cuda_archs(cuda)
    except LookupError as exc:
        if archs:
            raise _gap(recipe, "build.cuda_arch", exc, "cuda", cuda) from None
        supported_archs = ()
    for i, arch in enumerate(archs):
        if arch.replace("+PTX", "") not in supported_archs:
            raise _fail(recipe, f"build.cuda_arch[{i}]", "cuda_arch", arch, "cuda", cuda,
                        f"nvcc {_mm(cuda)} targets {', '.join(supported_archs)}",
                        hint="drop that architecture or pick a CUDA that supports it")

    fa = _pin(recipe, "flash-attn")
    if fa:
        i, fa_version = fa
        key = f"pip[{i}]"
        try:
            rel = compat.flash_attn_release(fa_version)
        except LookupError:
            known = [r.version for r in compat.flash_attn_releases()]
            raise _fail(recipe, key, "flash-attn", fa_version, "imgbuild's flash-attn table", known[-1],
                        "this flash-attn release is unknown", hint=_newest_hint("flash-attn", known)) from None
        if not torch_version:
            raise _fail(recipe, key, "flash-attn", fa_version, "torch", "(none)",
                        "flash-attn builds against torch", hint="pin torch: in the recipe")
        if torch_version not in rel.torch:
            raise _fail(recipe, key, "flash-attn", fa_version, "torch", torch_version,
                        f"flash-attn {fa_version} supports torch {rel.torch}", hint="change one of the two pins")
        if cuda not in rel.cuda and _mm(cuda) not in rel.cuda:
            raise _fail(recipe, key, "flash-attn", fa_version, "cuda", cuda,
                        f"flash-attn {fa_version} supports CUDA {rel.cuda}", hint="change one of the two pins")
        if python not in rel.python:
            raise _fail(recipe, key, "flash-attn", fa_version, "python", python,
                        f"flash-attn {fa_version} supports Python {rel.python}")
        for j, arch in enumerate(archs):
            if compat.arch_base(arch) not in rel.archs:
                raise _fail(recipe, f"build.cuda_arch[{j}]", "flash-attn", fa_version, "cuda_arch", arch,
                            f"flash-attn {fa_version} runs on compute capabilities {', '.join(rel.archs)}",
                            hint="FlashAttention 2 needs Ampere (8.0) or newer")
        # The release wheels carry kernels for Ampere, Ada and Hopper only; Blackwell or other
        # targets need a source build with a new enough nvcc.
        beyond_wheels = [a for a in archs if compat.arch_base(a) not in FLASH_ATTN_WHEEL_ARCHS]
        wheel = None if ("flash-attn" in from_source or beyond_wheels) else compat.flash_attn_prebuilt(
            fa_version, cuda, _mm(torch_version), python)
        if wheel is None:
            from_source.add("flash-attn")
        else:
            prebuilt.append(("flash-attn", flash_attn_wheel_url(fa_version, wheel.cuda, _mm(torch_version), python,
                                                                torch_version)))

    bnb = _pin(recipe, "bitsandbytes")
    if bnb:
        i, bnb_version = bnb
        try:
            brel = compat.bitsandbytes_release(bnb_version)
        except LookupError:
            known = [r.version for r in compat.bitsandbytes_releases()]
            raise _fail(recipe, f"pip[{i}]", "bitsandbytes", bnb_version, "imgbuild's bitsandbytes table", known[-1],
                        "this bitsandbytes release is unknown", hint=_newest_hint("bitsandbytes", known)) from None
        if not _cuda_in(brel.cuda, cuda):
            raise _fail(recipe, f"pip[{i}]", "bitsandbytes", bnb_version, "cuda", cuda,
                        f"bitsandbytes {bnb_version} ships CUDA binaries for {_describe(brel.cuda)}",
                        hint="pick a CUDA it supports or another bitsandbytes release")
        if python not in brel.python:
            raise _fail(recipe, f"pip[{i}]", "bitsandbytes", bnb_version, "python", python,
                        f"bitsandbytes {bnb_version} supports Python {brel.python}")
        if torch_version and brel.torch and torch_version not in brel.torch:
            fits = [r.version for r in compat.bitsandbytes_releases() if torch_version in r.torch
                    and _cuda_in(r.cuda, cuda) and python in r.python]
            raise _fail(recipe, f"pip[{i}]", "bitsandbytes", bnb_version, "torch", torch_version,
                        f"bitsandbytes {bnb_version} requires torch {brel.torch}",
                        hint=(f"use bitsandbytes=={fits[-1]} (the newest that accepts torch {torch_version})"
                              if fits else f"use a torch in {brel.torch}"))
        cc_floor = brel.min_compute_capability
        for j, arch in enumerate(archs):
            cc = compat.arch_base(arch)
            if cc_floor and Version(cc) < Version(cc_floor):
                raise _fail(recipe, f"build.cuda_arch[{j}]", "bitsandbytes", bnb_version, "cuda_arch", arch,
                            f"bitsandbytes {bnb_version}'s PyPI wheel has kernels for compute capability {cc_floor} and newer",  # noqa: E501
                            hint=f"drop {arch} or build bitsandbytes from source")
            if brel.int8_compute_capability and Version(cc) < Version(brel.int8_compute_capability):
                warnings.append(RecipeWarning(
                    codes.BNB_INT8_ARCH, f"build.cuda_arch[{j}]",
                    f"bitsandbytes: LLM.int8() needs compute capability {brel.int8_compute_capability}+; "
                    f"on {arch} only 8-bit optimizers and NF4/FP4 quantization work"))

    if from_source and not archs:
        archs = tuple(a for a in DEFAULT_BUILD_ARCHS if a in supported_archs)

    # --- images --------------------------------------------------------------------
    builder_image = None
    builder_cuda_wheels: tuple[str, ...] = ()
    builder_home = None
    if recipe.cuda.source == "nvidia":
        if recipe.base.image:
            base_image = mirrored_ref(recipe.base.image, recipe.base.mirror)
        else:
            base_image = _nvidia_image(recipe, cuda, recipe.cuda.flavor, os_name)
        eol = compat.image_end_of_life(cuda)
        if eol:
            warnings.append(RecipeWarning(
                codes.EOL_IMAGE, "cuda.version",
                f"nvidia/cuda {cuda} images are past NVIDIA's support window and may be deleted "
                "from Docker Hub; mirror the tag (imgbuild mirror) or move to a supported CUDA"))
        needs_devel_builder = bool(from_source) and recipe.cuda.flavor != "devel"
        if from_source:
            builder_image = _nvidia_image(recipe, cuda, "devel", os_name) if needs_devel_builder else base_image
    else:
        base_image = mirrored_ref(recipe.base.image, recipe.base.mirror)
        if from_source:
            builder_image, builder_cuda_wheels, builder_home = _wheels_builder(recipe, cuda, os_name, base_image,
                                                                               from_source)

    if recipe.cuda.flavor == "devel" and not from_source and not recipe.runtime_compile:
        warnings.append(RecipeWarning(
            codes.DEVEL_WITHOUT_COMPILE, "cuda.flavor",
            "cuda.flavor devel ships nvcc, headers and static libraries (several GB) but this "
            "recipe compiles nothing at run time; use flavor: runtime (extensions still build "
            "in a devel stage)" if recipe.cuda.source == "nvidia" else
            "cuda.flavor devel installs nvcc, headers and the math libraries from wheels (GBs) but "
            "this recipe compiles nothing at run time; use flavor: runtime"))
    jit = sorted((pin[0], n) for n in JIT_PACKAGES if (pin := _pin(recipe, n)))
    if jit and not recipe.runtime_compile:
        warnings.append(RecipeWarning(
            codes.JIT_WITHOUT_RUNTIME_COMPILE, f"pip[{jit[0][0]}]",
            f"{', '.join(sorted(n for _, n in jit))} compile(s) CUDA kernels at run time, which needs nvcc and "
            "headers in the final image: set runtime_compile: true if you use that path"))
    if recipe.runtime_compile and recipe.cuda.source == "wheels" and recipe.cuda.flavor != "devel":
        # the cu11/cu12 nvidia-cuda-nvcc wheels hold ptxas only; CUDA 13's hold nvcc (flavor: devel)
        warnings.append(RecipeWarning(
            codes.RUNTIME_COMPILE_WITHOUT_NVCC, "runtime_compile",
            "runtime_compile with cuda.source: wheels needs nvcc in the image: use flavor: devel "
            "(CUDA 13+: nvcc from wheels) or source: nvidia with flavor: devel"))
    if recipe.runtime_compile and recipe.cuda.source == "nvidia" and recipe.cuda.flavor != "devel":
        warnings.append(RecipeWarning(
            codes.RUNTIME_COMPILE_WITHOUT_NVCC, "runtime_compile",
            "runtime_compile needs nvcc and headers: the final image must use flavor: devel"))

    base_digest = None
    if base is not None:
        base_image, base_digest = _check_base(recipe, base, cuda, torch_version, torch_variant, base_image, warnings)

    cuda_wheels, cuda_home = _final_cuda_wheels(recipe, wheel_set, cuda, cudnn, torch_version)

    return Resolution(
        cuda_version=cuda,
        cuda_flavor=recipe.cuda.flavor,
        cuda_source=recipe.cuda.source,
        min_driver=toolkit.linux_min_driver,
        min_driver_compat=floor,
        cudnn=cudnn,
        python=python,
        python_provider=provider,
        os=os_name,
        base_image=base_image,
        builder_image=builder_image,
        require_cuda=require_cuda(recipe, cuda, floor),
        torch=torch_version,
        torch_variant=torch_variant,
        torch_index_url=torch_index,
        cuda_wheels=cuda_wheels,
        cuda_wheel_home=cuda_home or (builder_home if recipe.cuda.source == "wheels" else None),
        builder_cuda_wheels=builder_cuda_wheels,
        compile=tuple(sorted(from_source)),
        prebuilt_urls=tuple(prebuilt),
        cuda_arch=archs,
        warnings=tuple(warnings),
        base_digest=base_digest,
    )


def _check_wheel_cudnn(recipe: Recipe, cuda: str, cudnn: str) -> None:
    """cuda.cudnn with source: wheels: an nvidia-cudnn wheel of that major must exist for the
    CUDA (installed by imgbuild, or pinned by torch, checked where torch resolves)."""
    try:
        compat.cudnn_wheel(cuda, cudnn)
    except LookupError as exc:
        raise _gap(recipe, "cuda.cudnn", exc, "cudnn", cudnn) from None


def _torch_cudnn(release, variant: str) -> str | None:
    """The cuDNN major the torch wheel of the Python registry pins (None: not recorded)."""
    if release.pypi_variant != variant:
        return None
    pins = [v for n, v in release.pypi_cuda_wheels.items() if n.startswith("nvidia-cudnn")]
    return pins[0].split(".")[0] if pins else None


def _final_cuda_wheels(recipe: Recipe, wheel_set, cuda: str, cudnn: str | None,
                       torch_version: str | None) -> tuple[tuple[str, ...], str | None]:
    """The nvidia-* pins the final stage installs, and the CUDA_HOME tree a devel flavor gets.
    Runtime/base: cudart (+ cuDNN and what it loads: cuBLAS, NVRTC). Devel: the toolkit's
    nvcc, headers and math libraries, where that CUDA's wheels carry nvcc (CUDA 13+)."""
    if wheel_set is None:
        return (), None
    extras = ["cudart"]
    home = None
    if recipe.cuda.flavor == "devel":
        try:
            extras = list(compat.devel_wheel_extras(cuda))
        except LookupError as exc:
            raise _gap(recipe, "cuda.flavor", exc, "cuda.flavor", "devel") from None
        home = compat.cuda_wheel_home(cuda)
    if torch_version and recipe.cuda.flavor != "devel":
        return (), None
    pins = list(wheel_set.pins(*extras))
    if cudnn and not torch_version:
        cw = compat.cudnn_wheel(cuda, cudnn)
        pins = sorted(set(pins) | {f"{cw.wheel}=={cw.version}"} | set(wheel_set.pins("cublas", "nvrtc")))
    return tuple(pins), home


def _wheels_builder(recipe: Recipe, cuda: str, os_name: str | None, base_image: str,
                    from_source: set[str]) -> tuple[str, tuple[str, ...], str | None]:
    """The compile stage of a source: wheels recipe: (FROM, nvcc wheels, CUDA_HOME). C/C++
    extensions build on the final image's OS with a compiler. CUDA extensions need nvcc of the
    same CUDA: NVIDIA's devel image where the OS has one, else the CUDA 13+ nvcc wheels on the
    same base; with neither, refuse before anything builds."""
    if not from_source & CUDA_KERNEL_PACKAGES:
        return base_image, (), None
    if os_name and os_name.startswith("ubuntu"):
        try:
            return _nvidia_image(recipe, cuda, "devel", os_name, any_patch=True), (), None
        except CompatibilityError:
            pass  # no devel image for that OS: try nvcc from wheels
    try:
        extras = compat.devel_wheel_extras(cuda)
        ws = compat.cuda_wheel_set(cuda)
    except LookupError as exc:
        names = ", ".join(sorted(from_source & CUDA_KERNEL_PACKAGES))
        raise _fail(recipe, "build.from_source" if recipe.build.from_source else "pip", names, "(source build)",
                    "cuda", cuda, f"{names} compiles CUDA kernels and needs nvcc {_mm(cuda)}: there is no nvidia/cuda "
                    f"devel image for {os_name or recipe.base.image}, and {exc}",
                    hint="use an Ubuntu base (the compile stage then uses nvidia/cuda's devel image), "
                         "cuda.source: nvidia, CUDA >= 13.0 (nvcc from wheels), or a prebuilt wheel") from None
    return base_image, ws.pins(*extras), compat.cuda_wheel_home(cuda)


def _check_base(recipe: Recipe, base, cuda: str, torch_version, torch_variant, base_image: str,
                warnings: list[RecipeWarning]) -> tuple[str, str | None]:
    """A base read from its registry: refuse one whose CUDA or torch contradicts the recipe,
    then pin it by digest."""
    if base.error:
        warnings.append(RecipeWarning(
            codes.BASE_UNREADABLE, "base.image",
            f"could not read {base.ref} from its registry ({base.error}); "
            "it is neither checked against this recipe nor pinned by digest"))
        return base_image, None
    base_cuda = base.labels.get("io.imgbuild.cuda.version") or base.env.get("CUDA_VERSION")
    if base_cuda and _mm(base_cuda) != _mm(cuda):
        what = "torch" if torch_version else "cuda"
        version = f"{torch_version}+{torch_variant}" if torch_version else cuda
        raise _fail(recipe, "base.image", "base.image", f"{base.ref} (CUDA {base_cuda})", what, version,
                    f"the base carries CUDA {base_cuda} but this recipe needs CUDA {_mm(cuda)}",
                    hint=f"use cuda.version \"{_mm(base_cuda)}\" or a base built for CUDA {_mm(cuda)}")
    base_torch = base.labels.get("io.imgbuild.torch.version")
    if base_torch and torch_version and base_torch != f"{torch_version}+{torch_variant}":
        raise _fail(recipe, "torch", "base.image", f"{base.ref} (torch {base_torch})", "torch",
                    f"{torch_version}+{torch_variant}", "the base already has another torch build",
                    hint=f"drop torch: from the recipe (the base has {base_torch}) or rebuild the base")
    return base.pinned, base.digest


def _newest_with_image(recipe: Recipe, newest):
    """For nvidia/cuda bases, "12.8" means the newest 12.8.x that NVIDIA published an image for."""
    same_line = [t for t in compat.toolkits() if _mm(t.version) == _mm(newest.version)]
    for toolkit in reversed(same_line):
        try:
            compat.cuda_image_tag(toolkit.version, recipe.cuda.flavor, recipe.cuda.cudnn, detect_os(recipe) or recipe.base.os)  # noqa: E501
        except LookupError:
            continue
        return toolkit
    return newest  # none has an image: the tag lookup later explains what exists


def require_cuda(recipe: Recipe, cuda: str, floor: str | None) -> str:
    """NVIDIA_REQUIRE_CUDA for the image: what the NVIDIA container runtime lets it start on.

    The runtime compares it with the CUDA version the host driver supports. A wheels image
    carries no cuda-compat package, so forward compatibility is out; minor-version
    compatibility (driver >= the major's floor) is in, because the CUDA user-space libraries
    of one major run on any driver of that major's floor. Code that JIT-compiles PTX at run
    time is the exception: PTX from a newer toolkit needs the newer driver.
    """
    major = cuda.split(".", maxsplit=1)[0]
    if recipe.cuda.source == "wheels":
        if floor is None or recipe.runtime_compile:
            return f"cuda>={_mm(cuda)}"
        return f"cuda>={major}.0"
    return f"cuda>={_mm(cuda)}"


def _nvidia_image(recipe: Recipe, cuda: str, flavor: str, os_name: str | None, *, any_patch: bool = False) -> str:
    """The nvidia/cuda image for that toolkit. any_patch: a compile stage may use another
    patch release of the same X.Y (nvcc X.Y.a output runs on the X.Y.b runtime)."""
    os_name = os_name or recipe.base.os
    candidates = [cuda]
    if any_patch:
        candidates += [t.version for t in reversed(compat.toolkits()) if _mm(t.version) == _mm(cuda) and t.version != cuda]  # noqa: E501
    first_error: LookupError | None = None
    for candidate in candidates:
        try:
            tag = compat.cuda_image_tag(candidate, flavor, recipe.cuda.cudnn, os_name)
            return mirrored_ref(f"nvidia/cuda:{tag}", recipe.base.mirror)
        except LookupError as exc:
            first_error = first_error or exc
    raise _fail(recipe, "base.os" if "os" in str(first_error).lower() else "cuda", "nvidia/cuda", cuda, "image",
                f"{flavor}/{os_name}/cudnn {recipe.cuda.cudnn or '-'}", str(first_error).strip("'\""),
                hint=f"available OSes: {', '.join(compat.cuda_image_oses(cuda))}")


def _cuda_in(supported, cuda: str) -> bool:
    if hasattr(supported, "contains"):
        return supported.contains(cuda) or supported.contains(_mm(cuda))
    return _mm(cuda) in supported or cuda in supported


def _describe(supported) -> str:
    return str(supported) if hasattr(supported, "contains") else ", ".join(supported)


def flash_attn_wheel_url(fa_version: str, wheel_cuda: str, torch_mm: str, python: str, torch_version: str) -> str:
    """The GitHub release wheel flash-attn's own setup.py would fetch for this combination."""
    # torch's Linux wheels switched to the C++11 ABI with 2.7 (manylinux_2_28 builds).
    abi = "TRUE" if Version(torch_version) >= Version("2.7") else "FALSE"
    cu = "cu" + wheel_cuda.replace(".", "")
    py = "cp" + python.replace(".", "")
    return (f"https://github.com/Dao-AILab/flash-attention/releases/download/v{fa_version}/"
            f"flash_attn-{fa_version}+{cu}torch{torch_mm}cxx11abi{abi}-{py}-{py}-linux_x86_64.whl")
