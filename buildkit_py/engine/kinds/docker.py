"""Docker engines: what every docker kind shares (``DockerEngine``: the client found from
$IMGBUILD_DOCKER or PATH, the engine at $DOCKER_HOST, the SDK for image attributes, history,
save, tag and push, `docker run --gpus all`), and the classic client, ``--engine docker``
(alias ``classic``): `DOCKER_BUILDKIT=1 docker build` with a pre-23 client (Debian's 20.10).
buildx is in buildx.py."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

from buildkit_py import oci
from buildkit_py.engine.base import (
    CA_SECRET_ID,
    CACHE_EXPORT,
    CACHE_FROM,
    CACHE_MOUNTS,
    ENGINE_STORE,
    MULTI_PLATFORM,
    MULTI_STAGE,
    PLATFORM,
    SECRETS,
    BuildRequest,
    BuildResult,
    Engine,
    HistoryEntry,
    ImageInfo,
    ImageSizes,
    LineSink,
    ProgressSink,
    label_flags,
    run_step_flags,
)
from buildkit_py.engine.buildlog import BuildLog, build_failure, build_result
from buildkit_py.engine.children import follow
from buildkit_py.engine.kinds.container_run import run_args
from buildkit_py.engine.kinds.docker_format import history_entries, image_info
from buildkit_py.engine.kinds.docker_push import push_image
from buildkit_py.engine.push import PushResult, TransferSink
from buildkit_py.engine.registry import EngineChoice, register
from buildkit_py.engine.run import RunSpec, nvidia_cdi_specs
from buildkit_py.errors import EnvironmentProblem, InspectError

_ENGINE_DOWN = ("Cannot connect to the Docker daemon", "connect: no such file or directory",
                "Is the docker daemon running")


# --- finding the client -------------------------------------------------------------------------


def client_version(binary: str, env: dict[str, str] | None = None) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([binary, "version", "--format", "{{.Client.Version}}"], capture_output=True,  # noqa: PLW1510
                             text=True, timeout=20, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    # "20.10.24+dfsg1", "28.2.2", "24.0.7-rd": the leading numbers are the version.
    match = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", out.stdout.strip())
    return tuple(int(x) for x in match.groups() if x is not None) if match else None


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


def found_clients() -> list[str]:
    """``candidate_clients``, or EnvironmentProblem when there is none."""
    clients = candidate_clients()
    if not clients:
        raise EnvironmentProblem("no docker client found",
                                 hint="install Docker (on Debian: apt-get install docker.io) "
                                      "or run scripts/services.sh up")
    return clients


def any_client() -> str:
    """A docker client to read images with, whatever it can build: $IMGBUILD_DOCKER, PATH's, Debian's."""
    clients = [c for c in (os.environ.get("IMGBUILD_DOCKER"), shutil.which("docker"), "/usr/bin/docker") if c]
    return clients[0] if clients else "docker"


# --- the SDK ------------------------------------------------------------------------------------


def docker_sdk() -> ModuleType:
    """The docker SDK, imported on first use: it loads requests and urllib3 (CLI start-up cost)."""
    import docker  # noqa: PLC0415 - deliberately lazy, see tests/test_startup.py

    module: ModuleType = docker
    return module


def _sdk_error(exc: Exception, host: str | None) -> EnvironmentProblem:
    where = host or os.environ.get("DOCKER_HOST") or "the default socket"
    return EnvironmentProblem(f"cannot reach the Docker engine at {where} ({exc.__class__.__name__})",
                              hint="start it (scripts/services.sh up) or set DOCKER_HOST")


def gpu_runtime(info: Mapping[str, Any], cdi_dirs: tuple[Path, ...] | None = None) -> bool:
    """Does a docker engine offer GPUs? The nvidia runtime registered with dockerd (``info``:
    its `docker info`), or CDI specs for NVIDIA devices (`--gpus` works with either)."""
    return "nvidia" in (info.get("Runtimes") or {}) or nvidia_cdi_specs(cdi_dirs)


def _sdk_errors_as_inspect(chunks: Iterator[bytes], ref: str) -> Iterator[bytes]:
    errors = docker_sdk().errors
    try:
        yield from chunks
    except errors.DockerException as exc:
        raise InspectError(f"could not export {ref} from the engine: {exc}") from None


class DockerEngine:
    """One docker engine (at ``host``, None: the client's default) and the client that builds
    on it: what the docker kinds share. Subclasses add ``build`` and their capabilities."""

    name = "engine"
    title: ClassVar[str] = "docker"
    capabilities: frozenset[str] = frozenset()
    hints: Mapping[str, str] = {}
    gpu_flags: ClassVar[tuple[str, ...]] = ("--gpus", "all")
    who_can: ClassVar[Mapping[str, str]] = {}

    def __init__(self, client: str, *, host: str | None = None, builder: str | None = None):
        self.client = client
        self.host = host if host is not None else (os.environ.get("DOCKER_HOST") or None)
        self.builder = builder
        self._local = threading.local()
        self._info: dict[str, Any] | None = None

    # -- how to call it
    def describe(self) -> str:
        return f"{self.name} engine ({self.client}{', ' + self.host if self.host else ''})"

    def environment(self) -> dict[str, str]:
        env = {**os.environ, "DOCKER_BUILDKIT": "1"}
        if self.host:
            env["DOCKER_HOST"] = self.host
        return env

    def client_argv(self) -> list[str]:
        """The client command line that reaches this engine (for `docker run` and friends)."""
        return [self.client, *(["--host", self.host] if self.host else [])]

    def sdk(self) -> Any:  # docker.DockerClient (the SDK has no type information)
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

    def ping(self) -> None:
        self.sdk()

    # -- what it knows
    def info(self) -> dict[str, Any]:
        if self._info is None:
            self._info = self.sdk().info()
        return self._info

    def containerd_store(self) -> bool:
        """True when images live in containerd's content store (compressed blobs, OCI `docker save`)."""
        status = dict(tuple(x) for x in (self.info().get("DriverStatus") or []) if len(x) == 2)
        return status.get("driver-type") == "io.containerd.snapshotter.v1"

    def image(self, ref: str) -> ImageInfo | None:
        attrs = self.image_attrs(ref)
        return None if attrs is None else image_info(attrs)

    def image_attrs(self, ref: str) -> dict[str, Any] | None:
        """`docker image inspect` of ``ref``, None when the engine does not have it (the raw
        JSON: ``image`` parses it; the end-to-end tests read it as docker does)."""
        errors = docker_sdk().errors
        try:
            attrs: dict[str, Any] = self.sdk().api.inspect_image(ref)
        except errors.ImageNotFound:
            return None
        except errors.DockerException as exc:
            raise _sdk_error(exc, self.host) from None
        return attrs

    def history(self, ref: str) -> list[HistoryEntry]:
        """`docker history`, oldest first."""
        errors = docker_sdk().errors
        try:
            return history_entries(reversed(self.sdk().api.history(ref)))
        except errors.DockerException as exc:
            raise InspectError(f"could not read the history of {ref} from the engine: {exc}") from None

    def image_sizes(self, ref: str) -> ImageSizes:
        info = self.image(ref)
        size = info.size if info is not None else 0
        if self.containerd_store():
            # Size is the compressed content; the snapshots' sizes are in the history.
            return ImageSizes(sum(h.size for h in self.history(ref)), size)
        return ImageSizes(size, None)

    def save(self, ref: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """The bytes of `docker save ref`: the classic layout on 20.10, an OCI layout on the
        containerd store (inspect reads both)."""
        errors = docker_sdk().errors
        try:
            yield from self.sdk().images.get(ref).save(chunk_size=chunk_size)
        except errors.DockerException as exc:
            raise InspectError(f"could not export {ref} from the engine: {exc}") from None

    @contextlib.contextmanager
    def filesystem(self, ref: str, chunk_size: int = 1 << 20) -> Iterator[Iterator[bytes]]:
        """`docker create` (never started, no network) and `docker export`: on 20.10 this
        streams a 5.5 GiB image in 28 s where `docker save` takes 67 s (save copies the whole
        image to a temporary folder first)."""
        errors = docker_sdk().errors
        try:
            # a command is needed to create a container of an image that has none; it never runs
            container = self.sdk().containers.create(ref, command=["/imgbuild-never-started"], network_disabled=True)
        except errors.DockerException as exc:
            raise InspectError(f"could not create a container of {ref} to read its files: {exc}") from None
        try:
            yield _sdk_errors_as_inspect(container.export(chunk_size=chunk_size), ref)
        finally:
            with contextlib.suppress(errors.DockerException):
                container.remove(force=True)

    def tag(self, image: str, ref: str) -> None:
        """Give ``image`` (an id or a reference) the tag ``ref``."""
        parsed = oci.parse_reference(ref)
        self.sdk().images.get(image).tag(ref.rsplit(":", 1)[0], parsed.tag or "latest")

    def untag(self, ref: str) -> None:
        self.sdk().images.remove(ref, noprune=True)

    def remove(self, ref: str) -> None:
        subprocess.run([*self.client_argv(), "image", "rm", "-f", ref], capture_output=True, check=False,
                       env=self.environment())

    def push(self, ref: str, *, on_progress: ProgressSink | None = None,
             on_transfer: TransferSink | None = None) -> PushResult:
        """Push one tag that is in the engine, through the SDK; ``on_transfer`` hears each
        layer's bytes, ``on_progress`` the rest (see docker_push.push_image)."""
        return push_image(self.sdk(), ref, on_progress=on_progress, on_transfer=on_transfer)

    # -- running
    def gpu_available(self) -> bool:
        return gpu_runtime(self.info())

    def run_argv(self, spec: RunSpec) -> tuple[str, ...]:
        return (*self.client_argv(), *run_args(spec, self.gpu_flags))

    def remove_container_argv(self, name: str) -> tuple[str, ...]:
        return (*self.client_argv(), "rm", "-f", name)

    def build(self, request: BuildRequest, on_line: LineSink) -> BuildResult:  # pragma: no cover - abstract
        raise NotImplementedError


# --- the classic client -------------------------------------------------------------------------


@register
class ClassicEngine(DockerEngine):
    kind: ClassVar[str] = "docker"
    aliases: ClassVar[tuple[str, ...]] = ("classic",)
    auto_order: ClassVar[int | None] = 20  # after buildx
    named_builders: ClassVar[bool] = False
    title: ClassVar[str] = "the classic client"
    who_can: ClassVar[Mapping[str, str]] = {PLATFORM: "Docker's classic builder with DOCKER_BUILDKIT=1"}
    summary: ClassVar[str] = ("DOCKER_BUILDKIT=1 docker build with a client older than 23.0, e.g. Debian's 20.10; "
                              "the client is $IMGBUILD_DOCKER, the engine $DOCKER_HOST")
    name = "docker"
    # The 20.10 client has no --cache-to, --push, --metadata-file, --builder or output options; it
    # builds one platform per build (a repeated --platform silently keeps the last), never an index.
    capabilities = frozenset({MULTI_STAGE, CACHE_MOUNTS, SECRETS, CACHE_FROM, ENGINE_STORE, PLATFORM})
    hints: Mapping[str, str] = {
        CACHE_EXPORT: "with the classic client use --cache-from with an image built with inline cache",
        MULTI_PLATFORM: "Docker 20.10's classic builder builds one platform per build (a repeated --platform keeps "
                        "only the last one) and its image store holds one image per tag, so it cannot make an "
                        "index: build one platform there (--platform linux/arm64)"}

    @classmethod
    def find(cls, choice: EngineChoice) -> Engine:
        """The first client older than 23.0: it speaks BuildKit with DOCKER_BUILDKIT=1 (newer
        ones fall back to the legacy builder without buildx: refused)."""
        seen = []
        for c in found_clients():
            version = client_version(c)
            if version and version < (23,):
                return cls(c, host=choice.host)
            found = ".".join(map(str, version)) if version else "unknown"
            seen.append(f"{c}: client {found} needs buildx for BuildKit")
        where = "IMGBUILD_DOCKER" if os.environ.get("IMGBUILD_DOCKER") else "found"
        raise EnvironmentProblem(f"no BuildKit-capable docker client ({where}): " + "; ".join(seen),
                                 hint="install the buildx plugin, or point IMGBUILD_DOCKER at a 20.10 client "
                                      "(Debian's /usr/bin/docker from docker.io)")

    @classmethod
    def for_reading(cls, choice: EngineChoice) -> Engine:
        return cls(any_client(), host=choice.host)

    def build_argv(self) -> list[str]:
        return [*self.client_argv(), "build"]

    def command(self, request: BuildRequest, iidfile: Path, metadata: Path | None = None) -> list[str]:
        cmd = [*self.build_argv(), "--progress", "plain", "--iidfile", str(iidfile),
               "--file", str(request.dockerfile)]
        cmd += self.extra_args(request, metadata)
        cmd += run_step_flags(request)
        for ref in request.cache_from:
            cmd += ["--cache-from", ref]
        cmd += label_flags(request)
        cmd += self.tag_args(request)
        cmd.append(str(request.context_dir))
        return cmd

    def extra_args(self, request: BuildRequest, metadata: Path | None = None) -> list[str]:
        # Inline cache metadata lets a later --cache-from reuse this image's layers.
        args = ["--build-arg", "BUILDKIT_INLINE_CACHE=1"] if request.cache_from else []
        if len(request.platforms) == 1:  # more were refused (MULTI_PLATFORM) before building
            args += ["--platform", request.platforms[0]]
        return args

    def tag_args(self, request: BuildRequest) -> list[str]:
        return [a for tag in request.tags for a in ("--tag", tag)]

    def read_metadata(self, metadata: Path) -> str | None:
        return None

    def build_name(self, cmd: list[str]) -> str:
        """How a message names the build command: "docker build", "docker buildx build"."""
        words = cmd[:cmd.index("build") + 1] if "build" in cmd else cmd[:1]
        return " ".join([Path(words[0]).name, *(w for w in words[1:] if w in ("buildx", "build"))])

    def image_id(self, iid: str, digest: str | None) -> str:
        """What the engine names the built image by, from --iidfile and the metadata file's digest."""
        return iid

    def build_environment(self, request: BuildRequest, tmp: Path) -> dict[str, str]:
        return self.environment()

    def refine_failure(self, request: BuildRequest, log: str) -> None:
        """Raise a more precise error than BuildFailed where the log says what went wrong."""

    def build(self, request: BuildRequest, on_line: LineSink) -> BuildResult:
        log = BuildLog()
        start = time.monotonic()

        def line(text: str) -> None:
            log.feed(text)
            on_line(text)

        with tempfile.TemporaryDirectory(prefix="imgbuild-iid-") as tmp:
            iidfile, metadata = Path(tmp) / "iid", Path(tmp) / "metadata.json"
            cmd = self.command(request, iidfile, metadata)
            # A session of its own: an interrupt reaches imgbuild, which stops the build (children.py).
            code = follow(cmd, env=self.build_environment(request, Path(tmp)), on_line=line,
                          what=f"{self.build_name(cmd)} of {', '.join(request.tags) or 'the image'}")
            tail = "\n".join(log.tail)
            if code != 0:
                if any(s in tail for s in _ENGINE_DOWN):
                    raise EnvironmentProblem("the Docker engine is not reachable",
                                             hint="start it (scripts/services.sh up) or set DOCKER_HOST")
                self.refine_failure(request, tail)
                raise build_failure(log, cmd, code, ca_cert=CA_SECRET_ID in request.secrets)
            digest = self.read_metadata(metadata)
            image_id = self.image_id(iidfile.read_text().strip() if iidfile.exists() else "", digest)
        return build_result(log, image_id=image_id, tags=request.tags, seconds=time.monotonic() - start, digest=digest)

