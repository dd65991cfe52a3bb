"""The pipeline, assembled once: recipe -> resolution (against the base's facts and what the
plan-time look-up found) -> plan. Every command and library user goes through here; the layers
below it (recipe < compat < plan < render < engine, oci < analysis) import only downward
(tests/test_layers.py), and the CLI above it only draws what it returns.

``plan_recipe`` is the one way from a recipe file to a ``BuildPlan``; ``load_matrix`` the one way to
its variants. Both read the registry of a named base (``bases``) and the torch look-up cache
(``lookups``); nothing below them does.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path

from buildkit_py.analysis.lint import LintReport, lint_plan
from buildkit_py.compat.bases import BaseFacts
from buildkit_py.compat.resolve import resolve
from buildkit_py.compat.rules import LookedUp
from buildkit_py.pipeline import lookups
from buildkit_py.pipeline.bases import resolve_with_base
from buildkit_py.pipeline.lookups import OFFLINE, Lookup
from buildkit_py.plan import matrix as mx
from buildkit_py.plan.build_plan import BuildPlan, make_plan
from buildkit_py.recipe.model import Recipe, load_recipe
from buildkit_py.render.dockerfile import render_dockerfile


def facts_for(recipe: Recipe, lookup: Lookup, *, warn: Callable[[str], None] | None = None,
              note: Callable[[str], None] | None = None) -> LookedUp:
    """What the recipe's resolution may need beyond the shipped data (pipeline.lookups)."""
    return lookups.looked_up(recipe, lookup, warn=warn, note=note)


def plan_recipe(path: Path | Recipe, *, lookup: Lookup, tags: tuple[str, ...] = (), registry: str | None = None,
                warn: Callable[[str], None] | None = None,
                note: Callable[[str], None] | None = None) -> BuildPlan:
    """A recipe file -> its BuildPlan: loaded and validated, the facts it needs looked up, resolved
    against its base's facts, planned. A Recipe already loaded is planned as it is (build --platform
    puts its platforms in the recipe's place first: recipe.model.with_platforms). The clock's date
    (NVIDIA's image end of life) is read here, not in the resolver. ``lookup``: how the index and
    the look-up cache are reached (``OFFLINE``: neither)."""
    recipe = path if isinstance(path, Recipe) else load_recipe(path)
    looked_up = facts_for(recipe, lookup, warn=warn, note=note)
    resolution = resolve_with_base(recipe, looked_up=looked_up, today=datetime.date.today())
    return make_plan(recipe, resolution, tags=tags, registry=registry)


def plan_from_data(recipe: Recipe, *, tags: tuple[str, ...] = (), registry: str | None = None,
                   today: datetime.date | None = None) -> BuildPlan:
    """A loaded recipe planned from the shipped data alone: no base, index or cache looked up (the
    benchmarks and the tests plan this way; commands go through ``plan_recipe``). ``today``:
    default the clock's date."""
    return make_plan(recipe, resolve(recipe, today=today or datetime.date.today()), tags=tags, registry=registry)


def lint_recipe(path: Path, *, hadolint: str | None = "auto", cache: Path | None = None) -> LintReport:
    """A recipe's lint report: planned as `plan --offline` plans it (with the look-up ``cache``),
    then its findings and its Dockerfile's (hadolint)."""
    plan = plan_recipe(path, lookup=Lookup(offline=True, cache=cache))
    return lint_plan(plan, render_dockerfile(plan), hadolint=hadolint)


def load_matrix(path: Path, *, lookup: Lookup | None = None, today: datetime.date | None = None) -> mx.Matrix:
    """A recipe file -> its matrix of variants, each resolved against its base's facts (each base
    looked up once) and the torch releases the look-up cache (``lookup.cache``) holds."""
    bases: dict[str, BaseFacts | None] = {}
    lookup = lookup or Lookup()
    looked_up = LookedUp(torch=lookups.cached_torch_releases(lookup.cache), offline=lookup.offline)
    day = today or datetime.date.today()
    return mx.load_matrix(path, resolver=lambda recipe: resolve_with_base(recipe, cache=bases, looked_up=looked_up,
                                                                          today=day))


__all__ = ["OFFLINE", "BuildPlan", "LookedUp", "Lookup", "facts_for", "lint_recipe", "load_matrix", "plan_from_data",
           "plan_recipe", "resolve_with_base"]
