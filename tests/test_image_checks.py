"""The tests run in a built image (issue 24: 1), below the engine: the recipe's ``test:`` key
(schema, model, located errors), the label verdicts as a pure function of the labels and the
image's facts (a false label fails, a missing one for what the image holds fails), the pin import
verdicts, and the one error that shows each failed command's output once. The same checks against
real images, the gate before a push and `imgbuild test` run in test_e2e_image_tests.py."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import fakes
import pytest
from helpers import run_cli, write_recipe

from buildkit_py.analysis import image_checks
from buildkit_py.analysis.image_checks import (
    FAILED,
    PASSED,
    SKIPPED,
    ImageFacts,
    TestReport,
    TestResult,
    failure_of,
    import_checks,
    label_checks,
    pinned,
    require_passed,
)
from buildkit_py.cli import test as cli_test
from buildkit_py.engine.run import ContainerExit
from buildkit_py.errors import ImageTestFailed, RecipeError
from buildkit_py.pipeline import OFFLINE
from buildkit_py.pipeline.build import run_tests
from buildkit_py.recipe.model import TestSpec, load_recipe, recipe_schema

HEAD = 'name: team/app\nversion: "1"\ncuda: {version: "12.4", source: wheels, flavor: base}\n' \
       'base: {image: debian:bookworm-slim}\npython: "3.11"\npip: ["six==1.16.0"]\n'

# What a real image of HEAD holds (read by read_facts from an image built in the E2E test).
FACTS = ImageFacts(
    pkgs={"nvidia-cuda-runtime-cu12": "12.4.127", "six": "1.16.0", "pip": "23.0.1"},
    installers={"nvidia-cuda-runtime-cu12": "uv", "six": "uv", "pip": "pip"},
    sonames=("libc.so.6", "libcudart.so.12"),
    cudart={"libcudart.so.12": 12040},
    python="3.11.2", os="debian12", nvcc=False,
    imports=({"name": "six", "want": "1.16.0", "version": "1.16.0", "modules": ["six"], "error": None},),
)
LABELS = {"io.imgbuild.cuda.version": "12.4.1", "io.imgbuild.cuda.flavor": "base",
          "io.imgbuild.cuda.source": "wheels", "io.imgbuild.cuda.driver.min": "550.54.15",
          "io.imgbuild.cuda.driver.min-compat": "525.60.13", "io.imgbuild.python.version": "3.11",
          "io.imgbuild.os": "debian12", "io.imgbuild.installer": "uv 0.13.9",
          "org.opencontainers.image.title": "team/app"}


def by_name(results: list[TestResult]) -> dict[str, TestResult]:
    return {r.name: r for r in results}


# --- the recipe's test: key -------------------------------------------------------------------------


def test_test_entries_short_and_long_form(tmp_path):
    (tmp_path / "checks").mkdir()
    (tmp_path / "checks" / "smoke.py").write_text("print('ok')\n")
    recipe = load_recipe(write_recipe(tmp_path, HEAD + """\
test:
  - python -c "import six"
  - {script: checks/smoke.py, gpu: true}
  - {run: nvidia-smi, name: gpu-visible, gpu: true}
"""))
    assert recipe.tests == (
        TestSpec(name='python -c "import six"', run='python -c "import six"', key="test[0]"),
        TestSpec(name="checks/smoke.py", script="checks/smoke.py", gpu=True, key="test[1]"),
        TestSpec(name="gpu-visible", run="nvidia-smi", gpu=True, key="test[2]"),
    )


def test_tests_do_not_change_the_recipe_digest(tmp_path):
    """Tests run in the image and are no part of it: editing one must not move the digest (the
    io.imgbuild.recipe.digest label) and so rebuild nothing."""
    plain = load_recipe(write_recipe(tmp_path / "a", HEAD))
    tested = load_recipe(write_recipe(tmp_path / "b", HEAD + "test: [\"true\"]\n"))
    assert tested.tests and plain.digest == tested.digest


def test_bad_test_entries_are_located(tmp_path):
    (tmp_path / "smoke.py").write_text("")
    path = write_recipe(tmp_path, HEAD + """\
