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
