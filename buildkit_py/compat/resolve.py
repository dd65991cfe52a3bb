"""Recipe pins -> a ``Resolution``: what fits together, or a CompatibilityError that says why not.

``resolve`` composes the rules listed in ``compat.rules`` (one per component: CUDA, cuDNN, OS and
Python, torch, architectures, flash-attn, bitsandbytes, images, flavor, the base's facts, CUDA
wheels; each family in its subject's module) in order and gathers their warnings; the version
knowledge comes from the sourced tables in ``compat``.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from packaging.utils import canonicalize_name
from packaging.version import Version

from buildkit_py import compat
from buildkit_py.compat import (
    base_rule,
    bitsandbytes_rule,
    cuda_rule,
    cuda_wheels,
    flash_attn_rule,
    image_rule,
    platforms,
    rules,
    torch_rule,
    wheel_contents,
)
from buildkit_py.compat.bases import BaseFacts
from buildkit_py.compat.codes import RecipeWarning
from buildkit_py.compat.cuda_pins import cuda_pins_rule
from buildkit_py.compat.cudnn_source import cudnn_pins_rule, cudnn_source
from buildkit_py.compat.floors import DriverFloor
from buildkit_py.compat.gpu_fit import gpus_rule
from buildkit_py.compat.tables import NativeEvidence
from buildkit_py.errors import CompatibilityError, CompatibilityErrors
from buildkit_py.recipe.model import CudaFlavor, CudaSource, Recipe, pin_name
from buildkit_py.versions import major_minor

_T = TypeVar("_T")

# Pins whose wheels are large and change rarely: they get a layer of their own, before
# the other pins, so a change to a small pin does not re-download them.
HEAVY_PACKAGES = frozenset({
    "flash-attn", "flash_attn", "bitsandbytes", "xformers", "vllm", "triton", "deepspeed",
    "tensorflow", "jax", "jaxlib", "onnxruntime-gpu", "tensorrt", "cupy-cuda12x", "cupy-cuda11x",
})


@dataclass(frozen=True)
class Resolution:
    cuda_version: str  # full toolkit version, e.g. 12.4.1
    cuda_flavor: CudaFlavor
    cuda_source: CudaSource
    min_driver: str | None  # the native floor; None where NVIDIA publishes none for the minor
    min_driver_compat: str | None
    cudnn: str | None  # io.imgbuild.cudnn.version: the cuDNN the pins bring (compat.cudnn_source)
    python: str
    python_provider: rules.PythonProvider
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
    # Where the native floor is unpublished: the lowest driver known to run it natively, and why
    native_driver: NativeEvidence | None = None
    cudnn_origin: str | None = None  # where the cuDNN comes from, in words (plan shows it)
    # what the compile stage's source builds must be told to compile cuda_arch and no more
    # (FLASH_ATTN_CUDA_ARCHS: flash-attn reads its own setting, not TORCH_CUDA_ARCH_LIST)
    build_env: tuple[tuple[str, str], ...] = ()
    # what the from-source builds compile, as io.imgbuild.cuda.arch says it ("8.0;9.0+PTX"): each
    # package's own list (flash-attn's gencodes), which may differ from cuda_arch; () when none compiles
    compiled_arch: tuple[str, ...] = ()
    # the CUDA libraries the image's wheels bring, read from their recorded contents (compat/wheel_contents.py):
    # the model the cuda.* and cudnn labels are checked against
    image_cuda: wheel_contents.ImageCuda | None = None

    @property
    def driver_floor(self) -> DriverFloor:
        """The floors above as compat.floors gives them (what the labels stamp and check reads)."""
        return DriverFloor(self.cuda_version, self.min_driver, self.min_driver_compat, self.native_driver)

    @property
    def cuda_major_minor(self) -> str:
        return major_minor(self.cuda_version)

    @property
    def compile_stage_base(self) -> str:
        """FROM of the compile stage; resolve() sets builder_image whenever it sets compile."""
        if self.builder_image is None:
            raise ValueError("this resolution has no compile stage")
        return self.builder_image

    @property
    def torch_label(self) -> str | None:
        if not self.torch:
            return None
        return f"{self.torch}+{self.torch_variant}" if self.torch_variant else self.torch


def resolve(recipe: Recipe, base: BaseFacts | None = None, looked_up: rules.LookedUp | None = None, *,
            today: datetime.date) -> Resolution:
    """A pure function of its arguments: the same recipe and facts give the same resolution, with no
    registry, index, home folder or clock read here (``today`` dates NVIDIA's image end of
    life). ``base``: the facts of the final stage's base read
    from its registry (pipeline.bases), or None where it is not looked up; ``looked_up``: what the
    plan-time look-up found beyond the shipped data (torch releases newer than it) and did. Each
    rule gets what the rules before it decided; the rules that do not depend on each other all
    run, so every independent problem is reported at once."""
    looked_up = looked_up or rules.LookedUp()
    cuda, cudnn, py, torch, archs = _independent_parts(recipe, base, looked_up)
    flash_attn, bnb_warnings = _pin_parts(recipe, cuda, py, torch, archs)
    compile_ = frozenset(recipe.build.from_source) | flash_attn.compile
    images = image_rule.images_rule(recipe, cuda.version, py.os, compile_, today=today)
    flavor_warnings = rules.flavor_rule(recipe, compile_)
    pinned = base_rule.base_rule(recipe, base, cuda.version, torch, images.base_image)
    wheels = cuda_wheels.cuda_wheels_rule(recipe, cuda.wheel_set, cuda.version, cudnn, torch, base)
    # the label names the cuDNN the pins bring, written in the recipe or not (issue 28)
    cudnn_from = cudnn_source(recipe, cuda.version, torch, base, images.base_image, wheels.pins)
    image_cuda = _image_cuda(recipe, torch, wheels.pins, base, py.python, looked_up.wheels)
    _cuda_minor_rule(recipe, image_cuda, cuda.version)
    arch_list = archs.for_build(bool(compile_))
    if recipe.multi_platform:  # each pin, for each platform: refused before building
        torch_cuda = torch.release.variants.get(torch.variant) if torch.release and torch.variant else None
        problems: list[CompatibilityError] = []
        _attempt(problems, platforms.platforms_rule, recipe, cuda=cuda.version, cuda_wheels=wheels.pins,
                 torch=torch.version, torch_cuda=torch_cuda, compile_=tuple(sorted(compile_)), python=py.python,
                 base=base)
        _attempt(problems, platforms.untabled_pins_rule, recipe, tuple(sorted(compile_)), looked_up.pin_files)
        if problems:
            raise _all_of(problems)
    res = Resolution(
        cuda_version=cuda.version,
        cuda_flavor=recipe.cuda.flavor,
        cuda_source=recipe.cuda.source,
        min_driver=cuda.floor.native,
        min_driver_compat=cuda.floor.minor_compat,
        cudnn=cudnn_from.label if cudnn_from else None,
        cudnn_origin=cudnn_from.origin if cudnn_from else None,
        python=py.python,
        python_provider=py.provider,
        os=py.os,
        base_image=pinned.base_image,
        builder_image=images.builder_image,
        require_cuda=cuda_rule.require_cuda(recipe, cuda.version, cuda.floor.minor_compat),
        torch=torch.version,
        torch_variant=torch.variant,
        torch_index_url=torch.index_url,
        cuda_wheels=wheels.pins,
        cuda_wheel_home=wheels.home or (images.builder_home if recipe.cuda.source == CudaSource.WHEELS else None),
        builder_cuda_wheels=images.builder_cuda_wheels,
        compile=tuple(sorted(compile_)),
        prebuilt_urls=flash_attn.prebuilt,
        cuda_arch=arch_list,
        build_env=_build_env(recipe, compile_, arch_list, cuda.version),
        compiled_arch=_compiled_arch(recipe, compile_, arch_list, cuda.version),
        warnings=torch.warnings + bnb_warnings + images.warnings + flavor_warnings + pinned.warnings,
        base_digest=pinned.digest,
        native_driver=cuda.floor.evidence,
        image_cuda=image_cuda,
    )
    if not recipe.gpus:
        return res
    _, gpu_warnings = gpus_rule(recipe, res)  # what it installs against the GPUs it names: refused here
    return replace(res, warnings=res.warnings + gpu_warnings)


def _image_cuda(recipe: Recipe, torch: torch_rule.TorchPart, cuda_wheels: tuple[str, ...], base: BaseFacts | None,
                python: str, read_live: tuple[wheel_contents.WheelContents, ...] = ()) -> wheel_contents.ImageCuda:
    """The image's CUDA libraries from the content model, and the rule over them: a ``source: wheels``
    image must get a CUDA runtime any package can load (a large torch wheel keeps its own in torch/lib,
    where bitsandbytes does not find it), unless an imgbuild base brings one."""
    row = compat.torch_wheel(torch.release, torch.variant) if torch.release and torch.variant else None
    pins = cuda_wheels + tuple(spec.replace(" ", "") for spec in recipe.pip if "==" in spec)
    image = wheel_contents.image_cuda(pins, row, python=major_minor(python),
                                      m=wheel_contents.model().with_rows(read_live))
    if row is None and torch.label:  # a build of PyTorch's own index the data does not record: partial
        image = dataclasses.replace(image, unread=(*image.unread, f"torch=={torch.label}"))
    from_base = base is not None and base.built_by_imgbuild
    if (recipe.cuda.source == CudaSource.WHEELS and not from_base and not image.partial
            and "cudart" not in image.loadable):
        where = f" ({', '.join(sorted(image.private))} only inside torch/lib)" if image.private else ""
        raise rules.refusal_at(recipe, "cuda.source", "cuda.source", "wheels", "torch", torch.label or "",
                               f"the image's wheels would bring no CUDA runtime another package can load{where}",
                               hint="use cuda.source: nvidia")
    return image


def _cuda_minor_rule(recipe: Recipe, image: wheel_contents.ImageCuda, cuda: str) -> None:
    """Every CUDA runtime wheel in the image must be of the recipe's CUDA minor, or the cuda.version
    label names a CUDA the image does not load: a pip pin of nvidia-cuda-runtime of another minor (one
    wheels.json does not record, read live) is refused at its key, with the runtime of the image's CUDA."""
    mm = major_minor(cuda)
    other = sorted(image.cuda_minors - {mm}, key=Version)
    if not other:
        return
    versions = [v for v in image.cudart if not v.startswith(mm + ".")]
    for i, spec in enumerate(recipe.pip):
        name, _, version = spec.replace(" ", "").partition("==")
        if version in versions and canonicalize_name(name).startswith("nvidia-cuda-runtime"):
            try:
                want = compat.cuda_wheel_set(cuda).pins("cudart")
            except LookupError:
                want = ()
            hint = f"use {want[0]} (CUDA {mm}'s) or drop pip[{i}]" if want else f"drop pip[{i}]"
            raise rules.refusal_at(recipe, f"pip[{i}]", canonicalize_name(name), version, "cuda", cuda,
                                   f"{canonicalize_name(name)} {version} is the CUDA {major_minor(version)} "
                                   f"runtime (its wheel's version), and the image's CUDA is {mm}", hint=hint)
    raise rules.refusal_at(recipe, "cuda.version", "cuda", cuda, "cudart", ", ".join(versions),
                           f"the image's wheels bring the CUDA {', '.join(other)} runtime ({', '.join(versions)}) "
                           f"beside CUDA {mm}'s", hint=f'use cuda.version "{other[-1]}"')


