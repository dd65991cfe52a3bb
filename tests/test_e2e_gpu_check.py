"""`imgbuild check IMAGE --gpu` end to end on a real image: CUDA 13.0 from wheels plus cuRAND
10.4.0.35, whose libcurand.so.10 carries SASS for sm_75 to sm_121 and PTX for compute_121 only
(tests/test_kernels_cuobjdump.py checks that reading against cuobjdump). So an H100 and a T4 run
it from SASS, and a V100 (7.0) gets "no kernel image is available": the verdict must say so and
name the library, before any GPU is rented. One small image (a 60 MB wheel), one engine; then
the same checks on the image pushed and no longer in the engine, read from its registry."""

import json

import pytest
from conftest import on_engine
from helpers import CA_ARGS, run_cli, write_recipe

pytestmark = pytest.mark.e2e

CURAND = "/opt/venv/lib/python3.11/site-packages/nvidia/cu13/lib/libcurand.so.10"


@on_engine("docker20")
def test_check_gpu_on_an_image_with_curand(tmp_path, engine, base_image, unique_name, cleanup_images, logged_in,
                                           registry_refs, docker_client):
    recipe = write_recipe(tmp_path, f"""\
name: {unique_name}-curand
version: "1.0"
cuda: {{version: "13.0", source: wheels, flavor: base}}
base: {{image: {base_image}}}
python: "3.11"
pip: ["nvidia-curand==10.4.0.35"]
""")
    code, out, err = run_cli("build", str(recipe), *CA_ARGS, "--json", "--progress", "quiet")
    assert code == 0, err
    image = json.loads(out)["tags"][0]
    cleanup_images.append(image)

    code, out, err = run_cli("check", image, "--gpu", "H100", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert (report["verdict"], report["runs"], report["capability"]) == ("sass", True, "9.0")
    curand = next(lib for lib in report["libraries"] if lib["path"] == CURAND)
    assert curand["sass"] == ["sm_90"] and "sm_121" in curand["archs"] and "sm_70" not in curand["archs"]

    code, out, _ = run_cli("check", image, "--gpu", "T4")
    assert code == 0 and f"sass      {CURAND}: sm_75" in out

    code, out, _ = run_cli("check", image, "--gpu", "V100")
    assert code == 1
    assert f"image {image} on V100 (compute capability 7.0): no-kernel" in out
    assert f"no kernel for V100 (compute capability 7.0) in {CURAND}" in out

    # inspect --kernels: the same library, its bytes of SASS per architecture
    code, out, err = run_cli("inspect", image, "--kernels", "--no-compressed", "--json", "--progress", "quiet")
    assert code == 0, err
    kernels = json.loads(out)["kernels"]
    lib = next(x for x in kernels["libraries"] if x["path"] == CURAND)
    assert set(lib["sass_bytes"]) == set(curand["archs"]) and all(n > 100_000 for n in lib["sass_bytes"].values())
    assert lib["ptx"] == ["compute_121 (9.0)"]
    assert kernels["sass_bytes"]["sm_90"] >= lib["sass_bytes"]["sm_90"]

    # the same image only in its registry: read layer blob by layer blob, whiteouts applied
    ref = f"{logged_in.address}/{unique_name}-curand:1"
    engine.tag(image, ref)
    engine.push(ref)
    registry_refs.append(ref)
    docker_client.images.remove(ref)  # the tag only: `image` keeps the layers for the other checks
    code, out, err = run_cli("check", ref, "--gpu", "V100", "--json")
    assert code == 1, err
    remote = json.loads(out)
    assert (remote["verdict"], remote["decided_by"]) == ("no-kernel", CURAND)
    assert run_cli("check", ref, "--gpu", "H100")[0] == 0
