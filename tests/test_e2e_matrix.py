"""End to end on the real engine: a 2x2 matrix (CUDA 12.1/12.4 from the runtime wheels x two
idna pins) built with `build --all -j 2`. Four images with the right labels and tags, and the
variants that share a prefix with one built before them take it from the cache. And the bake
folder `imgbuild matrix --format bake -o DIR` writes, built by a real `docker buildx bake`."""

import json
import os
import subprocess

import pytest
from conftest import on_engine, unavailable
from helpers import CA_ARGS, run_cli, write_recipe

from buildkit_py import oci

CA = "/etc/ssl/certs/ca-certificates.crt"
RECIPE = """\
name: {name}
version: "1.0"
cuda: {{version: "12.4", source: wheels, flavor: base}}
base: {{image: {base}}}
python: "3.11"
pip: ["idna==3.7"]
labels: {{team: ml-platform}}
test: ["python -c 'import idna'"]
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
    code, out, err = run_cli("build", str(project), "--all", "-j", "2", "--test", "--json", "--progress", "quiet",
                             *ca_args())
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
    # --test: each variant's image passed its own tests (its own idna pin imported at its version)
    for vid, v in by_id.items():
        results = {r["name"]: r for r in v["tests"]["results"]}
        assert v["tests"]["failed"] == 0 and results["python -c 'import idna'"]["status"] == "passed", v["tests"]
        assert results["import idna"]["detail"].startswith(f"idna=={vid[-3:].replace('_', '.')}: "), results

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
    out = subprocess.run([*engine.client_argv(), "run", "--rm", "--network", "none", "--entrypoint", "python",
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
    cleanup_images.extend(t for image in docker_client.images.list(name=unique_name) for t in image.tags)
    assert code == 1, err
    assert "1 built, 1 failed" in out
    assert "cu124-idna0_0_1: build failed" in out
    docker_client.images.get(f"{unique_name}:1.0-cu124-cu124-idna3_7")


BAKE_RECIPE = """\
name: {name}
version: "1.0"
cuda: {{version: "12.4", source: wheels, flavor: base}}
base: {{image: {base}}}
python: "3.11"
labels: {{team: ml-platform}}
copy:
  - {{src: app/, dest: /app}}
matrix:
  pip: [["idna==3.7"], ["idna==3.8"]]
  tags: ["{{version}}-{{variant}}"]
"""


def test_bake_folder_builds_every_variant(tmp_path, logged_in, engine, base_image, cleanup_images, registry_refs,
                                          unique_name):
    """Issue 13 item 6: `docker buildx bake` in the folder `matrix --format bake -o` writes builds
    each variant (locked, with the CA secret, a COPY of the app, the reproducible CUDA layer's
    stub file and the shared stages as targets of their own) into the engine, with the tags and
    io.imgbuild.* labels `matrix --json` announces. buildx 0.13 reads the builds' host network
    from the folder's compose.yaml."""
    if not hasattr(engine, "buildx"):
        # The classic 20.10 client has no bake; the docker26 run covers it. In CI that engine
        # must be there (conftest adds it), so a missing buildx fails the run there, never skips.
        if engine.test_name == "docker26":
            unavailable("the docker26 engine has no buildx plugin")
        pytest.skip("docker buildx bake needs buildx; the classic client has none")
    project = tmp_path / "project"
    (project / "app").mkdir(parents=True)
    (project / "app" / "main.py").write_text(f"print({unique_name!r})\n")
    recipe = write_recipe(project, BAKE_RECIPE.format(name=unique_name, base=base_image))
    code, _, err = run_cli("lock", str(recipe), *CA_ARGS)
    assert code == 0, err
    code, out, err = run_cli("matrix", str(recipe), "--json", "--registry", logged_in.address)
    assert code == 0, err
    announced = {v["variant"]: v for v in json.loads(out)["variants"]}
    assert sorted(announced) == ["idna3_7", "idna3_8"]
    for v in announced.values():
        cleanup_images.extend(v["tags"])
        registry_refs.append(f"{logged_in.address}/{unique_name}:cache-{v['variant']}")

    folder = tmp_path / "bake"
    code, _, err = run_cli("matrix", str(recipe), "--format", "bake", "--registry", logged_in.address, "-o",
                           str(folder), *CA_ARGS)
    assert code == 0, err
    bake = json.loads((folder / "docker-bake.json").read_text())
    shared = [t for t in bake["target"] if t.startswith("shared-")]
    assert shared and all(t not in announced for t in shared)
    registry_refs.extend(f"{logged_in.address}/{unique_name}:cache-{t}" for t in shared)
    contexts = folder / "contexts"
    assert (contexts / "idna3_8" / "app" / "main.py").is_file()
    assert (contexts / "idna3_8" / ".imgbuild-lock" / "final-pins.txt").is_file()  # the lock is used
    assert any((contexts / t / ".imgbuild" / "root" / "etc" / "hosts").is_file() for t in shared)  # mount stubs

    # bake with no -f reads docker-bake.json and compose.yaml (the host network) in the folder.
    # Each Dockerfile is a file there: buildx 0.13 copied each dockerfile-inline to a folder in
    # TMPDIR and left it behind, one per target per bake.
    assert all((folder / "contexts" / t / spec["dockerfile"]).is_file() for t, spec in bake["target"].items())
    (tmp_path / "buildx-tmp").mkdir()
    proc = subprocess.run([*engine.buildx, "bake", "--progress", "plain"], capture_output=True, text=True,
                          env={**engine.environment(), "TMPDIR": str(tmp_path / "buildx-tmp")}, check=False,
                          timeout=900, cwd=folder)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert list((tmp_path / "buildx-tmp").iterdir()) == []
    assert "--mount=type=bind,source=.imgbuild-lock/final-pins.txt" in proc.stderr
    for vid, v in announced.items():
        attrs = [engine.image_attrs(tag) for tag in v["tags"]]
        assert all(attrs), f"bake did not load every tag of {vid}: {v['tags']}"
        assert len({a["Id"] for a in attrs}) == 1, f"{vid}: its tags name different images"
        assert v["tags"] == [f"{logged_in.address}/{unique_name}:1.0-{vid}",
                             f"{logged_in.address}/{unique_name}:{v['content_tag']}"]
        labels = attrs[0]["Config"]["Labels"]
        assert labels["io.imgbuild.recipe.digest"] == v["recipe_digest"]
        assert labels["io.imgbuild.cuda.version"] == v["cuda"] == "12.4.1"
        assert labels["io.imgbuild.python.version"] == v["python"] == "3.11"
        assert labels["org.opencontainers.image.title"] == unique_name and labels["team"] == "ml-platform"
    assert run_python(engine, announced["idna3_8"]["tags"][0]) == "3.8"
    # every target exported its registry cache
    for ref in registry_refs:
        assert oci.fetch_manifest(ref)[1].startswith("sha256:"), ref


