"""The classic client: `DOCKER_BUILDKIT=1 docker build` with a pre-23 client (Debian's 20.10)."""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

from buildkit_py.engine.base import (
    CA_SECRET_ID,
    CACHE_FROM,
    CACHE_MOUNTS,
    MULTI_STAGE,
    PLATFORM,
    SECRETS,
    BuildRequest,
    BuildResult,
    Engine,
    LineSink,
)
from buildkit_py.engine.buildlog import BuildLog
from buildkit_py.engine.children import supervised
from buildkit_py.errors import BuildFailed, EnvironmentProblem, FailedStep

_ENGINE_DOWN = ("Cannot connect to the Docker daemon", "connect: no such file or directory",
                "Is the docker daemon running")


class ClassicEngine(Engine):
    name = "docker"
    kind = "classic"
    # The 20.10 client has no --cache-to, --push, --metadata-file, --builder or output options; it
    # builds one platform per build (a repeated --platform silently keeps the last), never an index.
    capabilities = frozenset({MULTI_STAGE, CACHE_MOUNTS, SECRETS, CACHE_FROM, PLATFORM})

    def build_argv(self) -> list[str]:
        return [*self.docker_argv(), "build"]

    def command(self, request: BuildRequest, iidfile: Path, metadata: Path | None = None) -> list[str]:
        cmd = [*self.build_argv(), "--progress", "plain", "--iidfile", str(iidfile),
               "--file", str(request.dockerfile)]
        cmd += self.extra_args(request, metadata)
        if request.network:
            cmd += ["--network", request.network]
        if request.no_cache:
            cmd.append("--no-cache")
        if request.target:
            cmd += ["--target", request.target]
        for sid, src in sorted(request.secrets.items()):
            cmd += ["--secret", f"id={sid},src={src}"]
        for ref in request.cache_from:
            cmd += ["--cache-from", ref]
        for key, value in sorted(request.labels.items()):
            cmd += ["--label", f"{key}={value}"]
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
        with tempfile.TemporaryDirectory(prefix="imgbuild-iid-") as tmp:
            iidfile, metadata = Path(tmp) / "iid", Path(tmp) / "metadata.json"
            cmd = self.command(request, iidfile, metadata)
            try:
                # A session of its own: an interrupt reaches imgbuild, which stops the build (children.py).
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env=self.build_environment(request, Path(tmp)), errors="replace",
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as exc:
                raise EnvironmentProblem(f"cannot run {self.client}: {exc}") from None
            assert proc.stdout is not None  # noqa: S101
            with proc.stdout, supervised(proc, f"{self.build_name(cmd)} of {', '.join(request.tags) or 'the image'}"):
                for raw in proc.stdout:
                    line = raw.rstrip("\n")
                    log.feed(line)
                    on_line(line)
                code = proc.wait()
            tail = "\n".join(log.tail)
            if code != 0:
                if any(s in tail for s in _ENGINE_DOWN):
                    raise EnvironmentProblem("the Docker engine is not reachable",
                                             hint="start it (scripts/services.sh up) or set DOCKER_HOST")
                self.refine_failure(request, tail)
                raise build_failure(log, cmd, code, ca_cert=CA_SECRET_ID in request.secrets)
            digest = self.read_metadata(metadata)
            image_id = self.image_id(iidfile.read_text().strip() if iidfile.exists() else "", digest)
        steps = log.steps()
        rerun = tuple(name for _, name, state in steps if state != "cached")
        return BuildResult(image_id=image_id, tags=request.tags, log_tail=tail,
                           cached_steps=len(steps) - len(rerun), run_steps=len(rerun), rerun=rerun,
                           seconds=time.monotonic() - start, digest=digest)


def build_failure(log: BuildLog, command: list[str], code: int, *, ca_cert: bool) -> BuildFailed:
    """The error for a failed build: the step that failed, named once, with its own last lines
    and the known cause's hint; the log's last lines when no step failed (a Dockerfile the
    frontend refused, a base that cannot be pulled)."""
    failed, cause = log.failure(), log.cause(ca_cert=ca_cert)
    tail = "\n".join(log.tail)
    if failed is None:
        message = "build failed" + (f": {cause.summary}" if cause else f" (exit {code})")
        return BuildFailed(message, command=command, returncode=code, log_tail=tail,
                           hint=cause.hint if cause else None, cause=cause.code if cause else None)
    message = f"build failed at step {failed.name}: {failed.error}"
    if cause is not None:
        message += f"; {cause.summary} ({cause.evidence})"
    return BuildFailed(message, command=command, returncode=code, log_tail=tail,
                       hint=cause.hint if cause else "--progress plain prints every line of the build",
                       step=FailedStep(failed.name, failed.exit_code, failed.output),
                       cause=cause.code if cause else None)


ClassicBuildKitBackend = ClassicEngine  # the older name
