"""Verified streaming download of one blob into a file, resumable, in parallel ranges.

Why our own code (requests alone, and the ``oras`` SDK, measured slower: see the README's
design notes): the bytes go from the socket into the file and are hashed from the file by
another thread, so hashing is off the I/O path and no Python loop touches each byte.

- Plain http (loopback registries): a minimal HTTP/1.1 GET on a raw socket and
  ``os.splice`` socket -> pipe -> file, so the body never enters user space.
- https, a redirect, or anything unusual: ``requests`` with ``readinto`` a 4 MiB buffer
  and ``os.pwrite`` (same hashing thread).
- ``streams`` > 1 splits a large blob into that many ``Range`` requests, each written at
  its own offset; the hasher follows the contiguous prefix. A registry that ignores
  ``Range`` is read in one stream from the start.
- Resume: only the bytes not yet in the file (a ``.partial`` from an earlier pull) are
  requested. A download that stops (network gone, Ctrl-C) saves the hash's running state
  in the file's ``user.imgbuild.sha256`` extended attribute, with the file's size and
  mtime; the next call continues hashing from there instead of re-reading the file. A
  partial without that attribute, or changed since, is hashed from its start. A broken
  stream resumes from where it broke (the client's RetryPolicy). On failure the file is
  cut back to its contiguous prefix, so a later call can resume from it.
- Hashing reads the file with ``preadv`` into a 1 MiB buffer that stays in the CPU's
  cache (measured 1483 MiB/s from the page cache, against 1301 through ``mmap`` windows):
  memory stays flat.
"""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

try:
    import fcntl
except ImportError:  # not POSIX: no splice either, and no pipe to size
    fcntl = None  # type: ignore[assignment]

from buildkit_py.errors import DigestMismatch, RegistryError, RegistryUnreachable
from buildkit_py.oci.sha256_state import ResumableSha256
from buildkit_py.oci.transport import STREAM_ERRORS, Client, Progress, pull_scope
from buildkit_py.reference import Reference

BUFFER = 4 << 20  # requests path: readinto this much per call
HASH_BUFFER = 1 << 20  # hashed at once: small enough to stay in the CPU's cache
SPLICE_STEP = 1 << 20
RANGED_MIN_PART = 64 << 20  # no range smaller than this: a request costs more than it saves
_F_SETPIPE_SZ = 1031
HASH_STATE_XATTR = "user.imgbuild.sha256"
_HEAD_LIMIT = 64 << 10



