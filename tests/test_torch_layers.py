"""The torch stack in stable layers: the CUDA wheels a torch release pins, each big library in a
reproducible layer of its own, before torch (plan.py, compat/torch_pins.py)."""

from helpers import write_recipe

from buildkit_py.compat.torch_pins import CudaWheel, cuda_layers, torch_cuda_pins
from buildkit_py.plan.build_plan import make_plan
from buildkit_py.plan.steps import MountStubsStep, PipStep
from buildkit_py.recipe.model import load_recipe
from buildkit_py.render.dockerfile import render_step

RECIPE = """\
name: team/x
cuda: {{version: "13.0", source: wheels}}
base: {{image: debian:bookworm-slim}}
python: "3.11"
torch: "{torch}"
pip: [requests==2.32.3]
"""


def plan_for(tmp_path, torch):
    return make_plan(load_recipe(write_recipe(tmp_path, RECIPE.format(torch=torch))))


def test_torch_from_the_registry_gets_its_cuda_wheels_in_layers_before_it(tmp_path):
    plan = plan_for(tmp_path, "2.14.1")
    ids = [s.id for s in plan.final.steps]
    assert ids == ["os", "python", "mount-stubs", "cuda-libs", "cuda-cublas", "cuda-cufft", "cuda-cusolver",
                   "cuda-cusparse", "cuda-cudnn", "cuda-cusparselt", "cuda-nccl", "torch", "pins", "ldconfig", "meta"]
    cuda = [s for s in plan.final.steps if s.id.startswith("cuda-")]
    assert all(isinstance(s, PipStep) and s.no_deps and s.reproducible and s.group == "cuda" for s in cuda)
    installed = sorted(r for s in cuda for r in s.requirements)
    assert installed == sorted(w.pin for w in torch_cuda_pins("2.14.1").wheels)
    assert "nvidia-cudnn-cu13==9.24.0.43" in installed and "cuda-toolkit==13.0.3.0" in installed
    torch = plan.final.steps[ids.index("torch")]
    assert torch.requirements == ("torch==2.14.1",) and torch.reproducible and not torch.no_deps
    assert isinstance(plan.final.steps[2], MountStubsStep)
    assert [f.path for f in plan.context_files] == [".imgbuild/empty"]


def test_a_torch_patch_release_with_the_same_pins_changes_only_the_torch_step(tmp_path):
    a, b = plan_for(tmp_path / "a", "2.14.0"), plan_for(tmp_path / "b", "2.14.1")
    text = {s.id: render_step(s) for s in a.final.steps}
    changed = [s.id for s in b.final.steps if text.get(s.id) != render_step(s)]
    assert changed == ["torch", "meta"]  # meta: the torch label


def test_a_release_that_bumps_cudnn_and_nccl_changes_only_those_layers(tmp_path):
    a, b = plan_for(tmp_path / "a", "2.13.0"), plan_for(tmp_path / "b", "2.14.0")
    text = {s.id: render_step(s) for s in a.final.steps}
    changed = [s.id for s in b.final.steps if text.get(s.id) != render_step(s)]
    assert changed == ["cuda-cudnn", "cuda-nccl", "torch", "meta"]


def test_torch_from_another_index_keeps_one_step(tmp_path):
    path = write_recipe(tmp_path, 'name: x\ncuda: {version: "12.1", source: wheels}\n'
                                  'base: {image: debian:bookworm-slim}\npython: "3.11"\ntorch: "2.5.1"\n')
    assert make_plan(load_recipe(path)).resolution.torch_index_url  # cu121: PyPI's 2.5.1 is cu124
    ids = [s.id for s in make_plan(load_recipe(path)).final.steps]
    assert not any(i.startswith("cuda-") for i in ids) and "torch" in ids


def _w(name, mb):
    return CudaWheel(name, "1.0", mb * 10**6, "0" * 64)


def test_cuda_layers_big_wheels_alone_toolkit_parts_first_small_ones_together():
    wheels = (_w("cuda-toolkit", 0), _w("nvidia-cublas", 423), _w("nvidia-cudnn-cu13", 553),
              _w("nvidia-cuda-runtime", 2), _w("nvidia-nccl-cu13", 216), _w("nvidia-cufft", 214))
    layers = cuda_layers(wheels)
    assert [(x.id, [w.name for w in x.wheels]) for x in layers] == [
        ("cuda-libs", ["cuda-toolkit", "nvidia-cuda-runtime"]),
        ("cuda-cublas", ["nvidia-cublas"]), ("cuda-cufft", ["nvidia-cufft"]),
        ("cuda-cudnn", ["nvidia-cudnn-cu13"]), ("cuda-nccl", ["nvidia-nccl-cu13"])]
    assert [x.id for x in cuda_layers(wheels, own_layer_bytes=10**12)] == ["cuda-libs"]


def test_the_data_covers_the_current_releases_with_sources():
    for v in ("2.13.0", "2.14.0", "2.14.1", "2.15.0"):
        row = torch_cuda_pins(v)
        assert row is not None and row.source and row.read
        assert any(w.name.startswith("nvidia-cudnn") for w in row.wheels)
    assert torch_cuda_pins("0.1.0") is None
