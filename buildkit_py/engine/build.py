"""BuildPlan -> built (and optionally pushed) image: the one place that does build I/O.

Order matters for "nothing half-written": everything that can be refused (capabilities,
missing CA file, budget of the result) is checked before the image keeps its tags.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from buildkit_py import oci
from buildkit_py.engine import (
    CA_SECRET_ID,
    ENGINE_STORE,
    PROVENANCE,
    PUSH,
    BuildRequest,
    BuildResult,
    Engine,
    ImageSizes,
    cold_start,
    require,
    required_capabilities,
)
from buildkit_py.engine.cold_start import ColdStartPrediction, StartTime
from buildkit_py.engine.push import PushResult, TransferSink, check_can_push, split_tag
from buildkit_py.errors import BudgetExceeded, ImageTestFailed, ImgbuildError, RegistryError, UsageError
from buildkit_py.files import write_atomic
from buildkit_py.plan import labels as L
from buildkit_py.plan.build_plan import BuildPlan, check_image_tag
from buildkit_py.plan.history import attribute_entries
from buildkit_py.plan.installer import UV_ENV_SECRET_ID, uv_env_for
from buildkit_py.plan.steps import CopyStep
from buildkit_py.recipe.model import Recipe
from buildkit_py.render.dockerfile import render_dockerfile
from buildkit_py.sizes import human_size

LineSink = Callable[[str], None]
# Checks an image must pass before it keeps its tags or is pushed (the recipe's tests: see
# analysis/image_checks.py); called with the image id, it raises an ImgbuildError to refuse it, and
# returns how long the image's first test took (the entrypoint's start of budget.cold_start), if one ran.
ImageGate = Callable[[str], StartTime | None]
# A pip.conf (private index URL with credentials), read by pip steps as PIP_CONFIG_FILE.
PIP_CONFIG_SECRET_ID = "pipconf"  # noqa: S105


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
    load: bool = False  # keep the image in the engine even when pushing from BuildKit
    compression: str | None = None  # gzip|zstd[:level] (buildx)
    oci_mediatypes: bool = False
    provenance: str | None = None  # min|max|false (buildx)
    platforms: tuple[str, ...] = ()
    rejected: str | None = None  # the tag a refused image keeps (rejected_tag); None: REPO:rejected


def build_platforms(recipe: Recipe, requested: tuple[str, ...]) -> tuple[str, ...]:
    """The platforms a build names: the recipe's where it has its own (``platforms:``, or what
    build --platform put in their place, checked for each when it was resolved), else what was
    asked (nothing: the engine's own platform)."""
    return recipe.platforms if recipe.multi_platform else requested


@dataclass(frozen=True)
class BuildOutcome:
    plan: BuildPlan
    engine: str
    result: BuildResult
    size: int  # uncompressed bytes (kept under this name for older readers; see sizes)
    pushes: tuple[PushResult, ...] = ()
    groups: dict[str, int] = field(default_factory=dict)
    # What the built image carries, read back from the engine: the plan's static labels, the
    # volatile ones (created, revision, base digest) and any the base passes through.
    labels: dict[str, str] = field(default_factory=dict)
    sizes: ImageSizes | None = None  # uncompressed and compressed, None when not in the engine
    cold_start: ColdStartPrediction | None = None  # a fresh node's start, None when not in the engine


def registry_compressed_size(ref: str) -> int | None:
    """Bytes a pull of ``ref`` downloads: config + layers of its linux/amd64 manifest."""
    try:
        manifest, _, _ = oci.get_manifest(ref)
    except ImgbuildError:
        return None
    return int((manifest.get("config") or {}).get("size") or 0) + sum(
        int(layer.get("size") or 0) for layer in manifest.get("layers") or [])


def build_secrets(ca_cert: Path | None, pip_config: Path | None) -> dict[str, Path]:
    """The BuildKit secrets a build passes (id -> absolute file): the CA bundle pip trusts and
    the pip.conf pip steps read; a missing file is a usage error before anything builds."""
    secrets: dict[str, Path] = {}
    for sid, option, path in ((CA_SECRET_ID, "--ca-cert", ca_cert), (PIP_CONFIG_SECRET_ID, "--pip-config", pip_config)):
        if path is None:
            continue
        if not path.is_file():
            raise UsageError(f"{option} {path}: no such file")
        secrets[sid] = path.resolve()
    return secrets


def write_context(plan: BuildPlan, context: Path) -> Path:
    """Fill the folder ``context`` (created) with what the plan's build reads from its context,
    and only that, so nothing else in the recipe's folder (secrets, data, .git) reaches the
    engine: the sources its COPY steps name and the files its steps bind-mount or COPY (a locked
    build's requirement files, the mount stubs' empty file; see ``BuildPlan.context_files``)."""
    context.mkdir(parents=True)
    root = plan.recipe.context_dir
    for step in (s for stage in plan.stages for s in stage.steps if isinstance(s, CopyStep)):
        src = root / step.src
        dest = context / step.src
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dest)
    for f in plan.context_files:
        target = context / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f.text)
    return context