test:
  - {run: "true", script: smoke.py}
  - {script: ../../etc/passwd}
  - {script: missing.py}
  - {name: only-a-name}
  - 3
  - {run: x, gpu: "yes"}
  - {run: y, runs: 1}
  - {run: "true"}
  - "true"
  - {run: z, timeout: 0}
  - {run: w, timeout: 1.5}
""")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    f = str(path)
    assert [i.render() for i in info.value.issues] == [
        f"{f}:8: test[0]: give run or script, not both",
        f"{f}:9: test[1].script: '../../etc/passwd' is outside the recipe's folder {tmp_path.resolve()}",
        f"{f}:10: test[2].script: 'missing.py' is not a file (looked for {tmp_path.resolve() / 'missing.py'})",
        f"{f}:11: test[3]: give one of run (a shell command) or script (a file in the recipe's folder)",
        f"{f}:12: test[4]: must be a command (a string) or a mapping with run or script",
        f"{f}:13: test[5].gpu: must be true or false, got a string",
        f"{f}:14: test[6].runs: unknown key (did you mean 'run'?); allowed: gpu, name, run, script, timeout",
        f"{f}:16: test[8]: 'true' is already the name of test[7]; give each test its own name",
        f"{f}:17: test[9].timeout: must be at least 1, got 0",
        f"{f}:18: test[10].timeout: must be a whole number, got a number",
    ]


def test_bad_test_entry_through_the_cli_exits_2_with_file_line_key(tmp_path):
    path = write_recipe(tmp_path, HEAD + "test:\n  - {run: \"\"}\n")
    code, out, err = run_cli("test", str(path))
    assert code == 2 and out == ""
    assert f"{path}:8: test[0].run: must not be empty" in err and "Traceback" not in err


def test_schema_publishes_the_test_key():
    items = recipe_schema()["properties"]["test"]["items"]
    assert items["type"] == ["string", "object"]
    assert set(items["properties"]) == {"run", "script", "name", "gpu", "timeout"}


def test_a_test_may_run_600_seconds_unless_it_says_otherwise(tmp_path):
    path = write_recipe(tmp_path, HEAD + 'test:\n  - "true"\n  - {run: "sleep 5", timeout: 2}\n')
    assert [t.timeout for t in load_recipe(path).tests] == [600, 2]


# --- labels against the image's facts -----------------------------------------------------------------


def test_true_labels_pass_and_say_what_was_found():
    results = by_name(label_checks(LABELS, FACTS))
    assert {r.status for r in results.values()} == {PASSED}
    assert set(results) == {f"label {k}" for k in LABELS if k.startswith("io.imgbuild.")}
    assert results["label io.imgbuild.cuda.version"].detail == "'12.4.1': the CUDA runtime reports 12.4"


@pytest.mark.parametrize(("label", "value", "detail"), [
    ("io.imgbuild.python.version", "3.10", "says '3.10', but python is 3.11.2"),
    ("io.imgbuild.cuda.version", "12.6", "says '12.6', but the CUDA runtime reports 12.4"),
    ("io.imgbuild.cuda.version", "13.0", "says '13.0', but no libcudart.so.13 in the loader cache"),
    ("io.imgbuild.os", "ubuntu22.04", "says 'ubuntu22.04', but /etc/os-release says debian12"),
    ("io.imgbuild.cuda.flavor", "runtime", "says 'runtime', but it lacks "),
    ("io.imgbuild.cuda.flavor", "devel", "says 'devel', but no nvcc on PATH"),
    ("io.imgbuild.cudnn.version", "9", "says '9', but no libcudnn in the loader cache or any installed wheel"),
    ("io.imgbuild.torch.version", "2.4.1", "says '2.4.1', but torch is not installed"),
    ("io.imgbuild.installer", "pip", "says 'pip', but no package of the image records pip"[:40]),
    ("io.imgbuild.cuda.driver.min", "470.0", "says '470.0', but imgbuild's data for CUDA 12.4.1 says 550.54.15"),
])
def test_a_false_label_fails(label, value, detail):
    """A deliberately false label: the check fails and names what the image holds instead."""
    facts = FACTS if label != "io.imgbuild.installer" else dataclasses.replace(FACTS, installers={"six": "uv"})
    result = by_name(label_checks({**LABELS, label: value}, facts))[f"label {label}"]
    assert result.status == FAILED and result.detail.startswith(detail), result


def test_a_label_missing_for_what_the_image_holds_fails():
    facts = dataclasses.replace(FACTS, pkgs={**FACTS.pkgs, "torch": "2.4.1"},
                                sonames=(*FACTS.sonames, "libcudnn.so.9"))
    results = by_name(label_checks(LABELS, facts))
    assert results["label io.imgbuild.torch.version"].detail == "is missing, but torch 2.4.1 is installed"
    assert results["label io.imgbuild.cudnn.version"].status == FAILED


def test_a_cudnn_a_wheel_ships_counts_without_the_loader_cache():
    """torch's nvidia-cudnn wheel is loaded through torch's RPATH: with no ldconfig step (cuda.source:
    nvidia) it is not in the loader cache, yet the image carries it, so the label is due (issue 28)."""
    facts = dataclasses.replace(FACTS, pkgs={**FACTS.pkgs, "nvidia-cudnn-cu12": "9.1.0.70"},
                                wheel_libs={"libcudnn.so.9": "nvidia-cudnn-cu12"})
    missing = by_name(label_checks(LABELS, facts))["label io.imgbuild.cudnn.version"]
    assert missing.status == FAILED and "nvidia-cudnn-cu12 ships libcudnn.so.9" in missing.detail
    for label in ("9", "9.1.0.70", "9.1"):
        verdict = by_name(label_checks({**LABELS, "io.imgbuild.cudnn.version": label}, facts))
        assert verdict["label io.imgbuild.cudnn.version"].status == PASSED, (label, verdict)


@pytest.mark.parametrize("label", ["8", "9.10.2.21", "9.10"])
def test_a_cudnn_label_of_another_release_than_the_wheel_fails(label):
    """The exact version a wheel pin gave the label is held to the installed wheel, not only its major."""
    facts = dataclasses.replace(FACTS, pkgs={**FACTS.pkgs, "nvidia-cudnn-cu12": "9.1.0.70"},
                                wheel_libs={"libcudnn.so.9": "nvidia-cudnn-cu12"})
    verdict = by_name(label_checks({**LABELS, "io.imgbuild.cudnn.version": label}, facts))
    assert verdict["label io.imgbuild.cudnn.version"].status == FAILED, verdict


def test_recipe_digest_is_compared_with_the_recipe_and_skipped_without_one(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path, HEAD))
    labels = {**LABELS, "io.imgbuild.recipe.digest": recipe.digest}
    assert by_name(label_checks(labels, FACTS, recipe))["label io.imgbuild.recipe.digest"].status == PASSED
    assert by_name(label_checks(labels, FACTS))["label io.imgbuild.recipe.digest"].status == SKIPPED
    stale = {**labels, "io.imgbuild.recipe.digest": "sha256:" + "0" * 64}
    verdict = by_name(label_checks(stale, FACTS, recipe))["label io.imgbuild.recipe.digest"]
    assert verdict.status == FAILED and "the recipe changed since the image was built" in verdict.detail


def test_labels_without_a_content_check_are_skipped_with_the_reason():
    results = by_name(label_checks({**LABELS, "io.imgbuild.cuda.arch": "8.0;9.0", "io.imgbuild.future": "x"}, FACTS))
    # cuda.arch is held to the image's kernels (arch_label_checks, tests/test_arch_label.py), not to these facts
    assert "label io.imgbuild.cuda.arch" not in results
    assert results["label io.imgbuild.future"].detail == (
        "imgbuild has no check of this label against the image's content")


# --- the pins' imports ------------------------------------------------------------------------------


def _imports(**rec) -> ImageFacts:
    base = {"name": "six", "want": "1.16.0", "version": "1.16.0", "modules": ["six"], "error": None}
    return dataclasses.replace(FACTS, imports=({**base, **rec},))


def test_pins_import_at_their_pinned_version():
    assert [(r.name, r.status, r.detail) for r in import_checks(FACTS, gpu=False)] == [
        ("import six", PASSED, "six==1.16.0: import six")]
    [wrong] = import_checks(_imports(version="1.15.0"), gpu=False)
    assert (wrong.status, wrong.detail) == (FAILED, "six==1.16.0 is pinned, but 1.15.0 is installed")
    [gone] = import_checks(_imports(version=None, error="not installed"), gpu=False)
    assert gone.status == FAILED
    [broken] = import_checks(_imports(error="Traceback...\nImportError: boom"), gpu=False)
    assert broken.status == FAILED and broken.output.endswith("ImportError: boom")


def test_an_import_that_needs_the_driver_is_skipped_only_without_a_gpu():
    needs = _imports(name="flash-attn", want="2.6.3", version="2.6.3", modules=["flash_attn"],
                     error="ImportError: libcuda.so.1: cannot open shared object file")
    [skipped] = import_checks(needs, gpu=False)
    assert skipped.status == SKIPPED and "needs an NVIDIA driver" in skipped.detail
    [failed] = import_checks(needs, gpu=True)
    assert failed.status == FAILED


def test_pins_come_from_the_recipe_or_the_torch_label(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path, HEAD))
    assert pinned(recipe, {}) == (("six", "1.16.0"),)
    assert pinned(None, {"io.imgbuild.torch.version": "2.4.1+cu121"}) == (("torch", "2.4.1"),)
    assert pinned(None, {}) == ()


# --- the verdict ------------------------------------------------------------------------------------


def test_a_failure_names_each_failed_test_and_shows_its_output_once():
    report = TestReport("team/app:1", False, (
        TestResult("ok", "command", PASSED, "exit 0", command="true", exit_code=0),
        TestResult("smoke", "command", FAILED, "exit 3", command="python smoke.py", exit_code=3,
                   output="loading model\nAssertionError: wrong answer"),
        TestResult("gpu", "command", SKIPPED, "needs a GPU"),
    ))
    with pytest.raises(ImageTestFailed) as info:
        require_passed(report)
    text = info.value.render()
    assert text.startswith("1 of 3 tests of team/app:1 failed:\n- smoke: exit 3\n  command: python smoke.py")
    assert text.count("AssertionError: wrong answer") == 1
    assert info.value.exit_status == 1 and info.value.to_json()["failures"][0]["exit_code"] == 3
    require_passed(dataclasses.replace(report, results=report.results[:1]))  # nothing failed: no error


def test_a_driver_floor_nvidia_does_not_publish_must_be_absent_and_is_checked_so():
    """CUDA 13.4 has no published native floor (issue 21: 2): the check passes on the label's
    absence and fails on a floor stamped anyway; before, an absent label got no verdict at all."""
    facts = dataclasses.replace(FACTS, pkgs={"nvidia-cuda-runtime": "13.4.48", "six": "1.16.0"},
                                sonames=("libcudart.so.13",), cudart={"libcudart.so.13": 13040})
    labels = {k: v for k, v in LABELS.items() if "driver.min" not in k}
    labels.update({"io.imgbuild.cuda.version": "13.4.1", "io.imgbuild.cuda.driver.min-compat": "580"})
    absent = by_name(label_checks(labels, facts))["label io.imgbuild.cuda.driver.min"]
    assert absent.status == PASSED and "NVIDIA publishes none" in absent.detail
    claimed = by_name(label_checks({**labels, "io.imgbuild.cuda.driver.min": "580"}, facts))
    assert claimed["label io.imgbuild.cuda.driver.min"].status == FAILED


def test_floors_of_a_cuda_the_data_does_not_know_are_skipped_not_guessed():
    """An image from a newer imgbuild (CUDA 13.4.0 is no release this data has) carries floors
    nothing here can compare with: skipped with why. Before, its native floor was taken as
    absent, so any stamped floor failed (issue 29: 2: one floor function, no fallback guess)."""
    facts = dataclasses.replace(FACTS, pkgs={"nvidia-cuda-runtime": "13.4.48", "six": "1.16.0"},
                                sonames=("libcudart.so.13",), cudart={"libcudart.so.13": 13040})
    labels = {**LABELS, "io.imgbuild.cuda.version": "13.4.0", "io.imgbuild.cuda.driver.min": "610.43.02",
              "io.imgbuild.cuda.driver.min-compat": "580"}
    got = by_name(label_checks(labels, facts))
    for key in ("io.imgbuild.cuda.driver.min", "io.imgbuild.cuda.driver.min-compat"):
        assert got[f"label {key}"].status == SKIPPED
        assert "imgbuild's data does not know CUDA 13.4.0" in got[f"label {key}"].detail


def test_a_checked_push_pushes_the_image_that_was_checked(tmp_path, monkeypatch):
    """With tests (or a budget) the image is built, checked, then pushed. The push used to be a second
    build that trusted the cache (on buildx): a --no-cache build of the same recipe or a prune between
    the two made it push an image nobody had tested (issue 31: 1). Now there is one build; each tag is
    set on the checked image again and pushed from the engine's store, and the registry's answer is
    held to the checked image."""
    from buildkit_py import engine as engine_pkg
    from buildkit_py.engine import build as engine_build
    from buildkit_py.pipeline import build as build_mod
    from buildkit_py.pipeline import plan_recipe

    monkeypatch.setattr(build_mod, "check_can_push", lambda tags: None)  # no registry in a unit test
    monkeypatch.setattr(build_mod, "registry_compressed_size", lambda ref: None)
    monkeypatch.setattr(build_mod, "layer_groups", lambda *_a: {})
    verified: list[tuple[str, str]] = []
    monkeypatch.setattr(engine_build, "verify_pushed",
                        lambda image_id, pushed: verified.append((image_id, pushed.ref)))
    plan = plan_recipe(write_recipe(tmp_path, HEAD), registry="127.0.0.1:5000", lookup=OFFLINE)
    checked: list[str] = []

    def run_tests(engine, image_id, recipe, shown_as, platforms, on_event):  # the tests pass
        checked.append(image_id)
        return ()

    monkeypatch.setattr(build_mod, "run_tests", run_tests)

    def StoreEngine():  # noqa: N802 - buildx on the containerd store: pushes from BuildKit, keeps what it builds
        return fakes.FakeEngine(
            capabilities={engine_pkg.PUSH, engine_pkg.ENGINE_STORE, engine_pkg.SECRETS, engine_pkg.CACHE_MOUNTS,
                          engine_pkg.MULTI_STAGE, engine_pkg.METADATA_FILE, engine_pkg.PROVENANCE},
            built="sha256:checked", built_labels={"io.imgbuild.os": "debian12"}, run_steps=7,
            sizes=engine_pkg.ImageSizes(1000, None), push_digest="sha256:" + "9" * 64)

    engine = StoreEngine()
    options = build_mod.BuildOptions(push=True, no_cache=True, test=True)
    outcome = build_mod.build_checked(plan, engine, options, lambda _line: None).outcome
    [only] = engine.requests  # one build: no second one to trust the cache
    assert checked == ["sha256:checked"] and only.no_cache and not only.push
    [tag] = plan.tags
    hold = engine.calls[-1][1]  # the checked image's own tag until its push, taken off after it
    assert engine.calls == [("tag", "sha256:checked", tag), ("push", tag), ("untag", hold)]
    assert hold.startswith("127.0.0.1:5000/team/app:imgbuild-hold-")
    assert verified == [("sha256:checked", outcome.pushes[0].ref)]
    assert outcome.result.run_steps == 7


class _NoPythonEngine(fakes.FakeEngine):
    """An engine whose containers have no python on their PATH: its `run` is a shell that answers
    as docker and podman do (exit 127, their message), so the real run_container runs it. It
    builds (one image), tags and untags in memory (``tags``: tag -> image id)."""

    def __init__(self):
        from buildkit_py import engine as engine_pkg

        super().__init__(capabilities={engine_pkg.SECRETS, engine_pkg.CACHE_MOUNTS, engine_pkg.MULTI_STAGE})
        self.tags: dict[str, str] = {}

    def run_argv(self, spec) -> tuple[str, ...]:
        return ("sh", "-c", f"echo 'exec: \"{spec.entrypoint}\": executable file not found in $PATH' >&2; exit 127")

    def image(self, ref):
        return fakes.image_info(ref, LABELS)

    def tag(self, image_id: str, tag: str) -> None:
        self.tags[tag] = image_id

    def untag(self, tag: str) -> None:
        self.tags.pop(tag, None)


def test_an_image_without_python_on_its_path_fails_its_test_not_imgbuild():
    """issue 31: 5: the facts are read with the image's own python; with none on its PATH that was
    an InspectError out of the gate (an error of imgbuild's), and the build kept its release tags.
    Now it is a failed test of the image, with the engine's words, and the gate refuses it."""
    from buildkit_py.analysis.image_checks import FACTS_TEST, run_image_tests

    report = run_image_tests(_NoPythonEngine(), "sha256:abc", shown_as="team/app:1")
    [result] = report.results
    assert (result.name, result.status, result.exit_code) == (FACTS_TEST, FAILED, 127)
    assert result.detail.startswith("there is no python on the image's PATH (exit 127)")
    assert 'executable file not found in $PATH' in result.output
    with pytest.raises(ImageTestFailed) as info:
        require_passed(report)
    assert info.value.render().startswith("1 of 1 tests of team/app:1 failed:\n- python on PATH: there is no python")


def test_the_gate_keeps_an_image_without_python_as_rejected(tmp_path, monkeypatch):
    """The same image through `build --test`: untagged, kept as REPO:rejected, exit 1 (as any image
    that fails its tests), instead of an InspectError that left it under its release tags."""
    from buildkit_py.engine.base import BuildResult
    from buildkit_py.pipeline import build as build_mod
    from buildkit_py.pipeline import plan_recipe

    monkeypatch.setattr(build_mod, "layer_groups", lambda *_a: {})
    plan = plan_recipe(write_recipe(tmp_path, HEAD), lookup=OFFLINE)
    engine = _NoPythonEngine()

    def build(request, on_line):
        for tag in request.tags:
            engine.tag("sha256:built", tag)
        return BuildResult("sha256:built", request.tags, "", 0, 7, 1.0)

    engine.build = build
    engine.image_sizes = lambda image_id: None
    with pytest.raises(ImageTestFailed) as info:
        build_mod.build_checked(plan, engine, build_mod.BuildOptions(test=True), lambda _line: None)
    assert info.value.kept_as == "team/app:rejected" and info.value.exit_status == 1
    assert "nothing was pushed; the image is kept as team/app:rejected" in info.value.render()
    assert engine.tags == {"team/app:rejected": "sha256:built"}  # the release tag team/app:1 is gone
    assert info.value.reports[0].failed[0].name == "python on PATH"


# --- every platform, every variant (issue 31: 4), with a fake engine and fake containers -----------

MACHINE = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}
X86_ONLY = """test:\n  - {name: x86-only, run: 'uname -m; test "$(uname -m)" = x86_64'}\n"""
TWO = HEAD + "platforms: [linux/amd64, linux/arm64]\n" + X86_ONLY


