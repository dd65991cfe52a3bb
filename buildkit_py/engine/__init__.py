"""Engines: one object per engine, chosen once by the CLI (``select_engine``) and passed down.
Every module that needs the engine (build, push, image attributes, history, save, run with
GPUs) asks this object, through the ``Engine`` protocol (base.py: the ``Builder``, ``ImageStore``
and ``Runner`` roles, images as typed ``ImageInfo`` and ``HistoryEntry``); none builds its own client
and none branches on which kind it is.

The kinds are plug-ins, one module each in ``engine/kinds/``, registered by name
(registry.py): ``docker`` (alias ``classic``: a 20.10 client, ``DOCKER_BUILDKIT=1 docker
build``), ``buildx`` (``docker buildx build`` with the engine's own ``docker`` driver; with
``--builder NAME`` a docker-container, remote or Kubernetes BuildKit) and ``podman`` (its own
builder, buildah). Each declares its capabilities; ``require`` refuses an option the engine
cannot honour before any build starts, naming the engine or setting that can.
"""

from buildkit_py.engine.base import (
    BUILDER_SELECT,
    CA_SECRET_ID,
    CACHE_EXPORT,
    CACHE_FROM,
    CACHE_MOUNTS,
    COMPRESSION,
    ENGINE_STORE,
    METADATA_FILE,
    MULTI_PLATFORM,
    MULTI_STAGE,
    OCI_MEDIATYPES,
    PLATFORM,
    PROVENANCE,
    PUSH,
    SECRETS,
    Builder,
    BuildRequest,
    BuildResult,
    Engine,
    HistoryEntry,
    ImageInfo,
    ImageSizes,
    ImageStore,
    LineSink,
    ProgressSink,
    Runner,
    parse_compression,
    require,
    required_capabilities,
)
from buildkit_py.engine.registry import EngineChoice, engines, kind_names, register
from buildkit_py.engine.select import engine_for_reading, select_engine

__all__ = ["BUILDER_SELECT", "CA_SECRET_ID", "CACHE_EXPORT", "CACHE_FROM", "CACHE_MOUNTS", "COMPRESSION",
           "ENGINE_STORE", "METADATA_FILE", "MULTI_PLATFORM", "MULTI_STAGE", "OCI_MEDIATYPES", "PLATFORM",
           "PROVENANCE", "PUSH",
           "SECRETS", "BuildRequest", "BuildResult", "Builder", "Engine", "EngineChoice", "HistoryEntry",
           "ImageInfo", "ImageSizes", "ImageStore", "LineSink", "ProgressSink", "Runner",
           "engine_for_reading", "engines", "kind_names",
           "parse_compression", "register", "require", "required_capabilities", "select_engine"]
