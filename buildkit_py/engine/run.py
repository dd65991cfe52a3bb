"""`imgbuild run` and `imgbuild compose`: start an image with its weights pulled onto host
volumes (mounted read-only, never baked in) and the GPU flags when the host has a GPU runtime."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from buildkit_py.errors import UsageError
from buildkit_py.recipe.model import named_volume

# Where the NVIDIA container toolkit writes CDI specs (`nvidia-ctk cdi generate`).
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))


@dataclass(frozen=True)
class WeightsMount:
    ref: str
    host_dir: Path
    mount: str


@dataclass(frozen=True)
class RunPlan:
    image: str
    weights: tuple[WeightsMount, ...]
    gpu: bool
    argv: tuple[str, ...]  # the docker run command line


def default_weights_root() -> Path:
    env = os.environ.get("IMGBUILD_WEIGHTS_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/imgbuild/weights")
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "imgbuild" / "weights"


def weights_dir_name(ref: str) -> str:
    """A stable folder name per artifact reference: host/repo:tag -> host_repo_tag."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", ref).strip("_")


def gpu_runtime(info: dict) -> bool:
    """Does the engine offer GPUs? The nvidia runtime registered with dockerd, or CDI specs
    for NVIDIA devices (`--gpus` works with either)."""
    if "nvidia" in (info.get("Runtimes") or {}):
        return True
    return any(any(p.glob("nvidia*.yaml")) or any(p.glob("nvidia*.json")) for p in CDI_DIRS if p.is_dir())


def run_argv(image: str, weights: tuple[WeightsMount, ...], *, gpu: bool, network: str | None,
             extra: list[str], command: list[str], docker: tuple[str, ...] = ("docker",)) -> tuple[str, ...]:
    """``docker``: the client command line of the chosen engine (Engine.docker_argv())."""
    argv = [*docker, "run", "--rm"]
    if gpu:
        argv += ["--gpus", "all"]
    if network:
        argv += ["--network", network]
    for w in weights:
        argv += ["--mount", f"type=bind,source={w.host_dir},target={w.mount},readonly"]
    return tuple(argv + extra + [image] + command)


@dataclass(frozen=True)
class RunOptions:
    """What `imgbuild run` was asked for: where weights go on the host, GPUs (auto: when the
    engine has a GPU runtime), the network, extra `docker run` arguments and the command."""

    root: Path
    gpus: str = "auto"  # auto | all | none
    network: str | None = None
    extra: tuple[str, ...] = ()
    command: tuple[str, ...] = ()


def make_run_plan(image: str, weights_pairs: list[tuple[str, str]], options: RunOptions, *, engine_info: dict,
                  docker: tuple[str, ...] = ("docker",)) -> RunPlan:
    """``engine_info``: the engine's `docker info`; ``docker``: its client command line
    (Engine.docker_argv(), so $IMGBUILD_DOCKER and $DOCKER_HOST are honoured)."""
    mounts = tuple(WeightsMount(ref, options.root / weights_dir_name(ref), mount) for ref, mount in weights_pairs)
    if options.gpus == "auto":
        gpu = gpu_runtime(engine_info)
    elif options.gpus in {"all", "none"}:
        gpu = options.gpus == "all"
    else:
        raise UsageError(f"--gpus {options.gpus!r}: use auto, all or none")
    return RunPlan(image, mounts, gpu, run_argv(image, mounts, gpu=gpu, network=options.network,
                                                extra=list(options.extra), command=list(options.command),
                                                docker=docker))


def compose_document(image: str, recipe) -> dict:
    """compose.yaml for the image: GPU reservation, weights bound read-only from the host
    folders `imgbuild run` fills, and the companion services the recipe lists."""
    app: dict = {"image": image}
    app["deploy"] = {"resources": {"reservations": {"devices": [
        {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]}}}
    volumes = []
    for w in recipe.weights:
        volumes.append({"type": "bind", "source": f"./weights/{weights_dir_name(w.ref)}", "target": w.mount,
                        "read_only": True})
    if volumes:
        app["volumes"] = volumes
    if recipe.services:
        app["depends_on"] = [s.name for s in recipe.services]
    services = {"app": app}
    for s in recipe.services:
        svc: dict = {"image": s.image}
        # Compose interpolates ${VAR} and $VAR from the shell running it; a recipe's values are
        # literal, so each '$' is written '$$' (compose-spec, "Interpolation").
        if s.command:
            svc["command"] = [_literal(a) for a in s.command]
        if s.environment:
            svc["environment"] = {k: _literal(v) for k, v in s.environment}
        if s.ports:
            svc["ports"] = list(s.ports)
        if s.volumes:
            svc["volumes"] = list(s.volumes)
        services[s.name] = svc
    doc: dict = {"name": recipe.name.replace("/", "-"), "services": services}
    # Compose refuses a service whose named volume the file does not declare ("refers to
    # undefined volume"); the JSON schema alone does not check that.
    named = sorted({n for s in recipe.services for n in map(named_volume, s.volumes) if n})
    if named:
        doc["volumes"] = {n: {} for n in named}
    return doc


def _literal(value: str) -> str:
    return value.replace("$", "$$")


def compose_text(image: str, recipe) -> str:
    pulls = "".join(f"#   imgbuild weights pull {w.ref} ./weights/{weights_dir_name(w.ref)}\n" for w in recipe.weights)
    header = (f"# Written by `imgbuild compose {recipe.path.name}`.\n"
              + (f"# Pull the weights before `docker compose up`:\n{pulls}" if pulls else ""))
    return header + yaml.safe_dump(compose_document(image, recipe), sort_keys=False, default_flow_style=False)


def dry_run_json(plan: RunPlan) -> dict:
    return {"image": plan.image, "gpu": plan.gpu, "argv": list(plan.argv),
            "weights": [{"ref": w.ref, "host_dir": str(w.host_dir), "mount": w.mount} for w in plan.weights]}
