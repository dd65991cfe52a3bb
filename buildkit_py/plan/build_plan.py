"""Recipe + Resolution -> BuildPlan: the stages, their steps in cache-friendly order, the
labels, env and tags. Pure: no I/O, so the same recipe always plans the same."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from packaging.utils import canonicalize_name

from buildkit_py.compat import codes
from buildkit_py.compat.codes import RecipeWarning
from buildkit_py.compat.resolve import HEAVY_PACKAGES, Resolution
from buildkit_py.compat.rules import PythonProvider
from buildkit_py.compat.torch_pins import (
    CudaLayer,
    TorchCudaPins,
    cuda_layers,
    cuda_pin_layers,
    dependency_layers,
    is_python_independent,
    torch_cuda_pins,
)
from buildkit_py.errors import UsageError
from buildkit_py.file_kinds import is_weight_file, over_weight_limit
from buildkit_py.plan import labels as L
from buildkit_py.plan.installer import Installer, installer_for
from buildkit_py.plan.steps import (
    CUDA_PREFIX,
    AptStep,
    ContextFile,
    CopyStep,
    CudaHomeStep,
    DeadsnakesStep,
    LdconfigStep,
    LocalWheelsStep,
    MetaStep,
    MountStubsStep,
    PipStep,
    PrefixPathStep,
    PrefixPipStep,
    Step,
    VenvStep,
    WheelBuildStep,
)
from buildkit_py.recipe.model import CudaFlavor, CudaSource, Recipe, pin_name
from buildkit_py.reference import parse_reference
from buildkit_py.sizes import human_size
from buildkit_py.text_enum import TextEnum

VENV = "/opt/venv"
CUDA_PREFIX_PTH = "imgbuild-cuda-wheels.pth"  # the venv's .pth naming steps.CUDA_PREFIX
STEP_MARK = "imgbuild-step"  # written into each RUN so `inspect` can map layers to steps
# The mount stubs' step, and the empty context file its COPY (to /etc/hosts) reads: `inspect`
# knows that COPY by its source, so the recipe's own copy[0] stays copy-0.
# The mount stubs' /etc/hosts comes in a tree COPYed onto /: BuildKit then gives /etc the tree's
# mtime (SOURCE_DATE_EPOCH, set by the context writer); a COPY of the file alone stamps /etc with the clock.
MOUNT_STUBS_STEP, MOUNT_STUBS_GROUP, MOUNT_STUB_FILE = "mount-stubs", "python", ".imgbuild/root/etc/hosts"

# Build front-end tools of the builder stage, pinned so builds repeat. They never reach the
# final image. setuptools 75.3 is the last release that still supports Python 3.8.
BUILD_TOOLS = ("setuptools==75.3.0", "wheel==0.45.1")
TORCH_BUILD_TOOLS = ("ninja==1.11.1.1", "packaging==24.2", "psutil==6.1.1")

# The mtime reproducible layers give every file they add: 1980-01-01, the earliest a wheel (zip) records.
SOURCE_DATE_EPOCH = 315532800

# Heavy pins (flash-attn, bitsandbytes, xformers, ...: tens to hundreds of MB each, pinned and
# bumped one at a time) get a reproducible layer each, up to this many; any beyond share one.
MAX_HEAVY_LAYERS = 6

# Layer groups, in the order they appear: least often changed first.
GROUPS = ("os", "python", "cuda", "torch", "heavy", "pins", "app", "meta")
# Step id -> layer group: the one table. A key before a "-" stands for its family (cuda-cudnn,
# heavy-flash-attn, torch-triton, copy-0). make_plan's steps take their group from it, and
# inspect reads an image's layers back with it when no plan is at hand (plan/history.py).
STEP_GROUPS: dict[str, str] = {
    "python-ppa": "os", "os": "os", "python": "python", MOUNT_STUBS_STEP: MOUNT_STUBS_GROUP, "cuda": "cuda",
    "ldconfig": "cuda", "torch": "torch", "compiled": "heavy", "heavy": "heavy", "wheels": "heavy",
    "pins": "pins", "build-tools": "pins", "copy": "app", "meta": "meta",
}


def group_of(step_id: str) -> str | None:
    """The layer group of a step id make_plan writes (STEP_GROUPS); None for an id it does not."""
    return STEP_GROUPS.get(step_id) or STEP_GROUPS.get(step_id.split("-", 1)[0])


def _named(step_id: str) -> tuple[str, str]:
    """A step's id and its group, the two fields every step starts with."""
    group = group_of(step_id)
    if group is None:  # a step id added without its group: a bug here, not the recipe's
        raise ValueError(f"step id {step_id!r} has no layer group in STEP_GROUPS")
    return step_id, group