class FakeImages(fakes.FakeEngine):
    """An engine and its containers, faked: each image's labels and installed packages; a
    container of a platform's image (the engine's own, linux/amd64, when none is named) answers
    ``uname -m`` with that platform's machine, and a recipe's test: command runs in the host's sh
    with that uname first on PATH. Every container started is recorded (image, platform)."""

    def __init__(self, tmp_path, images: dict[str, tuple[dict[str, str], dict[str, str]]]):
        super().__init__()
        self.recorded, self.runs = images, []
        self.bins = {}
        for platform, machine in MACHINE.items():
            folder = tmp_path / "bin" / machine
            folder.mkdir(parents=True)
            (folder / "uname").write_text(f"#!/bin/sh\necho {machine}\n")
            (folder / "uname").chmod(0o755)
            self.bins[platform] = folder

    def image(self, ref):
        if ref not in self.recorded:
            return None
        return fakes.image_info(ref, self.recorded[ref][0], platform="linux/amd64")

    def run_in_image(self, engine, image, command, *, entrypoint, gpu=False, mounts=(), platform=None,
                     timeout=None, trace=None):
        self.runs.append((image, platform))
        pkgs = self.recorded[image][1]
        if entrypoint == "python":  # the facts script, with the pins to import
            imports = [{"name": n, "want": want, "version": pkgs.get(n), "modules": [n] if n in pkgs else [],
                        "error": None if n in pkgs else "not installed"} for n, want in json.loads(command[2])]
            facts = {"pkgs": pkgs, "installers": {n: "uv" for n in pkgs}, "sonames": [], "cudart": {},
                     "python": "3.11.2", "os": "debian12", "nvcc": False, "imports": imports}
            return ContainerExit(0), "IMGBUILD-FACTS " + json.dumps(facts)
        path = f"{self.bins[platform or 'linux/amd64']}:{os.environ['PATH']}"
        done = subprocess.run([entrypoint, *command], env={"PATH": path}, capture_output=True, text=True,
                              timeout=30)
        return ContainerExit(done.returncode), done.stdout + done.stderr


