"""End to end, arm64 beside amd64 (issue 24: 3): a recipe with `platforms: [linux/amd64, linux/arm64]`
and CUDA from wheels (cudart only, no torch: the emulated steps stay small) built on the
multi-platform Debian base scripts/services.sh pushes, pushed to the local registry with auth as one
index; the index is read back (both platforms), each platform's image runs (arm64 under qemu)
printing its architecture and loading libcudart by name, and every io.imgbuild.* label of each
platform's image is checked against that image's content.

Docker 20.10's classic builder cannot make an index (one platform per build, a repeated --platform
keeps only the last, one image per tag in its store): there the same build is refused before
anything builds or is pushed, and one platform alone (--platform linux/arm64) builds and runs."""

import json
import time

import pytest
from conftest import on_engine
from helpers import CA_ARGS, assert_labels_true, image_sh, run_cli, write_recipe

from buildkit_py import oci
from buildkit_py.errors import ManifestNotFound

pytestmark = pytest.mark.e2e

RECIPE = """\
name: {name}
version: "1.0"
cuda: {{version: "12.4", source: wheels, flavor: base}}
base: {{image: {base}}}
python: "3.11"
{platforms}"""
BOTH = "platforms: [linux/amd64, linux/arm64]\n"
# what each platform's image prints: its machine, and that libcudart loads by name
PROBE = ("python -c \"import ctypes, platform; ctypes.CDLL('libcudart.so.12'); "
         "print(platform.machine(), 'cudart loaded')\"")
MACHINE = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}


def _platforms_of(index: dict) -> set[str]:
    return {oci.platform_of(e).removesuffix("/v8") for e in index.get("manifests", [])} - {"unknown/unknown"}


def test_two_platform_index_is_pushed_and_each_platform_runs(tmp_path, engine, logged_in, multiarch_base,
                                                            unique_name, cleanup_images, registry_refs):
    path = write_recipe(tmp_path, RECIPE.format(name=unique_name, base=multiarch_base, platforms=BOTH))
    started = time.monotonic()
    code, out, err = run_cli("build", str(path), "--registry", logged_in.address, "--push", *CA_ARGS, "--json",
                             "--progress", "quiet")
    seconds = time.monotonic() - started
    tag = f"{logged_in.address}/{unique_name}:1.0"
    if engine.test_name == "docker20":
        # the classic builder cannot make an index: refused (exit 3) before building, nothing pushed
        assert code == 3, err
        assert "cannot do what this build needs: multi-platform" in err, err
        assert "a repeated --platform keeps only the last one" in err and "Traceback" not in err
        with pytest.raises(ManifestNotFound):
            oci.fetch_manifest(tag)
        assert engine.image_attrs(tag) is None
        return
    assert code == 0, err
    report = json.loads(out)
    cleanup_images.extend(report["tags"])
    # the push gate tested each platform's image (issue 24: 1), arm64 under qemu
    assert [t["image"] for t in report["platform_tests"]] == [f"{tag} (linux/amd64)", f"{tag} (linux/arm64)"]
    assert [t["platform"] for t in report["platform_tests"]] == ["linux/amd64", "linux/arm64"]  # issue 31: 4
    assert all(t["failed"] == 0 and t["passed"] for t in report["platform_tests"]), report["platform_tests"]
    digest = report["pushes"][0]["digest"]
    registry_refs.append(f"{logged_in.address}/{unique_name}@{digest}")
    print(f"\ntwo-platform build and push on {engine.test_name}: {seconds:.0f}s")

    # the index, read back from the registry: both platforms
    raw, got, media = oci.fetch_manifest(tag)
    index = json.loads(raw)
    assert got == digest and media in oci.INDEX_TYPES
    assert _platforms_of(index) == {"linux/amd64", "linux/arm64"}
    registry_refs.extend(f"{logged_in.address}/{unique_name}@{e['digest']}" for e in index["manifests"])

    labels = {}
    for platform in ("linux/amd64", "linux/arm64"):
        config = oci.get_image_config(tag, platform=platform)
        assert config["architecture"] == platform.split("/")[1]
        labels[platform] = (config.get("config") or {}).get("Labels") or {}
        # each platform's image: its machine, libcudart by name, every label true of its content
        assert image_sh(tag, PROBE, timeout=300, platform=platform).split() == [MACHINE[platform], "cudart",
                                                                                "loaded"]
        checked = assert_labels_true(tag, labels[platform], platform=platform)
        assert {"io.imgbuild.cuda.version", "io.imgbuild.cuda.source", "io.imgbuild.os"} <= checked
    assert labels["linux/amd64"]["io.imgbuild.cuda.version"] == labels["linux/arm64"]["io.imgbuild.cuda.version"]


