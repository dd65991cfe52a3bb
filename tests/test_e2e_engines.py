"""End to end on each engine (classic 20.10, Docker 26 + buildx + the containerd store, and
podman): the engine contract every engine plug-in keeps (``on_every_engine``: build through the
CLI with the CA bundle, labels read back true, push with the registry's digest, an unchanged
rebuild that keeps its image and digest, `imgbuild run` of the pushed image, the GPU flags,
`imgbuild inspect` reading the engine's saved image, and the pushed image's SBOM read again from
the engine's file system of it); the digest printed after a push is the
registry's, for one tag and several; buildx output options (zstd, OCI media types, provenance)
land in the registry as asked and the classic client refuses them before building; registry
cache survives `docker buildx prune -af`. (The bake folder `imgbuild matrix --format bake -o DIR`
writes is built for real in test_e2e_matrix.)"""

import json
import os
import shlex
import subprocess
import uuid
from pathlib import Path

import pytest
from conftest import ENGINE_NAMES, on_every_engine
from helpers import CA_ARGS, RUN_LABEL, RUN_MARK, run_cli, unique, write_recipe

from buildkit_py import label_keys as L
from buildkit_py import oci
from buildkit_py.engine.run import nvidia_cdi_specs

RECIPE = """\
name: {name}
version: "1.0"
cuda: {{version: "12.4", source: wheels, flavor: base}}
base: {{image: {base}}}
python: "3.11"
copy:
  - {{src: app/, dest: /app}}
workdir: /app
"""


@pytest.fixture
def project(tmp_path, base_image, unique_name):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.py").write_text(f"print({unique_name!r})\n")
    return write_recipe(tmp_path, RECIPE.format(name=unique_name, base=base_image))


@pytest.fixture
def logged_in(registry, docker_config):
    code, _, err = run_cli("login", registry.address, "-u", registry.user, "--password-stdin",
                           stdin=registry.password + "\n")
    assert code == 0, err
    return registry


def build(*args: str) -> dict:
    code, out, err = run_cli("build", *args, "--json", "--progress", "quiet", *CA_ARGS)
    assert code == 0, err
    return json.loads(out)


def buildx_only(engine) -> None:
    if getattr(engine, "buildx", None) is None:
        pytest.skip("a buildx feature; test_classic_refuses_buildx_options covers the classic client")


# How each engine asks for every GPU (Engine.run_argv), written out: the test's own expectation.
GPU_FLAGS = {"docker20": ["--gpus", "all"], "docker26": ["--gpus", "all"], "podman": ["--device", "nvidia.com/gpu=all"],
             "buildah": ["--device", "nvidia.com/gpu=all"]}  # buildah's images run through podman


