"""Commands that start what a recipe built: run (weights onto host volumes, then docker run),
compose (a compose.yaml that does the same)."""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildkit_py.cli.common import (
    AddCommand,
    Out,
    engine_option,
    file_lines,
    image_config,
    is_recipe,
    json_option,
    network_option,
    plan_recipe,
    progress_option,
    reading_engine,
    tag_options,
)
from buildkit_py.cli.progress import transfer_view
from buildkit_py.errors import EnvironmentProblem, UsageError
from buildkit_py.files import write_atomic
from buildkit_py.sizes import human_size

if TYPE_CHECKING:
    from buildkit_py.engine import Engine
    from buildkit_py.engine.run import ImageStart, RunPlan
    from buildkit_py.recipe.model import Recipe


@dataclass(frozen=True)
class DryRun:
    """What `run --dry-run` prints: the run's plan, as its --json document or as its text."""

    plan: RunPlan

    def to_json(self) -> dict[str, Any]:
        from buildkit_py.engine.run import dry_run_json

        return dry_run_json(self.plan)

    def lines(self) -> list[str]:
        run, process = self.plan, self.plan.process
        return [*(f"would pull {w.ref} -> {w.host_dir} (mounted read-only at {w.mount})" for w in run.weights),
                f"would run  {run.command_line}",
                *([f"container  {shlex.join(process.argv)}", f"           {process.how}"] if process is not None
                  else [])]


def register_run(add: AddCommand) -> None:
    rn = add("run", "Weights listed in the recipe (or the image's io.imgbuild.weights label) are pulled into\n"
             "--weights-dir (a second run downloads nothing) and mounted read-only. GPU flags are added\n"
             "when the engine offers GPUs: the NVIDIA runtime or CDI specs (--gpus auto; docker: --gpus all;\n"
             "podman: --device nvidia.com/gpu=all). The engine is --engine's, else $IMGBUILD_ENGINE's.\n\n"
             "The command after -- follows docker's rule: with an image ENTRYPOINT it is passed to the\n"
             "ENTRYPOINT as arguments; --entrypoint replaces the ENTRYPOINT. imgbuild prints which applies.\n\n"
             "  imgbuild run recipes/inference-slim.yaml -- --workers 2      # uvicorn serve:app ... --workers 2\n"
             "  imgbuild run recipes/inference-slim.yaml --entrypoint python -- -m serve\n"
             "  imgbuild run recipes/inference-slim.yaml --entrypoint '' -- python -m serve")
    rn.add_argument("target", help="a recipe file (runs its first tag) or an image")
    rn.add_argument("--dry-run", action="store_true", help="print what would be pulled and run; do nothing")
    rn.add_argument("--weights-dir", type=Path, default=None,
                    help="host folder for weights (default $IMGBUILD_WEIGHTS_DIR, /var/lib/imgbuild/weights as root)")
    rn.add_argument("--gpus", choices=["auto", "all", "none"], default="auto")
    rn.add_argument("--entrypoint", metavar="CMD", default=None,
                    help="replace the image's ENTRYPOINT (docker run --entrypoint; it also drops the image's CMD); "
                         "'' removes it, so the command after -- runs as given")
    network_option(rn, None, "docker run --network (default: the engine's)")
    rn.add_argument("--docker-arg", action="append", default=[], metavar="ARG",
                    help="extra docker run (podman run) argument, repeatable "
                         "(e.g. --docker-arg=-p --docker-arg=8000:8000)")
    engine_option(rn)
    json_option(rn, "with --dry-run: the plan as JSON")
    progress_option(rn, "weights download progress")
    rn.set_defaults(handler=cmd_run)


def register_compose(add: AddCommand) -> None:
    cp = add("compose")
    cp.add_argument("recipe", type=Path)
    cp.add_argument("-o", "--output", type=Path, default=None, help="file to write (default: stdout)")
    tag_options(cp, "image to run instead of the recipe's first tag", "prefix the image with this registry")
    json_option(cp, 'one JSON document on stdout ("schema": 1): image, compose (the document), output')
    cp.set_defaults(handler=cmd_compose)


