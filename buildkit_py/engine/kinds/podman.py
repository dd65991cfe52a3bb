"""Podman, ``--engine podman``: daemonless, root or rootless, building with its own builder
(buildah), not BuildKit. Tested with Debian 12's podman 4.3.1 (buildah 1.28.2).

What imgbuild's Dockerfiles need, buildah has: multi-stage builds, ``RUN --mount=type=cache``,
``type=secret`` (the CA bundle and pip.conf), ``type=tmpfs``, ``--network host``, no ``# syntax=``
line. What differs from the docker engines, and how this module makes it the same:

- Progress: buildah prints ``[i/n] STEP k/m: RUN ...``, the step's output, ``--> Using cache ID``
  and ``--> ID``. ``BuildahLines`` turns that into BuildKit's plain progress lines, so the step
  table, the failed-step error and its known causes (buildlog.py) read podman's builds as they
  read BuildKit's. ENV, LABEL and the other metadata instructions are no steps there, as in
  BuildKit; buildah's own step for the build-time labels (``--label``) is one of them.
- Images: `podman image inspect` and `podman history` describe them much as docker does; the id
  gets docker's ``sha256:`` and the history docker's keys. ``RepoDigests`` are left out: podman
  lists its local manifest's digest under every name, a digest no registry has for a built image
  (a push compresses the layers anew), while docker lists registry digests only, and the
  base-digest label and the lock take them as such.
- Push: `podman push --digestfile`, with the credentials imgbuild finds (its environment
  variables, the docker config and its helpers) handed over in a private auth file for that
  push only; plain http to loopback registries (``--tls-verify=false``), as dockerd does.
- GPUs: CDI (``--device nvidia.com/gpu=all``), from the specs `nvidia-ctk cdi generate` writes.
- Short names: ``FROM debian:bookworm-slim`` finds ``localhost/debian:bookworm-slim`` (what
  `podman load` and `podman import` name an image without a registry) or the docker.io name.

Not offered (refused before building, ``require``): cache export and import (``--cache-to``,
``--cache-from``: buildah's take an image repository, not BuildKit's cache), pushing from the
build, a metadata file, named builders, output compression and media-type options, provenance,
platforms. $DOCKER_HOST and $IMGBUILD_DOCKER are the docker engines' business; $IMGBUILD_PODMAN
names the podman binary (default: the one on PATH)."""

from __future__ import annotations

