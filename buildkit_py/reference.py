"""Image references: ``registry/repository[:tag][@digest]`` with the docker CLI's rules, and
which registry hosts are loopback (plain http, like dockerd's insecure default)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, replace

from buildkit_py.errors import UsageError

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
# What a reference may call Docker Hub besides docker.io; parse_reference folds them into it.
DOCKER_HUB_ALIASES = frozenset({"index.docker.io", DOCKER_HUB_API})
# Credential stores and logins also file Hub under its old web host (the docker CLI accepts it there).
DOCKER_HUB_LOGIN_HOSTS = frozenset({DOCKER_HUB, *DOCKER_HUB_ALIASES, "registry.hub.docker.com"})
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
# \Z, not $ ($ also matches before a trailing newline); ASCII: \w would take any Unicode letter.
_REPO_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*\Z")
_TAG_RE = re.compile(r"^[\w][\w.-]{0,127}\Z", re.ASCII)
_DIGEST_RE = re.compile(r"^sha256:[a-f0-9]{64}\Z")
_HOST_RE = re.compile(r"^(?:\[[0-9a-fA-F:]+\]|[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?)(?::[0-9]+)?\Z")


@dataclass(frozen=True)
class Reference:
    """``registry/repository[:tag][@digest]``; ``tag`` is None when it was not written."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def api_host(self) -> str:
        return api_host(self.registry)

    @property
    def reference(self) -> str:
        """What goes after ``/manifests/``: the digest when pinned, else the tag."""
        return self.digest or self.tag or "latest"

    def with_digest(self, digest: str) -> Reference:
        return replace(self, digest=digest)

    def with_tag(self, tag: str | None) -> Reference:
        return replace(self, tag=tag, digest=None)

    def __str__(self) -> str:
        text = f"{self.registry}/{self.repository}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def api_host(registry: str) -> str:
    """The host that serves a registry's /v2/ API: Docker Hub's is not docker.io."""
    return DOCKER_HUB_API if registry == DOCKER_HUB else registry


def is_registry_host(component: str) -> bool:
    """Whether the first path component of an image name is a registry host (the docker CLI's
    rule): it has a ``.`` or a ``:``, or is ``localhost``; else the name is on Docker Hub."""
    return "." in component or ":" in component or component == "localhost"


def names_registry(text: str) -> bool:
    """Whether a valid reference writes its registry (``host[:port]/repo``, ``docker.io/team/app``);
    a bare ``team/app`` is not Docker Hub to the commands that ask, but the local engine."""
    parse_reference(text)  # a malformed reference is refused, not answered
    first, _, rest = text.strip().partition("/")
    return bool(rest) and is_registry_host(first)


def parse_reference(text: str) -> Reference:
    """Parse an image reference with the docker CLI's rules.

    The first path component is a registry when it has a ``.`` or ``:`` or is
    ``localhost``; else the registry is docker.io, where one-component names get
    ``library/``. Raises UsageError on anything malformed.
    """
    original = text
    text = text.strip()
    if not text or "://" in text:
        raise UsageError(f"invalid image reference {original!r}", hint="write host/repo:tag or host/repo@sha256:...")
    digest = None
    if "@" in text:
        text, digest = text.split("@", 1)
        if not _DIGEST_RE.match(digest):
            raise UsageError(f"invalid digest in reference {original!r}", hint="digests look like sha256:<64 hex>")
    tag = None
    slash = text.rfind("/")
    colon = text.rfind(":")
    if colon > slash:
        text, tag = text[:colon], text[colon + 1:]
        if not _TAG_RE.match(tag):
            raise UsageError(f"invalid tag {tag!r} in reference {original!r}")
    first, _, rest = text.partition("/")
    if rest and is_registry_host(first):
        registry, repository = first, rest
        if not _HOST_RE.match(registry):
            raise UsageError(f"invalid registry host {registry!r} in reference {original!r}")
    else:
        registry, repository = DOCKER_HUB, text
    if registry in DOCKER_HUB_ALIASES:
        registry = DOCKER_HUB
    if registry == DOCKER_HUB and "/" not in repository:
        repository = f"library/{repository}"
    if not _REPO_RE.match(repository):
        raise UsageError(
            f"invalid repository name {repository!r} in reference {original!r}",
            hint="repository names are lowercase letters, digits and . _ - separators",
        )
    return Reference(registry, repository, tag, digest)


def as_reference(ref: Reference | str) -> Reference:
    return ref if isinstance(ref, Reference) else parse_reference(ref)



def is_loopback(host: str) -> bool:
    name = host
    if name.startswith("["):
        name = name[1:].split("]", 1)[0]
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False