def _attempt(problems: list[CompatibilityError], rule: Callable[..., _T], *args: Any, **kwargs: Any) -> _T | None:
    """``rule(*args, **kwargs)``, or None with its CompatibilityError added to ``problems``: rules that
    do not depend on each other all run, and every problem is reported at once."""
    try:
        return rule(*args, **kwargs)
    except CompatibilityError as exc:
        problems.append(exc)
        return None


def _build_env(recipe: Recipe, compile_: frozenset[str], archs: tuple[str, ...],
               cuda: str) -> tuple[tuple[str, str], ...]:
    """The settings a from-source package reads for its architectures besides TORCH_CUDA_ARCH_LIST, so
    that io.imgbuild.cuda.arch says what it compiled (flash-attn's FLASH_ATTN_CUDA_ARCHS)."""
    if "flash-attn" not in compile_:
        return ()
    return compat.flash_attn_build_env(_pinned_version(recipe, "flash-attn"), archs, cuda)


def _pinned_version(recipe: Recipe, name: str) -> str:
    return next(spec.split("==", 1)[1] for spec in recipe.pip if pin_name(spec) == name)


def _compiled_arch(recipe: Recipe, compile_: frozenset[str], archs: tuple[str, ...],
                   cuda: str) -> tuple[str, ...]:
    """What the compile stage's builds put into the image, together: flash-attn its gencodes for
    ``archs`` (compat.flash_attn_compiled: SASS only), every other package TORCH_CUDA_ARCH_LIST as
    torch's cpp_extension reads it (``+PTX`` adds the PTX of that arch). The default image test
    reads the kernels back and holds the label to them (analysis.image_checks)."""
    sass: set[str] = set()
    ptx: set[str] = set()
    for name in compile_:
        if name == "flash-attn":
            sass.update(compat.flash_attn_compiled(_pinned_version(recipe, "flash-attn"), archs, cuda))
            continue
        for arch in archs:
            sass.add(arch.replace("+PTX", ""))
            if arch.endswith("+PTX"):
                ptx.add(arch.replace("+PTX", ""))
    return tuple(a + ("+PTX" if a in ptx else "") for a in sorted(sass, key=_arch_order))


