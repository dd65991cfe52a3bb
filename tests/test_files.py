"""The one atomic-write helper: whole file or nothing, mode from the umask, usage errors for bad paths."""

import os
import stat

import pytest

from buildkit_py.errors import UsageError
from buildkit_py.files import write_atomic


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
