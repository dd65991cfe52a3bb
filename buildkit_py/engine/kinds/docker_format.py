"""Docker's description of an image (`docker image inspect`, the history API), parsed once into
``ImageInfo`` and ``HistoryEntry``: the docker kinds read it from the SDK, podman.py converts
podman's to it first. The only module that reads those JSON keys (tests/test_engine_keys.py).
It registers no engine."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from buildkit_py.engine.base import HistoryEntry, ImageInfo


def image_info(attrs: Mapping[str, Any]) -> ImageInfo:
    """`docker image inspect` of one image as ``ImageInfo``."""
    return ImageInfo(
        id=str(attrs.get("Id") or ""),
        config=dict(attrs.get("Config") or {}),
        layers=tuple((attrs.get("RootFS") or {}).get("Layers") or ()),
        repo_digests=tuple(attrs.get("RepoDigests") or ()),
        size=int(attrs.get("Size") or 0),
        os=attrs.get("Os") or None,
        architecture=attrs.get("Architecture") or None,
        variant=attrs.get("Variant") or None,
        created=attrs.get("Created") or None,
    )


def history_entries(entries: Iterable[Mapping[str, Any]]) -> list[HistoryEntry]:
    """The docker API's history entries as ``HistoryEntry``, in the same order."""
    return [HistoryEntry(created_by=str(e.get("CreatedBy") or ""), size=int(e.get("Size") or 0),
                         id=str(e.get("Id") or "<missing>"), created=int(e.get("Created") or 0),
                         comment=str(e.get("Comment") or "")) for e in entries]
