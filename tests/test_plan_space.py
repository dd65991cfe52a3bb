"""issue 29, item 3: the plan space proved by properties over a generated grid, not by examples.

The axes are read from the shipped data (every CUDA minor the toolkit table knows, each flavor and
source, every OS whose Python imgbuild knows, each of those Pythons, every torch, flash-attn and
bitsandbytes release the tables hold), plus neighbours that do not exist: a CUDA minor beyond the data,
a patch of CUDA, torch, flash-attn and bitsandbytes that was never released, an OS imgbuild does not
know. The full product is far too large to plan (``_full_size``), so a fixed seed draws ``SAMPLES``
recipes from it; each refusal's hints are then applied as a user would type them, and the recipe that
gives is planned too, up to ``CHAIN`` edits deep, which is how most passing plans are reached (few
random combinations fit). Everything is planned offline (``LookedUp(offline=True)``: what
``plan --offline`` passes the resolver), so no index is asked.

For every recipe planned:

(a) each hint, applied mechanically to the recipe, removes its problem: the edited recipe has no
    problem at that key, and none at the key the hint edited (a hint that trades one refusal for
    another at the pin it names could have named another release);
(b) a passing plan's labels follow from the model of the image its pins make (``_modelled_image``:
    the one place this test asks what an image holds);
(c) nothing but a typed CompatibilityError is raised, each problem at a recipe key with a hint, and
    its JSON says ``"partial": true`` wherever its text says the data is known only in part.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from helpers import MODELLED_LABELS, TODAY, model_image, run_cli
from packaging.version import Version

from buildkit_py import compat
from buildkit_py.analysis.image_checks import FAILED, ImageFacts, label_checks
from buildkit_py.compat.resolve import resolve
from buildkit_py.compat.rules import OS_PYTHON, LookedUp
from buildkit_py.errors import CompatibilityError, CompatibilityErrors
from buildkit_py.plan.build_plan import BuildPlan, make_plan
from buildkit_py.recipe.model import CudaFlavor, CudaSource, parse_recipe

SAMPLES = 2000  # recipes drawn from the full product; each hint applied adds one (7,003 distinct in all, 40 s)
CHAIN = 4  # hints followed one after another from a drawn recipe
SEED = 29
UNKNOWN_OS = "rockylinux9"  # a valid base.os (an nvidia/cuda OS name) whose Python imgbuild does not know
# the base image a source: wheels recipe names for each OS (source: nvidia names base.os only)
_OS_IMAGE = {"debian11": "debian:bullseye-slim", "debian12": "debian:bookworm-slim", "debian13": "debian:trixie-slim"}


# --- the one place the test asks what an image holds ---------------------------------------------------

def _modelled_image(plan: BuildPlan) -> ImageFacts:
    """What the image of ``plan`` holds, from the content model, not from its labels. Today the model is
    the plan's exact pins, torch.json (compat.torch_bundles_cuda: a large wheel's CUDA in torch/lib; the
    cuDNN its wheel requires), the base's nvidia/cuda tag and the ldconfig step (helpers.model_image);
    the per-wheel content model of issue 29 item 1 (each wheel's RECORD) replaces it here."""
    return model_image(plan)


def _content_model_disagrees(plan: BuildPlan) -> list[tuple[str, str]]:
    """The labels of a passing plan against the per-wheel content model (compat/wheel_contents.py:
    each wheel's recorded Requires-Dist and bundled libraries), where it knows every pin: a wheels
    image's runtime is a loadable libcudart of the labelled CUDA minor, and the cuDNN label's major
    is the one the wheels bring."""
    res = plan.resolution
    cuda = res.image_cuda
    if cuda is None or cuda.partial:
        return []
    wrong = []
    if res.cuda_source == CudaSource.WHEELS:
        if "cudart" not in cuda.loadable:
            wrong.append(("content model", "a wheels image whose wheels bring no loadable libcudart"))
        elif cuda.cuda_minors != {res.cuda_major_minor}:
            wrong.append(("content model", f"runtime wheels of CUDA {sorted(cuda.cuda_minors)}, "
                                           f"labelled {res.cuda_major_minor}"))
    if res.cudnn and cuda.cudnn and res.cudnn.split(".")[0] != cuda.cudnn:
        wrong.append(("content model", f"cudnn label {res.cudnn}, the wheels bring cuDNN {cuda.cudnn}"))
    return wrong


# --- the axes, read from the data ------------------------------------------------------------------------

def _unreleased_patch(versions: list[str]) -> str:
    """A patch after the newest of ``versions``: a neighbour that does not exist."""
    v = Version(max(versions, key=Version))
    return f"{v.major}.{v.minor}.{v.micro + 1}"


@dataclass(frozen=True)
class Axes:
    cuda: tuple[str, ...]
    flavor: tuple[str, ...]
    source: tuple[str, ...]
    os: tuple[str, ...]
    python: tuple[str, ...]
    torch: tuple[str | None, ...]
    flash_attn: tuple[str | None, ...]
    bitsandbytes: tuple[str | None, ...]

    def values(self) -> tuple[tuple[str | None, ...], ...]:
        return (self.cuda, self.flavor, self.source, self.os, self.python, self.torch, self.flash_attn,
                self.bitsandbytes)


def _axes() -> Axes:
    toolkits = [t.version for t in compat.toolkits()]
    minors = sorted({t.major_minor for t in compat.toolkits()}, key=Version)
    newest = Version(minors[-1])
    middle = minors[len(minors) // 2]
    torch = [r.version for r in compat.torch_releases()]
    fa = [r.version for r in compat.flash_attn_releases()]
    bnb = [r.version for r in compat.bitsandbytes_releases()]
    pythons = sorted(set(OS_PYTHON.values()), key=Version)
    return Axes(
        cuda=(*minors, f"{newest.major}.{newest.minor + 1}",  # a minor beyond the data
              _unreleased_patch([t for t in toolkits if t.startswith(middle + ".")])),
        flavor=CudaFlavor.words(),
        source=CudaSource.words(),
        os=(*OS_PYTHON, UNKNOWN_OS),
        python=tuple(pythons),
        torch=(None, *torch, _unreleased_patch(torch), _unreleased_patch(torch[: len(torch) // 2])),
        flash_attn=(None, *fa, _unreleased_patch(fa)),
        bitsandbytes=(None, *bnb, _unreleased_patch(bnb)),
    )


def _full_size(axes: Axes) -> int:
    size = 1
    for values in axes.values():
        size *= len(values)
    return size


# --- recipes -----------------------------------------------------------------------------------------------

Case = tuple[tuple[str, str | None], ...]  # the recipe's choices, as sorted (key, value) pairs
_KEYS = ("cuda", "flavor", "source", "os", "python", "torch", "flash_attn", "bitsandbytes")


def _text(case: dict[str, str | None]) -> str:
    os_name = case["os"] or ""
    if case["source"] == "nvidia":
        base = f"{{os: {os_name}}}"
    elif os_name in _OS_IMAGE:
        base = f"{{image: {_OS_IMAGE[os_name]}}}"
    elif os_name.startswith("ubuntu"):
        base = f'{{image: "ubuntu:{os_name.removeprefix("ubuntu")}"}}'
    else:  # an image imgbuild cannot tell the OS of: base.os says it
        base = f"{{image: registry.local/base/{os_name}:1, os: {os_name}}}"
    text = (f'name: team/x\ncuda: {{version: "{case["cuda"]}", source: {case["source"]}, flavor: {case["flavor"]}}}\n'
            f'base: {base}\npython: "{case["python"]}"\n')
    if case["torch"]:
        text += f'torch: "{case["torch"]}"\n'
    pins = [f'"{name}=={case[key]}"' for key, name in (("flash_attn", "flash-attn"), ("bitsandbytes", "bitsandbytes"))
            if case[key]]
    return text + (f"pip: [{', '.join(pins)}]\n" if pins else "")


def _draw(axes: Axes, rng: random.Random) -> dict[str, str | None]:
    """One recipe of the product; a pin is left out half the time (most recipes pin neither)."""
    case = {key: rng.choice(values) for key, values in zip(_KEYS, axes.values(), strict=True)}
    for key in ("flash_attn", "bitsandbytes"):
        if rng.random() < 0.5:
            case[key] = None
    return case


@dataclass(frozen=True)
class Outcome:
    plan: BuildPlan | None
    problems: tuple[CompatibilityError, ...]
    crash: str | None = None  # anything raised but a CompatibilityError: an internal error


_PATH = Path("/nonexistent/plan-space/recipe.yaml")  # never read: the text is parsed as given


def _plan(case: dict[str, str | None], memo: dict[str, Outcome]) -> Outcome:
    text = _text(case)
    if text in memo:
        return memo[text]
    recipe = parse_recipe(text, _PATH)
    try:
        plan = make_plan(recipe, resolution=resolve(recipe, looked_up=LookedUp(offline=True), today=TODAY))
        out = Outcome(plan, ())
    except CompatibilityErrors as exc:
        out = Outcome(None, tuple(exc.errors))
    except CompatibilityError as exc:
        out = Outcome(None, (exc,))
    except Exception as exc:  # noqa: BLE001 - (c): any other is an internal error, recorded and reported
        out = Outcome(None, (), f"{type(exc).__name__}: {exc}")
    memo[text] = out
    return out


# --- hints, applied as a user would type them --------------------------------------------------------------

_V = r"(\d+(?:\.\d+)*(?:\.post\d+)?)"
# each alternative of a hint that is an edit of one key (or two: a CUDA on an OS), as (regex, edit)
_EDITS: list[tuple[re.Pattern[str], tuple[str, ...]]] = [
    (re.compile(rf'^(?:use )?cuda: "{_V}" on (ubuntu\d+\.\d+)'), ("cuda", "os")),
    (re.compile(rf'^(?:use )?(?:cuda\.version |cuda )"?{_V}"?'), ("cuda",)),
    (re.compile(rf'^(?:use )?a released CUDA toolkit, e\.g\. "{_V}"'), ("cuda",)),
    (re.compile(r"^(?:use )?cuda\.flavor: (\w+)"), ("flavor",)),
    (re.compile(rf'^"{_V}" to stay on CUDA'), ("cuda",)),
    (re.compile(rf'^(?:use )?python: "{_V}"'), ("python",)),
    (re.compile(r"^(?:use )?base\.os: (ubuntu\d+\.\d+)"), ("os",)),
    (re.compile(rf"^(?:use )?torch (?:==)?{_V}"), ("torch",)),
    (re.compile(rf"^(?:use )?flash-attn(?:==| ){_V}"), ("flash_attn",)),
    (re.compile(rf"^(?:use )?a flash-attn release imgbuild knows; the newest are {_V}"), ("flash_attn",)),
    (re.compile(rf"^(?:use )?bitsandbytes(?:==| ){_V}"), ("bitsandbytes",)),
    (re.compile(rf"^(?:use )?a bitsandbytes release imgbuild knows; the newest are {_V}"), ("bitsandbytes",)),
]
_PIP_KEY = re.compile(r"^pip\[(\d+)\]$")


def _alternatives(hint: str) -> list[str]:
    """The choices a hint offers ("use A or B", "use A, B, or C", "A; or use B"), asides in parentheses
    left out. A switch of cuda.source is never applied alone: it changes what base.image must be too."""
    flat = re.sub(r"\([^()]*\)", "", hint)
    parts = re.split(r"[,;]? or (?:use )?|, (?=an? |use )", flat)
    return [p.strip(" ,;") for p in parts if p.strip(" ,;")]


def _edits(case: dict[str, str | None], hint: str) -> list[tuple[str, dict[str, str | None]]]:
    """(alternative, the recipe with it applied) for each alternative of ``hint`` that is an edit of
    recipe keys; advice ("pick a Python in that range") is no edit and gives nothing."""
    out = []
    for alt in _alternatives(hint):
        if alt.startswith("drop pip["):
            index = int(alt[len("drop pip["):].split("]")[0])
            pinned = [k for k in ("flash_attn", "bitsandbytes") if case[k]]
            out.append((alt, {**case, pinned[index]: None}))
            continue
        for pattern, keys in _EDITS:
            if m := pattern.match(alt):
                out.append((alt, {**case, **dict(zip(keys, m.groups(), strict=True))}))
                break
    return out


def _where(case: dict[str, str | None], key: str | None) -> str | None:
    """A problem's key with a pip index named by its pin (pip[0] is flash-attn or bitsandbytes)."""
    if key and (m := _PIP_KEY.match(key)):
        pinned = [k for k in ("flash_attn", "bitsandbytes") if case[k]]
        index = int(m.group(1))
        return pinned[index] if index < len(pinned) else key
    return key


_RECIPE_KEY = {"cuda": "cuda.version", "flavor": "cuda.flavor", "source": "cuda.source", "python": "python",
               "torch": "torch", "flash_attn": "flash_attn", "bitsandbytes": "bitsandbytes"}


def _edited_keys(before: dict[str, str | None], after: dict[str, str | None]) -> set[str]:
    keys = {_RECIPE_KEY[k] for k in _KEYS if k != "os" and before[k] != after[k]}
    if before["os"] != after["os"]:
        keys |= {"base.os", "base.image"}
    return keys


# --- the walk over the grid --------------------------------------------------------------------------------

@dataclass
class Findings:
    """What the walk saw: counts, and each recipe that broke a property with what it broke."""
    recipes: int = 0
    planned: int = 0
    hints_applied: int = 0
    advice: Counter = field(default_factory=Counter)  # hints that are no edit of the recipe, by shape
    crashes: list = field(default_factory=list)  # (c) anything but a CompatibilityError
    untyped: list = field(default_factory=list)  # (c) a problem without a key, line or hint
    partial: list = field(default_factory=list)  # (c) the text and the partial flag disagree
    unfixed: list = field(default_factory=list)  # (a) a hint applied that left its problem, or made one
    labels: list = field(default_factory=list)  # (b) a label the model of the image contradicts


# what a refusal says when the data it rests on is incomplete, and what a partial one says at least
_SAYS_PARTIAL = re.compile(r"known only in part|is partial|partial \(|known from the package index only")
_SAYS_UNKNOWN = re.compile(r"known only in part|partial|unknown|does not (?:know|record)|not recorded|not verified")


def _check_outcome(case: dict[str, str | None], out: Outcome, found: Findings) -> None:
    """(b) and (c) for one planned recipe."""
    found.recipes += 1
    if out.crash:
        found.crashes.append((case, out.crash))
        return
    if out.plan is not None:
        found.planned += 1
        plan = out.plan
        wrong = [(r.name, r.detail) for r in label_checks(plan.labels, _modelled_image(plan), plan.recipe)
                 if r.status == FAILED and r.name.removeprefix("label ") in MODELLED_LABELS]
        wrong += _content_model_disagrees(plan)
        if wrong:
            found.labels.append((case, wrong))
        return
    for p in out.problems:
        if not (p.key and p.hint and p.line):
            found.untyped.append((case, p.key, p.message, p.hint))
        says = _SAYS_PARTIAL.search(p.message) is not None
        if (says and not p.partial) or (p.partial and not _SAYS_UNKNOWN.search(p.message)) \
                or p.to_json()["partial"] is not p.partial:
            found.partial.append((case, p.partial, p.message))


def _walk(axes: Axes) -> Findings:
    rng = random.Random(SEED)  # noqa: S311 - a reproducible sample, not a secret
    memo: dict[str, Outcome] = {}
    found = Findings()
    seen: set[str] = set()

    def visit(case: dict[str, str | None]) -> Outcome:
        out = _plan(case, memo)
        text = _text(case)
        if text not in seen:
            seen.add(text)
            _check_outcome(case, out, found)
        return out

    for _ in range(SAMPLES):
        case = _draw(axes, rng)
        for _depth in range(CHAIN + 1):
            out = visit(case)
            follow = None
            for problem in out.problems:
                edits = _edits(case, problem.hint or "")
                if not edits:
                    found.advice[re.sub(r"\d+(\.\d+)*", "N", problem.hint or "(none)")] += 1
                for alt, fixed in edits:
                    found.hints_applied += 1
                    after = visit(fixed)
                    if after.crash:
                        continue  # recorded by visit
                    blamed = {_where(case, problem.key)} | _edited_keys(case, fixed)
                    # a problem with a pin the recipe lacks ("flash-attn builds against torch": (none)) is
                    # one no release the hint could name avoids
                    left = [p for p in after.problems if _where(fixed, p.key) in blamed and p.other_version != "(none)"]
                    if left:
                        found.unfixed.append((case, problem.key, problem.hint, alt, left[0].key, left[0].message))
                    follow = follow or fixed
            if follow is None:
                break
            case = follow
    return found


def test_the_plan_space_holds_its_properties(capsys):
    axes = _axes()
    start = time.monotonic()
    found = _walk(axes)
    took = time.monotonic() - start
    with capsys.disabled():
        print(f"\nplan space: full product {_full_size(axes):,} recipes; {SAMPLES:,} drawn (seed {SEED}), "
              f"{found.recipes:,} planned with the hints applied ({found.hints_applied:,} hints), "
              f"{found.planned:,} passing, in {took:.1f} s; {sum(found.advice.values()):,} hints are advice, "
              "not an edit")
    assert found.recipes >= 5000 and found.planned >= 500, (found.recipes, found.planned)
    # (a) is only as strong as the hints it can apply: a hint wording the parser stops reading would
    # turn into advice, and go untested (991 advice beside 5,091 edits today)
    assert found.hints_applied >= 3 * sum(found.advice.values()), found.advice.most_common(5)
    assert not found.crashes, found.crashes[:5]  # (c) no internal error
    assert not found.untyped, found.untyped[:5]  # (c) every problem at a key, with a hint
    assert not found.partial, found.partial[:5]  # (c) "partial" in the JSON where the text says so
    assert not found.unfixed, found.unfixed[:5]  # (a) each hint removes its problem
    assert not found.labels, found.labels[:5]  # (b) labels follow from the model


def test_the_grid_covers_every_value_the_data_knows():
    """The axes are the data's, plus neighbours that do not exist: no release is left out of the draw."""
    axes = _axes()
    assert set(axes.torch) >= {r.version for r in compat.torch_releases()}
    assert set(axes.flash_attn) >= {r.version for r in compat.flash_attn_releases()}
    assert set(axes.bitsandbytes) >= {r.version for r in compat.bitsandbytes_releases()}
    assert set(axes.cuda) >= {t.major_minor for t in compat.toolkits()}
    for values, known in ((axes.torch, [r.version for r in compat.torch_releases()]),
                          (axes.cuda, [t.version for t in compat.toolkits()])):
        assert any(v and v not in known and not any(k.startswith(v + ".") for k in known) for v in values)
    assert UNKNOWN_OS in axes.os and UNKNOWN_OS not in OS_PYTHON


def test_the_properties_can_fail():
    """Each check of the walk catches what it guards: a hint that is not applied, a label the model
    contradicts, a refusal that says "known only in part" without the partial flag."""
    found = Findings()
    case = {"cuda": "12.1", "flavor": "base", "source": "wheels", "os": "debian12", "python": "3.11",
            "torch": "2.4.1", "flash_attn": None, "bitsandbytes": None}
    plan = _plan(case, {}).plan
    assert plan is not None
    from buildkit_py import label_keys as K
    stale = dict(plan.labels) | {K.CUDNN_VERSION: "8"}
    import dataclasses
    _check_outcome(case, Outcome(dataclasses.replace(plan, labels=stale), ()), found)
    assert found.labels
    refused = CompatibilityError("bitsandbytes", "0.31.8", "data", "x", "bitsandbytes 0.31.8 is known only in part: x",
                                 hint="h", at=None)
    _check_outcome(case, Outcome(None, (refused,)), found)
    assert found.partial and found.untyped  # no partial flag; no key or line


def test_hints_are_read_as_a_user_would_apply_them():
    """The hint forms the resolver writes, each alternative an edit of the recipe; advice is no edit."""
    case = {"cuda": "13.1", "flavor": "base", "source": "nvidia", "os": "ubuntu24.04", "python": "3.14",
            "torch": "2.5.1", "flash_attn": "0.2.1", "bitsandbytes": "0.41.0"}
    cases = [
        ('use cuda: "12.4" on ubuntu22.04 (the nearest CUDA torch 2.5.1 has a build for; nvidia/cuda has no base '
         "image of it on ubuntu24.04) or torch 2.9.1 (the nearest release with a cu131 build for Python 3.14)",
         [{"cuda": "12.4", "os": "ubuntu22.04"}, {"torch": "2.9.1"}]),
        ('use python: "3.13", an Ubuntu base, or a python:3.14 base image', [{"python": "3.13"}]),
        ("use bitsandbytes==0.45.0 (the nearest release that fits CUDA 12.4, Python 3.11 and torch 1.13.1)",
         [{"bitsandbytes": "0.45.0"}]),
        ("use flash-attn 2.8.3.post2, 2.8.3 (the newest fully recorded that fit CUDA 12.4 and Python 3.11)",
         [{"flash_attn": "2.8.3.post2"}]),
        ('use a released CUDA toolkit, e.g. "13.4" (the nearest with an nvidia/cuda base image on ubuntu24.04)',
         [{"cuda": "13.4"}]),
        ("plan without --offline (the index reachable) to look it up, or use torch 2.14.1 (the newest imgbuild "
         "knows with a cu130 build for Python 3.11)", [{"torch": "2.14.1"}]),
        ("drop pip[1] (torch brings cuDNN 9.1.0.70)", [{"bitsandbytes": None}]),
        ("use cuda.source: wheels with a base.image for that OS", []),
        ("no bitsandbytes release imgbuild knows fits CUDA 13.0, Python 3.11 and torch 2.1.2; its newest are 0.50.2",
         []),
    ]
    for hint, want in cases:
        assert [{k: v for k, v in edited.items() if case[k] != v} for _, edited in _edits(case, hint)] == want, hint


def test_the_cli_json_says_partial_as_the_library_does(tmp_path):
    """The library's partial flag is what `plan --json --offline` prints: a recipe pinning a bitsandbytes
    release known only in part, and one refused for a release that is not partial."""
    partial = next(r.version for r in compat.bitsandbytes_releases() if r.partial)
    for version, want in ((partial, True), ("0.41.0", False)):  # 0.41.0 ships no CUDA 12.4 library
        path = tmp_path / f"{version}.yaml"
        path.write_text(_text({"cuda": "12.4", "flavor": "base", "source": "wheels", "os": "debian12",
                               "python": "3.11", "torch": "2.4.1", "flash_attn": None, "bitsandbytes": version}))
        code, out, _err = run_cli("plan", "--json", "--offline", str(path))
        doc = json.loads(out)
        assert code == 2, doc
        mine = [e for e in doc.get("errors", [doc]) if e["key"] == "pip[0]"]
        assert mine and all(e["partial"] is want for e in mine), (version, mine)

