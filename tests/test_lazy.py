"""Lazy pulling on paper (analysis/lazy.py): the trace parsed, reads charged to the layers of a
small synthetic image with exact numbers, and our eStargz reader on a blob laid out as the
eStargz writer lays it out (one gzip member per file, the TOC member, the 51-byte footer)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import struct
import tarfile

import pytest
from fakes import FakeEngine, image_info

from buildkit_py.analysis import lazy
from buildkit_py.analysis.saved_image import scan_layer
from buildkit_py.engine.run import BindMount
from buildkit_py.errors import EnvironmentProblem, InspectError

TRACE = """\
9     execve("/usr/bin/sh", ["sh", "-c", "python3 t.py"], 0x7ffe /* 3 vars */) = 0
9     openat(AT_FDCWD</>, "/etc/ld.so.cache", O_RDONLY|O_CLOEXEC) = 3</etc/ld.so.cache>
9 openat(AT_FDCWD</>, "/lib/x86_64-linux-gnu/libc.so.6", O_RDONLY|O_CLOEXEC) = 3</usr/lib/x86_64-linux-gnu/libc.so.6>
10 execve("/usr/local/sbin/python3", ["python3", "t.py"], 0x55c2) = -1 ENOENT (No such file or directory)
10    execve("/usr/bin/python3", ["python3", "t.py"], 0x55c2 /* 4 vars */) = 0
10    openat(AT_FDCWD</>, "/usr/lib/libgone.so", O_RDONLY|O_CLOEXEC) = -1 ENOENT (No such file or directory)
10    openat(AT_FDCWD</work>, "t.py", O_RDONLY) = 3</work/t.py>
10    openat(AT_FDCWD</>, "/proc/self/maps", O_RDONLY) = 4</proc/1/maps>
10    openat(AT_FDCWD</>, "/opt/venv/big.so", O_RDONLY|O_CLOEXEC) = 5</opt/venv/big.so>
10    +++ exited with 0 +++
"""


def test_the_trace_gives_each_path_opened_with_success():
    assert lazy.parse_trace(TRACE) == {
        "/usr/bin/sh", "/etc/ld.so.cache", "/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/python3",
        "/work/t.py", "/proc/1/maps", "/opt/venv/big.so"}


def _image() -> list[lazy.LayerFiles]:
    base = lazy.LayerFiles("sha256:a", compressed_size=1000, tar_size=4000,
                           files={"/usr/bin/dash": 400, "/usr/lib/x86_64-linux-gnu/libc.so.6": 2000,
                                  "/usr/bin/python3.11": 1000, "/etc/ld.so.cache": 100, "/etc/unread": 300},
                           links={"/bin": "usr/bin", "/usr/bin/sh": "dash", "/usr/bin/python3": "python3.11"})
    venv = lazy.LayerFiles("sha256:b", compressed_size=5000, tar_size=10_000,
                           files={"/opt/venv/big.so": 8000, "/opt/venv/other.so": 1500, "/work/t.py": 50})
    # the top layer deletes /etc/unread and writes a new ld.so.cache over the base's
    top = lazy.LayerFiles("sha256:c", compressed_size=100, tar_size=400, files={"/etc/ld.so.cache": 200},
                          whiteouts=(("/etc/unread", False),))
    return [base, venv, top]


def test_reads_are_charged_to_the_layer_whose_file_the_container_sees():
    report = lazy.lazy_report("app:1", _image(), lazy.parse_trace(TRACE) | {"/bin/sh", "/etc/unread"})
    assert report.files == {"/usr/bin/dash": 0, "/usr/lib/x86_64-linux-gnu/libc.so.6": 0,
                            "/usr/bin/python3.11": 0, "/etc/ld.so.cache": 2, "/opt/venv/big.so": 1,
                            "/work/t.py": 1}
    assert report.outside == ("/etc/unread", "/proc/1/maps")  # deleted above, and not in any layer
    base, venv, top = report.layers
    # base: dash + libc + python3.11 = 3400 bytes at its ratio 1000/4000 -> 850
    assert (base.files_read, base.bytes_read, base.needed, base.exact) == (3, 3400, 850, False)
    # venv: 8050 bytes at 5000/10000 -> 4025; top: 200 at 100/400 -> 50
    assert (venv.files_read, venv.bytes_read, venv.needed) == (2, 8050, 4025)
    assert (top.files_read, top.bytes_read, top.needed) == (1, 200, 50)
    assert report.compressed_size == 6100 and report.needed == 4925
    assert report.fraction == pytest.approx(4925 / 6100)
    doc = report.to_json()
    assert doc["fraction"] == 0.8074 and doc["exact"] is False
    assert doc["layers"][1] == {"index": 1, "digest": "sha256:b", "compressed_size": 5000, "files_read": 2,
                                "bytes_read": 8050, "needed": 4025, "fraction": 0.805, "exact": False}
    text = "\n".join(report.lines())
    assert "4.8 KiB of 6.0 KiB compressed (80.7%)" in text and "6 files read, 2 other paths opened" in text


def test_an_estargz_layer_is_charged_its_files_spans_and_its_toc():
    layers = _image()
    layers[1] = lazy.LayerFiles("sha256:b", 5000, 10_000, dict(layers[1].files),
                                spans={"/opt/venv/big.so": 3100, "/work/t.py": 40, "/opt/venv/other.so": 700},
                                toc_bytes=300)
    venv = lazy.lazy_report("app:1", layers, lazy.parse_trace(TRACE)).layers[1]
    assert (venv.needed, venv.exact) == (300 + 3100 + 40, True)


def test_symlinks_resolve_through_folders_relative_and_absolute_and_loops_stop():
    view = lazy._stack(_image())
    assert lazy.resolve(view, "/bin/sh") == "/usr/bin/dash"
    assert lazy.resolve(view, "/bin/../bin/./python3") == "/usr/bin/python3.11"
    loop = lazy._stack([lazy.LayerFiles("sha256:l", 1, 1, {}, links={"/a": "/b", "/b": "a"})])
    assert lazy.resolve(loop, "/a") is None


def test_an_opaque_whiteout_hides_the_folder_below_but_not_the_folder_itself():
    lower = lazy.LayerFiles("sha256:1", 10, 10, {"/d/x": 5, "/d": 0})
    upper = lazy.LayerFiles("sha256:2", 10, 10, {"/d/y": 7}, whiteouts=(("/d", True),))
    view = lazy._stack([lower, upper])
    assert "/d/x" not in view and view["/d/y"] == (1, 7, None) and view["/d"] == (0, 0, None)


def test_the_layer_scan_records_symlinks_and_hard_links():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, target in (("usr/bin/sh", tarfile.SYMTYPE, "dash"), ("usr/bin/py", tarfile.LNKTYPE,
                                                                              "usr/bin/python3.11")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, target
            tar.addfile(info)
    scan = scan_layer(io.BytesIO(buf.getvalue()), counter=None)
    assert scan.link_targets == {"/usr/bin/sh": "dash", "/usr/bin/py": "/usr/bin/python3.11"}


# --- eStargz --------------------------------------------------------------------------------------


def _member(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _tar_entry(name: str, data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info.tobuf(format=tarfile.PAX_FORMAT) + data + b"\0" * (-len(data) % 512)


def _footer(toc_offset: int) -> bytes:
    extra = b"SG" + struct.pack("<H", 22) + b"%016xSTARGZ" % toc_offset
    head = b"\x1f\x8b\x08\x04" + b"\0" * 4 + b"\0\xff" + struct.pack("<H", len(extra)) + extra
    return head + b"\x01\x00\x00\xff\xff" + b"\0" * 8  # Go's empty stored final block, CRC32 and size: 51 bytes


def estargz_blob(files: dict[str, bytes], landmark: bool = False) -> tuple[bytes, dict[str, int], str]:
    """A blob laid out as an eStargz writer does, (blob, each file's span, the TOC digest)."""
    blob, entries, spans = b"", [], {}
    names = ([".prefetch.landmark"] if landmark else []) + list(files)
    for name in names:
        data = files.get(name, b"\0")
        piece = _member(_tar_entry(name, data))
        entries.append({"name": name, "type": "reg", "size": len(data), "offset": len(blob)})
        spans["/" + name] = len(piece)
        blob += piece
    entries[0]["offset"] = max(entries[0]["offset"], 0)
    toc = json.dumps({"version": 1, "entries": entries}).encode()
    toc_offset = len(blob)
    blob += _member(_tar_entry("stargz.index.json", toc) + b"\0" * 1024) + _footer(toc_offset)
    return blob, spans, "sha256:" + hashlib.sha256(toc).hexdigest()


def test_our_reader_finds_the_toc_its_digest_and_each_files_span():
    blob, spans, digest = estargz_blob({"usr/bin/a": b"a" * 5000, "etc/b": b"hello" * 100, "opt/c": b"c"},
                                       landmark=True)
    toc = lazy.read_estargz(blob)
    assert toc.toc_digest == digest and toc.entries == 4 and toc.landmark == ".prefetch.landmark"
    # the first entry sits at offset 0, which no reader can tell from "no offset": not charged
    assert toc.spans == {p: n for p, n in spans.items() if p != "/.prefetch.landmark"}
    assert toc.toc_bytes == len(blob) - toc.toc_offset


def test_a_plain_gzip_layer_is_not_estargz():
    with pytest.raises(InspectError, match="no stargz footer"):
        lazy.read_estargz(_member(b"x" * 2000))


def test_a_footer_that_points_outside_the_blob_is_refused():
    blob, _, _ = estargz_blob({"a": b"1"})
    with pytest.raises(InspectError, match="outside"):
        lazy.read_estargz(blob[:-51] + _footer(10 ** 9))


def test_a_strace_that_ldd_cannot_read_is_refused(tmp_path):
    with pytest.raises(EnvironmentProblem, match="strace") as info:
        lazy.make_tracer(tmp_path, strace=str(tmp_path / "no-strace"))
    assert "cannot tell the libraries" in info.value.message


def test_the_tracer_wraps_the_command_in_the_hosts_strace_through_its_own_loader(tmp_path):
    tracer = lazy.Tracer(tmp_path / "tools", tmp_path / "out")
    entry, args = tracer.wrap("test-0", "sh", ("-c", "true"))
    assert entry == "/imgbuild-trace/ld-linux-x86-64.so.2"
    assert args == ("--library-path", "/imgbuild-trace", "/imgbuild-trace/strace", "-f", "-qq", "-y", "-e",
                    "trace=open,openat,execve", "-e", "signal=none", "-o", "/imgbuild-trace-out/test-0", "--",
                    "sh", "-c", "true")
    assert tracer.mounts() == (BindMount(tmp_path / "tools", "/imgbuild-trace"),
                               BindMount(tmp_path / "out", "/imgbuild-trace-out", read_only=False))


@pytest.mark.parametrize(("image", "digests", "measured"), [
    ("127.0.0.1:5000/team/app:1", ["127.0.0.1:5000/team/app@sha256:" + "a" * 64], "127.0.0.1:5000/team/app:1"),
    ("registry.example.com/app:1", ["registry.example.com/app@sha256:" + "a" * 64], "registry.example.com/app:1"),
    ("127.0.0.1:5000/team/app:1", [], None),  # built, never pushed: the engine's layers
    ("team/app:1", ["docker.io/team/app@sha256:" + "a" * 64], None),  # no registry host in its name
])
def test_an_image_is_measured_in_its_registry_only_when_pushed_there(image, digests, measured):
    from buildkit_py.pipeline.lazy import pushed_ref

    engine = FakeEngine(images={image: image_info("sha256:" + "b" * 64, repo_digests=digests)})
    assert pushed_ref(engine, image) == measured
