"""Small helpers shared by test modules (fixtures live in conftest.py)."""

from __future__ import annotations

import datetime
import io
import os
import re
import socket
import stat
import subprocess
import sys
import uuid
from pathlib import Path

from packaging.utils import canonicalize_name

from buildkit_py import compat
from buildkit_py import label_keys as K
from buildkit_py.analysis.image_checks import ImageFacts
from buildkit_py.cli.main import main
from buildkit_py.compat import cuda_base
from buildkit_py.plan.build_plan import BuildPlan
from buildkit_py.plan.steps import LdconfigStep, PipStep
from buildkit_py.recipe.model import Recipe

REPO = Path(__file__).resolve().parent.parent
SYSTEM_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# This pytest run's mark: every image, tag or registry repository a test creates carries it in its
# name (``unique``, the ``unique_name`` fixture) or in the RUN_LABEL label, so the check at the end of
# the session (conftest.py) finds what a test left behind, and only this run's, while other runs
# share the engines.
RUN_MARK = "tr" + uuid.uuid4().hex[:6]
RUN_LABEL = "imgbuild-test.run"  # not io.imgbuild.*: inspect reports those
# The date the tests resolve on: the resolver reads no clock (issue 32, 4), so a test's outcome does
# not move when NVIDIA's end-of-life dates pass. The day the dated tests were written.
TODAY = datetime.date(2026, 12, 5)


def plan_of(recipe: Recipe, *, tags: tuple[str, ...] = (), registry: str | None = None) -> BuildPlan:
    """``recipe`` planned from the shipped data alone, on TODAY (pipeline.plan_from_data)."""
    from buildkit_py.pipeline import plan_from_data

    return plan_from_data(recipe, tags=tags, registry=registry, today=TODAY)


def unique(prefix: str) -> str:
    """A new name for something a test creates, marked with this run: ``imgbuild-test/diff`` ->
    ``imgbuild-test/diff-tr3fa2c1-5d0e9a1b``."""
    return f"{prefix}-{RUN_MARK}-{uuid.uuid4().hex[:8]}"


# Builds here reach PyPI through a proxy whose CA only the system bundle has (environment.md).
CA_ARGS = ["--ca-cert", str(SYSTEM_CA)] if SYSTEM_CA.exists() else []