class StageRole(TextEnum):
    BUILDER = "builder"  # compiles wheels from source; the final stage copies them out
    FINAL = "final"  # the image


@dataclass(frozen=True)
class Stage:
    name: str
    base: str
    steps: tuple[Step, ...]
    role: StageRole


@dataclass(frozen=True)
class BuildPlan:
    recipe: Recipe
    resolution: Resolution
    stages: tuple[Stage, ...]
    labels: dict[str, str]  # static, in the Dockerfile
    env: dict[str, str]
    tags: tuple[str, ...]
    needs: frozenset[str]  # engine capabilities this plan cannot build without
    warnings: tuple[RecipeWarning, ...]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    @property
    def context_files(self) -> tuple[ContextFile, ...]:
        """Files the steps bind-mount from the build context, in plan order."""
        return tuple(f for stage in self.stages for step in stage.steps for f in step.context_files)

    @property
    def base_images(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.base for s in self.stages if s.base not in {x.name for x in self.stages}))


# A --tag that is only a version (1.2, v2.0.1, 1.2-rc1): the docker grammar reads it as a
# repository named 1.2, which is never what was meant.
_VERSION_LIKE = re.compile(r"v?\d+(\.\d+)*([.+_-][0-9A-Za-z][0-9A-Za-z._-]*)?")
# One word the docker grammar takes for a repository name (latest, dev, trainer); a word it would
# refuse ("Bad Tag") is left to check_image_tag, which says why.
_BARE_WORD = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")


def check_bare_tag(tag: str, recipe_name: str) -> None:
    """Refuse a --tag that is one bare word (latest, 1.2, dev, trainer): docker reads it as a
    repository of that name tagged latest, where with a recipe the user most often meant a tag of
    the recipe's image. Either reading, taken silently, surprises someone, so neither is: the
    hint spells both (UsageError, exit 2). A name with a / or a : is a whole image name, as in docker."""
    if not (_VERSION_LIKE.fullmatch(tag) or _BARE_WORD.fullmatch(tag)):
        return
    if _VERSION_LIKE.fullmatch(tag):
        meant = f"version {tag}"
        hint = f"give the name too: --tag {recipe_name}:{tag} (or set version: in the recipe)"
    else:
        meant = f"the tag {tag}"
        hint = (f"give the name too: --tag {recipe_name}:{tag} for that tag of this recipe's image, "
                f"or --tag {tag}:latest for an image named {tag}")
    raise UsageError(f"--tag {tag}: a tag names the whole image (REPOSITORY:TAG, as in docker build -t), so this "
                     f"would be the repository {tag!r} (tagged latest), not {meant} of {recipe_name}", hint=hint)