@on_every_engine
def test_engine_contract(project, logged_in, engine, cleanup_images, unique_name, tmp_path, capfd):
    """What every engine must do through imgbuild's CLI: build a small CUDA 12.4 wheels image
    with the CA bundle as a secret, carry the plan's labels (read back from the engine, the
    registry and `imgbuild inspect`), push with the registry's digest, rebuild unchanged from
    its cache with the same image and digest, and run the pushed image with `imgbuild run`."""
    tag = f"{logged_in.address}/{unique_name}:contract"
    report = build(str(project), "--tag", tag, "--push")
    cleanup_images.append(tag)
    assert report["engine"] == engine.name and report["steps_run"] > 0
    # the labels the plan promised are on the image, in the engine and in the registry
    labels = report["labels"]
    assert labels[L.CUDA_VERSION] == "12.4.1" and labels[L.OCI_TITLE] == unique_name
    attrs = engine.image_attrs(tag)
    assert attrs is not None and attrs["Id"] == report["image_id"]
    assert {k: v for k, v in attrs["Config"]["Labels"].items() if k.startswith(L.PREFIX)} == \
        {k: v for k, v in labels.items() if k.startswith(L.PREFIX)}
    config = oci.get_image_config(tag)["config"]
    assert config["Labels"] == attrs["Config"]["Labels"]
    # the digest printed is the registry's, and the sizes add up
    (push,) = report["pushes"]
    assert push["ref"] == f"{logged_in.address}/{unique_name}@{push['digest']}"
    assert oci.fetch_manifest(tag)[1] == push["digest"]
    assert report["size_uncompressed"] == sum(report["groups"].values()) > report["size_compressed"] > 0
    # the push attached the image's SBOM, read from the registry's layers; the engine's own file
    # system of the image (Engine.filesystem: a container created, never started, exported) lists
    # the same components
    (sbom,) = report["sboms"]
    assert sbom["subject"] == push["digest"]
    code, out, err = run_cli("sbom", tag, "--json")
    assert code == 0, err
    attached = json.loads(out)["components"]
    assert any(c["name"] == "nvidia-cuda-runtime-cu12" for c in attached)
    code, out, err = run_cli("sbom", tag, "--generate", "--source", "engine", "--json")
    assert code == 0, err
    assert json.loads(out)["components"] == attached
    # nothing changed: every step from the cache, the same image, the same digest
    again = build(str(project), "--tag", tag, "--push")
    assert (again["steps_run"], again["steps_cached"]) == (0, report["steps_run"] + report["steps_cached"])
    assert again["image_id"] == report["image_id"] and again["pushes"][0]["digest"] == push["digest"]
    # inspect reads the engine's saved image: the same labels and sizes
    code, out, err = run_cli("inspect", tag, "--json", "--progress", "quiet", "--no-compressed")
    assert code == 0, err
    seen = json.loads(out)
    assert seen["labels"] == {k: v for k, v in labels.items() if k.startswith(L.PREFIX)}
    assert seen["size_uncompressed"] == report["size_uncompressed"] and seen["id"] == report["image_id"]
    # run: the pushed image's app, through the engine's own client
    capfd.readouterr()
    code, _, err = run_cli("run", tag, "--gpus", "none", "--network", "none", "--weights-dir", str(tmp_path / "w"),
                           "--", "python", "main.py")
    assert code == 0, err
    assert capfd.readouterr().out.strip() == unique_name
    running = shlex.split(next(ln for ln in err.splitlines() if ln.startswith("running ")).removeprefix("running "))
    client = engine.client_argv()
    assert running[:len(client) + 2] == [*client, "run", "--rm"] and not set(GPU_FLAGS[engine.test_name]) & set(running)
    # the GPU flags this engine takes, where it is asked for every GPU
    code, out, err = run_cli("run", tag, "--dry-run", "--json", "--gpus", "all", "--", "nvidia-smi")
    assert code == 0, err
    argv = json.loads(out)["argv"]
    flags = GPU_FLAGS[engine.test_name]
    assert argv[argv.index(flags[0]):argv.index(flags[0]) + 2] == flags and argv[-2:] == [tag, "nvidia-smi"]


@pytest.fixture
def fake_gpu_spec():
    """A CDI spec that declares nvidia.com/gpu=all as an environment variable, where no real
    NVIDIA spec is (there the real device would be asked for): what podman injects for
    `--device nvidia.com/gpu=all` without a GPU. Named so that `--gpus auto` does not read it
    (nvidia*.yaml), removed afterwards."""
    if nvidia_cdi_specs():
        pytest.skip("this machine has NVIDIA CDI specs: a stand-in for them would clash")
    folder = Path("/var/run/cdi")
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / f"imgbuild-test-{RUN_MARK}-{uuid.uuid4().hex[:8]}.yaml"
    spec.write_text('cdiVersion: "0.5.0"\nkind: "nvidia.com/gpu"\ndevices:\n  - name: all\n'
                    f'    containerEdits:\n      env: ["IMGBUILD_TEST_GPU={spec.stem}"]\n')
    yield spec.stem
    spec.unlink()


