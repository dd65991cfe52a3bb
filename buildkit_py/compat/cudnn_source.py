"""Which cuDNN an image gets, and from which pin: the io.imgbuild.cudnn.version label comes from here,
whether or not the recipe writes ``cuda.cudnn``.

Each source is read from what the pinned artifacts say, not from the recipe's wish:

- torch: its wheel's own ``nvidia-cudnn`` requirement (its PyPI build's METADATA, in torch.json).
  Every CUDA build of torch depends on one, so every torch image carries libcudnn, and torch loads
  that one (its RPATH), whatever else the image holds;
- a ``pip:`` pin of an ``nvidia-cudnn`` wheel;
- the ``nvidia-cudnn`` wheel a ``source: wheels`` recipe installs for ``cuda.cudnn``;
- the base: an nvidia/cuda ``cudnn`` tag, an imgbuild base's own cudnn label, or NVIDIA's
  ``NV_CUDNN_VERSION`` in a base's env.

The label names the cuDNN the image's framework loads: torch's where torch is pinned, else the pip
pin's, else the wheel installed for ``cuda.cudnn``, else the base's. A ``cuda.cudnn`` the recipe writes
must be that cuDNN's major, and a pip pin must not ask for another cuDNN than torch's: both are refused
before building (pip could not install the pair, or the label would name a cuDNN nothing loads).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.utils import canonicalize_name

from buildkit_py import compat
from buildkit_py import label_keys as K
from buildkit_py.compat import cuda_base, wheel_contents
from buildkit_py.compat.bases import BaseFacts
from buildkit_py.compat.rules import refusal_at
from buildkit_py.compat.torch_rule import TorchPart, torch_cudnn_major
from buildkit_py.recipe.model import Recipe, pin_name

# nvidia-cudnn-cu12, nvidia-cudnn-cu13, nvidia-cudnn-cu11 (and an unsuffixed name, should NVIDIA drop it)
_CUDNN_WHEEL = re.compile(r"^nvidia-cudnn(-cu\d+)?$")


def is_cudnn_wheel(name: str) -> bool:
    return bool(_CUDNN_WHEEL.match(canonicalize_name(name)))


@dataclass(frozen=True)
class CudnnSource:
    """The cuDNN an image gets: its ``major``, its exact ``version`` where a wheel pin says it (None
    where only the major is known: another CUDA variant of torch, a base's tag), and ``origin``, where
    it comes from in words (plan shows it)."""

    major: str
    version: str | None
    origin: str

    @property
    def label(self) -> str:
        """io.imgbuild.cudnn.version: as precise as the artifacts say, never more."""
        return self.version or self.major


def cudnn_pins_rule(recipe: Recipe, torch: TorchPart) -> None:
    """What torch and the pins alone decide, checked beside the other pin rules so that a clash comes
    in the same run as theirs: where torch is pinned its cuDNN is the image's, so ``cuda.cudnn`` must be
    its major and a pip pin of an nvidia-cudnn wheel must not ask for another."""
    from_torch = _from_torch(recipe, torch)
    if from_torch is None:
        return
    if (from_pip := _from_pip(recipe)) is not None:
        _check_pip_against_torch(recipe, from_torch, from_pip, torch)
    _check_written(recipe, from_torch)


def cudnn_source(recipe: Recipe, cuda: str, torch: TorchPart, base: BaseFacts | None, base_image: str,
                 cuda_wheels: tuple[str, ...]) -> CudnnSource | None:
    """The cuDNN of the image these parts make (None: it has none), or a CompatibilityError where the
    recipe's ``cuda.cudnn`` contradicts it. What torch and the pins alone decide was checked before,
    with the other pin rules (``cudnn_pins_rule``)."""
    from_pip = _from_pip(recipe)
    found = (_from_torch(recipe, torch) or (from_pip[1] if from_pip else None) or _from_cuda_wheels(cuda_wheels)
             or _from_base(cuda, base, base_image))
    written = recipe.cuda.cudnn
    if written and found is None:
        return CudnnSource(_major(written), None, "cuda.cudnn")  # the base rule checked the base carries it
    if found is not None:
        _check_written(recipe, found)
    return found


def _check_written(recipe: Recipe, found: CudnnSource) -> None:
    written = recipe.cuda.cudnn
    if written and _major(written) != found.major:
        raise refusal_at(recipe, "cuda.cudnn", "cudnn", written, "cudnn", found.label,
                         f"{found.origin} brings cuDNN {found.label}, the one the image's framework loads",
                         hint=f'use cudnn: "{found.major}" or drop cuda.cudnn (imgbuild labels the cuDNN the pins '
                              "bring)")


def _from_torch(recipe: Recipe, torch: TorchPart) -> CudnnSource | None:
    release = torch.release
    if release is None or torch.variant is None:
        return None
    build = f"{release.version}+{torch.variant}"
    if (read := _from_torch_wheel(torch, build)) is not None:
        return read
    major = torch_cudnn_major(release)
    if major is None:
        raise refusal_at(recipe, "torch", "torch", build, "cudnn", "unknown",
                         f"imgbuild's data does not say which cuDNN torch {build} brings (its wheel's nvidia-cudnn "
                         "requirement is not recorded), so the image's cuDNN label cannot be stamped",
                         hint="refresh the data (scripts/refresh_compat.py) or pin a torch release imgbuild knows",
                         partial=True)
    # PyTorch builds every CUDA variant of a release against one cuDNN major (RELEASE.md's matrix);
    # the exact wheel of another variant is not recorded, so only the major is claimed.
    return CudnnSource(major, None, f"torch {build} (PyTorch builds every CUDA variant of {release.version} "
                                    f"on cuDNN {major})")


def _from_torch_wheel(torch: TorchPart, build: str) -> CudnnSource | None:
    """torch's cuDNN as its wheel's recorded contents say (compat/wheel_contents.py): the nvidia-cudnn
    wheel its Requires-Dist pins, else the libcudnn.so.N inside torch/lib (a large wheel). None where
    the data has no row for this build, or the row says neither."""
    if torch.release is None or torch.variant is None:
        return None
    wheel = compat.torch_wheel(torch.release, torch.variant)
    if wheel is None:
        return None
    pins = {n: v for n, v in wheel.pins().items() if is_cudnn_wheel(n)}
    if pins:
        name, version = sorted(pins.items())[0]
        return CudnnSource(_major(version), version, f"torch {build} (its wheel requires {name}=={version})")
    if (major := wheel_contents.cudnn_major(wheel.libraries)) is not None:
        return CudnnSource(major, None, f"torch {build} (a large wheel: cuDNN {major} inside torch/lib)")
    return None


def _from_pip(recipe: Recipe) -> tuple[int, CudnnSource] | None:
    for i, spec in enumerate(recipe.pip):
        if "==" in spec and is_cudnn_wheel(pin_name(spec)):
            version = spec.split("==", 1)[1].strip()
            return i, CudnnSource(_major(version), version, f"pip[{i}] ({pin_name(spec)}=={version})")
    return None


def _from_cuda_wheels(cuda_wheels: tuple[str, ...]) -> CudnnSource | None:
    for pin in cuda_wheels:
        name, _, version = pin.partition("==")
        if is_cudnn_wheel(name):
            return CudnnSource(_major(version), version, f"cuda.cudnn ({name}=={version})")
    return None


def _from_base(cuda: str, base: BaseFacts | None, base_image: str) -> CudnnSource | None:
    """The base's cuDNN: its nvidia/cuda tag, an imgbuild base's label, NVIDIA's env in its config."""
    image = base_image.split("@", 1)[0]
    if base is not None and (label := base.labels.get(K.CUDNN_VERSION)):
        return CudnnSource(_major(label), label if "." in label else None, f"the base {image} (its cudnn label)")
    tagged = cuda_base.from_tag(image)
    read = cuda_base.from_config(base.labels, base.env) if base is not None else None
    for facts in (tagged, read):
        if facts is None or facts.cudnn is None:
            continue
        major = facts.cudnn
        if major == "":  # a bare "cudnn" tag: the major NVIDIA publishes for that CUDA, when only one
            majors = compat.cudnn_versions(facts.cuda or cuda)
            if len(majors) != 1:
                continue
            major = majors[0]
        return CudnnSource(major, None, f"the base {image} ({facts.evidence})")
    return None


def _check_pip_against_torch(recipe: Recipe, torch_cudnn: CudnnSource, pinned: tuple[int, CudnnSource],
                             torch: TorchPart) -> None:
    """torch's wheel requires one exact nvidia-cudnn; a pip pin of another of the same distribution
    cannot be installed beside it, and one of another major leaves the label ambiguous."""
    i, pin = pinned
    if torch_cudnn.version is not None and pin.version != torch_cudnn.version:
        clash = _same_distribution(recipe.pip[i], torch)
        if clash or pin.major != torch_cudnn.major:
            why = ("pip cannot install both" if clash else
                   "torch loads its own, so the other would only add its size")
            raise refusal_at(recipe, f"pip[{i}]", pin_name(recipe.pip[i]), pin.label, "torch", torch.label or "",
                             f"torch {torch.label} requires cuDNN {torch_cudnn.version} ({torch_cudnn.origin}); {why}",
                             hint=f"drop pip[{i}] (torch brings cuDNN {torch_cudnn.version})")
    elif pin.major != torch_cudnn.major:
        raise refusal_at(recipe, f"pip[{i}]", pin_name(recipe.pip[i]), pin.label, "torch", torch.label or "",
                         f"torch {torch.label} loads cuDNN {torch_cudnn.major} ({torch_cudnn.origin})",
                         hint=f"drop pip[{i}] (torch brings cuDNN {torch_cudnn.major})")


def _same_distribution(spec: str, torch: TorchPart) -> bool:
    release = torch.release
    names = {canonicalize_name(n) for n in (release.pypi_cuda_wheels if release else {})}
    return canonicalize_name(pin_name(spec)) in names


def _major(version: str) -> str:
    return str(version).split(".", maxsplit=1)[0]

