"""Facts about a base image in a registry, read before resolution (the pipeline's only
registry I/O before a build): its digest, to pin it, and its labels and env, to check a
shared base built by imgbuild against the recipe that builds on it. No layer is pulled.
``resolve.resolve_with_base`` looks the base up and resolves against its facts.

A base that cannot be read stops the plan with the registry's own reason, before any rule
guesses at what the base might be: a missing tag or repository is the recipe's error at the
key that names it (exit 2); credentials the registry refuses, or a registry out of reach, are
the environment's (exit 3)."""

from __future__ import annotations

from dataclasses import dataclass, field

from buildkit_py import label_keys as K
from buildkit_py import oci
from buildkit_py.compat import cuda_base
from buildkit_py.errors import (
    AuthenticationError,
    BaseImageNotFound,
    ManifestNotFound,
    RecipeIssue,
    RegistryError,
    RegistryUnreachable,
)
from buildkit_py.recipe.model import Recipe


@dataclass(frozen=True)
class BaseFacts:
    ref: str
    digest: str | None  # what the tag points at (an index for multi-platform images)
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

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
    return oci.parse_reference(ref).registry != oci.DOCKER_HUB


def fetch_base_facts(ref: str, *, client=None) -> BaseFacts:
    """The base's digest, labels and env. Raises the registry's typed error when it cannot be
    read (ManifestNotFound, AuthenticationError, RegistryUnreachable, RegistryError)."""
    # Planning must not stall on an unreachable registry: one short try.
    client = client or oci.Client(timeout=(5.0, 5.0), max_retries=1)
    _raw, digest, _media_type = oci.fetch_manifest(ref, client=client)
    config = oci.get_image_config(ref, client=client).get("config") or {}
    env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
    return BaseFacts(ref, digest, dict(config.get("Labels") or {}), env)


def base_facts_for(recipe: Recipe, base_image: str, *, client=None) -> BaseFacts | None:
    """Look up the final stage's base when it sits in a named registry (a team base, a mirror), and,
    with ``cuda.source: nvidia``, any base whose CUDA its name does not tell (Docker Hub included):
    the resolver refuses to label CUDA it has not seen (compat/cuda_base.py). A base that cannot be
    read raises the registry's reason, located at the recipe's key."""
    wanted = cuda_base.needs_config(recipe.cuda.source, base_image)
    if not wanted and ("@sha256:" in base_image or not in_private_registry(base_image)):
        return None
    key = "base.mirror" if recipe.base.mirror else "base.image"
    where = f"{recipe.path}:{recipe.line_of(key)}" if recipe.line_of(key) else str(recipe.path)
    try:
        return fetch_base_facts(base_image, client=client)
    except ManifestNotFound as exc:
        raise BaseImageNotFound([RecipeIssue(
            str(recipe.path), recipe.line_of(key), key,
            f"the base image {base_image} is not in its registry ({_registry_words(exc.message)})")],
            hint=_missing_hint(recipe, base_image)) from None
    except (AuthenticationError, RegistryUnreachable) as exc:
        # exit 3, as the registry's own error; the recipe key says which image was being read.
        raise type(exc)(f"cannot read the base image {base_image} ({where}: {key}): {exc.message}",
                        hint=exc.hint) from None
    except RegistryError as exc:
        raise RegistryError(f"cannot read the base image {base_image} ({where}: {key}): {exc.message}",
                            hint=exc.hint) from None


def _registry_words(message: str) -> str:
    """The registry's own words from a ManifestNotFound (``... [MANIFEST_UNKNOWN: ...]``)."""
    start, end = message.rfind("["), message.rfind("]")
    return message[start + 1:end] if 0 <= start < end else message


def _missing_hint(recipe: Recipe, base_image: str) -> str:
    if recipe.base.mirror:
        upstream = recipe.base.image or base_image.removeprefix(recipe.base.mirror.rstrip("/") + "/")
        return (f"copy it into the mirror first: imgbuild mirror {upstream} --to-mirror {recipe.base.mirror}; "
                "or check the tag")
    return "check the repository and tag (a shared base must be pushed before recipes build on it)"
