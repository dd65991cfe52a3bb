"""A recipe's ``matrix:`` -> variants: each one a Recipe, its Resolution and its tags, or the
compatibility error that dropped it. Then the outputs built on them: a JSON listing, CI
matrices (GitHub Actions, GitLab), a docker-bake.json, and ``build_all``, which builds every
variant on one engine.

The schema, inside a recipe::

    matrix:
      cuda.version: ["12.1", "12.4"]     # any recipe key path -> the list of its values
      python: ["3.10", "3.11"]
      exclude: [{cuda.version: "12.1", python: "3.10"}]   # drops every combination it matches
      include: [{cuda.version: "12.6", torch: "2.6.0"}]   # one extra variant each; unset keys
                                                          # keep the recipe's own values
      tags: ["{version}-cu{cuda_short}-py{python}"]       # tag templates (default {version}-{variant})

Axes combine in the order they are written, values in the order listed, then the includes.
A combination the compatibility engine refuses is dropped and reported with its reason and
hint, never silently. Every variant also gets a content tag, ``sha-<12 hex>`` of its own
recipe digest. Expansion is pure: no I/O beyond reading the recipe.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from buildkit_py.compat.resolve import Resolution
from buildkit_py.errors import (
    CompatibilityError,
    RecipeError,
    RecipeIssue,
    UsageError,
)
from buildkit_py.plan.build_plan import BuildPlan, Stage, StageRole, make_plan
from buildkit_py.plan.steps import Step
from buildkit_py.recipe.model import (
    BASE_KEYS,
    BUDGET_KEYS,
    BUILD_KEYS,
    CUDA_KEYS,
    TAG_RE,
    TOP_KEYS,
    Recipe,
    _Located,
    locate,
    parse_recipe,
    read_recipe_text,
)
from buildkit_py.schemas import closest, line_of, load_schema, prune, validate

GITHUB_MAX_JOBS = 256  # GitHub Actions: a matrix generates at most 256 jobs per workflow run
GITLAB_MAX_JOBS = 200  # GitLab CI: parallel:matrix creates at most 200 jobs
MAX_COMBINATIONS = 4096  # a guard against a typo that multiplies into an unbuildable matrix
DEFAULT_TAGS = ("{version}-{variant}",)
RESERVED = ("exclude", "include", "tags")
PLACEHOLDERS = ("cuda", "cuda_short", "cuda_major", "python", "python_short", "torch", "version", "variant",
                "flavor")
_PLACEHOLDER_RE = re.compile(r"\{([^{}]*)\}")
_SUB_TABLES = {"cuda": CUDA_KEYS, "base": BASE_KEYS, "build": BUILD_KEYS, "budget": BUDGET_KEYS}
MATRIX_SCHEMA = {"$ref": "#/$defs/matrix"}  # in the recipe's schema, so editors check matrices too
# Every key path a matrix may vary, with the type the recipe expects there.
KEY_TYPES: dict[str, type] = {k: t for k, t in TOP_KEYS.items() if k not in {"matrix", "name"}}
KEY_TYPES.update({f"{top}.{k}": t for top, table in _SUB_TABLES.items() for k, t in table.items()})
# Short prefixes that make variant ids read like the tags people already use (cu124-py311).
_ID_PREFIX = {"cuda.version": "cu", "python": "py", "torch": "pt", "cuda.cudnn": "cudnn"}
# fail(key path, message): records one issue of the matrix spec.
Fail = Callable[[str, str], None]
# check_value(key, value, key path): the issues one axis value raises when the recipe takes it.
ValueChecker = Callable[[str, Any, str], list[RecipeIssue]]


class MatrixTooLarge(UsageError):
    """More variants than the CI system accepts in one matrix."""


@dataclass(frozen=True)
class MatrixSpec:
    axes: tuple[tuple[str, tuple[Any, ...]], ...]  # key path -> values, in the order written
    include: tuple[dict[str, Any], ...] = ()
    exclude: tuple[dict[str, Any], ...] = ()
    tags: tuple[str, ...] = DEFAULT_TAGS
    lines: dict[str, int] = field(default_factory=dict, compare=False, repr=False)  # matrix key path -> line

    @property
    def keys(self) -> tuple[str, ...]:
        """Axis keys, then keys only includes set, in order of first appearance."""
        keys = [k for k, _ in self.axes]
        for entry in self.include:
            keys += [k for k in entry if k not in keys]
        return tuple(keys)


@dataclass(frozen=True)
class Variant:
    id: str  # stable, tag- and target-safe: cu124-py311
    values: dict[str, Any]  # the recipe keys this variant sets (its overrides)
    source: str  # "matrix" (a combination of the axes), "include[N]" or "recipe" (no matrix)
    recipe: Recipe
    resolution: Resolution
    tags: tuple[str, ...]  # NAME:TAG, without a registry; the content tag last

    @property
    def content_tag(self) -> str:
        return self.tags[-1].rsplit(":", 1)[1]


@dataclass(frozen=True)
class DroppedVariant:
    id: str
    values: dict[str, Any]
    source: str
    error: CompatibilityError


@dataclass(frozen=True)
class ExcludedVariant:
    id: str
    values: dict[str, Any]
    by: str  # matrix.exclude[N]


@dataclass(frozen=True)
class Matrix:
    path: Path
    name: str
    keys: tuple[str, ...]
    variants: tuple[Variant, ...]
    dropped: tuple[DroppedVariant, ...] = ()
    excluded: tuple[ExcludedVariant, ...] = ()

    def variant(self, variant_id: str) -> Variant:
        for v in self.variants:
            if v.id == variant_id:
                return v
        for d in self.dropped:
            if d.id == variant_id:
                raise UsageError(f"variant {variant_id} was dropped: {_short_message(d.error)}", hint=d.error.hint)
        known = ", ".join(v.id for v in self.variants)
        raise UsageError(f"{self.path} has no variant {variant_id!r}", hint=f"variants: {known}")


# --- parsing the spec ------------------------------------------------------------------


def parse_matrix_spec(located: _Located, file: str, check_value: ValueChecker | None = None) -> MatrixSpec | None:
    """The ``matrix:`` mapping of a located recipe, validated (the recipe schema's
    ``$defs/matrix``, then the rules below); None when there is none. ``check_value(key, value,
    path)`` returns the issues of one axis value as the recipe would take it, so a bad value is
    reported in the same pass as a bad key."""
    data = located.data if isinstance(located.data, dict) else {}
    if data.get("matrix") is None:
        return None
    issues: list[RecipeIssue] = []

    def fail(path: str, message: str) -> None:
        issues.append(RecipeIssue(file, line_of(located.lines, path), path, message))

    refused = validate(data["matrix"], MATRIX_SCHEMA, root=load_schema("recipe"), at=("matrix",))
    for issue in refused:
        fail(issue.key, issue.message)
    if not isinstance(data["matrix"], dict):
        raise RecipeError(issues)
    raw = {"matrix": copy.deepcopy(data["matrix"])}
    prune(raw, refused)
    spec = raw["matrix"]
    axes = _axes(spec, located, fail)
    if check_value is not None:
        issues.extend(i for key, values in axes for n, value in enumerate(values)
                      for i in check_value(key, value, f"matrix.{key}[{n}]"))
    exclude = _entries(spec.get("exclude", []), "exclude", located, fail)
    include = _entries(spec.get("include", []), "include", located, fail)
    _check_excludes(exclude, axes, fail)
    _check_includes(include, [k for k, _ in axes], fail)
    tags = _tags(spec.get("tags"), fail) if "tags" in data["matrix"] else DEFAULT_TAGS
    if not axes and not include and not issues:
        fail("matrix", "needs at least one axis (a recipe key with a list of values) or an include")
    total = math.prod(len(values) for _, values in axes)
    if total > MAX_COMBINATIONS:
        fail("matrix", f"expands to {total} combinations, over the limit of {MAX_COMBINATIONS}")
    if issues:
        raise RecipeError(sorted(issues, key=lambda i: (i.line or 0, i.key)))
    lines = {k: v for k, v in located.lines.items() if k == "matrix" or k.startswith("matrix.")}
    return MatrixSpec(tuple(axes), tuple(include), tuple(exclude), tags, lines)


def _axes(spec: dict[str, Any], located: _Located, fail: Fail) -> list[tuple[str, tuple[Any, ...]]]:
    """Each axis (a recipe key path -> its values, read as the recipe loader reads them), in
    the order written; a value listed twice is refused."""
    axes: list[tuple[str, tuple[Any, ...]]] = []
    for key, values in spec.items():
        path = f"matrix.{key}"
        if key in RESERVED or not _known_key(key, fail, path):
            continue
        normalized = tuple(_normalize(v, f"{path}[{i}]", KEY_TYPES[key], located) for i, v in enumerate(values))
        seen: dict[str, int] = {}
        for i, value in enumerate(normalized):
            if _canon(value) in seen:
                fail(f"{path}[{i}]", f"{_show(value)} is listed twice (also {path}[{seen[_canon(value)]}])")
            seen.setdefault(_canon(value), i)
        axes.append((key, normalized))
    _check_overlap([k for k, _ in axes], fail, "matrix")
    return axes


def _entries(items: list[Any], name: str, located: _Located, fail: Fail) -> list[dict[str, Any]]:
    """``include``/``exclude``: each entry's recipe key paths -> values (the schema checked the shapes)."""
    out = []
    for i, item in enumerate(items):
        if item is None:
            continue
        path = f"matrix.{name}[{i}]"
        entry = {key: _normalize(value, f"{path}.{key}", KEY_TYPES[key], located)
                 for key, value in item.items() if _known_key(str(key), fail, f"{path}.{key}")}
        _check_overlap(list(entry), fail, path)
        out.append(entry)
    return out