REFUSED = """\
name: {name}
version: "1"
cuda: {{version: "12.4", source: wheels, flavor: base}}
base: {{image: {base}}}
python: "3.11"
pip: ["idna==3.7"]
test:
  - {{name: always-fails, run: "echo refused on purpose; exit 3"}}
matrix:
  pip: [["idna==3.7"], ["idna==3.8"]]
"""


@on_engine("docker20")  # the tags a refused variant keeps and the pins it is judged by: no engine's own path
def test_each_refused_variant_keeps_its_own_rejected_tag_and_is_judged_by_its_own_pins(
        tmp_path, engine, base_image, cleanup_images, unique_name):
    """Issue 31: 4. Every refused variant was kept as REPO:rejected, each overwriting the last, and
    `imgbuild test RECIPE` judged a variant's image by the base recipe's pins (false failures)."""
    path = write_recipe(tmp_path, REFUSED.format(name=unique_name, base=base_image))
    rejected = {vid: f"{unique_name}:rejected-{vid}" for vid in ("idna3_7", "idna3_8")}
    cleanup_images.extend([*rejected.values(), f"{unique_name}:rejected"])
    code, out, err = run_cli("build", str(path), "--all", "--test", "--json", "--progress", "quiet", *CA_ARGS)
    report = json.loads(out)
    assert code == 1 and report["failed"] == 2, err
    for v in report["variants"]:
        cleanup_images.extend(v["tags"])
        assert v["error"]["message"].endswith(f"nothing was pushed; the image is kept as {rejected[v['variant']]}")
    ids = {vid: engine.image_attrs(tag)["Id"] for vid, tag in rejected.items()}
    assert len(set(ids.values())) == 2, ids  # two images, each under its own tag
    assert engine.image_attrs(f"{unique_name}:rejected") is None

    # the refused idna 3.8 variant, by its own pins: only the test that refused it fails
    code, out, err = run_cli("test", str(path), "--variant", "idna3_8", "--tag", rejected["idna3_8"], "--json")
    own = json.loads(out)
    assert code == 1, err
    assert [r["name"] for r in own["results"] if r["status"] == "failed"] == ["always-fails"]
    results = {r["name"]: r for r in own["results"]}
    assert results["import idna"]["detail"].startswith("idna==3.8: import idna")
    assert results["label io.imgbuild.recipe.digest"]["status"] == "passed"
    # by the recipe without its matrix, the same image also fails what is true of it
    code, out, err = run_cli("test", str(path), "--tag", rejected["idna3_8"], "--json")
    base = sorted(r["name"] for r in json.loads(out)["results"] if r["status"] == "failed")
    assert base == ["always-fails", "import idna", "label io.imgbuild.recipe.digest"], err
