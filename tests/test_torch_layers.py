"""The torch stack in stable layers: the CUDA wheels a torch release pins, each big library in a
reproducible layer of its own, before torch (plan.py, compat/torch_pins.py)."""

import dataclasses
import time

from helpers import plan_of, write_recipe

from buildkit_py.compat.torch_pins import (
    CudaWheel,
    big_libraries,
    cuda_layers,
    cuda_pin_layers,
    is_python_independent,
    rows,
    torch_cuda_pins,
)
from buildkit_py.engine.build import write_context
from buildkit_py.plan.build_plan import MAX_HEAVY_LAYERS, SOURCE_DATE_EPOCH, _heavy_steps
from buildkit_py.plan.steps import (
    CUDA_PREFIX,
    ContextFile,
    LockedPipStep,
    MountStubsStep,
    PipStep,
    PrefixPathStep,
    PrefixPipStep,
)
from buildkit_py.recipe.model import load_recipe
from buildkit_py.render.dockerfile import render_step

RECIPE = """\
name: team/x
cuda: {{version: "13.0", source: wheels, flavor: base}}
base: {{image: debian:bookworm-slim}}
python: "3.11"
torch: "{torch}"
pip: [requests==2.32.3]
"""


def plan_for(tmp_path, torch):
    return plan_of(load_recipe(write_recipe(tmp_path, RECIPE.format(torch=torch))))


def test_torch_from_the_registry_gets_its_cuda_wheels_in_layers_before_it(tmp_path):
    plan = plan_for(tmp_path, "2.14.1")
    ids = [s.id for s in plan.final.steps]
    assert ids == ["os", "python", "mount-stubs", "cuda-libs", "cuda-libs-py", "cuda-cublas", "cuda-cufft",
                   "cuda-cusolver", "cuda-cusparse", "cuda-cudnn", "cuda-cusparselt", "cuda-nccl", "cuda-path",
                   "torch-triton", "torch", "pins", "ldconfig", "meta"]
    cuda = [s for s in plan.final.steps if s.id.startswith("cuda-") and isinstance(s, PipStep)]
    assert all(s.no_deps and s.reproducible and s.group == "cuda" for s in cuda)
    installed = sorted(r for s in cuda for r in s.requirements)
    assert installed == sorted(w.pin for w in torch_cuda_pins("2.14.1").cuda_wheels)
    # the py3-none wheels in the shared prefix; cuda-bindings, built per Python (cp312), in the venv
    assert [s.id for s in cuda if not isinstance(s, PrefixPipStep)] == ["cuda-libs-py"]
    assert plan.final.steps[ids.index("cuda-libs-py")].requirements == ("cuda-bindings==13.5.0",)
    assert "cuda-toolkit==13.0.3.0" in plan.final.steps[ids.index("cuda-libs")].requirements
    path = plan.final.steps[ids.index("cuda-path")]
    assert isinstance(path, PrefixPathStep) and path.prefix == CUDA_PREFIX
    # Triton, torch's one big other dependency, in a layer of its own below torch's
    triton = plan.final.steps[ids.index("torch-triton")]
    assert triton.requirements == ("triton==3.8.0",) and triton.no_deps and triton.reproducible
    assert triton.group == "torch"
    assert "nvidia-cudnn-cu13==9.24.0.43" in installed and "cuda-toolkit==13.0.3.0" in installed
    torch = plan.final.steps[ids.index("torch")]
    assert torch.requirements == ("torch==2.14.1",) and torch.reproducible and not torch.no_deps
    assert isinstance(plan.final.steps[2], MountStubsStep)
    assert [f.path for f in plan.context_files] == [".imgbuild/root/etc/hosts"]


def test_the_files_imgbuild_writes_into_the_context_are_dated_source_date_epoch(tmp_path):
    """The mount stubs' tree is COPYed onto /: BuildKit gives /etc its folder's mtime, so a context
    written at another time must give the same layer (issue 33: 1)."""
    plan = plan_for(tmp_path / "r", "2.14.1")
    context = write_context(plan, tmp_path / "ctx")
    written = [context / ".imgbuild", context / ".imgbuild/root", context / ".imgbuild/root/etc",
               context / ".imgbuild/root/etc/hosts"]
    assert [p.stat().st_mtime for p in written] == [SOURCE_DATE_EPOCH] * 4
    assert (context / ".imgbuild/root/etc/hosts").read_text() == ""