def _check_excludes(exclude: list[dict[str, Any]], axes: list[tuple[str, tuple[Any, ...]]], fail: Fail) -> None:
    values = dict(axes)
    for i, entry in enumerate(exclude):
        for key, value in entry.items():
            path = f"matrix.exclude[{i}].{key}"
            if key not in values:
                fail(path, f"{key} is not a matrix axis (axes: {', '.join(values) or 'none'})")
            elif _canon(value) not in {_canon(v) for v in values[key]}:
                fail(path, f"{_show(value)} is not one of the values of matrix.{key}, so this never matches")


def _check_includes(include: list[dict[str, Any]], axis_keys: list[str], fail: Fail) -> None:
    for i, entry in enumerate(include):
        for key in entry:
            if any(key != k and (k.startswith(key + ".") or key.startswith(k + ".")) for k in axis_keys):
                fail(f"matrix.include[{i}].{key}", f"{key} overlaps a matrix axis; set the axis key itself")


def _tags(templates: list[str] | None, fail: Fail) -> tuple[str, ...]:
    """Tag templates: every placeholder known, every brace matched."""
    if templates is None:  # refused by the schema
        return DEFAULT_TAGS
    for i, template in enumerate(templates):
        for name in _PLACEHOLDER_RE.findall(template):
            if name not in PLACEHOLDERS:
                close = closest(name, PLACEHOLDERS)
                fail(f"matrix.tags[{i}]", f"unknown placeholder {{{name}}}"
                     + (f" (did you mean {{{close}}}?)" if close else "")
                     + f"; known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}")
        rest = _PLACEHOLDER_RE.sub("", template)
        if "{" in rest or "}" in rest:
            fail(f"matrix.tags[{i}]", f"{template!r} has an unmatched brace")
    return tuple(templates)