def default_tags(recipe: Recipe, registry: str | None = None, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """NAME:VERSION (or ``extra``, the --tag values), under ``registry``; each one checked, and
    an invalid one blamed on the option that produced it (UsageError, exit 2)."""
    if extra:
        tags = list(extra)
        for tag in tags:
            check_bare_tag(tag, recipe.name)
    else:
        tags = [f"{recipe.name}:{recipe.version or 'latest'}"]
    origin = "--tag" if extra else "tag"
    if registry:
        registry = check_registry(registry)
        tags = [t if t.startswith(registry + "/") else f"{registry}/{t}" for t in tags]
        origin = "--tag/--registry" if extra else "--registry"
    return tuple(check_image_tag(t, origin=origin) for t in tags)


def check_registry(registry: str) -> str:
    """A --registry value: host[:port][/path], no scheme. Returns it without a trailing /."""
    value = registry.strip().rstrip("/")
    hint = "e.g. --registry 127.0.0.1:5000 or --registry ghcr.io/team (no http://)"
    if "://" in value:
        raise UsageError(f"--registry {registry!r}: write the host without a scheme", hint=hint)
    host = value.split("/", 1)[0]
    try:
        ok = parse_reference(f"{value}/x").registry == host
    except UsageError:
        ok = False
    if not value or not ok:
        raise UsageError(f"--registry {registry!r} is not a registry host[:port][/path]", hint=hint)
    return value


def check_image_tag(tag: str, *, origin: str = "tag") -> str:
    """A tag to apply to a built image, by oci.parse_reference's grammar (no digest). ``origin``
    names what produced it (--tag, --registry, the recipe's name) for the message."""
    try:
        ref = parse_reference(tag)
        problem = "a tag cannot carry a digest" if ref.digest else None
    except UsageError as exc:
        problem = exc.message
    if problem:
        raise UsageError(f"{origin}: {tag!r} is not a valid image reference: {problem}",
                         hint="e.g. team/trainer:1.0 or 127.0.0.1:5000/team/trainer:1.0")
    return tag


def _python_packages(res: Resolution, *, dev: bool) -> list[str]:
    if res.python_provider in {PythonProvider.IMAGE, PythonProvider.BASE}:
        return []
    if res.python_provider == PythonProvider.DEADSNAKES:
        v = res.python
        return [f"python{v}", f"python{v}-venv"] + ([f"python{v}-dev"] if dev else [])
    return ["python3", "python3-venv"] + (["python3-dev"] if dev else [])


def _python_bin(res: Resolution) -> str:
    if res.python_provider == PythonProvider.DEADSNAKES:
        return f"python{res.python}"
    return "python3"


def _split_pins(recipe: Recipe, res: Resolution) -> tuple[list[str], list[tuple[str, str]], list[str]]:
    """(compiled, heavy as (name, requirement), other) pins, each sorted by name for stable layers."""
    compiled, heavy, other = [], [], []
    prebuilt = dict(res.prebuilt_urls)
    for spec in recipe.pip:
        name = pin_name(spec)
        if name in res.compile:
            compiled.append(spec)
        elif name in prebuilt:
            heavy.append((name, prebuilt[name]))
        elif name in HEAVY_PACKAGES:
            heavy.append((name, spec))
        else:
            other.append(spec)
    return sorted(compiled), sorted(heavy), sorted(other)


def _heavy_steps(heavy: list[tuple[str, str]]) -> list[Step]:
    """One reproducible layer per heavy pin, so bumping one (bitsandbytes) leaves the others'
    layers (flash-attn) byte-identical; past MAX_HEAVY_LAYERS the rest share a last one."""
    own, rest = heavy[:MAX_HEAVY_LAYERS - 1], heavy[MAX_HEAVY_LAYERS - 1:]
    if len(rest) == 1:
        own, rest = heavy, []
    steps: list[Step] = [PipStep(*_named(f"heavy-{canonicalize_name(name)}"), requirements=(spec,), reproducible=True)
                         for name, spec in own]
    if rest:
        steps.append(PipStep(*_named("heavy-rest"), requirements=tuple(s for _, s in rest), reproducible=True))
    return steps


def _cuda_steps(layers: tuple[CudaLayer, ...], *, complete: bool = False,
                independent: Callable[[str], bool] = is_python_independent) -> list[Step]:
    """A reproducible step per CUDA layer. A big library's own layer installs --no-deps: the
    pins are a complete set (cuda-toolkit's extras, cuDNN with cuBLAS) whose other members sit
    in the layers around it; the small wheels' layer resolves as the one CUDA step always did.
    ``complete``: every layer --no-deps (pip's own resolution of a torch release).

    The Python-independent wheels (``independent``, by name: py3-none) go into the shared
    prefix (PrefixPipStep), so images on other OSes and Pythons carry the same layer; a layer's
    wheels built for one Python (cuda-bindings) go into the venv, in a layer ``<id>-py`` beside it."""
    steps: list[Step] = []
    for layer in layers:
        no_deps = complete or layer.own
        shared = tuple(p for p in layer.pins if independent(pin_name(p)))
        own = tuple(p for p in layer.pins if p not in shared)
        if shared:
            steps.append(PrefixPipStep(*_named(layer.id), requirements=shared, no_deps=no_deps, reproducible=True))
        if own:
            steps.append(PipStep(*_named(f"{layer.id}-py" if shared else layer.id), requirements=own,
                                 no_deps=no_deps, reproducible=True))
    return steps


def _with_prefix_path(steps: list[Step]) -> list[Step]:
    """The steps, with a PrefixPathStep after the last PrefixPipStep: before any later pip step
    resolves (torch's), so pip sees the CUDA wheels as installed rather than installing them
    again into the venv."""
    last = max((i for i, s in enumerate(steps) if isinstance(s, PrefixPipStep)), default=None)
    if last is None:
        return steps
    path = PrefixPathStep(*_named("cuda-path"), venv=VENV, prefix=CUDA_PREFIX, pth=CUDA_PREFIX_PTH)
    return steps[:last + 1] + [path] + steps[last + 1:]


def _os_steps(res: Resolution, apt: list[str], *, dev: bool) -> list[Step]:
    steps: list[Step] = []
    if res.python_provider == PythonProvider.BASE:
        # an imgbuild base already has Python, the venv and PATH; a builder needs headers
        packages = sorted(set(apt + (["python3-dev"] if dev else [])))
        return [AptStep(*_named("os"), packages=tuple(packages))] if packages else []
    if res.python_provider == PythonProvider.DEADSNAKES:
        steps.append(DeadsnakesStep(*_named("python-ppa"), python=res.python))
    packages = sorted(set(_python_packages(res, dev=dev) + apt))
    if packages:
        steps.append(AptStep(*_named("os"), packages=tuple(packages)))
    steps.append(VenvStep(*_named("python"), python=_python_bin(res), venv=VENV))
    return steps


def _pip_step(step_id: str, requirements: list[str], *, index_url: str | None = None) -> PipStep:
    return PipStep(*_named(step_id), requirements=tuple(requirements), index_url=index_url)


def _torch_step(res: Resolution) -> list[Step]:
    if not res.torch:
        return []
    spec = f"torch=={res.torch}+{res.torch_variant}" if res.torch_index_url else f"torch=={res.torch}"
    return [_pip_step("torch", [spec], index_url=res.torch_index_url)]


def _torch_stack(res: Resolution) -> list[Step]:
    """The final stage's torch: the CUDA wheels its release pins, each big library in a
    reproducible layer of its own (compat/torch_pins.py), then Triton in one of its own, then
    torch itself. Two images with the same pins share those layers byte for byte; a torch patch
    release that keeps its pins (2.14.0 -> 2.14.1) re-pulls only the torch layer. A torch from
    another index, or a release the data has no row for, installs with its CUDA dependencies in
    the (reproducible) torch step."""
    if not res.torch:
        return []
    pins = _torch_pins(res)
    steps: list[Step] = []
    if pins:
        wheels = {w.name: w for w in pins.cuda_wheels}  # each with its file, whose tags say
        steps = _cuda_steps(cuda_layers(pins.cuda_wheels), complete=True,
                            independent=lambda name: wheels[canonicalize_name(name)].python_independent)
        steps += [PipStep(*_named(layer.id), requirements=layer.pins, no_deps=True, reproducible=True)
                  for layer in dependency_layers(pins.dependency_wheels)]
    torch = [dataclasses.replace(s, reproducible=True) if isinstance(s, PipStep) else s for s in _torch_step(res)]
    return steps + torch


def _torch_pins(res: Resolution) -> TorchCudaPins | None:
    """The torch release's CUDA pins from the data, where its CUDA wheels get layers."""
    return None if not res.torch or res.torch_index_url else torch_cuda_pins(res.torch)


def _final_cuda_wheels(res: Resolution) -> list[Step]:
    """The final stage's CUDA wheels without torch's (``cuda.source: wheels``): each big library
    in a layer of its own (compat/torch_pins.cuda_pin_layers). Beside a torch stack that has
    its own CUDA layers (a devel flavor), the toolkit's wheels stay one step."""
    if not res.cuda_wheels:
        return []
    if _torch_pins(res):
        return _cuda_steps((CudaLayer("cuda", res.cuda_wheels),))
    return _cuda_steps(cuda_pin_layers(res.cuda_wheels))


def _with_installer(steps: list[Step], installer: Installer) -> list[Step]:
    """The steps, each install step (pip, locked pip, local wheels) made by ``installer``.
    Source builds (WheelBuildStep) stay pip: uv has no ``pip wheel``."""
    kinds = (PipStep, LocalWheelsStep)
    return [dataclasses.replace(s, installer=installer) if isinstance(s, kinds) else s for s in steps]


def _mount_stubs(steps: list[Step], installer: Installer) -> list[Step]:
    """A MountStubsStep before the first reproducible step, when there is one."""
    first = next((i for i, s in enumerate(steps) if isinstance(s, PipStep) and s.reproducible), None)
    if first is None:
        return steps
    stubs = MountStubsStep(*_named(MOUNT_STUBS_STEP), hosts=ContextFile(MOUNT_STUB_FILE, "", dated=True),
                           dirs=(*installer.stub_dirs, "/run/secrets"),
                           files=("/run/secrets/cacert", "/run/secrets/pipconf", *installer.stub_files))
    return steps[:first] + [stubs] + steps[first:]


def _cuda_home_steps(res: Resolution, prefix: str | None = None) -> list[Step]:
    """Make the toolkit tree the CUDA wheels install (site-packages/nvidia/cu13, or under
    ``prefix``) CUDA_HOME; nothing where the wheels install no such tree."""
    if res.cuda_wheel_home is None:
        return []
    return [CudaHomeStep(*_named("cuda-home"), venv=VENV, tree=res.cuda_wheel_home, home="/usr/local/cuda",
                         prefix=prefix)]


def weight_files_in_copies(recipe: Recipe) -> list[tuple[int, str, int]]:
    """(copy index, path, bytes) of every weight-like file a COPY would bake into the image, as
    the build context holds it: a folder's symlinks stay links (engine/build.py copies them as
    links), a source that is itself a link is followed. The one read of the file system in
    planning: sizes of the files the build sends anyway. ``lint`` reads the same list."""
    found = []
    for i, c in enumerate(recipe.copy):
        src = recipe.context_dir / c.src
        files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file() and not p.is_symlink())
        for f in files:
            if is_weight_file(f.name):
                found.append((i, str(f.relative_to(recipe.context_dir)), f.stat().st_size))
    return found


