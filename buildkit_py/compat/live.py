"""Releases newer than the shipped data, looked up on the package index at plan time and cached.

``imgbuild plan/build/render`` call ``ensure_torch`` before resolving: a ``torch:`` pin that
neither the shipped ``torch.json`` nor the cache knows is read from the index pip would use (its
Linux wheel's METADATA: CUDA variant, pins, Python range) and stored under
``$XDG_CACHE_HOME/imgbuild/compat/`` with the index URL and the date read. The resolver then
finds it through ``tables.torch_release`` and warns that the facts came from there. With
``--offline`` nothing is looked up; an unknown pin stays an error naming what is missing.

The cache itself is ``compat.cache`` (read by ``tables``, which must not depend on the network
client); this module adds the look-up, so the CLI imports it only when a pin is unknown or for
``imgbuild data``.
"""

from __future__ import annotations

import datetime as _dt

from packaging.version import Version

from buildkit_py.compat import index, refresh, tables
from buildkit_py.compat.cache import cache_dir, cached_rows, store

# The cache's readers (``imgbuild data status``) find it here, beside the look-up that fills it.
__all__ = ["cache_dir", "cached_rows", "ensure_torch", "torch_row_from_index"]


def torch_row_from_index(version: str, settings, *, today: str | None = None) -> dict:
    """Read torch ``version`` from the index: a torch.json row (source = index URL + wheel)."""
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
    if any(r.version == version for r in tables.torch_releases()) or tables.cached_torch(version) is not None:
        return None
    if offline:
        return None
    row = torch_row_from_index(version, settings)
    row["index"] = index.redact(settings.url)
    path = store(row["version"], row)
    if tables.cached_torch(version) is None:   # e.g. a CUDA the shipped toolkits do not know yet
        variant = row.get("pypi_variant")
        raise LookupError(f"torch {version} on {index.redact(settings.url)} is a {variant} build, a CUDA "
                          "imgbuild's shipped data does not know yet")
    return (f"looked torch {version} up on {index.redact(settings.url)} (its Linux wheel's METADATA) "
            f"and cached it in {path}")
