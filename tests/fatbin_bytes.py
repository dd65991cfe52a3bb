"""Hand-built ELF files with fat binaries in them, for exact tests of the kernel reader and of
what check and inspect make of its answer."""

from __future__ import annotations

import struct

PTX, SASS = 1, 2
LINUX_64 = 0x11
COMPRESSED, ZSTD, SPECIFIC, FAMILY = 0x2000, 0x8000, 0x100000, 0x200000


def entry(kind: int, arch: int, *, version: tuple[int, int] = (1, 8), payload: bytes = b"\x01" * 20,
          flags: int = LINUX_64, inflated: int = 0, extra: int = 0) -> bytes:
    """One fatbin entry: its header (64 bytes, plus ``extra`` bytes as newer CUDAs write) and
    its payload padded to 8 bytes. ``inflated`` is the inflated size of a compressed payload."""
    padded = payload + b"\0" * (-len(payload) % 8)
    compressed = flags & (COMPRESSED | ZSTD)
    header = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x101, 64 + extra, len(padded),
                         len(payload) if compressed else 0, 0x40 if extra else 0, version[1], version[0],
                         arch, 0, 0, flags, 0, inflated)
    return header + b"\0" * extra + padded


def fatbin(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def elf(sections: dict[str, bytes], *, nobits: tuple[str, ...] = ()) -> bytes:
    """A little-endian ELF64 with these sections (plus the null section and .shstrtab)."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n in sections) + b".shstrtab\0"
    body = bytearray(b"\0" * 64)
    rows = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)]
    name_off = 1
    for name, data in sections.items():
        kind = 8 if name in nobits else 1
        rows.append(struct.pack("<IIQQQQIIQQ", name_off, kind, 0, 0, len(body), len(data), 0, 0, 8, 0))
        if name not in nobits:
            body += data
        name_off += len(name) + 1
    rows.append(struct.pack("<IIQQQQIIQQ", name_off, 3, 0, 0, len(body), len(names), 0, 0, 1, 0))
    body += names
    shoff = len(body)
    body += b"".join(rows)
    header = bytearray(b"\x7fELF\x02\x01\x01" + b"\0" * 9)
    header += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(rows), len(rows) - 1)
    body[:64] = header
    return bytes(body)
