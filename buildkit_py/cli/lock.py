"""imgbuild lock: pin bases by digest and every pip package by hash, in RECIPE.lock."""

from __future__ import annotations

import argparse
from pathlib import Path

from buildkit_py.cli.common import (
    AddCommand,
    Out,
    ca_option,
    engine_option,
    json_option,
    plan_recipe,
    progress_option,
    reading_engine,
)
from buildkit_py.cli.progress import Activity
from buildkit_py.cli.settings import settings_of


def register(add: AddCommand) -> None:
    lk = add("lock", "Resolve the recipe for the image's Python and platform and write RECIPE.lock beside it:\n"
             "bases by digest, every wheel with its version and sha256, assigned to the pip step that\n"
             "installs it. `imgbuild build` then installs exactly that (pip --require-hashes).")
    lk.add_argument("recipe", type=Path)
    ca_option(lk, "CA bundle for reaching the package index")
    engine_option(lk)
    json_option(lk)
    progress_option(lk, "what is being resolved")
    lk.set_defaults(handler=cmd_lock)


def cmd_lock(args: argparse.Namespace, out: Out) -> int:
    import time

    from buildkit_py import pipeline
    from buildkit_py.pipeline import locks
    from buildkit_py.plan import lock
    from buildkit_py.plan import matrix as mx

    matrix = pipeline.load_matrix(args.recipe, lookup=settings_of(args).lookup(args))
    mx.require_variants(matrix, "lock")
    if [v.source for v in matrix.variants] == ["recipe"]:  # no matrix: the plan `build` makes
        plans = {lock.DEFAULT_VARIANT: plan_recipe(args, args.recipe)}
    else:  # every variant the matrix keeps, as `build --all` plans them
        plans = {v.id: mx.variant_plan(v) for v in matrix.variants}
    started = time.monotonic()
    with Activity.for_option(out.stderr, args.progress) as activity:
        data = locks.lock_recipe(plans, ca_cert=args.ca_cert, engine=reading_engine(args), on_status=activity,
                                 resolver=settings_of(args).pip_resolver())
    path = lock.lock_path(args.recipe)
    changed = lock.write_lock(path, lock.dump_lock(data))
    seconds = time.monotonic() - started
    for vid, variant in data.variants.items():
        for note in lock.variant_notes(variant):
            out.warn(note if len(plans) == 1 else f"[{vid}] {note}")
    out.document(locks.LockWritten(path, changed, seconds, data.variants), as_json=args.json)
    return 0
