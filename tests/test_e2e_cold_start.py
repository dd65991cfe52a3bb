"""End to end on Docker 26 (issue 33: 3): budget.cold_start fails a build as budget.max_size does. The
build's first test times the entrypoint's start (here a test that sleeps 3 s), the image's compressed
size on the containerd store gives the pull; over the budget the build exits 1, the image is kept as
REPO:rejected and nothing reaches the registry. Under it, the report carries the figure (--json)."""

import json

import pytest
from conftest import on_engine
from helpers import CA_ARGS, run_cli, tiny_recipe, write_recipe

from buildkit_py import oci
from buildkit_py.errors import ManifestNotFound

pytestmark = pytest.mark.e2e

SLOW_START = "test:\n  - {name: slow-start, run: \"python -c 'import time; time.sleep(3)'\"}\n"


def _build(folder, name, base, budget, registry):
    """Build and push the tiny recipe with its slow-starting test and ``budget``: (exit code, JSON, stderr)."""
    recipe = write_recipe(folder, tiny_recipe(name, base) + SLOW_START + f"budget: {{cold_start: {budget}}}\n")
    code, out, err = run_cli("build", str(recipe), "--registry", registry, "--push", "--json", "--progress", "quiet",
                             *CA_ARGS)
    return code, json.loads(out), err


@on_engine("docker26")
def test_a_build_over_its_cold_start_budget_pushes_nothing(tmp_path, engine, logged_in, base_image, unique_name,
                                                           cleanup_images, registry_refs):
    tag, rejected = f"{logged_in.address}/{unique_name}:1", f"{logged_in.address}/{unique_name}:rejected"
    cleanup_images.extend([tag, rejected])
    code, doc, err = _build(tmp_path / "over", unique_name, base_image, "{max: 2s, bandwidth: 1Gbit}",
                            logged_in.address)
    assert code == 1, err
    assert doc["error"] == "ColdStartOverBudget" and doc["max_seconds"] == 2.0, doc
    cold = doc["cold_start"]
    assert cold["start_seconds"] >= 3.0 and cold["start_source"] == "test 'slow-start'"
    assert cold["seconds"] > 3.0 and cold["pull_exact"] is True and cold["bandwidth"] == 125e6
    assert "over the recipe's budget.cold_start.max of 2s" in doc["message"]
    assert doc["message"].endswith(f"kept as {rejected}") and "Traceback" not in err
    with pytest.raises(ManifestNotFound):
        oci.get_manifest(tag)
    assert engine.image_attrs(rejected) is not None and engine.image_attrs(tag) is None

    # the same image under a budget it meets: pushed, the figure in the report, the pull its compressed size
    code, report, err = _build(tmp_path / "fits", unique_name, base_image,
                               "{max: 10min, bandwidth: 100Mbit, unpack_rate: 50MB/s}", logged_in.address)
    assert code == 0, err
    cleanup_images.extend(report["tags"])
    registry_refs.extend(p["ref"] for p in report["pushes"])
    cold = report["cold_start"]
    assert cold["pull_bytes"] > 0 and cold["unpack_bytes"] == report["size_uncompressed"]
    assert cold["download_seconds"] == round(cold["pull_bytes"] / 12.5e6, 2)
    assert cold["unpack_seconds"] == round(cold["unpack_bytes"] / 50e6, 2)
    assert cold["start_seconds"] >= 3.0
    # the image's layers (from its engine) unpack as their downloads end: between either part and their sum
    parts = (cold["download_seconds"], cold["unpack_seconds"])
    assert max(parts) - 0.02 <= cold["ready_seconds"] <= sum(parts) + 0.02
    assert cold["seconds"] == pytest.approx(cold["ready_seconds"] + cold["start_seconds"], abs=0.02)
    assert cold["sequential_seconds"] == pytest.approx(sum(parts) + cold["start_seconds"], abs=0.02)


@on_engine("docker26")
def test_the_images_on_the_node_are_not_pulled_again(tmp_path, engine, logged_in, base_image, unique_name,
                                                      cleanup_images, registry_refs):
    """budget.cold_start.node: a node already running the image without the app's pin pulls only what
    `imgbuild diff` says is new, and unpacks only the layers above the shared ones (same chain)."""
    registry = logged_in.address
    code, first, err = _build(tmp_path / "a", unique_name, base_image, "{max: 10min, bandwidth: 1Gbit}", registry)
    assert code == 0, err
    cleanup_images.extend(first["tags"])
    registry_refs.extend(p["ref"] for p in first["pushes"])
    held = first["pushes"][0]["ref"]
    recipe = write_recipe(tmp_path / "b", tiny_recipe(f"{unique_name}-b", base_image, pip=("six==1.16.0",))
                          + SLOW_START + f"budget: {{cold_start: {{max: 10min, bandwidth: 1Gbit, node: [{held}]}}}}\n")
    code, out, err = run_cli("build", str(recipe), "--registry", registry, "--push", "--json", "--progress", "quiet",
                             *CA_ARGS)
    assert code == 0, err
    second = json.loads(out)
    cleanup_images.extend(second["tags"])
    registry_refs.extend(p["ref"] for p in second["pushes"])
    cold = second["cold_start"]
    code, out, err = run_cli("diff", held, second["pushes"][0]["ref"], "--json", "--source", "registry")
    assert code == 0, err
    diff = json.loads(out)
    new = [x for x in diff["layers"] if x["status"] == "new"]
    assert new and cold["layers_held"] == diff["totals"]["layers"] - len(new) > 0, (cold, diff["totals"])
    # before the push the engine gives the image's compressed size with its manifest and config (which a
    # pull downloads too, new for a new image): the pull is the new layers and those, exactly
    beside_layers = engine.image_sizes(second["tags"][0]).compressed - diff["totals"]["compressed_size"]
    assert 0 < beside_layers < 64 * 1024, beside_layers
    assert cold["pull_bytes"] == diff["totals"]["new_compressed_size"] + beside_layers < second["size_compressed"]
    # unpacked there already: the shared layers below the first new one (one above it is unpacked again)
    below = next(i for i, x in enumerate(diff["layers"]) if x["status"] == "new")
    assert 0 < cold["layers_unpacked_held"] == below <= cold["layers_held"]
    # unpacked bytes as the engine counts them (its history), as the build reads them
    code, out, err = run_cli("diff", first["tags"][0], second["tags"][0], "--json", "--source", "engine")
    assert code == 0, err
    layers = json.loads(out)["layers"]
    assert cold["unpack_bytes"] == sum(x["size"] for x in layers[below:]) < second["size_uncompressed"]

    # an image the node holds that its registry does not have: the build stops before it starts
    gone = f"{registry}/{unique_name}-gone:1"
    recipe.write_text(recipe.read_text().replace(held, gone))
    code, out, err = run_cli("build", str(recipe), "--registry", registry, "--push", "--json", "--progress", "quiet",
                             *CA_ARGS)
    doc = json.loads(out)
    assert code == 1 and doc["message"].startswith(f"budget.cold_start.node: {gone}: "), doc
    assert "Traceback" not in err
