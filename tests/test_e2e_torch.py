"""A real PyTorch image, built from the Python registry and run: torch 2.14.1 is the cu130
build there (it requires cuda-toolkit==13.0.3 and the nvidia-* wheels, about 3 GB). The
answer torch gives inside the container must match the io.imgbuild.* labels on the image.

The image is the shipped recipes/inference-slim.yaml (torch 2.14.1, CUDA 13.0 from wheels, base
flavor), under a repository name of this run: test_e2e_recipes.py's claim that every shipped
recipe passes its default tests and pushes is checked here for it, on the same build
(``slim_build``), rather than building the same torch stack a second time (each build took 4-5
minutes of CI).

One build, on one engine only (the first of IMGBUILD_TEST_ENGINES). Measured on this 2-core
machine: 6m10s with the torch wheels not yet in the pip cache (one torch layer, 5.9 GB image),
2m07s for the whole test with the cache warm and the torch stack in 13 RUN steps; so CI stays
well under 30 minutes (see TORCH_BUILD_BUDGET_S). Like every E2E test it fails, never
skips, under CI=true when the engine or registry is missing.

The recipe is locked first, so the SBOM of the image (issue 24 item 2) can name each wheel by
the sha256 the build installed it with: `imgbuild sbom IMAGE --generate --lock` reads the
image's layers and must find torch and its CUDA wheels with the lock's hashes.

The build pushes, so its default tests gate it (issue 28): every label checked against the image
(the cuDNN torch's wheel brings included, which the recipe does not name) and torch imported, before
the registry gets it. The test repository is deleted afterwards and `services.sh reclaim` collects
its blobs."""

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import ENGINE_NAMES, delete_manifests, new_repository, remove_images
from helpers import CA_ARGS, run_cli
from packaging.utils import canonicalize_name

from buildkit_py import label_keys as K
from buildkit_py import oci
from buildkit_py.oci.manifests import fetch_manifest

TORCH = "2.14.1"
TORCH_BUILD_BUDGET_S = 900  # the build alone; a cold pip cache on this machine took ~6 min
RECIPES = Path(__file__).resolve().parent.parent / "recipes"
SHIPPED = "inference-slim"

on_first_engine = pytest.mark.parametrize("engine", ENGINE_NAMES[:1], indirect=True)


@dataclass(frozen=True)
class SlimBuild:
    recipe: Path  # the copy that was built, its lock beside it
    lock_code: int
    lock_err: str
    code: int  # of `imgbuild build --push`
    err: str
    report: dict  # its --json report ({} when it printed none)
    took: float  # seconds, the build alone


@pytest.fixture(scope="module")
def slim_build(engine, base_image, registry, tmp_path_factory):
    """recipes/inference-slim.yaml (with the app/ it copies), renamed to a repository of this run,
    locked (so the SBOM below can name each wheel by the sha256 it was installed with), then built
    with ``build --push`` once on this engine: its default tests gate the push. Both tests below
    assert on this one build. Its login, images and pushed manifests are its own, removed after."""
    root = tmp_path_factory.mktemp("slim")
    shutil.copytree(RECIPES / "app", root / "app")
    text = yaml.safe_load((RECIPES / f"{SHIPPED}.yaml").read_text())
    text["name"] = new_repository()  # other runs share the registry and engines
    assert text["base"]["image"] == base_image  # the base services.sh makes (base_image fails in CI without it)
    recipe = root / f"{SHIPPED}.yaml"
    recipe.write_text(yaml.safe_dump(text, sort_keys=False))
    config = root / "docker-config"
    config.mkdir()
    tag = f"{registry.address}/{text['name']}:{text['version']}"  # removed even when the build raised
    report: dict = {}
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("DOCKER_CONFIG", str(config))
            code, _, err = run_cli("login", registry.address, "-u", registry.user, "--password-stdin",
                                   stdin=registry.password + "\n")
            assert code == 0, err
            lock_code, _, lock_err = run_cli("lock", str(recipe), *CA_ARGS)  # every wheel by sha256, for the SBOM
            code, err, took = 1, lock_err, 0.0
            if lock_code == 0:
                started = time.monotonic()
                code, out, err = run_cli("build", str(recipe), "--registry", registry.address, "--push", "--json",
                                         "--progress", "quiet", *CA_ARGS)
                took = time.monotonic() - started
                report = json.loads(out) if out else {}
        yield SlimBuild(recipe, lock_code, lock_err, code, err, report, took)
    finally:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("DOCKER_CONFIG", str(config))
            delete_manifests([p["ref"] for p in report.get("pushes", ())])
        remove_images(engine, [tag, *report.get("tags", ())])


