"""The images rule (the 8th of ``rules``): the final stage's FROM and the compile stage's, from the
nvidia/cuda tags images.json knows (and their end of life) or the CUDA wheels of wheels.json."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from buildkit_py import compat
from buildkit_py.compat import codes
from buildkit_py.compat.codes import RecipeWarning
from buildkit_py.compat.rules import Warnings, mirrored_ref, nvidia_image, refusal_at
from buildkit_py.errors import CompatibilityError
from buildkit_py.recipe.model import CudaFlavor, CudaSource, Recipe
from buildkit_py.versions import major_minor as _mm  # short: it sits in many messages


@dataclass(frozen=True)
class ImagesPart:
    base_image: str  # FROM of the final stage
    builder_image: str | None  # FROM of the compile stage, when one is needed
    builder_cuda_wheels: tuple[str, ...] = ()  # nvcc and headers from wheels for the compile stage
    builder_home: str | None = None  # CUDA_HOME of those wheels
    warnings: Warnings = ()


def images_rule(recipe: Recipe, cuda: str, os_name: str | None, compile_: frozenset[str], *,
                today: datetime.date) -> ImagesPart:
    """The final stage's FROM (base.image, or NVIDIA's image for the toolkit, under base.mirror)
    and, when something compiles, the compile stage's; a warning when NVIDIA's support policy has
    put that image past its end of life on ``today`` (the caller's date: no clock read here)."""
    if recipe.base.image:  # always set with source: wheels (the recipe loader requires it)
        base_image = mirrored_ref(recipe.base.image, recipe.base.mirror)
    else:
        base_image = nvidia_image(recipe, cuda, recipe.cuda.flavor, os_name)
    if recipe.cuda.source != CudaSource.NVIDIA:
        if not compile_:
            return ImagesPart(base_image, None)
        builder, wheels, home = _wheels_builder(recipe, cuda, os_name, base_image, compile_)
        return ImagesPart(base_image, builder, wheels, home)
    builder_image = None
    if compile_:
        needs_devel = recipe.cuda.flavor != CudaFlavor.DEVEL
        builder_image = nvidia_image(recipe, cuda, "devel", os_name) if needs_devel else base_image
    warnings: Warnings = ()
    eol = compat.image_end_of_life(cuda, today)
    pulls_nvidia = not recipe.base.image or builder_image not in (None, base_image)
    if eol is not None and pulls_nvidia:
        gone = f" from {eol.deletion}" if eol.deletion else ""
        warnings = (RecipeWarning(
            codes.EOL_IMAGE, "cuda.version",
            f"nvidia/cuda {cuda} images reached end of life on {eol.date} ({eol.why}); NVIDIA's policy "
            f"deletes them from Docker Hub{gone}",
            hint="mirror the tag (imgbuild mirror) or move to a supported CUDA"),)
    return ImagesPart(base_image, builder_image, warnings=warnings)


def _wheels_builder(recipe: Recipe, cuda: str, os_name: str | None, base_image: str,
                    from_source: frozenset[str]) -> tuple[str, tuple[str, ...], str | None]:
    """The compile stage of a source: wheels recipe: (FROM, nvcc wheels, CUDA_HOME). Every package
    built from source gets NVIDIA's devel toolchain of the same CUDA (nvcc, headers, the math
    libraries): whether a package's build compiles CUDA code (pycuda's does; a list of known ones
    would miss the next) is not something imgbuild can tell from outside, and the cuda.arch label
    promises what was compiled for. NVIDIA's devel image where the OS has one, else the CUDA 13+
    nvcc wheels on the same base; with neither, refuse before anything builds."""
    if os_name and os_name.startswith("ubuntu"):
        try:
            return nvidia_image(recipe, cuda, "devel", os_name, any_patch=True), (), None
        except CompatibilityError:
            pass  # no devel image for that OS: try nvcc from wheels
    try:
        extras = compat.tier_extras("devel", cuda)
        ws = compat.cuda_wheel_set(cuda)
    except LookupError as exc:
        names = ", ".join(sorted(from_source))
        raise refusal_at(recipe, "build.from_source" if recipe.build.from_source else "pip", names, "(source build)",
                         "cuda", cuda, f"a source build gets the CUDA {_mm(cuda)} devel toolchain (nvcc, headers), and "
                         f"there is no nvidia/cuda devel image for {os_name or recipe.base.image}, and {exc}",
                         hint="use an Ubuntu base (the compile stage then uses nvidia/cuda's devel image), "
                         "cuda.source: nvidia, CUDA >= 13.0 (nvcc from wheels), or the package's wheel "
                         "(drop it from build.from_source)") from None
    return base_image, ws.pins(*extras), compat.cuda_wheel_home(cuda)
