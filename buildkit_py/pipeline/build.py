"""One image built, in one straight sequence: pre-flight -> build -> measure -> budget -> test ->
push -> verify (``build_checked``), then SBOM -> sign (``publish``); ``build_image`` is the two.

Each step is a call that returns a value. The recipe's tests are run here, on the image in the
engine, not handed down to the engine as a callback; a refused image (over budget, tests failed)
is kept as REPO:rejected and the error raised says so from the start. The engine does only
engine work (build, tag, push, inspect: engine/build.py), so adding a step (signing was one) is
one line here. ``pipeline.matrix_build`` maps ``build_checked`` over a matrix's variants.

Order matters for "nothing half-written": everything that can be refused (capabilities,
missing CA file, budget of the result, the tests) is checked before the image keeps its tags
and before anything is pushed.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildkit_py import oci
from buildkit_py.analysis.diff import SOURCE_REGISTRY, read_engine, read_image
from buildkit_py.analysis.image_checks import PASSED, TestReport, failure_of, run_image_tests
from buildkit_py.engine import (
    ENGINE_STORE,
    PROVENANCE,
    PUSH,
    BuildRequest,
    Engine,
    ImageSizes,
    cold_start,
    require,
    required_capabilities,
)
from buildkit_py.engine.build import (
    BuildOptions,
    BuildOutcome,
    assemble_context,
    build_args,
    build_platforms,
    build_secrets,
    buildkit_pushes,
    hold_tag,
    keep_as_rejected,
    layer_groups,
    local_digest,
    push_checked,
    registry_compressed_size,
    release_hold,
)
from buildkit_py.engine.cold_start import ColdStartPrediction, NodeLayer, StartTime
from buildkit_py.engine.push import PushResult, TransferSink, check_can_push
from buildkit_py.errors import BudgetExceeded, ImgbuildError, SbomError, SignatureError
from buildkit_py.files import write_atomic
from buildkit_py.pipeline.sources import volatile_labels
from buildkit_py.plan.build_plan import BuildPlan, check_image_tag
from buildkit_py.plan.installer import UV_ENV_SECRET_ID, uv_env_for
from buildkit_py.plan.lock import DEFAULT_VARIANT, lock_entry, wheel_hashes
from buildkit_py.recipe.model import CudaFlavor, Recipe
from buildkit_py.render.dockerfile import render_dockerfile
from buildkit_py.sizes import human_size

if TYPE_CHECKING:
    from buildkit_py.analysis.sbom import AttachedSbom
    from buildkit_py.compat.codes import RecipeWarning
    from buildkit_py.oci.signatures import SignedManifest, SigningKey

__all__ = ["BuildDocument", "BuildOptions", "BuildOutcome", "BuildReport", "Publishing", "build_checked",
           "build_image", "build_platforms", "publish", "push_json"]

LineSink = Callable[[str], None]


def _drop(_line: str) -> None:
    pass


@dataclass(frozen=True)
class Sinks:
    """Where a build's progress goes (the CLI draws it): the engine's log lines, imgbuild's own
    notes (the push, each test's verdict) and a push's bytes."""

    on_line: LineSink = _drop
    on_progress: LineSink | None = None
    on_transfer: TransferSink | None = None
    on_event: LineSink | None = None  # each test's verdict as it comes
    on_note: LineSink = _drop  # what happens after the push (the SBOM read)


NO_SINKS = Sinks()


@dataclass(frozen=True)
class Publishing:
    """What follows a push: the SBOM (with each wheel's sha256 from the lock beside ``recipe``, for
    ``variant``) unless ``sbom`` is off, then the signatures with ``key`` (None: none)."""

    recipe: Path
    sbom: bool = True
    key: SigningKey | None = None
    variant: str = DEFAULT_VARIANT


@dataclass(frozen=True)
class BuildReport:
    """A build's result: what the engine built and pushed (``outcome``), the test report of each
    platform tested (none when not tested), and the SBOMs and signatures attached after the push."""

    outcome: BuildOutcome
    tests: tuple[TestReport, ...] = ()
    sboms: tuple[AttachedSbom, ...] = ()
    signatures: tuple[SignedManifest, ...] = ()

    @property
    def pushed(self) -> list[str]:
        return [p.ref for p in self.outcome.pushes]


def push_json(p: PushResult) -> dict[str, Any]:
    """A push as the --json documents list it (build, build --all)."""
    return {"ref": p.ref, "tag": p.tag, "digest": p.digest, "size": p.size}


@dataclass(frozen=True)
class BuildDocument:
    """What `build` prints: its --json document (``to_json``) and its text (``lines``) both read
    these fields, so the two cannot disagree."""

    image_id: str
    tags: tuple[str, ...]
    size: int  # uncompressed bytes
    engine: str
    sizes: ImageSizes | None
    seconds: float  # as measured: the JSON rounds it, the text shows one decimal
    steps_run: int
    steps_cached: int
    steps_rerun: tuple[str, ...]
    groups: dict[str, int]
    labels: dict[str, str]
    warnings: tuple[RecipeWarning, ...]
    pushes: tuple[PushResult, ...]
    sboms: tuple[AttachedSbom, ...]
    signatures: tuple[SignedManifest, ...]
    tests: tuple[TestReport, ...]  # one per platform tested, in platform order
    cold_start: ColdStartPrediction | None
    platforms: tuple[str, ...]

    @classmethod
    def of(cls, report: BuildReport, warnings: tuple[RecipeWarning, ...],
           platforms: tuple[str, ...]) -> BuildDocument:
        """``warnings``: the plan's, as the command planned it; ``platforms``: those it built."""
        outcome, r = report.outcome, report.outcome.result
        return cls(r.image_id, r.tags, outcome.size, outcome.engine, outcome.sizes, r.seconds, r.run_steps,
                   r.cached_steps, r.rerun, outcome.groups, outcome.labels, warnings, outcome.pushes,
                   report.sboms, report.signatures, report.tests, outcome.cold_start, platforms)

    def to_json(self) -> dict[str, Any]:
        return {
            "image_id": self.image_id, "tags": list(self.tags), "size": self.size, "engine": self.engine,
            "backend": self.engine,  # the older name of "engine", kept for scripts that read it
            "size_uncompressed": self.sizes.uncompressed if self.sizes else None,
            "size_compressed": self.sizes.compressed if self.sizes else None,
            "seconds": round(self.seconds, 2), "steps_run": self.steps_run, "steps_cached": self.steps_cached,
            "steps_rerun": list(self.steps_rerun), "groups": self.groups, "labels": self.labels,
            "warnings": [w.to_json() for w in self.warnings],
            "pushes": [push_json(p) for p in self.pushes],
            "sboms": [s.to_json() for s in self.sboms],
            "signatures": [s.to_json() for s in self.signatures],
            "tests": self.tests[-1].to_json() if self.tests else None,
            "cold_start": self.cold_start.to_json() if self.cold_start else None,
            "platforms": list(self.platforms),
            # a multi-platform build tests each platform's image: one report each, in platform order
            "platform_tests": [t.to_json() for t in self.tests] if len(self.platforms) > 1 else [],
        }

    def lines(self) -> list[str]:
        """The text: the image, its size and steps, its tests, pushes, SBOMs and signatures."""
        compressed = self.sizes.compressed if self.sizes else None
        out = [f"image    {self.image_id}", f"tags     {', '.join(self.tags)}",
               f"size     {human_size(self.size)} ({self.size} bytes) uncompressed"
               + (f", {human_size(compressed)} compressed" if compressed else ""),
               f"steps    {self.steps_run} run, {self.steps_cached} cached, {self.seconds:.1f}s"]
        for t in self.tests:  # one per platform of a multi-platform build, each named by its image (platform)
            out.append(f"tests    {t.summary()}" + (f" ({t.image})" if len(self.tests) > 1 else ""))
        if not self.tests:
            out.append("tests    not run (they run before --push, or with --test)")
        if self.cold_start:
            out.append(f"start    {self.cold_start.summary()}")
        out += [f"pushed   {p.ref}" for p in self.pushes]
        out += [f"sbom     {s.ref} ({s.components} components, {s.via}) for {s.subject} ({s.platform})"
                for s in self.sboms]
        many = len(self.signatures) > 1
        out += [f"signed   {g.digest} ({g.platform or 'index' if many else 'manifest'}, {g.tag})"
                for g in self.signatures]
        return out


def build_image(plan: BuildPlan, engine: Engine, options: BuildOptions, *, publishing: Publishing | None = None,
                sinks: Sinks = NO_SINKS) -> BuildReport:
    """The whole build of one image: built, measured, held to its budget, tested (``options.test``),
    pushed and read back (``build_checked``), then its SBOM attached and its manifests signed
    (``publish``)."""
    report = build_checked(plan, engine, options, sinks.on_line, on_progress=sinks.on_progress,
                           on_transfer=sinks.on_transfer, on_event=sinks.on_event)
    return publish(report, publishing, on_note=sinks.on_note) if publishing is not None else report


def build_checked(plan: BuildPlan, engine: Engine, options: BuildOptions, on_line: LineSink,
                  on_progress: LineSink | None = None, on_transfer: TransferSink | None = None, *,
                  on_event: LineSink | None = None) -> BuildReport:
    """``preflight``, then ``build_preflighted``."""
    preflight(engine, [(plan, options)])
    return build_preflighted(plan, engine, options, on_line, on_progress, on_transfer, on_event=on_event)


def build_preflighted(plan: BuildPlan, engine: Engine, options: BuildOptions, on_line: LineSink,
                      on_progress: LineSink | None = None, on_transfer: TransferSink | None = None, *,
                      on_event: LineSink | None = None) -> BuildReport:
    """Build on ``engine`` what ``preflight`` passed; push from BuildKit where the engine can (PUSH:
    buildx), else through the engine (``engine.push``). The image is kept in the engine when asked
    (--load), when a budget or the recipe's tests (``options.test``) must pass first, or when the
    engine keeps every image anyway (ENGINE_STORE: not a named builder). An image refused by either
    keeps only REPO:rejected, and nothing is pushed."""
    dockerfile = render_dockerfile(plan)
    secrets = build_secrets(options.ca_cert, options.pip_config)
    # uv reads no pip.conf: its steps get the translation (UV_* variables) as a secret of their own.
    uv_env = uv_env_for(plan, options.pip_config, ca_cert=options.ca_cert is not None)
    tags = _tags(plan, options)
    node = node_images(plan.recipe)  # before the build: a node image that cannot be read fails fast
    # A budget and the tests are checked on the image in the engine before anything is pushed.
    checked_first = plan.recipe.max_size is not None or plan.recipe.cold_start is not None or options.test
    keep_local = options.load or checked_first or not options.push or ENGINE_STORE in engine.capabilities
    with tempfile.TemporaryDirectory(prefix="imgbuild-") as tmp:
        # An image checked before its push also gets a tag of its own until it is pushed: another build
        # of the same recipe taking the tags meanwhile would otherwise leave it untagged, which the
        # containerd store drops (and the push of the checked image would find nothing)
        hold = hold_tag(tags[0]) if options.push and checked_first else None
        request = _request(plan, engine, options, (dockerfile, secrets, uv_env, Path(tmp)),
                           tags + ((hold,) if hold else ()), load=keep_local,
                           push=options.push and PUSH in engine.capabilities and not checked_first)
        # A failure comes back as BuildFailed naming the step, its last lines and the known cause
        # (engine/buildlog.py), a full disk included.
        result = replace(engine.build(request, on_line), tags=tags)
        try:
            measured = _measure(engine, plan, result.image_id, keep_local=keep_local)
            _check_budget(engine, plan, result.image_id, tags, measured, options.rejected)
            tests = _test(engine, plan, result.image_id, tags, options, on_event)
            cold = _check_cold_start(engine, plan, result.image_id, tags, measured, tests, options.rejected, node)
            pushes = _push(engine, result.image_id, result, options, checked_first=checked_first,
                           progress=(on_progress, on_transfer))
        finally:
            if hold:
                release_hold(engine, hold)
    sizes, groups, image_labels = _read_back(measured, pushes)
    outcome = BuildOutcome(plan, engine.name, result, sizes.uncompressed if sizes else 0, tuple(pushes), groups,
                           labels=image_labels, sizes=sizes, cold_start=cold)
    return BuildReport(outcome, tests=tests)


# What the built image measures in the engine: its sizes (None when it is not there), bytes per
# layer group and its labels.
Measured = tuple[ImageSizes | None, dict[str, int], dict[str, str]]


def _tags(plan: BuildPlan, options: BuildOptions) -> tuple[str, ...]:
    """The tags the image gets: the options' where they name some (build --tag), else the plan's."""
    return plan.tags if not options.tags else options.tags


def preflight(engine: Engine, builds: Sequence[tuple[BuildPlan, BuildOptions]]) -> None:
    """Everything refused before any build starts, for every image about to be built (one, or each
    variant of a matrix with its own options): the tags' grammar, what the engine cannot do, the
    registry's credentials (each registry asked once, for all of them)."""
    pushed: list[str] = []
    for plan, options in builds:
        tags = _tags(plan, options)
        for tag in tags:  # reach argv and the registry, never a shell: check the grammar, exit 2
            check_image_tag(tag)
        probe = BuildRequest(Path("."), Path("Dockerfile"), tags, cache_from=options.cache_from,
                             cache_to=options.cache_to, builder=options.builder, compression=options.compression,
                             oci_mediatypes=options.oci_mediatypes, provenance=options.provenance,
                             platforms=options.platforms)
        require(engine, required_capabilities(plan.needs, probe))
        if options.push:
            pushed += tags
    if pushed:  # wrong credentials fail now, not after the whole build
        check_can_push(pushed)


def _request(plan: BuildPlan, engine: Engine, options: BuildOptions,
             written: tuple[str, dict[str, Path], str | None, Path], tags: tuple[str, ...], *, push: bool,
             load: bool) -> BuildRequest:
    """The engine's build request: the Dockerfile, the context and uv's settings (``written``) written
    into the folder it names, with the volatile labels and the secrets."""
    dockerfile, secrets, uv_env, tmp = written
    # No attestation unless asked for: BuildKit's provenance carries the build's start time and a
    # random invocation id, so with it every build, even of nothing changed, gets a new digest.
    provenance = options.provenance
    if provenance is None and PROVENANCE in engine.capabilities:
        provenance = "false"
    # A base pinned at plan time carries its digest as a static label already.
    base_digest = None if plan.resolution.base_digest else local_digest(engine, plan.resolution.base_image)
    volatile = volatile_labels(plan.recipe, source_date_epoch=options.source_date_epoch, base_digest=base_digest)
    context, dockerfile_path = assemble_context(plan, dockerfile, tmp)
    if uv_env is not None:  # beside the context, never in it
        secrets = {**secrets, UV_ENV_SECRET_ID: tmp / UV_ENV_SECRET_ID}
        write_atomic(secrets[UV_ENV_SECRET_ID], uv_env, private=True)
    return BuildRequest(
        context_dir=context, dockerfile=dockerfile_path, tags=tags,
        labels=volatile, secrets=secrets,
        network=options.network, no_cache=options.no_cache, cache_from=options.cache_from,
        cache_to=options.cache_to, builder=options.builder, push=push,
        load=load, compression=options.compression, oci_mediatypes=options.oci_mediatypes,
        provenance=provenance, platforms=options.platforms, build_args=build_args(),
    )


def _measure(engine: Engine, plan: BuildPlan, image_id: str, *, keep_local: bool) -> Measured:
    sizes = engine.image_sizes(image_id) if keep_local and image_id else None
    groups = layer_groups(engine, image_id, plan) if sizes else {}
    info = engine.image(image_id) if sizes else None
    return sizes, groups, dict(sorted(info.labels.items())) if info is not None else {}


def _check_budget(engine: Engine, plan: BuildPlan, image_id: str, tags: tuple[str, ...], measured: Measured,
                  rejected_as: str | None) -> None:
    budget = plan.recipe.max_size
    sizes, groups, _ = measured
    if budget is not None and sizes and sizes.uncompressed > budget:
        _reject_over_budget(engine, image_id, tags, sizes.uncompressed, budget, groups, plan, rejected_as)


def _test(engine: Engine, plan: BuildPlan, image_id: str, tags: tuple[str, ...], options: BuildOptions,
          on_event: LineSink | None) -> tuple[TestReport, ...]:
    """The recipe's tests, where asked for; an image that fails them is kept as REPO:rejected, which
    the error raised names."""
    tests = run_tests(engine, image_id, plan.recipe, tags[0], options.platforms, on_event) if options.test else ()
    failed = next((r for r in tests if r.failed), None)
    if failed is not None:
        kept = keep_as_rejected(engine, image_id, tags, options.rejected)
        raise failure_of(failed, kept_as=kept, reports=tests)
    return tests


def _check_cold_start(engine: Engine, plan: BuildPlan, image_id: str, tags: tuple[str, ...], measured: Measured,
                      tests: tuple[TestReport, ...], rejected_as: str | None,
                      node: tuple[tuple[NodeLayer, ...], ...] = ()) -> ColdStartPrediction | None:
    """A fresh node's start, predicted (engine/cold_start.py) from the image's sizes, the layers the node
    already holds (``node``: budget.cold_start.node) and the time its first test took; over
    budget.cold_start the image is kept as REPO:rejected and BudgetExceeded raised."""
    sizes, _, _ = measured
    if not sizes:
        return None
    started = next((s for s in map(entrypoint_start, tests) if s is not None), None)
    budget = plan.recipe.cold_start
    layers = built_layers(engine, image_id)  # per layer: the pull's timeline, and what the node holds
    cold = cold_start.build_prediction(budget, sizes.compressed, sizes.uncompressed, started, layers=layers,
                                       node=node)
    if budget and cold and cold_start.over_budget(budget, cold):
        cold_start.check_budget(cold, budget, image_id, keep_as_rejected(engine, image_id, tags, rejected_as))
    return cold


def node_images(recipe: Recipe) -> tuple[tuple[NodeLayer, ...], ...]:
    """The layers of each image of ``budget.cold_start.node``, read from its registry as `imgbuild diff
    --node` reads them (manifest and config: diff ids and compressed sizes, no blob read)."""
    out = []
    for ref in recipe.cold_start.node if recipe.cold_start else ():
        try:
            image = read_image(ref, source=SOURCE_REGISTRY, uncompressed=False)
        except ImgbuildError as exc:  # the same error, its exit status kept, saying which key named the image
            exc.message = f"budget.cold_start.node: {ref}: {exc.message}"
            exc.hint = exc.hint or "name an image the node holds by its registry reference, and push it first"
            raise
        out.append(tuple(NodeLayer(x.diff_id, x.compressed_size or 0) for x in image.layers))
    return tuple(out)


def built_layers(engine: Engine, image_id: str) -> tuple[tuple[str, int], ...]:
    """The built image's (diff id, unpacked bytes) per layer, bottom first, from its engine; empty where
    the engine's history does not give each layer's size (the prediction then holds nothing on the node)."""
    layers = read_engine(image_id, engine).layers
    if any(x.size is None for x in layers):
        return ()
    return tuple((x.diff_id, x.size or 0) for x in layers)


def entrypoint_start(report: TestReport) -> StartTime | None:
    """The time of the recipe's first ``test:`` command, its container's start included: what a node
    pays after the pull before the image does its work (budget.cold_start); None where none ran."""
    for r in report.results:
        if r.kind == "command" and r.status == PASSED:
            return StartTime(r.seconds, f"test {r.name!r}")
    return None


def _read_back(measured: Measured, pushes: list[PushResult]) -> Measured:
    """After a push: what a pull really downloads, from the registry's manifest, and the labels of an
    image pushed from a builder without loading it (none were read from the engine)."""
    sizes, groups, image_labels = measured
    if pushes:
        compressed = registry_compressed_size(pushes[0].ref)
        if compressed is not None:
            sizes = ImageSizes(sizes.uncompressed if sizes else 0, compressed)
        if not image_labels:
            image_labels = dict(sorted(oci.read_image_config(pushes[0].ref).labels.items()))
    return sizes, groups, image_labels


def run_tests(engine: Engine, image_id: str, recipe: Recipe, shown_as: str, platforms: tuple[str, ...],
               on_event: LineSink | None) -> tuple[TestReport, ...]:
    """The recipe's tests on the built image, before it keeps its tags and is pushed: every platform's
    image of a multi-platform build (arm64 under qemu), up to the first whose tests fail."""
    reports: list[TestReport] = []
    for platform in platforms or (None,):
        report = run_image_tests(engine, image_id, recipe=recipe, on_event=on_event or _drop, platform=platform,
                                 shown_as=f"{shown_as} ({platform})" if platform else shown_as)
        reports.append(report)
        if report.failed:
            break
    return tuple(reports)


def _push(engine: Engine, image_id: str, result: Any, options: BuildOptions, *, checked_first: bool,
          progress: tuple[LineSink | None, TransferSink | None]) -> list[PushResult]:
    """The push: of the checked image itself where something was checked, else as the build did it."""
    on_progress, on_transfer = progress
    tags = result.tags
    if options.push and checked_first and image_id:
        # The image that was checked is pushed, from the engine's store: never a second build
        # that trusts the cache (a --no-cache build of the same recipe or a prune meanwhile made
        # it push another image), and each push is then read back from the registry.
        return push_checked(engine, image_id, tags, on_progress=on_progress, on_transfer=on_transfer)
    if options.push and PUSH in engine.capabilities:
        return buildkit_pushes(result, tags)  # the build pushed as it exported
    if options.push:
        return [engine.push(tag, on_progress=on_progress, on_transfer=on_transfer) for tag in tags]
    return []


def _reject_over_budget(engine: Engine, image_id: str, tags: tuple[str, ...], size: int, budget: int,
                        groups: dict[str, int], plan: BuildPlan, rejected_as: str | None = None) -> None:
    rejected = keep_as_rejected(engine, image_id, tags, rejected_as)
    breakdown = ", ".join(f"{g} {human_size(b)}" for g, b in groups.items())
    raise BudgetExceeded(
        f"image {image_id[:19]} is {human_size(size)}, over the recipe's budget of "
        f"{human_size(budget)}: {breakdown}; kept as {rejected}",
        hint=f"see `imgbuild inspect {rejected}` for the biggest layers; {budget_advice(plan.recipe)}")


def budget_advice(recipe: Recipe) -> str:
    """What shrinks an image over its budget, for the recipe at hand: a runtime flavor only
    where the recipe asks for devel without compiling at run time."""
    if recipe.cuda.flavor == CudaFlavor.DEVEL and not recipe.runtime_compile:
        return ("cuda.flavor: runtime leaves the CUDA compilers out (build.from_source still compiles, in a "
                "builder stage), or drop heavy pins")
    return ("drop heavy pins, keep weights and data out of copy: (imgbuild weights push), or raise "
            "budget.max_size if the size is expected")


# --- after the push ------------------------------------------------------------------------------


def publish(report: BuildReport, publishing: Publishing, *, on_note: LineSink = _drop) -> BuildReport:
    """After a push: its SBOM attached, then each pushed manifest signed (nothing without a push)."""
    sboms = attach_sboms(report.pushed, publishing, on_note=on_note)
    return replace(report, sboms=tuple(sboms), signatures=tuple(sign_pushes(publishing.key, report.pushed)))


def attach_sboms(pushed: list[str], publishing: Publishing, *, on_note: LineSink = _drop) -> list[AttachedSbom]:
    """After a push: the SBOM of what the pushed image carries, attached to it (unless --no-sbom),
    with each wheel's sha256 from the recipe's lock when there is one (a build uses it when it
    is there; a stale one was refused before building)."""
    if not pushed or not publishing.sbom:
        return []
    from buildkit_py.analysis.sbom import attach_after_push  # noqa: PLC0415 - cyclonedx only for an SBOM

    hashes = wheel_hashes(lock_entry(publishing.recipe, publishing.variant))
    on_note(f"sbom     reading what {pushed[0]} carries from its layers, to attach its SBOM")
    try:
        return attach_after_push(pushed, hashes=hashes)
    except ImgbuildError as exc:
        raise SbomError(f"pushed {pushed[0]}, but could not attach its SBOM: {exc.render()}",
                        hint=f"`imgbuild sbom {pushed[0]} --generate --attach` tries again; --no-sbom pushes "
                             "without one") from exc


def sign_pushes(key: SigningKey | None, pushed: list[str]) -> list[SignedManifest]:
    """After a push (and its SBOMs): each pushed repository@digest signed as cosign does, the
    index and each platform's manifest (a push of several tags to one repository is one digest)."""
    if key is None or not pushed:
        return []
    from buildkit_py.oci.signatures import sign_image  # noqa: PLC0415 - cryptography only to sign

    signed = []
    for ref in dict.fromkeys(pushed):
        try:
            signed += sign_image(ref, key)
        except ImgbuildError as exc:
            raise SignatureError(f"pushed {ref}, but could not sign it: {exc.render()}",
                                 hint=f"`imgbuild sign {ref} --key KEY` tries again") from exc
    return signed