@on_first_engine
def test_the_shipped_inference_slim_recipe_passes_its_tests_and_pushes(engine, slim_build, logged_in):
    """test_e2e_recipes.py's claim for the inference-slim recipe: ``build --push`` runs every default
    test, none fails, its cuDNN (from torch's wheel, unasked) is labelled and found, torch imports,
    and the registry holds the digest that was tested."""
    assert slim_build.lock_code == 0, slim_build.lock_err
    assert slim_build.code == 0, slim_build.err
    tests = slim_build.report["tests"]
    assert tests["failed"] == 0 and tests["passed"] > 0, tests
    verdicts = {r["name"]: r for r in tests["results"]}
    cudnn = verdicts[f"label {K.CUDNN_VERSION}"]
    assert cudnn["status"] == "passed" and "libcudnn.so.9" in cudnn["detail"], cudnn
    assert verdicts["import torch"]["status"] == "passed", verdicts["import torch"]
    [push] = slim_build.report["pushes"]
    _, digest, _ = fetch_manifest(oci.parse_reference(push["ref"]))
    assert digest == push["digest"]


@on_first_engine
def test_torch_image_reports_what_its_labels_say(engine, slim_build, logged_in):
    assert slim_build.lock_code == 0, slim_build.lock_err
    recipe = slim_build.recipe
    lock_file = recipe.with_suffix(".lock")
    entry = yaml.safe_load(lock_file.read_text())["variants"]["default"]
    locked = {canonicalize_name(p["name"]): p["sha256"] for p in entry["packages"]["final"]}
    built = slim_build.report
    assert slim_build.code == 0, slim_build.err
    # the gate passed: no default test failed, torch imported, the unasked cuDNN labelled and true
    verdicts = {r["name"]: r for r in built["tests"]["results"]}
    assert built["tests"]["failed"] == 0, [r for r in verdicts.values() if r["status"] == "failed"]
    assert verdicts["import torch"]["status"] == "passed"
    assert verdicts["label io.imgbuild.cudnn.version"]["status"] == "passed"
    labels = built["labels"]
    assert labels["io.imgbuild.torch.version"] == f"{TORCH}+cu130"
    assert labels["io.imgbuild.cuda.version"] == "13.0.3"
    assert labels["io.imgbuild.cudnn.version"] == "9.24.0.43"  # torch 2.14.1's nvidia-cudnn-cu13 pin

    ref = built["tags"][0]
    # the recipe's entrypoint is its server (uvicorn): python instead, for the one question
    run = subprocess.run([*engine.client_argv(), "run", "--rm", "--network", "none", "--entrypoint", "python", ref,
                          "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
                         capture_output=True, text=True, timeout=300, env=engine.environment())
    assert run.returncode == 0, run.stderr
    version, cuda = run.stdout.split()
    assert version == labels["io.imgbuild.torch.version"]
    # torch.version.cuda is the toolkit it was built with, major.minor; the label has the patch.
    assert labels["io.imgbuild.cuda.version"].startswith(cuda + ".")

    # What the image carries, as its SBOM lists it: torch and the CUDA wheels, each with the
    # sha256 of the wheel the locked build installed (--require-hashes), read from the layers.
    code, out, err = run_cli("sbom", ref, "--generate", "--lock", str(lock_file), "--json")
    assert code == 0, err
    python = {canonicalize_name(c["name"]): c for c in json.loads(out)["components"] if c["type"] == "python"}
    assert python["torch"]["version"] == TORCH and python["torch"]["sha256"] == locked["torch"]
    cuda_wheels = sorted(n for n in python if n.startswith("nvidia-"))
    assert "nvidia-cuda-runtime" in cuda_wheels, cuda_wheels
    assert {n: python[n]["sha256"] for n in cuda_wheels} == {n: locked[n] for n in cuda_wheels}

    # Kernel coverage (issue 30) on the pushed torch image, read from the registry layer by layer:
    # an H100 runs it from SASS; a V100 (7.0) does not: CUDA 13 builds carry no sm_70 (Volta's
    # support ended with CUDA 13), so check names the library that decides it, before any GPU is
    # rented; and plan --gpu says the same before anything is built.
    pushed = built["pushes"][0]["ref"]
    code, out, err = run_cli("check", pushed, "--gpu", "H100", "--json")
    assert code == 0, err
    h100 = json.loads(out)
    assert h100["runs"] is True and h100["capability"] == "9.0"
    assert any(lib["path"].endswith("/libtorch_cuda.so") and "sm_90" in lib["sass"] for lib in h100["libraries"])
    code, out, err = run_cli("check", pushed, "--gpu", "V100", "--json")
    assert code == 1, err
    v100 = json.loads(out)
    assert (v100["verdict"], v100["runs"]) == ("no-kernel", False)
    assert v100["decided_by"] and "sm_70" not in next(
        lib["archs"] for lib in v100["libraries"] if lib["path"] == v100["decided_by"])
    code, _, err = run_cli("plan", str(recipe), "--gpu", "V100")
    assert code == 2 and "no kernel for V100" in err, err
    # last, so a slow machine still reports what the image holds (the build is shared: see slim_build)
    assert slim_build.took < TORCH_BUILD_BUDGET_S, f"torch build took {slim_build.took:.0f} s"
