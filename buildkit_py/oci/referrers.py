"""OCI 1.1 referrers: artifacts that point at an image through their manifest's ``subject``
(an SBOM, a signature), pushed beside the image and found from its digest.

Pushing (``push_referrer``): the artifact's blobs, the empty config, then the manifest by
digest, with ``subject`` = the image's descriptor and ``artifactType`` set (image-spec 1.1,
"guidelines for artifact usage"). A registry that serves the referrers API indexes it on its
own and says so with the ``OCI-Subject`` header; for one that does not (distribution 2.x, the
registry the tests run), the client keeps the *referrers tag schema* (distribution-spec 1.1):
an image index tagged ``sha256-<hex of the subject digest>`` that lists the referrers' descriptors
(with their ``artifactType`` and annotations). Updating it is read, add, put: the entries other
tools put there are kept; ``replaces`` drops the ones the new artifact supersedes. Two clients
updating the same tag at the same moment can lose one entry (the schema has no lock; the spec
says as much).

Finding (``list_referrers``): ``GET /v2/<name>/referrers/<digest>`` where the registry serves
it (any answer but 404), else the tag schema's index; no index means no referrers."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from buildkit_py.errors import ManifestNotFound, RegistryError
from buildkit_py.oci.blobs import upload_bytes
from buildkit_py.oci.manifests import (
    INDEX_TYPES,
    MAX_MANIFEST_BYTES,
    MEDIA_OCI_INDEX,
    MEDIA_OCI_MANIFEST,
    canonical_json,
    fetch_manifest,
    json_object,
    put_manifest,
)
from buildkit_py.oci.transport import Client, pull_scope, push_scope, read_limited, sha256_bytes
from buildkit_py.reference import Reference, as_reference

# image-spec 1.1: the config of an artifact that has none, and its one fixed blob.
MEDIA_EMPTY = "application/vnd.oci.empty.v1+json"
EMPTY_JSON = b"{}"
SUBJECT_HEADER = "OCI-Subject"  # a registry with the referrers API names the subject it indexed
VIA_API, VIA_TAG = "referrers-api", "tag-schema"


@dataclass(frozen=True)
class Blob:
    """One layer of an artifact: its bytes, media type and annotations (a file title, say)."""

    media_type: str
    data: bytes
    annotations: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Referrer:
    """A referrer as an index lists it: the artifact manifest's descriptor."""

    digest: str
    media_type: str
    size: int
    artifact_type: str | None
    annotations: dict[str, str]

    @classmethod
    def from_descriptor(cls, desc: Mapping[str, Any]) -> Referrer:
        return cls(str(desc.get("digest") or ""), str(desc.get("mediaType") or ""), int(desc.get("size") or 0),
                   desc.get("artifactType"), dict(desc.get("annotations") or {}))

    def descriptor(self) -> dict[str, Any]:
        desc: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.artifact_type:
            desc["artifactType"] = self.artifact_type
        if self.annotations:
            desc["annotations"] = dict(self.annotations)
        return desc


@dataclass(frozen=True)
class Referrers:
    """The referrers of one subject, and how they were found (VIA_API or VIA_TAG)."""

    subject: str
    via: str
    items: tuple[Referrer, ...]


@dataclass(frozen=True)
class PushedReferrer:
    ref: str  # repository@digest of the artifact manifest
    digest: str
    subject: str
    via: str  # VIA_API: the registry indexed it; VIA_TAG: listed in the sha256-<hex> index
    fallback_tag: str | None  # the tag schema's tag it was listed under


def fallback_tag(digest: str) -> str:
    """The tag schema's tag for a subject digest: ``sha256:ab..`` -> ``sha256-ab..``."""
    algorithm, _, hexpart = digest.partition(":")
    if not algorithm or not hexpart:
        raise RegistryError(f"{digest!r} is not a digest")
    return f"{algorithm}-{hexpart}"


def descriptor_of(ref: Reference | str, *, client: Client | None = None) -> dict[str, Any]:
    """``{mediaType, digest, size}`` of the manifest (or index) ``ref`` names, as a ``subject``
    points at it."""
    raw, digest, media_type = fetch_manifest(ref, client=client)
    return {"mediaType": media_type, "digest": digest, "size": len(raw)}


def artifact_manifest(subject: Mapping[str, Any], artifact_type: str, layers: Sequence[Mapping[str, Any]],
                      annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """An image-spec 1.1 artifact manifest: empty config, ``artifactType``, ``subject``."""
    manifest: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": MEDIA_OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": {"mediaType": MEDIA_EMPTY, "digest": sha256_bytes(EMPTY_JSON), "size": len(EMPTY_JSON),
                   "data": base64.b64encode(EMPTY_JSON).decode()},
        "layers": list(layers),
        "subject": {k: subject[k] for k in ("mediaType", "digest", "size")},
    }
    if annotations:
        manifest["annotations"] = dict(sorted(annotations.items()))
    return manifest


