"""The settings a command runs with, read once: from its options and the environment, here in
the CLI and nowhere below it (tests/test_settings.py forbids ``os.environ`` below cli/). The
layers below take each value as a parameter, so the same option means the same thing on every
command and a library caller says what it means instead of inheriting a variable."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from buildkit_py.pipeline.locks import PipResolver
    from buildkit_py.pipeline.lookups import Lookup


@dataclass(frozen=True)
class Settings:
    engine: str | None  # --engine, else $IMGBUILD_ENGINE, else the older $IMGBUILD_BACKEND; None: auto
    weights_root: Path  # where `run` puts the weights it downloads (--weights-dir overrides it)
    source_date_epoch: str | None  # $SOURCE_DATE_EPOCH: the image's created time where set (pipeline/sources)
    lock_python: str  # the Python whose pip resolves a lock: $IMGBUILD_LOCK_PYTHON, else this one
    environ: Mapping[str, str]  # the environment child processes start from (pip, when locking)
    compat_cache: Path  # the plan-time look-up's cache folder ($XDG_CACHE_HOME/imgbuild/compat)

    @classmethod
    def from_args(cls, args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
        """The settings of the command ``args`` parsed, in ``environ`` (os.environ for a real run)."""
        engine = getattr(args, "engine", None) or environ.get("IMGBUILD_ENGINE") or environ.get("IMGBUILD_BACKEND")
        return cls(engine=engine or None, weights_root=_weights_root(environ),
                   source_date_epoch=environ.get("SOURCE_DATE_EPOCH"),
                   lock_python=environ.get("IMGBUILD_LOCK_PYTHON") or sys.executable, environ=dict(environ),
                   compat_cache=_cache_home(environ) / "imgbuild" / "compat")

    def lookup(self, args: argparse.Namespace, *, offline: bool | None = None) -> Lookup:
        """How this command's plan-time look-up reaches the index and its cache: --offline (or
        ``offline``), --index-url, --pip-config, pip's variables and the cache folder."""
        from buildkit_py.pipeline.lookups import Lookup

        pip_config = getattr(args, "pip_config", None)
        return Lookup(offline=getattr(args, "offline", False) if offline is None else offline,
                      index_url=getattr(args, "index_url", None), pip_config=str(pip_config) if pip_config else None,
                      environ=self.environ, cache=self.compat_cache)

    def pip_resolver(self) -> PipResolver:
        """The resolver a lock is made with: pip, run by ``lock_python`` in ``environ``."""
        from buildkit_py.pipeline.locks import PipResolver

        return PipResolver(self.lock_python, self.environ)


def _weights_root(environ: Mapping[str, str]) -> Path:
    """$IMGBUILD_WEIGHTS_DIR; else the system's folder for root, the user's cache for anyone else."""
    if environ.get("IMGBUILD_WEIGHTS_DIR"):
        return Path(environ["IMGBUILD_WEIGHTS_DIR"])
    if os.geteuid() == 0:
        return Path("/var/lib/imgbuild/weights")
    return _cache_home(environ) / "imgbuild" / "weights"


def _cache_home(environ: Mapping[str, str]) -> Path:
    """$XDG_CACHE_HOME, else ~/.cache (the XDG base directory default)."""
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def settings_of(args: argparse.Namespace) -> Settings:
    """The settings main() read for this command; read here for a handler called without main()."""
    found = getattr(args, "settings", None)
    return found if isinstance(found, Settings) else Settings.from_args(args, os.environ)