def assemble_context(plan: BuildPlan, dockerfile: str, workdir: Path) -> tuple[Path, Path]:
    """The build context (``workdir``/context) and the Dockerfile beside it."""
    context = write_context(plan, workdir / "context")
    path = workdir / "Dockerfile"
    path.write_text(dockerfile)
    return context, path


def layer_groups(engine: Engine, image_id: str, plan: BuildPlan) -> dict[str, int]:
    """Bytes per layer group (base, os, python, cuda, ...), from the engine's history: cheap
    enough to run after every build, unlike `imgbuild inspect`, which streams the image."""
    history = engine.history(image_id)
    step_groups = {st.id: st.group for st in plan.final.steps}
    groups: dict[str, int] = {}
    for attribution, entry in zip(attribute_entries(history, step_groups), history, strict=False):
        groups[attribution.group] = groups.get(attribution.group, 0) + int(entry.get("Size") or 0)
    return {g: b for g, b in sorted(groups.items(), key=lambda kv: -kv[1]) if b}


REJECTED_TAG = "rejected"  # an image refused after its build (over budget, tests failed) keeps only this tag


def run_build(plan: BuildPlan, engine: Engine, options: BuildOptions, on_line: LineSink,
              on_progress: LineSink | None = None, on_transfer: TransferSink | None = None,
              gate: ImageGate | None = None) -> BuildOutcome:
    """Build on ``engine``; push from BuildKit where the engine can (PUSH: buildx), else through
    the engine (``engine.push``). The image is kept in the engine when asked (--load), when a budget
    or a ``gate`` (the recipe's tests) must pass first, or when the engine keeps every image anyway
    (ENGINE_STORE: not a named builder). An image refused by either keeps only REPO:rejected, and
    nothing is pushed."""
    dockerfile = render_dockerfile(plan)
    secrets = build_secrets(options.ca_cert, options.pip_config)
    # uv reads no pip.conf: its steps get the translation (UV_* variables) as a secret of their own.
    uv_env = uv_env_for(plan, options.pip_config, ca_cert=options.ca_cert is not None)
    tags = plan.tags if not options.tags else options.tags
    for tag in tags:  # reach argv and the registry, never a shell: check the grammar, exit 2
        check_image_tag(tag)
    budget = plan.recipe.max_size
    from_buildkit = options.push and PUSH in engine.capabilities
    # A budget and the tests are checked on the image in the engine before anything is pushed.
    checked_first = budget is not None or plan.recipe.cold_start is not None or gate is not None
    keep_local = options.load or checked_first or not options.push or ENGINE_STORE in engine.capabilities
    probe = BuildRequest(Path("."), Path("Dockerfile"), tags, cache_from=options.cache_from,
                         cache_to=options.cache_to, builder=options.builder, compression=options.compression,
                         oci_mediatypes=options.oci_mediatypes, provenance=options.provenance,
                         platforms=options.platforms)
    require(engine, required_capabilities(plan.needs, probe))
    if options.push:  # wrong credentials fail now, not after the whole build
        check_can_push(tags)

    # No attestation unless asked for: BuildKit's provenance carries the build's start time and a
    # random invocation id, so with it every build, even of nothing changed, gets a new digest.
    provenance = options.provenance
    if provenance is None and PROVENANCE in engine.capabilities:
        provenance = "false"
    # A base pinned at plan time carries its digest as a static label already.
    base_digest = None if plan.resolution.base_digest else _local_digest(engine, plan.resolution.base_image)
    volatile = L.volatile_labels(plan.recipe, base_digest=base_digest)
    with tempfile.TemporaryDirectory(prefix="imgbuild-") as tmp:
        context, dockerfile_path = assemble_context(plan, dockerfile, Path(tmp))
        if uv_env is not None:  # beside the context, never in it
            secrets[UV_ENV_SECRET_ID] = Path(tmp, UV_ENV_SECRET_ID)
            write_atomic(secrets[UV_ENV_SECRET_ID], uv_env, private=True)
        # An image checked before its push also gets a tag of its own until it is pushed: another build
        # of the same recipe taking the tags meanwhile would otherwise leave it untagged, which the
        # containerd store drops (and the push of the checked image would find nothing)
        hold = hold_tag(tags[0]) if options.push and checked_first else None
        request = BuildRequest(
            context_dir=context, dockerfile=dockerfile_path, tags=tags + ((hold,) if hold else ()),
            labels=volatile, secrets=secrets,
            network=options.network, no_cache=options.no_cache, cache_from=options.cache_from,
            cache_to=options.cache_to, builder=options.builder, push=from_buildkit and not checked_first,
            load=keep_local, compression=options.compression, oci_mediatypes=options.oci_mediatypes,
            provenance=provenance, platforms=options.platforms,
        )
        result = replace(_build(engine, request, on_line), tags=tags)
        try:
            pushes, sizes, groups, image_labels, cold = _check_and_push(
                engine, plan, result, options, gate, keep_local=keep_local,
                progress=(on_progress, on_transfer))
        finally:
            if hold:
                release_hold(engine, hold)
    if pushes:  # what a pull really downloads, from the registry's manifest
        compressed = registry_compressed_size(pushes[0].ref)
        if compressed is not None:
            sizes = ImageSizes(sizes.uncompressed if sizes else 0, compressed)
        if not image_labels:  # pushed from a builder without loading: read them back from the registry
            config = oci.get_image_config(pushes[0].ref).get("config") or {}
            image_labels = dict(sorted((config.get("Labels") or {}).items()))
    return BuildOutcome(plan, engine.name, result, sizes.uncompressed if sizes else 0, tuple(pushes), groups,
                        labels=image_labels, sizes=sizes, cold_start=cold)


