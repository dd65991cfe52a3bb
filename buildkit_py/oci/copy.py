"""Copy an image between repositories or registries (``imgbuild mirror``): blobs the
destination lacks (cross-repository mount when it is the same registry), streamed from the
source straight into the destination, then the manifest bytes unchanged.

An index (a multi-platform image, or an image with BuildKit's attestation manifests) is
copied whole by default: every manifest it names, their blobs, then the index bytes, so the
destination's digest is the source's. A platform filter copies the chosen platforms and the
attestation manifests that describe them under a new index, whose digest then differs (the
result says which platforms went and which stayed behind)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from buildkit_py.errors import RegistryError, RegistryUnreachable, UsageError
from buildkit_py.oci.blobs import MEDIA_OCTET, SizedBody, blob_exists, read_blob, start_upload
from buildkit_py.oci.manifests import (
    INDEX_TYPES,
    MEDIA_DOCKER_CONFIG,
    MEDIA_OCI_CONFIG,
    canonical_json,
    fetch_manifest,
    platform_matches,
    platform_of,
    put_manifest,
)
from buildkit_py.oci.transport import Client, Progress, pull_scope, push_scope, sha256_bytes
from buildkit_py.reference import Reference, as_reference

CHUNK = 1 << 20
# BuildKit's marks on the attestation manifests it adds to an index (docs: attestation storage).
REFERENCE_TYPE = "vnd.docker.reference.type"
REFERENCE_DIGEST = "vnd.docker.reference.digest"
ATTESTATION = "attestation-manifest"


@dataclass(frozen=True)
class CopyResult:
    """What ``copy_image`` put at the destination."""

    digest: str  # what the destination tag (or digest) now points at
    source_digest: str  # what the source reference pointed at
    media_type: str  # of the destination's top manifest (an index stays an index)
    platforms: tuple[str, ...]  # image platforms copied, in the source's order ("linux/amd64")
    left_out: tuple[str, ...]  # platforms of the source a filter left behind
    attestations: int  # attestation manifests copied with them
    manifests: int  # manifests put at the destination, the top one included

    @property
    def same_digest(self) -> bool:
        return self.digest == self.source_digest


class _Copier:
    """One copy: the blobs already seen at the destination are not asked about twice (layers
    shared by platforms, an attestation's empty config)."""

    def __init__(self, src: Reference, dest: Reference, client: Client, progress: Progress | None):
        self.src, self.dest, self.client, self.progress = src, dest, client, progress
        self.done: set[str] = set()
        self.manifests = 0

    def tree(self, raw: bytes, media_type: str) -> None:
        """Everything a manifest or an index names is at the destination; then the bytes
        themselves, by digest (the caller tags the top one)."""
        body = json.loads(raw)
        if media_type in INDEX_TYPES:
            for entry in body.get("manifests") or []:
                self.child(entry)
            return
        for desc in [body.get("config")] + list(body.get("layers") or []):
            if desc and not desc.get("urls"):  # foreign layers stay where they are
                self.blob(desc)

    def child(self, entry: dict) -> None:
        digest = entry["digest"]
        if digest in self.done:
            return
        raw, got, media_type = fetch_manifest(self.src.with_tag(None).with_digest(digest), client=self.client)
        self.tree(raw, media_type)
        put_manifest(Reference(self.dest.registry, self.dest.repository, None, got), raw, media_type,
                     client=self.client)
        self.done.add(digest)
        self.manifests += 1
        if self.progress:
            self.progress("manifest", f"{self.dest.repository}@{got}", len(raw), len(raw))

    def blob(self, desc: dict) -> None:
        digest = desc["digest"]
        if digest not in self.done:
            _copy_blob(self.src, self.dest, desc, self.client, self.progress)
            self.done.add(digest)


def _copy_blob(src: Reference, dest: Reference, desc: dict, client: Client, progress: Progress | None) -> int:
    digest, size = desc["digest"], int(desc.get("size") or 0)
    if blob_exists(dest, digest, client=client):
        if progress:
            progress("exists", digest, size, size)
        return 0
    mount = (digest, src.repository) if src.registry == dest.registry and src.repository != dest.repository else None
    location, mounted = start_upload(dest, client=client, mount=mount)
    if mounted:
        if progress:
            progress("mounted", digest, size, size)
        return 0
    failures = 0
    while True:
        try:
            return _stream_blob(src, dest, digest, size, location, client, progress)
        except RegistryUnreachable:
            failures += 1
            if failures > client.max_retries:
                raise
            client.retry.wait(failures - 1)
            location, _ = start_upload(dest, client=client)


def _stream_blob(src, dest, digest, size, location, client, progress) -> int:
    counter = [0]

    def body():
        counter[0] = 0
        resp = client.request("GET", src.api_host, f"/v2/{src.repository}/blobs/{digest}",
                              scope=pull_scope(src.repository), stream=True)

        def pieces():
            with resp:
                for piece in resp.iter_content(CHUNK):
                    counter[0] += len(piece)
                    if progress:
                        progress("copy", digest, counter[0], size)
                    yield piece
        return SizedBody(pieces(), size)

    # The destination checks the digest of what it receives (PUT ?digest=), so a corrupt
    # source blob is refused there, not stored.
    client.request("PUT", dest.api_host, location, scope=push_scope(dest.repository), expect=(201,),
                   params={"digest": digest}, body=body,
                   headers={"Content-Type": MEDIA_OCTET, "Content-Length": str(size)}).close()
    return counter[0]


def is_attestation(entry: dict) -> bool:
    return (entry.get("annotations") or {}).get(REFERENCE_TYPE) == ATTESTATION


def _choose(index: dict, platforms: Sequence[str], what: str) -> tuple[list[dict], tuple[str, ...]]:
    """The index entries for ``platforms`` and the attestation manifests that describe them;
    and the image platforms left out."""
    images = [e for e in index.get("manifests") or [] if not is_attestation(e)]
    have = [platform_of(e) for e in images]
    for wanted in platforms:
        if not any(platform_matches(e, wanted) for e in images):
            raise UsageError(f"{what} has no {wanted} manifest (has: {', '.join(have) or 'none'})",
                             hint="pick platforms it has, or leave --platform out to copy all of it")
    chosen = {e["digest"] for e in images if any(platform_matches(e, p) for p in platforms)}
    keep = [e for e in index.get("manifests") or []
            if e["digest"] in chosen or (is_attestation(e) and (e.get("annotations") or {}).get(REFERENCE_DIGEST)
                                         in chosen)]
    return keep, tuple(platform_of(e) for e in images if e["digest"] not in chosen)


def _manifest_platform(src: Reference, raw: bytes, client: Client) -> dict | None:
    """A single image manifest as an index entry would place it (``{"platform": {os,
    architecture, variant}}``), from its config (one small blob); None for an artifact
    (weights, a signature) whose config is not an image config."""
    config = json.loads(raw).get("config") or {}
    if config.get("mediaType") not in (MEDIA_OCI_CONFIG, MEDIA_DOCKER_CONFIG) or not config.get("digest"):
        return None
    try:
        body = json.loads(read_blob(src, config["digest"], client=client))
    except ValueError as exc:
        raise RegistryError(f"config blob {config['digest']} of {src} is not JSON") from exc
    return {"platform": {k: body[k] for k in ("os", "architecture", "variant") if isinstance(body.get(k), str)}}


def copy_image(src_ref: Reference | str, dest_ref: Reference | str, *, platforms: Sequence[str] = (),
               client: Client | None = None, progress: Progress | None = None) -> CopyResult:
    """Copy an image between repositories or registries (``imgbuild mirror``): blobs the
    destination lacks, then the manifest bytes unchanged, so the digest is the same.

    An index is copied with every manifest it names (each platform, BuildKit's attestation
    manifests, nested indexes) and their blobs. ``platforms`` (``os/arch[/variant]``) keeps
    only those image manifests and their attestations, in a new index: its digest differs
    from the source's (``CopyResult.same_digest``), unless the filter keeps everything. A
    single-platform source must be one of ``platforms`` when they are given. The destination
    tag defaults to the source's.
    """
    src, dest = as_reference(src_ref), as_reference(dest_ref)
    client = client or Client()
    raw, source_digest, media_type = fetch_manifest(src, client=client)
    copier = _Copier(src, dest, client, progress)
    attestations = 0
    left_out: tuple[str, ...] = ()
    if media_type in INDEX_TYPES:
        index = json.loads(raw)
        entries = list(index.get("manifests") or [])
        if platforms:
            entries, left_out = _choose(index, platforms, str(src))
            if len(entries) != len(index.get("manifests") or []):
                raw = canonical_json({**index, "manifests": entries})  # a new index: a new digest
        for entry in entries:
            copier.child(entry)
        copied = tuple(platform_of(e) for e in entries if not is_attestation(e))
        attestations = sum(1 for e in entries if is_attestation(e))
    else:
        entry = _manifest_platform(src, raw, client)
        if platforms and not (entry and any(platform_matches(entry, p) for p in platforms)):
            raise UsageError(f"{src} is a single-platform image ({platform_of(entry) if entry else 'not an image'}), "
                             f"not {', '.join(platforms)}", hint="leave --platform out to copy it")
        copier.tree(raw, media_type)
        copied = (platform_of(entry),) if entry else ()
    tag = dest.tag or src.tag
    target = Reference(dest.registry, dest.repository, tag, None if tag else sha256_bytes(raw))
    digest = put_manifest(target, raw, media_type, client=client)
    if progress:
        progress("manifest", str(target), len(raw), len(raw))
    return CopyResult(digest, source_digest, media_type, copied, left_out, attestations, copier.manifests + 1)
