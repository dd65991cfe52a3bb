"""Copy an image between repositories or registries (``imgbuild mirror``): blobs the
destination lacks (cross-repository mount when it is the same registry), streamed from the
source straight into the destination, then the manifest bytes unchanged.

An index (a multi-platform image, or an image with BuildKit's attestation manifests) is
copied whole by default: every manifest it names, their blobs, then the index bytes, so the
destination's digest is the source's. A platform filter copies the chosen platforms and the
attestation manifests that describe them under a new index, whose digest then differs (the
result says which platforms went and which stayed behind).

An image's referrers go with it: for each manifest copied (the top one only when its digest is
kept), the artifacts whose ``subject`` it is (SBOMs, attestations: the referrers API or the tag
schema's ``sha256-<hex>`` index) and cosign's ``sha256-<hex>.sig`` / ``.att`` / ``.sbom`` tags,
each with what it names and its own referrers (a signature of an SBOM), so that
``imgbuild sbom``, ``cosign verify`` and ``oras discover`` find at the copy what they found at
the source. A new index (a platform filter) gets none of the source index's: they name the
source's digest, which the copy does not have."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from buildkit_py.errors import ManifestNotFound, RegistryError, RegistryUnreachable, UsageError
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
from buildkit_py.oci.referrers import fallback_tag, list_referrers, record_referrers
from buildkit_py.oci.signatures import MEDIA_SIMPLE_SIGNING, append_signature_layers
from buildkit_py.oci.transport import Client, Progress, pull_scope, push_scope, sha256_bytes
from buildkit_py.reference import Reference, as_reference

CHUNK = 1 << 20
# BuildKit's marks on the attestation manifests it adds to an index (docs: attestation storage).
REFERENCE_TYPE = "vnd.docker.reference.type"
REFERENCE_DIGEST = "vnd.docker.reference.digest"
ATTESTATION = "attestation-manifest"
# cosign's tags beside an image's digest: signatures, attestations, attached SBOMs
COSIGN_SUFFIXES = {".sig": "cosign signature", ".att": "cosign attestation", ".sbom": "cosign sbom"}


@dataclass(frozen=True)
class CopiedReferrer:
    """One artifact copied with the image: what it refers to and what it is."""

    subject: str  # the manifest digest it refers to
    digest: str  # the artifact manifest's
    kind: str  # its artifactType, or one of COSIGN_SUFFIXES' words
    tag: str | None  # cosign's tag it was found under; None for an OCI 1.1 referrer


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
    referrers: tuple[CopiedReferrer, ...] = ()  # artifacts that refer to what was copied

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
        self.copied: list[str] = []  # manifest digests put at the destination, for their referrers

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

    def child(self, entry: Mapping[str, Any]) -> None:
        digest = entry["digest"]
        if digest in self.done:
            return
        raw, got, media_type = fetch_manifest(self.src.with_tag(None).with_digest(digest), client=self.client)
        self.tree(raw, media_type)
        put_manifest(Reference(self.dest.registry, self.dest.repository, None, got), raw, media_type,
                     client=self.client)
        self.done.add(digest)
        self.copied.append(got)
        self.manifests += 1
        if self.progress:
            self.progress("manifest", f"{self.dest.repository}@{got}", len(raw), len(raw))

    def referrers(self, subjects: Sequence[str]) -> list[CopiedReferrer]:
        """The referrers of each of ``subjects`` (copied already), copied and made findable at the
        destination; then theirs in turn (a signature of an SBOM)."""
        found: list[CopiedReferrer] = []
        queue, seen = list(subjects), set(subjects)
        while queue:
            subject = queue.pop(0)
            listed = list_referrers(self.src, subject, client=self.client).items
            for item in listed:
                self.child(item.descriptor())
            if listed:
                record_referrers(self.dest, subject, listed, client=self.client)
            found += [CopiedReferrer(subject, r.digest, r.artifact_type or r.media_type, None) for r in listed]
            found += self.cosign_tags(subject)
            for r in found:
                if r.digest not in seen:
                    seen.add(r.digest)
                    queue.append(r.digest)
        return found

    def cosign_tags(self, subject: str) -> list[CopiedReferrer]:
        found = []
        for suffix, kind in COSIGN_SUFFIXES.items():
            tag = fallback_tag(subject) + suffix
            try:
                raw, got, media_type = fetch_manifest(self.src.with_tag(tag), client=self.client)
            except ManifestNotFound:
                continue
            self.tree(raw, media_type)
            layers = list(json.loads(raw).get("layers") or [])
            if suffix == ".sig" and self.tag_exists(tag) and all(x.get("mediaType") == MEDIA_SIMPLE_SIGNING
                                                                  for x in layers):
                # the destination's own signatures stay: the source's are appended (as cosign appends)
                append_signature_layers(self.dest, subject, layers, client=self.client)
            else:  # the bytes unchanged, so the copy's digest is the source's
                put_manifest(self.dest.with_tag(tag), raw, media_type, client=self.client)
            self.manifests += 1
            found.append(CopiedReferrer(subject, got, kind, tag))
        return found

    def tag_exists(self, tag: str) -> bool:
        try:
            fetch_manifest(self.dest.with_tag(tag), client=self.client)
        except ManifestNotFound:
            return False
        return True

    def blob(self, desc: Mapping[str, Any]) -> None:
        digest = desc["digest"]
        if digest not in self.done:
            _copy_blob(self.src, self.dest, desc, self.client, self.progress)
            self.done.add(digest)


def _copy_blob(src: Reference, dest: Reference, desc: Mapping[str, Any], client: Client,
               progress: Progress | None) -> int:
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


def _stream_blob(src: Reference, dest: Reference, digest: str, size: int, location: str, client: Client,
                 progress: Progress | None) -> int:
    counter = [0]

    def body() -> SizedBody:
        counter[0] = 0
        resp = client.request("GET", src.api_host, f"/v2/{src.repository}/blobs/{digest}",
                              scope=pull_scope(src.repository), stream=True)

        def pieces() -> Iterator[bytes]:
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


def is_attestation(entry: Mapping[str, Any]) -> bool:
    return bool((entry.get("annotations") or {}).get(REFERENCE_TYPE) == ATTESTATION)


def _choose(index: Mapping[str, Any], platforms: Sequence[str],
            what: str) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
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


def _manifest_platform(src: Reference, raw: bytes, client: Client) -> dict[str, Any] | None:
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
    subjects = ([source_digest] if digest == source_digest else []) + copier.copied
    referrers = copier.referrers(subjects)
    return CopyResult(digest, source_digest, media_type, copied, left_out, attestations, copier.manifests + 1,
                      tuple(referrers))