def free_port() -> int:
    """A loopback port nothing listens on now: for a server a test starts (two pytest processes run at
    once under `make test`, so no fixed port) or for an address that must refuse connections."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def write_recipe(folder: Path, text: str, name: str = "recipe.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def fake_nvidia_smi(folder: Path, csv: Path, banner: str) -> Path:
    """Write into ``folder`` an nvidia-smi that prints ``csv`` (a recorded query output) when asked a
    query and ``banner`` when run with no arguments; returns ``folder``, to put on PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "banner.txt").write_text(banner)
    script = folder / "nvidia-smi"
    script.write_text(f"#!{sys.executable}\nimport sys\n"
                      f"sys.stdout.write(open({str(csv)!r} if sys.argv[1:] else "
                      f"{str(folder / 'banner.txt')!r}).read())\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return folder


def change_cuda12_floors(monkeypatch, tmp_path: Path) -> None:
    """Serve imgbuild's data as it would be after a change to CUDA 12's driver floors (still valid
    data): 12.4.1's native floor down to 12.4.0's 550.54.14, the 12.x minor-version floor up to
    535.154.05. Undo with compat.tables.clear_caches() once the monkeypatch is gone."""
    import json
    from importlib import resources

    from buildkit_py.compat import tables

    real = resources.files("buildkit_py.compat").joinpath("data")
    (tmp_path / "data").mkdir(parents=True)
    for f in tables.DATA_FILES:
        (tmp_path / "data" / f).write_text(real.joinpath(f).read_text())
    for name, rows, key, value in (("toolkits.json", "toolkits", ("version", "12.4.1"), "550.54.14"),
                                   ("minor_compat.json", "floors", ("major", 12), "535.154.05")):
        data = json.loads((tmp_path / "data" / name).read_text())
        next(r for r in data[rows] if r[key[0]] == key[1])["linux_min_driver"] = value
        (tmp_path / "data" / name).write_text(json.dumps(data))
    monkeypatch.setattr(tables.resources, "files", lambda pkg: tmp_path)
    tables.clear_caches()


def tiny_recipe(name: str, base: str, *, installer: str = "uv", pip: tuple[str, ...] = ()) -> str:
    """The smallest recipe that builds: CUDA 12.4's cudart wheel (flavor base: the runtime tier is
    ~2 GB of wheels) on ``base``, Python 3.11."""
    text = (f'name: {name}\nversion: "1"\ncuda: {{version: "12.4", source: wheels, flavor: base}}\n'
            f'base: {{image: {base}}}\npython: "3.11"\nbuild: {{installer: {installer}}}\n')
    return text + (f"pip: [{', '.join(repr(p) for p in pip)}]\n" if pip else "")


def as_unprivileged(argv: list[str]) -> list[str] | None:
    """``argv`` run without the power to write where a folder's mode forbids it; None where that
    cannot be done here. Root has that power (CAP_DAC_OVERRIDE); in a new user namespace it keeps
    its uid, the folder's owner, but not the capability in this one, so a folder of mode 555
    refuses it as it refuses any user."""
    import os
    import shutil

    if os.geteuid() != 0:
        return argv
    unshare = shutil.which("unshare")
    return [unshare, "--user", *argv] if unshare else None


def run_cli(*argv: str, stdin: str = "") -> tuple[int, str, str]:
    """Run the CLI in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err, stdin=io.StringIO(stdin))
    return code, out.getvalue(), err.getvalue()


def image_sh(image_id: str, script: str, timeout: int = 120, platform: str | None = None) -> str:
    """stdout of ``sh -c script`` in a throw-away container of the image (no network), started by
    the engine the test runs on as `imgbuild test` starts its containers (``Engine.run_argv``);
    ``platform``: that platform's image of a multi-platform one (linux/arm64 runs under qemu)."""
    from buildkit_py.engine import engine_for_reading
    from buildkit_py.engine.run import RunSpec

    engine = engine_for_reading(os.environ.get("IMGBUILD_ENGINE"))
    argv = engine.run_argv(RunSpec(image_id, network="none", entrypoint="sh", command=("-c", script),
                                   platform=platform))
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=engine.environment())
    assert out.returncode == 0, out.stderr
    return out.stdout


def assert_labels_true(image_id: str, labels: dict[str, str], platform: str | None = None) -> set[str]:
    """Each io.imgbuild.* label must be true of the image: the product's own label checks (what
    `imgbuild test` and `build --push` run; analysis/image_checks.py). Returns the labels that
    passed; fails on any that did not. ``platform``: check that platform's image of a
    multi-platform one against its own labels."""
    from buildkit_py.analysis.image_checks import PASSED, SKIPPED, label_checks, read_facts
    from buildkit_py.engine import engine_for_reading

    engine = engine_for_reading(os.environ.get("IMGBUILD_ENGINE"))  # the engine fixture's kind
    results = label_checks(labels, read_facts(engine, image_id, platform=platform))
    bad = [f"{r.name}: {r.detail}" for r in results if r.status not in (PASSED, SKIPPED)]
    assert not bad, "\n".join(bad)
    return {r.name.removeprefix("label ") for r in results if r.status == PASSED}


# The labels helpers.model_image can speak to (installer, OS and tiers need more than the pins).
MODELLED_LABELS = frozenset({K.CUDNN_VERSION, K.TORCH_VERSION, K.CUDA_VERSION, K.CUDA_SOURCE})
_EXACT_PIN = re.compile(r"^([A-Za-z0-9_.\-\[\],]+?)==([^;\s]+)$")