def _arch_order(arch: str) -> tuple[int, int, str]:
    major, _, rest = arch.partition(".")
    minor = rest.rstrip("af")
    return int(major), int(minor), rest[len(minor):]


def _all_of(problems: list[CompatibilityError]) -> CompatibilityError:
    """One error for several, each listed once (a CompatibilityErrors' own errors are taken apart)."""
    flat = [e for p in problems for e in (p.errors if isinstance(p, CompatibilityErrors) else [p])]
    return flat[0] if len(flat) == 1 else CompatibilityErrors(flat)


def _pin_parts(recipe: Recipe, cuda: cuda_rule.CudaPart, py: rules.PythonPart, torch: torch_rule.TorchPart,
               archs: rules.ArchPart) -> tuple[flash_attn_rule.FlashAttnPart, tuple[RecipeWarning, ...]]:
    """The rules of the pip pins (flash-attn, bitsandbytes, CUDA library wheels, cuDNN against torch):
    each needs only CUDA, Python, torch and the architectures, so all run and every problem they find
    is raised together (a cuDNN clash, a flash-attn torch floor and a bitsandbytes one in one run)."""
    problems: list[CompatibilityError] = []
    flash_attn = _attempt(problems, flash_attn_rule.flash_attn_rule, recipe, cuda.version, py.python, torch.version,
                          archs.requested)
    bnb_warnings = _attempt(problems, bitsandbytes_rule.bitsandbytes_rule, recipe, cuda.version, py.python,
                            torch.version, archs.requested)
    _attempt(problems, cuda_pins_rule, recipe, cuda.version, torch)
    _attempt(problems, cudnn_pins_rule, recipe, torch)
    _attempt(problems, source_builds_rule, recipe)
    if problems:
        raise _all_of(problems)
    assert flash_attn is not None and bnb_warnings is not None  # noqa: S101  (no problem: each returned its part)
    return flash_attn, bnb_warnings


