"""Choosing the engine once, from --engine/$IMGBUILD_ENGINE, $IMGBUILD_DOCKER (or PATH),
$DOCKER_HOST and --builder: the client, whether it has buildx, and which kind to build with."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from buildkit_py.engine.base import _WHO_CAN, BUILDER_SELECT, Engine
from buildkit_py.engine.buildx import BuilderEngine, BuildxEngine
from buildkit_py.engine.docker_cli import ClassicEngine
from buildkit_py.errors import BackendCapabilityError, EnvironmentProblem, ImgbuildError
from buildkit_py.text_enum import TextEnum


def _client_version(binary: str, env: dict[str, str] | None = None) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([binary, "version", "--format", "{{.Client.Version}}"], capture_output=True,  # noqa: PLW1510
                             text=True, timeout=20, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    # "20.10.24+dfsg1", "28.2.2", "24.0.7-rd": the leading numbers are the version.
    match = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", out.stdout.strip())
    return tuple(int(x) for x in match.groups() if x is not None) if match else None


def _has_buildx(binary: str) -> bool:
    try:
        out = subprocess.run([binary, "buildx", "version"], capture_output=True, text=True, timeout=20)  # noqa: PLW1510
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0


def buildx_beside(client: str) -> str | None:
    """A buildx plugin shipped with the client (<prefix>/libexec/docker/cli-plugins) that the
    client's config does not list: run standalone, so no config folder is changed."""
    prefix = Path(os.path.realpath(client)).parent.parent
    for d in ("libexec", "lib"):
        p = prefix / d / "docker" / "cli-plugins" / "docker-buildx"
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


def candidate_clients() -> list[str]:
    """docker clients to consider: $IMGBUILD_DOCKER alone when set (it must exist), else the
    first on PATH and Debian's."""
    explicit = os.environ.get("IMGBUILD_DOCKER")
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise EnvironmentProblem(f"IMGBUILD_DOCKER={explicit}: no such executable",
                                     hint="point it at a docker client (e.g. /usr/bin/docker) or unset it")
        return [explicit]
    seen: list[str] = []
    for c in (shutil.which("docker"), "/usr/bin/docker"):
        if c and os.path.exists(c) and os.path.realpath(c) not in {os.path.realpath(s) for s in seen}:
            seen.append(c)
    return seen


class EngineChoice(TextEnum):
    """What --engine and $IMGBUILD_ENGINE may say: the one list (the CLI checks --engine
    against it too)."""

    AUTO = "auto"  # buildx where the client has it, else a 20.10 client
    BUILDX = "buildx"
    DOCKER = "docker"  # the classic client: DOCKER_BUILDKIT=1 docker build
    CLASSIC = "classic"  # the same, by the name of its kind (README's engine table)


ENGINE_KINDS = EngineChoice.words()


def select_engine(preference: str | None = None, *, builder: str | None = None,
                  host: str | None = None) -> Engine:
    """Pick the engine once: ``preference`` (--engine/--backend, else $IMGBUILD_ENGINE or
    $IMGBUILD_BACKEND: auto, buildx, or docker/classic), the client from $IMGBUILD_DOCKER (or
    PATH, then Debian's), the engine from ``host`` or $DOCKER_HOST, a named builder from
    --builder. Auto prefers buildx; a client older than 23.0 without it still speaks BuildKit
    with DOCKER_BUILDKIT=1 (newer ones fall back to the legacy builder: refused)."""
    preference = preference or os.environ.get("IMGBUILD_ENGINE") or os.environ.get("IMGBUILD_BACKEND") or "auto"
    if preference not in ENGINE_KINDS:
        raise EnvironmentProblem(f"unknown engine {preference!r}", hint="use auto, buildx or docker")
    if builder and preference in {EngineChoice.DOCKER, EngineChoice.CLASSIC}:
        raise BackendCapabilityError(f"--builder {builder} needs buildx, not the classic client",
                                     hint=f"builder: {_WHO_CAN[BUILDER_SELECT]}")
    clients = candidate_clients()
    if not clients:
        raise EnvironmentProblem("no docker client found",
                                 hint="install Docker (on Debian: apt-get install docker.io) "
                                      "or run scripts/services.sh up")
    seen = []
    if preference in {EngineChoice.AUTO, EngineChoice.BUILDX}:
        for c in clients:
            runner = [c, "buildx"] if _has_buildx(c) else ([p] if (p := buildx_beside(c)) else None)
            if runner:
                cls = BuilderEngine if builder else BuildxEngine
                return cls(c, host=host, builder=builder, buildx=runner)
            seen.append(f"{c}: no buildx plugin")
        if preference == EngineChoice.BUILDX or builder:
            raise EnvironmentProblem("no docker client with the buildx plugin: " + "; ".join(seen),
                                     hint="install docker-buildx-plugin, or use --engine docker")
    for c in clients:
        version = _client_version(c)
        if version and version < (23,):
            return ClassicEngine(c, host=host)
        seen.append(f"{c}: client {'.'.join(map(str, version)) if version else 'unknown'} needs buildx for BuildKit")
    where = "IMGBUILD_DOCKER" if os.environ.get("IMGBUILD_DOCKER") else "found"
    raise EnvironmentProblem(f"no BuildKit-capable docker client ({where}): " + "; ".join(seen),
                             hint="install the buildx plugin, or point IMGBUILD_DOCKER at a 20.10 client "
                                  "(Debian's /usr/bin/docker from docker.io)")


def detect_backend(preference: str | None = None) -> Engine:
    """The older name of ``select_engine``."""
    return select_engine(preference)


def engine_for_reading() -> Engine:
    """An engine for commands that only read images (inspect, run, check): no BuildKit needed,
    so any client will do; the engine is the one DOCKER_HOST names."""
    try:
        return select_engine()
    except ImgbuildError:
        clients = [c for c in (os.environ.get("IMGBUILD_DOCKER"), shutil.which("docker"), "/usr/bin/docker") if c]
        return ClassicEngine(clients[0] if clients else "docker")
