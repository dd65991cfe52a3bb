"""`imgbuild run` and `imgbuild compose`: start an image with its weights pulled onto host
volumes (mounted read-only, never baked in) and the GPU flags when the host has a GPU runtime."""

from __future__ import annotations

import os
import re
import shlex
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
class Process:
    """What the container runs, by docker's rule: the command after the image replaces the
    image's CMD and is passed to its ENTRYPOINT as arguments; ``--entrypoint`` replaces the
    ENTRYPOINT (an empty one removes it) and drops the image's CMD."""

    argv: tuple[str, ...]  # ENTRYPOINT + arguments, as the container's first process gets them
    how: str  # one sentence: which rule applied, for the user


@dataclass(frozen=True)
class ImageStart:
    """An image's ENTRYPOINT and CMD and where they were read (the image, or the recipe when
    the image is not built yet)."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    source: str = "image"  # image | recipe


@dataclass(frozen=True)
class RunPlan:
    image: str
    weights: tuple[WeightsMount, ...]
    gpu: bool
    argv: tuple[str, ...]  # the docker run command line
    process: Process | None = None  # what runs in the container; None when the image's start is unknown

    @property
    def command_line(self) -> str:
        """``argv`` quoted for a POSIX shell, so it can be pasted."""
        return shlex.join(self.argv)


def container_process(start: ImageStart, command: tuple[str, ...], entrypoint: str | None = None) -> Process:
    """What ``docker run [--entrypoint E] IMAGE COMMAND...`` starts in the container."""
    ep = start.entrypoint if entrypoint is None else ((entrypoint,) if entrypoint else ())
    args = command if command or entrypoint is not None else start.cmd
    origin = " (read from the recipe: the image is not built)" if start.source == "recipe" else ""
    if not ep and not args:
        how = f"nothing: no ENTRYPOINT, CMD or command after --{origin}"
    elif entrypoint == "":
        how = "--entrypoint '' removes the image's ENTRYPOINT (and its CMD): the command after -- runs as given"
    elif entrypoint is not None:
        how = (f"--entrypoint {shlex.quote(entrypoint)} replaces the image's ENTRYPOINT (and its CMD); "
               "the command after -- is passed to it as arguments")
    elif ep and command:
        how = (f"the image's ENTRYPOINT runs with the command after -- as its arguments{origin}; "
               "to run the command itself, use --entrypoint (e.g. --entrypoint '' -- CMD...)")
    elif ep:
        how = f"the image's ENTRYPOINT{' and CMD' if args else ''}{origin}"
    elif command:
        how = f"the command after -- (the image has no ENTRYPOINT{origin}; it replaces the image's CMD)"
    else:
        how = f"the image's CMD{origin}"
    return Process(tuple(ep) + tuple(args), how)


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
             extra: list[str], command: list[str], docker: tuple[str, ...] = ("docker",),
             entrypoint: str | None = None) -> tuple[str, ...]:
    """``docker``: the client command line of the chosen engine (Engine.docker_argv());
    ``entrypoint``: docker's ``--entrypoint`` (None: the image's)."""
    argv = [*docker, "run", "--rm"]
    if gpu:
        argv += ["--gpus", "all"]
    if network:
        argv += ["--network", network]
    if entrypoint is not None:
        argv += ["--entrypoint", entrypoint]
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
    entrypoint: str | None = None  # docker run --entrypoint; None: the image's


def make_run_plan(image: str, weights_pairs: list[tuple[str, str]], options: RunOptions, *, engine_info: dict,
                  docker: tuple[str, ...] = ("docker",), start: ImageStart | None = None) -> RunPlan:
    """``engine_info``: the engine's `docker info`; ``docker``: its client command line
    (Engine.docker_argv(), so $IMGBUILD_DOCKER and $DOCKER_HOST are honoured); ``start``: the
    image's ENTRYPOINT and CMD, for the plan to say what runs in the container."""
    mounts = tuple(WeightsMount(ref, options.root / weights_dir_name(ref), mount) for ref, mount in weights_pairs)
    if options.gpus == "auto":
        gpu = gpu_runtime(engine_info)
    elif options.gpus in {"all", "none"}:
        gpu = options.gpus == "all"
    else:
        raise UsageError(f"--gpus {options.gpus!r}: use auto, all or none")
    argv = run_argv(image, mounts, gpu=gpu, network=options.network, extra=list(options.extra),
                    command=list(options.command), docker=docker, entrypoint=options.entrypoint)
    process = container_process(start, options.command, options.entrypoint) if start is not None else None
    return RunPlan(image, mounts, gpu, argv, process)


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
    return {"image": plan.image, "gpu": plan.gpu, "argv": list(plan.argv), "command_line": plan.command_line,
            "process": list(plan.process.argv) if plan.process else None,
            "process_rule": plan.process.how if plan.process else None,
            "weights": [{"ref": w.ref, "host_dir": str(w.host_dir), "mount": w.mount} for w in plan.weights]}
