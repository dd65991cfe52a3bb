"""Engines: one object per kind of docker engine + BuildKit client, chosen once by the CLI
(``select_engine``) and passed down. Every module that needs the engine (build, push, image
attributes, history, save, run, info) asks this object; none builds its own client.

Kinds: ``ClassicEngine`` (a 20.10 client, ``DOCKER_BUILDKIT=1 docker build``),
``BuildxEngine`` (``docker buildx build`` with the engine's own ``docker`` driver) and
``BuilderEngine`` (``docker buildx build --builder NAME``: a docker-container, remote or
Kubernetes BuildKit). Each declares its capabilities; ``require`` refuses an option the
engine cannot honour before any build starts, naming the engine or setting that can.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from buildkit_py.errors import BackendCapabilityError, EnvironmentProblem, ImgbuildError

if TYPE_CHECKING:
    from buildkit_py.engine.push import PushResult

# Capability names
MULTI_STAGE = "multi-stage"
CACHE_MOUNTS = "cache-mounts"
SECRETS = "secrets"
CACHE_FROM = "cache-from"
CACHE_EXPORT = "cache-export"
PUSH = "push"  # push from the build itself (BuildKit's image exporter), no second pass
METADATA_FILE = "metadata-file"
BUILDER_SELECT = "builder"
COMPRESSION = "compression"  # gzip|zstd with a level
OCI_MEDIATYPES = "oci-mediatypes"
PROVENANCE = "provenance"
PLATFORM = "platform"

# What can honour each capability, for the refusal's hint.
_WHO_CAN = {
    CACHE_EXPORT: "buildx with the containerd image store (Docker >= 24 with "
                  '{"features": {"containerd-snapshotter": true}} in daemon.json, e.g. the Docker 26 engine '
                  "scripts/services.sh starts on /run/docker26.sock) or a named builder (--builder)",
    PUSH: "buildx (docker buildx plugin >= 0.10)",
    METADATA_FILE: "buildx (docker buildx plugin)",
    BUILDER_SELECT: "buildx (docker buildx plugin)",
    COMPRESSION: "buildx with the containerd image store, or a named builder (--builder)",
    OCI_MEDIATYPES: "buildx with the containerd image store, or a named builder (--builder)",
    PROVENANCE: "buildx >= 0.10 with the containerd image store, or a named builder (--builder)",
    PLATFORM: "buildx (docker buildx plugin)",
}

LineSink = Callable[[str], None]
ProgressSink = Callable[[str], None]


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
    push: bool = False  # push every tag from the build (buildx)
    load: bool = True  # the image must end up in the engine's store
    compression: str | None = None  # "gzip", "zstd", "zstd:19"
    oci_mediatypes: bool = False
    provenance: str | None = None  # "min", "max", "false"; None: the client's default
    platforms: tuple[str, ...] = ()


@dataclass(frozen=True)
class BuildResult:
    image_id: str
    tags: tuple[str, ...]
    log_tail: str
    cached_steps: int
    run_steps: int
    seconds: float
    rerun: tuple[str, ...] = ()  # the steps that ran (not cached), by marker id or instruction
    digest: str | None = None  # the pushed manifest (or index) digest, from --metadata-file


@dataclass(frozen=True)
class ImageSizes:
    """Both numbers users meet, under explicit names: ``uncompressed`` is what the layers
    take unpacked (20.10's `docker images` SIZE), ``compressed`` what a pull downloads
    (the containerd store's SIZE, or the registry manifest's layer sizes); None when unknown."""
    uncompressed: int
    compressed: int | None


def parse_compression(value: str | None) -> tuple[str, int | None] | None:
    """'zstd:19' -> ('zstd', 19); 'gzip' -> ('gzip', None); None stays None."""
    if value is None:
        return None
    name, _, level = value.partition(":")
    limits = {"gzip": (0, 9), "zstd": (0, 22), "estargz": (0, 9), "uncompressed": None}
    if name not in limits or (level and (limits[name] is None or not level.isdigit()
                                         or not limits[name][0] <= int(level) <= limits[name][1])):
        from buildkit_py.errors import UsageError  # noqa: PLC0415

        raise UsageError(f"--compression {value!r}: use gzip[:0-9], zstd[:0-22], estargz or uncompressed")
    return name, int(level) if level else None


def required_capabilities(plan_needs: frozenset[str], request: BuildRequest) -> set[str]:
    needs = set(plan_needs)
    if request.cache_from:
        needs.add(CACHE_FROM)
    if request.cache_to:
        needs.add(CACHE_EXPORT)
    if request.builder:
        needs.add(BUILDER_SELECT)
    if request.compression:
        needs.add(COMPRESSION)
    if request.oci_mediatypes:
        needs.add(OCI_MEDIATYPES)
    if request.provenance is not None:
        needs.add(PROVENANCE)
    if request.platforms:
        needs.add(PLATFORM)
    return needs


def require(engine: Engine, needs: set[str]) -> None:
    missing = sorted(needs - engine.capabilities)
    if missing:
        hint = "; ".join(f"{m}: {_WHO_CAN[m]}" for m in missing if m in _WHO_CAN) or \
            "install the docker buildx plugin (docker-buildx-plugin)"
        if CACHE_EXPORT in missing and engine.kind == "classic":
            hint += "; with the classic client use --cache-from with an image built with inline cache"
        raise BackendCapabilityError(
            f"the {engine.describe()} cannot do what this build needs: {', '.join(missing)}", hint=hint)


# --- the engine object -------------------------------------------------------------------------


def _sdk_error(exc: Exception, host: str | None) -> EnvironmentProblem:
    where = host or os.environ.get("DOCKER_HOST") or "the default socket"
    return EnvironmentProblem(f"cannot reach the Docker engine at {where} ({exc.__class__.__name__})",
                              hint="start it (scripts/services.sh up) or set DOCKER_HOST")


class Engine:
    """One docker engine (at ``host``, None: the client's default) and the client that builds
    on it. Subclasses add ``build`` and their capabilities."""

    name = "engine"
    kind = "engine"
    capabilities: frozenset[str] = frozenset()

    def __init__(self, client: str, *, host: str | None = None, builder: str | None = None):
        self.client = client
        self.host = host if host is not None else (os.environ.get("DOCKER_HOST") or None)
        self.builder = builder
        self._local = threading.local()
        self._info: dict | None = None

    # -- how to call it
    def describe(self) -> str:
        return f"{self.name} engine ({self.client}{', ' + self.host if self.host else ''})"

    def environment(self) -> dict[str, str]:
        env = {**os.environ, "DOCKER_BUILDKIT": "1"}
        if self.host:
            env["DOCKER_HOST"] = self.host
        return env

    def docker_argv(self) -> list[str]:
        """The client command line that reaches this engine (for `docker run` and friends)."""
        return [self.client, *(["--host", self.host] if self.host else [])]

    def sdk(self):
        """A docker SDK client for this engine, one per thread (requests sessions are not shared)."""
        client = getattr(self._local, "client", None)
        if client is None:
            import docker  # heavy: only when the engine is really used  # noqa: PLC0415

            try:
                client = docker.DockerClient(base_url=self.host, timeout=600) if self.host \
                    else docker.from_env(timeout=600)
                client.ping()
            except Exception as exc:  # noqa: BLE001 - any failure to reach it means "no engine"
                raise _sdk_error(exc, self.host) from None
            self._local.client = client
        return client

    # -- what it knows
    def info(self) -> dict:
        if self._info is None:
            self._info = self.sdk().info()
        return self._info

    def containerd_store(self) -> bool:
        """True when images live in containerd's content store (compressed blobs, OCI `docker save`)."""
        status = dict(tuple(x) for x in (self.info().get("DriverStatus") or []) if len(x) == 2)
        return status.get("driver-type") == "io.containerd.snapshotter.v1"

    def image_attrs(self, ref: str) -> dict | None:
        """`docker image inspect` of ``ref``, None when the engine does not have it."""
        import docker.errors  # noqa: PLC0415

        try:
            return self.sdk().api.inspect_image(ref)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.DockerException as exc:
            raise _sdk_error(exc, self.host) from None

    def history(self, ref: str) -> list[dict]:
        """`docker history`, oldest first."""
        return list(reversed(self.sdk().api.history(ref)))

    def image_sizes(self, ref: str) -> ImageSizes:
        attrs = self.image_attrs(ref) or {}
        size = int(attrs.get("Size") or 0)
        if self.containerd_store():
            # Size is the compressed content; the snapshots' sizes are in the history.
            return ImageSizes(sum(int(h.get("Size") or 0) for h in self.history(ref)), size)
        return ImageSizes(size, None)

    def save(self, ref: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """The bytes of `docker save ref`: the classic layout on 20.10, an OCI layout on the
        containerd store (inspect reads both)."""
        return self.sdk().images.get(ref).save(chunk_size=chunk_size)

    def tag(self, image: str, ref: str) -> None:
        """Give ``image`` (an id or a reference) the tag ``ref``."""
        from buildkit_py import oci  # noqa: PLC0415

        parsed = oci.parse_reference(ref)
        self.sdk().images.get(image).tag(ref.rsplit(":", 1)[0], parsed.tag or "latest")

    def untag(self, ref: str) -> None:
        self.sdk().images.remove(ref, noprune=True)

    def remove(self, ref: str) -> None:
        subprocess.run([*self.docker_argv(), "image", "rm", "-f", ref], capture_output=True, check=False,
                       env=self.environment())

    def push(self, ref: str, *, on_progress: ProgressSink | None = None) -> PushResult:
        """Push one tag that is in the engine, through the SDK."""
        from buildkit_py.engine.push import push_image  # noqa: PLC0415

        return push_image(self.sdk(), ref, on_progress=on_progress)

    def build(self, request: BuildRequest, on_line: LineSink) -> BuildResult:  # pragma: no cover - abstract
        raise NotImplementedError


# Kept for the modules and tests written against the backend names.
BuildBackend = Engine


# --- choosing one ------------------------------------------------------------------------------


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


ENGINE_KINDS = ("auto", "buildx", "docker", "classic")


def select_engine(preference: str | None = None, *, builder: str | None = None,
                  host: str | None = None) -> Engine:
    """Pick the engine once: ``preference`` (--engine/--backend, else $IMGBUILD_ENGINE or
    $IMGBUILD_BACKEND: auto, buildx, or docker/classic), the client from $IMGBUILD_DOCKER (or
    PATH, then Debian's), the engine from ``host`` or $DOCKER_HOST, a named builder from
    --builder. Auto prefers buildx; a client older than 23.0 without it still speaks BuildKit
    with DOCKER_BUILDKIT=1 (newer ones fall back to the legacy builder: refused)."""
    from buildkit_py.engine.buildx import BuilderEngine, BuildxEngine  # noqa: PLC0415
    from buildkit_py.engine.docker_cli import ClassicEngine  # noqa: PLC0415

    preference = preference or os.environ.get("IMGBUILD_ENGINE") or os.environ.get("IMGBUILD_BACKEND") or "auto"
    if preference not in ENGINE_KINDS:
        raise EnvironmentProblem(f"unknown engine {preference!r}", hint="use auto, buildx or docker")
    if builder and preference in {"docker", "classic"}:
        raise BackendCapabilityError(f"--builder {builder} needs buildx, not the classic client",
                                     hint=f"builder: {_WHO_CAN[BUILDER_SELECT]}")
    clients = candidate_clients()
    if not clients:
        raise EnvironmentProblem("no docker client found",
                                 hint="install Docker (on Debian: apt-get install docker.io) "
                                      "or run scripts/services.sh up")
    seen = []
    if preference in {"auto", "buildx"}:
        for c in clients:
            runner = [c, "buildx"] if _has_buildx(c) else ([p] if (p := buildx_beside(c)) else None)
            if runner:
                cls = BuilderEngine if builder else BuildxEngine
                return cls(c, host=host, builder=builder, buildx=runner)
            seen.append(f"{c}: no buildx plugin")
        if preference == "buildx" or builder:
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
        from buildkit_py.engine.docker_cli import ClassicEngine  # noqa: PLC0415

        return ClassicEngine(clients[0] if clients else "docker")


__all__ = ["BuildRequest", "BuildResult", "Engine", "ImageSizes", "require", "required_capabilities",
           "select_engine"]
