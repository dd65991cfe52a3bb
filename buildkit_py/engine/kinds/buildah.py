"""Buildah, ``--engine buildah``: `buildah build` and `buildah push` (Debian 12's buildah 1.28.2),
with podman for what buildah has no command for. Both read and write the one containers storage
(/var/lib/containers, or the user's), so an image buildah builds is in podman's store at once:
podman inspects it, lists its history, saves, tags and removes it, and runs the image tests.

Only the builder differs from ``--engine podman`` (podman.py): podman's own `podman build` is
buildah's code, so the command line, its progress lines (``BuildahLines``), the capabilities and
their refusals are the same. $IMGBUILD_BUILDAH names the buildah binary (default: PATH's);
$IMGBUILD_PODMAN the podman one."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from typing import ClassVar

from buildkit_py.engine.base import CACHE_EXPORT, CACHE_FROM, Engine
from buildkit_py.engine.kinds.podman import PodmanEngine, _last_error, configured_executable, missing_executable
from buildkit_py.engine.registry import EngineChoice, register
from buildkit_py.errors import EnvironmentProblem

# buildah 1.24 is podman 4.0's: RUN --mount=type=cache and type=secret, --secret in buildah build
MIN_BUILDAH = (1, 24)


def buildah_version(text: str) -> tuple[int, ...] | None:
    """'buildah version 1.28.2 (image-spec 1.1.0-rc2, ...)' -> (1, 28, 2)."""
    match = re.search(r"version (\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(x) for x in match.groups() if x is not None) if match else None


@register
class BuildahEngine(PodmanEngine):
    kind: ClassVar[str] = "buildah"
    aliases: ClassVar[tuple[str, ...]] = ()
    auto_order: ClassVar[int | None] = None  # only when asked for: --engine buildah, IMGBUILD_ENGINE=buildah
    title: ClassVar[str] = "buildah"
    summary: ClassVar[str] = ("buildah build and push, podman for the store and the image tests; "
                              "the binaries are $IMGBUILD_BUILDAH and $IMGBUILD_PODMAN or PATH's")
    name = "buildah"
    hints: Mapping[str, str] = {
        CACHE_EXPORT: "buildah reuses the layers in its own storage; a registry cache needs --engine buildx",
        CACHE_FROM: "buildah reuses the layers in its own storage; a registry cache needs --engine buildx"}

    def __init__(self, binary: str = "podman", version: tuple[int, ...] | None = None, *,
                 buildah: str = "buildah", buildah_version: tuple[int, ...] | None = None):
        super().__init__(binary, version)
        self.tool = buildah
        self.buildah_version = buildah_version

    @staticmethod
    def _buildah() -> str | None:
        return configured_executable("IMGBUILD_BUILDAH", "buildah")

    @classmethod
    def find(cls, choice: EngineChoice) -> Engine:
        """buildah to build and push, podman (>= 4) for the store and running: both, or
        EnvironmentProblem naming the one missing."""
        buildah = cls._buildah()
        if buildah is None:
            raise missing_executable("buildah", "IMGBUILD_BUILDAH", "buildah")
        try:
            out = subprocess.run([buildah, "--version"], capture_output=True, text=True, timeout=30, check=False,
                                 stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EnvironmentProblem(f"cannot run {buildah}: {exc}") from None
        version = buildah_version(out.stdout)
        if version is None or version < MIN_BUILDAH:
            found = ".".join(map(str, version)) if version else f"no version ({_last_error(out.stdout + out.stderr)})"
            raise EnvironmentProblem(f"{buildah}: buildah {found}; imgbuild needs buildah 1.24 or newer "
                                     "(RUN --mount=type=cache and type=secret)",
                                     hint="install buildah >= 1.24 (tested with 1.28.2, Debian 12's)")
        podman, podman_version = cls.podman()
        return cls(podman, podman_version, buildah=buildah, buildah_version=version)

    @classmethod
    def for_reading(cls, choice: EngineChoice) -> Engine:
        return cls(cls._binary() or "podman", buildah=cls._buildah() or "buildah")

    def describe(self) -> str:
        version = f" {'.'.join(map(str, self.buildah_version))}" if self.buildah_version else ""
        return f"buildah engine ({self.tool}{version}, with {self.binary} for the store)"
