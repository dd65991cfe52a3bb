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


@dataclass(frozen=True)
class Settings:
    engine: str | None  # --engine, else $IMGBUILD_ENGINE, else the older $IMGBUILD_BACKEND; None: auto
    weights_root: Path  # where `run` puts the weights it downloads (--weights-dir overrides it)
    source_date_epoch: str | None  # $SOURCE_DATE_EPOCH: the image's created time where set (pipeline/sources)
    lock_python: str  # the Python whose pip resolves a lock: $IMGBUILD_LOCK_PYTHON, else this one
    environ: Mapping[str, str]  # the environment child processes start from (pip, when locking)

    @classmethod
    def from_args(cls, args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
        """The settings of the command ``args`` parsed, in ``environ`` (os.environ for a real run)."""
        engine = getattr(args, "engine", None) or environ.get("IMGBUILD_ENGINE") or environ.get("IMGBUILD_BACKEND")
        return cls(engine=engine or None, weights_root=_weights_root(environ),
                   source_date_epoch=environ.get("SOURCE_DATE_EPOCH"),
                   lock_python=environ.get("IMGBUILD_LOCK_PYTHON") or sys.executable, environ=dict(environ))

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
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "imgbuild" / "weights"


def settings_of(args: argparse.Namespace) -> Settings:
    """The settings main() read for this command; read here for a handler called without main()."""
    found = getattr(args, "settings", None)
    return found if isinstance(found, Settings) else Settings.from_args(args, os.environ)
