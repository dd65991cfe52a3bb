"""Lazy pulling on paper: which files the image's own tests read, and what share of the image's
compressed bytes a lazy-pulling node (eStargz, SOCI) must fetch before those tests pass.

How the reads are recorded: each test container runs its command under the host's ``strace``
(``-f -y -e trace=open,openat,execve``), mounted read-only with its libraries and started through
the host's own loader (``ld-linux --library-path``), so the image needs no tool of its own and any
engine that runs containers on this host (docker 20.10, docker 26, podman) can trace: the default
seccomp profiles of all three allow ptrace of a child. Every successful open is recorded with the
real path of the file it opened (strace's ``-y``), whoever opened it: Python, the shell, the
dynamic loader mapping a library. What it misses, and says so: the ELF interpreter of each
program (the kernel maps ``ld-linux`` itself, without an open), files a process touches only by
stat() or readlink(), and reads of a file already open before the trace (none: strace starts the
command). A file opened counts whole, though a lazy puller fetches the chunks touched: an upper
bound per file.

The bytes per file: from the layer's eStargz table of contents where the pushed layer is eStargz
(the compressed span of each file, exact), else the layer's own compression ratio times the
file's size (an estimate, said so in the report). Pure functions below the ``--- running`` line
take what the scans found; only ``traced`` and ``read_traces`` touch the host."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import posixpath
import re
import shutil
import struct
import subprocess
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from buildkit_py import oci
from buildkit_py.engine.run import BindMount
from buildkit_py.errors import EnvironmentProblem, InspectError
from buildkit_py.sizes import human_size

TRACE_DIR = "/imgbuild-trace"  # the host's strace and its libraries, read-only in the container
TRACE_OUT = "/imgbuild-trace-out"  # where each traced container writes its trace (one file per test)
LOADER = "ld-linux-x86-64.so.2"
TOC_DIGEST_ANNOTATION = "containerd.io/snapshot/stargz/toc.digest"
TOC_TAR_NAME = "stargz.index.json"
PREFETCH_LANDMARKS = (".prefetch.landmark", ".no.prefetch.landmark")
FOOTER_SIZE = 51  # eStargz; the legacy stargz footer is 47
LEGACY_FOOTER_SIZE = 47

# `PID openat(AT_FDCWD</>, "name", O_RDONLY) = 3</real/path>`; execve's own path (the kernel
# opens it): `PID execve("/usr/bin/sh", [...], ...) = 0`.
_OPENED = re.compile(r"^\d+\s+(?:open|openat)\(.*\)\s+=\s+\d+<(?P<path>[^>]*)>\s*$")
_EXECED = re.compile(r'^\d+\s+execve\("(?P<path>(?:[^"\\]|\\.)*)",.*\)\s+=\s+0\s*$')


# ---------------------------------------------------------------- the trace


def parse_trace(text: str) -> frozenset[str]:
    """The absolute paths a strace log (``-f -y -e trace=open,openat,execve``) shows opened with
    success, and each program executed (by the path the kernel was given; symlinks resolved later
    against the image's layers). Failed opens (ENOENT while the loader searches) are not reads."""
    found: set[str] = set()
    for line in text.splitlines():
        m = _OPENED.match(line) or _EXECED.match(line)
        if m and m.group("path").startswith("/"):
            found.add(m.group("path"))
    return frozenset(found)


# ---------------------------------------------------------------- the layers, stacked


@dataclass(frozen=True)
class LayerFiles:
    """One layer as the lazy report needs it: its regular files (path -> bytes), its links
    (path -> target), its whiteouts, and its compressed size (registry, store or estimate)."""

    digest: str
    compressed_size: int
    tar_size: int  # the uncompressed layer tar: the ratio's denominator
    files: Mapping[str, int]
    links: Mapping[str, str] = field(default_factory=dict)
    whiteouts: tuple[tuple[str, bool], ...] = ()
    # from the layer's eStargz TOC: each file's compressed span, and the bytes a node fetches to
    # mount the layer at all (footer + TOC); None: the layer is not eStargz
    spans: Mapping[str, int] | None = None
    toc_bytes: int = 0


def _stack(layers: Iterable[LayerFiles]) -> dict[str, tuple[int, int | None, str | None]]:
    """path -> (layer index, size of a file | None, link target | None) of the container's view:
    each layer's whiteouts delete below it, each path it writes replaces the one below."""
    view: dict[str, tuple[int, int | None, str | None]] = {}
    for i, layer in enumerate(layers):
        for target, opaque in layer.whiteouts:
            below = target.rstrip("/") + "/"
            for path in [p for p in view if p.startswith(below) or (not opaque and p == target)]:
                del view[path]
        for path, size in layer.files.items():
            view[path] = (i, size, None)
        for path, dest in layer.links.items():
            view[path] = (i, None, dest)
    return view


def resolve(view: Mapping[str, tuple[int, int | None, str | None]], path: str) -> str | None:
    """``path`` with every symlink in it followed through ``view`` (a hard link to its target),
    as the kernel would in the container; None for a loop (over 40 links)."""
    parts = [p for p in path.split("/") if p]
    done = "/"
    hops = 0
    while parts:
        name = parts.pop(0)
        if name == "..":
            done = posixpath.dirname(done.rstrip("/")) or "/"
            continue
        if name == ".":
            continue
        here = posixpath.join(done, name)
        entry = view.get(here)
        if entry is not None and entry[2] is not None:
            hops += 1
            if hops > 40:
                return None
            target = entry[2]
            parts = [p for p in target.split("/") if p] + parts
            done = "/" if target.startswith("/") else done
            continue
        done = here
    return done


# ---------------------------------------------------------------- the report


@dataclass(frozen=True)
class LazyLayer:
    index: int
    digest: str
    compressed_size: int
    files_read: int
    bytes_read: int  # uncompressed bytes of the files read
    needed: int  # compressed bytes a lazy puller fetches for them (+ the TOC of an eStargz layer)
    exact: bool  # needed from the layer's eStargz TOC; else the layer's ratio times the bytes read

    @property
    def fraction(self) -> float:
        return self.needed / self.compressed_size if self.compressed_size else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "digest": self.digest, "compressed_size": self.compressed_size,
                "files_read": self.files_read, "bytes_read": self.bytes_read, "needed": self.needed,
                "fraction": round(self.fraction, 4), "exact": self.exact}


