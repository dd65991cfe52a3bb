"""The cuDNN label comes from what the pins bring (issue 28), and nothing the plan decides can fail the
default image tests.

The first half: each source of an image's cuDNN (torch's wheel requirement, a shared base, an
nvidia/cuda cudnn tag, a pip pin, the wheel installed for cuda.cudnn) gives the label, written in the
recipe or not, and each contradiction is refused before building with the nearest fix.

The second half holds the plan to the checks: for every recipe of a grid across sources, flavors,
CUDA minors, torch releases, cuda.cudnn and pip pins, the image those pins make is modelled from the plan's
own install steps and the base's tag (what pip and the base put there, not the labels), and the
default label checks (analysis.image_checks.label_checks) run on it: a label the checks demand is one
the plan stamps, and a label the plan stamps is true of that image.
"""

from __future__ import annotations

import dataclasses
import itertools
import re

import pytest
from helpers import MODELLED_LABELS, TODAY, model_image, plan_of, write_recipe

from buildkit_py import compat
from buildkit_py import label_keys as K
from buildkit_py.analysis.image_checks import FAILED, label_checks
from buildkit_py.compat.bases import BaseFacts
from buildkit_py.compat.resolve import resolve
from buildkit_py.errors import CompatibilityError, CompatibilityErrors
from buildkit_py.recipe.model import load_recipe


def _recipe(tmp_path, *, cuda="12.1", source="wheels", flavor="base", torch=None, cudnn=None, pip=(),
            base=None, python=None):
    base = base or ("{image: debian:bookworm-slim}" if source == "wheels" else "{os: ubuntu22.04}")
    python = python or ("3.11" if source == "wheels" else "3.10")
    text = (f'name: team/x\ncuda: {{version: "{cuda}", source: {source}, flavor: {flavor}'
            + (f', cudnn: "{cudnn}"' if cudnn else "") + f"}}\nbase: {base}\npython: \"{python}\"\n"
            + (f'torch: "{torch}"\n' if torch else "")
            + (f"pip: [{', '.join(pip)}]\n" if pip else ""))
    return load_recipe(write_recipe(tmp_path, text))


# --- where the cuDNN comes from --------------------------------------------------------------------------


@pytest.mark.parametrize(("cuda", "torch", "label", "wheel"), [
    ("12.1", "2.4.1", "9.1.0.70", "nvidia-cudnn-cu12==9.1.0.70"),  # recipes/inference-slim.yaml
    ("13.0", "2.14.0", "9.24.0.43", "nvidia-cudnn-cu13==9.24.0.43"),  # the second case
    ("12.1", "2.1.2", "8.9.2.26", "nvidia-cudnn-cu12==8.9.2.26"),
])
def test_torch_from_the_registry_labels_its_wheels_cudnn_unasked(tmp_path, cuda, torch, label, wheel):
    res = resolve(_recipe(tmp_path, cuda=cuda, torch=torch), today=TODAY)
    assert res.cudnn == label
    assert res.cudnn_origin == f"torch {res.torch_label} (its wheel requires {wheel})"


def test_another_cuda_variant_of_torch_labels_the_major_only(tmp_path):
    """torch 2.4.1+cu124 comes from PyTorch's index, whose exact nvidia-cudnn pin is not recorded:
    only the major that every variant of the release is built on is claimed."""
    res = resolve(_recipe(tmp_path, cuda="12.4", torch="2.4.1"), today=TODAY)
    assert (res.torch_label, res.cudnn) == ("2.4.1+cu124", "9")
    assert "every CUDA variant of 2.4.1 on cuDNN 9" in (res.cudnn_origin or "")


def test_nvidia_base_without_cudnn_gets_torchs(tmp_path):
    """source: nvidia on a runtime tag with no cuDNN: torch's wheel is the image's only cuDNN."""
    res = resolve(_recipe(tmp_path, cuda="12.1", source="nvidia", flavor="runtime", torch="2.4.1"), today=TODAY)
    assert res.base_image == "nvidia/cuda:12.1.1-runtime-ubuntu22.04"
    assert res.cudnn == "9.1.0.70" and res.cudnn_origin.startswith("torch 2.4.1+cu121")


