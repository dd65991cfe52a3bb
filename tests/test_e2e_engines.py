"""End to end on each engine (classic 20.10, and Docker 26 + buildx + the containerd store):
the digest printed after a push is the registry's, for one tag and several; buildx output
options (zstd, OCI media types, provenance) land in the registry as asked and the classic
client refuses them before building; registry cache survives `docker buildx prune -af`. (The
bake folder `imgbuild matrix --format bake -o DIR` writes is built for real in test_e2e_matrix.)"""

import json
import subprocess

import pytest
from helpers import CA_ARGS, run_cli, write_recipe

from buildkit_py import oci

RECIPE = """\
name: {name}
version: "1.0"
cuda: {{version: "12.4", source: wheels}}
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
    if engine.kind == "classic":
        pytest.skip("a buildx feature; test_classic_refuses_buildx_options covers the classic client")


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


def test_registry_cache_survives_prune(project, logged_in, engine, cleanup_images, unique_name):
    buildx_only(engine)
    if not engine.containerd_store():
        pytest.skip("the docker driver exports cache only with the containerd image store")
    cache = f"{logged_in.address}/{unique_name}-cache:buildcache"
    args = ["--cache-to", f"type=registry,ref={cache},mode=max", "--cache-from", f"type=registry,ref={cache}"]
    first = build(str(project), *args)
    cleanup_images.extend(first["tags"])
    pruned = subprocess.run([*engine.buildx, "prune", "-af"], capture_output=True, text=True,
                            env=engine.environment(), check=False, timeout=600)
    assert pruned.returncode == 0, pruned.stderr
    for tag in first["tags"]:
        engine.remove(tag)
    (project.parent / "app" / "main.py").write_text(f"print({unique_name!r}, 2)\n")
    code, out, err = run_cli("build", str(project), *args, "--json", "--progress", "plain", *CA_ARGS)
    assert code == 0, err[-3000:]
    second = json.loads(out)
    # every step but the app's came from the registry cache
    assert second["steps_rerun"] == ["COPY", "WORKDIR"], "\n".join(
        ln for ln in err.splitlines() if "cache" in ln.lower() or "ERROR" in ln)[-3000:]
    assert second["steps_cached"] == first["steps_run"] + first["steps_cached"] - len(second["steps_rerun"])
