"""Every recipe shipped in recipes/ passes its own default tests (issue 28: 3).

What a user copies first must build and push. Each shipped recipe that compiles nothing from source
and needs nothing this machine cannot reach is built with its tests gating a push (``build --push``:
the label checks, the import of each pin, then the push), on one engine, the first of
IMGBUILD_TEST_ENGINES: demo here, and inference-slim (a real torch image, ~3 GB of wheels) in
test_e2e_torch.py, whose torch checks assert on that same build (BUILT_ELSEWHERE). The others are
planned, every matrix variant, and the labels each plan stamps are checked by the same default checks
against the image its pins make (helpers.model_image: the plan's install steps and the base's tag),
each with the reason it is not built here. A new recipe must be put in one list or the other.
"""

import json
from pathlib import Path

import pytest
from conftest import ENGINE_NAMES
from helpers import CA_ARGS, MODELLED_LABELS, TODAY, model_image, run_cli

from buildkit_py import label_keys as K
from buildkit_py import oci
from buildkit_py.analysis.image_checks import FAILED, label_checks
from buildkit_py.compat.resolve import resolve
from buildkit_py.oci.manifests import fetch_manifest
from buildkit_py.plan.build_plan import make_plan
from buildkit_py.plan.matrix import load_matrix

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
BUILT = ("demo", "inference-slim")
# built, with this file's checks, by the test that shares its build: one torch build, not two
BUILT_ELSEWHERE = {
    "inference-slim": "test_e2e_torch.py::test_the_shipped_inference_slim_recipe_passes_its_tests_and_pushes",
}
NOT_BUILT = {
    "kernels-from-source": "it compiles flash-attn with nvcc: hours on this 2-core machine",
    "pytorch-train": "its base ubuntu:22.04 (Docker Hub), torch 2.4.1+cu124 (PyTorch's index) and flash-attn's "
                     "GitHub wheel are not reachable from this machine",
    "team-base": "its base is an nvidia/cuda image on Docker Hub, not reachable from this machine",
    "matrix": "its base ubuntu:22.04 (Docker Hub) and torch's cu121/cu126 builds (PyTorch's index) are not "
              "reachable from this machine",
}


def test_every_shipped_recipe_is_built_or_says_why_not():
    shipped = {p.stem for p in RECIPES.glob("*.yaml")}
    assert shipped == set(BUILT) | set(NOT_BUILT), shipped ^ (set(BUILT) | set(NOT_BUILT))
    assert not set(BUILT) & set(NOT_BUILT)
    for name, where in BUILT_ELSEWHERE.items():  # the test that builds it exists, under that name
        module, test = where.split("::")
        assert name in BUILT and f"def {test}(" in (Path(__file__).parent / module).read_text(), where


@pytest.mark.parametrize("name", sorted(NOT_BUILT))
def test_a_recipe_not_built_here_plans_labels_its_image_would_pass(name):
    """Not built here (see NOT_BUILT): each variant plans, and no default label check would fail on
    the image its pins make: the cuDNN the torch wheel brings is labelled, each label is true."""
    matrix = load_matrix(RECIPES / f"{name}.yaml", resolver=lambda recipe: resolve(recipe, today=TODAY))
    assert matrix.variants, matrix.dropped
    for variant in matrix.variants:
        plan = make_plan(variant.recipe, resolution=variant.resolution)
        results = label_checks(plan.labels, model_image(plan), variant.recipe)
        failed = [(r.name, r.detail) for r in results
                  if r.status == FAILED and r.name.removeprefix("label ") in MODELLED_LABELS]
        assert not failed, (variant.id, failed)
        if variant.recipe.torch:
            assert K.CUDNN_VERSION in plan.labels, (variant.id, plan.labels)


@pytest.mark.e2e
@pytest.mark.parametrize("engine", ENGINE_NAMES[:1], indirect=True)
@pytest.mark.parametrize("name", [n for n in BUILT if n not in BUILT_ELSEWHERE])
def test_a_shipped_recipe_passes_its_tests_and_pushes(name, engine, logged_in, cleanup_images, registry_refs):
    """``imgbuild build recipes/NAME.yaml --push``, as the README tells a user: the gate runs every
    default test, none fails, and the registry holds the digest that was tested."""
    code, out, err = run_cli("build", str(RECIPES / f"{name}.yaml"), "--registry", logged_in.address, "--push",
                             "--json", "--progress", "quiet", *CA_ARGS)
    report = json.loads(out) if out else {}
    cleanup_images.extend(report.get("tags", ()))
    registry_refs.extend(p["ref"] for p in report.get("pushes", ()))
    assert code == 0, err
    tests = report["tests"]
    assert tests["failed"] == 0 and tests["passed"] > 0, tests
    [push] = report["pushes"]
    _, digest, _ = fetch_manifest(oci.parse_reference(push["ref"]))
    assert digest == push["digest"]
