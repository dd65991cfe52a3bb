"""The plan-time look-up cache: torch releases newer than the shipped data, as torch.json rows
read from the package index (``compat.live`` writes them; ``tables.torch_release`` reads them).
Under ``$XDG_CACHE_HOME/imgbuild/compat/``; a file that is unreadable or of another schema
counts as empty."""

from __future__ import annotations

import json
import os
from pathlib import Path

from buildkit_py.files import write_atomic

CACHE_SCHEMA = 1


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "imgbuild" / "compat"


def torch_file() -> Path:
    return cache_dir() / "torch.json"


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("schema") == CACHE_SCHEMA else {}


def cached_rows() -> dict[str, dict]:
    """version -> cached torch.json row (with its ``index`` and ``read``)."""
    rows = _read(torch_file()).get("releases", {})
    return rows if isinstance(rows, dict) else {}


def store(version: str, row: dict) -> Path:
    """Add (or replace) one torch row; the file is written atomically."""
    path = torch_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _read(path) or {"schema": CACHE_SCHEMA, "releases": {}}
    data["releases"][version] = row
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path
