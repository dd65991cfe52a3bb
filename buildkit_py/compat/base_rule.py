"""The base rule (the 10th of ``rules``): a base read from its registry, held to the recipe's CUDA,
flavor and torch by its labels and env, then pinned by digest."""

from __future__ import annotations

from dataclasses import dataclass

from buildkit_py import label_keys as K
from buildkit_py.compat.bases import BaseFacts
from buildkit_py.compat.rules import Warnings, refusal_at
from buildkit_py.compat.torch_rule import TorchPart
from buildkit_py.recipe.model import CudaFlavor, Recipe
from buildkit_py.versions import major_minor as _mm  # short: it sits in many messages


@dataclass(frozen=True)
class BasePart:
    base_image: str  # the final stage's FROM, pinned by digest when the registry was read
    digest: str | None
    warnings: Warnings = ()


def base_rule(recipe: Recipe, base: BaseFacts | None, cuda: str, torch: TorchPart, base_image: str) -> BasePart:
    """A base read from its registry: refuse one whose CUDA or torch contradicts the recipe,
    then pin it by digest. Not read (no registry named): the image as it is."""
    if base is None:
        return BasePart(base_image, None)
    base_cuda = base.labels.get(K.CUDA_VERSION) or base.env.get("CUDA_VERSION")
    if base_cuda and _mm(base_cuda) != _mm(cuda):
        what, version = ("torch", torch.label or "") if torch.version else ("cuda", cuda)
        raise refusal_at(recipe, "base.image", "base.image", f"{base.ref} (CUDA {base_cuda})", what, version,
                         f"the base carries CUDA {base_cuda} but this recipe needs CUDA {_mm(cuda)}",
                         hint=f"use cuda.version \"{_mm(base_cuda)}\" or a base built for CUDA {_mm(cuda)}")
    base_tier = base.labels.get(K.CUDA_FLAVOR)
    if base_tier in CudaFlavor.words() and CudaFlavor(base_tier).rank > recipe.cuda.flavor.rank:
        raise refusal_at(recipe, "cuda.flavor", "cuda.flavor", recipe.cuda.flavor, "base.image",
                         f"{base.ref} ({base_tier})", f"the base is the {base_tier} tier, so the image carries "
                         f"{base_tier} CUDA whatever this recipe says", hint=f"use cuda.flavor: {base_tier}")
    base_torch = base.labels.get(K.TORCH_VERSION)
    if base_torch and torch.label and base_torch != torch.label:
        raise refusal_at(recipe, "torch", "base.image", f"{base.ref} (torch {base_torch})", "torch",
                         torch.label, "the base already has another torch build",
                         hint=f"drop torch: from the recipe (the base has {base_torch}) or rebuild the base")
    return BasePart(base.pinned, base.digest)
