"""End to end on a real engine and registry: build a wheels recipe, check its labels and env,
run it with no network to prove libcudart loads by name, push it with auth and read the
manifest back from the registry. The build and the rebuild after an app change run on every
engine (podman too: ``on_every_engine``), the rest on the docker engines."""

import base64
import dataclasses
import json
import re
import subprocess

import pytest
from conftest import on_engine, on_every_engine
from helpers import CA_ARGS, run_cli, write_recipe

from buildkit_py import oci
from buildkit_py.plan.history import instruction_of

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
copy:
  - {{src: app/, dest: /app}}
workdir: /app
env:
  HF_HOME: /models/hf
labels:
  team: ml-platform
entrypoint: ["python", "/app/main.py"]
"""
MAIN = "import ctypes\nctypes.CDLL('libcudart.so.12')\nprint('cudart loaded')\n"


@pytest.fixture
def project(tmp_path, base_image, unique_name):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.py").write_text(MAIN)
    return write_recipe(tmp_path, RECIPE.format(name=unique_name, base=base_image))


def build(*args):
    code, out, err = run_cli("build", *args, "--json", "--progress", "quiet")
    assert code == 0, err
    return json.loads(out)


@on_every_engine
def test_build_labels_env_and_cuda_loads(project, engine, cleanup_images, unique_name):
    report = build(str(project), *CA_ARGS)
    cleanup_images.extend(report["tags"])
    assert report["tags"] == [f"{unique_name}:1.0"]
    attrs = engine.image_attrs(report["image_id"])
    labels = attrs["Config"]["Labels"]
    assert labels["io.imgbuild.cuda.version"] == "12.4.1"
    assert labels["io.imgbuild.cuda.driver.min"] == "550.54.15"
    assert labels["io.imgbuild.cuda.driver.min-compat"] == "525.60.13"
    assert labels["io.imgbuild.cuda.source"] == "wheels"
    assert labels["io.imgbuild.recipe.digest"].startswith("sha256:")
    assert labels["org.opencontainers.image.version"] == "1.0"
    assert labels["org.opencontainers.image.created"].endswith("Z")
    assert labels["team"] == "ml-platform"
    # --json reports exactly what the image carries, volatile labels included (issue 11 item 19)
    assert report["labels"] == labels
    env = dict(e.split("=", 1) for e in attrs["Config"]["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert env["NVIDIA_REQUIRE_CUDA"] == "cuda>=12.0"
    assert env["CUDA_VERSION"] == "12.4.1"
    assert env["HF_HOME"] == "/models/hf"
    client, client_env = engine.client_argv(), engine.environment()
    out = subprocess.run([*client, "run", "--rm", "--network", "none", report["image_id"]],
                         capture_output=True, text=True, timeout=120, env=client_env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "cudart loaded"
    # found through the loader cache, like NVIDIA's images, not through LD_LIBRARY_PATH
    ldconfig = subprocess.run([*client, "run", "--rm", "--network", "none", "--entrypoint", "ldconfig",
                               report["image_id"], "-p"], capture_output=True, text=True, timeout=60, env=client_env)
    assert "libcudart.so.12" in ldconfig.stdout
    # the CA bundle passed as a secret is not in the image
    history = json.dumps([dataclasses.asdict(e) for e in engine.history(report["image_id"])])
    assert "ca-certificates.crt" not in history and "BEGIN CERTIFICATE" not in history
    # inspect names each layer's recipe step: the mount stubs' COPY is theirs, the recipe's copy[0]
    # is copy-0 (issue 22: 11: they were copy-0 and copy-1)
    code, out, err = run_cli("inspect", report["tags"][0], "--json", "--no-compressed")
    assert code == 0, err
    layers = [(x["step"], x["group"], instruction_of(x["created_by"])) for x in json.loads(out)["layers"]]
    assert [x for x in layers if x[0] in ("mount-stubs", "copy-0", "copy-1")] == [
        ("mount-stubs", "python", "COPY"), ("mount-stubs", "python", "RUN"), ("copy-0", "app", "COPY")]
    # into a pipe (run_cli's stdout): aligned text columns, not box tables (issue 22: 9)
    code, out, err = run_cli("inspect", report["tags"][0], "--no-compressed")
    assert code == 0, err
    assert "\nLayers\n#  STEP " in out and not set("┃│━┏└") & set(out)
    # the minute-long pass over the image shows its bytes as it reads them (issue 22: 10)
    read = [line for line in err.splitlines() if line.startswith(f"     read {report['tags'][0]} ")]
    assert len(read) >= 3 and read[-1].split()[2] == "100%" and "MiB of" in read[-1], err
    # layer 8: the cuda-path layer (the CUDA wheels' prefix, a .pth in the venv) comes after cuda
    assert any(line.split()[:3] == ["8", "copy-0", "app"] for line in out.splitlines())


def test_push_with_auth_and_read_manifest_back(project, registry, docker_config, docker_client, cleanup_images,
                                               unique_name):
    code, _, err = run_cli("login", registry.address, "-u", registry.user, "--password-stdin",
                           stdin=registry.password + "\n")
    assert code == 0, err
    assert registry.password not in (docker_config / "config.json").read_text().replace("auth", "")
    report = build(str(project), "--registry", registry.address, "--push", *CA_ARGS)
    cleanup_images.extend(report["tags"])
    push = report["pushes"][0]
    assert push["tag"] == "1.0" and push["digest"].startswith("sha256:")
    # the digest printed is the tag's in the registry (an index where BuildKit adds attestations)
    assert oci.fetch_manifest(f"{registry.address}/{unique_name}:1.0")[1] == push["digest"]
    manifest, _digest, _media_type = oci.get_manifest(f"{registry.address}/{unique_name}:1.0")
    assert manifest["layers"]
    config = oci.get_image_config(f"{registry.address}/{unique_name}:1.0")
    assert config["config"]["Labels"]["io.imgbuild.cuda.version"] == "12.4.1"
    # check reads the labels from the registry, without the image being local
    docker_client.images.remove(report["tags"][0])
    code, out, err = run_cli("check", f"{registry.address}/{unique_name}:1.0", "--driver", "535.104.05", "--json")
    assert code == 0, err
    assert json.loads(out)["verdict"] == "minor-version"


@pytest.mark.parametrize("where", ["env", "docker-config"])
def test_wrong_push_credentials_exit_3_before_anything_builds(project, registry, docker_config, docker_client,
                                                              cleanup_images, monkeypatch, unique_name, where):
    """Issue 22 item 5: wrong credentials were found only when the push began, after the whole
    build (minutes for a torch image). Now the registry is asked before the engine builds:
    exit 3, no step ran, no image was made."""
    tag = f"{registry.address}/{unique_name}:1.0"
    cleanup_images.append(tag)  # in case a build ran after all (the old code built and tagged it)
    if where == "env":
        monkeypatch.setenv("IMGBUILD_REGISTRY_USER", registry.user)
        monkeypatch.setenv("IMGBUILD_REGISTRY_PASSWORD", "wrong-" + registry.password)
    else:
        auth = base64.b64encode(f"{registry.user}:wrong-{registry.password}".encode()).decode()
        (docker_config / "config.json").write_text(json.dumps({"auths": {registry.address: {"auth": auth}}}))
    code, out, err = run_cli("build", str(project), "--registry", registry.address, "--push", "--progress", "plain",
                             *CA_ARGS)
    assert code == 3, err
    assert f"cannot push {tag}: registry {registry.address} rejected the credentials of 'ci'" in err
    assert "nothing was built" in err and "imgbuild login" in err
    assert "wrong-" not in err and registry.password not in err
    assert "#1 " not in err and "[final" not in err  # BuildKit never started: no step, not even the context
    assert docker_client.images.list(name=tag) == []


@on_every_engine
def test_app_only_change_reruns_only_app_steps(project, engine, cleanup_images, unique_name):
    first = build(str(project), *CA_ARGS)
    cleanup_images.extend(first["tags"])
    # content never built before, so the layer cache cannot already hold it
    (project.parent / "app" / "main.py").write_text(MAIN + f"print({unique_name!r})\n")
    second = build(str(project), *CA_ARGS)
    # os, python, mount-stubs (COPY + RUN), cuda, cuda-path and ldconfig come from the cache; only COPY
    # and what follows re-run.
    assert second["steps_rerun"] == ["COPY", "WORKDIR"]
    assert second["steps_cached"] == 7
    assert second["image_id"] != first["image_id"]
    # --progress quiet: nothing on stderr but errors (issue 22: 9: the "building ..." line came through)
    code, out, err = run_cli("build", str(project), "--progress", "quiet", *CA_ARGS)
    assert code == 0 and err == "", err
    assert out.startswith("image    sha256:") and "steps    0 run, 9 cached" in out


def test_classic_engine_refuses_cache_to_before_building(project, docker_client, monkeypatch):
    monkeypatch.setenv("IMGBUILD_DOCKER", "/usr/bin/docker")  # the 20.10 client, whichever engine
    code, _, err = run_cli("build", str(project), "--engine", "docker", "--cache-to",
                           "type=registry,ref=127.0.0.1:5000/cache")
    assert code == 3 and "cache-export" in err


@on_engine("docker20")  # the view reads the engine's lines; both engines' lines are in test_step_view
def test_plain_progress_heartbeat_during_a_real_slow_step(project, cleanup_images, unique_name, monkeypatch):
    """issue 22: 10: off a terminal a long step printed nothing between its start and end line.
    With a 1 s heartbeat (IMGBUILD_HEARTBEAT), the uncached os/cuda steps (apt, the CUDA wheels)
    each take several seconds: heartbeat lines name the step that is running and how long."""
    monkeypatch.setenv("IMGBUILD_HEARTBEAT", "1")
    code, out, err = run_cli("build", str(project), "--no-cache", *CA_ARGS)
    cleanup_images.append(f"{unique_name}:1.0")
    assert code == 0, err
    lines = err.splitlines()
    beats = [(i, line) for i, line in enumerate(lines) if line.startswith("still running [final ")]
    assert beats, err
    for i, line in beats:  # each names a step that started before it and had not ended yet
        step = line.removeprefix("still running ").rsplit(" (", 1)[0]
        assert step in lines[:i] and not any(x.startswith(f"{step}: done") for x in lines[:i]), err
        assert re.fullmatch(r"\d+s", line.rsplit(" (", 1)[1].rstrip(")")), line