@pytest.mark.parametrize("engine", [e for e in ENGINE_NAMES if e in ("podman", "buildah")], indirect=True)
def test_podman_gives_the_gpus_through_cdi(project, engine, cleanup_images, fake_gpu_spec, tmp_path, capfd):
    """`imgbuild run --gpus all` on podman asks for nvidia.com/gpu=all through CDI, and podman
    hands the container what the spec for it says (here a stand-in spec's variable; on a GPU
    machine the device nodes and driver libraries `nvidia-ctk cdi generate` lists)."""
    report = build(str(project))
    cleanup_images.extend(report["tags"])
    capfd.readouterr()
    code, _, err = run_cli("run", report["tags"][0], "--gpus", "all", "--network", "none",
                           "--weights-dir", str(tmp_path / "w"), "--", "sh", "-c", "echo $IMGBUILD_TEST_GPU")
    assert code == 0, err
    assert capfd.readouterr().out.strip() == fake_gpu_spec
    assert "--device nvidia.com/gpu=all" in next(ln for ln in err.splitlines() if ln.startswith("running "))


@on_every_engine
@pytest.mark.parametrize("ntags", [1, 2])
def test_printed_digest_is_the_registrys(project, logged_in, engine, cleanup_images, unique_name, ntags):
    tags = [f"{logged_in.address}/{unique_name}:t{i}" for i in range(ntags)]
    report = build(str(project), *[a for t in tags for a in ("--tag", t)], "--push")
    cleanup_images.extend(tags)
    assert [p["tag"] for p in report["pushes"]] == [f"t{i}" for i in range(ntags)]
    for push, tag in zip(report["pushes"], tags, strict=True):
        assert push["ref"] == f"{logged_in.address}/{unique_name}@{push['digest']}"
        assert oci.fetch_manifest(tag)[1] == push["digest"]  # the tag's own digest, index or manifest
    # sizes under explicit names; compressed from the registry's manifest now that it is there
    manifest, _, _ = oci.get_manifest(tags[0])
    assert report["size_compressed"] == manifest["config"]["size"] + sum(x["size"] for x in manifest["layers"])
    assert report["size_uncompressed"] == report["size"] > report["size_compressed"] > 0
    assert report["size_uncompressed"] == sum(report["groups"].values())


def test_classic_refuses_buildx_options(project, engine, monkeypatch):
    monkeypatch.setenv("IMGBUILD_DOCKER", "/usr/bin/docker")  # the 20.10 client, on either engine
    code, _, err = run_cli("build", str(project), "--engine", "docker", "--compression", "zstd",
                           "--provenance", "min", "--progress", "quiet")
    assert code == 3, err
    assert "compression, provenance" in err and "containerd image store" in err


def test_zstd_oci_provenance_push_and_inspect(project, logged_in, engine, cleanup_images, unique_name):
    buildx_only(engine)
    tag = f"{logged_in.address}/{unique_name}:zstd"
    report = build(str(project), "--tag", tag, "--push", "--compression", "zstd:3", "--oci-mediatypes",
                   "--provenance", "min")
    cleanup_images.append(tag)
    raw, digest, media_type = oci.fetch_manifest(tag)
    assert digest == report["pushes"][0]["digest"] and media_type == "application/vnd.oci.image.index.v1+json"
    index = json.loads(raw)
    kinds = [(m.get("annotations") or {}).get("vnd.docker.reference.type") for m in index["manifests"]]
    assert "attestation-manifest" in kinds  # provenance mode=min
    # mirror copies that index whole: the same digest, the attestation manifest with it (issue 22 item 1)
    copy = f"{logged_in.address}/{unique_name}-mirror:zstd"
    code, out, err = run_cli("mirror", tag, copy, "--json", "--progress", "quiet")
    assert code == 0, err
    mirrored = json.loads(out)
    assert mirrored["digest"] == mirrored["source_digest"] == digest and mirrored["same_digest"] is True
    assert (mirrored["platforms"], mirrored["attestations"], mirrored["left_out"]) == (["linux/amd64"], 1, [])
    assert oci.fetch_manifest(copy)[:2] == (raw, digest)
    for entry in index["manifests"]:
        assert oci.fetch_manifest(f"{logged_in.address}/{unique_name}-mirror@{entry['digest']}")[1] == entry["digest"]
    manifest, _, _ = oci.get_manifest(tag)
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert {x["mediaType"] for x in manifest["layers"]} == {"application/vnd.oci.image.layer.v1.tar+zstd"}
    # inspect on the engine reads its OCI layout (zstd blobs); compressed sizes from the registry
    code, out, err = run_cli("inspect", tag, "--json", "--no-compressed")
    assert code == 0, err
    seen = json.loads(out)
    assert seen["size_uncompressed"] == report["size_uncompressed"]
    assert seen["compressed_source"] == "registry"
    assert [x["compressed_size"] for x in seen["layers"]] == [x["size"] for x in manifest["layers"]]