@on_engine("docker26")  # the engine that builds an index here (docker20 refuses it: the test above)
def test_imgbuild_test_tests_every_platform_of_the_recipe(tmp_path, engine, logged_in, multiarch_base, unique_name,
                                                          cleanup_images):
    """Issue 31: 4. `imgbuild test` of a two-platform recipe tested linux/amd64 alone, silently: an
    image the build refused for its arm64 test re-tested as all passed, exit 0."""
    path = write_recipe(tmp_path, RECIPE.format(name=unique_name, base=multiarch_base, platforms=BOTH)
                        + "test:\n  - {name: x86-only, run: 'uname -m; test \"$(uname -m)\" = x86_64'}\n")
    rejected = f"{unique_name}:rejected"
    cleanup_images.extend([f"{unique_name}:1.0", rejected])
    started = time.monotonic()
    code, out, err = run_cli("build", str(path), "--test", *CA_ARGS, "--progress", "quiet")
    assert code == 1, err
    assert f"1 of 10 tests of {unique_name}:1.0 (linux/arm64) failed:\n- x86-only: exit 1" in err
    assert f"the image is kept as {rejected}" in err
    print(f"\ntwo-platform build --test on {engine.test_name}: {time.monotonic() - started:.0f}s")

    code, out, err = run_cli("test", str(path), "--tag", rejected, "--progress", "quiet")
    assert code == 1, err
    assert out.endswith(f"tests    {rejected} (linux/amd64): 10 passed, 0 failed, 0 skipped\n"
                        f"tests    {rejected} (linux/arm64): 9 passed, 1 failed, 0 skipped\n"), out
    assert "--- output of x86-only (uname -m; test \"$(uname -m)\" = x86_64) on linux/arm64 ---\naarch64\n" in out
    code, out, err = run_cli("test", str(path), "--tag", rejected, "--json", "--progress", "quiet")
    doc = json.loads(out)
    assert code == 1 and doc["platforms"] == ["linux/amd64", "linux/arm64"] and doc["failed"] == 1, err
    assert [(t["platform"], t["failed"]) for t in doc["platform_tests"]] == [("linux/amd64", 0), ("linux/arm64", 1)]
    [failed] = [r for r in doc["results"] if r["status"] == "failed"]
    assert (failed["name"], failed["platform"]) == ("x86-only", "linux/arm64")
    code, out, err = run_cli("test", str(path), "--tag", rejected, "--platform", "linux/amd64", "--progress", "quiet")
    assert (code, out) == (0, f"tests    {rejected} (linux/amd64): 10 passed, 0 failed, 0 skipped\n"), err


@on_engine("docker20")  # the one platform the classic builder can build: arm64 alone, under qemu
def test_classic_builder_builds_arm64_alone(tmp_path, engine, logged_in, multiarch_base, unique_name,
                                            cleanup_images):
    path = write_recipe(tmp_path, RECIPE.format(name=unique_name, base=multiarch_base, platforms=""))
    started = time.monotonic()
    code, out, err = run_cli("build", str(path), "--platform", "linux/arm64", *CA_ARGS, "--json",
                             "--progress", "quiet")
    assert code == 0, err
    report = json.loads(out)
    cleanup_images.extend(report["tags"])
    print(f"\narm64 build on docker20: {time.monotonic() - started:.0f}s")
    attrs = engine.image_attrs(report["image_id"])
    assert attrs["Architecture"] == "arm64"
    assert image_sh(report["image_id"], PROBE, timeout=300).split() == ["aarch64", "cudart", "loaded"]
    assert_labels_true(report["image_id"], attrs["Config"]["Labels"])
