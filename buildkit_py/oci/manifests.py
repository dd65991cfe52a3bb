"""Manifests: fetch (digest-checked, size-limited), pick a platform from an index, put,
delete, and an image's config read without pulling a layer."""

from __future__ import annotations

import json

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


def _media_type(resp: requests.Response, body: dict) -> str:
    header = (resp.headers.get("Content-Type") or "").split(";", 1)[0].strip()
    return body.get("mediaType") or header


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
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise RegistryError(f"manifest of {ref} is not JSON") from exc
    media_type = _media_type(resp, body)
    if media_type not in MANIFEST_TYPES + INDEX_TYPES:
        raise RegistryError(f"{ref} has unsupported manifest type {media_type!r}",
                            hint="only OCI and Docker schema 2 manifests are supported")
    return raw, digest, media_type


def get_manifest(ref: Reference | str, *, platform: str = DEFAULT_PLATFORM,
                 client: Client | None = None) -> tuple[dict, str, str]:
    """``(manifest, digest, media_type)``. For an index (multi-platform image) the entry
    for ``platform`` is fetched and returned."""
    ref = as_reference(ref)
    client = client or Client()
    raw, digest, media_type = fetch_manifest(ref, client=client)
    body = json.loads(raw)
    if media_type in INDEX_TYPES:
        child = select_platform(body, platform, str(ref))
        raw, digest, media_type = fetch_manifest(ref.with_digest(child["digest"]), client=client)
        body = json.loads(raw)
        if media_type in INDEX_TYPES:
            raise RegistryError(f"{ref}: nested index for {platform} is not supported")
    return body, digest, media_type


def platform_of(entry: dict) -> str:
    """``os/arch[/variant]`` of an index entry (``unknown/unknown`` for BuildKit's attestations)."""
    p = entry.get("platform") or {}
    return "/".join(x for x in (p.get("os"), p.get("architecture"), p.get("variant")) if x) or "unknown"


def platform_matches(entry: dict, platform: str) -> bool:
    """Does the index entry serve ``platform`` (``os/arch``, or ``os/arch/variant`` to be exact)?"""
    os_name, _, rest = platform.partition("/")
    arch, _, variant = rest.partition("/")
    p = entry.get("platform") or {}
    return p.get("os") == os_name and p.get("architecture") == arch and (not variant or p.get("variant") == variant)


def select_platform(index: dict, platform: str, what: str = "image") -> dict:
    entries = index.get("manifests") or []
    for entry in entries:
        if platform_matches(entry, platform):
            return entry
    seen = ", ".join(platform_of(e) for e in entries)
    raise RegistryError(f"{what} has no {platform} manifest (has: {seen or 'none'})")


def put_manifest(ref: Reference | str, manifest: dict | bytes, media_type: str | None = None, *,
                 client: Client | None = None) -> str:
    """PUT a manifest under ``ref``'s tag (or its digest). Returns the digest."""
    ref = as_reference(ref)
    client = client or Client()
    raw = manifest if isinstance(manifest, bytes) else canonical_json(manifest)
    if media_type is None:
        media_type = json.loads(raw).get("mediaType") or MEDIA_OCI_MANIFEST
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


def canonical_json(obj) -> bytes:
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


def get_image_config(ref: Reference | str, *, platform: str = DEFAULT_PLATFORM,
                     client: Client | None = None) -> dict:
    """The image config (labels, env, entrypoint) read from the registry without pulling
    any layer."""
    ref = as_reference(ref)
    client = client or Client()
    manifest, _, _ = get_manifest(ref, platform=platform, client=client)
    desc = manifest.get("config") or {}
    digest, size = desc.get("digest"), int(desc.get("size") or 0)
    if not digest:
        raise RegistryError(f"manifest of {ref} has no config descriptor")
    if size > MAX_CONFIG_BYTES:
        raise RegistryError(f"config of {ref} is {size} bytes, more than an image config should be")
    raw = read_blob(ref, digest, client=client, limit=MAX_CONFIG_BYTES)
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise RegistryError(f"config blob {digest} of {ref} is not JSON") from exc

