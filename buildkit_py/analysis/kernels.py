"""Which GPU kernels a file carries: the CUDA fat binaries in an ELF file's ``.nv_fatbin`` and
``__nv_relfatbin`` sections, read from their headers alone (no payload is inflated).

A fat binary ("fatbin") is a 16-byte header (magic 0xBA55ED50, version 1, header size, size of
what follows) and entries, each a header and its payload: kind 1 is PTX (the portable assembly a
driver JIT-compiles), kind 2 an ELF cubin of SASS for one architecture. NVIDIA does not publish
the layout; the fields read here are the ones every entry of the libraries in
tests/test_kernels_cuobjdump.py agrees on with ``cuobjdump --list-elf --list-ptx`` (CUDA 13.4):
arch-specific cubins (``sm_90a``) carry flag 0x100000, payloads compressed the old way 0x2000,
with zstd (CUDA 12.8 on) 0x8000. Flag 0x200000 marks family-specific code (``sm_100f``: runs on
every GPU of the major); cuobjdump prints those as plain ``sm_100``, so the name keeps that
spelling and ``Arch.family`` says it.

``.nv_fatbin`` holds what the CUDA runtime loads; ``__nv_relfatbin`` the relocatable objects
kept for device linking (``-rdc``), which nothing loads at run time. ``FileKernels.listed`` is
what cuobjdump lists by default: the executable fatbins, or the relocatable ones in a file that
has no other; ``runnable`` is the executable ones only.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from buildkit_py.errors import InspectError
from buildkit_py.text_enum import TextEnum

ELF_MAGIC = b"\x7fELF"
FATBIN_MAGIC = 0xBA55ED50
EXECUTABLE_SECTION = ".nv_fatbin"
RELOCATABLE_SECTION = "__nv_relfatbin"
FATBIN_SECTIONS = (EXECUTABLE_SECTION, RELOCATABLE_SECTION)

_SHT_NOBITS = 8  # a section with no bytes in the file (.bss-like)
_CONTAINER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries after it
# kind, (unknown), header size, payload size (padded), stored size when compressed, (unknown),
# version minor, version major, arch, object name offset and length, flags, (zero), size inflated
_ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")

FLAG_COMPRESSED = 0x2000  # the compression of CUDA 11 and 12's --compress-all
FLAG_COMPRESSED_ZSTD = 0x8000  # CUDA 12.8 on (--compress-mode)
FLAG_ARCH_SPECIFIC = 0x100000  # sm_90a, sm_100a: runs only on that exact GPU
FLAG_FAMILY_SPECIFIC = 0x200000  # sm_100f: runs on the GPUs of the major


class KernelReadError(InspectError):
    """A fat binary in an ELF file that is cut short or garbled."""


class CodeKind(TextEnum):
    SASS = "sass"  # machine code for one architecture
    PTX = "ptx"  # virtual assembly, JIT-compiled by the driver for the GPU it runs on


@dataclass(frozen=True, order=True)
class Arch:
    """A compute capability as CUDA names code for it: ``sm_90`` (major 9, minor 0), ``sm_90a``
    (arch-specific: that GPU only), ``sm_100f`` (family-specific)."""

    major: int
    minor: int
    specific: bool = False  # the 'a' kinds
    family: bool = False

    @classmethod
    def from_number(cls, number: int, *, specific: bool = False, family: bool = False) -> Arch:
        return cls(number // 10, number % 10, specific, family)

    @property
    def number(self) -> int:
        return self.major * 10 + self.minor

    @property
    def name(self) -> str:
        """cuobjdump's spelling: sm_90a; family code prints as plain sm_100, as cuobjdump does."""
        return f"sm_{self.number}{'a' if self.specific else ''}"

    @property
    def capability(self) -> str:
        return f"{self.major}.{self.minor}"

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class FatbinEntry:
    kind: CodeKind
    arch: Arch
    version: tuple[int, int]  # PTX: the PTX ISA version (8.7); SASS: the cubin format's (1.8)
    size: int  # payload bytes as stored in the file (compressed when compressed)
    inflated_size: int  # payload bytes once inflated; == size when not compressed
    compression: str | None  # None, "lz" (flag 0x2000) or "zstd" (0x8000)
    section: str  # EXECUTABLE_SECTION or RELOCATABLE_SECTION
    offset: int  # of the entry's header in the file

    @property
    def ptx_version(self) -> str | None:
        return f"{self.version[0]}.{self.version[1]}" if self.kind == CodeKind.PTX else None


