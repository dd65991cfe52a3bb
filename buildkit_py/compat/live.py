"""Releases newer than the shipped data, looked up on the package index at plan time and cached.

``imgbuild plan/build/render`` call ``ensure_torch`` before resolving: a ``torch:`` pin that
neither the shipped ``torch.json`` nor the cache knows is read from the index pip would use (its
Linux wheel's METADATA: CUDA variant, pins, Python range) and stored under
``$XDG_CACHE_HOME/imgbuild/compat/`` with the index URL and the date read. The resolver then
finds it through ``tables.torch_release`` and warns that the facts came from there. With
``--offline`` nothing is looked up; an unknown pin stays an error naming what is missing.

Cheap to import (json, pathlib): ``tables`` imports it on a shipped-data miss; the index client
is imported only when a look-up really goes to the network.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
from pathlib import Path

CACHE_SCHEMA = 1


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "imgbuild" / "compat"


def _torch_file() -> Path:
    return cache_dir() / "torch.json"


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("schema") == CACHE_SCHEMA else {}


def cached_rows() -> dict[str, dict]:
    """version -> cached torch.json row (with its ``index`` and ``read``)."""
    rows = _read(_torch_file()).get("releases", {})
    return rows if isinstance(rows, dict) else {}


def cached_torch(version: str):
    """The cached row as a checked ``TorchRelease``, or None (also for a row the current data
    cannot accept, e.g. a CUDA variant no shipped toolkit knows)."""
    from packaging.version import InvalidVersion, Version  # noqa: PLC0415

    from buildkit_py.compat import tables  # noqa: PLC0415
    from buildkit_py.errors import CompatDataError  # noqa: PLC0415

    try:
        want = Version(str(version))
    except InvalidVersion:
        return None
    for v, row in cached_rows().items():
        try:
            if Version(v) != want:
                continue
            rel = tables.torch_row("look-up cache torch.json", row)
        except (InvalidVersion, CompatDataError, AttributeError, TypeError):
            return None
        return dataclasses.replace(rel, from_cache=str(_torch_file()))
    return None


def _store(version: str, row: dict) -> Path:
    from buildkit_py.files import write_atomic  # noqa: PLC0415

    path = _torch_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _read(path) or {"schema": CACHE_SCHEMA, "releases": {}}
    data["releases"][version] = row
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


def torch_row_from_index(version: str, settings, *, today: str | None = None) -> dict:
    """Read torch ``version`` from the index: a torch.json row (source = index URL + wheel)."""
    from packaging.version import Version  # noqa: PLC0415

    from buildkit_py.compat import index, refresh  # noqa: PLC0415

    client = index.client_for(settings)
    project = client.project("torch")
    hits = [v for v in project.versions if Version(v) == Version(version)]
    if not hits:
        newest = ", ".join(project.releases()[-3:])
        raise LookupError(f"torch {version} is not on the package index {index.redact(settings.url)} "
                          f"(newest there: {newest})")
    return refresh.torch_row(client, project, hits[0], today=today or _dt.date.today().isoformat())


def ensure_torch(version: str, settings, *, offline: bool) -> str | None:
    """Make ``torch_release(version)`` answerable. Returns a note for the user (None when the
    shipped data or the cache already knew it). Raises LookupError / PackageIndexError."""
    from buildkit_py.compat import index, tables  # noqa: PLC0415

    if any(r.version == version for r in tables.torch_releases()) or cached_torch(version) is not None:
        return None
    if offline:
        return None
    row = torch_row_from_index(version, settings)
    row["index"] = index.redact(settings.url)
    path = _store(row["version"], row)
    if cached_torch(version) is None:   # e.g. a CUDA the shipped toolkits do not know yet
        variant = row.get("pypi_variant")
        raise LookupError(f"torch {version} on {index.redact(settings.url)} is a {variant} build, a CUDA imgbuild's shipped data "  # noqa: E501
                          "does not know yet")
    return f"looked torch {version} up on {index.redact(settings.url)} (its Linux wheel's METADATA) and cached it in {path}"  # noqa: E501
