"""The CUDA wheels rule (the 11th of ``rules``): the nvidia-* wheels the final stage of a
``cuda.source: wheels`` recipe installs, from wheels.json's tiers less what torch's pins or an
imgbuild base already bring."""

from __future__ import annotations

import re
from dataclasses import dataclass

from buildkit_py import compat
from buildkit_py import label_keys as K
from buildkit_py.compat import torch_pins
from buildkit_py.compat.bases import BaseFacts
from buildkit_py.compat.rules import data_gap, refusal_at
from buildkit_py.compat.tables import WheelSet
from buildkit_py.compat.torch_data import TorchRelease
from buildkit_py.compat.torch_rule import TorchPart
from buildkit_py.recipe.model import CudaSource, Recipe
from buildkit_py.versions import major_minor as _mm  # short: it sits in many messages


@dataclass(frozen=True)
class CudaWheelsPart:
    pins: tuple[str, ...] = ()
    home: str | None = None  # the CUDA_HOME tree a devel flavor gets from wheels


def cuda_wheels_rule(recipe: Recipe, wheel_set: WheelSet | None, cuda: str, cudnn: str | None,
                     torch: TorchPart, base: BaseFacts | None = None) -> CudaWheelsPart:
    """The nvidia-* pins the final stage installs, and the CUDA_HOME tree a devel flavor gets: the
    library set of NVIDIA's image tier (wheels.json ``tiers``: base = cudart; runtime = the runtime
    libraries and NCCL; devel = those plus nvcc and headers, where that CUDA's wheels carry nvcc),
    less what torch's pins or an imgbuild base already bring; plus cuDNN and what it loads."""
    if recipe.cuda.source != CudaSource.WHEELS:
        return CudaWheelsPart()
    flavor = recipe.cuda.flavor
    facts = base
    imgbuild_base = facts if facts is not None and facts.built_by_imgbuild else None
    bundled = torch.release is not None and torch.variant is not None and compat.torch_bundles_cuda(
        torch.release, torch.variant)
    if wheel_set is None:  # torch or the base brings CUDA; does the tier need more than that?
        if bundled and imgbuild_base is None:
            raise refusal_at(recipe, "torch", "torch", torch.label or "", "cuda", cuda,
                             f"torch {torch.label} is a large wheel: its CUDA libraries sit in torch/lib, where "
                             f"nothing else loads them, and PyPI has no CUDA {_mm(cuda)} wheels to install "
                             "libcudart from",
                             hint=f"use cuda.source: nvidia, or a torch release from {compat.large_wheels_before()} on "
                             "(its CUDA comes as nvidia-* wheels)")
        if flavor == "base" or imgbuild_base is not None and _base_tier(imgbuild_base) == flavor:
            return CudaWheelsPart()
        raise refusal_at(recipe, "cuda.flavor", "cuda.flavor", flavor, "cuda", cuda,
                         f"the {flavor} tier needs CUDA libraries torch does not bring, and PyPI has no CUDA "
                         f"{_mm(cuda)} wheels to add them from",
                         hint="use cuda.flavor: base (torch's own CUDA libraries)")
    try:
        extras = compat.tier_extras(flavor, wheel_set.toolkit)
    except LookupError as exc:
        raise data_gap(recipe, "cuda.flavor", exc, "cuda.flavor", flavor) from None
    brought = _brought_extras(wheel_set, None if bundled else torch.release, imgbuild_base)
    pins = set(wheel_set.pins(*(x for x in extras if x not in brought)))
    if flavor != "base" and "nccl" not in brought:
        pins.add(compat.nccl_pin(cuda))
    if cudnn and not torch.version:
        cw = compat.cudnn_wheel(cuda, cudnn)
        pins |= {f"{cw.wheel}=={cw.version}"} | set(wheel_set.pins(*(x for x in ("cublas", "nvrtc")
                                                                       if x not in brought)))
    home = compat.cuda_wheel_home(cuda) if flavor == "devel" else None
    return CudaWheelsPart(tuple(sorted(pins)), home)


def _base_tier(facts: BaseFacts) -> str:
    """The tier an imgbuild base was built as (an unlabelled one: cudart only, the least it has)."""
    return facts.labels.get(K.CUDA_FLAVOR, "base")


def _brought_extras(wheel_set: WheelSet, torch: TorchRelease | None, base: BaseFacts | None) -> frozenset[str]:
    """The tier extras (and "nccl") already in the image: what torch's wheel pins (its PyPI build's
    pins: PyTorch's other variants depend on the same libraries of their CUDA), or an imgbuild base's tier."""
    out: set[str] = set()
    if base is not None:
        tier = _base_tier(base)
        out |= set(compat.tier_extras("runtime" if tier == "devel" else tier, wheel_set.toolkit))
        if tier != "base":
            out.add("nccl")
    if torch is not None:
        # the wheel's own pins, and every CUDA wheel pip resolves with it (nvjitlink comes in through cuSPARSE)
        resolved = torch_pins.torch_cuda_pins(torch.version)
        names = set(torch.pypi_cuda_wheels) | {w.name for w in (resolved.wheels if resolved else ())}
        out |= set(torch.pypi_cuda_toolkit_extras)
        out |= {extra for extra, pkgs in wheel_set.extras
                if any(_unsuffixed(p) in {_unsuffixed(n) for n in names} for p, _ in pkgs)}
        if any(n.startswith("nvidia-nccl") for n in names):
            out.add("nccl")
    return frozenset(out)


def _unsuffixed(package: str) -> str:
    """nvidia-cublas-cu12 -> nvidia-cublas: torch's pins and the toolkit's wheels name one library alike."""
    return re.sub(r"-cu\d+$", "", package)