@dataclass(frozen=True)
class FileKernels:
    """The fat binary entries of one ELF file, in file order."""

    path: str
    entries: tuple[FatbinEntry, ...]

    @property
    def runnable(self) -> tuple[FatbinEntry, ...]:
        return tuple(e for e in self.entries if e.section == EXECUTABLE_SECTION)

    @property
    def listed(self) -> tuple[FatbinEntry, ...]:
        """What ``cuobjdump --list-elf --list-ptx`` lists without ``-all``."""
        return self.runnable or self.entries

    def sass_archs(self, entries: Iterable[FatbinEntry] | None = None) -> tuple[Arch, ...]:
        return tuple(sorted({e.arch for e in (self.runnable if entries is None else entries)
                             if e.kind == CodeKind.SASS}))

    def ptx(self, entries: Iterable[FatbinEntry] | None = None) -> tuple[tuple[Arch, str], ...]:
        """(virtual architecture, PTX ISA version) of each distinct PTX."""
        return tuple(sorted({(e.arch, e.ptx_version or "") for e in (self.runnable if entries is None else entries)
                             if e.kind == CodeKind.PTX}))

    def sass_bytes(self) -> dict[Arch, int]:
        """Stored bytes of runnable SASS per architecture: what dropping that arch would save."""
        out: dict[Arch, int] = {}
        for e in self.runnable:
            if e.kind == CodeKind.SASS:
                out[e.arch] = out.get(e.arch, 0) + e.size
        return dict(sorted(out.items()))


# ---------------------------------------------------------------- ELF sections


def _elf_sections(data: memoryview, path: str) -> list[tuple[str, int, int]]:
    """(name, offset, size) of the fat binary sections that have bytes in the file. Only
    little-endian ELF is read: CUDA code runs on x86-64 and aarch64 hosts, both little-endian."""
    if len(data) < 0x34 or data[5] != 1:
        return []
    if data[4] == 2:  # ELFCLASS64
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        header, fields = struct.Struct("<IIQQQQ"), (0, 1, 4, 5)  # name, type, offset, size
    elif data[4] == 1:  # ELFCLASS32
        shoff, = struct.unpack_from("<I", data, 0x20)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x2E)
        header, fields = struct.Struct("<IIIIII"), (0, 1, 4, 5)
    else:
        return []
    if shoff == 0 or shnum == 0:
        return []  # no section table: a stripped-down or odd ELF carries no fatbin we can find
    if shentsize < header.size or shoff + shnum * shentsize > len(data) or shstrndx >= shnum:
        raise KernelReadError(f"{path}: ELF section table is cut short or garbled",
                              hint="the file is truncated or not a valid ELF")
    table = []
    for i in range(shnum):
        row = header.unpack_from(data, shoff + i * shentsize)
        table.append(tuple(row[f] for f in fields))
    _, _, str_off, str_size = table[shstrndx]
    if str_off + str_size > len(data):
        raise KernelReadError(f"{path}: ELF section names lie past the end of the file",
                              hint="the file is truncated")
    names = bytes(data[str_off:str_off + str_size])
    found = []
    for name_off, kind, off, size in table:
        end = names.find(b"\0", name_off)
        name = names[name_off:end if end >= 0 else None].decode("latin-1")
        if name in FATBIN_SECTIONS and kind != _SHT_NOBITS and size:
            if off + size > len(data):
                raise KernelReadError(f"{path}: section {name} lies past the end of the file",
                                      hint="the file is truncated")
            found.append((name, off, size))
    return found


