"""Writing output files: the one atomic-write helper every command uses, and the one folder lock
(downloads into a shared folder)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from buildkit_py.errors import UsageError


def write_atomic(path: str | os.PathLike[str], data: str | bytes, *, private: bool = False) -> Path:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part.

    The bytes go to a hidden temporary file beside ``path`` (same file system), are fsynced and
    renamed over it. The mode follows the umask (0644 under umask 022) unless ``private``, which
    creates the file 0600 from the start (credentials). A path that is a directory, or whose folder
    does not exist, is a usage error; nothing is left behind on any failure.
    """
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"cannot write {path}: it is a directory", hint="give a file name, e.g. "
                         f"{path / 'Dockerfile'}")
    parent = path.parent
    if not parent.is_dir():
        raise UsageError(f"cannot write {path}: folder {parent} does not exist",
                         hint=f"create it first (mkdir -p {parent})")
    # O_EXCL below makes a clash an error, not a race; os.urandom spares every CLI start the
    # import of `secrets` (hmac, hashlib, random: a quarter of `imgbuild --version`).
    tmp = parent / f".{path.name}.{os.urandom(4).hex()}.tmp"
    raw = data.encode() if isinstance(data, str) else data
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o666)
    except PermissionError:
        raise UsageError(f"cannot write {path}: no permission to create files in {parent}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


@contextmanager
def exclusive_folder(path: str | os.PathLike[str], *, fallback: str | os.PathLike[str],
                     on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on folder ``path`` while the block runs: another holder, in this
    process or another, waits until it ends (``on_wait`` is called once before waiting).

    The lock is ``flock`` on the folder itself, so nothing is written into it. A file system that
    refuses to lock a folder (NFS emulates flock with byte-range locks, which need a file open for
    writing) gets the same lock on the file ``fallback`` instead, created if missing and kept:
    removing a lock file others may hold open would let two holders in. The kernel drops the lock
    when its holder exits, so a killed process never leaves a stale one.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            _lock(fd, on_wait)
        except OSError as exc:
            if exc.errno not in (errno.EBADF, errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            os.close(fd)
            fd = -1
            fd = os.open(fallback, os.O_RDWR | os.O_CREAT, 0o644)
            _lock(fd, on_wait)
        yield
    finally:
        if fd >= 0:
            os.close(fd)  # closing the last descriptor releases the lock


def _lock(fd: int, on_wait: Callable[[], None] | None) -> None:
    import fcntl  # noqa: PLC0415 - POSIX only, and only a pull needs it

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        if on_wait:
            on_wait()
        fcntl.flock(fd, fcntl.LOCK_EX)
