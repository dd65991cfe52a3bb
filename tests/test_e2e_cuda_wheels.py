"""End to end, CUDA from wheels on a plain Debian base (no GPU needed): a CUDA 13 image from the
unsuffixed wheels loads libcudart by name, a devel flavor from CUDA 13 wheels compiles and links a
.cu file with its nvcc, and every io.imgbuild.* label of each image is checked against what is
really inside it (ldconfig -p, pip list, python, /etc/os-release)."""

import json

import pytest
from conftest import on_engine
from helpers import CA_ARGS, assert_labels_true, image_sh, run_cli, write_recipe

from buildkit_py import compat
from buildkit_py.analysis.image_checks import tier_packages

pytestmark = pytest.mark.e2e

RECIPE = """\
name: {name}
version: "1.0"
cuda: {{version: "{cuda}", source: wheels, flavor: {flavor}{cudnn}}}
base: {{image: {base}}}
python: "3.11"
"""
KERNEL = """\
#include <cstdio>
#include <cuda_runtime.h>
__global__ void k(int *x) { x[0] = 42; }
int main() { int v = 0; cudaRuntimeGetVersion(&v); printf("%d\\n", v); return 0; }
"""


def _build(tmp_path, name, base, cuda, flavor="base", cudnn=None):
    path = write_recipe(tmp_path, RECIPE.format(name=name, cuda=cuda, flavor=flavor, base=base,
                                                cudnn=f', cudnn: "{cudnn}"' if cudnn else ""))
    code, out, err = run_cli("build", str(path), *CA_ARGS, "--json", "--progress", "quiet")
    assert code == 0, err
    return json.loads(out)


def test_cuda13_wheels_image_loads_libcudart_by_name(tmp_path, base_image, docker_client, cleanup_images,
                                                     unique_name):
    report = _build(tmp_path, unique_name, base_image, "13.0")
    cleanup_images.extend(report["tags"])
    labels = docker_client.images.get(report["image_id"]).labels
    assert labels["io.imgbuild.cuda.version"] == "13.0.3"
    out = image_sh(report["image_id"], "python -c \"import ctypes; ctypes.CDLL('libcudart.so.13'); print('cudart 13 loaded')\"")  # noqa: E501
    assert out.strip() == "cudart 13 loaded"
    assert "nvidia-cuda-runtime==13.0.96" in image_sh(report["image_id"], "pip list --format=freeze")
    assert assert_labels_true(report["image_id"], labels) >= {"io.imgbuild.cuda.version", "io.imgbuild.cuda.source"}


@on_engine("docker20")  # the labels come from the Dockerfile; the engine paths run on both above
def test_cuda_13_4_image_claims_no_native_floor(tmp_path, base_image, docker_client, cleanup_images, unique_name):
    """NVIDIA publishes no minimum driver for CUDA 13.4: no io.imgbuild.cuda.driver.min label, the
    minor-version floor only (issue 21: 2); the checker holds every other label to the content."""
    report = _build(tmp_path, unique_name, base_image, "13.4")
    cleanup_images.extend(report["tags"])
    labels = docker_client.images.get(report["image_id"]).labels
    assert "io.imgbuild.cuda.driver.min" not in labels and labels["io.imgbuild.cuda.driver.min-compat"] == "580"
    assert {"io.imgbuild.cuda.driver.min", "io.imgbuild.cuda.version"} <= assert_labels_true(report["image_id"], labels)


@on_engine("docker20")  # what nvcc compiles does not depend on the engine; the build above runs on both
def test_devel_from_cuda13_wheels_compiles_with_nvcc(tmp_path, base_image, docker_client, cleanup_images,
                                                     unique_name):
    report = _build(tmp_path, unique_name, base_image, "13.0", flavor="devel")
    cleanup_images.extend(report["tags"])
    labels = docker_client.images.get(report["image_id"]).labels
    assert labels["io.imgbuild.cuda.flavor"] == "devel"
    script = (f"cat > /tmp/k.cu <<'EOF'\n{KERNEL}EOF\n"
              "nvcc -arch=sm_90a -o /tmp/k /tmp/k.cu && /tmp/k && echo $CUDA_HOME")
    out = image_sh(report["image_id"], script, timeout=300).split()
    assert out == ["13000", "/usr/local/cuda"]
    assert_labels_true(report["image_id"], labels)


@on_engine("docker26")  # ~2 GB of wheels (the runtime tier, cuDNN); the labels are checked on both engines above
def test_runtime_tier_and_cudnn_labels_are_backed_by_the_libraries(tmp_path, base_image, docker_client,
                                                                   cleanup_images, unique_name):
    """flavor: runtime from wheels carries NVIDIA's runtime tier (cuBLAS, cuFFT, cuRAND, cuSOLVER,
    cuSPARSE, NPP, nvJPEG, NVRTC, nvJitLink, NVTX, cuFile, NCCL...), not only cudart (issue 21: 3);
    the checker compares the whole set with wheels.json's tier."""
    report = _build(tmp_path, unique_name, base_image, "13.0", flavor="runtime", cudnn="9")
    cleanup_images.extend(report["tags"])
    labels = docker_client.images.get(report["image_id"]).labels
    # the label is the cuDNN the wheel installs, as exact as its pin (issue 28), the major asked for
    cudnn = compat.cudnn_wheel("13.0", "9")
    assert (labels["io.imgbuild.cudnn.version"], labels["io.imgbuild.cuda.flavor"]) == (cudnn.version, "runtime")
    assert "io.imgbuild.cudnn.version" in assert_labels_true(report["image_id"], labels)
    assert {"nvidia-cublas", "nvidia-npp", "nvidia-nvjpeg", "nvidia-nccl", "nvidia-cufft"} <= tier_packages(
        "runtime", "13.0")
    loaded = image_sh(report["image_id"], "python -c \"import ctypes; [ctypes.CDLL(n) for n in "
                                          "('libcublas.so.13', 'libnppc.so.13', 'libnvjpeg.so.13', 'libnccl.so.2')]; "
                                          "print('ok')\"")
    assert loaded.strip() == "ok"