def test_a_context_file_whose_text_changes_keeps_a_fresh_mtime(tmp_path):
    """A lock's requirement file is not dated: buildx skips sending a file whose size and mtime
    match the last context of the same name, so a hash corrupted in place (same size) would reach
    pip as the old text, and the build would pass (measured on Docker 26, issue 33: 1)."""
    plan = plan_for(tmp_path / "r", "2.14.1")
    req = ContextFile(".imgbuild/lock/final-pins.txt", "six==1.16.0 --hash=sha256:" + "f" * 64 + "\n")
    locked = LockedPipStep("pins", "pins", requirements_file=req, mount_target="/tmp/req", index_url=None,
                           extra_index_urls=())
    final = dataclasses.replace(plan.final, steps=(*plan.final.steps, locked))
    plan = dataclasses.replace(plan, stages=(*plan.stages[:-1], final))
    before = time.time() - 5
    context = write_context(plan, tmp_path / "ctx")
    assert (context / req.path).read_text() == req.text
    assert (context / req.path).stat().st_mtime > before
    assert (context / ".imgbuild/lock").stat().st_mtime > before
    assert (context / ".imgbuild/root/etc/hosts").stat().st_mtime == SOURCE_DATE_EPOCH


def test_a_torch_patch_release_with_the_same_pins_changes_only_the_torch_step(tmp_path):
    """The same CUDA pins and the same Triton (3.8.0): only torch's own layer is new."""
    a, b = plan_for(tmp_path / "a", "2.14.0"), plan_for(tmp_path / "b", "2.14.1")
    assert "torch-triton" in [s.id for s in b.final.steps]
    text = {s.id: render_step(s) for s in a.final.steps}
    changed = [s.id for s in b.final.steps if text.get(s.id) != render_step(s)]
    assert changed == ["torch", "meta"]  # meta: the torch label


def test_a_release_that_bumps_cudnn_and_nccl_changes_only_those_layers(tmp_path):
    a, b = plan_for(tmp_path / "a", "2.13.0"), plan_for(tmp_path / "b", "2.14.0")
    text = {s.id: render_step(s) for s in a.final.steps}
    changed = [s.id for s in b.final.steps if text.get(s.id) != render_step(s)]
    assert changed == ["cuda-cudnn", "cuda-nccl", "torch-triton", "torch", "meta"]  # Triton 3.7.1 -> 3.8.0


def test_torch_from_another_index_keeps_one_step(tmp_path):
    path = write_recipe(tmp_path, 'name: x\ncuda: {version: "12.1", source: wheels, flavor: base}\n'
                                  'base: {image: debian:bookworm-slim}\npython: "3.11"\ntorch: "2.5.1"\n')
    assert plan_of(load_recipe(path)).resolution.torch_index_url  # cu121: PyPI's 2.5.1 is cu124
    ids = [s.id for s in plan_of(load_recipe(path)).final.steps]
    assert not any(i.startswith("cuda-") for i in ids) and "torch" in ids


def _w(name, mb):
    return CudaWheel(name, "1.0", mb * 10**6, "0" * 64)


def test_cuda_layers_big_wheels_alone_toolkit_parts_first_small_ones_together():
    wheels = (_w("cuda-toolkit", 0), _w("nvidia-cublas", 423), _w("nvidia-cudnn-cu13", 553),
              _w("nvidia-cuda-runtime", 2), _w("nvidia-nccl-cu13", 216), _w("nvidia-cufft", 214))
    layers = cuda_layers(wheels)
    assert [(x.id, x.pins, x.own) for x in layers] == [
        ("cuda-libs", ("cuda-toolkit==1.0", "nvidia-cuda-runtime==1.0"), False),
        ("cuda-cublas", ("nvidia-cublas==1.0",), True), ("cuda-cufft", ("nvidia-cufft==1.0",), True),
        ("cuda-cudnn", ("nvidia-cudnn-cu13==1.0",), True), ("cuda-nccl", ("nvidia-nccl-cu13==1.0",), True)]
    assert [x.id for x in cuda_layers(wheels, own_layer_bytes=10**12)] == ["cuda-libs"]


def test_big_libraries_come_from_the_measured_sizes_whatever_the_cuda_major():
    big = big_libraries()
    assert {"cudnn", "cublas", "cufft", "cusolver", "cusparse", "nccl"} <= big
    assert not {"cuda-runtime", "cuda-nvrtc", "nvjitlink", "cuda-nvcc"} & big  # under 100 MB each
    pins = ("nvidia-cublas-cu12==12.4.5.8", "nvidia-cuda-nvrtc-cu12==12.4.127", "nvidia-cuda-runtime-cu12==12.4.127",
            "nvidia-cudnn-cu12==9.10.2.21")
    assert [(x.id, x.pins, x.own) for x in cuda_pin_layers(pins)] == [
        ("cuda", pins[1:3], False), ("cuda-cublas", pins[:1], True), ("cuda-cudnn", pins[3:], True)]


