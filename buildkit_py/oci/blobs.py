"""Blobs: presence, small reads, deletes, and uploads of files.

Upload of a file (``upload_blob``), measured against ``curl -T`` (README design notes):

- one upload session, the whole file streamed in one PATCH (no client-side chunking: the
  registry, not the link, is the limit on loopback), closed by ``PUT ?digest=``; the
  registry hashes what it receives and refuses a mismatch;
- the file is hashed once, before the upload (4 MiB reads), so a blob the registry has
  is never sent (a second push uploads nothing). Hashing while uploading instead was
  measured: on 2 cores the hash then competes with the upload for CPU and the first push
  gained 4% while a second push of 1 GiB re-sent half of it; parallel files (weights.push)
  overlap one file's hash with another's upload instead;
- resumable: a broken stream asks the session how far it got (``GET`` on the upload
  location, ``Range: 0-N``) and sends the rest from there; a session the registry lost
  starts over. Retries follow the client's RetryPolicy.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from urllib.parse import urljoin

from buildkit_py.errors import DigestMismatch, RegistryError, RegistryUnreachable
from buildkit_py.oci.transport import (
    STREAM_ERRORS,
    Client,
    Progress,
    pull_scope,
    push_scope,
    read_limited,
    sha256_bytes,
)
from buildkit_py.reference import Reference, as_reference

CHUNK = 1 << 20  # read/hash unit of small helpers
UPLOAD_PIECE = 4 << 20  # a streamed upload body is read from the file in pieces this big
MAX_CONFIG_BYTES = 16 << 20
MEDIA_OCTET = "application/octet-stream"



@dataclass(frozen=True)
class UploadResult:
    digest: str
    size: int
    uploaded_bytes: int  # 0 when the registry had it already (or mounted it)


def head_blob(ref: Reference | str, digest: str, *, client: Client | None = None) -> int | None:
    """The blob's size when the repository has it, else None."""
    ref = as_reference(ref)
    client = client or Client()
    resp = client.request("HEAD", ref.api_host, f"/v2/{ref.repository}/blobs/{digest}",
                          scope=pull_scope(ref.repository), expect=(200, 404))
    resp.close()
    if resp.status_code == 404:
        return None
    return int(resp.headers.get("Content-Length") or 0)


def blob_exists(ref: Reference | str, digest: str, *, client: Client | None = None) -> bool:
    return head_blob(ref, digest, client=client) is not None


def read_blob(ref: Reference | str, digest: str, *, client: Client | None = None,
              limit: int = MAX_CONFIG_BYTES) -> bytes:
    """A small blob into memory (configs), digest verified."""
    ref = as_reference(ref)
    client = client or Client()
    resp = client.request("GET", ref.api_host, f"/v2/{ref.repository}/blobs/{digest}",
                          scope=pull_scope(ref.repository), stream=True)
    with resp:
        raw = read_limited(resp, limit, f"blob {digest}")
    if sha256_bytes(raw) != digest:
        raise DigestMismatch(f"blob {digest} of {ref} does not match its digest (got {sha256_bytes(raw)})")
    return raw


def read_blob_range(ref: Reference | str, digest: str, start: int, end: int, *,
                    client: Client | None = None) -> bytes:
    """Bytes ``start`` to ``end`` (exclusive) of a blob, by one ranged GET, as a lazy puller reads
    a layer's footer and table of contents; a registry that ignores the range (200) is refused
    rather than streamed whole."""
    ref = as_reference(ref)
    client = client or Client()
    resp = client.request("GET", ref.api_host, f"/v2/{ref.repository}/blobs/{digest}", expect=(206,),
                          headers={"Range": f"bytes={start}-{end - 1}"}, scope=pull_scope(ref.repository),
                          stream=True)
    with resp:
        raw = read_limited(resp, end - start, f"bytes {start}-{end - 1} of blob {digest}")
    if len(raw) != end - start:
        raise RegistryError(f"{ref}: blob {digest} gave {len(raw)} bytes for the range {start}-{end - 1}")
    return raw


def delete_blob(ref: Reference | str, digest: str, *, client: Client | None = None) -> None:
    ref = as_reference(ref)
    client = client or Client()
    client.request("DELETE", ref.api_host, f"/v2/{ref.repository}/blobs/{digest}",
                   scope=f"repository:{ref.repository}:delete,pull,push", expect=(202, 200, 404)).close()


def sha256_file(path: str | os.PathLike[str], progress: Progress | None = None, label: str = "") -> tuple[str, int]:
    """``(digest, size)`` of a file, read in 4 MiB pieces."""
    hasher, size = hashlib.sha256(), 0
    total = os.path.getsize(path)
    buf = bytearray(UPLOAD_PIECE)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            hasher.update(view[:n])
            size += n
            if progress:
                progress("hash", label or os.fspath(path), size, total)
    return "sha256:" + hasher.hexdigest(), size


def start_upload(ref: Reference, *, client: Client, mount: tuple[str, str] | None = None) -> tuple[str, bool]:
    """POST an upload session. With ``mount=(digest, from_repo)`` the registry may link
    the blob from another repository: returns ``(location, mounted)``."""
    params = {"mount": mount[0], "from": mount[1]} if mount else None
    scope = (push_scope(ref.repository),) + ((pull_scope(mount[1]),) if mount else ())
    resp = client.request("POST", ref.api_host, f"/v2/{ref.repository}/blobs/uploads/", scope=scope,
                          expect=(201, 202), params=params, headers={"Content-Length": "0"})
    resp.close()
    location = resp.headers.get("Location")
    if resp.status_code == 201:
        return location or "", True
    if not location:
        raise RegistryError(f"registry {ref.registry} started an upload without a Location")
    return _absolute(client, ref, location), False