def source_builds_rule(recipe: Recipe) -> None:
    """A ``build.from_source`` package is built from its release's sdist (``pip wheel --no-binary``):
    a pinned release the content model records without one cannot be built, so the plan refuses it
    instead of the build failing (bitsandbytes publishes wheels only after 0.42.0). A release the
    model has no row of is left to the build."""
    problems: list[CompatibilityError] = []
    for i, name in enumerate(recipe.build.from_source):
        pin = next((spec.split("==", 1)[1] for spec in recipe.pip if pin_name(spec) == canonicalize_name(name)
                    and "==" in spec), None)
        if pin is None or wheel_contents.model().has_sdist(name, pin) is not False:
            continue
        files = wheel_contents.model().pin_files(name)
        assert files is not None  # noqa: S101  (the model has a row of this release)
        with_sdist = [v for v, _, sdist in files.releases if sdist]
        newest = f"; its newest release with an sdist is {with_sdist[-1]}" if with_sdist else ""
        problems.append(rules.refusal_at(
            recipe, f"build.from_source[{i}]", name, pin, "build", "from source",
            f"{name} {pin} has no source distribution on the package index ({files.source}): pip cannot "
            "build it, only install its wheels",
            hint=f"drop {name} from build.from_source (its wheel is installed instead){newest}"))
    if problems:
        raise _all_of(problems)