def _check_and_push(engine: Engine, plan: BuildPlan, result: BuildResult, options: BuildOptions,
                    gate: ImageGate | None, *, keep_local: bool,
                    progress: tuple[LineSink | None, TransferSink | None]) -> tuple[
                        list[PushResult], ImageSizes | None, dict[str, int], dict[str, str],
                        ColdStartPrediction | None]:
    """After the build: the size budget and the gate (the recipe's tests) on the image in the engine,
    then the push: of the checked image itself where something was checked, else as the build did it.
    Returns the pushes, the image's sizes, its layer groups, its labels and its cold start."""
    on_progress, on_transfer = progress
    tags = result.tags
    budget = plan.recipe.max_size
    checked_first = budget is not None or plan.recipe.cold_start is not None or gate is not None
    from_buildkit = options.push and PUSH in engine.capabilities
    sizes = engine.image_sizes(result.image_id) if keep_local and result.image_id else None
    groups = layer_groups(engine, result.image_id, plan) if sizes else {}
    attrs = (engine.image_attrs(result.image_id) or {}) if sizes else {}
    image_labels = dict(sorted(((attrs.get("Config") or {}).get("Labels") or {}).items()))
    if budget is not None and sizes and sizes.uncompressed > budget:
        _reject_over_budget(engine, result.image_id, tags, sizes.uncompressed, budget, groups, plan,
                            options.rejected)
    started = None
    if gate is not None:
        try:
            started = gate(result.image_id)
        except ImageTestFailed as exc:
            exc.kept_as = keep_as_rejected(engine, result.image_id, tags, options.rejected)
            exc.message += f"\nnothing was pushed; the image is kept as {exc.kept_as}"
            exc.args = (exc.message,)
            raise
    # budget.cold_start, after the tests, which time the entrypoint's start (engine/cold_start.py)
    cold = cold_start.build_prediction(plan.recipe.cold_start, sizes.compressed, sizes.uncompressed, started) \
        if sizes else None
    if plan.recipe.cold_start and cold and cold_start.over_budget(plan.recipe.cold_start, cold):
        cold_start.check_budget(cold, plan.recipe.cold_start, result.image_id,
                                keep_as_rejected(engine, result.image_id, tags, options.rejected))
    pushes: list[PushResult] = []
    if options.push and checked_first and result.image_id:
        # The image that was checked is pushed, from the engine's store: never a second build
        # that trusts the cache (a --no-cache build of the same recipe or a prune meanwhile made
        # it push another image), and each push is then read back from the registry.
        pushes = push_checked(engine, result.image_id, tags, on_progress=on_progress, on_transfer=on_transfer)
    elif options.push and from_buildkit:
        pushes = _buildkit_pushes(result, tags)  # the build pushed as it exported
    elif options.push:
        pushes = [engine.push(tag, on_progress=on_progress, on_transfer=on_transfer) for tag in tags]
    return pushes, sizes, groups, image_labels, cold


HOLD_TAG = "imgbuild-hold"  # the tag an image keeps between its build and its checked push


def hold_tag(tag: str) -> str:
    """REPO:imgbuild-hold-<random>: the checked image's own tag until it is pushed, unique to this build."""
    return f"{split_tag(tag)[0]}:{HOLD_TAG}-{uuid.uuid4().hex[:12]}"


def release_hold(engine: Engine, hold: str) -> None:
    """Remove the hold tag; the image stays under its own tags (or REPO:rejected). Never raises: the
    build's own outcome, a push or a refusal, is what the user must see."""
    with contextlib.suppress(Exception):
        engine.untag(hold)