def weights_in_copies(recipe: Recipe) -> list[tuple[int, str, int]]:
    """The weight-like files under copy: sources above the limit (file_kinds.WEIGHT_FILE_LIMIT)."""
    return [found for found in weight_files_in_copies(recipe) if over_weight_limit(found[2])]


def weights_in_copy_warning(index: int, rel: str, size: int) -> RecipeWarning:
    return RecipeWarning(
        codes.WEIGHTS_IN_COPY, f"copy[{index}].src",
        f"copy[{index}] puts {rel} ({human_size(size)}) into the image: keep weights out of images "
        "(imgbuild weights push, then list them under weights: to mount them at run time)")


def make_plan(recipe: Recipe, resolution: Resolution, *, tags: tuple[str, ...] = (),
              registry: str | None = None) -> BuildPlan:
    """The plan of ``recipe`` as its ``resolution`` decided it (pipeline.plan_recipe makes both)."""
    res = resolution
    installer = installer_for(recipe.build.installer)
    compiled, heavy, other = _split_pins(recipe, res)
    stages: list[Stage] = []

    if res.compile:
        builder_steps = _os_steps(res, ["build-essential"], dev=True)
        if res.builder_cuda_wheels:  # nvcc and headers from the CUDA 13+ wheels
            builder_steps.append(_pip_step("cuda", list(res.builder_cuda_wheels)))
            builder_steps += _cuda_home_steps(res)
        # Extensions that build against torch (flash-attn, xformers) build without isolation,
        # so torch and their build tools must be installed first.
        builder_steps += _torch_step(res)
        tools = BUILD_TOOLS + (TORCH_BUILD_TOOLS if res.torch else ())
        builder_steps.append(_pip_step("build-tools", sorted(tools)))
        builder_steps.append(WheelBuildStep(
            *_named("wheels"),
            requirements=tuple(compiled),
            arch_list=" ".join(res.cuda_arch),
            jobs=recipe.build.jobs or 2,
            no_isolation=bool(res.torch),
            # Force a source build even where the index has a binary wheel.
            no_binary=",".join(sorted(pin_name(r) for r in compiled)),
            env=res.build_env,
        ))
        builder = tuple(_with_installer(builder_steps, installer))
        stages.append(Stage("builder", res.compile_stage_base, builder, StageRole.BUILDER))

    devel_wheels = res.cuda_flavor == CudaFlavor.DEVEL and res.cuda_source == CudaSource.WHEELS
    # nvcc needs a host C++ compiler; NVIDIA's devel images are the other source of one
    steps = _os_steps(res, list(recipe.apt) + (["g++"] if devel_wheels else []), dev=False)
    cuda = _final_cuda_wheels(res)
    steps += cuda
    if devel_wheels:
        steps += _cuda_home_steps(res, prefix=CUDA_PREFIX if any(isinstance(s, PrefixPipStep) for s in cuda) else None)
    steps += _torch_stack(res)
    steps = _with_prefix_path(steps)
    if compiled:
        # Install the builder's wheel files by path: given only a name, pip would prefer the
        # index's manylinux wheel over a locally built linux_x86_64 one.
        steps.append(LocalWheelsStep(*_named("compiled"), packages=tuple(compiled), wheels_from="builder"))
    steps += _heavy_steps(heavy)
    if other:  # reproducible too: a --no-cache rebuild must give the same layer (issue 33: 1)
        steps.append(dataclasses.replace(_pip_step("pins", other), reproducible=True))
    if res.cuda_source == CudaSource.WHEELS:
        # The prefix always: the step rewrites the one conf file, and a shared base built by imgbuild
        # has its CUDA wheels there even when this recipe installs none (its dirs are listed if present)
        steps.append(LdconfigStep(*_named("ldconfig"), venv=VENV, prefix=CUDA_PREFIX))
    for i, c in enumerate(recipe.copy):
        steps.append(CopyStep(*_named(f"copy-{i}"), src=c.src, dest=c.dest))
    steps = _mount_stubs(_with_installer(steps, installer), installer)

    env = dict(recipe.env)
    if res.cuda_source == CudaSource.WHEELS:
        # What NVIDIA's images set, so the NVIDIA container runtime treats this as a CUDA image.
        env.setdefault("NVIDIA_VISIBLE_DEVICES", "all")
        env.setdefault("NVIDIA_DRIVER_CAPABILITIES", "compute,utility")
        env["NVIDIA_REQUIRE_CUDA"] = res.require_cuda
        env["CUDA_VERSION"] = res.cuda_version
    env = dict(sorted(env.items()))
    labels = L.static_labels(recipe, res)
    steps.append(MetaStep(
        *_named("meta"),
        workdir=recipe.workdir,
        env=tuple(env.items()),
        volumes=tuple(recipe.volumes),
        labels=tuple(labels.items()),
        entrypoint=tuple(recipe.entrypoint),
        cmd=tuple(recipe.cmd),
    ))
    stages.append(Stage("final", res.base_image, tuple(steps), StageRole.FINAL))

    needs = {"multi-stage", "cache-mounts", "secrets"} if res.compile else {"cache-mounts", "secrets"}
    warnings = res.warnings + tuple(weights_in_copy_warning(*found) for found in weights_in_copies(recipe))
    return BuildPlan(
        recipe=recipe,
        resolution=res,
        stages=tuple(stages),
        labels=labels,
        env=env,
        tags=default_tags(recipe, registry, tags),
        needs=frozenset(needs),
        warnings=warnings,
    )


