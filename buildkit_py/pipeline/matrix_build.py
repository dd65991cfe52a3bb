"""Building a matrix: every variant of a recipe's matrix on one engine, shared prefixes once.

The plan side (variants, their plans, the stages they share) is ``plan.matrix``; this module
maps ``pipeline.build.build_checked`` over those plans, then publishes (SBOM, signatures) what
was pushed, in variant order, and reports what happened.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from buildkit_py.engine import ENGINE_STORE, Engine, bake
from buildkit_py.engine.build import BuildOptions, BuildOutcome, build_platforms, rejected_tag
from buildkit_py.engine.children import stop_all
from buildkit_py.errors import ImageTestFailed, ImgbuildError
from buildkit_py.pipeline.build import (
    BuildReport,
    Publishing,
    attach_sboms,
    build_preflighted,
    preflight,
    push_json,
    sign_pushes,
)
from buildkit_py.pipeline.locks import use_lock
from buildkit_py.plan.build_plan import BuildPlan
from buildkit_py.plan.matrix import (
    Matrix,
    Variant,
    after_shared,
    build_order,
    matrix_json,
    select_variants,
    shared_stage_plan,
    shared_stage_tag,
    shared_stages,
    variant_plan,
)
from buildkit_py.sizes import human_size

VariantSink = Callable[[str, str], None]  # (variant id, log line)


@dataclass(frozen=True)
class BuildHooks:
    """What a caller plugs into ``build_all``: where log lines and events go, a step run on
    every plan before anything builds (e.g. applying the variant's lock), and the function that
    builds one plan (``build_checked``; tests pass a fake)."""

    on_line: VariantSink | None = None
    on_event: Callable[[str], None] | None = None
    prepare: Callable[[Variant, BuildPlan], BuildPlan] | None = None
    runner: Callable[..., BuildReport] | None = None


NO_HOOKS = BuildHooks()


@dataclass(frozen=True)
class VariantBuild:
    variant: Variant
    plan: BuildPlan
    report: BuildReport | None = None  # when it built
    error: ImgbuildError | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def outcome(self) -> BuildOutcome | None:
        return self.report.outcome if self.report is not None else None

    @property
    def tests(self) -> tuple[Any, ...]:
        """Each platform's test report: of the image built, or of the one whose tests refused it."""
        if self.report is not None:
            return self.report.tests
        return self.error.reports if isinstance(self.error, ImageTestFailed) else ()

    @property
    def digest(self) -> str | None:
        if self.outcome is None:
            return None
        pushed = [p.digest for p in self.outcome.pushes if p.digest]
        return pushed[0] if pushed else self.outcome.result.image_id


@dataclass(frozen=True)
class MatrixBuild:
    matrix: Matrix
    builds: tuple[VariantBuild, ...]
    seconds: float

    @property
    def failed(self) -> tuple[VariantBuild, ...]:
        return tuple(b for b in self.builds if not b.ok)


def build_all(matrix: Matrix, engine: Engine, options: BuildOptions, *, jobs: int = 1,
              registry: str | None = None, variant_ids: tuple[str, ...] = (), tags: tuple[str, ...] = (),
              hooks: BuildHooks = NO_HOOKS) -> MatrixBuild:
    """Build the variants (all, or ``variant_ids``) on one engine, up to ``jobs`` at a time.

    A variant that builds a prefix others share (the stages ``shared_stages`` finds) goes
    first; the variants that share it wait for it, then find it in BuildKit's cache, so each
    shared stage is built once even with ``jobs`` > 1. One failure does not stop the others.
    ``{variant}`` in --cache-from/--cache-to values becomes each variant's id. With ``options.test``
    each variant's image passes its own tests before it keeps its tags and is pushed.
    """
    on_line, prepare, runner = hooks.on_line, hooks.prepare, hooks.runner or build_preflighted
    chosen = select_variants(matrix, variant_ids, jobs=jobs, tags=tags)
    plans = {v.id: variant_plan(v, registry=registry, tags=tags) for v in chosen}
    if prepare is not None:
        plans = {v.id: prepare(v, plans[v.id]) for v in chosen}
    # every variant refused or passed before any builds (each registry asked once); then built
    preflight(engine, [(plans[v.id], _variant_options(v, plans[v.id], options)) for v in chosen])
    stages, chains = shared_stages(plans)
    say = hooks.on_event or (lambda _t: None)
    scratch: tuple[str, ...] = ()  # shared-stage images built for --no-cache, untagged at the end
    if options.no_cache and stages and ENGINE_STORE in engine.capabilities:
        plans, chains, scratch = _prebuild_shared_stages(matrix, plans, engine, options, runner, on_line, say)

    def one(v: Variant) -> VariantBuild:
        plan = plans[v.id]
        opts = _variant_options(v, plan, options)
        start = time.monotonic()
        try:
            report = runner(plan, engine, opts, (lambda line: on_line(v.id, line)) if on_line else (lambda _l: None),
                            on_event=lambda line: say(f"[{v.id}] {line}"))
        except ImgbuildError as exc:
            return VariantBuild(v, plan, error=exc, seconds=time.monotonic() - start)
        return VariantBuild(v, plan, report=report, seconds=time.monotonic() - start)

    start = time.monotonic()
    pending = list(chosen)
    claimed: set[str] = set()
    ready: set[str] = set()
    results: dict[str, VariantBuild] = {}
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="imgbuild-variant") as pool:
        running: dict[Any, Variant] = {}
        try:
            while pending or running:
                for v in list(pending):
                    if len(running) >= jobs:
                        break
                    if any(k in claimed and k not in ready for k in chains[v.id]):
                        continue  # another variant is building a stage this one shares: wait for the cache
                    claimed.update(chains[v.id])
                    pending.remove(v)
                    say(f"[{v.id}] building {', '.join(plans[v.id].tags)}")
                    running[pool.submit(one, v)] = v
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    v = running.pop(fut)
                    result = fut.result()
                    results[v.id] = result
                    ready.update(chains[v.id])
                    say(f"[{v.id}] " + (f"built in {result.seconds:.1f}s" if result.ok
                                        else f"FAILED: {result.error.message.splitlines()[0]}"))
        except KeyboardInterrupt as exc:
            # The interrupt reaches this thread only: the builds the workers wait on are stopped
            # here (engine/children.py), so leaving the pool does not wait for them to finish.
            stop_all(exc)
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    for tag in scratch:  # the variants keep their layers; only the helper tag goes
        engine.remove(tag)
    return MatrixBuild(matrix, tuple(results[v.id] for v in chosen), time.monotonic() - start)