def cmd_run(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py.artifacts import weights
    from buildkit_py.cli.settings import settings_of
    from buildkit_py.engine.run import (
        ImageStart,
        RunOptions,
        container_name,
        make_run_plan,
        run_container,
    )
    from buildkit_py.plan.labels import weights_from_labels

    if args.json and not args.dry_run:
        raise UsageError("run --json prints the plan: use it with --dry-run",
                         hint="without --dry-run the container's own output goes to stdout")
    engine = reading_engine(args)
    from_recipe = is_recipe(args.target)
    if from_recipe:
        plan = plan_recipe(args, Path(args.target))
        image = plan.tags[0]
        pairs = [(w.ref, w.mount) for w in plan.recipe.weights]
        start = _recipe_start(engine, image, plan.recipe)
    else:
        image = args.target
        config = image_config(engine, image)
        pairs = weights_from_labels(config.get("Labels") or {})
        start = ImageStart(tuple(config.get("Entrypoint") or ()), tuple(config.get("Cmd") or ()))
    try:
        gpu_available = engine.gpu_available()
    except EnvironmentProblem:
        if not args.dry_run:
            raise
        gpu_available = False  # no engine here: a dry run still says what would run
    if from_recipe and not args.dry_run:  # before any weight is downloaded
        _require_built(engine, image, Path(args.target))
    options = RunOptions(root=args.weights_dir or settings_of(args).weights_root, gpus=args.gpus, network=args.network,
                         extra=tuple(args.docker_arg), command=tuple(args.container_command),
                         entrypoint=args.entrypoint)
    run = make_run_plan(image, pairs, options, engine=engine, gpu_available=gpu_available, start=start)
    process = run.process
    if args.dry_run:
        out.document(DryRun(run), as_json=args.json)
        return 0
    if process is not None and not process.argv:
        raise UsageError(f"{image} has no ENTRYPOINT or CMD: nothing would run",
                         hint=f"give the command after --: imgbuild run {args.target} -- CMD...")
    for w in run.weights:  # the pull makes the folder (and names it when it cannot)
        with transfer_view(out.stderr, args.progress) as progress:
            # force: the folder is imgbuild's own copy of this reference (named after it), so a tag
            # that moved gets its new files in place of the old; each replaced file is named below.
            res = weights.pull(w.ref, w.host_dir, progress=progress, force=True,
                               on_wait=partial(out.info, f"waiting for another pull into {w.host_dir} to end"))
        out.info(f"weights {w.ref}: {human_size(res.downloaded_bytes)} downloaded, {len(res.skipped)} files already "
                 "present" + (f", {len(res.replaced)} replaced ({', '.join(res.replaced)})" if res.replaced else ""))
    assert run.spec is not None  # noqa: S101 - make_run_plan writes it
    # named, so that an interrupt removes the container and not only its client
    spec = replace(run.spec, name=container_name())
    out.info(f"running {shlex.join(engine.run_argv(spec))}")
    if process is not None:
        out.info(f"  container runs {shlex.join(process.argv)}: {process.how}")
    out.stdout.flush()
    return run_container(engine, spec, what=f"container of {image}").code


def _recipe_start(engine: Engine, image: str, recipe: Recipe) -> ImageStart:
    """ENTRYPOINT and CMD of a recipe's image: the built image's own (its base may set them), else
    the recipe's."""
    from buildkit_py.engine.run import ImageStart
    from buildkit_py.errors import ImgbuildError

    try:
        info = engine.image(image)
    except ImgbuildError:
        info = None  # no engine here (a dry run): the recipe says
    if info is not None:
        config = info.config
        return ImageStart(tuple(config.get("Entrypoint") or ()), tuple(config.get("Cmd") or ()))
    return ImageStart(recipe.entrypoint, recipe.cmd, source="recipe")


def _require_built(engine: Engine, image: str, recipe: Path) -> None:
    """A recipe's image must be in the local engine, or (for a registry tag) in its registry:
    else `docker run` would fail with 125 after every weight was downloaded."""
    from buildkit_py import oci
    from buildkit_py.errors import ImageMissing, ManifestNotFound

    if engine.image(image) is not None:
        return
    ref = oci.parse_reference(image)
    if ref.registry != oci.DOCKER_HUB:  # docker run pulls a registry tag itself, if it is there
        try:
            oci.read_manifest(ref)
            return
        except ManifestNotFound:
            pass
    raise ImageMissing(f"image {image} (from {recipe}) is not built: not in the local engine"
                       + ("" if ref.registry == oci.DOCKER_HUB else f" nor in {ref.registry}"),
                       hint=f"build it first: imgbuild build {recipe}")


@dataclass(frozen=True)
class Composed:
    """`compose`'s result: the compose document for the image, and as text the compose.yaml itself
    (nothing on stdout when it went to --output)."""

    image: str
    compose: dict[str, Any]  # the document compose.yaml holds
    text: str  # compose.yaml: a header comment, then the document
    output: Path | None

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image, "compose": self.compose, "output": str(self.output) if self.output else None}

    def lines(self) -> list[str]:
        return file_lines(self.text, written=self.output)


def cmd_compose(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py.engine.run import compose_document, compose_text

    plan = plan_recipe(args, args.recipe)
    text = compose_text(plan.tags[0], plan.recipe)
    if args.output:
        write_atomic(args.output, text)
        out.info(f"wrote {args.output}")
    composed = Composed(plan.tags[0], compose_document(plan.tags[0], plan.recipe), text, args.output or None)
    out.document(composed, as_json=args.json)
    return 0