import base64
import calendar
import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from buildkit_py import oci
from buildkit_py.engine.base import (
    CA_SECRET_ID,
    CACHE_EXPORT,
    CACHE_FROM,
    CACHE_MOUNTS,
    ENGINE_STORE,
    MULTI_STAGE,
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
from buildkit_py.engine.push import PushResult, TransferSink, push_with_retries, registry_host, split_tag
from buildkit_py.engine.registry import EngineChoice, register
from buildkit_py.engine.run import RunSpec, nvidia_cdi_specs
from buildkit_py.errors import EnvironmentProblem, ImgbuildError, InspectError
from buildkit_py.files import write_atomic
from buildkit_py.oci import auth

MIN_VERSION = (4, 0)  # RUN --mount=type=cache/secret and --secret in podman build
_NOT_FOUND = ("image not known", "no such image", "unable to find")

# --- buildah's progress, as BuildKit's --------------------------------------------------------

_STEP_RE = re.compile(r"^(?:\[(\d+)/(\d+)\] )?STEP (\d+)/(\d+): (\S+)(?: (.*))?$")
_USING_CACHE_RE = re.compile(r"^--> Using cache ([0-9a-f]{64})$")
_STEP_DONE_RE = re.compile(r"^--> ([0-9a-f]{6,64})$")
_ERROR_RE = re.compile(r'^Error: building at STEP "(.*)": (.*)$', re.S)
_EXIT_STATUS_RE = re.compile(r"exit status (\d+)\s*$")
_AS_RE = re.compile(r"\s+AS\s+(\S+)\s*$", re.I)
_COMMIT_RE = re.compile(r"^(?:\[\d+/\d+\] )?COMMIT\b")
# Instructions that only change the image's config: BuildKit shows no step for them.
_METADATA = frozenset({"ARG", "CMD", "ENTRYPOINT", "ENV", "EXPOSE", "HEALTHCHECK", "LABEL", "MAINTAINER",
                       "ONBUILD", "SHELL", "STOPSIGNAL", "USER", "VOLUME"})


@dataclass
class _Open:
    vertex: int
    started: float


class BuildahLines:
    """buildah's build output, line by line, as BuildKit's plain progress (``feed`` returns the
    lines to pass on, often one, none for buildah's markers): a step's header
    ``#N [stage k/m] RUN ...``, its output ``#N 1.234 text``, then ``#N CACHED``,
    ``#N DONE 2.1s`` or ``#N ERROR: exit code: 1``. Lines outside a step pass unchanged."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.vertices = 0
        self.open: _Open | None = None
        self.in_step = False  # inside a step, shown or not (a metadata step's "--> ID" is no output)
        self.stage = ""

    def _close(self, how: str) -> list[str]:
        open_, self.open = self.open, None
        if open_ is None:
            return []
        if how == "done":
            return [f"#{open_.vertex} DONE {self.clock() - open_.started:.1f}s"]
        return [f"#{open_.vertex} {how}"]

    def feed(self, line: str) -> list[str]:
        if m := _STEP_RE.match(line):
            return self._step(m)
        if _USING_CACHE_RE.match(line):
            return self._close("CACHED")
        if _STEP_DONE_RE.match(line):
            self.in_step = False
            return self._close("done")
        if m := _ERROR_RE.match(line):
            if self.open is None:
                return [line]
            status = _EXIT_STATUS_RE.search(m.group(2))
            reason = f"exit code: {status.group(1)}" if status else " ".join(m.group(2).split())
            return self._close(f"ERROR: {reason}")
        if _COMMIT_RE.match(line):
            self.in_step = False
            return [*self._close("done"), line]
        if self.open is not None:
            return [f"#{self.open.vertex} {self.clock() - self.open.started:.3f} {line}"]
        return [] if self.in_step else [line]

    def _step(self, m: re.Match[str]) -> list[str]:
        out = self._close("done")
        stage_index, stages, step, instruction = m.group(1), m.group(2), f"{m.group(3)}/{m.group(4)}", m.group(5)
        args = m.group(6) or ""
        if instruction.upper() == "FROM":
            named = _AS_RE.search(args)
            self.stage = named.group(1) if named else (f"stage-{int(stage_index) - 1}" if stages else "")
        self.in_step = True
        if instruction.upper() in _METADATA:
            return out
        self.vertices += 1
        self.open = _Open(self.vertices, self.clock())
        stage = f"[{self.stage} {step}]" if self.stage else f"[{step}]"
        return [*out, f"#{self.vertices} {stage} {instruction} {args}".rstrip()]

    def finish(self) -> list[str]:
        """At the end of the output: a step still open ended with the build."""
        return self._close("done")


# --- images as docker describes them -----------------------------------------------------------


def docker_image_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """`podman image inspect` output in `docker image inspect`'s terms (see the module's notes)."""
    out = dict(attrs)
    image_id = str(out.get("Id") or "")
    out["Id"] = image_id if image_id.startswith("sha256:") else f"sha256:{image_id}"
    out["RepoDigests"] = []
    return out


def _epoch(created: str) -> int:
    """'2026-12-04T13:29:11Z' (or with fractions and an offset of 0) -> seconds since 1970."""
    text = re.sub(r"\.\d+", "", created).replace("+00:00", "Z")
    try:
        return calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return 0


def docker_history(entries: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`podman history --format json` entries (newest first) as the docker API's history gives
    them: ``Id`` (``sha256:...`` or ``<missing>``), ``Created`` (seconds), ``CreatedBy``,
    ``Size``, ``Comment``, ``Tags``; same order."""
    history = []
    for e in entries:
        entry_id = str(e.get("id") or "<missing>")
        history.append({
            "Id": entry_id if entry_id == "<missing>" or entry_id.startswith("sha256:") else f"sha256:{entry_id}",
            "Created": _epoch(str(e.get("created") or e.get("Created") or "")),
            "CreatedBy": e.get("CreatedBy") or e.get("createdBy") or "",
            "Size": int(e.get("size") or e.get("Size") or 0),
            "Comment": e.get("comment") or e.get("Comment") or "",
            "Tags": e.get("tags") or None,
        })
    return history


def _version(text: str) -> tuple[int, ...] | None:
    match = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    return tuple(int(x) for x in match.groups() if x is not None) if match else None