def _variant_options(v: Variant, plan: BuildPlan, options: BuildOptions) -> BuildOptions:
    """A variant's build options: its own platforms, rejected tag and cache references
    (``{variant}`` in --cache-from/--cache-to becomes its id); the tags are its plan's."""
    return replace(options, tags=(), platforms=build_platforms(plan.recipe, options.platforms),
                   rejected=rejected_tag(plan.tags[0], v.id),
                   cache_from=tuple(r.replace("{variant}", v.id) for r in options.cache_from),
                   cache_to=tuple(r.replace("{variant}", v.id) for r in options.cache_to))


def _prebuild_shared_stages(matrix: Matrix, plans: dict[str, BuildPlan], engine: Engine, options: BuildOptions,
                            runner: Callable[..., BuildReport], on_line: VariantSink | None,
                            say: Callable[[str], None]) -> tuple[dict[str, BuildPlan], dict[str, list[str]],
                                                                 tuple[str, ...]]:
    """--no-cache with shared prefixes: the prefix is a run of steps inside each variant's final
    stage, which no per-stage cache filter can reach (and 20.10 has none). So each shared stage
    is built once, without cache, as a local image FROM its parent's, and the variants are then
    built without cache FROM the last one they share, with only their own steps. (A named
    builder cannot see the engine's images: there the variants rebuild the prefix.)"""
    stages, chains = shared_stages(plans)
    built: dict[str, str] = {}
    for key in build_order(stages):
        st = stages[key]
        base = built[st.parent] if st.parent else st.base
        tag = shared_stage_tag(matrix, key)
        shared = replace(shared_stage_plan(st, plans, base), tags=(tag,))
        say(f"[shared] building {', '.join(s.id for s in st.steps)} once for {', '.join(st.users)}")
        sink = (lambda line: on_line("shared", line)) if on_line else (lambda _l: None)
        # a shared stage is no image of the recipe's: its tests run on the variants built from it
        runner(shared, engine, replace(options, tags=(tag,), push=False, cache_to=(), test=False), sink)
        built[key] = tag
    out = dict(plans)
    for vid, chain in chains.items():
        if chain:
            out[vid] = after_shared(plans[vid], chain, stages, built[chain[-1]])
    return out, {vid: [] for vid in plans}, tuple(built.values())


def publish_all(result: MatrixBuild, publishing: Publishing, *,
                on_note: Callable[[str], None] = lambda _t: None) -> MatrixBuild:
    """After the variants' pushes, in variant order: each one's SBOM (with its own lock entry's
    hashes), then each one's signatures. A failure stops here, with every variant built."""
    built = [b for b in result.builds if b.report is not None]
    sboms = {b.variant.id: attach_sboms(b.report.pushed, replace(publishing, variant=b.variant.id), on_note=on_note)
             for b in built if b.report is not None}
    signed = {b.variant.id: sign_pushes(publishing.key, b.report.pushed) for b in built if b.report is not None}
    return replace(result, builds=tuple(
        replace(b, report=replace(b.report, sboms=tuple(sboms[b.variant.id]), signatures=tuple(signed[b.variant.id])))
        if b.report is not None else b for b in result.builds))