def _known_key(key: str, fail: Fail, path: str) -> bool:
    if key == "name":
        fail(path, "a matrix varies one image repository; name cannot be an axis")
        return False
    if key == "matrix" or key not in KEY_TYPES:
        close = closest(key, KEY_TYPES)
        fail(path, "not a recipe key" + (f" (did you mean '{close}'?)" if close else "")
             + "; a matrix axis is a recipe key path such as cuda.version, python, torch or pip")
        return False
    return True


def _check_overlap(keys: list[str], fail: Fail, where: str) -> None:
    for a, b in itertools.permutations(keys, 2):
        if b.startswith(a + "."):
            fail(f"{where}.{b}", f"{b} overlaps {a}: vary one or the other")


def _normalize(value: Any, path: str, expected: type, located: _Located) -> Any:
    """The value as the recipe loader would read it: unquoted numbers keep the text written
    (python: 3.10 is "3.10", not 3.1), except where the recipe wants a number or a bool."""
    if isinstance(value, list):
        return [_normalize(v, f"{path}[{i}]", str, located) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): _normalize(v, f"{path}.{k}", str, located) for k, v in value.items()}
    if isinstance(value, (int, float)) and not isinstance(value, bool) and expected is str:
        return located.raw_scalars.get(path, str(value))
    return value


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else repr(value)


