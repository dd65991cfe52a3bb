"""The classic client: `DOCKER_BUILDKIT=1 docker build` with a pre-23 client (Debian's 20.10)."""

from __future__ import annotations

import collections
import re
import subprocess
import tempfile
import time
from pathlib import Path

from buildkit_py.engine.base import (
    CACHE_FROM,
    CACHE_MOUNTS,
    MULTI_STAGE,
    SECRETS,
    BuildRequest,
    BuildResult,
    Engine,
    LineSink,
)
from buildkit_py.errors import BuildFailed, EnvironmentProblem

_STEP_RE = re.compile(r"^#(\d+) \[[^\]]*\d+/\d+\] (\S+)(.*)$")
_MARK_RE = re.compile(r": imgbuild-step=([\w.-]+);")
_CACHED_RE = re.compile(r"^#(\d+) CACHED$")
_ENGINE_DOWN = ("Cannot connect to the Docker daemon", "connect: no such file or directory",
                "Is the docker daemon running")


class ClassicEngine(Engine):
    name = "docker"
    kind = "classic"
    # The 20.10 client has no --cache-to, --push, --metadata-file, --builder or output options.
    capabilities = frozenset({MULTI_STAGE, CACHE_MOUNTS, SECRETS, CACHE_FROM})

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
        return ["--build-arg", "BUILDKIT_INLINE_CACHE=1"] if request.cache_from else []

    def tag_args(self, request: BuildRequest) -> list[str]:
        return [a for tag in request.tags for a in ("--tag", tag)]

    def read_metadata(self, metadata: Path) -> str | None:
        return None

    def build_environment(self, request: BuildRequest, tmp: Path) -> dict[str, str]:
        return self.environment()

    def refine_failure(self, request: BuildRequest, log: str) -> None:
        """Raise a more precise error than BuildFailed where the log says what went wrong."""

    def build(self, request: BuildRequest, on_line: LineSink) -> BuildResult:
        tail: collections.deque[str] = collections.deque(maxlen=40)
        steps: dict[str, str] = {}  # vertex number -> step name (marker id or instruction)
        cached: set[str] = set()
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="imgbuild-iid-") as tmp:
            iidfile, metadata = Path(tmp) / "iid", Path(tmp) / "metadata.json"
            cmd = self.command(request, iidfile, metadata)
            try:
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env=self.build_environment(request, Path(tmp)), errors="replace",
                                        stdin=subprocess.DEVNULL)
            except OSError as exc:
                raise EnvironmentProblem(f"cannot run {self.client}: {exc}") from None
            assert proc.stdout is not None  # noqa: S101
            for raw in proc.stdout:
                line = raw.rstrip("\n")
                tail.append(line)
                on_line(line)
                if (m := _STEP_RE.match(line)) and m.group(2) != "FROM":
                    mark = _MARK_RE.search(m.group(3))
                    steps[m.group(1)] = mark.group(1) if mark else m.group(2)
                elif m := _CACHED_RE.match(line):
                    cached.add(m.group(1))
            code = proc.wait()
            log = "\n".join(tail)
            if code != 0:
                if any(s in log for s in _ENGINE_DOWN):
                    raise EnvironmentProblem("the Docker engine is not reachable",
                                             hint="start it (scripts/services.sh up) or set DOCKER_HOST")
                self.refine_failure(request, log)
                raise BuildFailed(f"build failed (exit {code})", command=cmd, returncode=code, log_tail=log)
            image_id = iidfile.read_text().strip() if iidfile.exists() else ""
            digest = self.read_metadata(metadata)
        rerun = tuple(name for vertex, name in sorted(steps.items(), key=lambda kv: int(kv[0]))
                      if vertex not in cached)
        return BuildResult(image_id=image_id, tags=request.tags, log_tail=log,
                           cached_steps=len(cached & steps.keys()), run_steps=len(rerun), rerun=rerun,
                           seconds=time.monotonic() - start, digest=digest)


ClassicBuildKitBackend = ClassicEngine  # the older name