@dataclass(frozen=True)
class LazyReport:
    """What the tests read, per layer, and the share of the image's compressed bytes that is."""

    image: str
    layers: tuple[LazyLayer, ...]
    files: Mapping[str, int]  # each file read (its real path in the image) -> the layer that holds it
    # paths opened that are no file of the layers: folders (listed, not read), /proc, /dev, the
    # test's own mounted script, files made at run time
    outside: tuple[str, ...]
    method: str = "strace -f -y (open, openat, execve), every test container"

    @property
    def compressed_size(self) -> int:
        return sum(x.compressed_size for x in self.layers)

    @property
    def needed(self) -> int:
        return sum(x.needed for x in self.layers)

    @property
    def fraction(self) -> float:
        return self.needed / self.compressed_size if self.compressed_size else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image, "method": self.method, "compressed_size": self.compressed_size,
                "needed": self.needed, "fraction": round(self.fraction, 4),
                "exact": all(x.exact for x in self.layers), "layers": [x.to_json() for x in self.layers],
                "files": [{"path": p, "layer": i} for p, i in sorted(self.files.items())],
                "outside_image": list(self.outside)}

    def lines(self) -> list[str]:
        return report_lines(self)


def lazy_report(image: str, layers: list[LayerFiles], reads: Iterable[str]) -> LazyReport:
    """Each path of ``reads`` resolved in the stacked ``layers`` and charged to the layer whose
    file the container saw: per layer the files, their bytes and the compressed bytes they cost."""
    view = _stack(layers)
    owner: dict[str, int] = {}
    outside: set[str] = set()
    for path in reads:
        real = resolve(view, path)
        entry = view.get(real) if real else None
        if entry is None or entry[1] is None:
            outside.add(path)
        else:
            owner[real or path] = entry[0]
    rows = []
    for i, layer in enumerate(layers):
        mine = [p for p, at in owner.items() if at == i]
        raw = sum(layer.files[p] for p in mine)
        if layer.spans is not None:
            needed = layer.toc_bytes + sum(layer.spans.get(p, 0) for p in mine)
        else:
            needed = round(raw * layer.compressed_size / layer.tar_size) if layer.tar_size else 0
        rows.append(LazyLayer(i, layer.digest, layer.compressed_size, len(mine), raw,
                              min(needed, layer.compressed_size), layer.spans is not None))
    return LazyReport(image, tuple(rows), dict(sorted(owner.items())), tuple(sorted(outside)))


def report_lines(report: LazyReport) -> list[str]:
    """The text form: one line per layer, then the total."""
    out = [f"lazy     {report.image}: files the tests read ({report.method})",
           f"  {'layer':>5}  {'files':>6}  {'read':>10}  {'fetched':>10}  {'of':>10}  {'share':>6}  bytes"]
    for x in report.layers:
        out.append(f"  {x.index:>5}  {x.files_read:>6}  {human_size(x.bytes_read):>10}  {human_size(x.needed):>10}  "
                   f"{human_size(x.compressed_size):>10}  {x.fraction:>6.1%}  {'toc' if x.exact else 'estimate'}")
    out.append(f"  total: {human_size(report.needed)} of {human_size(report.compressed_size)} compressed "
               f"({report.fraction:.1%}) before the tests pass; {len(report.files)} files read, "
               f"{len(report.outside)} other paths opened (folders, /proc, /dev, mounts)")
    return out


