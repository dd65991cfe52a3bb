"""The fat binary reader on hand-built bytes: exact entries, flags, and a typed error (never a
traceback) for input that is cut short or garbled. Agreement with cuobjdump on real libraries
is tests/test_kernels_cuobjdump.py."""

from __future__ import annotations

import io
import struct
import tarfile

import pytest
from fatbin_bytes import COMPRESSED, FAMILY, LINUX_64, PTX, SASS, SPECIFIC, ZSTD, elf, entry, fatbin

from buildkit_py.analysis.kernels import (
    Arch,
    CodeKind,
    KernelReadError,
    parse_fatbins,
    read_kernels,
)
from buildkit_py.analysis.saved_image import scan_kernels, stack_kernel_scans
from buildkit_py.errors import InspectError


def test_several_entries_with_their_kinds_archs_versions_and_sizes():
    data = elf({".text": b"\x90" * 32, ".nv_fatbin": fatbin(
        entry(SASS, 80, payload=b"a" * 100),
        entry(SASS, 90, payload=b"b" * 37, flags=LINUX_64 | SPECIFIC),
        entry(PTX, 90, version=(8, 7), payload=b"c" * 10, flags=LINUX_64 | COMPRESSED, inflated=4000, extra=56),
        entry(SASS, 100, payload=b"d" * 9, flags=LINUX_64 | ZSTD | FAMILY, inflated=512, extra=48),
    )})
    k = read_kernels(data, "lib.so")
    assert k is not None and k.path == "lib.so"
    got = [(e.kind, e.arch.name, e.version, e.size, e.inflated_size, e.compression) for e in k.entries]
    assert got == [
        (CodeKind.SASS, "sm_80", (1, 8), 104, 104, None),  # stored payload, padded to 8
        (CodeKind.SASS, "sm_90a", (1, 8), 40, 40, None),
        (CodeKind.PTX, "sm_90", (8, 7), 10, 4000, "lz"),  # compressed: the bytes stored, not the padded
        (CodeKind.SASS, "sm_100", (1, 8), 9, 512, "zstd"),
    ]
    assert k.entries[3].arch.family and not k.entries[3].arch.specific
    assert [a.name for a in k.sass_archs()] == ["sm_80", "sm_90a", "sm_100"]
    assert k.ptx() == ((Arch(9, 0), "8.7"),)
    assert k.sass_bytes() == {Arch(8, 0): 104, Arch(9, 0, specific=True): 40, Arch(10, 0, family=True): 9}


def test_several_fat_binaries_in_one_section_with_padding_between():
    section = fatbin(entry(SASS, 75)) + b"\0" * 8 + fatbin(entry(SASS, 86), entry(PTX, 86, version=(9, 0)))
    k = read_kernels(elf({".nv_fatbin": section}))
    assert k is not None
    assert [(e.kind, e.arch.name) for e in k.entries] == [("sass", "sm_75"), ("sass", "sm_86"), ("ptx", "sm_86")]
    assert k.ptx() == ((Arch(8, 6), "9.0"),)


def test_relocatable_fatbins_are_listed_apart_from_what_runs():
    k = read_kernels(elf({"__nv_relfatbin": fatbin(entry(SASS, 70), entry(PTX, 70, version=(8, 4))),
                          ".nv_fatbin": fatbin(entry(SASS, 80))}))
    assert k is not None
    assert [e.arch.name for e in k.runnable] == ["sm_80"]
    assert k.listed == k.runnable  # cuobjdump lists the executable fatbins by default
    assert [e.section for e in k.entries] == ["__nv_relfatbin", "__nv_relfatbin", ".nv_fatbin"]
    only_relocatable = read_kernels(elf({"__nv_relfatbin": fatbin(entry(SASS, 70))}))
    assert only_relocatable is not None
    assert only_relocatable.runnable == () and [e.arch.name for e in only_relocatable.listed] == ["sm_70"]


def test_files_without_kernels_say_none():
    assert read_kernels(b"#!/bin/sh\necho hi\n") is None
    assert read_kernels(elf({".text": b"\x90" * 8})) is None
    assert read_kernels(elf({".nv_fatbin": b""})) is None
    assert read_kernels(elf({".nv_fatbin": b"x" * 64}, nobits=(".nv_fatbin",))) is None
    assert read_kernels(b"") is None


def test_arch_names_and_capabilities():
    assert Arch.from_number(121).capability == "12.1"
    assert Arch.from_number(90, specific=True).name == "sm_90a"
    assert str(Arch(10, 3)) == "sm_103"
    assert sorted([Arch(12, 0), Arch(9, 0), Arch(10, 0)]) == [Arch(9, 0), Arch(10, 0), Arch(12, 0)]


GOOD = elf({".nv_fatbin": fatbin(entry(SASS, 80, payload=b"a" * 64), entry(PTX, 80, version=(8, 0)))})


