"""The SBOM of a pushed image, end to end on each engine (issue 24 item 2): a locked recipe with
the CUDA runtime wheel and a pip pin, built and pushed with auth; `build --push` attaches a
CycloneDX 1.6 SBOM of what the image carries as an OCI 1.1 referrer (the registry here,
distribution 2.8, has no referrers API: the tag schema's sha256-<hex> index lists it), and
`imgbuild sbom`, oras-py and skopeo find it. On the engine with attestations, BuildKit's
provenance is asked for too: it stays in the pushed index beside the SBOM referrer.

Torch itself, with its hash, is checked in test_e2e_torch.py, on the image that test builds."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml
from conftest import SUITE_ENGINES, unavailable
from helpers import CA_ARGS, run_cli, write_recipe

from buildkit_py import oci
from buildkit_py.engine import PROVENANCE

RECIPE = """\
name: {name}
version: "1"
cuda: {{version: "12.4", source: wheels, flavor: base}}
base: {{image: {base}, os: debian12}}
python: "3.11"
pip: ["six==1.16.0"]
"""


@pytest.fixture
def pushed_base(engine, logged_in, base_image, unique_name, cleanup_images, registry_refs):
    """The Debian base pushed to the local registry through the engine under test, so the lock
    pins it by its registry digest and BuildKit pulls it by that digest. (A base only imported
    into an engine cannot be built by digest on Docker 26: see the note in h7-sbom's report.)"""
    ref = f"{logged_in.address}/{unique_name}-base:bookworm-slim"
    engine.tag(base_image, ref)
    cleanup_images.append(ref)
    engine.push(ref)
    registry_refs.append(ref)
    return ref


def build_push(recipe, registry, *args):
    code, out, err = run_cli("build", str(recipe), "--registry", registry, "--push", "--json", "--progress", "quiet",
                             *args, *CA_ARGS)
    assert code == 0, err
    return json.loads(out)


def skopeo(*args: str) -> subprocess.CompletedProcess:
    binary = shutil.which("skopeo")
    if binary is None:
        unavailable("skopeo is not installed (scripts/services.sh up installs it)")
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=120, check=False)


def test_push_attaches_the_sbom_and_other_clients_find_it(tmp_path, engine, logged_in, pushed_base, unique_name,
                                                          docker_client, cleanup_images, registry_refs):
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    reg = logged_in.address
    recipe = write_recipe(tmp_path, RECIPE.format(name=unique_name, base=pushed_base))
    code, _, err = run_cli("lock", str(recipe), *CA_ARGS)
    assert code == 0, err
    assert yaml.safe_load(recipe.with_suffix(".lock").read_text())["variants"]["default"]["bases"]["final"] \
        == {"ref": pushed_base, "digest": oci.fetch_manifest(pushed_base)[1]}
    locked = {p["name"]: p["sha256"] for p in yaml.safe_load(recipe.with_suffix(".lock").read_text())
              ["variants"]["default"]["packages"]["final"]}
    provenance = ["--provenance", "min"] if PROVENANCE in engine.capabilities else []
    ref = f"{reg}/{unique_name}:1"

    first = build_push(recipe, reg, "--no-sbom", *provenance)
    cleanup_images.extend(first["tags"])
    registry_refs.append(ref)
    assert first["sboms"] == []
    code, out, err = run_cli("sbom", ref, "--json")
    assert code == 1 and json.loads(out)["error"] == "SbomError", err
    assert "no SBOM is attached" in err and "--generate --attach" in err

    pushed = build_push(recipe, reg, *provenance)
    top = pushed["pushes"][0]["digest"]
    raw, _, media_type = oci.fetch_manifest(f"{reg}/{unique_name}@{top}")
    # the SBOM's subject is the image's manifest: with provenance the pushed digest is an index
    # of it and its attestation, and the SBOM is the amd64 manifest's (issue 31 item 3)
    digest = oci.select_platform(json.loads(raw), "linux/amd64", ref)["digest"] \
        if media_type in oci.INDEX_TYPES else top
    [attached] = pushed["sboms"]
    assert (attached["subject"], attached["via"], attached["platform"]) == (digest, "tag-schema", "linux/amd64")
    registry_refs.extend([f"{reg}/{unique_name}@{attached['digest']}",
                          f"{reg}/{unique_name}:{attached['fallback_tag']}"])
    if provenance:  # BuildKit's provenance stays: the pushed index still holds its attestation manifest
        index = json.loads(oci.fetch_manifest(ref)[0])
        assert any((m.get("annotations") or {}).get("vnd.docker.reference.type") == "attestation-manifest"
                   for m in index["manifests"])

    out_file = tmp_path / "image.cdx.json"
    code, out, err = run_cli("sbom", ref, "--json", "-o", str(out_file))
    assert code == 0, err
    found = json.loads(out)
    assert (found["subject"], found["sbom"], found["via"]) == (digest, attached["digest"], "tag-schema")
    document = out_file.read_bytes()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(document.decode()) is None
    assert json.loads(document) == found["document"]
    rows = {(c["type"], c["name"]): c for c in found["components"]}
    # read from the image: the CUDA wheel and the pin with the wheels' sha256 from the lock, the OS's packages
    assert rows[("python", "nvidia-cuda-runtime-cu12")]["sha256"] == locked["nvidia-cuda-runtime-cu12"]
    assert rows[("python", "six")]["sha256"] == locked["six"]
    assert rows[("python", "six")]["location"].startswith("/opt/venv/lib/python3.11/site-packages/")
    assert rows[("deb", "libc6")]["arch"] == "amd64" and rows[("deb", "python3.11")]["version"]
    assert rows[("os", "debian")]["version"] == "12"
    assert found["document"]["metadata"]["component"]["version"] == digest

    # the same image read from the engine (a container's file system, never started) lists the same
    code, out, err = run_cli("sbom", ref, "--generate", "--source", "engine", "--lock",
                             str(recipe.with_suffix(".lock")), "--json")
    assert code == 0, err
    local = json.loads(out)
    assert local["source"] == "engine" and local["components"] == found["components"]

    # third-party clients find it by the tag schema: oras-py has no referrers call (0.2.43), so it
    # reads the sha256-<hex> index like any client without the API, then pulls the SBOM blob
    import oras.provider

    oras_reg = oras.provider.Registry(insecure=True, auth_backend="basic")
    oras_reg.login(username=logged_in.user, password=logged_in.password, hostname=reg)
    listed = oras_reg.get_manifest(f"{reg}/{unique_name}:{attached['fallback_tag']}")
    [entry] = [m for m in listed["manifests"] if m.get("artifactType") == "application/vnd.cyclonedx+json"]
    artifact = oras_reg.get_manifest(f"{reg}/{unique_name}@{entry['digest']}")
    assert artifact["subject"]["digest"] == digest
    pulled = oras_reg.download_blob(f"{reg}/{unique_name}", artifact["layers"][0]["digest"],
                                    str(tmp_path / "oras.cdx.json"))
    assert open(pulled, "rb").read() == document  # noqa: PTH123

    # skopeo (no referrers command in 1.9): the tag, the index it names, and the artifact copied out
    creds = ["--creds", f"{logged_in.user}:{logged_in.password}", "--tls-verify=false"]
    tags = skopeo("list-tags", *creds, f"docker://{reg}/{unique_name}")
    assert tags.returncode == 0 and attached["fallback_tag"] in json.loads(tags.stdout)["Tags"], tags.stderr
    raw = skopeo("inspect", "--raw", *creds, f"docker://{reg}/{unique_name}:{attached['fallback_tag']}")
    assert raw.returncode == 0, raw.stderr
    assert [m["digest"] for m in json.loads(raw.stdout)["manifests"]] == [attached["digest"]]
    copied = skopeo("copy", "--src-creds", f"{logged_in.user}:{logged_in.password}", "--src-tls-verify=false",
                    f"docker://{reg}/{unique_name}@{attached['digest']}", f"dir:{tmp_path / 'skopeo'}")
    assert copied.returncode == 0, copied.stderr
    blob = artifact["layers"][0]["digest"].split(":", 1)[1]  # skopeo's dir: layout names blobs by their hex
    assert (tmp_path / "skopeo" / blob).read_bytes() == document