def _absolute(client: Client, ref: Reference, location: str) -> str:
    return urljoin(client.base_url(ref.api_host) + "/", location)


class SizedBody:
    """An iterable body of known length: requests then sends Content-Length and streams
    the pieces instead of switching to chunked transfer encoding."""

    def __init__(self, pieces: Iterable[bytes], length: int):
        self._pieces, self._length = pieces, length

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._pieces)


def upload_blob(ref: Reference | str, path: str | os.PathLike[str], *, digest: str | None = None,
                client: Client | None = None, progress: Progress | None = None, label: str = "",
                skip_existing: bool = True) -> UploadResult:
    """Upload a file as a blob unless the registry has it (hashed first when ``digest`` is
    not given). A file that changed since it was hashed is refused by the registry's digest
    check: DigestMismatch."""
    ref = as_reference(ref)
    client = client or Client()
    path = os.fspath(path)
    label = label or path
    size = os.path.getsize(path)
    if digest is None:
        digest, size = sha256_file(path, progress, label)
    if skip_existing and blob_exists(ref, digest, client=client):
        if progress:
            progress("exists", label, size, size)
        return UploadResult(digest, size, 0)
    return _upload(ref, _Source(path, size, label, progress), digest, client)


@dataclass
class _Source:
    """A file being uploaded, and how many of its bytes were sent."""

    path: str
    size: int
    label: str
    progress: Progress | None
    sent: int = 0


def _upload(ref: Reference, src: _Source, digest: str, client: Client) -> UploadResult:
    scope = push_scope(ref.repository)
    path, size = src.path, src.size
    location, _ = start_upload(ref, client=client)
    offset, failures = 0, 0
    while True:
        try:
            location = _patch(ref, client, location, src, offset)
            break
        except (*STREAM_ERRORS, RegistryUnreachable) as exc:
            failures += 1
            if failures > client.retry.retries:
                raise RegistryUnreachable(f"upload of {path} to {ref.registry} kept failing: {exc}") from exc
            client.retry.wait(failures - 1)
            offset, location = _resume_point(ref, location, client)
    try:
        client.request("PUT", ref.api_host, location, scope=scope, expect=(201,), params={"digest": digest},
                       headers={"Content-Length": "0", "Content-Type": MEDIA_OCTET}).close()
    except RegistryError as exc:
        if "DIGEST_INVALID" in str(exc) or "BLOB_UPLOAD_INVALID" in str(exc):
            raise DigestMismatch(f"{path} changed while it was uploaded (expected {digest})") from exc
        raise
    return UploadResult(digest, size, src.sent)


def _patch(ref: Reference, client: Client, location: str, src: _Source, offset: int) -> str:
    """PATCH bytes [offset, size) of the file in one streamed request, counting them in
    ``src.sent``; returns the next location."""
    before, size = src.sent, src.size

    def body() -> SizedBody:
        src.sent = before  # a resend after an auth re-challenge counts from the start
        return SizedBody(_file_pieces(src, offset), size - offset)

    headers = {"Content-Type": MEDIA_OCTET, "Content-Length": str(size - offset)}
    if size:
        headers["Content-Range"] = f"{offset}-{size - 1}"
    resp = client.request("PATCH", ref.api_host, location, scope=push_scope(ref.repository), expect=(202,),
                          body=body, retry=False, headers=headers)
    resp.close()
    return _absolute(client, ref, resp.headers.get("Location") or location)


def _file_pieces(src: _Source, start: int) -> Iterator[bytes]:
    path, stop, progress = src.path, src.size, src.progress
    with open(path, "rb", buffering=0) as fh:
        fh.seek(start)
        pos = start
        while pos < stop:
            piece = fh.read(min(UPLOAD_PIECE, stop - pos))
            if not piece:
                raise DigestMismatch(f"{path} shrank while it was being uploaded")
            pos += len(piece)
            src.sent += len(piece)
            if progress:
                progress("upload", src.label, pos, stop)
            yield piece


def _resume_point(ref: Reference, location: str, client: Client) -> tuple[int, str]:
    """How much of the session the registry holds: ``(next offset, location)``; a lost
    session starts a new one from 0."""
    resp = client.request("GET", ref.api_host, location, scope=push_scope(ref.repository), expect=(204, 404))
    resp.close()
    m = re.match(r"^(\d+)-(\d+)$", resp.headers.get("Range", ""))
    if resp.status_code == 204 and m:
        return int(m.group(2)) + 1, _absolute(client, ref, resp.headers.get("Location") or location)
    if resp.status_code == 204 and not resp.headers.get("Range"):
        return 0, _absolute(client, ref, resp.headers.get("Location") or location)
    return 0, start_upload(ref, client=client)[0]


def upload_bytes(ref: Reference | str, data: bytes, *, client: Client | None = None) -> UploadResult:
    """A small in-memory blob (configs): skipped when present, else one PUT."""
    ref = as_reference(ref)
    client = client or Client()
    digest = sha256_bytes(data)
    if blob_exists(ref, digest, client=client):
        return UploadResult(digest, len(data), 0)
    location, _ = start_upload(ref, client=client)
    client.request("PUT", ref.api_host, location, scope=push_scope(ref.repository), expect=(201,),
                   params={"digest": digest}, body=data,
                   headers={"Content-Type": MEDIA_OCTET, "Content-Length": str(len(data))}).close()
    return UploadResult(digest, len(data), len(data))
