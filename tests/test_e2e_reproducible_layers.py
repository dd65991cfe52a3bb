"""Reproducible layers on the real engine: the CUDA wheels' layer is byte-identical in two images
whose lower layers differ (another apt package), so a node that holds one image pulls only
what changed for the other (plan.PipStep.reproducible, steps.j2 repro_begin/repro_end)."""

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from conftest import engine_settings, on_engine, unavailable
from helpers import CA_ARGS, run_cli, tiny_recipe, write_recipe

pytestmark = pytest.mark.e2e

RECIPE = """\
name: {name}
version: "1.0"
cuda: {{version: "12.4", source: wheels, flavor: base}}
base: {{image: {base}}}
python: "3.11"
build: {{installer: {installer}}}
{apt}
"""


def layers_by_step(tag: str) -> dict[str, str]:
    code, out, err = run_cli("inspect", tag, "--json")
    assert code == 0, err
    return {x["step"]: x["digest"] for x in json.loads(out)["layers"] if x["step"]}


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_the_cuda_layer_is_byte_identical_over_different_lower_layers(tmp_path, base_image, unique_name, engine,
                                                                     docker_client, cleanup_images, installer):
    digests = []
    for i, apt in enumerate(["", "apt: [less]"]):
        path = write_recipe(tmp_path / str(i), RECIPE.format(name=f"{unique_name}-{i}", base=base_image, apt=apt,
                                                                  installer=installer))
        code, out, err = run_cli("build", str(path), "--json", "--progress", "quiet", *CA_ARGS)
        assert code == 0, err
        report = json.loads(out)
        cleanup_images.extend(report["tags"])
        digests.append(layers_by_step(report["tags"][0]))
    a, b = digests
    assert a["os"] != b["os"]  # the lower layer differs...
    assert a["cuda"] == b["cuda"]  # ...and the CUDA wheels' layer does not
    # nor, since the venv step dates its files and bytecode (issue 33: 1), the venv's layer above it;
    # on 20.10 that layer still holds /etc's mtime, which its BuildKit sets (DOCKER20_DIFFERING_LAYERS)
    assert (a["python"] == b["python"]) == (engine.test_name != "docker20")


# cuDNN and cuBLAS from wheels without torch (plan._final_cuda_wheels), and two heavy pins, each
# in a layer of its own (plan._heavy_steps). The second image has another apt package below all
# of them and another cupy release: every CUDA layer and jaxlib's layer, which re-runs above the
# changed cupy layer, must come out byte-identical. About 1.3 GB of wheels (pip cache mount).
SPLIT = """\
name: {name}
version: "1.0"
cuda: {{version: "12.4", source: wheels, cudnn: "9", flavor: base}}
base: {{image: {base}}}
python: "3.11"
pip: [cupy-cuda12x=={cupy}, jaxlib==0.9.0]
{apt}
"""


@on_engine("docker26")  # ~8 minutes per engine; the cheap test above covers both
def test_cuda_library_and_heavy_pin_layers_are_byte_identical_where_their_pins_are(
        tmp_path, base_image, unique_name, docker_client, cleanup_images):
    digests = []
    for i, (apt, cupy) in enumerate([("", "14.1.0"), ("apt: [less]", "14.1.1")]):
        text = SPLIT.format(name=f"{unique_name}-{i}", base=base_image, apt=apt, cupy=cupy)
        path = write_recipe(tmp_path / str(i), text)
        code, out, err = run_cli("build", str(path), "--json", "--progress", "quiet", *CA_ARGS)
        assert code == 0, err
        report = json.loads(out)
        cleanup_images.extend(report["tags"])
        digests.append(layers_by_step(report["tags"][0]))
    a, b = digests
    assert a["os"] != b["os"] and a["heavy-cupy-cuda12x"] != b["heavy-cupy-cuda12x"]  # what changed...
    for step in ("cuda", "cuda-cublas", "cuda-cudnn", "heavy-jaxlib"):  # ...and what must not have
        assert a[step] == b[step], step
    assert len({a["cuda"], a["cuda-cublas"], a["cuda-cudnn"]}) == 3  # three layers, not one



