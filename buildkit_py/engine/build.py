"""The engine's side of a build: the build context and secrets, the image's layer groups, the
tags a refused or held image keeps, and the checked push (tag, push, read back). The build's
sequence (pre-flight, build, measure, budget, tests, push, verify, SBOM, signing) is
``pipeline/build.py``; nothing here runs tests or decides what is refused.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from buildkit_py import oci
from buildkit_py.engine import (
    CA_SECRET_ID,
    BuildResult,
    Engine,
    ImageSizes,
)
from buildkit_py.engine.cold_start import ColdStartPrediction
from buildkit_py.engine.push import PushResult, TransferSink, split_tag
from buildkit_py.errors import ImgbuildError, RegistryError, UsageError
from buildkit_py.plan.build_plan import SOURCE_DATE_EPOCH, BuildPlan
from buildkit_py.plan.history import attribute_entries
from buildkit_py.plan.steps import CopyStep
from buildkit_py.recipe.model import Recipe

LineSink = Callable[[str], None]
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
    test: bool = False  # the recipe's tests pass before the image keeps its tags (pipeline/build.py runs them)
    source_date_epoch: str | None = None  # the image's created time where set (the CLI: $SOURCE_DATE_EPOCH)


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


def build_args() -> dict[str, str]:
    """The build args of every build, as `imgbuild build` passes them (buildx) and the bake file gives
    each target. SOURCE_DATE_EPOCH dates the image config (its ``created``) and history: fixed, the
    time the layers' files carry, so that two builds of the same inputs give one image. Not the
    recipe's created time: BuildKit puts the arg into every RUN's environment, so every step's cache
    key follows it, and a time that moves with any input (a lock rewritten, an app file) re-ran every
    step (the first attempt at issue 33: 1, reverted). When the inputs changed is the
    org.opencontainers.image.created label's to say (pipeline/sources.created_time)."""
    return {"SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)}


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
    # A file of fixed text (ContextFile.dated: the mount stubs' tree) is dated SOURCE_DATE_EPOCH with its
    # folders, after the last write: a COPY of it then gives the same layer on every build. Never one
    # whose text changes (a lock's requirements): buildx's context transfer skips a file whose size and
    # mtime match the last transfer of a context of the same name, so a corrupted hash (same size) went
    # unseen, measured on Docker 26.
    for f in (f for f in plan.context_files if f.dated):
        for path in (Path(f.path), *(p for p in Path(f.path).parents if p != Path("."))):
            os.utime(context / path, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH), follow_symlinks=False)
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
    entries = [{"created_by": e.created_by} for e in history]  # the image config's spelling, which it reads
    for attribution, entry in zip(attribute_entries(entries, step_groups), history, strict=False):
        groups[attribution.group] = groups.get(attribution.group, 0) + entry.size
    return {g: b for g, b in sorted(groups.items(), key=lambda kv: -kv[1]) if b}


REJECTED_TAG = "rejected"  # an image refused after its build (over budget, tests failed) keeps only this tag


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


def buildkit_pushes(result: BuildResult, tags: tuple[str, ...]) -> list[PushResult]:
    """What BuildKit pushed: every tag at the digest its metadata file names."""
    if not result.digest:
        raise RegistryError("the build pushed but its metadata file has no containerimage.digest",
                            hint="is the buildx plugin older than 0.10? push with --engine docker")
    return [PushResult(f"{split_tag(t)[0]}@{result.digest}", split_tag(t)[1], result.digest, None, 1) for t in tags]


def local_digest(engine: Engine, ref: str) -> str | None:
    """The base image's registry digest where the engine knows one (pulled, not imported)."""
    try:
        info = engine.image(ref)
    except ImgbuildError:
        return None
    return info.registry_digest() if info is not None else None
