"""BuildPlan -> built (and optionally pushed) image: the one place that does build I/O.

Order matters for "nothing half-written": everything that can be refused (capabilities,
missing CA file, budget of the result) is checked before the image keeps its tags.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import labels as L
from .backends import BuildBackend, BuildRequest, BuildResult, require, required_capabilities
from .errors import BudgetExceeded, BuildFailed, EnvironmentProblem, UsageError
from .plan import BuildPlan
from .registry import PushResult, push_image
from .render import render_dockerfile

LineSink = Callable[[str], None]
CA_SECRET_ID = "cacert"
# A pip.conf (private index URL with credentials), read by pip steps as PIP_CONFIG_FILE.
PIP_CONFIG_SECRET_ID = "pipconf"


@dataclass(frozen=True)
class BuildOptions:
    tags: tuple[str, ...] = ()
    push: bool = False
    ca_cert: Path | None = None
    pip_config: Path | None = None
    network: str | None = "host"
    no_cache: bool = False
    cache_from: tuple[str, ...] = ()
    cache_to: tuple[str, ...] = ()
    builder: str | None = None


@dataclass(frozen=True)
class BuildOutcome:
    plan: BuildPlan
    backend: str
    result: BuildResult
    size: int
    pushes: tuple[PushResult, ...] = ()
    groups: dict[str, int] = field(default_factory=dict)
    # What the built image carries, read back from the engine: the plan's static labels, the
    # volatile ones (created, revision, base digest) and any the base passes through.
    labels: dict[str, str] = field(default_factory=dict)


def docker_client():
    import docker

    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except Exception as exc:
        raise EnvironmentProblem(f"cannot reach the Docker engine ({exc.__class__.__name__})",
                                 hint="start it (scripts/services.sh up starts Debian's dockerd) or set DOCKER_HOST") from None
    return client


def assemble_context(plan: BuildPlan, dockerfile: str, workdir: Path) -> tuple[Path, Path]:
    """A build context holding only what the recipe copies, so nothing else in the recipe's
    folder (secrets, data, .git) is sent to the engine."""
    context = workdir / "context"
    context.mkdir()
    root = plan.recipe.context_dir
    for c in plan.recipe.copy:
        src = root / c.src
        dest = context / c.src
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dest)
    # Files a step bind-mounts from the context (a locked build's requirement files, see
    # lock.apply_lock): the plan names them, so the Dockerfile and the context agree.
    for stage in plan.stages:
        for step in stage.steps:
            for rel, text in sorted(step.data.get("context_files", {}).items()):
                target = context / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
    path = workdir / "Dockerfile"
    path.write_text(dockerfile)
    return context, path


def layer_groups(client, image_id: str, plan: BuildPlan) -> dict[str, int]:
    """Bytes per layer group (base, os, python, cuda, ...), from the engine's history: cheap
    enough to run after every build, unlike `imgbuild inspect`, which streams the image."""
    from .inspect import attribute_entries

    history = list(reversed(client.api.history(image_id)))  # the API lists newest first
    step_groups = {st.id: st.group for st in plan.final.steps}
    groups: dict[str, int] = {}
    for attribution, entry in zip(attribute_entries(history, step_groups), history):
        groups[attribution.group] = groups.get(attribution.group, 0) + int(entry.get("Size") or 0)
    return {g: b for g, b in sorted(groups.items(), key=lambda kv: -kv[1]) if b}


def run_build(plan: BuildPlan, backend: BuildBackend, options: BuildOptions, on_line: LineSink,
              on_progress: LineSink | None = None, client=None) -> BuildOutcome:
    dockerfile = render_dockerfile(plan)
    secrets: dict[str, Path] = {}
    if options.ca_cert is not None:
        if not options.ca_cert.is_file():
            raise UsageError(f"--ca-cert {options.ca_cert}: no such file")
        secrets[CA_SECRET_ID] = options.ca_cert.resolve()
    if options.pip_config is not None:
        if not options.pip_config.is_file():
            raise UsageError(f"--pip-config {options.pip_config}: no such file")
        secrets[PIP_CONFIG_SECRET_ID] = options.pip_config.resolve()
    tags = plan.tags if not options.tags else options.tags
    from .recipe import IMAGE_REF_RE

    for tag in tags:  # reach argv and the registry, never a shell: check the grammar, exit 2
        if not IMAGE_REF_RE.match(tag) or "@" in tag:
            raise UsageError(f"--tag {tag!r} is not a valid image reference",
                             hint="e.g. team/trainer:1.0 or 127.0.0.1:5000/team/trainer:1.0")
    request_probe = BuildRequest(Path("."), Path("Dockerfile"), tags, cache_from=options.cache_from,
                                 cache_to=options.cache_to, builder=options.builder)
    require(backend, required_capabilities(plan.needs, request_probe))
    client = client or docker_client()

    # A base pinned at plan time carries its digest as a static label already.
    base_digest = None if plan.resolution.base_digest else _local_digest(client, plan.resolution.base_image)
    volatile = L.volatile_labels(plan.recipe, base_digest=base_digest)
    with tempfile.TemporaryDirectory(prefix="imgbuild-") as tmp:
        context, dockerfile_path = assemble_context(plan, dockerfile, Path(tmp))
        request = BuildRequest(
            context_dir=context, dockerfile=dockerfile_path, tags=tags, labels=volatile, secrets=secrets,
            network=options.network, no_cache=options.no_cache, cache_from=options.cache_from,
            cache_to=options.cache_to, builder=options.builder,
        )
        try:
            result = backend.build(request, on_line)
        except BuildFailed as exc:
            if "no space left on device" not in exc.log_tail.lower() or exc.hint:
                raise
            raise BuildFailed("build failed: the engine ran out of disk space", command=exc.command,
                              returncode=exc.returncode, log_tail=exc.log_tail,
                              hint="free space in the engine's data root (docker system prune, "
                                   "docker builder prune) and build again; no image was tagged") from None

    image = client.images.get(result.image_id)
    size = int(image.attrs.get("Size") or 0)
    image_labels = dict(sorted(((image.attrs.get("Config") or {}).get("Labels") or {}).items()))
    groups = layer_groups(client, result.image_id, plan)
    if plan.recipe.max_size is not None and size > plan.recipe.max_size:
        # The image stays in the engine (its layers are cache) but loses the tags we gave it.
        for tag in tags:
            client.images.remove(tag, noprune=True)
        breakdown = ", ".join(f"{g} {_human(b)}" for g, b in groups.items())
        raise BudgetExceeded(
            f"image is {_human(size)}, over the recipe's budget of {_human(plan.recipe.max_size)}: {breakdown}",
            hint="see `imgbuild inspect` for the biggest layers; drop heavy pins or use a runtime flavor")

    pushes: list[PushResult] = []
    if options.push:
        for tag in tags:
            pushes.append(push_image(client, tag, on_progress=on_progress))
    return BuildOutcome(plan, backend.name, result, size, tuple(pushes), groups, image_labels)


def _local_digest(client, ref: str) -> str | None:
    """The base image's registry digest where the engine knows one (pulled, not imported)."""
    try:
        digests = client.images.get(ref).attrs.get("RepoDigests") or []
    except Exception:
        return None
    for d in digests:
        if "@" in d:
            return d.split("@", 1)[1]
    return None


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"
