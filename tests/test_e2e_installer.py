"""uv and pip as the installer of the pip steps, end to end on the real engines and the Python
registry: the same small recipe built with each (both run; uv is not in its image; bytecode is
compiled by both), a locked uv build (hashes enforced by uv: a corrupted one fails the build),
and a pip.conf that uv only honours translated (a package that exists only on a local index the
pip.conf names), which never reaches a layer."""

import json
import subprocess
import uuid

import pytest
import yaml
from helpers import CA_ARGS, run_cli, write_recipe
from packaging.utils import canonicalize_name
from pyindex import LocalIndex

from buildkit_py.plan import lock

pytestmark = pytest.mark.e2e
DOCKER = "/usr/bin/docker"
RECIPE = """\
name: {name}
version: "1.0"
cuda: {{version: "12.4", source: wheels, flavor: base}}
base: {{image: {base}}}
python: "3.11"
pip: [{pins}]
build: {{installer: {installer}}}
"""
SITE = "/opt/venv/lib/python3.11/site-packages"


def build(recipe, *args, expect=0):
    # not --progress quiet: a test reads the "lock     PATH (status)" note, which quiet leaves out
    code, out, err = run_cli("build", str(recipe), *args, "--json", *CA_ARGS)
    assert code == expect, err
    return (json.loads(out) if code == 0 else None), err


def sh(image: str, script: str) -> subprocess.CompletedProcess:
    """Run ``script`` in ``image`` (the docker20 client reaches the engine the test runs on)."""
    return subprocess.run([DOCKER, "run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c", script],
                          capture_output=True, text=True, check=False, timeout=120)


def test_uv_and_pip_build_the_same_pins_and_uv_does_not_ship(tmp_path, base_image, unique_name,
                                                              docker_client, cleanup_images):
    images = {}
    for installer in ("uv", "pip"):
        path = write_recipe(tmp_path / installer, RECIPE.format(name=f"{unique_name}-{installer}", base=base_image,
                                                                pins='"six==1.16.0"', installer=installer))
        report, _ = build(path)
        cleanup_images.extend(report["tags"])
        images[installer] = report["tags"][0]
    for installer, image in images.items():
        out = sh(image, "python -c \"import ctypes, six; ctypes.CDLL('libcudart.so.12'); print(six.__version__)\"; "
                        f"cat {SITE}/six-1.16.0.dist-info/INSTALLER | tr -d '\\n'; echo; ls {SITE}/__pycache__")
        assert out.returncode == 0, out.stderr
        version, who, pycs = out.stdout.split("\n", 2)
        assert version == "1.16.0" and who == installer
        assert "six.cpython-311.pyc" in pycs  # bytecode compiled at build time by both
    # uv came from a cache mount: no uv program anywhere in the image, its mount point empty
    out = sh(images["uv"], "command -v uv; find / -xdev -name uv -type f; "
                           "find /run/imgbuild-uv /root/.cache/uv -mindepth 1")
    assert out.stdout == "" and out.stderr == "", out
    history = json.dumps(docker_client.api.history(images["uv"]))
    assert '\\"$uv\\" pip install' in history and "BEGIN CERTIFICATE" not in history


def test_a_locked_uv_build_installs_exactly_the_lock_and_refuses_a_bad_hash(tmp_path, base_image,
                                                                           unique_name, docker_client, cleanup_images):
    path = write_recipe(tmp_path, RECIPE.format(name=unique_name, base=base_image, pins='"requests==2.32.3"',
                                                installer="uv"))
    code, _, err = run_cli("lock", str(path), *CA_ARGS)
    assert code == 0, err
    entry = yaml.safe_load(lock.lock_path(path).read_text())["variants"]["default"]
    locked = {canonicalize_name(p["name"]): p["version"] for p in entry["packages"]["final"]}
    report, err = build(path)
    cleanup_images.extend(report["tags"])
    assert "(used)" in err
    out = sh(report["image_id"], "pip freeze")
    assert out.returncode == 0, out.stderr
    frozen = dict(line.split("==", 1) for line in out.stdout.split())
    assert {canonicalize_name(n): v for n, v in frozen.items()} == {
        n: v for n, v in locked.items() if n not in lock.FREEZE_EXCLUDED}
    history = json.dumps(docker_client.api.history(report["image_id"]))
    assert '\\"$uv\\" pip install' in history and "--require-hashes" in history

    certifi = next(p for p in entry["packages"]["final"] if p["name"] == "certifi")
    lock.lock_path(path).write_text(lock.lock_path(path).read_text().replace(certifi["sha256"], "f" * 64))
    _, err = build(path, expect=1)
    assert "hash" in err.lower() and "certifi" in err  # uv's own hash check failed the step


def test_a_pip_conf_reaches_uv_translated_and_stays_out_of_the_image(tmp_path, base_image, unique_name,
                                                                      docker_client, cleanup_images):
    probe = f"imgbuild-probe-{uuid.uuid4().hex[:8]}"  # a package only this index has; a new name, no cached step
    with LocalIndex(tmp_path / "index") as index:
        index.add_wheel(probe, "1.0")
        conf = tmp_path / "pip.conf"
        conf.write_text(f"[global]\nextra-index-url = {index.url}\ntrusted-host = 127.0.0.1\ntimeout = 60\n"
                        "disable-pip-version-check = true\n")
        path = write_recipe(tmp_path / "r", RECIPE.format(name=unique_name, base=base_image,
                                                          pins=f'"{probe}==1.0", "six==1.16.0"', installer="uv"))
        report, _ = build(path, "--pip-config", str(conf))
        cleanup_images.extend(report["tags"])
        assert f"/simple/{probe}/" in index.requests
    where = index.url.split("/simple")[0]  # http://127.0.0.1:PORT
    module = probe.replace("-", "_")
    out = sh(report["image_id"], f"python -c 'import {module}'; cat {SITE}/{module}-1.0.dist-info/INSTALLER;"
                                 f" echo; wc -c < /run/secrets/uvenv; grep -rl {where} /opt /etc /root /run || :")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["uv", "0"]  # installed by uv; the secret's mount point is empty
    history = json.dumps(docker_client.api.history(report["image_id"]))
    assert index.url not in history and "UV_EXTRA_INDEX_URL" not in history

    # a key uv has no equivalent for: exit 2 naming it, before anything is built
    conf.write_text(f"[global]\nextra-index-url = {index.url}\nconstraint = /etc/constraints.txt\n")
    _, err = build(path, "--pip-config", str(conf), expect=2)
    assert "uv has no equivalent for [global] constraint" in err