# ---------------------------------------------------------------- fat binaries


def parse_fatbins(data: memoryview | bytes, start: int, end: int, *, section: str = EXECUTABLE_SECTION,
                  path: str = "<bytes>") -> list[FatbinEntry]:
    """The entries of the fat binaries laid one after another in ``data[start:end]`` (a section).
    Zero bytes between them are alignment padding. Raises KernelReadError on anything else."""
    view = memoryview(data)
    out: list[FatbinEntry] = []
    pos = start
    while pos < end:
        if end - pos < _CONTAINER.size:
            if any(view[pos:end]):
                raise KernelReadError(f"{path}: {section} ends inside a fat binary header at {pos:#x}")
            break
        magic, version, header_size, fat_size = _CONTAINER.unpack_from(view, pos)
        if magic != FATBIN_MAGIC:
            if not any(view[pos:pos + 8]):
                pos += 8  # padding to the next fat binary's alignment
                continue
            raise KernelReadError(f"{path}: no fat binary at {pos:#x} in {section} (magic {magic:#010x})",
                                  hint="the section is garbled, or written by a CUDA this reader does not know")
        if version != 1 or header_size < _CONTAINER.size:
            raise KernelReadError(f"{path}: fat binary at {pos:#x} has version {version}, header size {header_size}",
                                  hint="only version 1 fat binaries are known")
        body, stop = pos + header_size, pos + header_size + fat_size
        if stop > end:
            raise KernelReadError(f"{path}: fat binary at {pos:#x} claims {fat_size} bytes, past the end of {section}",
                                  hint="the file is truncated")
        out += _entries(view, body, stop, section, path)
        pos = stop
    return out


def _entries(view: memoryview, pos: int, stop: int, section: str, path: str) -> list[FatbinEntry]:
    out = []
    while pos < stop:
        if stop - pos < _ENTRY.size:
            raise KernelReadError(f"{path}: fat binary entry at {pos:#x} in {section} is cut short")
        (kind, _, header_size, payload, stored, _, minor, major, arch, _, _, flags, _,
         inflated) = _ENTRY.unpack_from(view, pos)
        if kind not in (1, 2) or header_size < _ENTRY.size or pos + header_size + payload > stop:
            raise KernelReadError(f"{path}: garbled fat binary entry at {pos:#x} in {section} "
                                  f"(kind {kind}, header {header_size} bytes, payload {payload})")
        compression = "zstd" if flags & FLAG_COMPRESSED_ZSTD else "lz" if flags & FLAG_COMPRESSED else None
        out.append(FatbinEntry(
            kind=CodeKind.PTX if kind == 1 else CodeKind.SASS,
            arch=Arch.from_number(arch, specific=bool(flags & FLAG_ARCH_SPECIFIC),
                                  family=bool(flags & FLAG_FAMILY_SPECIFIC)),
            version=(major, minor),
            size=stored if compression else payload,
            inflated_size=inflated if compression else payload,
            compression=compression, section=section, offset=pos))
        pos += header_size + payload
    return out


def read_kernels(data: bytes | bytearray | memoryview, path: str = "<bytes>") -> FileKernels | None:
    """The fat binaries of one file's bytes; None when it is no ELF file or has no fatbin section."""
    view = memoryview(data)
    if bytes(view[:4]) != ELF_MAGIC:
        return None
    sections = _elf_sections(view, path)
    if not sections:
        return None
    entries: list[FatbinEntry] = []
    for name, off, size in sections:
        entries += parse_fatbins(view, off, off + size, section=name, path=path)
    return FileKernels(path, tuple(entries))


def read_kernels_path(path: str) -> FileKernels | None:
    with open(path, "rb") as f:
        return read_kernels(f.read(), path)