def test_named_builder_of_a_docker_context(project, engine, docker_config, monkeypatch, cleanup_images,
                                           unique_name):
    """`--builder NAME` with a named builder: here the docker-driver builder of a docker context
    (`docker context create` + `use`, no DOCKER_HOST: how Docker Desktop's builders are named),
    since a docker-container builder needs the moby/buildkit image from Docker Hub. The build
    runs through that builder, loads the image (type=docker output), and imgbuild reads sizes
    and labels from the context's engine, not the default socket's (the SDK's from_env follows
    the current context too)."""
    buildx_only(engine)
    if not engine.host:
        pytest.skip("needs an engine on a socket of its own to name in a context")
    name = unique("imgbuild-test")
    for argv in (["context", "create", name, "--docker", f"host={engine.host}"], ["context", "use", name]):
        proc = subprocess.run([engine.client, *argv], capture_output=True, text=True, check=False, timeout=60,
                              env={k: v for k, v in os.environ.items() if k != "DOCKER_HOST"})
        assert proc.returncode == 0, proc.stderr
    monkeypatch.delenv("DOCKER_HOST")  # the context says where the engine is
    report = build(str(project), "--builder", name)
    cleanup_images.extend(report["tags"])
    assert report["engine"] == "buildx-builder"
    attrs = engine.image_attrs(report["tags"][0])  # the engine fixture names the socket itself
    assert attrs is not None and attrs["Id"] == report["image_id"]
    assert attrs["Config"]["Labels"]["io.imgbuild.cuda.version"] == "12.4.1"
    assert report["labels"]["io.imgbuild.recipe.digest"] == attrs["Config"]["Labels"]["io.imgbuild.recipe.digest"]
    assert report["size_uncompressed"] == sum(report["groups"].values()) > 0


