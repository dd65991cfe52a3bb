"""`imgbuild run` and `imgbuild compose`: start an image with its weights pulled onto host
volumes (mounted read-only, never baked in) and the GPU flags when the engine offers GPUs. What
runs is a ``RunSpec``; the engine turns it into its client's command line (``Engine.run_argv``:
`docker run --gpus all`, `podman run --device nvidia.com/gpu=all`) and says whether it has GPUs
(``Engine.gpu_available``)."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildkit_py.engine import children
from buildkit_py.errors import UsageError

if TYPE_CHECKING:
    from buildkit_py.engine.base import Engine
    from buildkit_py.recipe.model import Recipe

# yaml and the recipe model (yaml, packaging) are imported by compose's functions, as push.py
# imports requests where it needs it: every engine kind imports these modules, and reading the
# engine registry (--engine's choices and help) imports every kind (issue 32: start-up).

# Where the NVIDIA container toolkit writes CDI specs (`nvidia-ctk cdi generate`).
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))


@dataclass(frozen=True)
class WeightsMount:
    ref: str
    host_dir: Path
    mount: str


@dataclass(frozen=True)
class BindMount:
    """A host file or folder bound into the container at ``target``, read-only unless asked."""

    source: Path
    target: str
    read_only: bool = True


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
    argv: tuple[str, ...]  # the engine client's run command line (docker run, podman run)
    process: Process | None = None  # what runs in the container; None when the image's start is unknown
    spec: RunSpec | None = None  # what ``argv`` was written from: ``run_container`` starts it

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


def weights_dir_name(ref: str) -> str:
    """A stable folder name per artifact reference: host/repo:tag -> host_repo_tag."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", ref).strip("_")


def nvidia_cdi_specs(dirs: tuple[Path, ...] | None = None) -> bool:
    """Are there CDI specs for NVIDIA devices (`nvidia-ctk cdi generate`)? Docker (with
    ``--gpus``) and podman (with ``--device nvidia.com/gpu=all``) both take GPUs from them."""
    return any(any(p.glob("nvidia*.yaml")) or any(p.glob("nvidia*.json"))
               for p in (CDI_DIRS if dirs is None else dirs) if p.is_dir())


@dataclass(frozen=True)
class RunSpec:
    """One container to start, whatever the engine: the image, the weights bound read-only, GPUs
    or not, the network, docker's ``--entrypoint`` (None: the image's), other bind mounts, the
    client arguments the user passed on (`imgbuild run --docker-arg`) and the command."""

    image: str
    weights: tuple[WeightsMount, ...] = ()
    gpu: bool = False
    network: str | None = None
    entrypoint: str | None = None
    extra: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    platform: str | None = None  # that platform's image of a multi-platform one (linux/arm64: under qemu)
    name: str | None = None  # the container's name (--name): how it is removed when its client is stopped
    mounts: tuple[BindMount, ...] = ()  # after the weights (the image tests' scripts and wheels)


@dataclass(frozen=True)
class RunOptions:
    """What `imgbuild run` was asked for: where weights go on the host, GPUs (auto: when the
    engine offers them), the network, extra `docker run` (`podman run`) arguments and the command."""

    root: Path
    gpus: str = "auto"  # auto | all | none
    network: str | None = None
    extra: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    entrypoint: str | None = None  # docker run --entrypoint; None: the image's


def make_run_plan(image: str, weights_pairs: list[tuple[str, str]], options: RunOptions, *, engine: Engine,
                  gpu_available: bool, start: ImageStart | None = None) -> RunPlan:
    """``engine``: the chosen engine, whose ``run_argv`` writes the command line;
    ``gpu_available``: whether it offers GPUs (``engine.gpu_available()``, asked by the caller,
    which decides what an unreachable engine means); ``start``: the image's ENTRYPOINT and CMD,
    for the plan to say what runs in the container. The weights folders are absolute paths: a bind
    mount's source must be (docker refuses a relative one with exit 125, after the download)."""
    root = Path(os.path.abspath(options.root))  # --weights-dir wdir: from the working directory, as the user meant
    mounts = tuple(WeightsMount(ref, root / weights_dir_name(ref), mount) for ref, mount in weights_pairs)
    if options.gpus == "auto":
        gpu = gpu_available
    elif options.gpus in {"all", "none"}:
        gpu = options.gpus == "all"
    else:
        raise UsageError(f"--gpus {options.gpus!r}: use auto, all or none")
    spec = RunSpec(image, mounts, gpu, options.network, options.entrypoint, options.extra, options.command)
    process = container_process(start, options.command, options.entrypoint) if start is not None else None
    return RunPlan(image, mounts, gpu, engine.run_argv(spec), process, spec)


