"""The CUDA rule (the 1st of ``rules``): cuda.version -> the toolkit (the newest patch with the recipe's
image, a base's own, or the one PyPI has wheels for), its driver floors, and NVIDIA_REQUIRE_CUDA; the
toolkit and driver data it reads is compat/tables.py and compat/floors.py."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

from buildkit_py import compat
from buildkit_py.compat import cuda_base
from buildkit_py.compat.bases import BaseFacts
from buildkit_py.compat.floors import DriverFloor
from buildkit_py.compat.rules import (
    cudnn_unsupported,
    data_gap,
    detect_os,
    image_gap_refusal,
    mirrored_ref,
    nvidia_image_os,
    refusal_at,
)
from buildkit_py.compat.tables import Toolkit, WheelSet
from buildkit_py.errors import CompatibilityError
from buildkit_py.recipe.model import CudaFlavor, CudaSource, Recipe
from buildkit_py.versions import major_minor as _mm  # short: it sits in many messages


@dataclass(frozen=True)
class CudaPart:
    toolkit: Toolkit
    wheel_set: WheelSet | None  # the toolkit's own wheels, where the final stage installs them
    floor: DriverFloor  # the toolkit's driver floors (compat.floors, their one home)

    @property
    def version(self) -> str:
        return self.toolkit.version


def require_cuda(recipe: Recipe, cuda: str, floor: str | None) -> str:
    """NVIDIA_REQUIRE_CUDA for the image: what the NVIDIA container runtime lets it start on.

    The runtime compares it with the CUDA version the host driver supports. A wheels image
    carries no cuda-compat package, so forward compatibility is out; minor-version
    compatibility (driver >= the major's floor) is in, because the CUDA user-space libraries
    of one major run on any driver of that major's floor. Code that JIT-compiles PTX at run
    time is the exception: PTX from a newer toolkit needs the newer driver.
    """
    major = cuda.split(".", maxsplit=1)[0]
    if recipe.cuda.source == CudaSource.WHEELS and floor is not None and not recipe.runtime_compile:
        return f"cuda>={major}.0"
    return f"cuda>={_mm(cuda)}"


def cuda_rule(recipe: Recipe, base: BaseFacts | None) -> CudaPart:
    """cuda.version -> the toolkit. ``source: wheels`` installs the toolkit's own wheels unless
    torch (which pins its own) or an imgbuild base (which has them) brings them; then the
    toolkit is one PyPI has wheels for."""
    try:
        toolkit = compat.resolve_cuda(recipe.cuda.version)
    except LookupError as exc:
        raise data_gap(recipe, "cuda.version", exc, "cuda", recipe.cuda.version,
                       hint=_imaged_cuda_hint(recipe)) from None
    exact = recipe.cuda.version.count(".") == 2
    if recipe.cuda.cudnn and not compat.cudnn_supported(toolkit.version, recipe.cuda.cudnn):
        # before any image or wheel is looked for: one answer for both sources (cudnn_rule)
        raise cudnn_unsupported(recipe, recipe.cuda.cudnn, toolkit.version)
    if recipe.cuda.source == CudaSource.NVIDIA and not recipe.base.image and not exact:
        toolkit = _newest_with_image(recipe, toolkit)
    if recipe.cuda.source == CudaSource.NVIDIA and recipe.base.image:
        toolkit = _nvidia_base_toolkit(recipe, base, toolkit)
    from_imgbuild_base = (facts := base) is not None and facts.built_by_imgbuild
    brought = from_imgbuild_base or (_torch_brings_cuda_wheels(recipe, toolkit.major_minor)
                                     and recipe.cuda.flavor != CudaFlavor.DEVEL)
    wheel_set = None
    if recipe.cuda.source == CudaSource.WHEELS:
        try:
            wheel_set = compat.cuda_wheel_set(recipe.cuda.version if exact else toolkit.major_minor)
        except LookupError as exc:
            if not brought:  # else cuda_wheels_rule refuses only if the tier needs more than torch/the base has
                raise data_gap(recipe, "cuda.version", exc, "cuda", recipe.cuda.version) from None
        if wheel_set is not None and not brought:
            toolkit = compat.resolve_cuda(wheel_set.toolkit)
    return CudaPart(toolkit, wheel_set, compat.driver_floor(toolkit.version))


def _imaged_cuda_hint(recipe: Recipe) -> str | None:
    """For a CUDA the data does not know, where imgbuild picks the nvidia/cuda tag: the nearest released
    minor NVIDIA publishes the recipe's image for (the newest release may have none on that OS). None
    where the recipe names its base, or no CUDA has that image: the look-up's own hint serves."""
    if recipe.cuda.source != CudaSource.NVIDIA or recipe.base.image:
        return None
    minors = sorted({t.major_minor for t in compat.toolkits()}, key=Version)
    fits = [m for m in minors if nvidia_image_os(recipe, m) == recipe.base.os]
    if not fits:
        return None
    nearest = compat.nearest_versions(recipe.cuda.version, fits, n=1)[0]
    return (f'use a released CUDA toolkit, e.g. "{nearest}" (the nearest with an nvidia/cuda {recipe.cuda.flavor} '
            f"image on {recipe.base.os})")


def _torch_brings_cuda_wheels(recipe: Recipe, cuda: str) -> bool:
    """Does the torch pin bring CUDA as nvidia-* wheels other packages load too? Not a large wheel
    (compat.torch_bundles_cuda: its CUDA sits in torch/lib); an unknown release is torch_rule's to refuse."""
    if not recipe.torch:
        return False
    try:
        release = compat.torch_release(recipe.torch)
    except LookupError:
        return True
    return not compat.torch_bundles_cuda(release, "cu" + _mm(cuda).replace(".", ""))


def _nvidia_base_toolkit(recipe: Recipe, base: BaseFacts | None, wanted: Toolkit) -> Toolkit:
    """``source: nvidia`` on a named base: nothing installs CUDA, so the base must carry the recipe's
    CUDA, flavor and cuDNN, read from its nvidia/cuda tag or its config. The toolkit is then the
    base's own release (the labels name what is inside), never a guess."""
    image = recipe.base.image or ""
    facts = cuda_base.from_tag(image) or cuda_base.from_tag(mirrored_ref(image, recipe.base.mirror))
    if facts is None and (read := base) is not None:
        facts = cuda_base.from_config(read.labels, read.env)
    if facts is None or facts.cuda is None:
        raise _not_a_cuda_base(recipe, image, base, facts)
    if _mm(facts.cuda) != wanted.major_minor or (recipe.cuda.version.count(".") == 2 and facts.cuda.count(".") == 2
                                                  and facts.cuda != wanted.version):
        raise refusal_at(recipe, "cuda.version", "cuda", recipe.cuda.version, "base.image",
                         f"{image} (CUDA {facts.cuda})",
                         f"with source: nvidia the CUDA is the base's, and {image} carries CUDA {facts.cuda} "
                         f"({facts.evidence})", hint=f'use cuda.version "{facts.cuda}" or a base with CUDA '
                                                f"{recipe.cuda.version}")
    if facts.flavor != recipe.cuda.flavor:
        raise refusal_at(recipe, "cuda.flavor", "cuda.flavor", recipe.cuda.flavor, "base.image",
                         f"{image} ({facts.flavor or 'flavor unknown'})",
                         f"with source: nvidia the image carries the base's CUDA tier, and {image} is "
                         + (f"the {facts.flavor} tier ({facts.evidence})" if facts.flavor else
                            f"of a tier imgbuild cannot tell ({facts.evidence})"),
                         hint=f"use cuda.flavor: {facts.flavor}" if facts.flavor else
                         "use an nvidia/cuda tag or an imgbuild base, which say their tier")
    cudnn = recipe.cuda.cudnn
    base_cudnn = facts.cudnn
    if base_cudnn == "":  # a bare "cudnn" tag: the major NVIDIA publishes for that CUDA, when only one
        majors = compat.cudnn_versions(facts.cuda)
        base_cudnn = majors[0] if len(majors) == 1 else None
    if cudnn and base_cudnn != cudnn.split(".", maxsplit=1)[0]:
        carries = (f"cuDNN {base_cudnn}" if base_cudnn else "a cuDNN of a major imgbuild cannot tell"
                   if facts.cudnn == "" else "no cuDNN")
        raise refusal_at(recipe, "cuda.cudnn", "cudnn", cudnn, "base.image", image,
                         f"with source: nvidia cuDNN comes from the base, and {image} carries {carries} "
                         f"({facts.evidence})",
                         hint=f'use cudnn: "{base_cudnn}"' if base_cudnn else
                         "drop cuda.cudnn or use a base with that cuDNN (an nvidia/cuda cudnn tag)")
    if facts.cuda.count(".") < 2:
        return wanted
    try:
        return compat.resolve_cuda(facts.cuda)
    except LookupError as exc:
        raise data_gap(recipe, "base.image", exc, "cuda", facts.cuda) from None


def _not_a_cuda_base(recipe: Recipe, image: str, base: BaseFacts | None,
                     facts: cuda_base.CudaBase | None) -> CompatibilityError:
    if facts is not None:
        why = f"it carries no CUDA: {facts.evidence}"
    elif cuda_base.plain_os_image(image):
        why = "it is a plain OS image: nothing in it or in the recipe installs CUDA"
    else:
        why = "it is not an nvidia/cuda tag and its config was not read, so its CUDA cannot be checked"
    return refusal_at(recipe, "base.image", "base.image", image, "cuda.source", "nvidia",
                      f"source: nvidia takes CUDA from the base image, and {why}",
                      hint="use cuda.source: wheels (CUDA from NVIDIA's wheels on this base), drop base.image "
                      "(imgbuild picks the nvidia/cuda tag), or name an nvidia/cuda tag or a CUDA base in a "
                      "registry imgbuild can read")


def _newest_with_image(recipe: Recipe, newest: Toolkit) -> Toolkit:
    """For nvidia/cuda bases, "12.8" means the newest 12.8.x that NVIDIA published this image for
    (flavor, cuDNN and the recipe's OS); none: refuse, naming the OSes that minor has and the newest
    release for this OS."""
    os_name = detect_os(recipe) or recipe.base.os
    try:
        release = compat.image_release(newest.major_minor, recipe.cuda.flavor, recipe.cuda.cudnn, os_name)
    except compat.ImageGap as gap:
        raise image_gap_refusal(recipe, gap, recipe.cuda.version, os_name) from None
    return compat.resolve_cuda(release)
