"""The contract stamped on every image: io.imgbuild.* and org.opencontainers.image.* labels
(their names are in buildkit_py/label_keys.py).

Static labels go into the Dockerfile; volatile ones (created time, git revision) are passed
at build time so they never break the layer cache: pipeline/sources.py reads them from git and the
files' times, which the plan layer never reads.
"""

from __future__ import annotations

import json

from buildkit_py.compat.floors import floor_labels
from buildkit_py.compat.gpu_fit import gpu_spec
from buildkit_py.compat.resolve import Resolution
from buildkit_py.label_keys import (
    CUDA_ARCH,
    CUDA_FLAVOR,
    CUDA_SOURCE,
    CUDA_VERSION,
    CUDNN_VERSION,
    GPUS,
    INSTALLER,
    OCI_BASE_DIGEST,
    OCI_BASE_NAME,
    OCI_TITLE,
    OCI_VERSION,
    OS,
    PYTHON_VERSION,
    RECIPE_DIGEST,
    TORCH_VERSION,
    WEIGHTS,
)
from buildkit_py.plan.installer import installer_for
from buildkit_py.recipe.model import Recipe


def static_labels(recipe: Recipe, res: Resolution) -> dict[str, str]:
    labels: dict[str, str] = dict(recipe.labels)
    labels.update({
        CUDA_VERSION: res.cuda_version,
        CUDA_FLAVOR: res.cuda_flavor,
        CUDA_SOURCE: res.cuda_source,
        PYTHON_VERSION: res.python,
        INSTALLER: installer_for(recipe.build.installer).label,
        RECIPE_DIGEST: recipe.digest,
        OCI_TITLE: recipe.name,
        # Always set: otherwise the base's own value (Ubuntu stamps its release) shows through.
        # The tag's version: with no `version:` the image is tagged :latest (README).
        OCI_VERSION: recipe.version or "latest",
        OCI_BASE_NAME: res.base_image.split("@", 1)[0],
    })
    if res.os:
        labels[OS] = res.os
    if res.base_digest:
        labels[OCI_BASE_DIGEST] = res.base_digest
    # the mapping `imgbuild check` reads back (compat.floors): no native floor where NVIDIA publishes none
    labels.update(floor_labels(res.driver_floor))
    if res.cudnn:
        labels[CUDNN_VERSION] = res.cudnn
    if res.torch_label:
        labels[TORCH_VERSION] = res.torch_label
    if res.compiled_arch:  # what was compiled, not what was asked: flash-attn compiles its own list
        labels[CUDA_ARCH] = ";".join(res.compiled_arch)
    if recipe.gpus:  # resolve checked each name; as NVIDIA's list spells it, in the recipe's order
        labels[GPUS] = ";".join(gpu_spec(g).name for g in recipe.gpus)
    if recipe.weights:
        # JSON, so a reader needs no parsing rules of ours: [{"mount": ..., "ref": ...}]
        labels[WEIGHTS] = json.dumps([{"mount": w.mount, "ref": w.ref} for w in recipe.weights],
                                     separators=(",", ":"))
    return dict(sorted(labels.items()))


def weights_from_labels(labels: dict[str, str]) -> list[tuple[str, str]]:
    """(ref, mount) pairs an image expects on volumes, from its io.imgbuild.weights label."""
    raw = labels.get(WEIGHTS)
    if not raw:
        return []
    try:
        return [(w["ref"], w["mount"]) for w in json.loads(raw)]
    except (ValueError, KeyError, TypeError):
        return []