@pytest.mark.parametrize("engine", SUITE_ENGINES[:1], indirect=True)
def test_each_pushed_matrix_variant_gets_its_sbom_with_its_lock_entry(tmp_path, engine, logged_in, pushed_base,
                                                                      unique_name, docker_client, cleanup_images,
                                                                      registry_refs):
    """`build --all --push`: the variants' SBOMs, each with the hashes of its own lock entry.
    One engine: the glue is the CLI's, the engine paths are the test above's."""
    reg = logged_in.address
    recipe = write_recipe(tmp_path, RECIPE.format(name=unique_name, base=pushed_base)
                          + 'matrix:\n  python: ["3.11"]\n  tags: ["{version}-{variant}"]\n')
    code, _, err = run_cli("lock", str(recipe), *CA_ARGS)
    assert code == 0, err
    entry = yaml.safe_load(recipe.with_suffix(".lock").read_text())["variants"]["py311"]
    six = next(p["sha256"] for p in entry["packages"]["final"] if p["name"] == "six")
    code, _, err = run_cli("sign", "--generate-key", str(tmp_path / "team.key"))
    assert code == 0, err
    code, out, err = run_cli("build", str(recipe), "--all", "--registry", reg, "--push", "--json", "--progress",
                             "quiet", "--sign", str(tmp_path / "team.key"), *CA_ARGS)
    assert code == 0, err
    [variant] = json.loads(out)["variants"]
    cleanup_images.extend(variant["tags"])
    registry_refs.extend(variant["tags"])
    [attached] = variant["sboms"]  # two tags, one digest: one SBOM
    assert attached["subject"] == variant["digest"]
    # --sign signs each variant's pushed digest once, however many tags name it (issue 31 item 2)
    assert [s["digest"] for s in variant["signatures"]] == [variant["digest"]]
    code, _, err = run_cli("verify", variant["tags"][1], "--key", str(tmp_path / "team.key.pub"))
    assert code == 0, err
    code, out, err = run_cli("sbom", variant["tags"][0], "--json")
    assert code == 0, err
    rows = {c["name"]: c for c in json.loads(out)["components"] if c["type"] == "python"}
    assert rows["six"]["sha256"] == six
