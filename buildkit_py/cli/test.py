"""imgbuild test: the tests of a built image on their own (what `build --push` runs before it
pushes), and the gate `build` hands to the engine layer."""

from __future__ import annotations

import argparse
from collections.abc import Callable
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
from buildkit_py.errors import ExitStatus

if TYPE_CHECKING:
    from buildkit_py.analysis.image_checks import TestReport
    from buildkit_py.engine import Engine
    from buildkit_py.recipe.model import Recipe


def register(add: AddCommand) -> None:
    t = add("test", "Run an image's tests, as `imgbuild build` runs them before it pushes:\n"
            "  - every io.imgbuild.* label checked against what the image holds (CUDA runtime version,\n"
            "    CUDA wheels of the flavor, cuDNN, torch, Python, OS, installer; the recipe digest with a recipe),\n"
            "  - the import of each pinned package (torch from its label when no recipe is given),\n"
            "  - the recipe's test: commands (a RECIPE only; gpu: true ones are skipped, with the reason,\n"
            "    where the engine has no GPU runtime).\n"
            "Containers run with no network. Exit 0 when none failed, 1 when one did (each failed\n"
            "command's output shown once), 2 for a bad recipe, 3 without an engine.\n\n"
            "  imgbuild test recipes/inference-slim.yaml          # the recipe's image (its first tag)\n"
            "  imgbuild test 127.0.0.1:5000/team/app:1            # labels and torch only\n"
            "  imgbuild test app.yaml --tag team/app:rejected     # an image build refused")
    t.add_argument("target", help="a recipe file (tests its first tag, or --tag) or an image in the engine")
    tag_options(t, "with a RECIPE: test this image instead of the recipe's first tag",
                "with a RECIPE: prefix its tags with this registry, as build --registry does")
    t.add_argument("--no-defaults", action="store_true",
                   help="run only the recipe's test: commands, not the label and import checks")
    engine_options(t)
    progress_option(t, "one line per test")
    json_option(t, 'one JSON document on stdout ("schema": 1): image, gpu, passed, failed, skipped, results '
                   "(name, kind label|import|command, status, detail, command, exit_code, output)")
    offline_options(t)
    t.set_defaults(handler=cmd_test)


def cmd_test(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py.analysis.image_checks import run_image_tests
    from buildkit_py.errors import ImageMissing

    engine = reading_engine(args)
    recipe = None
    if is_recipe(args.target):
        plan = plan_recipe(args, Path(args.target), out)
        recipe, image = plan.recipe, plan.tags[0]
    else:
        image = args.target
    if engine.image_attrs(image) is None:
        raise ImageMissing(f"no image {image} in the {engine.describe()}",
                           hint=f"build it first (imgbuild build {args.target})" if recipe else
                           f"pull it first (docker pull {image}): tests run on the engine's own copy")
    report = run_image_tests(engine, image, recipe=recipe, defaults=not args.no_defaults,
                             on_event=None if args.json else out.info)
    if args.json:
        out.data(report.to_json())
    else:
        print_failures(report, out)
        out.line(f"tests    {image}: {report.summary()}")
    return ExitStatus.FAILED if report.failed else 0


def print_failures(report: TestReport, out: Out) -> None:
    """Each failed test's output, once (the one-line verdicts went by as progress)."""
    for r in report.failed:
        if r.output:
            out.line(f"--- output of {r.name} ({r.command}) ---\n{r.output}\n--- end of output ---")


def build_gate(engine: Engine, recipe: Recipe, shown_as: str, on_event: Callable[[str], None],
               reports: list[TestReport], platforms: tuple[str, ...] = ()) -> Callable[[str], None]:
    """What `build` runs on the image before it keeps its tags and pushes: every test, refused
    with ImageTestFailed when one fails; each report is appended to ``reports``. ``platforms``:
    every platform's image of a multi-platform build is tested (arm64 under qemu)."""
    from buildkit_py.analysis.image_checks import require_passed, run_image_tests

    def gate(image_id: str) -> None:
        for platform in platforms or (None,):
            report = run_image_tests(engine, image_id, recipe=recipe, on_event=on_event, platform=platform,
                                     shown_as=f"{shown_as} ({platform})" if platform else shown_as)
            reports.append(report)
            require_passed(report)

    return gate
