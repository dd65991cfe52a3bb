"""CUDA layers shared across OSes and Pythons (issue 33 item 2): the nvidia-* wheels go into one
prefix outside the venv (plan.PrefixPipStep, /opt/imgbuild/cuda-wheels), so a Debian 12 /
Python 3.11 image and a Debian 13 / Python 3.13 image of the same CUDA carry the same CUDA layer,
byte for byte, and a node holding one pulls only the rest for the other. The libraries still load
in both, by soname (the loader's config) and through Python (the venv's .pth)."""

import json
import subprocess

import pytest
from conftest import _client, on_engine, unavailable
from helpers import CA_ARGS, assert_labels_true, image_sh, run_cli, write_recipe
from test_e2e_reproducible_layers import layers_by_step

pytestmark = pytest.mark.e2e

# Debian 13 has Python 3.13, Debian 12 3.11: another OS and another Python under the same CUDA.
TRIXIE = "debian:trixie-slim"

RECIPE = """\
name: {name}
version: "1.0"
cuda: {{version: "12.4", source: wheels, flavor: base}}
base: {{image: {base}}}
python: "{python}"
build: {{installer: pip}}
"""

# In each image: libcudart loads by soname (ld.so.conf.d + ldconfig) and reports its version;
# Python sees the wheel (importlib.metadata through the .pth) and imports its package from the prefix.
LOAD = ("python -c 'import ctypes, importlib.metadata as m, nvidia.cuda_runtime as r; v = ctypes.c_int(); "
        "ctypes.CDLL(\"libcudart.so.12\").cudaRuntimeGetVersion(ctypes.byref(v)); "
        "print(v.value, m.version(\"nvidia-cuda-runtime-cu12\"), list(r.__path__)[0])'")


@pytest.fixture(scope="session")
def trixie_base(engine, tmp_path_factory) -> str:
    """debian:trixie-slim in the engine: made with mmdebstrap (about 20 s) and imported where missing,
    as scripts/services.sh makes the bookworm base; no public registry serves one here."""
    if engine.image_attrs(TRIXIE) is not None:
        return TRIXIE
    tar = tmp_path_factory.mktemp("trixie") / "rootfs.tar"
    try:
        subprocess.run(["mmdebstrap", "--quiet", "--format=tar", "--variant=minbase", "--include=ca-certificates",
                        "trixie", str(tar), "http://deb.debian.org/debian"], check=True, timeout=600,
                       capture_output=True)
    except (OSError, subprocess.SubprocessError) as exc:
        unavailable(f"cannot make the {TRIXIE} base with mmdebstrap: {exc}")
    done = _client(engine, "import", str(tar), TRIXIE)
    assert done.returncode == 0, done.stderr
    return TRIXIE


@on_engine("docker26")
def test_images_on_other_oses_and_pythons_share_their_cuda_layer_and_load_it(
        tmp_path, base_image, trixie_base, unique_name, cleanup_images):
    digests, loaded = [], []
    for i, (base, python) in enumerate([(base_image, "3.11"), (trixie_base, "3.13")]):
        path = write_recipe(tmp_path / str(i), RECIPE.format(name=f"{unique_name}-{i}", base=base, python=python))
        code, out, err = run_cli("build", str(path), "--json", "--progress", "quiet", *CA_ARGS)
        assert code == 0, err
        report = json.loads(out)
        cleanup_images.extend(report["tags"])
        digests.append(layers_by_step(report["tags"][0]))
        loaded.append(image_sh(report["image_id"], LOAD).split())
        # the image tests' facts (importlib.metadata, wheel_libs, ldconfig -p, cudart's version)
        # find the wheels in the prefix: every io.imgbuild.* label holds
        assert "io.imgbuild.cuda.version" in assert_labels_true(report["image_id"], report["labels"])
    a, b = digests
    assert a["os"] != b["os"] and a["python"] != b["python"] and a["cuda-path"] != b["cuda-path"]
    assert a["cuda"] == b["cuda"]  # the CUDA wheels' layer: one blob for both images
    for got in loaded:
        assert got == ["12040", "12.4.127", "/opt/imgbuild/cuda-wheels/nvidia/cuda_runtime"]
