"""imgbuild build: one recipe, or the variants of its matrix (--all, --variant)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildkit_py.cli.common import (
    AddCommand,
    Out,
    ca_option,
    engine_options,
    json_option,
    network_option,
    offline_options,
    pip_config_option,
    plan_recipe,
    progress_option,
    reading_engine,
)
from buildkit_py.cli.progress import StepView
from buildkit_py.cli.settings import settings_of
from buildkit_py.errors import ExitStatus, UsageError
from buildkit_py.sizes import human_size

if TYPE_CHECKING:
    from rich.console import Console

    from buildkit_py.pipeline import BuildPlan
    from buildkit_py.pipeline.build import BuildOptions, Publishing
    from buildkit_py.plan.lock import LockMode


def register(add: AddCommand) -> None:
    b = add("build", "Build a recipe with BuildKit (docker buildx, or DOCKER_BUILDKIT=1 with a 20.10 client) or\n"
            "podman (--engine podman).\n"
            "Prints the image id, tags and size; after --push, each registry reference and its digest.")
    b.add_argument("recipe", type=Path)
    b.add_argument("--tag", action="append", default=[], help="tag instead of NAME:VERSION (repeatable)")
    b.add_argument("--push", action="store_true",
                   help="push every tag after the build, once the image's tests pass (see `imgbuild test`)")
    testing = b.add_mutually_exclusive_group()
    testing.add_argument("--test", action="store_true",
                         help="run the image's tests after the build even without --push (a failure keeps the "
                              "image only as REPO:rejected, exit 1)")
    testing.add_argument("--no-test", action="store_true",
                         help="push without running the image's tests (a warning says so)")
    b.add_argument("--no-sbom", action="store_true",
                   help="with --push: attach no SBOM (by default a CycloneDX SBOM of what the image carries is "
                        "attached to the pushed image as an OCI referrer; see `imgbuild sbom`)")
    b.add_argument("--sign", type=Path, metavar="KEY",
                   help="with --push: sign each pushed manifest (the index and each platform's) in cosign's format "
                        "with KEY, a PEM EC P-256 private key (read before building; see `imgbuild sign`)")
    b.add_argument("--registry", help="prefix tags with this registry, e.g. 127.0.0.1:5000")
    ca_option(b, "CA bundle for downloads inside the build, passed as a BuildKit secret (never in a layer)")
    pip_config_option(b, "pip.conf for every pip step (e.g. a private index-url with credentials), passed as a "
                         "BuildKit secret read through PIP_CONFIG_FILE (never in a layer)")
    network_option(b, "host", "network for RUN steps (default: host; 'default' for the engine's)")
    b.add_argument("--no-cache", action="store_true", help="ignore the layer cache")
    progress_option(b, "build log")
    engine_options(b)
    b.add_argument("--load", action="store_true",
                   help="with --push on a named builder: also load the image into the engine")
    b.add_argument("--compression", metavar="ALGO[:LEVEL]",
                   help="layer compression of the pushed image: gzip[:0-9] or zstd[:0-22] (buildx)")
    b.add_argument("--oci-mediatypes", action="store_true", help="OCI media types in the manifest (buildx)")
    b.add_argument("--provenance", choices=["min", "max", "false"], default=None,
                   help="attach a provenance attestation (buildx with the containerd store or a builder; "
                        "default false: an attestation holds the build's start time and a random id, so every "
                        "build, even of an unchanged recipe, would get a new digest)")
    b.add_argument("--platform", action="append", default=[], metavar="OS/ARCH",
                   help="build for this platform instead of the recipe's platforms: (repeatable: linux/amd64 and "
                        "linux/arm64 make one index of both; each pin is checked for each platform first)")
    b.add_argument("--cache-from", action="append", default=[], metavar="REF",
                   help="import build cache (e.g. type=registry,ref=R/cache or an image built with inline cache)")
    b.add_argument("--cache-to", action="append", default=[], metavar="REF",
                   help="export build cache (buildx only), e.g. type=registry,ref=R/cache,mode=max")
    json_option(b, "print a JSON report on stdout")
    b.add_argument("--all", action="store_true",
                   help="build every variant of the recipe's matrix here (shared stages once), then print a "
                        "summary; exit 1 if any failed")
    b.add_argument("--variant", action="append", default=[], metavar="ID",
                   help="build this matrix variant (repeatable; ids from `imgbuild matrix RECIPE`)")
    b.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                   help="with --all: build up to N variants at once (default 1)")
    offline_options(b)
    locking = b.add_mutually_exclusive_group()
    locking.add_argument("--update-lock", action="store_true",
                         help="re-resolve and rewrite the recipe's lock file, then build with it")
    locking.add_argument("--locked", action="store_true",
                         help="CI: fail (exit 1) if the lock file is missing or would change; never write it")
    b.set_defaults(handler=cmd_build)


def _build_options(args: argparse.Namespace, out: Out) -> BuildOptions:
    from buildkit_py.pipeline.build import BuildOptions

    return BuildOptions(
        tags=(), push=args.push, ca_cert=args.ca_cert, pip_config=args.pip_config,
        network=None if args.network == "default" else args.network, no_cache=args.no_cache,
        cache_from=tuple(args.cache_from), cache_to=tuple(args.cache_to), builder=args.builder,
        load=args.load, compression=args.compression, oci_mediatypes=args.oci_mediatypes,
        provenance=args.provenance, platforms=tuple(args.platform), test=_testing(args, out),
        source_date_epoch=settings_of(args).source_date_epoch,
    )


def _publishing(args: argparse.Namespace) -> Publishing:
    """What follows a push: the SBOM unless --no-sbom, the signatures with --sign's key (read
    before building: a bad key fails in a second, not after the push)."""
    from buildkit_py.pipeline.build import Publishing

    return Publishing(args.recipe, sbom=not args.no_sbom, key=_signing_key(args))


def _lock_mode(args: argparse.Namespace) -> LockMode:
    from buildkit_py.plan.lock import LockMode

    return LockMode.UPDATE if args.update_lock else LockMode.LOCKED if args.locked else LockMode.AUTO


def _testing(args: argparse.Namespace, out: Out) -> bool:
    """Whether the built images are tested before they keep their tags: with --push or --test,
    not with --no-test (which, with --push, is said aloud)."""
    if args.no_test and args.push:
        out.warn("--no-test: pushing without running the image's tests")
    return bool((args.push or args.test) and not args.no_test)


def cmd_build(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py.engine import select_engine
    from buildkit_py.pipeline.bases import verify_base
    from buildkit_py.pipeline.build import BuildDocument, Sinks, build_image, build_platforms
    from buildkit_py.pipeline.locks import use_lock
    from buildkit_py.plan.lock import LockStatus

    if args.jobs < 1:
        raise UsageError(f"-j {args.jobs}: the number of parallel builds must be at least 1")
    if args.sign and not args.push:
        raise UsageError("--sign signs the pushed image: use it with --push",
                         hint="or sign an image pushed before: imgbuild sign IMAGE --key KEY")
    if args.all or args.variant:
        return cmd_build_matrix(args, out)
    if args.jobs != 1:
        raise UsageError(f"-j {args.jobs} builds matrix variants in parallel: use it with --all or --variant",
                         hint="one recipe without --all is one build")
    plan = plan_recipe(args, args.recipe, out)
    for w in plan.warnings:
        out.warn(w.render())
    # Before the engine is chosen: a stale lock is refused even where no engine runs.
    locked = use_lock(plan, mode=_lock_mode(args), ca_cert=args.ca_cert, engine=reading_engine(args),
                      resolver=settings_of(args).pip_resolver())
    plan = verify_base(locked.plan)  # base.verify: an unsigned shared base stops here, before building
    for note in locked.warnings:
        out.warn(note)
    if locked.status != LockStatus.NONE:
        out.info(f"lock     {locked.path} ({locked.status})")
    publishing = _publishing(args)
    engine = select_engine(settings_of(args).engine, builder=args.builder)
    # the recipe's platforms (or --platform's, which plan_recipe put in its place): one index of them
    options = replace(_build_options(args, out), platforms=build_platforms(plan.recipe, tuple(args.platform)))

    out.info(f"building {', '.join(plan.tags)} with the {engine.describe()}"
             + (f" for {', '.join(options.platforms)}" if options.platforms else ""))
    with StepView.for_option(out.stderr, args.progress) as view:
        built = build_image(plan, engine, options, publishing=publishing, sinks=Sinks(
            on_line=view.line, on_progress=view.note, on_transfer=view.transfer, on_event=view.note,
            on_note=out.info))
    out.document(BuildDocument.of(built, plan.warnings, options.platforms), as_json=args.json)
    return 0


def _signing_key(args: argparse.Namespace) -> Any:
    """--sign's key, read before building: a bad key fails in a second, not after the push."""
    if not args.sign:
        return None
    from buildkit_py.cli.sign import signing_key

    return signing_key(args.sign)