def test_a_cudnn_torch_does_not_load_is_refused_on_every_source(tmp_path):
    """cuda.cudnn "8" on an nvidia/cuda cudnn8 image with torch 2.4.1, which loads its own cuDNN 9: the
    label would name a cuDNN the framework never loads (before, only source: wheels refused it)."""
    with pytest.raises(CompatibilityError) as info:
        resolve(_recipe(tmp_path, cuda="12.1", source="nvidia", flavor="runtime", torch="2.4.1", cudnn="8"),
                today=TODAY)
    err = info.value
    assert (err.key, err.component, err.version) == ("cuda.cudnn", "cudnn", "8")
    assert "torch 2.4.1+cu121" in err.message and "brings cuDNN 9.1.0.70" in err.message
    assert err.hint.startswith('use cudnn: "9"')
    fixed = resolve(_recipe(tmp_path, cuda="12.1", source="nvidia", flavor="runtime", torch="2.4.1"), today=TODAY)
    assert fixed.cudnn == "9.1.0.70"


def test_a_shared_base_that_carries_cudnn_gives_the_label(tmp_path):
    """An imgbuild base labelled with its cuDNN, used with no cuda.cudnn: the label is the base's."""
    ref = "127.0.0.1:5000/platform/cuda-base:12.4"
    facts = BaseFacts(ref, "sha256:" + "a" * 64, labels={K.CUDA_VERSION: "12.4.1", K.CUDA_FLAVOR: "runtime",
                                                        K.CUDNN_VERSION: "9", K.CUDA_SOURCE: "nvidia",
                                                        K.PYTHON_VERSION: "3.11"})
    res = resolve(_recipe(tmp_path, cuda="12.4", flavor="runtime", base=f"{{image: {ref}}}"), base=facts, today=TODAY)
    assert res.cudnn == "9" and res.cudnn_origin == f"the base {ref} (its cudnn label)"


def test_an_nvidia_cudnn_tag_named_as_base_gives_the_label(tmp_path):
    image = "nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04"
    res = resolve(_recipe(tmp_path, cuda="12.4", source="nvidia", flavor="runtime", base=f"{{image: {image}}}"),
                  today=TODAY)
    assert res.cudnn == "9" and "its tag 12.4.1-cudnn-runtime-ubuntu22.04" in res.cudnn_origin


def test_a_pinned_cudnn_wheel_gives_the_label(tmp_path):
    res = resolve(_recipe(tmp_path, cuda="12.4", pip=("nvidia-cudnn-cu12==9.1.0.70",)), today=TODAY)
    assert (res.cudnn, res.cudnn_origin) == ("9.1.0.70", "pip[0] (nvidia-cudnn-cu12==9.1.0.70)")


def test_a_pinned_cudnn_beside_torchs_own_is_refused(tmp_path):
    """torch 2.4.1 requires nvidia-cudnn-cu12==9.1.0.70 exactly: pip cannot install another beside it."""
    with pytest.raises(CompatibilityError) as info:
        resolve(_recipe(tmp_path, torch="2.4.1", pip=("six==1.16.0", "nvidia-cudnn-cu12==9.3.0.75")), today=TODAY)
    err = info.value
    assert err.key == "pip[1]" and "pip cannot install both" in err.message
    assert err.hint == "drop pip[1] (torch brings cuDNN 9.1.0.70)"
    same = resolve(_recipe(tmp_path, torch="2.4.1", pip=("nvidia-cudnn-cu12==9.1.0.70",)), today=TODAY)
    assert same.cudnn == "9.1.0.70"


def test_a_cudnn_pin_of_another_major_than_cuda_cudnn_is_refused(tmp_path):
    with pytest.raises(CompatibilityError) as info:
        resolve(_recipe(tmp_path, cuda="12.1", cudnn="9", pip=("nvidia-cudnn-cu12==8.9.2.26",)), today=TODAY)
    assert info.value.key == "cuda.cudnn" and "pip[0] (nvidia-cudnn-cu12==8.9.2.26) brings cuDNN 8.9.2.26" in \
        info.value.message


def test_no_torch_no_cudnn_no_label(tmp_path):
    res = resolve(_recipe(tmp_path, cuda="12.4"), today=TODAY)
    assert res.cudnn is None and res.cudnn_origin is None
    assert K.CUDNN_VERSION not in plan_of(_recipe(tmp_path, cuda="12.4")).labels


def test_plan_says_where_the_cudnn_comes_from(tmp_path):
    from helpers import run_cli
    path = write_recipe(tmp_path, 'name: team/x\ncuda: {version: "12.1", source: wheels, flavor: base}\n'
                                  'base: {image: debian:bookworm-slim}\npython: "3.11"\ntorch: "2.4.1"\n')
    code, out, err = run_cli("plan", str(path))
    assert code == 0, err
    assert "  cudnn     9.1.0.70 from torch 2.4.1+cu121 (its wheel requires nvidia-cudnn-cu12==9.1.0.70)" in out


# --- the plan's labels against a model of the image its pins make ----------------------------------------

