"""imgbuild matrix: a recipe's matrix expanded into variants, a CI matrix or a bake file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from buildkit_py.cli.common import AddCommand, Out, ca_option, json_option, pip_config_option
from buildkit_py.cli.settings import settings_of
from buildkit_py.errors import UsageError

if TYPE_CHECKING:
    from buildkit_py.plan.matrix import Matrix


def register(add: AddCommand) -> None:
    mx = add("matrix", "Expand the recipe's matrix: into the variants kept and those dropped by the compatibility\n"
             "check, each with its reason; or into a GitHub Actions strategy.matrix (at most 256 jobs), a\n"
             "GitLab parallel:matrix (at most 200) or, with -o DIR, a bake folder: docker-bake.json (one\n"
             "target per variant, per-target registry cache, shared base stages as targets of their own),\n"
             "compose.yaml (network: host for buildx < 0.17) and each target's build context. Then:\n\n"
             "  imgbuild matrix RECIPE --format bake --registry R -o bake/ && cd bake && docker buildx bake")
    mx.add_argument("recipe", type=Path)
    mx.add_argument("--format", choices=["text", "json", "github", "gitlab", "bake"], default=None,
                    help="text (default), json, github, gitlab or bake")
    json_option(mx, 'same as --format json: one JSON document ("schema": 1)')
    mx.add_argument("--registry", help="prefix tags and cache refs with this registry, e.g. 127.0.0.1:5000")
    ca_option(mx, "bake: pass this CA bundle to every target as the cacert secret")
    mx.add_argument("--push", action="store_true", help="bake: variant targets push their tags instead of loading")
    pip_config_option(mx, "bake: pass this pip.conf to every target as the pipconf secret")
    mx.add_argument("-o", "--output", type=Path, default=None, metavar="DIR",
                    help="bake: the folder to write (new, empty, or an earlier bake folder); required")
    mx.set_defaults(handler=cmd_matrix)


def cmd_matrix(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py import pipeline
    from buildkit_py.plan import matrix as mx

    if args.json and args.format not in (None, "json"):
        raise UsageError(f"matrix: --json is --format json; it cannot go with --format {args.format}")
    fmt = args.format or ("json" if args.json else "text")
    if args.output is not None and fmt != "bake":
        raise UsageError(f"-o {args.output}: only --format bake writes a folder", hint="other formats print to stdout")
    if fmt == "bake" and args.output is None:
        raise UsageError("--format bake writes a folder: the bake file, its compose.yaml and each target's "
                         "build context (files imgbuild writes, e.g. the mount stubs' .imgbuild/root and lock "
                         "requirements)",
                         hint="add -o DIR, then run `docker buildx bake` in DIR")
    matrix = pipeline.load_matrix(args.recipe, lookup=settings_of(args).lookup(args))
    mx.require_variants(matrix, {"github": "put in a GitHub Actions matrix", "gitlab": "put in a GitLab matrix",
                                 "bake": "bake"}.get(fmt, "list"))
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
    else:
        _write_bake(args, matrix, out)
    return 0


def _write_bake(args: argparse.Namespace, matrix: Matrix, out: Out) -> None:
    from buildkit_py.pipeline.matrix_build import write_bake

    written = write_bake(matrix, args.output, registry=args.registry, ca_cert=args.ca_cert,
                         pip_config=args.pip_config, push=args.push, warn=out.warn)
    for path in written:
        out.info(f"wrote    {path}")
    out.info(f"run      cd {args.output} && docker buildx bake")