def cmd_build_matrix(args: argparse.Namespace, out: Out) -> int:
    """build --all / --variant: the matrix's variants, N at a time, one summary at the end."""
    from buildkit_py import pipeline
    from buildkit_py.engine import select_engine
    from buildkit_py.pipeline.bases import verify_base
    from buildkit_py.pipeline.locks import use_lock
    from buildkit_py.pipeline.matrix_build import BuildHooks, MatrixBuildDocument, build_all, publish_all
    from buildkit_py.plan import matrix as mx

    if args.all and args.variant:
        raise UsageError("use --all or --variant, not both")
    matrix = pipeline.load_matrix(args.recipe, lookup=settings_of(args).lookup(args))
    mx.select_variants(matrix, tuple(args.variant), jobs=args.jobs, tags=tuple(args.tag))  # before any output
    for w in mx.dropped_warnings(matrix):
        out.warn(w)
    publishing = _publishing(args)
    engine = select_engine(settings_of(args).engine, builder=args.builder)
    options = _build_options(args, out)
    lock_mode = _lock_mode(args)

    def prepare(variant: mx.Variant, plan: BuildPlan) -> BuildPlan:
        locked = use_lock(plan, mode=lock_mode, variant=variant.id, ca_cert=args.ca_cert, engine=engine,
                          resolver=settings_of(args).pip_resolver())
        for w in [pw.render() for pw in plan.warnings] + list(locked.warnings):
            out.warn(f"[{variant.id}] {w}")
        return verify_base(locked.plan)

    out.info(f"building {'all ' if args.all else ''}{len(args.variant) or len(matrix.variants)} variant(s) of "
             f"{matrix.name} with the {engine.describe()}, {args.jobs} at a time")
    with StepView.for_option(out.stderr, args.progress) as view:
        hooks = BuildHooks(on_line=lambda vid, line: view.line(line, vid), on_event=view.note, prepare=prepare)
        result = build_all(matrix, engine, options, jobs=args.jobs, registry=args.registry,
                           variant_ids=tuple(args.variant), tags=tuple(args.tag), hooks=hooks)
    result = publish_all(result, publishing, on_note=out.info)
    document = MatrixBuildDocument(result)
    if args.json or not out.stdout.isatty():
        out.document(document, as_json=args.json)
    else:  # a terminal: the summary as a table, read from the same document
        summary_table(document.to_json(), out.console())
        for line in document.artifact_lines():
            out.line(line)
    return ExitStatus.FAILED if result.failed else 0


