"""Engines: one object per kind of docker engine + BuildKit client, chosen once by the CLI
(``select_engine``) and passed down. Every module that needs the engine (build, push, image
attributes, history, save, run, info) asks this object; none builds its own client.

Kinds: ``ClassicEngine`` (a 20.10 client, ``DOCKER_BUILDKIT=1 docker build``),
``BuildxEngine`` (``docker buildx build`` with the engine's own ``docker`` driver) and
``BuilderEngine`` (``docker buildx build --builder NAME``: a docker-container, remote or
Kubernetes BuildKit). Each declares its capabilities; ``require`` refuses an option the
engine cannot honour before any build starts, naming the engine or setting that can.
"""

from buildkit_py.engine.base import (
    BUILDER_SELECT,
    CA_SECRET_ID,
    CACHE_EXPORT,
    CACHE_FROM,
    CACHE_MOUNTS,
    COMPRESSION,
    METADATA_FILE,
    MULTI_PLATFORM,
    MULTI_STAGE,
    OCI_MEDIATYPES,
    PLATFORM,
    PROVENANCE,
    PUSH,
    SECRETS,
    BuildBackend,
    BuildRequest,
    BuildResult,
    Engine,
    ImageSizes,
    LineSink,
    ProgressSink,
    parse_compression,
    require,
    required_capabilities,
)
from buildkit_py.engine.select import (
    ENGINE_KINDS,
    buildx_beside,
    candidate_clients,
    detect_backend,
    engine_for_reading,
    select_engine,
)

__all__ = ["BUILDER_SELECT", "CA_SECRET_ID", "CACHE_EXPORT", "CACHE_FROM", "CACHE_MOUNTS", "COMPRESSION",
           "ENGINE_KINDS", "METADATA_FILE", "MULTI_PLATFORM", "MULTI_STAGE", "OCI_MEDIATYPES", "PLATFORM",
           "PROVENANCE", "PUSH",
           "SECRETS", "BuildBackend", "BuildRequest", "BuildResult", "Engine", "ImageSizes", "LineSink", "ProgressSink",
           "buildx_beside", "candidate_clients", "detect_backend", "engine_for_reading", "parse_compression",
           "require", "required_capabilities", "select_engine"]