# ---------------------------------------------------------------- eStargz: our own reader


@dataclass(frozen=True)
class EstargzToc:
    """A layer blob's eStargz table of contents: where it starts, its digest (sha256 of the JSON,
    what the ``toc.digest`` annotation names), each regular file's compressed span, and the
    prefetch landmark if the writer put one (ctr-remote / nerdctl do; BuildKit does not)."""

    toc_offset: int
    toc_digest: str
    spans: Mapping[str, int]
    entries: int
    landmark: str | None
    toc_bytes: int  # the TOC member and the footer: what a node fetches to mount the layer


def footer_offset(tail: bytes) -> tuple[int, int]:
    """(TOC offset, footer size) from the last FOOTER_SIZE bytes of a blob: the gzip member that
    ends an eStargz blob holds ``%016x`` + ``STARGZ`` in its FEXTRA field, in an ``SG`` subfield
    (eStargz, 51 bytes) or bare (legacy stargz, 47 bytes)."""
    for size in (FOOTER_SIZE, LEGACY_FOOTER_SIZE):
        foot = tail[-size:]
        if len(foot) < size or foot[:2] != b"\x1f\x8b" or not foot[3] & 0x04:
            continue
        xlen = struct.unpack_from("<H", foot, 10)[0]
        extra = foot[12:12 + xlen]
        if size == FOOTER_SIZE and extra[:2] == b"SG" and struct.unpack_from("<H", extra, 2)[0] == 22:
            extra = extra[4:]
        if len(extra) == 22 and extra.endswith(b"STARGZ"):
            try:
                return int(extra[:16], 16), size
            except ValueError:
                break
    raise InspectError("not an eStargz blob: no stargz footer at its end")


def read_toc(tail: bytes, toc_offset: int, footer: int) -> EstargzToc:
    """The TOC from ``tail``, the blob's bytes from ``toc_offset`` to its end, as a lazy puller
    reads it after the footer: a gzip member of a tar that holds stargz.index.json alone."""
    try:
        with tarfile.open(fileobj=gzip.GzipFile(fileobj=io.BytesIO(tail[:len(tail) - footer])), mode="r|") as tar:
            first = next(iter(tar), None)
            if first is None or first.name != TOC_TAR_NAME:
                raise InspectError(f"eStargz TOC member holds {first.name if first else 'nothing'}, "
                                   f"not {TOC_TAR_NAME}")
            f = tar.extractfile(first)
            raw = f.read() if f is not None else b""
    except (OSError, EOFError, tarfile.TarError) as exc:
        raise InspectError(f"eStargz TOC at {toc_offset} cannot be read: {exc}") from None
    try:
        toc = json.loads(raw)
    except ValueError as exc:
        raise InspectError(f"eStargz TOC is not JSON: {exc}") from None
    entries = [e for e in toc.get("entries") or [] if isinstance(e, dict)]
    # A file's bytes run from its entry's offset to the next offset in the blob (its next chunk's,
    # the next file's, or the TOC's): compressed bytes, as each entry starts its own gzip member.
    offsets = sorted({int(e["offset"]) for e in entries if int(e.get("offset") or 0) > 0} | {toc_offset})
    following = dict(zip(offsets, offsets[1:], strict=False))
    spans: dict[str, int] = {}
    for e in entries:
        off = int(e.get("offset") or 0)
        if e.get("type") in ("reg", "chunk") and off in following:
            path = "/" + str(e.get("name", "")).strip("/")
            spans[path] = spans.get(path, 0) + following[off] - off
    names = {str(e.get("name", "")).strip("/") for e in entries}
    landmark = next((n for n in PREFETCH_LANDMARKS if n in names), None)
    return EstargzToc(toc_offset, "sha256:" + hashlib.sha256(raw).hexdigest(), spans, len(entries), landmark,
                      len(tail))


def read_estargz(blob: bytes) -> EstargzToc:
    """The TOC of a whole eStargz blob in memory (footer, then TOC)."""
    toc_offset, footer = footer_offset(blob[-FOOTER_SIZE:])
    if not 0 <= toc_offset < len(blob) - footer:
        raise InspectError(f"eStargz footer points at {toc_offset}, outside the {len(blob)}-byte blob")
    return read_toc(blob[toc_offset:], toc_offset, footer)


# ---------------------------------------------------------------- running: the host's strace