def test_the_data_covers_the_current_releases_with_sources():
    for v in ("2.13.0", "2.14.0", "2.14.1", "2.15.0"):
        row = torch_cuda_pins(v)
        assert row is not None and row.source and row.read
        assert any(w.name.startswith("nvidia-cudnn") for w in row.wheels)
        assert [w.name for w in row.dependency_wheels] == ["triton"]
    assert torch_cuda_pins("0.1.0") is None


# --- cuda.source: wheels without torch, and the heavy extensions -----------------------------

WHEELS = """\
name: team/x
cuda: {{version: "{cuda}", source: wheels{extra}}}
base: {{image: debian:bookworm-slim}}
python: "3.11"
"""


def cuda_plan(tmp_path, cuda, extra=""):
    return plan_of(load_recipe(write_recipe(tmp_path, WHEELS.format(cuda=cuda, extra=extra))))


def test_cudnn_from_wheels_without_torch_gets_cudnn_and_cublas_layers_of_their_own(tmp_path):
    plan = cuda_plan(tmp_path, "13.0", ', flavor: base, cudnn: "9"')
    steps = {s.id: s for s in plan.final.steps if s.group == "cuda" and isinstance(s, PipStep)}
    assert list(steps) == ["cuda", "cuda-cublas", "cuda-cudnn"]
    assert steps["cuda"].requirements == ("nvidia-cuda-nvrtc==13.0.88", "nvidia-cuda-runtime==13.0.96")
    assert steps["cuda-cublas"].requirements == ("nvidia-cublas==13.1.1.3",)
    assert steps["cuda-cudnn"].requirements == ("nvidia-cudnn-cu13==9.24.0.43",)
    assert not steps["cuda"].no_deps and steps["cuda-cudnn"].no_deps and steps["cuda-cublas"].no_deps
    assert all(s.reproducible for s in steps.values())
    assert sorted(r for s in steps.values() for r in s.requirements) == sorted(plan.resolution.cuda_wheels)
    assert isinstance(plan.final.steps[[s.id for s in plan.final.steps].index("cuda") - 1], MountStubsStep)


def test_the_devel_toolkit_splits_its_math_libraries_and_keeps_nvcc_with_the_small_ones(tmp_path):
    plan = cuda_plan(tmp_path, "13.0", ", flavor: devel")
    ids = [s.id for s in plan.final.steps if s.group == "cuda"]
    assert ids == ["cuda", "cuda-cublas", "cuda-cufft", "cuda-cusolver", "cuda-cusparse", "cuda-nccl", "cuda-path",
                   "cuda-home", "ldconfig"]
    small = plan.final.steps[[s.id for s in plan.final.steps].index("cuda")]
    assert "nvidia-cuda-nvcc==13.0.88" in small.requirements
    assert "nvidia-npp==13.0.1.2" in small.requirements  # devel is the runtime tier and the compiler


def test_a_base_tier_recipe_keeps_its_one_cuda_step(tmp_path):
    plan = cuda_plan(tmp_path, "12.4", ", flavor: base")
    assert [s.id for s in plan.final.steps if s.group == "cuda"] == ["cuda", "cuda-path", "ldconfig"]


def test_the_runtime_tier_gives_its_big_libraries_layers_of_their_own(tmp_path):
    plan = cuda_plan(tmp_path, "12.4")
    assert [s.id for s in plan.final.steps if s.group == "cuda"] == [
        "cuda", "cuda-cublas", "cuda-cufft", "cuda-cusolver", "cuda-cusparse", "cuda-nccl", "cuda-path", "ldconfig"]


def test_cudnn_layers_are_the_same_steps_whatever_else_the_image_holds(tmp_path):
    a = cuda_plan(tmp_path / "a", "12.4", ', flavor: base, cudnn: "9"')
    text = WHEELS.format(cuda="12.4", extra=', flavor: base, cudnn: "9"') + "apt: [less]\npip: [requests==2.32.3]\n"
    b = plan_of(load_recipe(write_recipe(tmp_path / "b", text)))
    text = {s.id: render_step(s) for s in a.final.steps}
    same = [s.id for s in b.final.steps if text.get(s.id) == render_step(s)]
    assert {"cuda", "cuda-cublas", "cuda-cudnn"} <= set(same) and "os" not in same


HEAVY = """\
name: team/x
cuda: {{version: "12.4", source: wheels, flavor: base}}
base: {{image: debian:bookworm-slim}}
python: "3.11"
torch: "2.5.1"
pip: [{pins}]
"""


def heavy_plan(tmp_path, pins):
    return plan_of(load_recipe(write_recipe(tmp_path, HEAVY.format(pins=", ".join(pins)))))