def _what_torch_brings(res, pkgs: dict[str, str]) -> dict[str, str]:
    """Add to ``pkgs`` the wheels pip installs with torch; return the libraries torch's own wheel ships."""
    if not res.torch:
        return {}
    release = compat.torch_release(res.torch)
    if not res.torch_index_url:  # the Python registry's build: pip installs what its METADATA requires,
        # pinned in the plan's own steps or not (torch 1.13's are not: no torch_cuda_pins row)
        for name, version in release.pypi_cuda_wheels.items():
            pkgs.setdefault(canonicalize_name(name), version)
        return {}
    # PyTorch's index: pip resolves its nvidia-* requirements (the release's cuDNN major: only that is recorded)
    cudnn_wheels = [v for n, v in release.pypi_cuda_wheels.items() if n.startswith("nvidia-cudnn")]
    major = cudnn_wheels[0].split(".")[0]
    if compat.torch_bundles_cuda(release, res.torch_variant):  # a large wheel: cuDNN in torch/lib
        return {f"libcudnn.so.{major}": "torch"}
    # a small wheel: cuDNN and the CUDA runtime of its variant come as nvidia-* wheels
    cuda_major = res.cuda_version.split(".")[0]
    pkgs.setdefault(f"nvidia-cudnn-cu{cuda_major}", major + ".0.0")
    pkgs.setdefault(f"nvidia-cuda-runtime-cu{cuda_major}", res.cuda_major_minor + ".0")
    return {}


def model_image(plan: BuildPlan) -> ImageFacts:
    """What the image of ``plan`` holds, read from what installs things, not from its labels: each exact
    pin of the final stage's pip steps, what pip brings with torch (from the Python registry: its wheel's
    nvidia-* requirements; from PyTorch's index: the release's cuDNN major, only that is recorded), the
    base's nvidia/cuda tag, and the loader cache an ldconfig step fills."""
    res = plan.resolution
    final = plan.stages[-1]
    pkgs: dict[str, str] = {}
    for step in final.steps:
        if isinstance(step, PipStep):
            for req in step.requirements:
                if m := _EXACT_PIN.match(req):
                    pkgs[canonicalize_name(m.group(1).split("[")[0])] = m.group(2)
    wheel_libs = _what_torch_brings(res, pkgs)
    for name, version in pkgs.items():
        if name.startswith("nvidia-cudnn"):
            wheel_libs[f"libcudnn.so.{version.split('.')[0]}"] = name
        if name.startswith("nvidia-cuda-runtime"):
            wheel_libs[f"libcudart.so.{version.split('.')[0]}"] = name
    ldconfig = any(isinstance(s, LdconfigStep) for s in final.steps)
    sonames = set(wheel_libs) if ldconfig else set()
    tag = cuda_base.from_tag(res.base_image.split("@", 1)[0])
    cudart: dict[str, int] = {}
    if tag is not None and tag.cuda:
        sonames.add(f"libcudart.so.{tag.cuda.split('.')[0]}")
        if tag.cudnn is not None:
            majors = [tag.cudnn] if tag.cudnn else list(compat.cudnn_versions(tag.cuda))
            sonames |= {f"libcudnn.so.{m}" for m in majors}
        major, minor = tag.cuda.split(".")[:2]
        cudart[f"libcudart.so.{major}"] = int(major) * 1000 + int(minor) * 10
    for name, version in pkgs.items():
        if name.startswith("nvidia-cuda-runtime") and f"libcudart.so.{version.split('.')[0]}" in sonames:
            major, minor = version.split(".")[:2]
            cudart[f"libcudart.so.{major}"] = int(major) * 1000 + int(minor) * 10
    return ImageFacts(pkgs=pkgs, installers={}, sonames=tuple(sorted(sonames)), cudart=cudart,
                      python=f"{res.python}.0", os=res.os or "", nvcc=res.cuda_flavor == "devel",
                      wheel_libs=wheel_libs)