def default_streams() -> int:
    """Parallel range requests for one blob: one per two cores, at most 4. On loopback each
    stream costs a core of kernel copying (measured: 1 stream beats 2 on 2 cores); over a
    real network several streams fill the pipe that one TCP window cannot."""
    return max(1, min(4, (os.cpu_count() or 2) // 2))


class _NoRange(Exception):
    """The registry answered 200 to a request for a range that does not start at 0."""


class _Cancelled(Exception):
    """Another part failed (or Ctrl-C): this one stops where it is."""


class _Ended(Exception):
    """The registry has no bytes at this position (416): the blob is shorter than promised."""


class _Frontier:
    """Where each part of a download has got to. Part i covers [start_i, end_i); its
    position only grows. The hasher waits for the contiguous prefix to pass a byte."""

    def __init__(self, bounds: list[tuple[int, int]], first_pos: int):
        self.bounds = bounds
        self.pos = [start for start, _ in bounds]
        self.pos[0] = first_pos
        self.cond = threading.Condition()
        self.stopped = False

    def advance(self, part: int, pos: int) -> None:
        with self.cond:
            self.pos[part] = pos
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()

    def contiguous(self) -> int:
        end = 0
        for (start, stop), pos in zip(self.bounds, self.pos, strict=True):
            if start > end:
                break
            end = pos
            if pos < stop:
                break
        return end

    def wait_past(self, at: int) -> int | None:
        """The end of the contiguous prefix once it is beyond ``at``; None when stopped."""
        with self.cond:
            while True:
                end = self.contiguous()
                if end > at:
                    return end
                if self.stopped:
                    return None
                self.cond.wait()


@dataclass(frozen=True)
class _Job:
    """One blob download: where it goes, how far each part is, whom to tell."""

    ref: Reference
    digest: str
    fd: int
    client: Client
    frontier: _Frontier
    received: list
    report: Callable[[], None]

    @property
    def path(self) -> str:
        return f"/v2/{self.ref.repository}/blobs/{self.digest}"

    def wrote(self, part: int, pos: int, n: int) -> None:
        """``n`` bytes of ``part`` landed, up to ``pos``."""
        self.received[part] += n
        self.frontier.advance(part, pos)
        self.report()


class _Hashing:
    """The blob's hash and how many of its first bytes it has taken in."""

    def __init__(self, hasher: ResumableSha256 | None = None, hashed: int = 0):
        self.hasher, self.hashed = hasher or ResumableSha256(), hashed
        self.settled = True  # False while a hashing thread may still change it


def _hash_file(fd: int, size: int, frontier: _Frontier, hashing: _Hashing) -> None:
    try:
        _hash_prefix(fd, size, frontier, hashing)
    finally:
        hashing.settled = True


def _hash_prefix(fd: int, size: int, frontier: _Frontier, hashing: _Hashing) -> None:
    buf = bytearray(HASH_BUFFER)
    view = memoryview(buf)
    pos = hashing.hashed
    while pos < size:
        avail = frontier.wait_past(pos)
        if avail is None:
            break
        while pos < avail:
            n = os.preadv(fd, [view[:min(HASH_BUFFER, avail - pos)]], pos)
            if not n:  # the file was cut under us: the size check reports it
                return
            hashing.hasher.update(view[:n])
            pos += n
            hashing.hashed = pos


def _load_hash_state(fd: int, digest: str, offset: int) -> _Hashing:
    """The running hash an interrupted call saved on this file, if the file is as it left
    it; else a fresh hash (the bytes there are then hashed from the start)."""
    try:
        saved = json.loads(os.getxattr(fd, HASH_STATE_XATTR))
        os.removexattr(fd, HASH_STATE_XATTR)  # it is written again if this call stops too
    except (OSError, ValueError, AttributeError):  # none, no xattrs here, or not POSIX
        return _Hashing()
    st = os.fstat(fd)
    try:
        fits = (saved["digest"] == digest and saved["size"] == st.st_size == offset
                and saved["mtime_ns"] == st.st_mtime_ns and 0 <= saved["hashed"] <= offset)
        if fits:
            return _Hashing(ResumableSha256(base64.b64decode(saved["state"])), saved["hashed"])
    except (KeyError, TypeError, ValueError):
        pass  # another version's or a damaged record: hash from the start
    return _Hashing()


def _save_hash_state(fd: int, digest: str, hashing: _Hashing) -> None:
    """Keep the running hash on the file for the next call; best effort (a filesystem
    without user xattrs only costs that call a re-hash)."""
    state = hashing.hasher.saved()
    if state is None or not hashing.hashed or not hashing.settled:  # a second Ctrl-C cut the join short
        return
    try:
        # The bytes must be on disk before a record that vouches for them: after a crash the
        # record could outlive unwritten pages, and the resume would trust bytes never written.
        os.fsync(fd)
    except OSError:
        return
    st = os.fstat(fd)
    record = {"digest": digest, "hashed": hashing.hashed, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
              "state": base64.b64encode(state).decode()}
    try:
        os.setxattr(fd, HASH_STATE_XATTR, json.dumps(record).encode())
    except (OSError, AttributeError):
        pass


def get_blob(ref: Reference, digest: str, dest_file, *, size: int | None = None,
             client: Client | None = None, progress: Progress | None = None, label: str = "",
             streams: int | None = None) -> int:
    """Stream a blob into ``dest_file`` (a binary file opened ``r+b``/``w+b``; written by
    descriptor, not through its buffer), verifying its sha256; returns the bytes received
    over the network.

    The bytes already in the file (a ``.partial`` an earlier call left) are kept, not
    fetched; they are hashed again unless that call saved its hash state on the file.
    Raises DigestMismatch when the bytes do not match (with ``received_bytes``); what was
    written stays in the file for the caller to discard.
    """
    client = client or Client()
    if size is None:
        size = _blob_size(ref, digest, client)
    dest_file.flush()
    fd = dest_file.fileno()
    offset = os.fstat(fd).st_size
    if offset > size:  # not a prefix of this blob: start over
        os.ftruncate(fd, 0)
        offset = 0
    streams = streams or default_streams()
    def job_of(frontier: _Frontier, received: list, report: Callable[[], None]) -> _Job:
        return _Job(ref, digest, fd, client, frontier, received, report)

    label = label or digest
    hashing = _load_hash_state(fd, digest, offset)
    try:
        try:
            received, got_size = _transfer(job_of, offset, size, progress, label, streams, hashing)
        except _NoRange:
            os.ftruncate(fd, 0)
            hashing = _Hashing()
            received, got_size = _transfer(job_of, 0, size, progress, label, 1, hashing)
    except BaseException:  # stopped: what is in the file stays, and so does its hash
        _save_hash_state(fd, digest, hashing)
        raise
    hexdigest = hashing.hasher.hexdigest()
    error = None
    if got_size != size:
        error = DigestMismatch(f"blob {digest} of {ref}: got {got_size} bytes, the manifest says {size}")
    elif "sha256:" + hexdigest != digest:
        error = DigestMismatch(f"blob {digest} of {ref} is corrupt: its content hashes to sha256:{hexdigest}",
                               hint="the registry's copy is damaged or was tampered with; push it again")
    if error:
        error.received_bytes = received  # what crossed the network before the check failed
        raise error
    return received


def _blob_size(ref: Reference, digest: str, client: Client) -> int:
    resp = client.request("HEAD", ref.api_host, f"/v2/{ref.repository}/blobs/{digest}",
                          scope=pull_scope(ref.repository), expect=(200, 404))
    resp.close()
    if resp.status_code == 404:
        raise RegistryError(f"{ref.registry}/{ref.repository} has no blob {digest} (BLOB_UNKNOWN)")
    return int(resp.headers.get("Content-Length") or 0)


def _split(offset: int, size: int, streams: int) -> list[tuple[int, int]]:
    """[start, end) ranges covering [0, size); the first begins at 0 (its bytes below
    ``offset`` are already there)."""
    rest = size - offset
    n = max(1, min(streams, rest // RANGED_MIN_PART))
    step = -(-rest // n) if rest else 0
    cuts = [offset + i * step for i in range(n)] + [size]
    cuts[0] = 0
    return [(cuts[i], min(cuts[i + 1], size)) for i in range(n)]


def _transfer(job_of: Callable[[_Frontier, list, Callable], _Job], offset: int, size: int,
              progress: Progress | None, label: str, streams: int, hashing: _Hashing) -> tuple[int, int]:
    """``(bytes received, contiguous bytes in the file)``; ``hashing`` has taken them in."""
    bounds = _split(offset, size, streams)
    frontier = _Frontier(bounds, offset)
    received = [0] * len(bounds)
    errors: list[BaseException] = []
    lock = threading.Lock()

    def report() -> None:
        if progress:
            progress("download", label, sum(p - s for (s, _), p in zip(bounds, frontier.pos, strict=True)), size)

    job = job_of(frontier, received, report)
    fd = job.fd

    def run_part(i: int) -> None:
        try:
            _fetch_part(job, i, bounds[i][1])
        except BaseException as exc:  # handed to the caller's thread below
            with lock:
                errors.append(exc)
            frontier.stop()

    hash_thread = threading.Thread(target=_hash_file, args=(fd, size, frontier, hashing),
                                   name="blob-hash", daemon=True)
    hashing.settled = False
    hash_thread.start()
    workers = [threading.Thread(target=run_part, args=(i,), name=f"blob-part-{i}", daemon=True)
               for i in range(1, len(bounds))]
    for w in workers:
        w.start()
    try:
        run_part(0)
        for w in workers:
            w.join()
    except BaseException:  # Ctrl-C: stop the others, keep what is contiguous
        frontier.stop()
        for w in workers:
            w.join()
        hash_thread.join()
        os.ftruncate(fd, frontier.contiguous())
        raise
    frontier.stop()
    hash_thread.join()
    if errors:
        if len(bounds) > 1 or frontier.contiguous() < os.fstat(fd).st_size:
            os.ftruncate(fd, frontier.contiguous())
        real = [e for e in errors if not isinstance(e, _Cancelled)]
        raise next((e for e in real if isinstance(e, _NoRange)), real[0] if real else errors[0])
    return sum(received), frontier.contiguous()


def _fetch_part(job: _Job, part: int, end: int) -> None:
    """Fill [pos, end) of part ``part``, retrying broken streams from where they broke."""
    frontier, client = job.frontier, job.client
    failures = 0
    use_raw = client.plain(job.ref.api_host) and hasattr(os, "splice")
    while frontier.pos[part] < end:
        pos = frontier.pos[part]
        if frontier.stopped:
            raise _Cancelled()
        try:
            if use_raw:
                done = _raw_get(job, part, pos, end)
                if done is None:  # something the raw path does not handle: requests does
                    use_raw = False
                    continue
            else:
                _requests_get(job, part, pos, end)
        except _Ended:
            return
        except (*STREAM_ERRORS, OSError) as exc:
            if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
                raise
            if frontier.pos[part] > pos:
                failures = 0  # progress was made: a fresh budget for this stretch
            failures += 1
            if failures > client.retry.retries:
                raise RegistryUnreachable(f"download of {job.digest} from {job.ref.registry} kept failing at byte "
                                          f"{frontier.pos[part]}: {exc}") from exc
            client.retry.wait(failures - 1)
            continue
        if frontier.pos[part] == pos:
            return  # a clean end without a byte: the size check in get_blob says what is missing


def _range_header(pos: int, end: int, whole_end: int | None) -> dict:
    if pos == 0 and end == whole_end:
        return {}
    return {"Range": f"bytes={pos}-{end - 1}"}


def _check_range(status: int, content_range: str | None, pos: int) -> None:
    if status == 200 and pos:
        raise _NoRange()
    if status == 206:
        m = re.match(r"bytes (\d+)-\d+/(\d+|\*)", content_range or "")
        if not m or int(m.group(1)) != pos:
            raise RegistryError(f"registry answered range {content_range} for bytes={pos}-")


def _requests_get(job: _Job, part: int, pos: int, end: int) -> None:
    headers = _range_header(pos, end, job.frontier.bounds[-1][1])
    resp = job.client.request("GET", job.ref.api_host, job.path, scope=pull_scope(job.ref.repository),
                              expect=(200, 206, 416), headers=headers, stream=True)
    with resp:
        if resp.status_code == 416:
            raise _Ended()
        _check_range(resp.status_code, resp.headers.get("Content-Range"), pos)
        buf = bytearray(min(BUFFER, max(end - pos, 1)))
        view = memoryview(buf)
        raw = resp.raw
        while pos < end:
            if job.frontier.stopped:
                raise _Cancelled()
            n = raw.readinto(view[:min(len(buf), end - pos)])
            if not n:
                break
            written = 0
            while written < n:
                written += os.pwrite(job.fd, view[written:n], pos + written)
            pos += n
            job.wrote(part, pos, n)


def _raw_get(job: _Job, part: int, pos: int, end: int) -> bool | None:
    """GET over a plain socket with splice. None when the answer needs requests (an auth
    challenge to learn, a redirect, chunked encoding, an error to read)."""
    client, ref = job.client, job.ref
    url = urlsplit(client.base_url(ref.api_host))
    headers = {"Host": url.netloc, "User-Agent": client.session.headers.get("User-Agent", "imgbuild"),
               "Accept-Encoding": "identity", "Connection": "close",
               **_range_header(pos, end, job.frontier.bounds[-1][1]),
               **client.auth_header(ref.api_host, (pull_scope(ref.repository),))}
    request = f"GET {job.path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    connect_timeout, read_timeout = client.timeout
    sock = socket.create_connection((url.hostname, url.port or 80), timeout=connect_timeout)
    try:
        sock.settimeout(None)  # blocking fd for splice; SO_RCVTIMEO bounds each wait instead
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(read_timeout))
        sock.sendall(request.encode("latin-1"))
        head = b""
        while b"\r\n\r\n" not in head:
            piece = sock.recv(65536)
            if not piece:
                raise ConnectionError("registry closed the connection before answering")
            head += piece
            if len(head) > _HEAD_LIMIT:
                return None
        head, _, body = head.partition(b"\r\n\r\n")
        status, fields = _parse_head(head)
        if status not in (200, 206) or "chunked" in fields.get("transfer-encoding", "").lower():
            return None
        _check_range(status, fields.get("content-range"), pos)
        length = int(fields.get("content-length", -1))
        if length < 0 or length > end - pos:
            return None
        stop = pos + length
        if body:
            body = body[:stop - pos]
            os.pwrite(job.fd, body, pos)
            pos += len(body)
            job.wrote(part, pos, len(body))
        _splice_into(job, sock, part, pos, stop)
        return True
    finally:
        sock.close()


def _splice_into(job: _Job, sock: socket.socket, part: int, pos: int, stop: int) -> None:
    read_end, write_end = os.pipe()
    try:
        try:
            fcntl.fcntl(write_end, _F_SETPIPE_SZ, SPLICE_STEP)
        except OSError:
            pass  # a smaller pipe only means more calls
        while pos < stop:
            if job.frontier.stopped:
                raise _Cancelled()
            try:
                n = os.splice(sock.fileno(), write_end, min(SPLICE_STEP, stop - pos))
            except BlockingIOError as exc:  # SO_RCVTIMEO ran out
                raise TimeoutError("registry stopped sending") from exc
            if not n:
                raise ConnectionError(f"registry closed the stream at byte {pos} of {stop}")
            moved = 0
            while moved < n:
                moved += os.splice(read_end, job.fd, n - moved, offset_dst=pos + moved)
            pos += n
            job.wrote(part, pos, n)
    finally:
        os.close(read_end)
        os.close(write_end)


def _timeval(seconds: float) -> bytes:
    whole = int(seconds)
    return struct.pack("ll", whole, int((seconds - whole) * 1e6))


def _parse_head(head: bytes) -> tuple[int, dict]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ConnectionError(f"not an HTTP answer: {lines[0][:80]!r}")
    fields = {}
    for line in lines[1:]:
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip().lower()] = value.strip()
    return int(parts[1]), fields

