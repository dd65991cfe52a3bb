"""What every engine is: the ``Engine`` protocol, three roles in one object (``Builder``: build,
push, declared capabilities; ``ImageStore``: the images it holds, as typed ``ImageInfo`` and
``HistoryEntry``; ``Runner``: run with GPUs), the build request and result it takes and gives,
and the refusal of an option an engine cannot honour. The engines themselves are plug-ins in ``engine/kinds/`` (one
module per kind, each registering its class with ``registry.register``); ``select.py`` chooses
one; ``buildkit_py.engine`` exports this module's names."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from buildkit_py.engine.registry import who_can
from buildkit_py.errors import EngineCapabilityError, UsageError

if TYPE_CHECKING:
    from buildkit_py.engine.push import PushResult, TransferSink
    from buildkit_py.engine.run import RunSpec

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
PLATFORM = "platform"  # build for one named platform (--platform linux/arm64, emulated where foreign)
MULTI_PLATFORM = "multi-platform"  # several platforms in one build, exported as one index
# Builds read and write the engine's own image store: a FROM may name an image only the engine
# has, and the built image is there without --load (not so for a named buildx builder).
ENGINE_STORE = "engine-store"

CA_SECRET_ID = "cacert"  # noqa: S105 - the BuildKit secret that carries --ca-cert's bundle


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
    # --build-arg NAME=VALUE (engine/build.py build_args), passed where BuildKit reads them (buildx):
    # 20.10's BuildKit 0.8 and buildah have no SOURCE_DATE_EPOCH, and would only warn of an unused arg.
    build_args: dict[str, str] = field(default_factory=dict)


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
class ImageInfo:
    """An image in the engine's store, read once by its kind (engine/kinds/) from whatever the
    engine prints (`docker image inspect`, `podman image inspect`): generic code reads these
    fields, never the engine's JSON keys (tests/test_engine_keys.py holds that)."""

    id: str  # sha256:<the config's digest>
    # The image config's runtime part as the OCI image config spells it ("Labels", "Env",
    # "Entrypoint", "Cmd", ...): what the registry's config blob has under "config" too.
    config: Mapping[str, Any]
    layers: tuple[str, ...] = ()  # the diff ids, bottom layer first
    # Registry digests ("repo@sha256:..."), only for images a registry holds: pulled or pushed
    repo_digests: tuple[str, ...] = ()
    size: int = 0  # the engine's own size (classic store: unpacked; containerd store: the blobs)
    os: str | None = None
    architecture: str | None = None
    variant: str | None = None
    created: str | None = None  # RFC 3339, as the config says

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.config.get("Labels") or {})

    @property
    def platform(self) -> str | None:
        """os/arch (the platform a run without --platform starts), None when unknown."""
        return f"{self.os}/{self.architecture}" if self.os and self.architecture else None

    def registry_digest(self) -> str | None:
        """The first registry digest the engine knows for it (a pulled base's), else None."""
        return next((d.split("@", 1)[1] for d in self.repo_digests if "@" in d), None)


@dataclass(frozen=True)
class HistoryEntry:
    """One entry of an image's history as the engine keeps it (oldest first in a list): the
    instruction that made it, the bytes its layer holds (0 for a metadata step)."""

    created_by: str
    size: int = 0
    id: str = "<missing>"  # sha256:... of the image it made, or <missing> (not in this store)
    created: int = 0  # seconds since 1970
    comment: str = ""


@dataclass(frozen=True)
class ImageSizes:
    """Both numbers users meet, under explicit names: ``uncompressed`` is what the layers
    take unpacked (20.10's `docker images` SIZE), ``compressed`` what a pull downloads
    (the containerd store's SIZE, or the registry manifest's layer sizes); None when unknown."""
    uncompressed: int
    compressed: int | None


def run_step_flags(request: BuildRequest) -> list[str]:
    """The flags docker build and podman build spell alike for how the RUN steps run: network,
    --no-cache, target stage and the secrets (each engine adds its own flags around them)."""
    flags = ["--network", request.network] if request.network else []
    if request.no_cache:
        flags.append("--no-cache")
    if request.target:
        flags += ["--target", request.target]
    for sid, src in sorted(request.secrets.items()):
        flags += ["--secret", f"id={sid},src={src}"]
    return flags


def label_flags(request: BuildRequest) -> list[str]:
    return [arg for key, value in sorted(request.labels.items()) for arg in ("--label", f"{key}={value}")]


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


# Cache exporters that take BuildKit's compression options (inline rides in the image's config).
_COMPRESSING_CACHE_TYPES = frozenset({"registry", "local", "gha", "s3", "azblob"})


def cache_export_value(value: str, compression: str | None) -> str:
    """A --cache-to value with one compression forced on its blobs, unless the user chose one.

    Without force-compression BuildKit exports every combination of the compression variants it
    holds for the chain's layers (cache/remote.go getAvailableBlobs): once the same layers were
    held as several blobs (gzip, zstd, estargz), the candidate chains multiply with every layer, and
    in a test run the export grew dockerd to 24 GB until the kernel killed it (moby/buildkit#6088).
    One compression (the image's, else BuildKit's default gzip) is what an importer needs anyway."""
    fields = [f for f in value.split(",") if f]
    keys = {f.partition("=")[0].strip() for f in fields}
    kind = next((f.partition("=")[2] for f in fields if f.startswith("type=")), "")
    if kind not in _COMPRESSING_CACHE_TYPES or keys & {"compression", "force-compression"}:
        return value
    name, level = parse_compression(compression) or ("gzip", None)
    extra = [f"compression={name}", "force-compression=true"]
    if level is not None:
        extra.append(f"compression-level={level}")
    return ",".join([*fields, *extra])


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
    if len(request.platforms) > 1:
        needs.add(MULTI_PLATFORM)
    return needs


