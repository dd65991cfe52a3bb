"""End to end, on every docker engine (issue 24: 1): the recipe's ``test:`` gates the push. A
small image (CUDA 12.4's cudart from wheels, one pin, no torch) built with --push runs its label
and import checks and its test: commands first; passing, it is pushed; a gpu: true test is skipped
with its reason here (no GPU runtime on this machine). A failing test pushes nothing, keeps the
image only as REPO:rejected and exits 1 with the command's output shown once. `imgbuild test`
runs the same tests alone, on a recipe or an image, and fails on a deliberately false label."""

import json

import pytest
from conftest import _client, on_every_engine
from helpers import CA_ARGS, run_cli, tiny_recipe, write_recipe

from buildkit_py import oci
from buildkit_py.errors import ManifestNotFound
from buildkit_py.oci.manifests import fetch_manifest

pytestmark = pytest.mark.e2e


def _recipe(folder, name, base, extra_tests=""):
    (folder / "checks").mkdir(parents=True, exist_ok=True)
    (folder / "checks" / "smoke.py").write_text("import six, sys\nprint('smoke ok', six.__version__)\n")
    return write_recipe(folder, f"""\
name: {name}
version: "1"
cuda: {{version: "12.4", source: wheels, flavor: base}}
base: {{image: {base}}}
python: "3.11"
pip: ["six==1.16.0"]
test:
  - python -c "import six; assert six.PY3"
  - {{script: checks/smoke.py, name: smoke}}
  - {{run: nvidia-smi, name: gpu-visible, gpu: true}}
{extra_tests}""")


def test_passing_tests_then_push(tmp_path, engine, logged_in, base_image, unique_name, cleanup_images,
                                 registry_refs):
    recipe = _recipe(tmp_path, unique_name, base_image)
    code, out, err = run_cli("build", str(recipe), "--registry", logged_in.address, "--push", "--json",
                             "--progress", "plain", *CA_ARGS)
    assert code == 0, err
    report = json.loads(out)
    cleanup_images.extend(report["tags"])
    registry_refs.extend(p["ref"] for p in report["pushes"])
    tests = {r["name"]: r for r in report["tests"]["results"]}
    assert report["tests"]["failed"] == 0 and report["tests"]["gpu"] is False
    assert {n for n, r in tests.items() if r["status"] == "passed"} >= {
        "label io.imgbuild.cuda.version", "label io.imgbuild.cuda.source", "label io.imgbuild.cuda.flavor",
        "label io.imgbuild.python.version", "label io.imgbuild.os", "label io.imgbuild.installer",
        "label io.imgbuild.recipe.digest", "import six", 'python -c "import six; assert six.PY3"', "smoke"}
    assert tests["gpu-visible"]["status"] == "skipped"
    assert "has no GPU runtime" in tests["gpu-visible"]["detail"]
    assert "test skipped gpu-visible: needs a GPU (gpu: true)" in err  # the clear line, as progress
    # the push that follows the tests (from the cache, on buildx) shows its export and push, not
    # every step a second time
    assert err.count(": imgbuild-step=os;") == 1, err
    [push] = report["pushes"]
    _, digest, _ = fetch_manifest(oci.parse_reference(report["tags"][0]))  # the tag in the registry
    assert digest == push["digest"]

    # the same tests alone: on the recipe, on the image (labels and imports only), as JSON
    code, out, err = run_cli("test", str(recipe), "--registry", logged_in.address, "--json")
    assert code == 0, err
    alone = json.loads(out)
    assert alone["schema"] == 1 and alone["failed"] == 0 and alone["passed"] == report["tests"]["passed"]
    code, out, err = run_cli("test", report["tags"][0])
    assert code == 0, err
    assert "label io.imgbuild.recipe.digest: no recipe given" in err
    # eight labels against the content; the recipe digest skipped (no recipe), no pins known
    assert out == f"tests    {report['tags'][0]} (linux/amd64): 8 passed, 0 failed, 1 skipped\n"  # its platform named

    # a deliberately false label on the same content: the check fails, exit 1
    false = f"{unique_name}-false:1"
    created = _client(engine, "create", report["tags"][0], "true")  # the image has no CMD
    assert created.returncode == 0, created.stderr
    container = created.stdout.strip()
    try:
        done = _client(engine, "commit", "--change", "LABEL io.imgbuild.python.version=3.9", container, false)
        assert done.returncode == 0, done.stderr
    finally:
        _client(engine, "rm", container)
    cleanup_images.append(false)
    code, out, err = run_cli("test", false, "--json")
    assert code == 1, err
    bad = {r["name"]: r for r in json.loads(out)["results"] if r["status"] == "failed"}
    assert list(bad) == ["label io.imgbuild.python.version"]
    assert bad["label io.imgbuild.python.version"]["detail"].startswith("says '3.9', but python is 3.11.")