def push_checked(engine: Engine, image_id: str, tags: tuple[str, ...], *, on_progress: LineSink | None = None,
                 on_transfer: TransferSink | None = None) -> list[PushResult]:
    """Push ``image_id``, the image whose tests and budget passed, under ``tags``: each tag is set on
    it again first (another build of the same recipe may have moved it meanwhile), then pushed, then
    the registry's answer is held to it (``verify_pushed``)."""
    pushes = []
    for tag in tags:
        engine.tag(image_id, tag)
        pushed = engine.push(tag, on_progress=on_progress, on_transfer=on_transfer)
        verify_pushed(image_id, pushed)
        pushes.append(pushed)
    return pushes


def verify_pushed(image_id: str, pushed: PushResult) -> None:
    """The registry's manifest under ``pushed.ref`` is the tested image: its digest is the image's id
    (the containerd store names an image by its manifest or index) or its config is (the classic
    store and podman name it by its config, whose digest covers every layer's content). Else the
    push is a failure: a tag moved between the test and the push."""
    manifest, digest, _ = oci.get_manifest(pushed.ref)
    config = (manifest.get("config") or {}).get("digest")
    if image_id in (pushed.digest, digest, config):
        return
    raise RegistryError(
        f"{pushed.ref} is not the image that was tested ({image_id[:19]}): the registry holds manifest "
        f"{digest[:19]} with config {str(config)[:19]}",
        hint="another build or an image prune moved the tag between the tests and the push; build again "
             "(nothing else builds this tag meanwhile)")


def _reject_over_budget(engine: Engine, image_id: str, tags: tuple[str, ...], size: int, budget: int,
                        groups: dict[str, int], plan: BuildPlan, rejected_as: str | None = None) -> None:
    rejected = keep_as_rejected(engine, image_id, tags, rejected_as)
    breakdown = ", ".join(f"{g} {human_size(b)}" for g, b in groups.items())
    raise BudgetExceeded(
        f"image {image_id[:19]} is {human_size(size)}, over the recipe's budget of "
        f"{human_size(budget)}: {breakdown}; kept as {rejected}",
        hint=f"see `imgbuild inspect {rejected}` for the biggest layers; {budget_advice(plan.recipe)}")


def rejected_tag(tag: str, variant: str | None = None) -> str:
    """The tag a refused image keeps: REPO:rejected, or REPO:rejected-VARIANT for a matrix variant,
    whose siblings share its repository (one tag for all, each refused variant overwrote the last)."""
    return f"{split_tag(tag)[0]}:{REJECTED_TAG}" + (f"-{variant}"[:128 - len(REJECTED_TAG)] if variant else "")


def keep_as_rejected(engine: Engine, image_id: str, tags: tuple[str, ...], rejected: str | None = None) -> str:
    """A refused image (over its budget, tests failed) loses the tags we gave it (nothing may push
    or run it by them) and is kept as ``rejected`` (default REPO:rejected), so the error can name
    something to inspect."""
    rejected = rejected or rejected_tag(tags[0])
    engine.tag(image_id, rejected)
    for tag in tags:
        if tag != rejected:
            engine.untag(tag)
    return rejected


def budget_advice(recipe: Recipe) -> str:
    """What shrinks an image over its budget, for the recipe at hand: a runtime flavor only
    where the recipe asks for devel without compiling at run time."""
    if recipe.cuda.flavor == "devel" and not recipe.runtime_compile:
        return ("cuda.flavor: runtime leaves the CUDA compilers out (build.from_source still compiles, in a "
                "builder stage), or drop heavy pins")
    return ("drop heavy pins, keep weights and data out of copy: (imgbuild weights push), or raise "
            "budget.max_size if the size is expected")


def _buildkit_pushes(result: BuildResult, tags: tuple[str, ...]) -> list[PushResult]:
    """What BuildKit pushed: every tag at the digest its metadata file names."""
    if not result.digest:
        raise RegistryError("the build pushed but its metadata file has no containerimage.digest",
                            hint="is the buildx plugin older than 0.10? push with --engine docker")
    return [PushResult(f"{split_tag(t)[0]}@{result.digest}", split_tag(t)[1], result.digest, None, 1) for t in tags]


def _build(engine: Engine, request: BuildRequest, on_line: LineSink) -> BuildResult:
    # A failure comes back as BuildFailed naming the step, its last lines and the known cause
    # (engine/buildlog.py), a full disk included.
    return engine.build(request, on_line)


def _local_digest(engine: Engine, ref: str) -> str | None:
    """The base image's registry digest where the engine knows one (pulled, not imported)."""
    try:
        digests = (engine.image_attrs(ref) or {}).get("RepoDigests") or []
    except ImgbuildError:
        return None
    for d in digests:
        if "@" in d:
            return d.split("@", 1)[1]
    return None
