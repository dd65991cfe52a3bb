"""`docker buildx build`: the backend most users have (cache export, metadata file, builders)."""

from __future__ import annotations

from . import (BUILDER_SELECT, CACHE_EXPORT, CACHE_FROM, CACHE_MOUNTS, METADATA_FILE, MULTI_STAGE, PUSH,
               SECRETS, BuildRequest)
from .docker_cli import ClassicBuildKitBackend


class BuildxBackend(ClassicBuildKitBackend):
    name = "buildx"
    capabilities = frozenset({MULTI_STAGE, CACHE_MOUNTS, SECRETS, CACHE_FROM, CACHE_EXPORT, PUSH,
                              METADATA_FILE, BUILDER_SELECT})

    def command(self, request: BuildRequest, iidfile) -> list[str]:
        cmd = super().command(request, iidfile)
        # `docker buildx build` takes the same flags as `docker build` from here on.
        return [cmd[0], "buildx", *cmd[1:]]

    def extra_args(self, request: BuildRequest) -> list[str]:
        args = ["--load"]  # into the engine, where tag/push/inspect go through the docker SDK
        if request.builder:
            args += ["--builder", request.builder]
        for ref in request.cache_to:
            args += ["--cache-to", ref]
        return args
