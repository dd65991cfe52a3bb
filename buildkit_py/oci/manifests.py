"""Manifests: fetch (digest-checked, size-limited), pick a platform from an index, put,
delete, and an image's config read without pulling a layer.

The registry's JSON is parsed once, here, into frozen ``Manifest`` / ``Index`` / ``ImageConfig``
values; each keeps the exact bytes it was parsed from, because a manifest's digest is of those
bytes (re-serialising the parsed form would change it)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import requests

from buildkit_py.errors import DigestMismatch, RegistryError
from buildkit_py.oci.blobs import MAX_CONFIG_BYTES, read_blob
from buildkit_py.oci.transport import Client, pull_scope, push_scope, read_limited, sha256_bytes
from buildkit_py.reference import Reference, as_reference

MAX_MANIFEST_BYTES = 4 << 20  # distribution-spec's suggested manifest size limit

MEDIA_OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MEDIA_DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MEDIA_OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
INDEX_TYPES = (MEDIA_OCI_INDEX, MEDIA_DOCKER_LIST)
MANIFEST_TYPES = (MEDIA_OCI_MANIFEST, MEDIA_DOCKER_MANIFEST)
ACCEPT = ", ".join(MANIFEST_TYPES + INDEX_TYPES)
DEFAULT_PLATFORM = "linux/amd64"


def _str_map(value: object) -> Mapping[str, str]:
    """A JSON object of strings (annotations, labels); anything else reads as empty."""
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def json_object(raw: bytes, what: str) -> dict[str, Any]:
    """A registry document's bytes as a JSON object; a RegistryError naming ``what`` otherwise."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise RegistryError(f"{what} is not JSON") from exc
    if not isinstance(body, dict):
        raise RegistryError(f"{what} is not a JSON object")
    return body


@dataclass(frozen=True)
class Descriptor:
    """An OCI content descriptor: a blob or manifest by media type, digest and size, with the
    platform an index entry serves. ``document`` is the descriptor as the registry wrote it,
    for the callers that copy it into a document they push (a referrer's subject, an index)."""

    media_type: str
    digest: str
    size: int
    annotations: Mapping[str, str] = field(default_factory=dict)
    platform: Mapping[str, str] = field(default_factory=dict)  # os, architecture, variant
    artifact_type: str | None = None
    document: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_json(cls, value: object, what: str) -> Descriptor:
        if not isinstance(value, dict) or not isinstance(value.get("digest"), str):
            raise RegistryError(f"{what} is not a descriptor with a digest")
        return cls(media_type=str(value.get("mediaType") or ""), digest=value["digest"],
                   size=int(value.get("size") or 0), annotations=_str_map(value.get("annotations")),
                   platform=_str_map(value.get("platform")),
                   artifact_type=value.get("artifactType") if isinstance(value.get("artifactType"), str) else None,
                   document=value)

    @property
    def platform_name(self) -> str:
        """``os/arch[/variant]`` (``unknown`` when the entry names none)."""
        return platform_of(self.document)


@dataclass(frozen=True)
class Manifest:
    """An image (or artifact) manifest: its config and layer descriptors, and the bytes its
    ``digest`` is of."""

    raw: bytes
    digest: str
    media_type: str
    config: Descriptor
    layers: tuple[Descriptor, ...]
    artifact_type: str | None = None
    subject: Descriptor | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def compressed_size(self) -> int:
        """Bytes a pull downloads: the config and every layer blob."""
        return self.config.size + sum(layer.size for layer in self.layers)

    def document(self) -> dict[str, Any]:
        """The manifest as JSON (a fresh copy: the parsed form is frozen)."""
        return json_object(self.raw, f"manifest {self.digest}")


@dataclass(frozen=True)
class Index:
    """An index (multi-platform image or manifest list): one descriptor per platform manifest."""

    raw: bytes
    digest: str
    media_type: str
    manifests: tuple[Descriptor, ...]

    def select(self, platform: str, what: str = "image") -> Descriptor:
        """The entry serving ``platform``; a RegistryError listing the platforms it has otherwise."""
        return Descriptor.from_json(select_platform(self.document(), platform, what), f"index entry of {what}")

    def document(self) -> dict[str, Any]:
        return json_object(self.raw, f"index {self.digest}")


