"""imgbuild test: the tests of a built image on their own (what `build --push` runs before it
pushes: pipeline/build.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from buildkit_py.cli.common import (
    AddCommand,
    Out,
    engine_options,
    is_recipe,
    json_option,
    offline_options,
    plan_recipe,
    progress_option,
    reading_engine,
    tag_options,
)
from buildkit_py.cli.settings import settings_of
from buildkit_py.errors import ExitStatus, UsageError

if TYPE_CHECKING:
    from buildkit_py.analysis.image_checks import TestReport
    from buildkit_py.pipeline.lazy import LazyReport, RemoteLayer
    from buildkit_py.recipe.model import Recipe


def register(add: AddCommand) -> None:
    t = add("test", "Run an image's tests, as `imgbuild build` runs them before it pushes:\n"
            "  - every io.imgbuild.* label checked against what the image holds (CUDA runtime version,\n"
            "    CUDA wheels of the flavor, cuDNN, torch, Python, OS, installer; the recipe digest with a recipe),\n"
            "  - the import of each pinned package (torch from its label when no recipe is given),\n"
            "  - the recipe's test: commands (a RECIPE only; gpu: true ones are skipped, with the reason,\n"
            "    where the engine has no GPU runtime).\n"
            "A recipe's image is tested on every platform the recipe names (platforms:, arm64 under qemu),\n"
            "each platform's report named by its platform; an image on the engine's own platform.\n"
            "Containers run with no network. Exit 0 when none failed, 1 when one did (each failed\n"
            "command's output shown once), 2 for a bad recipe, 3 without an engine.\n\n"
            "  imgbuild test recipes/inference-slim.yaml          # the recipe's image (its first tag)\n"
            "  imgbuild test 127.0.0.1:5000/team/app:1            # labels and torch only\n"
            "  imgbuild test app.yaml --tag team/app:rejected     # an image build refused\n"
            "  imgbuild test app.yaml --platform linux/arm64      # one platform of a two-platform recipe\n"
            "  imgbuild test matrix.yaml --variant cu124-py311    # a matrix variant, by its own pins")
    t.add_argument("target", help="a recipe file (tests its first tag, or --tag) or an image in the engine")
    tag_options(t, "with a RECIPE: test this image instead of the recipe's first tag",
                "with a RECIPE: prefix its tags with this registry, as build --registry does")
    # dest apart from build's --platform: plan_recipe puts that one in the recipe's place, which
    # would change the recipe digest the image's label is checked against
    t.add_argument("--platform", action="append", default=[], dest="test_platforms", metavar="OS/ARCH",
                   help="test this platform's image only (repeatable; with a RECIPE, one of its platforms:); "
                        "default: every platform of the recipe, or the engine's own for an IMAGE")
    t.add_argument("--variant", metavar="ID",
                   help="with a RECIPE that has a matrix: test this variant's image (its first tag, or --tag) "
                        "against the variant's own pins and recipe digest (ids from `imgbuild matrix RECIPE`)")
    t.add_argument("--no-defaults", action="store_true",
                   help="run only the recipe's test: commands, not the label and import checks")
    t.add_argument("--lazy", action="store_true",
                   help="record the files the tests read (each test container under the host's strace) and "
                        "report the share of the image's compressed bytes a lazy-pulling node (eStargz, SOCI) "
                        "fetches before they pass, per layer and in total; an image pushed to a registry is "
                        "measured there, its eStargz layers by their TOC (exact), others by each layer's "
                        "compression ratio (an estimate). The engine's own platform only")
    engine_options(t)
    progress_option(t, "one line per test")
    json_option(t, 'one JSON document on stdout ("schema": 1): image, gpu, platforms, passed, failed, skipped '
                   "(over every platform), results (name, kind label|import|command, status, detail, command, "
                   "exit_code, output, platform), platform_tests (one report per platform: image, platform, "
                   "passed, failed, skipped, results); with --lazy, \"lazy\": image, method, compressed_size, "
                   "needed, fraction, exact, layers (index, digest, compressed_size, files_read, bytes_read, needed, "
                   "fraction, exact), files (path, layer), outside_image, registry_layers (digest, size, "
                   "announced_toc, toc_digest, verified, toc_bytes, landmark)")
    offline_options(t)
    t.set_defaults(handler=cmd_test)


def cmd_test(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py.analysis.image_checks import TestRun, run_image_tests
    from buildkit_py.errors import ImageMissing

    engine = reading_engine(args)
    recipe, image = test_subject(args, out)
    platforms = tested_platforms(recipe, tuple(args.test_platforms))
    if engine.image(image) is None:
        raise ImageMissing(f"no image {image} in the {engine.describe()}",
                           hint=f"build it first (imgbuild build {args.target}"
                                + (f" --variant {args.variant})" if args.variant else ")") if recipe else
                           f"pull it first (docker pull {image}): tests run on the engine's own copy")
    if args.lazy:
        from buildkit_py.pipeline.lazy import lazy_tests

        if platforms and platforms != ("linux/amd64",):
            raise UsageError(f"--lazy traces the engine's own platform's image, not {', '.join(platforms)}'s",
                             hint="test --lazy --platform linux/amd64, or without --platform")
        report, lazy, remote = lazy_tests(engine, image, recipe=recipe, defaults=not args.no_defaults,
                                          on_event=None if args.json else out.info)
        return show_lazy(args, out, image, report, lazy, remote)
    reports = [run_image_tests(engine, image, recipe=recipe, defaults=not args.no_defaults, platform=platform,
                               on_event=None if args.json else out.info) for platform in platforms or (None,)]
    if not args.json:  # each failed test's output, before the verdicts
        for report in reports:
            print_failures(report, out)
    out.document(TestRun(image, tuple(reports)), as_json=args.json)
    return ExitStatus.FAILED if any(r.failed for r in reports) else 0


def show_lazy(args: argparse.Namespace, out: Out, image: str, report: TestReport, lazy: LazyReport,
              remote: list[RemoteLayer] | None) -> int:
    """`test --lazy`'s output: each failed test's output first (text), then the document."""
    from buildkit_py.analysis.image_checks import TestRun
    from buildkit_py.pipeline.lazy import LazyTestRun

    if not args.json:
        print_failures(report, out)
    out.document(LazyTestRun(TestRun(image, (report,)), lazy, tuple(remote) if remote is not None else None),
                 as_json=args.json)
    return ExitStatus.FAILED if report.failed else 0


def test_subject(args: argparse.Namespace, out: Out) -> tuple[Recipe | None, str]:
    """(the recipe the image is judged by, the image): a RECIPE's own first tag (or --tag); a
    matrix variant's (--variant), judged by the variant's pins and digest, not the base recipe's;
    an IMAGE alone."""
    if not is_recipe(args.target):
        if args.variant:
            raise UsageError(f"--variant {args.variant}: a variant is one of a RECIPE's matrix, and "
                             f"{args.target} is an image", hint=f"imgbuild test RECIPE --variant {args.variant}")
        return None, args.target
    if not args.variant:
        plan = plan_recipe(args, Path(args.target), out)
        return plan.recipe, plan.tags[0]
    from buildkit_py import pipeline
    from buildkit_py.plan import matrix as mx

    matrix = pipeline.load_matrix(Path(args.target), lookup=settings_of(args).lookup(args))
    if not matrix.keys:
        raise UsageError(f"--variant {args.variant}: {args.target} has no matrix",
                         hint=f"imgbuild test {args.target} tests its one image")
    plan = mx.variant_plan(matrix.variant(args.variant), registry=args.registry, tags=tuple(args.tag))
    return plan.recipe, plan.tags[0]


def tested_platforms(recipe: Recipe | None, requested: tuple[str, ...]) -> tuple[str, ...]:
    """The platforms whose images are tested, in order: those asked for (with a recipe, each one
    it names: another was never built from it), else each one a recipe builds (build_platforms:
    none where it names linux/amd64 alone), else none: the engine's own platform's image."""
    from buildkit_py.pipeline.build import build_platforms
    from buildkit_py.recipe.model import PLATFORMS

    requested = tuple(dict.fromkeys(requested))
    allowed = recipe.platforms if recipe is not None else PLATFORMS
    for p in requested:
        if p not in allowed:
            where = f"{recipe.path} builds" if recipe is not None else "imgbuild builds"
            raise UsageError(f"--platform {p}: {where} {', '.join(allowed)}",
                             hint="name one of them, once per --platform"
                                  + ("; an image built with build --platform: test the image by its tag, "
                                     "not the recipe" if recipe is not None else ""))
    return requested or (build_platforms(recipe, ()) if recipe is not None else ())


def print_failures(report: TestReport, out: Out) -> None:
    """Each failed test's output, once (the one-line verdicts went by as progress)."""
    for r in report.failed:
        if r.output:
            out.line(f"--- output of {r.name} ({r.command}) on {report.platform} ---\n{r.output}\n"
                     "--- end of output ---")