@dataclass(frozen=True)
class Tracer:
    """The host's strace, its libraries and loader copied into ``tools`` (mounted read-only at
    TRACE_DIR), and ``out`` (mounted writable at TRACE_OUT) where each test's trace lands."""

    tools: Path
    out: Path

    def mounts(self) -> tuple[BindMount, ...]:
        return (BindMount(self.tools, TRACE_DIR), BindMount(self.out, TRACE_OUT, read_only=False))

    def wrap(self, name: str, entrypoint: str, command: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
        """(entrypoint, command) that run ``entrypoint command...`` under strace, its log in
        TRACE_OUT/``name``; strace exits with the command's own status."""
        return (f"{TRACE_DIR}/{LOADER}",
                ("--library-path", TRACE_DIR, f"{TRACE_DIR}/strace", "-f", "-qq", "-y", "-e",
                 "trace=open,openat,execve", "-e", "signal=none", "-o", f"{TRACE_OUT}/{name}", "--",
                 entrypoint, *command))


def make_tracer(root: Path, strace: str | None = None) -> Tracer:
    """Copy the host's strace, each library ``ldd`` names and the loader under ``root``.
    EnvironmentProblem without strace (Debian: apt-get install strace) or on a host whose loader
    is not x86-64's (the containers traced run the host's own strace)."""
    binary = strace or shutil.which("strace")
    if binary is None:
        raise EnvironmentProblem("--lazy records the tests' reads with strace, and there is none on PATH",
                                 hint="apt-get install strace (it runs on the host; the image needs nothing)")
    found = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False)
    libs = re.findall(r"(/\S+\.so[.\d]*)", found.stdout)
    if found.returncode != 0 or not any(Path(p).name == LOADER for p in libs):
        raise EnvironmentProblem(f"cannot tell the libraries of {binary} (ldd: {found.stderr.strip() or 'no loader'})",
                                 hint="--lazy needs an x86-64 host with a dynamically linked strace")
    tools, out = root / "tools", root / "out"
    tools.mkdir(parents=True)
    out.mkdir()
    out.chmod(0o777)  # an image whose USER is not root writes its trace there too
    shutil.copy(binary, tools / "strace")
    for lib in libs:
        shutil.copy(lib, tools / Path(lib).name)  # follows the symlink: the real file under its soname
    return Tracer(tools, out)


def read_traces(tracer: Tracer) -> frozenset[str]:
    """Every path the traced tests read, over all their logs."""
    reads: set[str] = set()
    for log in sorted(tracer.out.iterdir()):
        reads |= parse_trace(log.read_text(errors="replace"))
    return frozenset(reads)


# ---------------------------------------------------------------- the registry's layers


@dataclass(frozen=True)
class RemoteLayer:
    """A layer as its registry holds it: the blob, its size, the TOC digest its descriptor
    announces, and the TOC our reader found there (None: the blob has no stargz footer)."""

    digest: str
    size: int
    announced_toc: str | None
    toc: EstargzToc | None

    @property
    def verified(self) -> bool:
        """A real eStargz layer: a TOC behind its footer, with the digest its descriptor announces."""
        return self.toc is not None and self.announced_toc == self.toc.toc_digest

    def to_json(self) -> dict[str, Any]:
        return {"digest": self.digest, "size": self.size, "announced_toc": self.announced_toc,
                "toc_digest": self.toc.toc_digest if self.toc else None, "verified": self.verified,
                "toc_bytes": self.toc.toc_bytes if self.toc else None,
                "landmark": self.toc.landmark if self.toc else None}


def remote_layers(ref: str, platform: str = "linux/amd64") -> list[RemoteLayer]:
    """Each layer of ``ref``'s manifest in its registry, its eStargz TOC read by ranged GETs (the
    footer, then the TOC) where the blob ends in a stargz footer, as a lazy-pulling node reads it."""
    client = oci.Client(max_retries=1, timeout=(5.0, 60.0))
    manifest, _, _ = oci.get_manifest(ref, platform=platform, client=client)
    out = []
    for desc in manifest.get("layers") or []:
        digest, size = str(desc.get("digest")), int(desc.get("size") or 0)
        announced = (desc.get("annotations") or {}).get(TOC_DIGEST_ANNOTATION)
        toc = None
        if size > FOOTER_SIZE:
            tail = oci.read_blob_range(ref, digest, size - FOOTER_SIZE, size, client=client)
            try:
                toc_offset, footer = footer_offset(tail)
            except InspectError:
                toc_offset = -1
            if 0 <= toc_offset < size - footer:
                toc = read_toc(oci.read_blob_range(ref, digest, toc_offset, size, client=client), toc_offset, footer)
        out.append(RemoteLayer(digest, size, announced, toc))
    return out