@dataclass(frozen=True)
class ImageConfig:
    """An image config blob: the runtime settings (``config``: labels, env, entrypoint), the
    layers' diff ids and the build history."""

    raw: bytes
    digest: str
    runtime: Mapping[str, Any]  # the "config" object: Labels, Env, Entrypoint, Cmd, ...
    diff_ids: tuple[str, ...]
    history: tuple[Mapping[str, Any], ...]

    @property
    def labels(self) -> Mapping[str, str]:
        return _str_map(self.runtime.get("Labels"))

    def document(self) -> dict[str, Any]:
        return json_object(self.raw, f"config {self.digest}")


def parse_manifest(raw: bytes, digest: str, media_type: str, what: str) -> Manifest | Index:
    """The typed form of fetched manifest bytes (an index when ``media_type`` is one)."""
    body = json_object(raw, f"manifest of {what}")
    if media_type in INDEX_TYPES:
        return Index(raw, digest, media_type, tuple(
            Descriptor.from_json(e, f"index entry of {what}") for e in body.get("manifests") or []))
    subject = body.get("subject")
    return Manifest(
        raw, digest, media_type,
        config=Descriptor.from_json(body.get("config"), f"config descriptor of {what}") if body.get("config")
        else Descriptor("", "", 0),
        layers=tuple(Descriptor.from_json(x, f"layer of {what}") for x in body.get("layers") or []),
        artifact_type=body.get("artifactType") if isinstance(body.get("artifactType"), str) else None,
        subject=Descriptor.from_json(subject, f"subject of {what}") if subject else None,
        annotations=_str_map(body.get("annotations")))


def parse_image_config(raw: bytes, digest: str, what: str) -> ImageConfig:
    body = json_object(raw, what)
    runtime = body.get("config") or {}
    history = body.get("history") or []
    return ImageConfig(raw, digest, runtime if isinstance(runtime, dict) else {},
                       tuple(str(x) for x in (body.get("rootfs") or {}).get("diff_ids") or []),
                       tuple(h for h in history if isinstance(h, dict)))


def _media_type(resp: requests.Response, body: dict[str, Any]) -> str:
    header = (resp.headers.get("Content-Type") or "").split(";", 1)[0].strip()
    return str(body.get("mediaType") or header)


def fetch_manifest(ref: Reference | str, *, client: Client | None = None) -> tuple[bytes, str, str]:
    """The manifest bytes as stored (index or manifest), their digest and media type."""
    ref = as_reference(ref)
    client = client or Client()
    resp = client.request("GET", ref.api_host, f"/v2/{ref.repository}/manifests/{ref.reference}",
                          scope=pull_scope(ref.repository), headers={"Accept": ACCEPT}, stream=True)
    with resp:
        raw = read_limited(resp, MAX_MANIFEST_BYTES, f"manifest of {ref}")
    digest = sha256_bytes(raw)
    if ref.digest and digest != ref.digest:
        raise DigestMismatch(f"manifest of {ref} has digest {digest}, not the pinned {ref.digest}")
    media_type = _media_type(resp, json_object(raw, f"manifest of {ref}"))
    if media_type not in MANIFEST_TYPES + INDEX_TYPES:
        raise RegistryError(f"{ref} has unsupported manifest type {media_type!r}",
                            hint="only OCI and Docker schema 2 manifests are supported")
    return raw, digest, media_type


def read_any_manifest(ref: Reference | str, *, client: Client | None = None) -> Manifest | Index:
    """What ``ref`` names, parsed: an index (multi-platform image) or a manifest."""
    ref = as_reference(ref)
    raw, digest, media_type = fetch_manifest(ref, client=client)
    return parse_manifest(raw, digest, media_type, str(ref))


def read_manifest(ref: Reference | str, *, platform: str = DEFAULT_PLATFORM,
                  client: Client | None = None) -> Manifest:
    """The image manifest ``ref`` names; for an index, the entry for ``platform``."""
    ref = as_reference(ref)
    client = client or Client()
    found = read_any_manifest(ref, client=client)
    if isinstance(found, Index):
        found = read_any_manifest(ref.with_digest(found.select(platform, str(ref)).digest), client=client)
        if isinstance(found, Index):
            raise RegistryError(f"{ref}: nested index for {platform} is not supported")
    return found


def get_manifest(ref: Reference | str, *, platform: str = DEFAULT_PLATFORM,
                 client: Client | None = None) -> tuple[dict[str, Any], str, str]:
    """``(manifest, digest, media_type)``, the manifest as JSON: ``read_manifest``'s dict view, for
    the engine modules that still read it by key (issue 32: i32-engines moves them to ``Manifest``)."""
    manifest = read_manifest(ref, platform=platform, client=client)
    return manifest.document(), manifest.digest, manifest.media_type


