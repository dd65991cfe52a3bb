"""A small read-only client for a Python package index (PEP 503 HTML / PEP 691 JSON).

It answers three questions, without downloading big wheels:

- which releases a project has (``project``), sorted by version, not by the index's order;
- what one distribution file declares in its METADATA (``metadata``): from the PEP 658 file
  (``<url>.metadata``) where the index advertises one; otherwise, for a wheel, by reading the
  zip's central directory and the METADATA member with HTTP range requests (a torch wheel is
  500 MB; this reads tens of kB); a small file is read whole;
- which files a wheel holds (``members``: its zip central directory, by the same range reads),
  e.g. the ``libbitsandbytes_cudaXYZ.so`` libraries of a bitsandbytes wheel.

Imported lazily (only when a lookup misses the shipped data or on ``imgbuild data refresh``), so
the stdlib ``urllib`` is used: nothing here may slow down ``import buildkit_py``.
"""

from __future__ import annotations

import email.parser
import io
import json
import os
import re
import ssl
import struct
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from html.parser import HTMLParser
from http.client import HTTPResponse
from typing import TypedDict, cast
from urllib.parse import urldefrag, urljoin, urlsplit

from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from buildkit_py.compat.pip_config import PYPI_SIMPLE, pip_configs, read_pip_config
from buildkit_py.errors import PackageIndexError

PYPI = f"{PYPI_SIMPLE}/"  # with the slash urljoin needs to keep /simple/ in a project's URL
_JSON = "application/vnd.pypi.simple.v1+json"
_ACCEPT = f"{_JSON}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"
_WHOLE_LIMIT = 4 * 1024 * 1024   # read a file whole below this size instead of ranging it
_TAIL = 64 * 1024                # first range read: the zip's end (central directory of a torch wheel ~ 40 kB)


@dataclass(frozen=True)
class DistFile:
    filename: str
    url: str
    version: str
    requires_python: str | None
    yanked: bool
    metadata_url: str | None   # PEP 658/714 ``<url>.metadata`` where the index advertises it
    size: int | None = None

    @property
    def is_wheel(self) -> bool:
        return self.filename.endswith(".whl")

    @property
    def tags(self) -> frozenset[str]:
        """``{"cp312-cp312-manylinux_2_28_x86_64", ...}`` for a wheel; empty for an sdist."""
        if not self.is_wheel:
            return frozenset()
        return frozenset(str(t) for t in parse_wheel_filename(self.filename)[3])


@dataclass(frozen=True)
class Project:
    name: str
    index_url: str
    files: tuple[DistFile, ...]

    @property
    def versions(self) -> tuple[str, ...]:
        """Every release with a non-yanked file, ascending by version (pre-releases included)."""
        vs = {f.version for f in self.files if not f.yanked}
        return tuple(sorted(vs, key=Version))

    def releases(self, *, pre: bool = False) -> tuple[str, ...]:
        return tuple(v for v in self.versions if pre or not Version(v).is_prerelease)

    def files_of(self, version: str) -> tuple[DistFile, ...]:
        want = Version(version)
        return tuple(f for f in self.files if Version(f.version) == want and not f.yanked)


@dataclass(frozen=True)
class Metadata:
    name: str
    version: str
    requires_python: str | None
    requires_dist: tuple[str, ...]
    provides_extra: tuple[str, ...]
    source: str   # the URL it was read from and how (pep658 / range / whole)


# ----------------------------------------------------------------------------- HTTP
def _context(cafile: str | None) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()