def _last_error(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln.removeprefix("Error: ") for ln in lines if ln.startswith("Error:")]
    return (errors or lines or ["no output"])[-1]


# --- the engine -------------------------------------------------------------------------------


def configured_executable(variable: str, name: str) -> str | None:
    """The executable ``$variable`` names (None when it names no executable file), else ``name``
    on PATH (None when there is none): how podman.py and buildah.py find their tools."""
    explicit = os.environ.get(variable)
    if explicit:
        return explicit if os.path.isfile(explicit) and os.access(explicit, os.X_OK) else None
    return shutil.which(name)


def missing_executable(kind: str, variable: str, name: str) -> EnvironmentProblem:
    """Why ``configured_executable(variable, name)`` found nothing, for ``--engine kind``."""
    where = f"{variable}={os.environ[variable]}: no such executable" if os.environ.get(variable) \
        else f"no {name} on PATH"
    return EnvironmentProblem(f"--engine {kind}: {where}",
                              hint=f"install {name} (on Debian 12: apt-get install {name}, or "
                                   f"scripts/services.sh up) or point {variable} at it")


@register
class PodmanEngine:
    kind: ClassVar[str] = "podman"
    aliases: ClassVar[tuple[str, ...]] = ()
    auto_order: ClassVar[int | None] = None  # only when asked for: --engine podman, IMGBUILD_ENGINE=podman
    named_builders: ClassVar[bool] = False
    title: ClassVar[str] = "podman"
    summary: ClassVar[str] = "podman build, buildah's builder; the binary is $IMGBUILD_PODMAN or PATH's"
    name = "podman"
    capabilities: frozenset[str] = frozenset({MULTI_STAGE, CACHE_MOUNTS, SECRETS, ENGINE_STORE})
    hints: Mapping[str, str] = {
        CACHE_EXPORT: "podman reuses the layers in its own storage; a registry cache needs --engine buildx",
        CACHE_FROM: "podman reuses the layers in its own storage; a registry cache needs --engine buildx"}
    gpu_flags: ClassVar[tuple[str, ...]] = ("--device", "nvidia.com/gpu=all")  # CDI
    who_can: ClassVar[Mapping[str, str]] = {}  # nothing the docker kinds cannot do

    def __init__(self, binary: str = "podman", version: tuple[int, ...] | None = None):
        self.binary = binary
        self.version = version
        # What builds and pushes: podman itself; buildah.py's engine puts buildah here and keeps
        # podman for the store and for running (both read the one containers storage).
        self.tool = binary

    @staticmethod
    def _binary() -> str | None:
        return configured_executable("IMGBUILD_PODMAN", "podman")

    @classmethod
    def find(cls, choice: EngineChoice) -> Engine:
        return cls(*cls.podman())

    @classmethod
    def podman(cls) -> tuple[str, tuple[int, ...]]:
        """podman's binary and version, or EnvironmentProblem saying why it will not do."""
        binary = cls._binary()
        if binary is None:
            raise missing_executable(cls.kind, "IMGBUILD_PODMAN", "podman")
        try:
            out = subprocess.run([binary, "version", "--format", "{{.Client.Version}}"], capture_output=True,
                                 text=True, timeout=30, check=False, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EnvironmentProblem(f"cannot run {binary}: {exc}") from None
        version = _version(out.stdout)
        if version is None or version < MIN_VERSION:
            found = ".".join(map(str, version)) if version else f"no version ({_last_error(out.stdout + out.stderr)})"
            raise EnvironmentProblem(f"{binary}: podman {found}; imgbuild needs podman 4 or newer "
                                     "(RUN --mount=type=cache and type=secret)",
                                     hint="install podman >= 4 (tested with 4.3.1, Debian 12's)")
        return binary, version

    @classmethod
    def for_reading(cls, choice: EngineChoice) -> Engine:
        return cls(cls._binary() or "podman")

    # -- how to call it
    def describe(self) -> str:
        version = f" {'.'.join(map(str, self.version))}" if self.version else ""
        return f"podman engine ({self.binary}{version})"

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def client_argv(self) -> list[str]:
        return [self.binary]

    def _run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run([self.binary, *args], capture_output=True, text=True, timeout=timeout, check=False,
                                  env=self.environment(), stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EnvironmentProblem(f"cannot run {self.binary} {args[0]}: {exc}",
                                     hint="install podman, or point IMGBUILD_PODMAN at it") from None

    def _checked(self, *args: str) -> str:
        proc = self._run(*args)
        if proc.returncode != 0:
            raise ImgbuildError(f"podman {' '.join(args[:2])} failed: {_last_error(proc.stderr or proc.stdout)}")
        return proc.stdout

    def ping(self) -> None:
        proc = self._run("info", "--format", "{{.Store.GraphRoot}}", timeout=60)
        if proc.returncode != 0:
            raise EnvironmentProblem(f"podman does not answer ({self.binary} info: "
                                     f"{_last_error(proc.stderr or proc.stdout)})",
                                     hint="check its storage and configuration: podman info")

    # -- building
    def command(self, request: BuildRequest, iidfile: Path) -> list[str]:
        """`podman build`: layers kept (the cache, as BuildKit's), docker's image format (the
        manifest docker engines push by default; OCI would drop HEALTHCHECK and SHELL)."""
        cmd = [self.tool, "build", "--layers", "--format", "docker", "--iidfile", str(iidfile),
               "--file", str(request.dockerfile)]
        cmd += run_step_flags(request) + label_flags(request)
        for tag in request.tags:
            cmd += ["--tag", tag]
        cmd.append(str(request.context_dir))
        return cmd

    def build(self, request: BuildRequest, on_line: LineSink) -> BuildResult:
        log = BuildLog()
        lines = BuildahLines()
        start = time.monotonic()

        def passed(texts: list[str]) -> None:
            for text in texts:
                log.feed(text)
                on_line(text)

        with tempfile.TemporaryDirectory(prefix="imgbuild-iid-") as tmp:
            iidfile = Path(tmp) / "iid"
            cmd = self.command(request, iidfile)
            code = follow(cmd, env=self.environment(), on_line=lambda raw: passed(lines.feed(raw)),
                          what=f"{self.name} build of {', '.join(request.tags) or 'the image'}")
            passed(lines.finish())
            if code != 0:
                raise build_failure(log, cmd, code, ca_cert=CA_SECRET_ID in request.secrets)
            image_id = iidfile.read_text().strip() if iidfile.exists() else ""
        return build_result(log, image_id=image_id, tags=request.tags, seconds=time.monotonic() - start)

    # -- pushing
    def _authfile(self, host: str, folder: Path) -> Path | None:
        """The credentials imgbuild finds for ``host``, as a private containers auth file."""
        creds = auth.resolve(host)
        if creds is None:
            return None  # podman's own: $REGISTRY_AUTH_FILE, its auth.json, ~/.docker/config.json
        entry = {"identitytoken": creds.identity_token} if creds.identity_token else \
            {"auth": base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()}
        return write_atomic(folder / "auth.json", json.dumps({"auths": {auth.normalize_host(host): entry}}),
                            private=True)

    def push(self, ref: str, *, on_progress: ProgressSink | None = None,
             on_transfer: TransferSink | None = None) -> PushResult:
        """`podman push` of one tag; the digest is the one podman put (its --digestfile). Its
        lines go to ``on_progress``; ``on_transfer`` hears nothing (podman prints no byte counts
        off a terminal)."""
        host = registry_host(ref)
        with tempfile.TemporaryDirectory(prefix="imgbuild-push-") as tmp:
            digestfile = Path(tmp) / "digest"
            cmd = [self.tool, "push", "--digestfile", str(digestfile)]
            if oci.is_loopback(host):
                cmd.append("--tls-verify=false")  # plain http, as dockerd treats 127.0.0.0/8
            authfile = self._authfile(host, Path(tmp))
            if authfile is not None:
                cmd += ["--authfile", str(authfile)]
            cmd.append(ref)

            def once() -> tuple[str | None, int | None, str | None]:
                digestfile.unlink(missing_ok=True)
                output: list[str] = []

                def line(text: str) -> None:
                    output.append(text)
                    if on_progress is not None and text.strip():
                        on_progress(text.strip())  # "Copying blob sha256:...": podman counts no bytes off a terminal

                code = follow(cmd, env=self.environment(), what=f"{self.name} push of {ref}", on_line=line)
                if code != 0:
                    return None, None, _last_error("\n".join(output))
                digest = digestfile.read_text().strip() if digestfile.exists() else ""
                return (digest, self._manifest_size(ref, digest), None) if digest.startswith("sha256:") \
                    else (None, None, None)

            return push_with_retries(once, ref, on_progress=on_progress)

    @staticmethod
    def _manifest_size(ref: str, digest: str) -> int | None:
        try:
            raw, _, _ = oci.fetch_manifest(f"{split_tag(ref)[0]}@{digest}",
                                           client=oci.Client(max_retries=1, timeout=(5.0, 30.0)))
        except ImgbuildError:
            return None
        return len(raw)

    # -- the image store
    def image(self, ref: str) -> ImageInfo | None:
        attrs = self.image_attrs(ref)
        return None if attrs is None else image_info(attrs)

    def image_attrs(self, ref: str) -> dict[str, Any] | None:
        """`podman image inspect` of ``ref`` in docker's terms (``docker_image_attrs``), None when
        podman does not have it (``image`` parses it; the end-to-end tests read it as docker's)."""
        proc = self._run("image", "inspect", ref)
        if proc.returncode != 0:
            if any(m in proc.stderr.lower() for m in _NOT_FOUND):
                return None
            raise EnvironmentProblem(f"podman image inspect {ref} failed: {_last_error(proc.stderr)}",
                                     hint="check podman: podman info")
        found = json.loads(proc.stdout or "[]")
        return docker_image_attrs(found[0]) if found else None

    def history(self, ref: str) -> list[HistoryEntry]:
        proc = self._run("history", "--no-trunc", "--format", "json", ref)
        if proc.returncode != 0:
            raise InspectError(f"could not read the history of {ref} from podman: {_last_error(proc.stderr)}")
        return history_entries(reversed(docker_history(json.loads(proc.stdout or "[]"))))

    def image_sizes(self, ref: str) -> ImageSizes:
        # The layers' own sizes, as the docker engines count them (`Size` adds a little metadata).
        return ImageSizes(sum(h.size for h in self.history(ref)), None)

    def save(self, ref: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """`podman save --format docker-archive`: the classic `docker save` layout."""
        return self._stream(["save", "--quiet", "--format", "docker-archive", ref], ref, chunk_size)

    @contextlib.contextmanager
    def filesystem(self, ref: str, chunk_size: int = 1 << 20) -> Iterator[Iterator[bytes]]:
        """`podman create` (never started, no network) and `podman export`."""
        # a command is needed to create a container of an image that has none; it never runs
        proc = self._run("create", "--network", "none", ref, "/imgbuild-never-started")
        if proc.returncode != 0:
            raise InspectError(f"could not create a container of {ref} to read its files: "
                               f"{_last_error(proc.stderr or proc.stdout)}")
        container = proc.stdout.strip().splitlines()[-1]
        try:
            yield self._stream(["export", container], ref, chunk_size)
        finally:
            self._run("rm", "--force", container)

    def _stream(self, args: list[str], ref: str, chunk_size: int) -> Iterator[bytes]:
        """The stdout of `podman ARGS` as it comes; InspectError when it fails."""
        try:
            proc = subprocess.Popen([self.binary, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    stdin=subprocess.DEVNULL, env=self.environment())
        except OSError as exc:
            raise EnvironmentProblem(f"cannot run {self.binary} {args[0]}: {exc}") from None
        assert proc.stdout is not None and proc.stderr is not None  # noqa: S101
        finished = False
        try:
            while chunk := proc.stdout.read(chunk_size):
                yield chunk
            finished = True
        finally:
            if not finished and proc.poll() is None:  # the reader stopped early (the tar's end)
                proc.kill()
            code = proc.wait()
            error = proc.stderr.read().decode(errors="replace")
            proc.stdout.close()
            proc.stderr.close()
        if code != 0:
            raise InspectError(f"could not export {ref} from podman: {_last_error(error)}")

    def tag(self, image: str, ref: str) -> None:
        self._checked("tag", image, ref)

    def untag(self, ref: str) -> None:
        self._checked("untag", ref, ref)

    def remove(self, ref: str) -> None:
        self._run("image", "rm", "-f", ref)

    # -- running
    def gpu_available(self) -> bool:
        return nvidia_cdi_specs()

    def run_argv(self, spec: RunSpec) -> tuple[str, ...]:
        return (*self.client_argv(), *run_args(spec, self.gpu_flags))

    def remove_container_argv(self, name: str) -> tuple[str, ...]:
        return (*self.client_argv(), "rm", "-f", name)
