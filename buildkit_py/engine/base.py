"""The engine object's base: build requests and results, capabilities and the refusal of an
option the engine cannot honour, and ``Engine`` (what every kind shares: the SDK client, image
attributes, history, save, the file system, tag, push). The kinds are in docker_cli.py and buildx.py; choosing
one in select.py; ``buildkit_py.engine`` exports them all."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from buildkit_py import oci
from buildkit_py.engine.push import PushResult, TransferSink, push_image
from buildkit_py.errors import BackendCapabilityError, EnvironmentProblem, UsageError

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

CA_SECRET_ID = "cacert"  # noqa: S105 - the BuildKit secret that carries --ca-cert's bundle

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
    limits: dict[str, tuple[int, int] | None] = {"gzip": (0, 9), "zstd": (0, 22), "estargz": (0, 9),
                                                 "uncompressed": None}
    bounds = limits.get(name)
    if name not in limits or (level and (bounds is None or not level.isdigit()
                                         or not bounds[0] <= int(level) <= bounds[1])):
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


def docker_sdk() -> ModuleType:
    """The docker SDK, imported on first use: it loads requests and urllib3 (CLI start-up cost)."""
    import docker  # noqa: PLC0415 - deliberately lazy, see tests/test_startup.py

    return docker


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
            docker = docker_sdk()
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
        errors = docker_sdk().errors
        try:
            return self.sdk().api.inspect_image(ref)
        except errors.ImageNotFound:
            return None
        except errors.DockerException as exc:
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

    @contextlib.contextmanager
    def filesystem(self, ref: str, chunk_size: int = 1 << 20) -> Iterator[Iterator[bytes]]:
        """The image's file system as a container of it sees it (the layers stacked), as a tar
        stream: `docker create` (never started, no network) and `docker export`, the container
        removed when the block ends. On 20.10 this streams a 5.5 GiB image in 28 s where
        `docker save` takes 67 s: save copies the whole image to a temporary folder first."""
        # a command is needed to create a container of an image that has none; it never runs
        container = self.sdk().containers.create(ref, command=["/imgbuild-never-started"], network_disabled=True)
        try:
            yield container.export(chunk_size=chunk_size)
        finally:
            container.remove(force=True)

    def tag(self, image: str, ref: str) -> None:
        """Give ``image`` (an id or a reference) the tag ``ref``."""
        parsed = oci.parse_reference(ref)
        self.sdk().images.get(image).tag(ref.rsplit(":", 1)[0], parsed.tag or "latest")

    def untag(self, ref: str) -> None:
        self.sdk().images.remove(ref, noprune=True)

    def remove(self, ref: str) -> None:
        subprocess.run([*self.docker_argv(), "image", "rm", "-f", ref], capture_output=True, check=False,
                       env=self.environment())

    def push(self, ref: str, *, on_progress: ProgressSink | None = None,
             on_transfer: TransferSink | None = None) -> PushResult:
        """Push one tag that is in the engine, through the SDK; ``on_transfer`` hears each
        layer's bytes, ``on_progress`` the rest (see push.push_image)."""
        return push_image(self.sdk(), ref, on_progress=on_progress, on_transfer=on_transfer)

    def build(self, request: BuildRequest, on_line: LineSink) -> BuildResult:  # pragma: no cover - abstract
        raise NotImplementedError


# Kept for the modules and tests written against the backend names.
BuildBackend = Engine