def write_bake(matrix: Matrix, folder: Path, *, registry: str | None, ca_cert: Path | None, pip_config: Path | None,
               push: bool, warn: Callable[[str], None]) -> list[Path]:
    """`imgbuild matrix --format bake`: the bake folder (engine/bake.py), each variant's plan with the
    lock beside the recipe applied as build --all applies it; each lock warning told to ``warn``."""
    def prepare(variant: Variant, plan: BuildPlan) -> BuildPlan:
        locked = use_lock(plan, variant=variant.id, ca_cert=ca_cert)
        for w in locked.warnings:
            warn(f"[{variant.id}] {w}")
        return locked.plan

    return bake.write_bake(matrix, folder, registry=registry, ca_cert=ca_cert, pip_config=pip_config, push=push,
                           prepare=prepare)


def build_report(result: MatrixBuild) -> dict[str, Any]:
    variants = []
    for b in result.builds:
        entry: dict[str, Any] = {"variant": b.variant.id, "status": "ok" if b.ok else "failed",
                                 "tags": list(b.plan.tags), "seconds": round(b.seconds, 2)}
        if b.outcome is not None:
            r = b.outcome.result
            entry.update(image_id=r.image_id, digest=b.digest, size=b.outcome.size, steps_run=r.run_steps,
                         steps_cached=r.cached_steps, steps_rerun=list(r.rerun), groups=b.outcome.groups,
                         pushes=[push_json(p) for p in b.outcome.pushes])
        else:
            entry["error"] = b.error.to_json() if b.error else None
        if b.report is not None:
            entry["sboms"] = [s.to_json() for s in b.report.sboms]
            entry["signatures"] = [g.to_json() for g in b.report.signatures]
        entry["tests"] = b.tests[-1].to_json() if b.tests else None  # a multi-platform variant: its last platform
        entry["platform_tests"] = [t.to_json() for t in b.tests] if len(b.tests) > 1 else []
        variants.append(entry)
    return {
        "recipe": str(result.matrix.path), "name": result.matrix.name, "seconds": round(result.seconds, 2),
        "ok": sum(1 for b in result.builds if b.ok), "failed": len(result.failed), "variants": variants,
        "dropped": matrix_json(result.matrix)["dropped"],
    }


@dataclass(frozen=True)
class MatrixBuildDocument:
    """What `build --all`/`--variant` prints: the summary's --json document (build_report) and its
    plain text (summary_lines, then each variant's SBOMs and signatures), both read from the one
    MatrixBuild."""

    result: MatrixBuild

    def to_json(self) -> dict[str, Any]:
        return build_report(self.result)

    def lines(self) -> list[str]:
        return summary_lines(self.result) + self.artifact_lines()

    def artifact_lines(self) -> list[str]:
        """Each built variant's SBOMs, then its signatures (under the table on a terminal, too)."""
        built = [(b.variant.id, b.report) for b in self.result.builds if b.report is not None]
        return ([f"sbom     [{vid}] {s.ref} ({s.components} components, {s.via}) for {s.subject}"
                 for vid, report in built for s in report.sboms]
                + [f"signed   [{vid}] {g.digest} ({g.tag})" for vid, report in built for g in report.signatures])


def summary_lines(result: MatrixBuild) -> list[str]:
    rows = [("VARIANT", "STATUS", "SIZE", "DIGEST", "TIME", "CACHED", "TAGS")]
    for b in result.builds:
        if b.outcome is not None:
            r = b.outcome.result
            digest = (b.digest or "").replace("sha256:", "")[:12]
            rows.append((b.variant.id, "ok", human_size(b.outcome.size), digest, f"{b.seconds:.1f}s",
                         f"{r.cached_steps}/{r.cached_steps + r.run_steps}", ", ".join(b.plan.tags)))
        else:
            rows.append((b.variant.id, "FAILED", "-", "-", f"{b.seconds:.1f}s", "-", ", ".join(b.plan.tags)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=False)) + "  " + r[-1] for r in rows]
    lines.append(f"{len(result.builds) - len(result.failed)} built, {len(result.failed)} failed, "
                 f"{len(result.matrix.dropped)} dropped, in {result.seconds:.1f}s")
    for b in result.failed:
        lines.append(f"{b.variant.id}: {b.error.render() if b.error else 'failed'}")
    return lines
