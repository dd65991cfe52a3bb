"""The one atomic-write helper: whole file or nothing, mode from the umask, usage errors for bad paths;
the one folder lock: a second holder waits."""

import errno
import os
import stat
import threading

import pytest

from buildkit_py.errors import UsageError
from buildkit_py.files import exclusive_folder, write_atomic


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_writes_and_replaces(tmp_path):
    target = tmp_path / "out.txt"
    write_atomic(target, "one\n")
    write_atomic(target, b"two\n")
    assert target.read_text() == "two\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_mode_follows_umask(tmp_path, umask022):
    target = write_atomic(tmp_path / "a.lock", "x")
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_private_is_0600_whatever_the_umask(tmp_path, umask022):
    target = write_atomic(tmp_path / "config.json", "{}", private=True)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_missing_folder_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist") as info:
        write_atomic(tmp_path / "missing" / "Dockerfile", "x")
    assert "mkdir -p" in info.value.hint
    assert list(tmp_path.iterdir()) == []


def test_directory_is_a_usage_error_and_leaves_nothing(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(UsageError, match="is a directory"):
        write_atomic(tmp_path / "d", "x")
    assert [p.name for p in tmp_path.iterdir()] == ["d"] and list((tmp_path / "d").iterdir()) == []


def test_failed_rename_leaves_no_temporary(tmp_path, monkeypatch):
    def refuse(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="disk gone"):
        write_atomic(tmp_path / "f", "x")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- exclusive_folder (weights pull's lock)


def _take_turns(folder, fallback) -> tuple[list[str], list[str]]:
    """Two threads lock ``folder``: the second waits (says so once) until the first lets go."""
    order, waits = [], []
    inside, release = threading.Event(), threading.Event()

    def first():
        with exclusive_folder(folder, fallback=fallback):
            order.append("first in")
            inside.set()
            release.wait(10)
            order.append("first out")

    def second():
        with exclusive_folder(folder, fallback=fallback, on_wait=lambda: waits.append("waiting") or release.set()):
            order.append("second in")

    t1 = threading.Thread(target=first)
    t1.start()
    assert inside.wait(10)
    t2 = threading.Thread(target=second)
    t2.start()
    t1.join(10)
    t2.join(10)
    return order, waits


def test_exclusive_folder_makes_a_second_holder_wait(tmp_path):
    order, waits = _take_turns(tmp_path, tmp_path / ".lock.partial")
    assert order == ["first in", "first out", "second in"] and waits == ["waiting"]
    assert list(tmp_path.iterdir()) == []  # the folder itself is locked: nothing written into it


def test_exclusive_folder_falls_back_to_a_file_where_folders_cannot_be_locked(tmp_path, monkeypatch):
    """NFS: flock on a folder fails (EBADF: its byte-range emulation needs a file open for writing)."""
    import fcntl

    real = fcntl.flock

    def nfs_like(fd, op):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EBADF, "Bad file descriptor")
        return real(fd, op)

    monkeypatch.setattr(fcntl, "flock", nfs_like)
    order, waits = _take_turns(tmp_path, tmp_path / ".lock.partial")
    assert order == ["first in", "first out", "second in"] and waits == ["waiting"]
    assert [p.name for p in tmp_path.iterdir()] == [".lock.partial"]  # kept: others may hold it open