_TORCH = [None, "2.1.2", "2.4.1", "2.5.1", "2.7.1", "2.9.1", "2.12.0", "2.14.0", "2.14.1", "2.15.0"]
_CUDA = ["11.8", "12.1", "12.2", "12.4", "12.6", "12.8", "13.0", "13.2"]
_CUDNN_PINS = ["nvidia-cudnn-cu12==9.1.0.70", "nvidia-cudnn-cu12==8.9.2.26", "nvidia-cudnn-cu13==9.24.0.43"]


_CUDNN_WRITTEN = [None, "8", "9"]
_SOURCE_FLAVORS = [("wheels", "base"), ("wheels", "runtime"), ("nvidia", "base"), ("nvidia", "runtime"),
                   ("nvidia", "devel")]


@pytest.mark.parametrize(("source", "flavor"), _SOURCE_FLAVORS)
def test_no_label_the_plan_stamps_or_omits_fails_the_default_checks(tmp_path, source, flavor):
    """The whole grid, not a sample (960 recipes per source and flavor, 4,800 in all; 96 to 250 of each
    960 plan, the rest are refused before building): a plan that says yes stamps the labels the default
    checks demand of the image those pins make, each true of it. A refusal is a CompatibilityError;
    anything else raised fails the test."""
    planned, wrong = 0, []
    for cuda, torch, cudnn, pip in itertools.product(_CUDA, _TORCH, _CUDNN_WRITTEN,
                                                     [(), *((p,) for p in _CUDNN_PINS)]):
        recipe = _recipe(tmp_path, cuda=cuda, source=source, flavor=flavor, torch=torch, cudnn=cudnn, pip=pip)
        try:
            plan = plan_of(recipe)
        except CompatibilityError:
            continue  # refused before building: nothing is stamped, nothing can fail later
        planned += 1
        results = label_checks(plan.labels, model_image(plan), recipe)
        wrong += [(cuda, torch, cudnn, pip, r.name, r.detail) for r in results
                  if r.status == FAILED and r.name.removeprefix("label ") in MODELLED_LABELS]
    assert planned >= 90, planned  # the grid exercises passing plans, not only refusals
    assert not wrong, wrong[:5]


def test_the_model_catches_a_plan_that_leaves_the_cudnn_label_out(tmp_path):
    """The property above can fail: the labels of inference-slim's plan without the cudnn label (what
    the plan stamped before issue 28) fail the checks on the modelled image."""
    plan = plan_of(_recipe(tmp_path, cuda="12.1", torch="2.4.1"))
    labels = {k: v for k, v in plan.labels.items() if k != K.CUDNN_VERSION}
    results = {r.name: r for r in label_checks(labels, model_image(plan))}
    assert results[f"label {K.CUDNN_VERSION}"].status == FAILED
    stale = dataclasses.replace(plan, labels={**plan.labels, K.CUDNN_VERSION: "8"})
    results = {r.name: r for r in label_checks(stale.labels, model_image(stale))}
    assert results[f"label {K.CUDNN_VERSION}"].status == FAILED


def test_a_large_torch_wheel_gets_the_cuda_runtime_installed(tmp_path):
    """torch 2.1.2+cu118 is a large wheel (its CUDA sits in torch/lib, no nvidia-* requirements: PyTorch
    PR #114620 made cu118 small only in 2.2.0): with source: wheels the plan used to install no CUDA
    runtime at all, so a bitsandbytes beside it found no libcudart and every CUDA label was false (issue 29,
    found by the grid above). The runtime wheel is installed now, and the cuDNN label is torch's own."""
    res = resolve(_recipe(tmp_path, cuda="11.8", torch="2.1.2"), today=TODAY)
    assert res.torch_label == "2.1.2+cu118" and res.torch_index_url
    assert any(p.startswith("nvidia-cuda-runtime-cu11==11.8.") for p in res.cuda_wheels), res.cuda_wheels
    assert res.cudnn == "8" and res.cudnn_origin == "torch 2.1.2+cu118 (a large wheel: cuDNN 8 inside torch/lib)"
    small = resolve(_recipe(tmp_path, cuda="11.8", torch="2.4.1"), today=TODAY)  # a small wheel: torch brings its CUDA
    assert not any(p.startswith("nvidia-cuda-runtime") for p in small.cuda_wheels), small.cuda_wheels