def _get_path(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


# --- expansion ------------------------------------------------------------------------


Resolver = Callable[[Recipe], Resolution]


def load_matrix(path: str | Path, *, resolver: Resolver) -> Matrix:
    """Read a recipe and expand its matrix. A recipe without one is a one-variant matrix. ``resolver``
    resolves each variant (the pipeline's, which reads each base's facts once)."""
    path = Path(path)
    return expand_matrix(read_recipe_text(path), path, resolver=resolver)


def expand_matrix(text: str, path: Path, *, resolver: Resolver) -> Matrix:
    file = str(path)
    located = locate(text, file)
    spec = parse_matrix_spec(located, file, _value_checker(text, path, located))
    base = parse_recipe(text, path)  # the recipe as written must be valid on its own
    if spec is None:
        try:
            res = resolver(base)
        except CompatibilityError as exc:
            return Matrix(path, base.name, (), (), (DroppedVariant("default", {}, "recipe", exc),))
        tags = (f"{base.name}:{base.version or 'latest'}", f"{base.name}:{content_tag(base)}")
        return Matrix(path, base.name, (), (Variant("default", {}, "recipe", base, res, tags),))

    base_data = located.data
    base_values = {k: _normalize(_get_path(base_data, k), k, KEY_TYPES[k], located) for k in spec.keys}
    # Candidates, in order: the product of the axes, then the includes.
    candidates: list[tuple[dict[str, Any], str, dict[str, str]]] = []
    excluded_raw: list[tuple[dict[str, Any], str]] = []
    if spec.axes:
        keys = [k for k, _ in spec.axes]
        for combo in itertools.product(*(range(len(v)) for _, v in spec.axes)):
            values = {k: spec.axes[j][1][i] for j, (k, i) in enumerate(zip(keys, combo, strict=False))}
            by = next((f"matrix.exclude[{n}]" for n, ex in enumerate(spec.exclude)
                       if all(_canon(values[k]) == _canon(v) for k, v in ex.items())), None)
            if by:
                excluded_raw.append((values, by))
                continue
            candidates.append((values, "matrix", {k: f"matrix.{k}[{i}]" for k, i in zip(keys, combo, strict=False)}))
    seen = {_canon(_effective(v, base_values)) for v, _, _ in candidates}
    for n, entry in enumerate(spec.include):
        if _canon(_effective(entry, base_values)) in seen:
            continue  # already a combination of the axes
        seen.add(_canon(_effective(entry, base_values)))
        candidates.append((dict(entry), f"include[{n}]", {k: f"matrix.include[{n}].{k}" for k in entry}))

    ids = _variant_ids([_effective(v, base_values) for v, _, _ in candidates]
                       + [_effective(v, base_values) for v, _ in excluded_raw], spec.keys,
                       tuple(k for k, _ in spec.axes), base_values)
    kept: list[Variant] = []
    dropped: list[DroppedVariant] = []
    issues: list[RecipeIssue] = []
    for (values, source, paths), vid in zip(candidates, ids, strict=False):
        lines = {k: line_of(spec.lines, p) for k, p in paths.items()}
        override_lines = {k: line for k, line in lines.items() if line is not None}
        try:
            recipe = parse_recipe(text, path, overrides=values, override_lines=override_lines)
        except RecipeError as exc:
            issues += _relocate(exc.issues, values, paths, spec.lines, vid)
            continue
        try:
            res = resolver(recipe)
        except CompatibilityError as exc:
            dropped.append(DroppedVariant(vid, values, source, exc))
            continue
        tag_list, tag_issues = _render_tags(spec, recipe, res, vid, file)
        issues += tag_issues
        kept.append(Variant(vid, values, source, recipe, res, tag_list))
    owners: dict[str, str] = {}
    for v in kept:
        for tag in v.tags:
            if tag in owners and owners[tag] != v.id:
                issues.append(RecipeIssue(file, line_of(spec.lines, "matrix.tags"), "matrix.tags",
                                          f"variants {owners[tag]} and {v.id} would both be tagged {tag}; "
                                          "add {variant} or the varying keys to a tag template"))
            owners.setdefault(tag, v.id)
    if issues:
        unique = {(i.line or 0, i.key, i.message): i for i in issues}
        raise RecipeError([unique[k] for k in sorted(unique)])
    excluded = tuple(ExcludedVariant(vid, values, by)
                     for (values, by), vid in zip(excluded_raw, ids[len(candidates):], strict=False))
    return Matrix(path, base.name, spec.keys, tuple(kept), tuple(dropped), excluded)


def _value_checker(text: str, path: Path, located: _Located) -> ValueChecker:
    """check_value for parse_matrix_spec: the issues one axis value raises when the recipe takes it."""
    def check_value(key: str, value: Any, where: str) -> list[RecipeIssue]:
        line = line_of(located.lines, where)
        try:
            parse_recipe(text, path, overrides={key: value}, override_lines={key: line} if line else {})
        except RecipeError as exc:  # only what this value is blamed for: the recipe's own issues come later
            mine = [i for i in exc.issues if i.key == key or i.key.startswith((key + ".", key + "["))]
            return _relocate(mine, {key: value}, {key: where}, located.lines, "")
        return []
    return check_value


def _effective(values: dict[str, Any], base_values: dict[str, Any]) -> dict[str, Any]:
    return {k: values.get(k, base_values.get(k)) for k in base_values}


def _relocate(issues: Sequence[RecipeIssue], values: Mapping[str, Any], paths: dict[str, str],
              spec_lines: dict[str, int], vid: str) -> list[RecipeIssue]:
    """Point a variant's recipe errors at the matrix entry that set the value."""
    out = []
    for issue in issues:
        key = next((k for k in values if issue.key == k or issue.key.startswith((k + ".", k + "["))), None)
        if key is None:
            out.append(issue._replace(message=f"(variant {vid}) {issue.message}"))
            continue
        where = paths[key] + issue.key[len(key):]
        out.append(RecipeIssue(issue.file, line_of(spec_lines, where) or issue.line, where, issue.message))
    return out


def content_tag(recipe: Recipe) -> str:
    return "sha-" + recipe.digest.split(":", 1)[1][:12]


def _tag_values(recipe: Recipe, res: Resolution, vid: str) -> dict[str, str | None]:
    mm = res.cuda_major_minor
    return {
        "cuda": res.cuda_version,
        "cuda_short": mm.replace(".", ""),
        "cuda_major": mm.split(".")[0],
        "python": res.python,
        "python_short": res.python.replace(".", ""),
        "torch": res.torch,
        "version": recipe.version or "latest",
        "variant": vid,
        "flavor": res.cuda_flavor,
    }


def _render_tags(spec: MatrixSpec, recipe: Recipe, res: Resolution, vid: str,
                 file: str) -> tuple[tuple[str, ...], list[RecipeIssue]]:
    values = _tag_values(recipe, res, vid)
    tags, issues = [], []
    for i, template in enumerate(spec.tags):
        key = f"matrix.tags[{i}]" if spec.tags is not DEFAULT_TAGS else "matrix"
        missing = [n for n in _PLACEHOLDER_RE.findall(template) if not values.get(n)]
        if missing:
            issues.append(RecipeIssue(file, line_of(spec.lines, key), key,
                                      f"variant {vid} has no {missing[0]} for {{{missing[0]}}}"))
            continue
        tag = _PLACEHOLDER_RE.sub(lambda m: str(values[m.group(1)]), template)
        if not TAG_RE.match(tag):
            issues.append(RecipeIssue(file, line_of(spec.lines, key), key,
                                      f"{template!r} gives {tag!r} for variant {vid}, not a valid tag "
                                      "(letters, digits, '.', '_', '-'; at most 128)"))
            continue
        if f"{recipe.name}:{tag}" not in tags:
            tags.append(f"{recipe.name}:{tag}")
    tags.append(f"{recipe.name}:{content_tag(recipe)}")
    return tuple(tags), issues


# --- variant ids ----------------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", str(text).lower()).strip("_")


def _digits(text: str) -> str:
    return re.sub(r"[^0-9a-z]", "", str(text).lower())


def _id_part(key: str, value: Any, all_values: list[Any]) -> str:
    if value is None:
        return ""
    last = key.rsplit(".", 1)[-1]
    if key in _ID_PREFIX and isinstance(value, str):
        return _ID_PREFIX[key] + _digits(value)
    if isinstance(value, bool):
        return _slug(last) if value else "no" + _slug(last)
    if isinstance(value, int):
        return f"{_slug(last)}{value}"
    if isinstance(value, str):
        return ("v" if key == "version" else "") + _slug(value)
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        # Only what sets this value apart: pip [a, idna==3.7] vs [a, idna==3.8] -> idna3_7.
        lists = [v for v in all_values if isinstance(v, list)]
        common = set.intersection(*(set(v) for v in lists)) if lists else set()
        own = [x for x in value if x not in common]
        return "_".join(_slug(x.replace("==", "")) for x in own) or "no" + _slug(last)
    distinct = list(dict.fromkeys(_canon(v) for v in all_values))
    return f"{_slug(last)}{distinct.index(_canon(value)) + 1}"


def _variant_ids(effective: list[dict[str, Any]], keys: tuple[str, ...], axis_keys: tuple[str, ...],
                 base_values: dict[str, Any]) -> list[str]:
    """Stable ids from the values (not from positions), unique within the matrix. A key only
    includes set shows in the ids of the variants that change it (cu126-py312-pt260)."""
    per_key = {k: [e.get(k) for e in effective] for k in keys}
    ids = []
    for e in effective:
        parts = [_id_part(k, e.get(k), per_key[k]) for k in keys
                 if k in axis_keys or _canon(e.get(k)) != _canon(base_values.get(k))]
        ids.append("-".join(p for p in parts if p) or "default")
    counts: dict[str, int] = {}
    out = []
    for vid in ids:
        counts[vid] = counts.get(vid, 0) + 1
        out.append(vid if ids.count(vid) == 1 else f"{vid}-{counts[vid]}")
    return out


# --- plans and shared prefixes --------------------------------------------------------


def variant_plan(variant: Variant, *, registry: str | None = None, tags: tuple[str, ...] = ()) -> BuildPlan:
    return make_plan(variant.recipe, variant.resolution, tags=tags or variant.tags, registry=registry)


def _step_key(step: Step) -> list[Any]:
    return [type(step).__name__, asdict(step)]


def _prefix_digest(base: str, steps: Sequence[Step]) -> str:
    blob = json.dumps([base, [_step_key(s) for s in steps]], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class SharedStage:
    """A run of final-stage steps that two or more variants have in common, from the base."""

    key: str  # sha256 prefix of (base, steps up to here)
    parent: str | None  # the shared stage this one continues, or None (it starts FROM base)
    base: str  # FROM: the base image, or the parent's context name
    steps: tuple[Step, ...]  # the steps this stage adds
    users: tuple[str, ...]  # variant ids whose final stage starts with it

    @property
    def target(self) -> str:
        return f"shared-{self.key}"

    @property
    def context(self) -> str:
        return f"imgbuild-shared-{self.key}"


def shared_stages(plans: dict[str, BuildPlan]) -> tuple[dict[str, SharedStage], dict[str, list[str]]]:
    """The shared prefixes of the variants' final stages: where two variants' steps stop being
    the same, a stage ends. Returns the stages by key and, per variant, its chain of keys
    (outermost first). The same cuts BuildKit's cache shares on one engine."""
    finals = {vid: (p.final.base, p.final.steps) for vid, p in plans.items()}
    stages: dict[str, SharedStage] = {}
    chains: dict[str, list[str]] = {}
    for vid, (base, steps) in finals.items():
        chain: list[str] = []
        start = 0
        for k in range(1, len(steps)):
            share = {u for u, (b, s) in finals.items() if b == base and len(s) > k and s[:k] == steps[:k]}
            nxt = {u for u in share if finals[u][1][k] == steps[k]}
            if len(share) >= 2 and nxt != share:
                key = _prefix_digest(base, steps[:k])
                if key not in stages:
                    parent = chain[-1] if chain else None
                    stages[key] = SharedStage(key, parent, stages[parent].context if parent else base,
                                              tuple(steps[start:k]), tuple(sorted(share)))
                chain.append(key)
                start = k
        chains[vid] = chain
    return stages, chains



def shared_stage_plan(stage: SharedStage, plans: dict[str, BuildPlan], base: str) -> BuildPlan:
    """The plan of one shared stage alone: its steps FROM ``base`` (the base image, or what
    its parent stage became: a bake context name or a locally built image)."""
    return replace(plans[stage.users[0]], stages=(Stage("shared", base, stage.steps, StageRole.FINAL),))


def shared_stage_tag(matrix: Matrix, key: str) -> str:
    """The local tag of a shared stage built once for --no-cache (untagged after the build)."""
    return f"imgbuild-shared/{_slug(matrix.name)}:{key}"


def after_shared(plan: BuildPlan, chain: list[str], stages: dict[str, SharedStage], base: str) -> BuildPlan:
    """``plan`` with its final stage FROM ``base`` (what the last stage of ``chain`` became),
    less the steps the chain's stages already hold."""
    skip = sum(len(stages[k].steps) for k in chain)
    final = replace(plan.final, base=base, steps=plan.final.steps[skip:])
    return replace(plan, stages=plan.stages[:-1] + (final,))

# --- outputs --------------------------------------------------------------------------


def _short_message(exc: CompatibilityError) -> str:
    return f"{exc.component} {exc.version} conflicts with {exc.other} {exc.other_version}: {exc.reason}"


def matrix_json(matrix: Matrix, *, registry: str | None = None) -> dict[str, Any]:
    kept = []
    for v in matrix.variants:
        plan = variant_plan(v, registry=registry)
        r = v.resolution
        kept.append({
            "variant": v.id, "source": v.source, "values": v.values, "tags": list(plan.tags),
            "content_tag": v.content_tag, "recipe_digest": v.recipe.digest, "cuda": r.cuda_version,
            "cuda_short": r.cuda_major_minor.replace(".", ""), "python": r.python, "torch": r.torch_label,
            "base_image": r.base_image, "warnings": [w.to_json() for w in r.warnings],
        })
    dropped = [{
        "variant": d.id, "source": d.source, "values": d.values, "reason": _short_message(d.error),
        "message": d.error.message, "hint": d.error.hint, "component": d.error.component,
        "version": d.error.version, "other": d.error.other, "other_version": d.error.other_version,
        "file": d.error.file, "line": d.error.line, "key": d.error.key,
    } for d in matrix.dropped]
    excluded = [{"variant": e.id, "values": e.values, "by": e.by} for e in matrix.excluded]
    return {"recipe": str(matrix.path), "name": matrix.name, "keys": list(matrix.keys), "variants": kept,
            "dropped": dropped, "excluded": excluded}


def cache_ref(matrix: Matrix, variant_id: str, registry: str | None = None) -> str:
    ref = f"{matrix.name}:cache-{variant_id}"
    return f"{registry.rstrip('/')}/{ref}" if registry else ref


def _check_job_limit(matrix: Matrix, limit: int, what: str, hint: str) -> None:
    if len(matrix.variants) > limit:
        raise MatrixTooLarge(f"{matrix.path}: {len(matrix.variants)} variants, but {what} at most {limit} jobs",
                             hint=hint)


def github_matrix(matrix: Matrix, *, registry: str | None = None) -> dict[str, Any]:
    """A GitHub Actions ``strategy.matrix`` (use with fromJSON): one include entry per variant."""
    _check_job_limit(matrix, GITHUB_MAX_JOBS, "a GitHub Actions matrix runs",
                     "exclude combinations, or split the matrix across recipes or workflows")
    include = []
    for v in matrix.variants:
        r = v.resolution
        include.append({
            "variant": v.id, "recipe": str(matrix.path), "cuda": r.cuda_version,
            "cuda_short": r.cuda_major_minor.replace(".", ""), "python": r.python, "torch": r.torch_label or "",
            "tags": list(variant_plan(v, registry=registry).tags), "cache": cache_ref(matrix, v.id, registry),
        })
    return {"include": include}


def gitlab_matrix(matrix: Matrix, *, registry: str | None = None) -> dict[str, Any]:
    """A GitLab CI ``parallel:matrix``: one entry of scalar variables per variant."""
    _check_job_limit(matrix, GITLAB_MAX_JOBS, "GitLab's parallel:matrix creates",
                     "exclude combinations, or split the matrix across several jobs")
    entries = []
    for v in matrix.variants:
        r = v.resolution
        entries.append({
            "IMGBUILD_VARIANT": v.id, "IMGBUILD_RECIPE": str(matrix.path), "CUDA": r.cuda_version,
            "PYTHON": r.python, "TORCH": r.torch_label or "",
            "IMGBUILD_TAGS": " ".join(variant_plan(v, registry=registry).tags),
            "IMGBUILD_CACHE": cache_ref(matrix, v.id, registry),
        })
    return {"parallel": {"matrix": entries}}


def build_order(stages: dict[str, SharedStage]) -> list[str]:
    """The shared stages' keys, each after its parent."""
    order: list[str] = []

    def visit(key: str) -> None:
        if key in order:
            return
        parent = stages[key].parent
        if parent:
            visit(parent)
        order.append(key)

    for key in stages:
        visit(key)
    return order


def text_lines(matrix: Matrix, *, registry: str | None = None) -> list[str]:
    lines = [(f"{matrix.name}: {len(matrix.variants)} variants kept, {len(matrix.dropped)} dropped, "
              f"{len(matrix.excluded)} excluded ({matrix.path})")]
    for v in matrix.variants:
        r = v.resolution
        stack = f"cuda {r.cuda_version}, python {r.python}" + (f", torch {r.torch_label}" if r.torch else "")
        lines.append(f"  kept     {v.id:<24} {stack}")
        lines.append(f"           {'':<24} {', '.join(variant_plan(v, registry=registry).tags)}")
    for d in matrix.dropped:
        lines.append(f"  dropped  {d.id:<24} {_short_message(d.error)}")
        if d.error.hint:
            lines.append(f"           {'':<24} hint: {d.error.hint}")
    for e in matrix.excluded:
        lines.append(f"  excluded {e.id:<24} by {e.by}")
    return lines


def dropped_warnings(matrix: Matrix) -> list[str]:
    return [f"variant {d.id} dropped: {_short_message(d.error)}" + (f" (hint: {d.error.hint})" if d.error.hint else "")
            for d in matrix.dropped]


def require_variants(matrix: Matrix, what: str) -> None:
    """UsageError (exit 2) when the matrix keeps no variant, listing why each combination went:
    nothing can be ``what`` (built, locked, a CI matrix: GitHub fails an empty one in its own
    words, far from the cause)."""
    if matrix.variants:
        return
    reasons = dropped_warnings(matrix) + [f"variant {e.id} excluded by {e.by}" for e in matrix.excluded]
    raise UsageError(f"{matrix.path}: every variant was dropped, nothing to {what}:\n"
                     + "\n".join(f"  {r}" for r in reasons),
                     hint="change the matrix's values (or the recipe) as each reason's hint says")


def select_variants(matrix: Matrix, variant_ids: tuple[str, ...] = (), *, jobs: int = 1,
                    tags: tuple[str, ...] = ()) -> list[Variant]:
    """The variants a build asks for (all when ``variant_ids`` is empty), or UsageError: the
    checks of every option, so the CLI can run them before it prints or builds anything."""
    if jobs < 1:
        raise UsageError(f"-j {jobs}: the number of parallel builds must be at least 1")
    chosen = [matrix.variant(i) for i in dict.fromkeys(variant_ids)] if variant_ids else list(matrix.variants)
    if not chosen:
        require_variants(matrix, "build")
    if tags and len(chosen) != 1:
        raise UsageError("--tag names one image: use it with a single --variant, not with --all",
                         hint="set matrix.tags in the recipe to tag every variant")
    return chosen