def test_a_failing_test_pushes_nothing_and_keeps_the_image_as_rejected(tmp_path, engine, logged_in, base_image,
                                                                       unique_name, cleanup_images):
    recipe = _recipe(tmp_path, unique_name, base_image, "  - name: answer\n"
                     "    run: python -c \"print('checking ' + 'the answer'); raise SystemExit(7)\"\n"
                     # a hung test (sleep as PID 1 ignores the client's SIGINT) fails at its timeout
                     "  - {run: 'exec sleep 300', name: hang, timeout: 3}\n")
    tag = f"{logged_in.address}/{unique_name}:1"
    rejected = f"{logged_in.address}/{unique_name}:rejected"
    cleanup_images.extend([tag, rejected])
    code, out, err = run_cli("build", str(recipe), "--registry", logged_in.address, "--push", "--progress", "quiet",
                             *CA_ARGS)
    assert code == 1, err
    assert out == ""
    assert f"2 of 15 tests of {tag} failed:\n- answer: exit 7" in err
    assert "- hang: still running after its timeout of 3 s: the container was removed" in err
    assert err.count("checking the answer") == 1  # the command's output, once
    left = _client(engine, "ps", "-aq", "--filter", f"ancestor={rejected}")
    assert left.returncode == 0 and left.stdout.strip() == "", left.stdout  # the hung container is gone
    assert f"nothing was pushed; the image is kept as {rejected}" in err and "Traceback" not in err
    with pytest.raises(ManifestNotFound):
        oci.get_manifest(tag)
    assert engine.image_attrs(rejected) is not None
    assert engine.image_attrs(tag) is None  # the tags it was given are gone: nothing runs or pushes it by them

    # `imgbuild test` on the rejected image, with the recipe's tests: the same failure, exit 1
    code, out, err = run_cli("test", str(recipe), "--tag", rejected, "--progress", "quiet")
    assert code == 1
    assert "--- output of answer" in out and out.count("checking the answer") == 1


def test_a_missing_image_is_exit_2_with_a_hint(engine, unique_name):
    code, out, err = run_cli("test", f"{unique_name}:nope")
    assert (code, out) == (2, "")
    assert f"no image {unique_name}:nope in the" in err and "hint: pull it first" in err


@on_every_engine
def test_an_image_without_python_on_its_path_is_a_failed_test_kept_as_rejected(tmp_path, engine, base_image,
                                                                                unique_name, cleanup_images):
    """issue 31: 5: the recipe's env sets a PATH without the venv (the image has no other python):
    the label checks, which run the image's own python, got exit 127 from the engine, and the gate
    ended in an InspectError that left the image under its release tag. Now it is a failed test
    (named, with the engine's own words), and the image is kept only as REPO:rejected, exit 1."""
    recipe = write_recipe(tmp_path, tiny_recipe(unique_name, base_image)
                          + "env: {PATH: /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}\n")
    tag, rejected = f"{unique_name}:1", f"{unique_name}:rejected"
    cleanup_images.extend([tag, rejected])
    code, out, err = run_cli("build", str(recipe), "--test", "--json", "--progress", "quiet", *CA_ARGS)
    assert code == 1, err
    doc = json.loads(out)
    assert (doc["error"], doc["kept_as"]) == ("ImageTestFailed", rejected), doc
    [failure] = doc["failures"]
    assert (failure["name"], failure["exit_code"]) == ("python on PATH", 127)
    assert failure["detail"].startswith("there is no python on the image's PATH (exit 127)")
    assert "python" in failure["output"] and "not found" in failure["output"]  # the engine's words
    assert f"nothing was pushed; the image is kept as {rejected}" in err and "Traceback" not in err
    assert engine.image_attrs(rejected) is not None
    assert engine.image_attrs(tag) is None  # the release tag is gone

    # `imgbuild test` of it: the same failed test, exit 1, no internal error
    code, out, err = run_cli("test", rejected, "--json")
    assert code == 1, err
    assert [r["name"] for r in json.loads(out)["results"] if r["status"] == "failed"] == ["python on PATH"]