def summary_table(report: dict[str, Any], console: Console) -> None:
    """The matrix summary (``pipeline.matrix_build.build_report``) as a rich table, for a terminal; pipes
    and CI logs get ``pipeline.matrix_build.summary_lines``, plain and stable."""
    from rich.table import Table

    table = Table(title=report["name"], title_justify="left")
    for column in ("variant", "status", "size", "digest", "time", "cached", "tags"):
        table.add_column(column, justify="right" if column in ("size", "time", "cached") else "left")
    for v in report["variants"]:
        ok = v["status"] == "ok"
        steps = (v.get("steps_cached") or 0) + (v.get("steps_run") or 0)
        table.add_row(v["variant"], "[green]ok[/]" if ok else "[bold red]FAILED[/]",
                      human_size(v["size"]) if ok else "-",
                      (v.get("digest") or "").replace("sha256:", "")[:12] or "-",
                      f"{v['seconds']:.1f}s", f"{v['steps_cached']}/{steps}" if ok else "-", ", ".join(v["tags"]))
    console.print(table)
    console.print(f"{report['ok']} built, {report['failed']} failed, {len(report['dropped'])} dropped, "
                  f"in {report['seconds']:.1f}s", markup=False, highlight=False)
    for v in report["variants"]:
        if v.get("error"):
            console.print(f"{v['variant']}: {v['error']['message']}", markup=False, highlight=False)
