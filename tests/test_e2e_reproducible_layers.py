"""Reproducible layers on the real engine: the CUDA wheels' layer is byte-identical in two images
whose lower layers differ (another apt package), so a node that holds one image pulls only
what changed for the other (plan.PipStep.reproducible, steps.j2 repro_begin/repro_end)."""

import json
import os
import time

import pytest
from conftest import on_engine
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
def test_the_cuda_layer_is_byte_identical_over_different_lower_layers(tmp_path, base_image, unique_name,
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
    assert a["os"] != b["os"] and a["python"] != b["python"]  # the lower layers differ...
    assert a["cuda"] == b["cuda"]  # ...and the CUDA wheels' layer does not


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
