"""Copy an image between repositories or registries (``imgbuild mirror``): blobs the
destination lacks (cross-repository mount when it is the same registry), streamed from the
source straight into the destination, then the manifest bytes unchanged."""

from __future__ import annotations

import json

from buildkit_py.errors import RegistryError, RegistryUnreachable
from buildkit_py.oci.blobs import MEDIA_OCTET, SizedBody, blob_exists, start_upload
from buildkit_py.oci.manifests import (
    DEFAULT_PLATFORM,
    INDEX_TYPES,
    fetch_manifest,
    put_manifest,
    select_platform,
)
from buildkit_py.oci.reference import Reference, as_reference
from buildkit_py.oci.transport import Client, Progress, pull_scope, push_scope

CHUNK = 1 << 20


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


def _copy_manifest(src: Reference, dest: Reference, raw: bytes, media_type: str, client: Client,
                   progress: Progress | None) -> None:
    body = json.loads(raw)
    for desc in [body.get("config")] + list(body.get("layers") or []):
        if desc and not desc.get("urls"):  # foreign layers stay where they are
            _copy_blob(src, dest, desc, client, progress)


def copy_image(src_ref: Reference | str, dest_ref: Reference | str, *, all_platforms: bool = False,
               platform: str = DEFAULT_PLATFORM, client: Client | None = None,
               progress: Progress | None = None) -> str:
    """Copy an image between repositories or registries (``imgbuild mirror``): blobs the
    destination lacks, then the manifest bytes unchanged, so the digest is the same.

    For a multi-platform source, copies the ``platform`` manifest only, or with
    ``all_platforms`` every child and the index. The destination tag defaults to the
    source's. Returns the digest now tagged at the destination.
    """
    src, dest = as_reference(src_ref), as_reference(dest_ref)
    client = client or Client()
    raw, digest, media_type = fetch_manifest(src, client=client)
    if media_type in INDEX_TYPES:
        index = json.loads(raw)
        if all_platforms:
            for entry in index.get("manifests") or []:
                child_raw, child_digest, child_type = fetch_manifest(src.with_digest(entry["digest"]), client=client)
                if child_type in INDEX_TYPES:
                    raise RegistryError(f"{src}: nested indexes are not supported")
                _copy_manifest(src, dest, child_raw, child_type, client, progress)
                put_manifest(Reference(dest.registry, dest.repository, None, child_digest), child_raw,
                             child_type, client=client)
        else:
            entry = select_platform(index, platform, str(src))
            raw, digest, media_type = fetch_manifest(src.with_digest(entry["digest"]), client=client)
    if media_type not in INDEX_TYPES:
        _copy_manifest(src, dest, raw, media_type, client, progress)
    tag = dest.tag or src.tag
    target = Reference(dest.registry, dest.repository, tag, None if tag else digest)
    put_manifest(target, raw, media_type, client=client)
    if progress:
        progress("manifest", str(target), len(raw), len(raw))
    return digest
