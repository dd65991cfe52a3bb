"""Facts about a base image in a registry, read before resolution (the pipeline's only
registry I/O before a build): its digest, to pin it, and its labels and env, to check a
shared base built by imgbuild against the recipe that builds on it. No layer is pulled."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    from buildkit_py import oci  # noqa: PLC0415

    return oci.parse_reference(ref).registry != oci.DOCKER_HUB


def fetch_base_facts(ref: str, *, client=None) -> BaseFacts:
    from buildkit_py import oci  # noqa: PLC0415

    # Planning must not stall on an unreachable registry: one short try, then a warning.
    client = client or oci.Client(timeout=5, max_retries=1)
    try:
        _raw, digest, _media_type = oci.fetch_manifest(ref, client=client)
        config = oci.get_image_config(ref, client=client).get("config") or {}
    except ImgbuildError as exc:
        return BaseFacts(ref, None, error=exc.message)
    env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
    return BaseFacts(ref, digest, dict(config.get("Labels") or {}), env)


def base_facts_for(recipe: Recipe, base_image: str, *, client=None) -> BaseFacts | None:
    """Look up the final stage's base when it sits in a named registry (a team base, a mirror)."""
    if "@sha256:" in base_image or not in_private_registry(base_image):
        return None
    return fetch_base_facts(base_image, client=client)


def resolve_with_base(recipe: Recipe, *, client=None, cache: dict[str, BaseFacts | None] | None = None):
    """Resolve against the final base's own facts (labels, env) when it sits in a named
    registry: a shared base built by imgbuild says its OS and Python in its labels. Every
    command that resolves a recipe (plan, build, matrix, lock) goes through here. ``cache``
    (base ref -> facts) lets a matrix look each base up once."""
    from buildkit_py.compat.resolve import mirrored_ref, resolve  # noqa: PLC0415

    if recipe.base.image:
        base_ref = mirrored_ref(recipe.base.image, recipe.base.mirror)
    elif recipe.base.mirror:
        base_ref = resolve(recipe).base_image  # an nvidia/cuda tag under the mirror
    else:
        return resolve(recipe)  # nvidia/cuda on Docker Hub: nothing to look up
    if cache is not None and base_ref in cache:
        facts = cache[base_ref]
    else:
        facts = base_facts_for(recipe, base_ref, client=client)
        if cache is not None:
            cache[base_ref] = facts
    return resolve(recipe, base=facts)
