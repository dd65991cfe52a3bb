"""Facts about a base image in a registry, read before resolution (the pipeline's only
registry I/O before a build): its digest, to pin it, and its labels and env, to check a
shared base built by imgbuild against the recipe that builds on it. No layer is pulled.
``resolve.resolve_with_base`` looks the base up and resolves against its facts."""

from __future__ import annotations

from dataclasses import dataclass, field

from buildkit_py import oci
from buildkit_py.compat import cuda_base
from buildkit_py.errors import ImgbuildError
from buildkit_py.recipe.model import Recipe


@dataclass(frozen=True)
class BaseFacts:
    ref: str
    digest: str | None  # what the tag points at (an index for multi-platform images)
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    error: str | None = None  # why the registry could not be read, when it could not

    @property
    def pinned(self) -> str:
        return f"{self.ref.split('@', 1)[0]}@{self.digest}" if self.digest else self.ref

    @property
    def built_by_imgbuild(self) -> bool:
        return "io.imgbuild.cuda.version" in self.labels


def in_private_registry(ref: str) -> bool:
    """True when the reference names its registry host (127.0.0.1:5000/x, ghcr.io/x):
    those are looked up. Docker Hub short names are not, so rendering a recipe on
    `ubuntu:22.04` needs no network."""
    return oci.parse_reference(ref).registry != oci.DOCKER_HUB


def fetch_base_facts(ref: str, *, client=None) -> BaseFacts:
    # Planning must not stall on an unreachable registry: one short try, then a warning.
    client = client or oci.Client(timeout=(5.0, 5.0), max_retries=1)
    try:
        _raw, digest, _media_type = oci.fetch_manifest(ref, client=client)
        config = oci.get_image_config(ref, client=client).get("config") or {}
    except ImgbuildError as exc:
        return BaseFacts(ref, None, error=exc.message)
    env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
    return BaseFacts(ref, digest, dict(config.get("Labels") or {}), env)


def base_facts_for(recipe: Recipe, base_image: str, *, client=None) -> BaseFacts | None:
    """Look up the final stage's base when it sits in a named registry (a team base, a mirror), and,
    with ``cuda.source: nvidia``, any base whose CUDA its name does not tell (Docker Hub included):
    the resolver refuses to label CUDA it has not seen (compat/cuda_base.py)."""
    if cuda_base.needs_config(recipe.cuda.source, base_image):
        return fetch_base_facts(base_image, client=client)
    if "@sha256:" in base_image or not in_private_registry(base_image):
        return None
    return fetch_base_facts(base_image, client=client)