def test_an_unchanged_rebuild_gives_the_same_image_id_and_pushed_digest(tmp_path, base_image, unique_name, engine,
                                                                         logged_in, cleanup_images, registry_refs):
    """Issue 22 item 6: org.opencontainers.image.created was the clock's time, so every rebuild of
    an unchanged recipe got a new image id and digest (and buildx's default provenance attestation,
    with its start time and random id, a new index digest). Now created is when the inputs last
    changed (labels.created_time: the recipe's mtime here, outside git) and no attestation is
    attached unless asked for: a rebuild gives the same id, and its push the same digest."""
    recipe = write_recipe(tmp_path, tiny_recipe(unique_name, base_image, pip=("six==1.16.0",)))
    os.utime(recipe, (1_000_000_000, 1_000_000_000))
    reports = []
    for _ in range(2):
        code, out, err = run_cli("build", str(recipe), "--registry", logged_in.address, "--push", "--json",
                                 "--progress", "quiet", *CA_ARGS)
        assert code == 0, err
        reports.append(json.loads(out))
        cleanup_images.extend(reports[-1]["tags"])
        registry_refs.extend(p["ref"] for p in reports[-1]["pushes"])
        time.sleep(1.1)  # a clock-based label would differ by now
    first, second = reports
    assert first["labels"]["org.opencontainers.image.created"] == "2001-09-09T01:46:40Z"
    assert second["labels"] == first["labels"]
    assert second["image_id"] == first["image_id"], engine.test_name
    assert second["pushes"][0]["digest"] == first["pushes"][0]["digest"], engine.test_name


# --- Reproducible from scratch (issue 33: 1) -----------------------------------------------------

def layer_list(tag: str) -> list[tuple[str, str]]:
    """(step, digest) of each layer, in order (the mount stubs' COPY and RUN both name their step)."""
    code, out, err = run_cli("inspect", tag, "--json")
    assert code == 0, err
    return [(x["step"] or "base", x["digest"]) for x in json.loads(out)["layers"]]


def build_no_cache(recipe, tag: str, cleanup_images: list[str]) -> dict:
    code, out, err = run_cli("build", str(recipe), "--no-cache", "--tag", tag, "--json", "--progress", "quiet",
                             *CA_ARGS)
    assert code == 0, err
    cleanup_images.append(tag)
    return json.loads(out)


# What Docker 20.10's BuildKit (0.8: no SOURCE_DATE_EPOCH) gives from scratch, measured: the layers
# below differ by directory mtimes only (BuildKit adds and removes its /etc/hosts and resolv.conf
# mount points around a RUN until the mount stubs provide them; its COPY stamps /etc with the clock);
# every later layer is the same, and the config's history records each build's own times.
DOCKER20_DIFFERING_LAYERS = ["os", "python", "mount-stubs"]


def test_two_no_cache_builds_of_an_unchanged_recipe_give_one_image(tmp_path, base_image, unique_name, engine,
                                                                   cleanup_images):
    """Issue 33 item 1: two --no-cache builds of the same recipe differed in 5 of 7 layers (mtimes
    everywhere; apt's logs, ldconfig's aux-cache and the venv's bytecode in bytes) and in the config's
    times. Now every step dates what it writes and buildx passes SOURCE_DATE_EPOCH: Docker 26 gives
    the same image id; 20.10 the same layers from the mount stubs up (DOCKER20_DIFFERING_LAYERS)."""
    recipe = write_recipe(tmp_path, tiny_recipe(unique_name, base_image, pip=("six==1.16.0",)))
    os.utime(recipe, (1_000_000_000, 1_000_000_000))
    first = build_no_cache(recipe, f"{unique_name}:a", cleanup_images)
    time.sleep(1.1)  # anything dated by the clock would differ by now
    second = build_no_cache(recipe, f"{unique_name}:b", cleanup_images)
    assert first["steps_cached"] == second["steps_cached"] == 0  # both really built every step
    a, b = layer_list(first["tags"][0]), layer_list(second["tags"][0])
    assert [s for s, _ in a] == [s for s, _ in b]
    differing = [step for (step, da), (_, db) in zip(a, b, strict=True) if da != db]
    print(f"\n{engine.test_name}: no-cache ids {first['image_id'][:19]} {second['image_id'][:19]}, "
          f"{len(differing)} of {len(a)} layers differ: {differing}")
    if engine.test_name == "docker20":
        assert differing == DOCKER20_DIFFERING_LAYERS
        assert second["image_id"] != first["image_id"]
    else:
        assert differing == []
        assert second["image_id"] == first["image_id"], engine.test_name


