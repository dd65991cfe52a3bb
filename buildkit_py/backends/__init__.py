"""Build backends: each runs a BuildKit build through a docker client and declares what it can do.

The plan states what it needs (``BuildPlan.needs`` plus what the command line asks for);
``require`` refuses early, before any build starts, when the backend lacks it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from ..errors import BackendCapabilityError, EnvironmentProblem

# Capability names
MULTI_STAGE = "multi-stage"
CACHE_MOUNTS = "cache-mounts"
SECRETS = "secrets"
CACHE_FROM = "cache-from"
CACHE_EXPORT = "cache-export"
PUSH = "push"
METADATA_FILE = "metadata-file"
BUILDER_SELECT = "builder"

LineSink = Callable[[str], None]


@dataclass(frozen=True)
class BuildRequest:
    context_dir: Path
    dockerfile: Path
    tags: tuple[str, ...]
    labels: dict[str, str] = field(default_factory=dict)  # volatile labels, added at export
    secrets: dict[str, Path] = field(default_factory=dict)  # id -> file
    network: str | None = "host"
    no_cache: bool = False
    progress: str = "auto"  # auto | plain | tty
    cache_from: tuple[str, ...] = ()
    cache_to: tuple[str, ...] = ()
    builder: str | None = None
    target: str | None = None


@dataclass(frozen=True)
class BuildResult:
    image_id: str
    tags: tuple[str, ...]
    log_tail: str
    cached_steps: int
    run_steps: int
    seconds: float
    rerun: tuple[str, ...] = ()  # the steps that ran (not cached), by marker id or instruction


class BuildBackend(Protocol):
    name: str
    client: str  # the docker client binary
    capabilities: frozenset[str]

    def build(self, request: BuildRequest, on_line: LineSink) -> BuildResult: ...


def required_capabilities(plan_needs: frozenset[str], request: BuildRequest) -> set[str]:
    needs = set(plan_needs)
    if request.cache_from:
        needs.add(CACHE_FROM)
    if request.cache_to:
        needs.add(CACHE_EXPORT)
    if request.builder:
        needs.add(BUILDER_SELECT)
    return needs


def require(backend: BuildBackend, needs: set[str]) -> None:
    missing = sorted(needs - backend.capabilities)
    if missing:
        hint = "install the docker buildx plugin (docker-buildx-plugin) for " + ", ".join(missing)
        if CACHE_EXPORT in missing:
            hint += "; with the classic client use --cache-from with an image built with inline cache"
        raise BackendCapabilityError(
            f"the {backend.name} backend ({backend.client}) cannot do what this build needs: {', '.join(missing)}",
            hint=hint)


def _client_version(binary: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([binary, "version", "--format", "{{.Client.Version}}"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    # "20.10.24+dfsg1", "28.2.2", "24.0.7-rd": the leading numbers are the version.
    match = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", out.stdout.strip())
    return tuple(int(x) for x in match.groups() if x is not None) if match else None


def _has_buildx(binary: str) -> bool:
    try:
        out = subprocess.run([binary, "buildx", "version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0


def candidate_clients() -> list[str]:
    """docker clients to consider, in order: $IMGBUILD_DOCKER, the first on PATH, Debian's."""
    seen: list[str] = []
    for c in (os.environ.get("IMGBUILD_DOCKER"), shutil.which("docker"), "/usr/bin/docker"):
        if c and os.path.exists(c) and os.path.realpath(c) not in {os.path.realpath(s) for s in seen}:
            seen.append(c)
    return seen


def detect_backend(preference: str | None = None) -> BuildBackend:
    """Pick a BuildKit-capable backend: buildx where a client has it, else a client older than
    23.0 whose classic `docker build` still speaks BuildKit with DOCKER_BUILDKIT=1 (newer
    clients need buildx for that and silently fall back to the legacy builder without it).

    preference: None/"auto", "buildx" or "docker" (also from $IMGBUILD_BACKEND).
    """
    from .buildx import BuildxBackend
    from .docker_cli import ClassicBuildKitBackend

    preference = preference or os.environ.get("IMGBUILD_BACKEND") or "auto"
    if preference not in {"auto", "buildx", "docker"}:
        raise EnvironmentProblem(f"unknown backend {preference!r}", hint="use auto, buildx or docker")
    clients = candidate_clients()
    if not clients:
        raise EnvironmentProblem("no docker client found",
                                 hint="install Docker (on Debian: apt-get install docker.io) or run scripts/services.sh up")
    seen = []
    if preference in {"auto", "buildx"}:
        for c in clients:
            if _has_buildx(c):
                return BuildxBackend(c)
            seen.append(f"{c}: no buildx plugin")
        if preference == "buildx":
            raise EnvironmentProblem("no docker client with the buildx plugin: " + "; ".join(seen),
                                     hint="install docker-buildx-plugin, or use --backend docker")
    for c in clients:
        version = _client_version(c)
        if version and version < (23,):
            return ClassicBuildKitBackend(c)
        seen.append(f"{c}: client {'.'.join(map(str, version)) if version else 'unknown'} needs buildx for BuildKit")
    raise EnvironmentProblem("no BuildKit-capable docker client: " + "; ".join(seen),
                             hint="install the buildx plugin, or point IMGBUILD_DOCKER at a 20.10 client "
                                  "(Debian's /usr/bin/docker from docker.io)")