class IndexClient:
    def __init__(self, index_url: str = PYPI, *, timeout: float = 30.0, cafile: str | None = None):
        self.index_url = index_url if index_url.endswith("/") else index_url + "/"
        self.timeout = timeout
        self._ctx = _context(cafile) if urlsplit(self.index_url).scheme == "https" else None
        self.requests = 0
        self.bytes_read = 0

    def _open(self, url: str, headers: dict[str, str] | None = None) -> HTTPResponse:
        # urllib would open file: and other schemes too (what S310 warns of): refuse them here.
        if urlsplit(url).scheme not in ("http", "https"):
            raise PackageIndexError(f"package index: {redact(url)}: only http and https URLs are read",
                                    hint="set the index URL (pip's index-url) to an http(s) URL")
        req = urllib.request.Request(url, headers={"User-Agent": "imgbuild-index-client", **(headers or {})})  # noqa: S310
        self.requests += 1
        try:
            context = self._ctx if url.startswith("https:") else None
            # typeshed types urlopen's answer Any; for the http(s) URLs allowed above it is an HTTPResponse
            return cast(HTTPResponse, urllib.request.urlopen(req, timeout=self.timeout, context=context))  # noqa: S310
        except urllib.error.HTTPError as exc:
            raise PackageIndexError(f"package index: GET {redact(url)}: HTTP {exc.code}",
                                    hint="check the index URL (pip's index-url) and that the project exists") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PackageIndexError(f"package index {redact(self.index_url)} unreachable: {reason}",
                                    hint="check the network or pip's index-url; --offline uses only the shipped "
                                         "data") from None

    def _read(self, url: str, headers: dict[str, str] | None = None) -> tuple[bytes, HTTPResponse]:
        with self._open(url, headers) as r:
            body = r.read()
            self.bytes_read += len(body)
            return body, r

    # ------------------------------------------------------------------ project pages
    def project(self, name: str) -> Project:
        norm = canonicalize_name(name)
        url = urljoin(self.index_url, f"{norm}/")
        body, resp = self._read(url, {"Accept": _ACCEPT})
        ctype = (resp.headers.get("Content-Type") or "").split(";")[0].strip()
        try:
            if ctype == _JSON:
                files = _parse_json(body, url)
            else:
                files = _parse_html(body.decode("utf-8", "replace"), url)
        except (ValueError, KeyError, TypeError) as exc:
            raise PackageIndexError(f"package index: malformed project page {redact(url)}: {exc}") from None
        out = []
        for f in files:
            v = _file_version(f["filename"], norm)
            if v is None:
                continue
            out.append(DistFile(f["filename"], f["url"], v, f.get("requires_python"), bool(f.get("yanked")),
                                f.get("metadata_url"), f.get("size")))
        return Project(norm, self.index_url, tuple(out))

    # ------------------------------------------------------------------ metadata
    def metadata(self, f: DistFile) -> Metadata:
        if f.metadata_url:
            body, _ = self._read(f.metadata_url)
            return _parse_metadata(body, f"{redact(f.metadata_url)} (PEP 658)")
        if not f.is_wheel:
            raise PackageIndexError(f"package index: {f.filename}: an sdist without PEP 658 metadata "
                              "(its requirements are known only after a build)")
        if f.size is not None and f.size <= _WHOLE_LIMIT:
            body, _ = self._read(f.url)
            return _parse_metadata(_member_from_zip_bytes(body, f.filename), f"{redact(f.url)} (whole wheel)")
        return _parse_metadata(self._ranged_metadata(f), f"{redact(f.url)} (METADATA by HTTP range)")

    def _range(self, url: str, spec: str) -> tuple[bytes, int | None]:
        body, resp = self._read(url, {"Range": f"bytes={spec}"})
        status = getattr(resp, "status", 200)
        total = None
        cr = resp.headers.get("Content-Range") or ""
        m = re.match(r"bytes (\d+)-(\d+)/(\d+)", cr)
        if m:
            total = int(m.group(3))
        if status != 206:   # the server ignored Range and sent the whole file
            return body, len(body)
        return body, total

    def members(self, f: DistFile) -> tuple[str, ...]:
        """The file names in a wheel: its zip central directory, by HTTP range requests (or the
        whole file below the size limit)."""
        if f.size is not None and f.size <= _WHOLE_LIMIT:
            body, _ = self._read(f.url)
            return tuple(_zip_names(body, f.filename))
        whole, cd = self._central_directory_of(f)
        if whole is not None:
            return tuple(_zip_names(whole, f.filename))
        return tuple(e[0] for e in _entries(cd))

    def _central_directory_of(self, f: DistFile) -> tuple[bytes | None, bytes]:
        """(the whole file, b"") when the server sent it all, else (None, the central directory)."""
        tail, total = self._range(f.url, f"-{_TAIL}")
        if total is not None and len(tail) == total:   # whole file came back
            return tail, b""
        if total is None:
            raise PackageIndexError(f"package index: {f.filename}: the server answered a range request "
                                    "without Content-Range")
        start_of_tail = total - len(tail)
        cd_offset, cd_size = _central_directory(tail, start_of_tail, f.filename, self, f.url)
        if cd_offset >= start_of_tail:
            return None, tail[cd_offset - start_of_tail: cd_offset - start_of_tail + cd_size]
        cd, _ = self._range(f.url, f"{cd_offset}-{cd_offset + cd_size - 1}")
        return None, cd

    def _ranged_metadata(self, f: DistFile) -> bytes:
        whole, cd = self._central_directory_of(f)
        if whole is not None:
            return _member_from_zip_bytes(whole, f.filename)
        name, method, csize, lho = _find_metadata_entry(cd, f.filename)
        head, _ = self._range(f.url, f"{lho}-{lho + 30 + 1024 + csize - 1}")
        if head[:4] != b"PK\x03\x04":
            raise PackageIndexError(f"package index: {f.filename}: no local file header at {lho}")
        nlen, xlen = struct.unpack("<HH", head[26:30])
        data = head[30 + nlen + xlen: 30 + nlen + xlen + csize]
        if len(data) < csize:
            more, _ = self._range(f.url, f"{lho + 30 + nlen + xlen}-{lho + 30 + nlen + xlen + csize - 1}")
            data = more
        return _inflate(data, method, f.filename)