@pytest.fixture
def fake_images(tmp_path, monkeypatch):
    """FakeImages(images) as the engine `imgbuild test` and the build gate use."""
    def make(images):
        fake = FakeImages(tmp_path, images)
        monkeypatch.setattr(image_checks, "run_in_image", fake.run_in_image)
        monkeypatch.setattr(cli_test, "reading_engine", lambda _args: fake)
        return fake
    return make


def _built_from(recipe_path, pkgs=None) -> tuple[dict[str, str], dict[str, str]]:
    """The labels and packages of an image built from the recipe at ``recipe_path``."""
    recipe = load_recipe(recipe_path)
    return ({"io.imgbuild.recipe.digest": recipe.digest, "io.imgbuild.python.version": "3.11"},
            pkgs or {"six": "1.16.0"})


def test_imgbuild_test_tests_every_platform_of_the_recipe(tmp_path, fake_images):
    """It tested linux/amd64 alone, silently: an image whose arm64 test fails passed, exit 0."""
    path = write_recipe(tmp_path, TWO)
    fake = fake_images({"team/app:1": _built_from(path)})
    code, out, err = run_cli("test", str(path), "--offline")
    assert code == 1, err
    assert fake.runs == [("team/app:1", "linux/amd64")] * 2 + [("team/app:1", "linux/arm64")] * 2
    assert out.splitlines()[-2:] == ["tests    team/app:1 (linux/amd64): 4 passed, 0 failed, 0 skipped",
                                     "tests    team/app:1 (linux/arm64): 3 passed, 1 failed, 0 skipped"]
    assert out.startswith('--- output of x86-only (uname -m; test "$(uname -m)" = x86_64) on linux/arm64 ---\n'
                          "aarch64\n--- end of output ---\n")
    assert "[linux/arm64] test failed  x86-only: exit 1" in err

    code, out, _ = run_cli("test", str(path), "--offline", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["schema"] == 1
    assert (doc["platforms"], doc["passed"], doc["failed"]) == (["linux/amd64", "linux/arm64"], 7, 1)
    assert [(t["image"], t["platform"], t["failed"]) for t in doc["platform_tests"]] == [
        ("team/app:1", "linux/amd64", 0), ("team/app:1", "linux/arm64", 1)]
    [failed] = [r for r in doc["results"] if r["status"] == "failed"]
    assert (failed["name"], failed["platform"]) == ("x86-only", "linux/arm64")

    # --platform: the ones asked for, each one of the recipe's
    fake.runs.clear()
    code, out, err = run_cli("test", str(path), "--offline", "--platform", "linux/amd64")
    assert (code, out) == (0, "tests    team/app:1 (linux/amd64): 4 passed, 0 failed, 0 skipped\n"), err
    assert {p for _, p in fake.runs} == {"linux/amd64"}
    code, out, err = run_cli("test", str(path), "--offline", "--platform", "linux/arm64", "--platform", "linux/arm64")
    assert code == 1 and out.count("tests    ") == 1 and "(linux/arm64): 3 passed, 1 failed" in out


def test_a_platform_the_recipe_does_not_build_is_a_usage_error(tmp_path, fake_images):
    one = write_recipe(tmp_path, HEAD + X86_ONLY)
    two = write_recipe(tmp_path, TWO, name="two.yaml")
    fake = fake_images({"team/app:1": _built_from(one)})
    code, out, err = run_cli("test", str(one), "--offline", "--platform", "linux/arm64")
    assert (code, out) == (2, "")
    assert f"--platform linux/arm64: {one} builds linux/amd64" in err and "hint: name one of them" in err
    code, _, err = run_cli("test", str(two), "--offline", "--platform", "linux/s390x")
    assert code == 2 and "builds linux/amd64, linux/arm64" in err
    assert fake.runs == []
    # a recipe of linux/amd64 alone: the engine's own platform's image, the report naming it
    code, out, err = run_cli("test", str(one), "--offline")
    assert (code, out) == (0, "tests    team/app:1 (linux/amd64): 4 passed, 0 failed, 0 skipped\n"), err
    assert {p for _, p in fake.runs} == {None}
    # an image: any platform imgbuild builds (the image's own index decides whether it has it)
    code, out, err = run_cli("test", "team/app:1", "--platform", "linux/arm64", "--json")
    assert code == 0 and [t["platform"] for t in json.loads(out)["platform_tests"]] == ["linux/arm64"], err


def test_the_build_gate_names_each_platform_in_its_report(tmp_path, fake_images):
    """build --json's platform_tests entries had no platform key: each report now names its own."""
    path = write_recipe(tmp_path, TWO)
    fake = fake_images({"sha256:abc": _built_from(path)})
    reports = run_tests(fake, "sha256:abc", load_recipe(path), "team/app:1", ("linux/amd64", "linux/arm64"), None)
    assert failure_of(reports[-1]).render().startswith(
        "1 of 4 tests of team/app:1 (linux/arm64) failed:\n- x86-only: exit 1")
    assert [(r.to_json()["platform"], r.to_json()["failed"]) for r in reports] == [("linux/amd64", 0),
                                                                                  ("linux/arm64", 1)]
    fake.recorded["sha256:one"] = ({}, {"six": "1.16.0"})  # one platform, the engine's own: named from its inspect
    single = run_tests(fake, "sha256:one", load_recipe(write_recipe(tmp_path, HEAD, name="one.yaml")), "team/app:1",
                       (), None)
    assert [r.platform for r in single] == ["linux/amd64"]


MATRIX = HEAD + 'matrix:\n  pip: [["six==1.16.0"], ["six==1.17.0"]]\n'


def test_a_variant_is_judged_by_its_own_pins(tmp_path, fake_images):
    """`imgbuild test RECIPE` judged a variant's image by the base recipe: its own pin (six 1.17.0)
    and recipe digest failed. --variant judges it by the variant's."""
    path = write_recipe(tmp_path, MATRIX)
    from buildkit_py import pipeline

    variant = pipeline.load_matrix(path).variant("six1_17_0")
    labels = {"io.imgbuild.recipe.digest": variant.recipe.digest, "io.imgbuild.python.version": "3.11"}
    fake = fake_images({"team/app:1-six1_17_0": (labels, {"six": "1.17.0"})})
    code, out, err = run_cli("test", str(path), "--offline", "--tag", "team/app:1-six1_17_0", "--json")
    failed = sorted(r["name"] for r in json.loads(out)["results"] if r["status"] == "failed")
    assert code == 1 and failed == ["import six", "label io.imgbuild.recipe.digest"]  # the base recipe's pins

    code, out, err = run_cli("test", str(path), "--offline", "--variant", "six1_17_0")
    assert (code, out) == (0, "tests    team/app:1-six1_17_0 (linux/amd64): 3 passed, 0 failed, 0 skipped\n"), err
    assert "import six: six==1.17.0: import six" in err
    assert fake.runs[-1] == ("team/app:1-six1_17_0", None)
    code, out, err = run_cli("test", str(path), "--offline", "--variant", "six1_17_0", "--registry", "r.example:5000")
    assert code == 2 and "no image r.example:5000/team/app:1-six1_17_0" in err
    assert "build it first (imgbuild build " in err and "--variant six1_17_0)" in err


@pytest.mark.parametrize(("target", "variant", "message"), [
    ("matrix", "cu999", "has no variant 'cu999'"),
    ("plain", "six1_17_0", "has no matrix"),
    ("image", "six1_17_0", "a variant is one of a RECIPE's matrix"),
])
def test_a_variant_that_is_not_there_is_a_usage_error(tmp_path, fake_images, target, variant, message):
    fake = fake_images({"team/app:1": ({}, {})})
    paths = {"matrix": str(write_recipe(tmp_path, MATRIX, name="m.yaml")),
             "plain": str(write_recipe(tmp_path, HEAD, name="p.yaml")), "image": "team/app:1"}
    code, out, err = run_cli("test", paths[target], "--offline", "--variant", variant)
    assert (code, out) == (2, "") and message in err and "Traceback" not in err, err
    assert fake.runs == []