def own_base(engine, base_image: str, folder) -> tuple[str, str]:
    """A base only this test builds on: ``base_image`` plus a file holding a fresh marker, so
    every cache record of the builds above it is this test's alone (other tests and workers
    share the engine and its cache). Tagged debian:bookworm-...: the name tells imgbuild the OS."""
    marker = uuid.uuid4().hex[:16]
    tag = f"debian:bookworm-imgbuild-test-{RUN_MARK}-{marker}"
    folder.mkdir()
    (folder / "Dockerfile").write_text(f"FROM {base_image}\nRUN echo {marker} > /etc/imgbuild-test-marker\n")
    proc = subprocess.run([*engine.buildx, "build", "--network", "host", "--label", f"{RUN_LABEL}={RUN_MARK}",
                           "--output", f"type=docker,name={tag}",
                           str(folder)], capture_output=True, text=True, env=engine.environment(), check=False,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tag, marker


def cache_records(engine) -> list[dict[str, str]]:
    """`docker buildx du --verbose`: one dict per cache record (ID, Parent(s), Description...)."""
    proc = subprocess.run([*engine.buildx, "du", "--verbose"], capture_output=True, text=True,
                          env=engine.environment(), check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    records = []
    for block in proc.stdout.split("\n\n"):
        fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        if "ID" in fields:
            records.append(fields)
    return records


def prune_own_cache(engine, marker: str) -> int:
    """Prune the cache records built on the marker's layer, newest first, one id at a time,
    and nothing else: `docker buildx prune -af` would empty every other worker's cache too
    (and their cache-hit assertions would fail while this test runs). Returns how many."""
    records = cache_records(engine)
    children: dict[str, list[str]] = {}
    for r in records:
        for parent in (r.get("Parent") or r.get("Parents") or "").replace(",", " ").split():
            children.setdefault(parent, []).append(r["ID"])
    order: list[str] = []
    todo = [r["ID"] for r in records if marker in r.get("Description", "")]
    assert todo, f"no cache record of the base marked {marker}"
    while todo:
        rid = todo.pop()
        for child in children.get(rid, []):
            if child not in order:
                order.append(child)
                todo.append(child)
    for rid in reversed(order):  # leaves first: a record with a child is still in use
        proc = subprocess.run([*engine.buildx, "prune", "-af", "--filter", f"id={rid}"], capture_output=True,
                              text=True, env=engine.environment(), check=False, timeout=300)
        assert proc.returncode == 0, proc.stderr
    return len(order)


def test_registry_cache_survives_prune(tmp_path, base_image, logged_in, engine, cleanup_images, registry_refs,
                                       unique_name):
    """After the local cache of this build is pruned, the rebuild takes every step but the app's
    from the registry cache. Only this build's records are pruned (see prune_own_cache)."""
    buildx_only(engine)
    if not engine.containerd_store():
        pytest.skip("the docker driver exports cache only with the containerd image store")
    base, marker = own_base(engine, base_image, tmp_path / "base")
    cleanup_images.append(base)
    project = tmp_path / "project"
    (project / "app").mkdir(parents=True)
    (project / "app" / "main.py").write_text(f"print({unique_name!r})\n")
    recipe = write_recipe(project, RECIPE.format(name=unique_name, base=base))
    cache = f"{logged_in.address}/{unique_name}-cache:buildcache"
    registry_refs.append(cache)
    args = ["--cache-to", f"type=registry,ref={cache},mode=max", "--cache-from", f"type=registry,ref={cache}"]
    # The same base layers also held as zstd (as after test_zstd_oci_provenance_push_and_inspect):
    # an unforced mode=max export walked every mix of the variants and grew dockerd to 23 GB
    # (moby/buildkit#6088); imgbuild forces one compression on it (engine.base.cache_export_value).
    zstd = build(str(recipe), "--compression", "zstd", "--tag", f"{unique_name}:zstd")
    cleanup_images.extend(zstd["tags"])
    first = build(str(recipe), *args)
    cleanup_images.extend(first["tags"])
    cache_index = oci.read_any_manifest(cache)
    assert isinstance(cache_index, oci.Index)
    layer_types = {d.media_type for d in cache_index.manifests if "layer" in d.media_type or "rootfs" in d.media_type}
    assert layer_types and all(t.endswith("gzip") for t in layer_types), layer_types
    for tag in first["tags"]:
        engine.remove(tag)
    pruned = prune_own_cache(engine, marker)
    assert pruned >= first["steps_run"] + first["steps_cached"], pruned  # every step's record, at least
    (project / "app" / "main.py").write_text(f"print({unique_name!r}, 2)\n")
    code, out, err = run_cli("build", str(recipe), *args, "--json", "--progress", "plain", *CA_ARGS)
    assert code == 0, err[-3000:]
    second = json.loads(out)
    # every step but the app's came from the registry cache
    assert second["steps_rerun"] == ["COPY", "WORKDIR"], "\n".join(
        ln for ln in err.splitlines() if "cache" in ln.lower() or "ERROR" in ln)[-3000:]
    assert second["steps_cached"] == first["steps_run"] + first["steps_cached"] - len(second["steps_rerun"])
