"""`docker buildx build`, ``--engine buildx``: the engine most users have (cache export, push
from the build, metadata file, output options, builders). With ``--builder NAME`` it is
``BuilderEngine``: BuildKit outside the engine (docker-container, remote, Kubernetes)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from buildkit_py.engine.base import (
    BUILDER_SELECT,
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
    BuildRequest,
    Engine,
    cache_export_value,
    parse_compression,
)
from buildkit_py.engine.kinds.docker import ClassicEngine, found_clients
from buildkit_py.engine.push import classify_push_error, registry_host
from buildkit_py.engine.registry import EngineChoice, register
from buildkit_py.errors import AuthenticationError, EnvironmentProblem, RegistryError
from buildkit_py.oci import auth

_BASE = frozenset({MULTI_STAGE, CACHE_MOUNTS, SECRETS, CACHE_FROM, PUSH, METADATA_FILE, PLATFORM})
# What the docker driver can do only with the containerd image store (on the classic store
# the engine keeps no compressed blobs of its own and cannot export cache, attestations or an
# index of several platforms).
_STORE = frozenset({CACHE_EXPORT, COMPRESSION, OCI_MEDIATYPES, PROVENANCE, MULTI_PLATFORM})


def has_buildx(binary: str) -> bool:
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


def _csv(value: str) -> str:
    """One field of an --output value; buildx parses it as CSV, so a comma needs quotes."""
    return f'"{value}"' if "," in value or '"' in value else value


@register
class BuildxEngine(ClassicEngine):
    """buildx with the engine's own `docker` driver: the image lands in the engine's store
    whatever the output, so --load changes nothing here."""

    kind: ClassVar[str] = "buildx"
    aliases: ClassVar[tuple[str, ...]] = ()
    auto_order: ClassVar[int | None] = 10  # what --engine auto prefers
    named_builders: ClassVar[bool] = True
    title: ClassVar[str] = "buildx"
    summary: ClassVar[str] = "docker buildx build, client and engine as for docker; with --builder, that BuildKit"
    # What a refusal's hint names for each capability (engine/registry.py who_can)
    who_can: ClassVar[Mapping[str, str]] = {
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
        MULTI_PLATFORM: "buildx with the containerd image store (the Docker 26 engine scripts/services.sh starts on "
                        "/run/docker26.sock) or a named builder (--builder)",
    }
    name = "buildx"
    hints: Mapping[str, str] = {}

    def __init__(self, client: str, *, host: str | None = None, builder: str | None = None,
                 buildx: list[str] | None = None):
        super().__init__(client, host=host, builder=builder)
        # [client, "buildx"] or the plugin binary run standalone.
        self.buildx = list(buildx or [client, "buildx"])

    @classmethod
    def find(cls, choice: EngineChoice) -> Engine:
        """The first client with the buildx plugin (its own, or one shipped beside it); with
        --builder, that builder through it."""
        seen = []
        for c in found_clients():
            runner = [c, "buildx"] if has_buildx(c) else ([p] if (p := buildx_beside(c)) else None)
            if runner:
                kind = BuilderEngine if choice.builder else BuildxEngine
                return kind(c, host=choice.host, builder=choice.builder, buildx=runner)
            seen.append(f"{c}: no buildx plugin")
        raise EnvironmentProblem("no docker client with the buildx plugin: " + "; ".join(seen),
                                 hint="install docker-buildx-plugin, or use --engine docker")

    @classmethod
    def for_reading(cls, choice: EngineChoice) -> Engine:
        return ClassicEngine.for_reading(choice)  # reading needs no buildx

    @property
    def capabilities(self) -> frozenset[str]:  # type: ignore[override]
        try:
            store = self.containerd_store()
        except Exception:  # noqa: BLE001 - engine unreachable: the build will say so
            store = False
        return _BASE | {ENGINE_STORE} | (_STORE if store else frozenset())

    def describe(self) -> str:
        store = ""
        try:
            store = ", containerd image store" if self.containerd_store() else ", classic image store"
        except Exception:  # noqa: BLE001, S110
            pass
        return f"buildx engine ({self.client}{', ' + self.host if self.host else ''}{store})"

    def build_argv(self) -> list[str]:
        return [*self.buildx, "build"]

    def environment(self) -> dict[str, str]:
        env = super().environment()
        if self.buildx[0] != self.client and not self.host:
            env.pop("DOCKER_HOST", None)
        return env

    def output_args(self, request: BuildRequest) -> list[str]:
        fields = ["type=image", _csv(f"name={','.join(request.tags)}")] if request.tags else ["type=image"]
        if request.push:
            fields.append("push=true")
        comp = parse_compression(request.compression)
        if comp:
            fields += [f"compression={comp[0]}", "force-compression=true"]
            if comp[1] is not None:
                fields.append(f"compression-level={comp[1]}")
        if request.oci_mediatypes:
            fields.append("oci-mediatypes=true")
        return ["--output", ",".join(fields)]

    def extra_args(self, request: BuildRequest, metadata: Path | None = None) -> list[str]:
        args = self.output_args(request)
        # SOURCE_DATE_EPOCH among them: BuildKit 0.11+ dates the image config and its history by it.
        # Its exporter's rewrite-timestamp=true is not used: Docker 26's docker driver refuses it
        # ("conflicts with unpack"); the steps date their files themselves (templates/steps.j2).
        for name, value in sorted(request.build_args.items()):
            args += ["--build-arg", f"{name}={value}"]
        if metadata is not None:
            args += ["--metadata-file", str(metadata)]
        if request.builder:
            args += ["--builder", request.builder]
        for ref in request.cache_to:
            args += ["--cache-to", cache_export_value(ref, request.compression)]
        if request.provenance is not None:
            args += ["--provenance", "false" if request.provenance == "false" else f"mode={request.provenance}"]
        for p in request.platforms:
            args += ["--platform", p]
        return args

    def tag_args(self, request: BuildRequest) -> list[str]:
        return []  # the names are in --output

    def build_environment(self, request: BuildRequest, tmp: Path) -> dict[str, str]:
        """BuildKit pushes with the client's credentials (DOCKER_CONFIG). Credentials imgbuild
        takes from the environment (IMGBUILD_REGISTRY_USER/PASSWORD) are handed over in a
        private config for this build only, the user's own config untouched."""
        env = self.environment()
        if not request.push:
            return env
        found = {}
        for tag in request.tags:
            host = registry_host(tag)
            creds = auth.resolve(host)
            if creds is not None and creds.source == "env":
                found[auth.config_key(host)] = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
        if not found:
            return env
        original = auth.docker_config_path()
        config = auth.load_docker_config(original) if original.exists() else {}
        config.setdefault("auths", {}).update({k: {"auth": v} for k, v in found.items()})
        for key in found:  # these credentials, not a helper's, for these hosts
            (config.get("credHelpers") or {}).pop(key, None)
        config.pop("credsStore", None)
        config["cliPluginsExtraDirs"] = [str(original.parent / "cli-plugins"), *config.get("cliPluginsExtraDirs", [])]
        private = tmp / "docker-config"
        private.mkdir(mode=0o700)
        fd = os.open(private / "config.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(config, f)
        if (original.parent / "buildx").is_dir():  # the named builders live there
            (private / "buildx").symlink_to(original.parent / "buildx")
        return {**env, "DOCKER_CONFIG": str(private)}

    def refine_failure(self, request: BuildRequest, log: str) -> None:
        if not request.push:
            return
        lines = [ln for ln in log.splitlines() if "ERROR" in ln or "error" in ln.lower()]
        message = " ".join(lines[-1].split()) if lines else ""
        low = log.lower()
        if any(m in low for m in ("401 unauthorized", "failed to authorize", "unauthorized", "authentication required",
                                  "insufficient_scope")):
            err = classify_push_error("unauthorized: " + message, registry_host(request.tags[0]))
            if isinstance(err, (AuthenticationError, RegistryError)):
                raise err

    def image_id(self, iid: str, digest: str | None) -> str:
        """The containerd store names an image by its manifest's (or index's) digest, which the
        metadata file has; --iidfile holds the config's digest when there is no index (no
        attestation), which `docker image inspect` there does not find."""
        try:
            store = self.containerd_store()
        except Exception:  # noqa: BLE001 - the engine answered the build; a failed look-up keeps the iid
            store = False
        return digest if store and digest else iid

    def read_metadata(self, metadata: Path) -> str | None:
        try:
            data = json.loads(metadata.read_text())
        except (OSError, ValueError):
            return None
        digest = data.get("containerimage.digest")
        return digest if isinstance(digest, str) and digest.startswith("sha256:") else None


class BuilderEngine(BuildxEngine):
    """buildx with a named builder (docker-container, remote, Kubernetes): BuildKit runs
    outside the engine, so the image reaches the engine only with --load (type=docker), and a
    FROM cannot name an image only the engine has (no ENGINE_STORE). Chosen by BuildxEngine.find."""

    name = "buildx-builder"

    @property
    def capabilities(self) -> frozenset[str]:  # type: ignore[override]
        return _BASE | _STORE | {BUILDER_SELECT}

    def describe(self) -> str:
        return f"buildx builder {self.builder} ({self.client})"

    def output_args(self, request: BuildRequest) -> list[str]:
        args = super().output_args(request) if request.push or not request.load else []
        if request.load:
            args += ["--output", "type=docker" + ("," + _csv(f"name={','.join(request.tags)}") if request.tags else "")]
        return args

    def extra_args(self, request: BuildRequest, metadata: Path | None = None) -> list[str]:
        args = super().extra_args(request, metadata)
        if "--builder" not in args and self.builder:
            args += ["--builder", self.builder]
        return args