def release_checks(recipe: Recipe, looked_up: rules.LookedUp | None = None) -> list[tuple[Any, tuple[Any, ...]]]:
    """The checks that a pinned torch, flash-attn or bitsandbytes is a release the data knows, each
    (function, extra args): they need nothing else decided, so resolve runs them beside the CUDA and
    Python rules and reports every unknown pin at once."""
    checks: list[tuple[Any, tuple[Any, ...]]] = []
    if recipe.torch:
        checks.append((torch_rule.torch_release_rule, (looked_up,)))
    for name, table, fits in (("flash-attn", compat.flash_attn_releases, flash_attn_rule.fa_fits),
                              ("bitsandbytes", compat.bitsandbytes_releases, bitsandbytes_rule.bnb_fits)):
        if (pin := rules.pip_pin(recipe, name)) is not None:
            checks.append((rules.known_release, (f"pip[{pin[0]}]", name, pin[1], table, fits)))
    return checks


def _independent_parts(recipe: Recipe, base: BaseFacts | None, looked_up: rules.LookedUp) -> tuple[
        cuda_rule.CudaPart, str | None, rules.PythonPart, torch_rule.TorchPart, rules.ArchPart]:
    """CUDA, cuDNN, Python, torch and the architectures: each rule runs when what it needs was decided,
    and every problem found is raised together (CompatibilityErrors), not the first one alone."""
    problems: list[CompatibilityError] = []

    def attempt(rule: Callable[..., _T], *args: Any) -> _T | None:
        return _attempt(problems, rule, *args)

    cuda = attempt(cuda_rule.cuda_rule, recipe, base)
    py = attempt(rules.python_rule, recipe, base)
    # every pin of a release the data lacks, not only the first (a list: all() would stop at one)
    checks = release_checks(recipe, looked_up)
    known = all([attempt(check, recipe, *extra) is not None for check, extra in checks])
    cudnn = attempt(rules.cudnn_rule, recipe, cuda.version) if cuda else None
    archs = attempt(rules.arch_rule, recipe, cuda.version) if cuda else None
    torch = None
    if cuda and py and known and not problems:
        torch = attempt(torch_rule.torch_rule, recipe, cuda.version, py.python, looked_up)
    if problems:
        raise _all_of(problems)
    # no problem: every rule ran and gave its part (cudnn alone may be None: no cuDNN asked for)
    assert cuda is not None and py is not None and torch is not None and archs is not None  # noqa: S101
    return cuda, cudnn, py, torch, archs
