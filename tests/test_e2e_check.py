"""End to end on a real engine: `imgbuild check IMAGE` on the host's driver, read from a recorded
nvidia-smi (there is no GPU here), judges an image built by imgbuild by the driver floors stamped on
it, whatever imgbuild's data says since, and an image without them by the data (issue 29: 2)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import CA_ARGS, change_cuda12_floors, fake_nvidia_smi, run_cli, tiny_recipe, write_recipe

FIX = Path(__file__).parent / "fixtures" / "nvidia-smi"
# What nvidia-smi prints with no arguments on the 535.104.05 driver of single_rtx4090.csv: the
# driver's own CUDA (12.2) is below the image's 12.4, so the floors decide.
BANNER = """\
+---------------------------------------------------------------------------------------+
| NVIDIA-SMI 535.104.05             Driver Version: 535.104.05   CUDA Version: 12.2     |
|-----------------------------------------+----------------------+----------------------+
"""


@pytest.fixture
def host_535(tmp_path, monkeypatch):
    """This host's nvidia-smi answers with the recorded outputs of an RTX 4090 on driver 535.104.05."""
    smi = fake_nvidia_smi(tmp_path / "smi", FIX / "single_rtx4090.csv", BANNER)
    monkeypatch.setenv("PATH", f"{smi}{os.pathsep}{os.environ['PATH']}")  # the engine's client stays on it


def check(image: str) -> tuple[int, dict, str]:
    code, out, err = run_cli("check", image, "--json")
    assert code in (0, 1), err
    text = run_cli("check", image)[1]
    return code, json.loads(out), text


def test_check_follows_the_floors_the_image_carries(engine, base_image, cleanup_images, unique_name, tmp_path,
                                                    monkeypatch, host_535):
    recipe = write_recipe(tmp_path / "app", tiny_recipe(unique_name, base_image))
    code, out, err = run_cli("build", str(recipe), "--json", "--progress", "quiet", "--no-test", *CA_ARGS)
    assert code == 0, err
    built = json.loads(out)
    cleanup_images.extend(built["tags"])
    labelled = built["tags"][0]
    labels = engine.image_attrs(labelled)["Config"]["Labels"]
    assert (labels["io.imgbuild.cuda.version"], labels["io.imgbuild.cuda.driver.min"],
            labels["io.imgbuild.cuda.driver.min-compat"]) == ("12.4.1", "550.54.15", "525.60.13")
    # the same image, its floor labels taken off: what an image built without them looks like
    bare = f"{unique_name}:no-floors"
    cleanup_images.append(bare)
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "Dockerfile").write_text(
        f"FROM {labelled}\nLABEL io.imgbuild.cuda.driver.min= io.imgbuild.cuda.driver.min-compat=\n")
    buildx = getattr(engine, "buildx", None)  # Docker 26 has no classic builder
    argv = [*buildx, "build", "--output", f"type=docker,name={bare}"] if buildx else \
        [*engine.client_argv(), "build", "-q", "-t", bare]
    done = subprocess.run([*argv, str(tmp_path / "bare")], capture_output=True, text=True, timeout=300,
                          env=engine.environment())
    assert done.returncode == 0, done.stderr

    # with today's data both images get the same verdict, each saying where its floors came from
    code, data, text = check(labelled)
    assert (code, data["verdict"], data["floors_from"], data["driver"]) == (
        0, "minor-version", "from the image's labels", "535.104.05")
    assert "warnings" not in data and "  driver floors from the image's labels: >= 550.54.15 native" in text
    code, data, _ = check(bare)
    assert (code, data["verdict"], data["floors_from"]) == (
        0, "minor-version", "from imgbuild's data, the image carries no floor")

    # the data changes (the 12.x minor-version floor rises above this driver): the labelled image
    # keeps the verdict it carries and says the data now differs; the bare one follows the data
    change_cuda12_floors(monkeypatch, tmp_path / "changed")
    try:
        code, data, text = check(labelled)
        assert (code, data["verdict"], data["floor_source"], data["min_driver_compat"]) == (
            0, "minor-version", "labels", "525.60.13")
        assert data["warnings"] == [{
            "code": "floor-labels-differ", "key": None,
            "message": "imgbuild's data now differs for CUDA 12.4.1: >= 550.54.14 native, >= 535.154.05 with "
                       "minor-version compatibility (the image's labels say >= 550.54.15 native, >= 525.60.13 with "
                       "minor-version compatibility); the verdict follows the labels, by the data it would be "
                       "incompatible",
            "hint": "to judge by the data instead: imgbuild check --cuda 12.4.1 --driver 535.104.05"}]
        assert "  warning: [floor-labels-differ] imgbuild's data now differs for CUDA 12.4.1" in text
        code, data, _ = check(bare)
        assert (code, data["verdict"], data["floor_source"], data["min_driver_compat"]) == (
            1, "incompatible", "data", "535.154.05")
    finally:
        from buildkit_py.compat import tables

        tables.clear_caches()