def container_name() -> str:
    """A fresh name for a container imgbuild starts (``run_container`` removes it by this name)."""
    import uuid  # noqa: PLC0415 - ~2 ms, for the run alone

    return f"imgbuild-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class ContainerExit:
    """How a container run ended: the client's exit code, and whether imgbuild removed the
    container because it ran past its time limit."""

    code: int
    timed_out: bool = False


def run_container(engine: Engine, spec: RunSpec, *, what: str, timeout: float | None = None,
                  on_line: Callable[[str], None] | None = None) -> ContainerExit:
    """Run ``spec``'s container to its end under a name of its own: its output to ``on_line``
    (None: to imgbuild's own stdout and stderr). A container still running after ``timeout``
    seconds, or when imgbuild is interrupted, is removed by that name (`rm -f`), and then its
    client ends: stopping the `docker run` client alone leaves the container running in the
    engine (a PID 1 without a handler ignores the SIGINT the client passes on)."""
    name = spec.name or container_name()
    argv = list(engine.run_argv(replace(spec, name=name)))
    ended, expired = threading.Event(), threading.Event()

    def remove() -> None:
        # bounded: an engine that no longer answers must not hold an interrupt (the client is stopped next)
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            subprocess.run(engine.remove_container_argv(name), capture_output=True,  # noqa: PLW1510
                           env=engine.environment(), stdin=subprocess.DEVNULL, timeout=30)

    def watch() -> None:
        if timeout is not None and not ended.wait(timeout):
            expired.set()
            # rm -f can come before the engine has created the container: again until the client ends
            while True:
                remove()
                if ended.wait(1.0):
                    return

    watcher = threading.Thread(target=watch, name=f"timeout of {name}", daemon=True)
    watcher.start()
    try:
        if on_line is None:
            code = children.wait(argv, env=engine.environment(), what=what, on_interrupt=remove)
        else:
            code = children.follow(argv, env=engine.environment(), what=what, on_line=on_line, on_interrupt=remove)
    finally:
        ended.set()
    watcher.join()
    return ContainerExit(code, expired.is_set())


def compose_document(image: str, recipe: Recipe) -> dict[str, Any]:
    """compose.yaml for the image: GPU reservation, weights bound read-only from the host
    folders `imgbuild run` fills, and the companion services the recipe lists."""
    from buildkit_py.recipe.model import named_volume  # noqa: PLC0415 - compose only (see the imports)

    app: dict[str, Any] = {"image": image}
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
    services: dict[str, dict[str, Any]] = {"app": app}
    for s in recipe.services:
        svc: dict[str, Any] = {"image": s.image}
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
    doc: dict[str, Any] = {"name": recipe.name.replace("/", "-"), "services": services}
    # Compose refuses a service whose named volume the file does not declare ("refers to
    # undefined volume"); the JSON schema alone does not check that.
    named = sorted({n for s in recipe.services for n in map(named_volume, s.volumes) if n})
    if named:
        doc["volumes"] = {n: {} for n in named}
    return doc


def _literal(value: str) -> str:
    return value.replace("$", "$$")


def compose_text(image: str, recipe: Recipe) -> str:
    import yaml  # noqa: PLC0415 - compose only (see the imports)

    pulls = "".join(f"#   imgbuild weights pull {w.ref} ./weights/{weights_dir_name(w.ref)}\n" for w in recipe.weights)
    header = (f"# Written by `imgbuild compose {recipe.path.name}`.\n"
              + (f"# Pull the weights before `docker compose up`:\n{pulls}" if pulls else ""))
    return header + yaml.safe_dump(compose_document(image, recipe), sort_keys=False, default_flow_style=False)


def dry_run_json(plan: RunPlan) -> dict[str, Any]:
    return {"image": plan.image, "gpu": plan.gpu, "argv": list(plan.argv), "command_line": plan.command_line,
            "process": list(plan.process.argv) if plan.process else None,
            "process_rule": plan.process.how if plan.process else None,
            "weights": [{"ref": w.ref, "host_dir": str(w.host_dir), "mount": w.mount} for w in plan.weights]}
