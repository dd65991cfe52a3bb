"""Small helpers shared by test modules (fixtures live in conftest.py)."""

from __future__ import annotations

import io
import json
import re
import subprocess
import uuid
from pathlib import Path

from buildkit_py import label_keys as K
from buildkit_py.cli.main import main

REPO = Path(__file__).resolve().parent.parent
SYSTEM_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# This pytest run's mark: every image, tag or registry repository a test creates carries it in its
# name (``unique``, the ``unique_name`` fixture) or in the RUN_LABEL label, so the check at the end of
# the session (conftest.py) finds what a test left behind, and only this run's, while other runs
# share the engines.
RUN_MARK = "tr" + uuid.uuid4().hex[:6]
RUN_LABEL = "imgbuild-test.run"  # not io.imgbuild.*: inspect reports those


def unique(prefix: str) -> str:
    """A new name for something a test creates, marked with this run: ``imgbuild-test/diff`` ->
    ``imgbuild-test/diff-tr3fa2c1-5d0e9a1b``."""
    return f"{prefix}-{RUN_MARK}-{uuid.uuid4().hex[:8]}"


# Builds here reach PyPI through a proxy whose CA only the system bundle has (environment.md).
CA_ARGS = ["--ca-cert", str(SYSTEM_CA)] if SYSTEM_CA.exists() else []


def write_recipe(folder: Path, text: str, name: str = "recipe.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def tiny_recipe(name: str, base: str, *, installer: str = "uv", pip: tuple[str, ...] = ()) -> str:
    """The smallest recipe that builds: CUDA 12.4's runtime wheel on ``base``, Python 3.11."""
    text = (f'name: {name}\nversion: "1"\ncuda: {{version: "12.4", source: wheels}}\nbase: {{image: {base}}}\n'
            f'python: "3.11"\nbuild: {{installer: {installer}}}\n')
    return text + (f"pip: [{', '.join(repr(p) for p in pip)}]\n" if pip else "")


def run_cli(*argv: str, stdin: str = "") -> tuple[int, str, str]:
    """Run the CLI in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err, stdin=io.StringIO(stdin))
    return code, out.getvalue(), err.getvalue()


def image_sh(image_id: str, script: str, timeout: int = 120, platform: str | None = None) -> str:
    """stdout of ``sh -c script`` in a throw-away container of the image (no network); ``platform``:
    that platform's image of a multi-platform one (linux/arm64 runs under qemu)."""
    where = ["--platform", platform] if platform else []
    out = subprocess.run(["/usr/bin/docker", "run", "--rm", "--network", "none", *where, "--entrypoint", "sh",
                          image_id, "-c", script], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout


_FACTS = """python - <<'EOF'
import json, platform, subprocess, shutil
from importlib import metadata
pkgs = {d.metadata['Name'].lower(): d.version for d in metadata.distributions()}
ld = subprocess.run(['ldconfig', '-p'], capture_output=True, text=True).stdout
osr = dict(l.split('=', 1) for l in open('/etc/os-release').read().split() if '=' in l)
print(json.dumps({'pkgs': pkgs, 'ld': ld, 'py': platform.python_version(),
  'os': osr['ID'] + osr['VERSION_ID'].strip('"'), 'nvcc': bool(shutil.which('nvcc'))}))
EOF"""


def _unsuffixed(name: str) -> str:
    return re.sub(r"-cu\d+$", "", name)


def tier_packages(flavor: str, cuda: str) -> set[str]:
    """The wheels (names without -cuXX) of NVIDIA's tier for that CUDA, from wheels.json: what an image
    of that flavor must carry."""
    from buildkit_py import compat

    ws = compat.cuda_wheel_set(cuda)
    names = {_unsuffixed(p) for extra in compat.tier_extras(flavor, cuda) for p, _ in dict(ws.extras)[extra]}
    if flavor != "base":
        names.add(_unsuffixed(compat.nccl_pin(cuda).split("==")[0]))
    return names


def assert_labels_true(image_id: str, labels: dict[str, str], platform: str | None = None) -> set[str]:
    """Each io.imgbuild.* label that names content must match the image's content: CUDA version and
    source (the runtime wheel, libcudart by name), the flavor's whole library set (NVIDIA's tier from
    wheels.json: no more, no less for a wheels image), cuDNN, Python, OS, torch. Returns the labels checked.
    ``platform``: check that platform's image of a multi-platform one (its own labels)."""
    facts = json.loads(image_sh(image_id, _FACTS, timeout=300, platform=platform))
    checked = set()
    cuda = labels[K.CUDA_VERSION]
    from buildkit_py import compat

    # the driver floors are the data's: driver.min only where NVIDIA publishes one (issue 21: 2)
    toolkit = compat.resolve_cuda(cuda)
    assert labels.get(K.DRIVER_MIN) == toolkit.linux_min_driver, labels
    assert labels.get(K.DRIVER_MIN_COMPAT) == compat.minor_compat_floor(int(cuda.split(".")[0]))
    checked |= {K.DRIVER_MIN, K.DRIVER_MIN_COMPAT}
    mm = ".".join(cuda.split(".")[:2])
    runtime = {n: v for n, v in facts["pkgs"].items() if n.startswith("nvidia-cuda-runtime")}
    flavor = labels.get(K.CUDA_FLAVOR)
    if labels.get(K.CUDA_SOURCE) == "wheels":
        assert runtime and all(v.startswith(mm + ".") for v in runtime.values()), runtime
        assert f"libcudart.so.{mm.split('.')[0]}" in facts["ld"]
        have = {_unsuffixed(n) for n in facts["pkgs"] if n.startswith("nvidia-")}
        want = tier_packages(flavor, cuda)
        assert want <= have, f"flavor {flavor} lacks {sorted(want - have)}"
        if flavor == "base" and K.TORCH_VERSION not in labels and K.CUDNN_VERSION not in labels:
            assert have <= want, f"flavor base carries more than cudart: {sorted(have - want)}"
        checked |= {K.CUDA_VERSION, K.CUDA_SOURCE, K.CUDA_FLAVOR}
    cudnn = labels.get(K.CUDNN_VERSION)
    if cudnn:
        assert f"libcudnn.so.{cudnn}" in facts["ld"], "cuDNN label without libcudnn in the loader cache"
        checked.add(K.CUDNN_VERSION)
    else:
        assert "libcudnn.so" not in facts["ld"]
    assert facts["py"].startswith(labels[K.PYTHON_VERSION] + ".")
    assert facts["os"] == labels[K.OS]
    assert facts["nvcc"] == (flavor == "devel"), f"flavor {flavor} but nvcc on PATH: {facts['nvcc']}"
    torch = labels.get(K.TORCH_VERSION)
    assert (facts["pkgs"].get("torch") or None) == (torch.split("+")[0] if torch else None)
    checked |= {K.PYTHON_VERSION, K.OS, K.CUDA_FLAVOR}
    return checked