def test_each_heavy_pin_gets_its_own_reproducible_layer_before_the_other_pins(tmp_path):
    plan = heavy_plan(tmp_path, ["requests==2.32.3", "xformers==0.0.28.post3", "bitsandbytes==0.44.1"])
    ids = [s.id for s in plan.final.steps]
    assert ids[ids.index("torch") + 1:ids.index("pins") + 1] == ["heavy-bitsandbytes", "heavy-xformers", "pins"]
    heavy = [s for s in plan.final.steps if s.group == "heavy"]
    assert [s.requirements for s in heavy] == [("bitsandbytes==0.44.1",), ("xformers==0.0.28.post3",)]
    assert all(isinstance(s, PipStep) and s.reproducible and not s.no_deps for s in heavy)


def test_bumping_one_heavy_pin_changes_only_its_layer(tmp_path):
    a = heavy_plan(tmp_path / "a", ["xformers==0.0.28.post3", "bitsandbytes==0.44.1"])
    b = heavy_plan(tmp_path / "b", ["xformers==0.0.28.post3", "bitsandbytes==0.45.0"])
    text = {s.id: render_step(s) for s in a.final.steps}
    # xformers re-runs on the new layer below it, and, reproducible, writes the same bytes
    assert [s.id for s in b.final.steps if text.get(s.id) != render_step(s)] == ["heavy-bitsandbytes", "meta"]


def test_heavy_layers_are_capped_and_the_layer_count_stays_well_under_the_engine_limit():
    pins = [(f"pkg{i}", f"pkg{i}==1.0") for i in range(MAX_HEAVY_LAYERS + 3)]
    steps = _heavy_steps(pins)
    assert len(steps) == MAX_HEAVY_LAYERS and steps[-1].id == "heavy-rest"
    assert steps[-1].requirements == tuple(s for _, s in pins[MAX_HEAVY_LAYERS - 1:])
    assert [s.id for s in _heavy_steps(pins[:MAX_HEAVY_LAYERS])][-1] == f"heavy-pkg{MAX_HEAVY_LAYERS - 1}"


def test_a_torch_image_with_heavy_pins_stays_far_under_127_layers(tmp_path):
    plan = heavy_plan(tmp_path, ["xformers==0.0.28.post3", "bitsandbytes==0.44.1", "requests==2.32.3"])
    assert len(plan.final.steps) < 40  # overlay2 stacks at most 128 layers, the base's included


def test_inspect_groups_the_per_library_and_per_package_layers_by_their_prefix():
    from buildkit_py.plan.history import attribute_entries

    history = [{"created_by": f"RUN /bin/sh -c set -eu; : imgbuild-step={step}; pip install x # buildkit"}
               for step in ("cuda", "cuda-cudnn", "cuda-libs", "heavy-flash-attn", "heavy-rest", "mount-stubs")]
    # mount-stubs: the plan's group for it, python (issue 22: 11; it fell to "other" without a plan's table)
    assert [a.group for a in attribute_entries(history)] == ["cuda", "cuda", "cuda", "heavy", "heavy", "python"]


def test_every_nvidia_wheel_in_the_data_is_python_independent_as_the_name_rule_assumes():
    """is_python_independent judges a pin without its file (cuda.source: wheels) by an nvidia-*
    name: that holds for every nvidia-* wheel file read into the data; a cp wheel is not."""
    wheels = [w for row in rows().values() for w in row.wheels]
    nvidia = [w for w in wheels if w.name.startswith("nvidia-")]
    assert len(nvidia) > 100 and all(w.file and w.python_independent for w in nvidia)
    assert all(is_python_independent(w.name) for w in nvidia)
    cp = [w for w in wheels if w.name == "cuda-bindings"]
    assert cp and not any(w.python_independent for w in cp)
    assert not is_python_independent("cuda-bindings") and not is_python_independent("triton")
    assert is_python_independent("cuda-toolkit", "cuda_toolkit-13.0.2-py2.py3-none-any.whl")
    assert not is_python_independent("x", "x-1.0-cp311-cp311-manylinux_2_17_x86_64.whl")
    assert not is_python_independent("x", "x-1.0-py3-abi3-any.whl") and not is_python_independent("x", "not-a-wheel")


def test_a_base_tier_recipe_puts_its_cuda_wheels_in_the_shared_prefix_and_points_the_venv_at_it(tmp_path):
    plan = cuda_plan(tmp_path, "12.4", ", flavor: base")
    steps = {s.id: s for s in plan.final.steps}
    assert isinstance(steps["cuda"], PrefixPipStep) and steps["cuda"].prefix == CUDA_PREFIX
    assert steps["cuda-path"].pth == "imgbuild-cuda-wheels.pth" and steps["ldconfig"].prefix == CUDA_PREFIX
    text = render_step(steps["cuda"])
    assert f"cp -a /tmp/imgbuild-prefix/. {CUDA_PREFIX}/" in text and "--target /tmp/imgbuild-prefix" in text