def require(engine: Builder, needs: set[str]) -> None:
    missing = sorted(needs - engine.capabilities)
    if missing:
        offers = {m: text for m in missing if (text := who_can(m))}
        hint = "; ".join(f"{m}: {text}" for m, text in offers.items()) or \
            "install the docker buildx plugin (docker-buildx-plugin)"
        hint += "".join(f"; {text}" for m, text in sorted(engine.hints.items()) if m in missing)
        raise EngineCapabilityError(
            f"the {engine.describe()} cannot do what this build needs: {', '.join(missing)}", hint=hint)


# --- the engine object -------------------------------------------------------------------------


class Builder(Protocol):
    """What builds and pushes: declared capabilities (``require`` refuses the rest before any
    build starts), ``build`` passing on BuildKit's plain progress lines (``buildlog.py`` reads
    them, the CLI draws them) whatever the engine prints itself, and ``push``. Failures are typed:
    EnvironmentProblem when it cannot be reached, BuildFailed and the registry errors."""

    name: str  # how reports name it ("docker", "buildx", "buildx-builder", "podman", "buildah")

    @property
    def capabilities(self) -> frozenset[str]:
        """What it can do (the names above); ``require`` refuses the rest before building."""
        ...

    @property
    def hints(self) -> Mapping[str, str]:
        """Extra advice per missing capability, added to the refusal's hint."""
        ...

    def describe(self) -> str:
        """The engine in words, for messages: "podman engine (/usr/bin/podman 4.3.1)"."""
        ...

    def environment(self) -> dict[str, str]:
        """The environment its client runs with (the engine's address included)."""
        ...

    def ping(self) -> None:
        """Raise EnvironmentProblem unless the engine answers."""
        ...

    def build(self, request: BuildRequest, on_line: LineSink) -> BuildResult:
        """Build ``request``; ``on_line`` hears BuildKit's plain progress lines as they come."""
        ...

    def push(self, ref: str, *, on_progress: ProgressSink | None = None,
             on_transfer: TransferSink | None = None) -> PushResult:
        """Push one tag the engine has; the digest is the registry's."""
        ...


class ImageStore(Protocol):
    """The images an engine holds, typed (``ImageInfo``, ``HistoryEntry``): each kind parses its
    engine's JSON once. InspectError when an image cannot be read back."""

    def describe(self) -> str:
        ...

    def image(self, ref: str) -> ImageInfo | None:
        """``ref`` as the engine holds it; None when it does not have it."""
        ...

    def history(self, ref: str) -> list[HistoryEntry]:
        """Its history, oldest first."""
        ...

    def image_sizes(self, ref: str) -> ImageSizes:
        """Its sizes; ``uncompressed`` is the sum of its history's layer sizes."""
        ...

    def save(self, ref: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """The bytes of `docker save ref` (the classic layout or an OCI layout)."""
        ...

    def filesystem(self, ref: str, chunk_size: int = 1 << 20) -> AbstractContextManager[Iterator[bytes]]:
        """The image's file system as a container of it sees it (the layers stacked), as a tar
        stream: a container created (never started, no network) and exported, removed when the
        block ends. InspectError when the engine cannot. (`imgbuild sbom` reads a local image so:
        on 20.10 a 5.5 GiB image streams in 28 s where `docker save` takes 67 s.)"""
        ...

    def tag(self, image: str, ref: str) -> None:
        """Give ``image`` (an id or a reference) the tag ``ref``."""
        ...

    def untag(self, ref: str) -> None:
        """Take the tag ``ref`` off its image, keeping the image."""
        ...

    def remove(self, ref: str) -> None:
        """Remove the image ``ref`` (quietly: a missing one is no error)."""
        ...


class Runner(Protocol):
    """What runs containers of the store's images (`imgbuild run`, the image tests)."""

    def describe(self) -> str:
        ...

    def environment(self) -> dict[str, str]:
        ...

    def gpu_available(self) -> bool:
        """Can its containers get NVIDIA GPUs (`imgbuild run --gpus auto`)?"""
        ...

    def run_argv(self, spec: RunSpec) -> tuple[str, ...]:
        """The client command line that runs ``spec`` (GPU flags included when it asks)."""
        ...

    def remove_container_argv(self, name: str) -> tuple[str, ...]:
        """The client command line that removes the container ``name`` (stopped or running)."""
        ...


class Engine(Builder, ImageStore, Runner, Protocol):
    """One engine, chosen once (``select.select_engine``) and passed down: every module that
    builds, pushes, reads the image store or runs a container asks this object, and none
    branches on which kind it is; what differs between kinds is a method or a capability. A
    module that needs one role takes that protocol (``Builder``, ``ImageStore``, ``Runner``)."""
