"""SHA-256 whose running state can be saved and restored, so a resumed download hashes
only the bytes it has not hashed before.

``hashlib`` cannot export a running state (CPython keeps OpenSSL's context private), and
``rehash``, the library that did, stops at OpenSSL 1.x. OpenSSL's SHA256_Init/Update/Final
work on a caller-owned struct whose layout is public (``SHA256_CTX`` in <openssl/sha.h>:
``h[8], Nl, Nh, data[16], num, md_len``, 112 bytes; the same in 1.1 and 3.x), and run the
same SHA-NI code that hashlib reaches (measured here: 1615 MiB/s against hashlib's 1621).
They are deprecated in OpenSSL 3 but exported; if libcrypto cannot be loaded, lacks them or
fails the self-check below, hashlib is used and ``saved()`` is None (a resume then
re-hashes the file, as before).

ctypes releases the GIL for the call, so hashing in a thread overlaps the transfer as
hashlib's ``update`` does.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib

CTX_SIZE = 112  # sizeof(SHA256_CTX): the bytes a saved state holds
_CTX_BUFFER = 256  # room to spare: a wrong layout fails the self-check instead of writing past
_LIBRARIES = ("libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.so", "libcrypto.3.dylib", "libcrypto.1.1.dylib")


@functools.cache
def _libcrypto() -> ctypes.CDLL | None:
    """libcrypto with the SHA256_* calls, or None; loaded and self-checked once."""
    for name in _LIBRARIES:
        try:
            lib = ctypes.CDLL(name)
            for fn in (lib.SHA256_Init, lib.SHA256_Update, lib.SHA256_Final):
                fn.restype = ctypes.c_int
            lib.SHA256_Update.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
        except (OSError, AttributeError):
            continue
        if _self_check(lib):
            return lib
    return None


def _self_check(lib: ctypes.CDLL) -> bool:
    """A state saved mid-way and restored elsewhere gives hashlib's digest."""
    data = bytes(range(256)) * 40 + b"tail"
    ctx = ctypes.create_string_buffer(_CTX_BUFFER)
    if lib.SHA256_Init(ctx) != 1 or lib.SHA256_Update(ctx, data, 1001) != 1:
        return False
    moved = ctypes.create_string_buffer(_CTX_BUFFER)
    ctypes.memmove(moved, ctx, CTX_SIZE)
    out = ctypes.create_string_buffer(32)
    if lib.SHA256_Update(moved, data[1001:], len(data) - 1001) != 1 or lib.SHA256_Final(out, moved) != 1:
        return False
    return out.raw == hashlib.sha256(data).digest()


class ResumableSha256:
    """``update`` / ``hexdigest`` as hashlib's, plus ``saved()`` and ``ResumableSha256(saved)``."""

    def __init__(self, saved: bytes | None = None):
        self._lib = _libcrypto()
        self._ctx = ctypes.create_string_buffer(_CTX_BUFFER)
        self._fallback = hashlib.sha256()  # used only without libcrypto
        if self._lib is None:
            if saved is not None:
                raise ValueError("no saved SHA-256 state can be restored here (libcrypto unavailable)")
        elif saved is None:
            self._lib.SHA256_Init(self._ctx)
        elif len(saved) != CTX_SIZE:
            raise ValueError(f"a saved SHA-256 state has {CTX_SIZE} bytes, not {len(saved)}")
        else:
            ctypes.memmove(self._ctx, saved, CTX_SIZE)

    def update(self, data: bytes | bytearray | memoryview) -> None:
        lib = self._lib
        if lib is None:
            self._fallback.update(data)
        elif isinstance(data, bytes):
            lib.SHA256_Update(self._ctx, data, len(data))
        else:
            with memoryview(data) as view:
                if view.readonly:  # no pointer without a copy; callers hash writable buffers
                    lib.SHA256_Update(self._ctx, view.tobytes(), view.nbytes)
                    return
                array = (ctypes.c_char * view.nbytes).from_buffer(view)
                lib.SHA256_Update(self._ctx, array, view.nbytes)
                del array  # the buffer export ends before the view is released

    def hexdigest(self) -> str:
        lib = self._lib
        if lib is None:
            return self._fallback.hexdigest()
        ctx = ctypes.create_string_buffer(_CTX_BUFFER)  # Final on a copy: this one stays usable
        ctypes.memmove(ctx, self._ctx, CTX_SIZE)
        out = ctypes.create_string_buffer(32)
        lib.SHA256_Final(out, ctx)
        return out.raw.hex()

    def saved(self) -> bytes | None:
        """The running state, to restore with ``ResumableSha256(saved)``; None without libcrypto."""
        if self._lib is None:
            return None
        return self._ctx.raw[:CTX_SIZE]
