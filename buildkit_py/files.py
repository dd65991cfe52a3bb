"""Writing output files: the one atomic-write helper every command uses."""

from __future__ import annotations

import os
from pathlib import Path

from buildkit_py.errors import UsageError


def write_atomic(path: str | os.PathLike, data: str | bytes, *, private: bool = False) -> Path:
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
