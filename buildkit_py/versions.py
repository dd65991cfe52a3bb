"""Version strings as the compat data and recipes write them (``12.4.1``, ``2.5``, ``3.11``)."""

from __future__ import annotations


def major_minor(version: str) -> str:
    """``12.4.1`` -> ``12.4``: the first two dot-separated parts as written (``12`` stays ``12``;
    no normalising, so ``12.04`` stays ``12.04``: a table key is matched as it was written)."""
    return ".".join(version.split(".")[:2])