# ----------------------------------------------------------------------------- parsing helpers
def redact(url: str) -> str:
    """Drop user:password from an index URL before it reaches a message."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
        return parts._replace(netloc="***@" + netloc).geturl()
    return url


def _file_version(filename: str, project: str) -> str | None:
    try:
        if filename.endswith(".whl"):
            name, ver, *_ = parse_wheel_filename(filename)
        elif filename.endswith((".tar.gz", ".zip")):
            name, ver = parse_sdist_filename(filename)
        else:
            return None
    except (ValueError, InvalidVersion):
        return None
    return str(ver) if canonicalize_name(str(name)) == project else None


def _metadata_url(url: str, attr: object) -> str | None:
    if attr in (None, False, "false"):
        return None
    return url + ".metadata"


class _FileEntryBase(TypedDict):
    filename: str
    url: str
    requires_python: str | None
    yanked: bool
    metadata_url: str | None


class _FileEntry(_FileEntryBase, total=False):
    """One file of a project page, as either page format lists it (only the JSON one gives a size)."""
    size: int | None


def _parse_json(body: bytes, page_url: str) -> list[_FileEntry]:
    data = json.loads(body)
    out: list[_FileEntry] = []
    for f in data["files"]:
        url = urljoin(page_url, f["url"])
        base, _ = urldefrag(url)
        meta = f.get("core-metadata", f.get("data-dist-info-metadata"))
        y = f.get("yanked", False)
        out.append({"filename": f["filename"], "url": base, "requires_python": f.get("requires-python"),
                    "yanked": bool(y), "metadata_url": _metadata_url(base, meta), "size": f.get("size")})
    return out


class _Links(HTMLParser):
    """Each <a>'s attributes and its text (kept apart: the attribute values may be None, the text not)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[dict[str, str | None], str]] = []
        self._cur: dict[str, str | None] | None = None
        self._text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._cur = dict(attrs)
            self._text = ""

    def handle_data(self, data: str) -> None:
        if self._cur is not None:
            self._text += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._cur is not None:
            self.links.append((self._cur, self._text))
            self._cur = None


def _parse_html(text: str, page_url: str) -> list[_FileEntry]:
    p = _Links()
    p.feed(text)
    out: list[_FileEntry] = []
    for a, a_text in p.links:
        href = a.get("href")
        if not href:
            continue
        url, _ = urldefrag(urljoin(page_url, href))
        filename = url.rsplit("/", 1)[-1] or a_text.strip()
        meta = a.get("data-core-metadata", a.get("data-dist-info-metadata"))
        out.append({"filename": filename, "url": url, "requires_python": a.get("data-requires-python"),
                    "yanked": "data-yanked" in a, "metadata_url": _metadata_url(url, meta)})
    return out


def _parse_metadata(body: bytes, source: str) -> Metadata:
    msg = email.parser.HeaderParser().parsestr(body.decode("utf-8", "replace"))
    name, version = msg.get("Name"), msg.get("Version")
    if not name or not version:
        raise PackageIndexError(f"package index: {source}: METADATA without Name/Version")
    return Metadata(name, version, msg.get("Requires-Python"), tuple(msg.get_all("Requires-Dist") or ()),
                    tuple(msg.get_all("Provides-Extra") or ()), source)


def _central_directory(tail: bytes, tail_start: int, filename: str, client: IndexClient, url: str) -> tuple[int, int]:
    i = tail.rfind(b"PK\x05\x06")
    if i < 0:
        raise PackageIndexError(f"package index: {filename}: no zip end-of-central-directory record")
    cd_size, cd_offset = struct.unpack("<II", tail[i + 12:i + 20])
    if cd_offset == 0xFFFFFFFF or cd_size == 0xFFFFFFFF:   # zip64
        j = tail.rfind(b"PK\x06\x07", 0, i)
        if j < 0:
            raise PackageIndexError(f"package index: {filename}: zip64 locator missing")
        (eocd64,) = struct.unpack("<Q", tail[j + 8:j + 16])
        if eocd64 >= tail_start:
            rec = tail[eocd64 - tail_start: eocd64 - tail_start + 56]
        else:
            rec, _ = client._range(url, f"{eocd64}-{eocd64 + 55}")
        cd_size, cd_offset = struct.unpack("<QQ", rec[40:56])
    return cd_offset, cd_size