@pytest.mark.parametrize(("name", "data", "says"), [
    ("cut inside the section table", GOOD[:-10], "section table is cut short"),
    ("garbled magic", GOOD.replace(struct.pack("<I", 0xBA55ED50), struct.pack("<I", 0xDEADBEEF)),
     "no fat binary at"),
    ("an entry longer than its fat binary", GOOD.replace(struct.pack("<HHIQ", 2, 0x101, 64, 64),
                                                         struct.pack("<HHIQ", 2, 0x101, 64, 6400)), "garbled"),
    ("unknown entry kind", GOOD.replace(struct.pack("<HHIQ", 2, 0x101, 64, 64),
                                        struct.pack("<HHIQ", 7, 0x101, 64, 64)), "kind 7"),
    ("unknown container version", GOOD.replace(struct.pack("<IH", 0xBA55ED50, 1), struct.pack("<IH", 0xBA55ED50, 9)),
     "version 9"),
])
def test_bad_input_is_a_typed_error(name, data, says):
    with pytest.raises(KernelReadError, match=says) as info:
        read_kernels(data, "libbad.so")
    assert "libbad.so" in info.value.message


def test_a_section_past_the_end_of_the_file_is_a_typed_error():
    data = bytearray(GOOD)
    shoff, = struct.unpack_from("<Q", data, 0x28)
    struct.pack_into("<Q", data, shoff + 64 + 32, 1 << 40)  # section 1's size
    with pytest.raises(KernelReadError, match="past the end"):
        read_kernels(bytes(data), "x")


def test_a_fat_binary_claiming_more_than_its_section_is_a_typed_error():
    section = fatbin(entry(SASS, 80))
    section = section[:8] + struct.pack("<Q", 10_000) + section[16:]
    with pytest.raises(KernelReadError, match="past the end of .nv_fatbin"):
        parse_fatbins(section, 0, len(section))
    with pytest.raises(KernelReadError, match="ends inside a fat binary header"):
        parse_fatbins(fatbin(entry(SASS, 80))[:10], 0, 10)
    short_entry = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 24) + b"\x02" * 24  # 24 bytes: no room for an entry
    with pytest.raises(KernelReadError, match="cut short"):
        parse_fatbins(short_entry, 0, len(short_entry))


# ---------------------------------------------------------------- a tar stream (saved_image.scan_kernels)


def _tar(members: list[tuple[str, bytes | None]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """A tar of regular files (bytes) and symlinks (None: a link to /x)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.linkname = tarfile.SYMTYPE, "/x"
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


LONG = "opt/venv/lib/python3.11/site-packages/" + "deep/" * 30 + "libkernels.so"  # past ustar's 255 bytes


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_scan_kernels_reads_every_elf_file_of_a_tar(fmt):
    other = elf({".nv_fatbin": fatbin(entry(SASS, 90))})
    data = _tar([("usr/bin/tool", b"#!/bin/sh\n" * 50), (LONG, GOOD), ("usr/lib/libx.so", other),
                 ("usr/lib/libplain.so", elf({".text": b"\x90" * 64})), ("usr/lib/libgone.so", other),
                 ("usr/lib/libgone.so", b"replaced by text"), ("usr/lib/link.so", None),
                 ("usr/lib/libbad.so", GOOD[:-10]), ("tiny", b"ab")], fmt)
    scan = scan_kernels(io.BufferedReader(io.BytesIO(data)))
    assert sorted(scan.kernels) == ["/" + LONG, "/usr/lib/libx.so"]
    assert [e.arch.name for e in scan.kernels["/" + LONG].entries] == ["sm_80", "sm_80"]
    assert scan.kernels["/" + LONG] == read_kernels(GOOD, "/" + LONG)
    assert list(scan.errors) == ["/usr/lib/libbad.so"] and "cut short" in scan.errors["/usr/lib/libbad.so"]
    plain = len(elf({".text": b"\x90" * 64}))
    assert scan.files == 7  # "tiny" is too small to be ELF; links are no files
    assert scan.elf_bytes == len(GOOD) * 2 - 10 + len(other) * 2 + plain  # every ELF file read whole, nothing else


def test_scan_kernels_on_a_stream_cut_short_is_a_typed_error():
    data = _tar([("usr/lib/libx.so", GOOD)])
    with pytest.raises(InspectError, match="ended inside"):
        scan_kernels(io.BytesIO(data[:700]))
    assert scan_kernels(io.BytesIO(b"")).kernels == {}


def test_layers_stack_with_whiteouts_and_replaced_files():
    other = elf({".nv_fatbin": fatbin(entry(SASS, 90))})
    lower = scan_kernels(io.BytesIO(_tar([("usr/lib/a.so", GOOD), ("usr/lib/b.so", GOOD), ("opt/x/c.so", other),
                                          ("opt/keep.so", other)])))
    upper = scan_kernels(io.BytesIO(_tar([("usr/lib/.wh.a.so", b""), ("usr/lib/b.so", b"now a text file"),
                                          ("opt/x/.wh..wh..opq", b""), ("opt/x/d.so", GOOD)])))
    assert upper.whiteouts == [("/usr/lib/a.so", False), ("/opt/x", True)]
    stacked = stack_kernel_scans([lower, upper])
    assert sorted(stacked.kernels) == ["/opt/keep.so", "/opt/x/d.so"]
    assert sorted(stack_kernel_scans([upper, lower]).kernels) == ["/opt/keep.so", "/opt/x/c.so", "/opt/x/d.so",
                                                                   "/usr/lib/a.so", "/usr/lib/b.so"]
