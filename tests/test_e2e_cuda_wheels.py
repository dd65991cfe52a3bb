"""End to end, CUDA from wheels on a plain Debian base (no GPU needed): a CUDA 13 image from the
unsuffixed wheels loads libcudart by name, a devel flavor from CUDA 13 wheels compiles and links a
.cu file with its nvcc, and every io.imgbuild.* label of each image is checked against what is
really inside it (ldconfig -p, pip list, python, /etc/os-release)."""

import json
import subprocess

import pytest
from conftest import on_engine
from helpers import CA_ARGS, run_cli, write_recipe

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


def _build(tmp_path, name, base, cuda, flavor="runtime", cudnn=None):
    path = write_recipe(tmp_path, RECIPE.format(name=name, cuda=cuda, flavor=flavor, base=base,
                                                cudnn=f', cudnn: "{cudnn}"' if cudnn else ""))
    code, out, err = run_cli("build", str(path), *CA_ARGS, "--json", "--progress", "quiet")
    assert code == 0, err
    return json.loads(out)


def _sh(image_id, script, timeout=120):
    out = subprocess.run(["/usr/bin/docker", "run", "--rm", "--network", "none", "--entrypoint", "sh", image_id,
                          "-c", script], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout


def assert_labels_true(image_id, labels):
    """Each io.imgbuild.* label that names content must match the image's content."""
    facts = json.loads(_sh(image_id, "python - <<'EOF'\n"
                           "import json, platform, subprocess, shutil\n"
                           "from importlib import metadata\n"
                           "pkgs = {d.metadata['Name'].lower(): d.version for d in metadata.distributions()}\n"
                           "ld = subprocess.run(['ldconfig', '-p'], capture_output=True, text=True).stdout\n"
                           "osr = dict(l.split('=', 1) for l in open('/etc/os-release').read().split() if '=' in l)\n"
                           "print(json.dumps({'pkgs': pkgs, 'ld': ld, 'py': platform.python_version(),\n"
                           "  'os': osr['ID'] + osr['VERSION_ID'].strip('\"'), 'nvcc': bool(shutil.which('nvcc'))}))\n"
                           "EOF"))
    checked = set()
    mm = ".".join(labels["io.imgbuild.cuda.version"].split(".")[:2])
    runtime = {n: v for n, v in facts["pkgs"].items() if n.startswith("nvidia-cuda-runtime")}
    if labels.get("io.imgbuild.cuda.source") == "wheels":
        assert runtime and all(v.startswith(mm + ".") for v in runtime.values()), runtime
        assert f"libcudart.so.{mm.split('.')[0]}" in facts["ld"]
        checked |= {"io.imgbuild.cuda.version", "io.imgbuild.cuda.source"}
    cudnn = labels.get("io.imgbuild.cudnn.version")
    if cudnn:
        assert f"libcudnn.so.{cudnn}" in facts["ld"], "cuDNN label without libcudnn in the loader cache"
        checked.add("io.imgbuild.cudnn.version")
    else:
        assert "libcudnn.so" not in facts["ld"]
    assert facts["py"].startswith(labels["io.imgbuild.python.version"] + ".")
    assert facts["os"].replace("debian", "debian") == labels["io.imgbuild.os"]
    flavor = labels.get("io.imgbuild.cuda.flavor")
    assert facts["nvcc"] == (flavor == "devel"), f"flavor {flavor} but nvcc on PATH: {facts['nvcc']}"
    torch = labels.get("io.imgbuild.torch.version")
    assert (facts["pkgs"].get("torch") or None) == (torch.split("+")[0] if torch else None)
    checked |= {"io.imgbuild.python.version", "io.imgbuild.os", "io.imgbuild.cuda.flavor"}
    return checked


def test_cuda13_wheels_image_loads_libcudart_by_name(tmp_path, base_image, docker_client, cleanup_images,
                                                     unique_name):
    report = _build(tmp_path, unique_name, base_image, "13.0")
    cleanup_images.extend(report["tags"])
    labels = docker_client.images.get(report["image_id"]).labels
    assert labels["io.imgbuild.cuda.version"] == "13.0.3"
    out = _sh(report["image_id"], "python -c \"import ctypes; ctypes.CDLL('libcudart.so.13'); print('cudart 13 loaded')\"")  # noqa: E501
    assert out.strip() == "cudart 13 loaded"
    assert "nvidia-cuda-runtime==13.0.96" in _sh(report["image_id"], "pip list --format=freeze")
    assert assert_labels_true(report["image_id"], labels) >= {"io.imgbuild.cuda.version", "io.imgbuild.cuda.source"}


@on_engine("docker20")  # what nvcc compiles does not depend on the engine; the build above runs on both
def test_devel_from_cuda13_wheels_compiles_with_nvcc(tmp_path, base_image, docker_client, cleanup_images,
                                                     unique_name):
    report = _build(tmp_path, unique_name, base_image, "13.0", flavor="devel")
    cleanup_images.extend(report["tags"])
    labels = docker_client.images.get(report["image_id"]).labels
    assert labels["io.imgbuild.cuda.flavor"] == "devel"
    script = (f"cat > /tmp/k.cu <<'EOF'\n{KERNEL}EOF\n"
              "nvcc -arch=sm_90a -o /tmp/k /tmp/k.cu && /tmp/k && echo $CUDA_HOME")
    out = _sh(report["image_id"], script, timeout=300).split()
    assert out == ["13000", "/usr/local/cuda"]
    assert_labels_true(report["image_id"], labels)


@on_engine("docker26")  # ~1 GB of cuDNN wheels; the labels themselves are checked on both engines above
def test_cudnn_label_is_backed_by_libcudnn(tmp_path, base_image, docker_client, cleanup_images, unique_name):
    report = _build(tmp_path, unique_name, base_image, "13.0", cudnn="9")
    cleanup_images.extend(report["tags"])
    labels = docker_client.images.get(report["image_id"]).labels
    assert labels["io.imgbuild.cudnn.version"] == "9"
    assert "io.imgbuild.cudnn.version" in assert_labels_true(report["image_id"], labels)