def platform_of(entry: Mapping[str, Any]) -> str:
    """``os/arch[/variant]`` of an index entry (``unknown/unknown`` for BuildKit's attestations)."""
    p = entry.get("platform") or {}
    return "/".join(x for x in (p.get("os"), p.get("architecture"), p.get("variant")) if x) or "unknown"


def platform_matches(entry: Mapping[str, Any], platform: str) -> bool:
    """Does the index entry serve ``platform`` (``os/arch``, or ``os/arch/variant`` to be exact)?"""
    os_name, _, rest = platform.partition("/")
    arch, _, variant = rest.partition("/")
    p = entry.get("platform") or {}
    return bool(p.get("os") == os_name and p.get("architecture") == arch
                and (not variant or p.get("variant") == variant))


def select_platform(index: Mapping[str, Any], platform: str, what: str = "image") -> dict[str, Any]:
    entries: list[dict[str, Any]] = index.get("manifests") or []
    for entry in entries:
        if platform_matches(entry, platform):
            return entry
    seen = ", ".join(platform_of(e) for e in entries)
    raise RegistryError(f"{what} has no {platform} manifest (has: {seen or 'none'})")


def put_manifest(ref: Reference | str, manifest: Mapping[str, Any] | bytes, media_type: str | None = None, *,
                 client: Client | None = None) -> str:
    """PUT a manifest under ``ref``'s tag (or its digest). Returns the digest."""
    ref = as_reference(ref)
    client = client or Client()
    raw = manifest if isinstance(manifest, bytes) else canonical_json(manifest)
    if media_type is None:
        media_type = str(json_object(raw, f"manifest for {ref}").get("mediaType") or MEDIA_OCI_MANIFEST)
    digest = sha256_bytes(raw)
    target = ref.tag or ref.digest or digest
    if ref.digest and not ref.tag and ref.digest != digest:
        raise DigestMismatch(f"manifest digest {digest} does not match the reference {ref}")
    resp = client.request("PUT", ref.api_host, f"/v2/{ref.repository}/manifests/{target}",
                          scope=push_scope(ref.repository), expect=(201, 200),
                          headers={"Content-Type": media_type}, body=raw)
    resp.close()
    echoed = resp.headers.get("Docker-Content-Digest")
    if echoed and echoed.startswith("sha256:") and echoed != digest:
        raise RegistryError(f"registry stored manifest {ref} as {echoed}, expected {digest}")
    return digest


def canonical_json(obj: object) -> bytes:
    """Deterministic bytes for a document we create: same content, same digest."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def delete_manifest(ref: Reference | str, *, client: Client | None = None) -> str:
    """Delete a manifest (resolving a tag to its digest first). Returns the digest."""
    ref = as_reference(ref)
    client = client or Client()
    digest = ref.digest or fetch_manifest(ref, client=client)[1]
    client.request("DELETE", ref.api_host, f"/v2/{ref.repository}/manifests/{digest}",
                   scope=f"repository:{ref.repository}:delete,pull,push", expect=(202, 200, 404)).close()
    return digest


def read_image_config(ref: Reference | str, *, platform: str = DEFAULT_PLATFORM,
                      client: Client | None = None, manifest: Manifest | None = None) -> ImageConfig:
    """The image config (labels, env, entrypoint, diff ids) read from the registry without pulling
    any layer; ``manifest``: ``ref``'s, when the caller has read it already."""
    ref = as_reference(ref)
    client = client or Client()
    manifest = manifest or read_manifest(ref, platform=platform, client=client)
    digest, size = manifest.config.digest, manifest.config.size
    if not digest:
        raise RegistryError(f"manifest of {ref} has no config descriptor")
    if size > MAX_CONFIG_BYTES:
        raise RegistryError(f"config of {ref} is {size} bytes, more than an image config should be")
    raw = read_blob(ref, digest, client=client, limit=MAX_CONFIG_BYTES)
    return parse_image_config(raw, digest, f"config blob {digest} of {ref}")


def get_image_config(ref: Reference | str, *, platform: str = DEFAULT_PLATFORM,
                     client: Client | None = None) -> dict[str, Any]:
    """The image config as JSON: ``read_image_config``'s dict view (see ``get_manifest``)."""
    return read_image_config(ref, platform=platform, client=client).document()
