"""imgbuild matrix: a recipe's matrix expanded into variants, a CI matrix or a bake file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from buildkit_py.cli.common import AddCommand, Out, ca_option, json_option
from buildkit_py.errors import UsageError


def register(add: AddCommand) -> None:
    mx = add("matrix", "expand a recipe's matrix: variants kept and dropped (with reasons), a CI matrix or a bake file",
             "Expand the recipe's matrix: into the variants kept and those dropped by the compatibility\n"
             "check, each with its reason; or into a GitHub Actions strategy.matrix (at most 256 jobs), a\n"
             "GitLab parallel:matrix (at most 200) or a docker-bake.json (one target per variant,\n"
             "per-target registry cache, shared base stages as targets of their own).")
    mx.add_argument("recipe", type=Path)
    mx.add_argument("--format", choices=["text", "json", "github", "gitlab", "bake"], default=None,
                    help="text (default), json, github, gitlab or bake")
    json_option(mx, 'same as --format json: one JSON document ("schema": 1)')
    mx.add_argument("--registry", help="prefix tags and cache refs with this registry, e.g. 127.0.0.1:5000")
    ca_option(mx, "bake: pass this CA bundle to every target as the cacert secret")
    mx.add_argument("--push", action="store_true", help="bake: variant targets push their tags instead of loading")
    mx.set_defaults(handler=cmd_matrix)


def cmd_matrix(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py.plan import matrix as mx

    if args.json and args.format not in (None, "json"):
        raise UsageError(f"matrix: --json is --format json; it cannot go with --format {args.format}")
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
        bake = mx.bake_file(matrix, registry=args.registry, ca_cert=args.ca_cert, push=args.push)
        out.line(json.dumps(bake, indent=2))
    return 0
