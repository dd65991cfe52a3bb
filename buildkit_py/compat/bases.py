"""Facts about a base image in a registry, read before resolution (by ``pipeline.bases``, the
pipeline's only registry I/O before a build): its digest, to pin it, and its labels and env, to
check a shared base built by imgbuild against the recipe that builds on it. This module holds the
facts and the rule of which bases are looked up; reading them is the pipeline's business."""

from __future__ import annotations

from dataclasses import dataclass, field

from buildkit_py import label_keys as K
from buildkit_py import reference
from buildkit_py.compat import cuda_base
from buildkit_py.recipe.model import Recipe


@dataclass(frozen=True)
class BaseFacts:
    ref: str
    digest: str | None  # what the tag points at (an index for multi-platform images)
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    # os/arch of each image the tag carries (an index's entries, attestations left out); () unknown
    platforms: tuple[str, ...] = ()

    @property
    def pinned(self) -> str:
        return f"{self.ref.split('@', 1)[0]}@{self.digest}" if self.digest else self.ref

    @property
    def built_by_imgbuild(self) -> bool:
        return K.CUDA_VERSION in self.labels


def in_private_registry(ref: str) -> bool:
    """True when the reference names its registry host (127.0.0.1:5000/x, ghcr.io/x):
    those are looked up. Docker Hub short names are not, so rendering a recipe on
    `ubuntu:22.04` needs no network."""
    return reference.parse_reference(ref).registry != reference.DOCKER_HUB


def needs_lookup(recipe: Recipe, base_image: str) -> bool:
    """Is the final stage's base looked up: one in a named registry (a team base, a mirror), and,
    with ``cuda.source: nvidia``, any base whose CUDA its name does not tell (Docker Hub included):
    the resolver refuses to label CUDA it has not seen (compat/cuda_base.py)."""
    if cuda_base.needs_config(recipe.cuda.source, base_image):
        return True
    return "@sha256:" not in base_image and in_private_registry(base_image)