def test_a_cudnn_clash_comes_in_the_same_run_as_the_other_pin_problems(tmp_path):
    """issue 29: a cuDNN clash, a flash-attn torch floor and a bitsandbytes torch floor came one per run."""
    recipe = _recipe(tmp_path, cuda="12.1", torch="2.1.2", cudnn="9",
                     pip=('"flash-attn==2.8.3"', '"bitsandbytes==0.48.2"'))
    with pytest.raises(CompatibilityErrors) as info:
        resolve(recipe, today=TODAY)
    keys = [e.key for e in info.value.errors]
    assert keys == ["pip[0]", "pip[1]", "cuda.cudnn"], [e.message for e in info.value.errors]


# --- every hint, applied, removes its problem -------------------------------------------------------------

_USE_CUDNN = re.compile(r'^use cudnn: "(\d+)"')
_USE_PIN = re.compile(r"^use ([A-Za-z0-9_.\-]+)==([^\s,)]+)")
_DROP_PIP = re.compile(r"^drop pip\[(\d+)\]")


def _apply_hint(case: dict, hint: str) -> dict | None:
    """The recipe with ``hint`` applied as a user would type it; None where the hint is no edit of one
    key (a choice between keys, or advice)."""
    case = dict(case)
    if m := _USE_CUDNN.match(hint):
        case["cudnn"] = m.group(1)
    elif m := _DROP_PIP.match(hint):
        pins = list(case["pip"])
        del pins[int(m.group(1))]
        case["pip"] = tuple(pins)
    elif m := _USE_PIN.match(hint):
        name = m.group(1)
        case["pip"] = tuple(f"{name}=={m.group(2)}" if p.split("==")[0] == name else p for p in case["pip"])
    elif hint.startswith("drop cuda.cudnn"):
        case["cudnn"] = None
    else:
        return None
    return case


_HINT_PINS = ["nvidia-cudnn-cu12==9.1.0.70", "nvidia-cudnn-cu12==8.9.2.26", "nvidia-cublas-cu12==12.1.3.1",
              "flash-attn==2.8.3", "flash-attn==2.5.8", "bitsandbytes==0.48.2"]


def _problems(tmp_path, case: dict) -> list[CompatibilityError]:
    try:
        resolve(_recipe(tmp_path, **case), today=TODAY)
    except CompatibilityErrors as exc:
        return exc.errors
    except CompatibilityError as exc:
        return [exc]
    return []


@pytest.mark.parametrize("source", ["wheels", "nvidia"])
def test_every_hint_applied_removes_its_problem(tmp_path, source):
    """issue 29: a grid of recipes with cuDNN, CUDA-wheel, flash-attn and bitsandbytes pins; for each
    problem whose hint is an edit of one key (use cudnn: "9", use NAME==V, drop pip[i]), the recipe with
    that edit no longer has that problem at that key."""
    flavor = "base" if source == "wheels" else "runtime"
    applied = 0
    for cuda, torch, cudnn, pin in itertools.product(["12.1", "12.4", "12.8", "13.0"],
                                                     ["2.1.2", "2.4.1", "2.5.1", "2.8.0", "2.14.1"],
                                                     [None, "8", "9"], [(), *((p,) for p in _HINT_PINS)]):
        case = {"cuda": cuda, "source": source, "flavor": flavor, "torch": torch, "cudnn": cudnn,
                "pip": tuple(f'"{p}"' for p in pin)}
        for problem in _problems(tmp_path, case):
            fixed = _apply_hint({**case, "pip": tuple(p.strip('"') for p in case["pip"])}, problem.hint or "")
            if fixed is None:
                continue
            applied += 1
            fixed["pip"] = tuple(f'"{p}"' for p in fixed["pip"])
            same = [e for e in _problems(tmp_path, fixed) if e.key == problem.key and e.reason == problem.reason]
            assert not same, (case, problem.hint, same[0].message)
    assert applied >= 50, applied


def test_every_refusal_on_a_row_known_only_in_part_says_partial(tmp_path):
    """issue 29: '"partial": true in --json wherever the text says known only in part'. Every partial row
    of the flash-attn and bitsandbytes tables, pinned, is refused as partial (the JSON's partial key)."""
    from buildkit_py.errors import CompatibilityErrors as Several

    cases = [("flash-attn", r.version) for r in compat.flash_attn_releases() if r.partial]
    cases += [("bitsandbytes", r.version) for r in compat.bitsandbytes_releases() if r.partial]
    assert cases
    for name, version in cases:
        recipe = _recipe(tmp_path, cuda="12.4", torch="2.4.1", pip=(f'"{name}=={version}"',))
        with pytest.raises(CompatibilityError) as info:
            resolve(recipe, today=TODAY)
        errors = info.value.errors if isinstance(info.value, Several) else [info.value]
        mine = [e for e in errors if e.key == "pip[0]"]
        assert mine and all(e.partial for e in mine), (name, version, [e.message for e in mine])