@contextlib.contextmanager
def fresh_docker26(base_image: str):
    """A Docker 26 engine of its own (the shared engine's binaries, the containerd image store) on
    an empty data-root: no layer, no build cache, no image but the base, copied from the shared
    engine by save and load (an import would give the base another config). Yields its DOCKER_HOST."""
    shared = engine_settings("docker26")
    client = str(shared["IMGBUILD_DOCKER"])
    prefix = Path(os.path.realpath(client)).parent.parent
    dockerd = prefix / "sbin" / "dockerd"
    if not dockerd.exists():
        unavailable(f"{dockerd} (Docker 26's engine) is missing")
    root = Path(tempfile.mkdtemp(prefix="imgbuild-d26-"))  # short: unix socket paths are limited
    (root / "daemon.json").write_text('{"features": {"containerd-snapshotter": true}}')
    host = f"unix://{root}/d.sock"
    env = {**os.environ, "PATH": f"{prefix / 'sbin'}:{prefix / 'bin'}:{os.environ.get('PATH', '')}"}
    with (root / "dockerd.log").open("ab") as log:
        proc = subprocess.Popen(
            [str(dockerd), "--config-file", str(root / "daemon.json"), "--data-root", str(root / "data"),
             "--exec-root", str(root / "exec"), "--pidfile", str(root / "pid"), "--host", host,
             "--bridge=none", "--iptables=false", "--ip-masq=false"],
            stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([client, "-H", host, "version"], capture_output=True).returncode != 0:  # noqa: PLW1510
            if proc.poll() is not None or time.monotonic() > deadline:
                unavailable("a second Docker 26 engine did not start: " + (root / "dockerd.log").read_text()[-2000:])
            time.sleep(0.5)
        save = subprocess.Popen([client, "-H", str(shared["DOCKER_HOST"]), "save", base_image], stdout=subprocess.PIPE)
        load = subprocess.run([client, "-H", host, "load"], stdin=save.stdout, capture_output=True, text=True,
                              timeout=300)
        assert save.wait(timeout=300) == 0 and load.returncode == 0, load.stderr
        yield host
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


@on_engine("docker26")  # a second engine of Docker 26; 20.10 gives no identical image (above)
def test_a_fresh_engine_builds_the_same_image(tmp_path, base_image, unique_name, engine, cleanup_images):
    """Issue 33 item 1: a build on another engine, with an empty data-root (a fresh CI runner), gives
    the image a --no-cache build on the shared engine gives: the same id, layer by layer."""
    recipe = write_recipe(tmp_path, tiny_recipe(unique_name, base_image, pip=("six==1.16.0",)))
    os.utime(recipe, (1_000_000_000, 1_000_000_000))
    here = build_no_cache(recipe, f"{unique_name}:shared", cleanup_images)
    with fresh_docker26(base_image) as host, pytest.MonkeyPatch.context() as mp:
        mp.setenv("DOCKER_HOST", host)
        code, out, err = run_cli("build", str(recipe), "--tag", f"{unique_name}:fresh", "--json", "--progress",
                                 "quiet", *CA_ARGS)
        assert code == 0, err
        fresh = json.loads(out)
        fresh_layers = layer_list(fresh["tags"][0])
    assert fresh["steps_cached"] == 0  # nothing to take from: every step ran there
    assert fresh_layers == layer_list(here["tags"][0])
    assert fresh["image_id"] == here["image_id"]
