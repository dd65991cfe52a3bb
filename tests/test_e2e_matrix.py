"""End to end on the real engine: a 2x2 matrix (CUDA 12.1/12.4 from the runtime wheels x two
idna pins) built with `build --all -j 2`. Four images with the right labels and tags, and the
variants that share a prefix with one built before them take it from the cache."""

import json
import os
import subprocess

import pytest
from helpers import run_cli, write_recipe

CA = "/etc/ssl/certs/ca-certificates.crt"
RECIPE = """\
name: {name}
version: "1.0"
cuda: {{version: "12.4", source: wheels}}
base: {{image: {base}}}
python: "3.11"
pip: ["idna==3.7"]
labels: {{team: ml-platform}}
matrix:
  cuda.version: ["12.1", "12.4"]
  pip: [["idna==3.7"], ["idna==3.8"]]
  tags: ["{{version}}-cu{{cuda_short}}-{{variant}}"]
"""
VARIANTS = ["cu121-idna3_7", "cu121-idna3_8", "cu124-idna3_7", "cu124-idna3_8"]


def ca_args():
    return ["--ca-cert", CA] if os.path.exists(CA) else []


@pytest.fixture
def project(tmp_path, base_image, unique_name):
    return write_recipe(tmp_path, RECIPE.format(name=unique_name, base=base_image))


def test_build_all_two_by_two(project, engine, docker_client, cleanup_images, unique_name):
    code, out, err = run_cli("build", str(project), "--all", "-j", "2", "--json", "--progress", "quiet", *ca_args())
    report = json.loads(out) if out.strip().startswith("{") else {}
    for v in report.get("variants", []):
        cleanup_images.extend(v["tags"])
    assert code == 0, err
    assert [v["variant"] for v in report["variants"]] == VARIANTS
    assert report["ok"] == 4 and report["failed"] == 0 and report["dropped"] == []

    by_id = {v["variant"]: v for v in report["variants"]}
    for vid, v in by_id.items():
        cuda = "12.1.1" if vid.startswith("cu121") else "12.4.1"
        assert v["tags"][0] == f"{unique_name}:1.0-cu{cuda[:4].replace('.', '')}-{vid}"
        assert v["tags"][1].startswith(f"{unique_name}:sha-")
        image = docker_client.images.get(v["tags"][0])
        assert image.id == v["image_id"] == docker_client.images.get(v["tags"][1]).id
        labels = image.labels
        assert labels["io.imgbuild.cuda.version"] == cuda
        assert labels["io.imgbuild.recipe.digest"][7:19] == v["tags"][1].rsplit("sha-", 1)[1]
        assert labels["team"] == "ml-platform"
    assert len({v["image_id"] for v in by_id.values()}) == 4

    # The second variant of each CUDA waits for the first and takes os, python and the CUDA
    # wheels from its cache; only its own pins (and what follows) may run.
    for sharer in ("cu121-idna3_8", "cu124-idna3_8"):
        v = by_id[sharer]
        assert v["steps_cached"] >= 3, v
        assert not {"os", "python", "cuda"} & set(v["steps_rerun"]), v
    # the CUDA 12.4 leader shares os+python with the first build
    assert not {"os", "python"} & set(by_id["cu124-idna3_7"]["steps_rerun"])

    assert run_python(engine, by_id["cu124-idna3_8"]["image_id"]) == "3.8"


def run_python(engine, image: str) -> str:
    """Load libcudart and print idna's version inside ``image``, on the engine that built it."""
    out = subprocess.run([*engine.docker_argv(), "run", "--rm", "--network", "none", "--entrypoint", "python",
                          image, "-c", "import ctypes, idna; ctypes.CDLL('libcudart.so.12'); print(idna.__version__)"],
                         capture_output=True, text=True, timeout=120, env=engine.environment(), check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_build_all_no_cache_builds_the_shared_prefix_once(project, engine, docker_client, cleanup_images):
    """Issue 11 item 22: with --no-cache the shared os/python prefix is built once, as a local
    image the variants are built FROM, instead of once per variant."""
    code, out, err = run_cli("build", str(project), "--all", "-j", "2", "--no-cache", "--json", "--progress", "quiet",
                             *ca_args())
    report = json.loads(out) if out.strip().startswith("{") else {}
    for v in report.get("variants", []):
        cleanup_images.extend(v["tags"])
    assert code == 0, err
    assert report["ok"] == 4
    for v in report["variants"]:
        # the variant's own build ran without cache and never reached os or python again
        assert v["steps_cached"] == 0, v
        assert not {"os", "python"} & set(v["steps_rerun"]), v
        labels = docker_client.images.get(v["tags"][0]).labels
        assert labels["io.imgbuild.cuda.version"] in {"12.1.1", "12.4.1"}
    assert run_python(engine, report["variants"][1]["image_id"]) == "3.8"
    # the helper tags of the shared stages are gone; the variants keep the layers
    assert not [t for i in docker_client.images.list() for t in i.tags if t.startswith("imgbuild-shared/")]


def test_build_all_one_failure_keeps_the_others(tmp_path, base_image, docker_client, cleanup_images, unique_name):
    # idna 0.0.1 does not exist: that variant fails, the other still builds; exit 1
    path = write_recipe(tmp_path, RECIPE.format(name=unique_name, base=base_image).replace(
        'pip: [["idna==3.7"], ["idna==3.8"]]', 'pip: [["idna==3.7"], ["idna==0.0.1"]]').replace(
        'cuda.version: ["12.1", "12.4"]', 'cuda.version: ["12.4"]'))
    code, out, err = run_cli("build", str(path), "--all", "--progress", "quiet", *ca_args())
    cleanup_images.extend([f"{unique_name}:1.0-cu124-cu124-idna3_7", f"{unique_name}:1.0-cu124-cu124-idna0_0_1"])
    assert code == 1, err
    assert "1 built, 1 failed" in out
    assert "cu124-idna0_0_1: build failed" in out
    docker_client.images.get(f"{unique_name}:1.0-cu124-cu124-idna3_7")
