"""Lock files end to end, on the real engine, registry and Python registry: lock a small
wheels recipe (requests and what it pulls, plus the CUDA runtime wheel of the plan's cuda
step) on a base pushed to the local registry so it pins by digest, build it, and compare
`pip freeze` inside the image with the lock; then a stale lock, --locked drift, --update-lock
and a corrupted hash."""

import json
import os
import subprocess
import time

import pytest
import yaml
from helpers import run_cli, unique, write_recipe
from packaging.utils import canonicalize_name

from buildkit_py import oci
from buildkit_py.plan import lock

CA = "/etc/ssl/certs/ca-certificates.crt"
DOCKER = "/usr/bin/docker"
RECIPE = """\
name: {name}
version: "1.0"
cuda:
  version: "12.4"
  source: wheels
  flavor: base
base:
  image: {base}
python: "3.11"
pip:
  - requests==2.32.3
"""


def ca_args():
    return ["--ca-cert", CA] if os.path.exists(CA) else []


@pytest.fixture
def pushed_base(registry, docker_config, docker_client, base_image):
    """The Debian base pushed to the local registry (under a fresh repository), so the lock
    can pin it by registry digest; an imported image alone has none."""
    code, _, err = run_cli("login", registry.address, "-u", registry.user, "--password-stdin",
                           stdin=registry.password + "\n")
    assert code == 0, err
    ref = unique(f"{registry.address}/imgbuild-test") + "/debian:bookworm-slim"
    subprocess.run([DOCKER, "tag", base_image, ref], check=True, capture_output=True)
    push = subprocess.run([DOCKER, "push", ref], capture_output=True, text=True, check=False, timeout=300)
    assert push.returncode == 0, push.stderr
    yield ref
    subprocess.run([DOCKER, "image", "rm", ref], capture_output=True, check=False)


@pytest.fixture
def project(tmp_path, pushed_base, unique_name):
    return write_recipe(tmp_path, RECIPE.format(name=unique_name, base=pushed_base))


def cli(*argv):
    return run_cli(*argv)


def build(recipe, *args, expect=0):
    # not --progress quiet: the tests read the "lock     PATH (status)" note, which quiet leaves out
    code, out, err = run_cli("build", str(recipe), *args, "--json", *ca_args())
    assert code == expect, err
    return (json.loads(out) if code == 0 else None), err


def locked_packages(recipe):
    entry = yaml.safe_load(lock.lock_path(recipe).read_text())["variants"]["default"]
    return entry, {canonicalize_name(p["name"]): p["version"] for p in entry["packages"]["final"]}


def freeze(image_id):
    out = subprocess.run([DOCKER, "run", "--rm", "--network", "none", image_id, "pip", "freeze"],
                         capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stderr
    pairs = (line.split("==", 1) for line in out.stdout.split())
    return {canonicalize_name(n): v for n, v in pairs}


def test_lock_then_build_installs_exactly_the_lock(project, pushed_base, docker_client, cleanup_images):
    started = time.monotonic()
    code, out, err = cli("lock", str(project), *ca_args())
    lock_seconds = time.monotonic() - started
    assert code == 0, err
    path = project.with_suffix(".lock")
    first = path.read_bytes()
    entry, pkgs = locked_packages(project)
    # transitive wheels, and the cuda step's wheel, each with a sha256
    assert {"requests", "certifi", "idna", "urllib3", "charset-normalizer", "nvidia-cuda-runtime-cu12"} <= set(pkgs)
    assert pkgs["requests"] == "2.32.3" and pkgs["nvidia-cuda-runtime-cu12"] == "12.4.127"
    assert all(len(p["sha256"]) == 64 for p in entry["packages"]["final"])
    steps = {canonicalize_name(p["name"]): p["step"] for p in entry["packages"]["final"]}
    assert steps["nvidia-cuda-runtime-cu12"] == "cuda" and steps["certifi"] == "pins"
    # the base by its registry digest
    _, digest, _ = oci.fetch_manifest(pushed_base)
    assert entry["bases"]["final"] == {"ref": pushed_base, "digest": digest}
    # deterministic: locking again writes nothing and the bytes are the same
    code, out, err = cli("lock", str(project), *ca_args())
    assert code == 0 and "\nunchanged " in out, err
    assert path.read_bytes() == first

    report, err = build(project)
    cleanup_images.extend(report["tags"])
    assert f"lock     {path} (used)" in err
    assert freeze(report["image_id"]) == {n: v for n, v in pkgs.items() if n not in lock.FREEZE_EXCLUDED}
    history = json.dumps(docker_client.api.history(report["image_id"]))
    assert "--require-hashes" in history
    for p in entry["packages"]["final"]:
        assert p["sha256"] not in history  # the requirement files were mounted, not copied
    leftover = subprocess.run([DOCKER, "run", "--rm", "--network", "none", report["image_id"],
                               "find", lock.MOUNT_DIR, "-type", "f"], capture_output=True, text=True, check=False, timeout=60)  # noqa: E501
    assert leftover.stdout == ""

    started = time.monotonic()
    again, _ = build(project)
    print(f"\nlock {lock_seconds:.1f}s, first locked build {report['seconds']:.1f}s, "
          f"rebuild with lock {time.monotonic() - started:.1f}s ({again['steps_cached']} cached)")
    assert again["steps_run"] == 0  # every step from the cache (the image differs only in its created label)


def test_stale_lock_drift_update_and_hash_mismatch(project, docker_client, cleanup_images):
    code, _, err = cli("lock", str(project), *ca_args())
    assert code == 0, err
    path = project.with_suffix(".lock")
    locked = path.read_text()

    # the recipe moves on: the build is refused, naming what changed, and nothing is built
    project.write_text(project.read_text().replace("requests==2.32.3", "requests==2.32.2"))
    _, err = build(project, expect=2)
    assert "pip: requests 2.32.3 -> 2.32.2" in err and "--update-lock" in err
    # --locked (CI) fails on it with exit 1, and leaves the lock alone
    _, err = build(project, "--locked", expect=1)
    assert "requests 2.32.3 -> 2.32.2" in err
    assert path.read_text() == locked

    # --update-lock rewrites it and builds; then --locked passes
    report, err = build(project, "--update-lock")
    cleanup_images.extend(report["tags"])
    assert "(updated)" in err
    _, pkgs = locked_packages(project)
    assert pkgs["requests"] == "2.32.2"
    assert freeze(report["image_id"])["requests"] == "2.32.2"
    again, _ = build(project, "--locked")
    assert again["steps_run"] == 0

    # a corrupted hash: --locked names it, and the build itself fails in pip's hash check
    entry, _ = locked_packages(project)
    certifi = next(p for p in entry["packages"]["final"] if p["name"] == "certifi")
    path.write_text(path.read_text().replace(certifi["sha256"], "f" * 64))
    _, err = build(project, "--locked", expect=1)
    assert f"certifi {certifi['version']}: locked sha256 ffffffffffff" in err
    _, err = build(project, expect=1)
    assert "hash" in err.lower() and "certifi" in err
