"""ResumableSha256: a state saved anywhere and restored gives hashlib's digest; without
libcrypto it is plain hashlib and says it cannot save."""

from __future__ import annotations

import hashlib
import os

import pytest
from conftest import unavailable

from buildkit_py.oci import download, sha256_state
from buildkit_py.oci.sha256_state import CTX_SIZE, ResumableSha256

DATA = os.urandom(300_000)


@pytest.fixture
def libcrypto():
    if sha256_state._libcrypto() is None:
        unavailable("libcrypto's SHA256_* calls are not loadable here")


@pytest.mark.parametrize("cut", [0, 1, 63, 64, 65, 4096, 123_457, len(DATA)])
def test_saved_and_restored_state_gives_hashlibs_digest(libcrypto, cut):
    first = ResumableSha256()
    first.update(DATA[:cut])
    saved = first.saved()
    assert saved is not None and len(saved) == CTX_SIZE
    second = ResumableSha256(saved)
    second.update(bytearray(DATA[cut:]))  # a writable buffer, as the download's is
    assert second.hexdigest() == hashlib.sha256(DATA).hexdigest()


def test_hexdigest_leaves_the_hash_usable_and_views_are_hashed_in_place(libcrypto):
    h = ResumableSha256()
    buf = bytearray(DATA)
    h.update(memoryview(buf)[:1000])
    assert h.hexdigest() == hashlib.sha256(DATA[:1000]).hexdigest()
    h.update(memoryview(buf)[1000:])
    h.update(memoryview(b"read-only"))
    assert h.hexdigest() == h.hexdigest() == hashlib.sha256(DATA + b"read-only").hexdigest()
    buf.append(0)  # no buffer export is left behind: the bytearray can still grow


def test_a_state_of_the_wrong_size_is_refused(libcrypto):
    with pytest.raises(ValueError, match="112 bytes"):
        ResumableSha256(b"short")


def test_without_libcrypto_it_is_hashlib_and_cannot_save(monkeypatch):
    monkeypatch.setattr(sha256_state, "_libcrypto", lambda: None)
    h = ResumableSha256()
    h.update(DATA)
    assert h.hexdigest() == hashlib.sha256(DATA).hexdigest()
    assert h.saved() is None
    with pytest.raises(ValueError, match="libcrypto unavailable"):
        ResumableSha256(b"\0" * CTX_SIZE)


def test_a_library_that_hashes_wrongly_fails_the_self_check():
    class Wrong:
        """Answers like libcrypto but ignores what it is given after Init."""

        def SHA256_Init(self, ctx):  # noqa: N802 (libcrypto's names)
            return 1

        def SHA256_Update(self, ctx, data, n):  # noqa: N802
            return 1

        def SHA256_Final(self, out, ctx):  # noqa: N802
            return 1

    assert sha256_state._self_check(Wrong()) is False


def test_hash_state_on_a_file_round_trips_only_while_the_file_is_unchanged(libcrypto, tmp_path):
    path = tmp_path / "blob.partial"
    path.write_bytes(DATA[:5000])
    digest = "sha256:" + hashlib.sha256(DATA).hexdigest()
    hashing = download._Hashing(ResumableSha256())
    hashing.hasher.update(DATA[:4096])
    hashing.hashed = 4096
    with open(path, "r+b") as fh:
        hashing.settled = False  # a hashing thread may still be running: nothing is saved
        download._save_hash_state(fh.fileno(), digest, hashing)
        assert download.HASH_STATE_XATTR not in os.listxattr(fh.fileno())
        hashing.settled = True
        download._save_hash_state(fh.fileno(), digest, hashing)
        other = download._load_hash_state(fh.fileno(), "sha256:" + "0" * 64, 5000)  # another blob's
        assert other.hashed == 0
        download._save_hash_state(fh.fileno(), digest, hashing)
        loaded = download._load_hash_state(fh.fileno(), digest, 5000)
        assert loaded.hashed == 4096 and download.HASH_STATE_XATTR not in os.listxattr(fh.fileno())
        loaded.hasher.update(DATA[4096:])
        assert "sha256:" + loaded.hasher.hexdigest() == digest
        download._save_hash_state(fh.fileno(), digest, hashing)
    with open(path, "ab") as fh:
        fh.write(b"more")  # the file changed after the state was saved
    with open(path, "r+b") as fh:
        assert download._load_hash_state(fh.fileno(), digest, 5004).hashed == 0