def _entries(cd: bytes) -> Iterator[tuple[str, int, int, int]]:
    """(name, method, compressed size, local header offset) of each central directory record."""
    pos = 0
    while pos + 46 <= len(cd) and cd[pos:pos + 4] == b"PK\x01\x02":
        method, = struct.unpack("<H", cd[pos + 10:pos + 12])
        csize, usize = struct.unpack("<II", cd[pos + 20:pos + 28])
        nlen, xlen, clen = struct.unpack("<HHH", cd[pos + 28:pos + 34])
        lho, = struct.unpack("<I", cd[pos + 42:pos + 46])
        name = cd[pos + 46:pos + 46 + nlen].decode("utf-8", "replace")
        extra = cd[pos + 46 + nlen:pos + 46 + nlen + xlen]
        if 0xFFFFFFFF in (csize, usize, lho):   # zip64 extended information
            vals = []
            k = 0
            while k + 4 <= len(extra):
                hid, hlen = struct.unpack("<HH", extra[k:k + 4])
                if hid == 1:
                    vals = [struct.unpack("<Q", extra[k + 4 + 8 * n:k + 12 + 8 * n])[0] for n in range(hlen // 8)]
                    break
                k += 4 + hlen
            it = iter(vals)
            if usize == 0xFFFFFFFF:
                usize = next(it)
            if csize == 0xFFFFFFFF:
                csize = next(it)
            if lho == 0xFFFFFFFF:
                lho = next(it)
        yield name, method, csize, lho
        pos += 46 + nlen + xlen + clen


def _find_metadata_entry(cd: bytes, filename: str) -> tuple[str, int, int, int]:
    for entry in _entries(cd):
        if re.fullmatch(r"[^/]+\.dist-info/METADATA", entry[0]):
            return entry
    raise PackageIndexError(f"package index: {filename}: no .dist-info/METADATA in the wheel")


def _zip_names(body: bytes, filename: str) -> list[str]:
    try:
        with zipfile.ZipFile(io.BytesIO(body)) as z:
            return z.namelist()
    except zipfile.BadZipFile as exc:
        raise PackageIndexError(f"package index: {filename}: not a zip: {exc}") from None


def _inflate(data: bytes, method: int, filename: str) -> bytes:
    if method == 0:
        return data
    if method == 8:
        return zlib.decompress(data, -15)
    raise PackageIndexError(f"package index: {filename}: METADATA compressed with unsupported method {method}")


def _member_from_zip_bytes(body: bytes, filename: str) -> bytes:
    try:
        with zipfile.ZipFile(io.BytesIO(body)) as z:
            for n in z.namelist():
                if re.fullmatch(r"[^/]+\.dist-info/METADATA", n):
                    return z.read(n)
    except zipfile.BadZipFile as exc:
        raise PackageIndexError(f"package index: {filename}: not a zip: {exc}") from None
    raise PackageIndexError(f"package index: {filename}: no .dist-info/METADATA in the wheel")


# ----------------------------------------------------------------------------- which index (as pip would)
@dataclass(frozen=True)
class IndexSettings:
    url: str
    cafile: str | None
    source: str     # where the URL came from: "PIP_INDEX_URL", a config file path, "--index-url", "default (PyPI)"


def index_settings(*, index_url: str | None = None, pip_config: str | None = None,
                   env: Mapping[str, str]) -> IndexSettings:
    """The index pip would use: ``--index-url``, then ``PIP_INDEX_URL``, then ``--pip-config`` FILE
    (imgbuild's own option, the file pip steps get), then pip's config files ([global], [install]);
    PyPI otherwise. The CA bundle likewise from ``PIP_CERT`` / ``cert =``. The files are read by
    compat/pip_config.py, as pip and the uv translation read them: PipConfigError (exit 2) for
    a file pip would refuse, or a --pip-config that cannot be read. ``env``: the environment pip
    would run in (the CLI passes its own: cli/settings.py), read for PIP_* and HOME."""
    env = dict(env)
    configs = ([read_pip_config(pip_config, what="--pip-config")] if pip_config
               else pip_configs(env, env.get("HOME") or os.path.expanduser("~")))
    url = cafile = None
    where = "default (PyPI)"
    for config in configs:
        if (found := config.value("index-url")) is not None:
            url, where = found.strip(), config.path
        if (found := config.value("cert")) is not None:
            cafile = found.strip()
    if not pip_config and env.get("PIP_INDEX_URL"):
        url, where = env["PIP_INDEX_URL"].strip(), "PIP_INDEX_URL"
    if env.get("PIP_CERT"):
        cafile = env["PIP_CERT"]
    if index_url:
        url, where = index_url, "--index-url"
    return IndexSettings(url or PYPI, cafile or None, where)


def client_for(settings: IndexSettings, *, timeout: float = 30.0) -> IndexClient:
    return IndexClient(settings.url, timeout=timeout, cafile=settings.cafile)