def push_referrer(subject_ref: Reference | str, subject: Mapping[str, Any], artifact_type: str,
                  blobs: Sequence[Blob], *,
                  annotations: dict[str, str] | None = None, replaces: Callable[[Referrer], bool] | None = None,
                  client: Client | None = None) -> PushedReferrer:
    """Push an artifact whose ``subject`` is ``subject`` (a descriptor from ``descriptor_of``)
    into ``subject_ref``'s repository, and make it findable: by the registry's referrers API
    when it indexes it, else in the tag schema's index, where an entry that ``replaces``
    accepts (an older version of the same artifact) gives way to the new one."""
    ref = as_reference(subject_ref)
    client = client or Client()
    upload_bytes(ref, EMPTY_JSON, client=client)
    layers = []
    for blob in blobs:
        uploaded = upload_bytes(ref, blob.data, client=client)
        layer: dict[str, Any] = {"mediaType": blob.media_type, "digest": uploaded.digest, "size": uploaded.size}
        if blob.annotations:
            layer["annotations"] = dict(blob.annotations)
        layers.append(layer)
    manifest = artifact_manifest(subject, artifact_type, layers, annotations)
    raw = canonical_json(manifest)
    digest = sha256_bytes(raw)
    resp = client.request("PUT", ref.api_host, f"/v2/{ref.repository}/manifests/{digest}",
                          scope=push_scope(ref.repository), expect=(201, 200),
                          headers={"Content-Type": MEDIA_OCI_MANIFEST}, body=raw)
    resp.close()
    pinned = Reference(ref.registry, ref.repository, None, digest)
    if resp.headers.get(SUBJECT_HEADER) == subject["digest"]:
        return PushedReferrer(str(pinned), digest, subject["digest"], VIA_API, None)
    entry = Referrer(digest, MEDIA_OCI_MANIFEST, len(raw), artifact_type, dict(manifest.get("annotations") or {}))
    tag = _add_to_fallback_index(ref, subject["digest"], entry, replaces, client)
    return PushedReferrer(str(pinned), digest, subject["digest"], VIA_TAG, tag)


def _fallback_index(ref: Reference, subject_digest: str, client: Client) -> dict[str, Any] | None:
    """The tag schema's index for ``subject_digest``, or None when there is none yet."""
    tag_ref = Reference(ref.registry, ref.repository, fallback_tag(subject_digest))
    try:
        raw, _, media_type = fetch_manifest(tag_ref, client=client)
    except ManifestNotFound:
        return None
    if media_type not in INDEX_TYPES:
        raise RegistryError(f"{tag_ref} exists but is not an image index, so it cannot list referrers",
                            hint="the tag schema reserves sha256-<hex> tags for referrer indexes: "
                                 "remove or rename what is tagged there")
    return json_object(raw, f"index {tag_ref}")


def _add_to_fallback_index(ref: Reference, subject_digest: str, entry: Referrer,
                           replaces: Callable[[Referrer], bool] | None, client: Client) -> str:
    index = _fallback_index(ref, subject_digest, client) or {"schemaVersion": 2, "mediaType": MEDIA_OCI_INDEX,
                                                              "manifests": []}
    kept = [d for d in index.get("manifests") or []
            if d.get("digest") != entry.digest and not (replaces and replaces(Referrer.from_descriptor(d)))]
    tag = fallback_tag(subject_digest)
    put_manifest(Reference(ref.registry, ref.repository, tag), {**index, "manifests": [*kept, entry.descriptor()]},
                 MEDIA_OCI_INDEX, client=client)
    return tag


def record_referrers(ref: Reference | str, subject_digest: str, entries: Sequence[Referrer], *,
                     client: Client | None = None) -> str:
    """Make ``entries`` (artifact manifests already in ``ref``'s repository, each with
    ``subject_digest`` as its subject) findable there, as a copy needs: a registry with the
    referrers API indexed them when they were put (VIA_API); else they join the tag schema's
    index, beside what it lists. Returns how they are found."""
    ref = as_reference(ref)
    client = client or Client()
    listed = list_referrers(ref, subject_digest, client=client)
    if listed.via == VIA_API:
        return VIA_API
    have = {r.digest for r in listed.items}
    for entry in entries:
        if entry.digest not in have:
            _add_to_fallback_index(ref, subject_digest, entry, None, client)
            have.add(entry.digest)
    return VIA_TAG


def list_referrers(ref: Reference | str, subject_digest: str, *, artifact_type: str | None = None,
                   client: Client | None = None) -> Referrers:
    """The referrers of ``subject_digest`` in ``ref``'s repository, those of ``artifact_type``
    only when given: from the referrers API, else from the tag schema's index."""
    ref = as_reference(ref)
    client = client or Client()
    resp = client.request("GET", ref.api_host, f"/v2/{ref.repository}/referrers/{subject_digest}",
                          scope=pull_scope(ref.repository), expect=(200, 404),
                          params={"artifactType": artifact_type} if artifact_type else None,
                          headers={"Accept": MEDIA_OCI_INDEX}, stream=True)
    with resp:
        body = read_limited(resp, MAX_MANIFEST_BYTES, f"referrers of {subject_digest}")
    if resp.status_code == 200:
        try:
            index = json.loads(body)
        except ValueError as exc:
            raise RegistryError(f"{ref.registry} answered the referrers of {subject_digest} with something "
                                "that is not JSON") from exc
        via = VIA_API
    else:  # 404: no referrers API here (the spec forbids a 404 from one that has it)
        index = _fallback_index(ref, subject_digest, client) or {}
        via = VIA_TAG
    items = tuple(Referrer.from_descriptor(d) for d in index.get("manifests") or [] if isinstance(d, dict))
    if artifact_type:  # a registry may ignore the filter (it says so in OCI-Filters-Applied); the tag never filters
        items = tuple(r for r in items if r.artifact_type == artifact_type)
    return Referrers(subject_digest, via, items)