def plan_json(plan: BuildPlan, dockerfile: str) -> dict[str, Any]:
    res = plan.resolution
    return {
        "name": plan.recipe.name,
        "recipe": str(plan.recipe.path),
        "recipe_digest": plan.recipe.digest,
        "dockerfile": dockerfile,
        "labels": plan.labels,
        "env": plan.env,
        "tags": list(plan.tags),
        "platforms": list(plan.recipe.platforms),
        "base_image": res.base_image,
        "base_images": list(plan.base_images),
        "stages": [
            {"name": s.name, "role": s.role, "base": s.base,
             "steps": [{"id": st.id, "group": st.group} for st in s.steps]}
            for s in plan.stages
        ],
        "resolution": {
            "cuda": res.cuda_version, "flavor": res.cuda_flavor, "source": res.cuda_source,
            "min_driver": res.min_driver, "min_driver_compat": res.min_driver_compat,
            "native_driver": res.native_driver.driver if res.native_driver else None,
            "native_driver_why": res.native_driver.why if res.native_driver else None,
            "cudnn": res.cudnn, "cudnn_from": res.cudnn_origin,
            "python": res.python, "python_provider": res.python_provider,
            "os": res.os, "torch": res.torch_label, "torch_index_url": res.torch_index_url,
            "compile": list(res.compile), "cuda_arch": list(res.cuda_arch),
            "compiled_arch": list(res.compiled_arch),
            "require_cuda": res.require_cuda,
        },
        "needs": sorted(plan.needs),
        "warnings": [w.to_json() for w in plan.warnings],
    }
