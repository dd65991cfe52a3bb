"""Shared bases and mirrors against the real registry with htpasswd auth: a base published
by imgbuild, then used by a derived recipe and pinned by digest; a mismatched base refused;
a mirrored base that survives deletion of its upstream tag; a base that cannot be read stops
the plan with the registry's reason."""

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import CA_ARGS, assert_labels_true, free_port, run_cli, write_recipe

from buildkit_py import oci


def build_json(*args):
    code, out, err = run_cli("build", *args, "--json", "--progress", "quiet", *CA_ARGS)
    assert code == 0, err
    return json.loads(out)


def test_shared_base_pinned_by_digest_and_checked(tmp_path, logged_in, base_image, unique_name, docker_client,
                                                  cleanup_images):
    reg = logged_in.address
    base_recipe = write_recipe(tmp_path / "base", f"""\
name: {unique_name}-base
version: "1"
cuda: {{version: "12.4", source: wheels, flavor: base}}
base: {{image: {base_image}}}
python: "3.11"
labels: {{team: platform}}
""")
    base = build_json(str(base_recipe), "--registry", reg, "--push")
    cleanup_images.extend(base["tags"])
    base_ref, base_digest = base["tags"][0], base["pushes"][0]["digest"]

    (tmp_path / "app" / "src").mkdir(parents=True)
    (tmp_path / "app" / "src" / "main.py").write_text("import ctypes; ctypes.CDLL('libcudart.so.12'); print('ok')\n")
    derived = write_recipe(tmp_path / "app", f"""\
name: {unique_name}-app
version: "1"
cuda: {{version: "12.4", source: wheels, flavor: base}}
base: {{image: {base_ref}}}
python: "3.11"
copy: [{{src: src/, dest: /app}}]
entrypoint: ["python", "/app/main.py"]
""")
    code, out, err = run_cli("plan", str(derived), "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["base_image"] == f"{base_ref.rsplit(':', 1)[0]}:1@{base_digest}"
    assert f"FROM {base_ref}@{base_digest} AS final" in plan["dockerfile"]
    assert plan["labels"]["org.opencontainers.image.base.digest"] == base_digest
    assert [s["id"] for s in plan["stages"][-1]["steps"]] == ["ldconfig", "copy-0", "meta"]  # python comes with the base  # noqa: E501

    # The base's labels name its OS everywhere the plan reads them: matrix, lock, build --all.
    code, out, err = run_cli("matrix", str(derived), "--format", "json")
    assert code == 0, err
    assert [v["variant"] for v in json.loads(out)["variants"]] == ["default"], out
    code, out, err = run_cli("lock", str(derived), *CA_ARGS)
    assert code == 0, err
    assert "internal error" not in err and derived.with_suffix(".lock").is_file()

    docker_client.images.remove(base_ref)  # BuildKit must pull the base from the registry, with auth
    app = build_json(str(derived))
    cleanup_images.extend(app["tags"])
    run = subprocess.run(["/usr/bin/docker", "run", "--rm", "--network", "none", app["image_id"]],
                         capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "ok", run.stderr
    labels = docker_client.images.get(app["image_id"]).labels
    assert labels["org.opencontainers.image.base.digest"] == base_digest
    assert labels["team"] == "platform"  # inherited from the base
    # a matrix of one
    code, out, err = run_cli("build", str(derived), "--all", "--json", "--progress", "quiet", *CA_ARGS)
    assert code == 0, err
    cleanup_images.extend(t for v in json.loads(out)["variants"] for t in v["tags"])

    # source: nvidia on the shared base: CUDA, tier and OS come from the base's labels, never guessed,
    # and every label of the image is checked against what is inside it (issue 21: 1)
    on_cuda_base = write_recipe(tmp_path / "nv", f"""\
name: {unique_name}-nv
version: "1"
cuda: {{version: "12.4", source: nvidia, flavor: base}}
base: {{image: {base_ref}}}
python: "3.11"
""")
    nv = build_json(str(on_cuda_base))
    cleanup_images.extend(nv["tags"])
    nv_labels = docker_client.images.get(nv["image_id"]).labels
    assert (nv_labels["io.imgbuild.cuda.version"], nv_labels["io.imgbuild.cuda.source"]) == ("12.4.1", "nvidia")
    assert_labels_true(nv["image_id"], nv_labels)

    mismatched = write_recipe(tmp_path / "bad", f"""\
name: {unique_name}-bad
cuda: {{version: "12.1", source: wheels, flavor: base}}
base: {{image: {base_ref}}}
python: "3.11"
""")
    code, _, err = run_cli("plan", str(mismatched))
    assert code == 2
    assert "the base carries CUDA 12.4.1 but this recipe needs CUDA 12.1" in err and "base.image" in err


def test_mirror_survives_upstream_deletion(tmp_path, logged_in, base_image, unique_name, docker_client,
                                           cleanup_images):
    reg = logged_in.address
    upstream = f"{reg}/{unique_name}/upstream/debian:bookworm-slim"
    docker_client.images.get(base_image).tag(upstream)
    cleanup_images.append(upstream)
    from buildkit_py.engine.kinds.docker_push import push_image

    pushed = push_image(docker_client, upstream)
    mirror_prefix = f"{reg}/{unique_name}/mirror"
    code, out, err = run_cli("mirror", upstream, "--to-mirror", mirror_prefix, "--json")
    assert code == 0, err
    mirrored = json.loads(out)
    assert mirrored["digest"] == pushed.digest
    assert mirrored["dest"] == f"{mirror_prefix}/{unique_name}/upstream/debian:bookworm-slim"
    _, digest, _ = oci.get_manifest(mirrored["dest"])
    assert digest == pushed.digest

    # a base in a registry whose config shows no CUDA cannot be a source: nvidia base (issue 21: 1)
    plain = write_recipe(tmp_path / "plain", f"""\
name: {unique_name}-plain
cuda: {{version: "12.4", source: nvidia}}
base: {{image: {upstream}}}
python: "3.11"
""")
    code, _, err = run_cli("plan", str(plain))
    assert code == 2 and "base.image" in err and "it carries no CUDA" in err, err

    oci.delete_manifest(f"{reg}/{unique_name}/upstream/debian@{pushed.digest}")
    from buildkit_py.errors import RegistryError

    with pytest.raises(RegistryError):  # the upstream tag is gone
        oci.get_manifest(upstream)
    recipe = write_recipe(tmp_path, f"""\
name: {unique_name}-mirrored
cuda: {{version: "12.4", source: wheels, flavor: base}}
base: {{image: {upstream}, mirror: {mirror_prefix}, os: debian12}}
python: "3.11"
""")
    code, out, err = run_cli("plan", str(recipe), "--json")
    assert code == 0, err
    assert json.loads(out)["base_image"] == f"{mirrored['dest']}@{pushed.digest}"
    report = build_json(str(recipe))
    cleanup_images.extend(report["tags"])
    assert docker_client.images.get(report["image_id"]).labels["io.imgbuild.cuda.version"] == "12.4.1"


def test_mirror_usage_errors():
    assert run_cli("mirror", "a/b:1")[0] == 2
    assert run_cli("mirror", "a/b:1", "c/d:1", "--to-mirror", "r/m")[0] == 2
    code, _, err = run_cli("mirror", "a/b:1", "c/d:1", "--platform", "linux")
    assert code == 2 and "not OS/ARCH" in err
    code, _, err = run_cli("mirror", "a/b:1", "c/d:1", "--platform", "linux/amd64", "--all-platforms")
    assert code == 2 and "contradict" in err


def test_run_pulls_weights_once_and_mounts_them_read_only(tmp_path, logged_in, base_image, unique_name,
                                                          cleanup_images):
    import sys

    reg = logged_in.address
    weights_src = tmp_path / "weights-src"
    (weights_src / "tokenizer").mkdir(parents=True)
    (weights_src / "model.safetensors").write_bytes(os.urandom(3 * 2**20))
    (weights_src / "tokenizer" / "vocab.json").write_text('{"hello": 1}')
    ref = f"{reg}/{unique_name}/weights:1"
    code, out, err = run_cli("weights", "push", str(weights_src), ref, "--json")
    assert code == 0, err
    # sizes in sizes.py's units everywhere, never raw byte counts (issue 22: 9)
    code, out, err = run_cli("weights", "ls", ref)
    assert code == 0, err
    assert [line.split()[:2] + line.split()[3:] for line in out.splitlines()] == [
        ["3.0", "MiB", "model.safetensors"], ["12", "B", "tokenizer/vocab.json"]]
    code, out, err = run_cli("weights", "push", str(weights_src), ref)
    assert code == 0 and out.startswith("pushed 2 files (0 B uploaded): "), err
    code, out, err = run_cli("weights", "pull", ref, str(tmp_path / "pulled"), "--progress", "plain")
    assert code == 0 and out == f"2 files in {tmp_path / 'pulled'}: 3.0 MiB downloaded, 0 already present\n", err
    assert "download model.safetensors 100% (3.0 MiB of 3.0 MiB)" in err and "bytes" not in err

    recipe = write_recipe(tmp_path / "app", f"""\
name: {unique_name}-run
cuda: {{version: "12.4", source: wheels, flavor: base}}
base: {{image: {base_image}}}
python: "3.11"
weights: [{{ref: "{ref}", mount: /models/tiny}}]
""")
    report = build_json(str(recipe))
    cleanup_images.extend(report["tags"])
    image = report["tags"][0]
    cmd = [sys.executable, "-m", "buildkit_py", "run", image, "--weights-dir", str(tmp_path / "vol"),
           "--network", "none", "--", "sh", "-c",
           "cat /models/tiny/tokenizer/vocab.json; echo; touch /models/tiny/x 2>/dev/null && echo writable || echo read-only"]  # noqa: E501
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == ['{"hello": 1}', "read-only"]
    assert "weights " + f"{ref}: 3.0 MiB downloaded, 0 files already present" in first.stderr
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert second.returncode == 0, second.stderr
    assert "0 B downloaded, 2 files already present" in second.stderr
    assert (tmp_path / "vol").is_dir() and "model.safetensors" not in json.dumps(
        subprocess.run(["/usr/bin/docker", "history", "--no-trunc", image], capture_output=True, text=True).stdout)


def _base_recipe(folder: Path, image: str, extra: str = "") -> Path:
    return write_recipe(folder, f"""\
name: app
version: "1"
cuda: {{version: "12.4.1", source: wheels}}
base:
  image: {image}
{extra}python: "3.11"
""")


@pytest.mark.parametrize("os_line", ["", "  os: debian12\n"], ids=["no-os", "base.os"])
def test_unreadable_base_says_the_registrys_reason_first(tmp_path, logged_in, unique_name, os_line):
    """Issue 22 item 2: a base the registry could not give (wrong credentials, missing tag) was
    refused with "cannot tell which OS; set base.os", and once base.os was set the real reason
    was only a warning and the plan passed. Now the registry's reason comes first: exit 2 at
    base.image (file:line) for a missing tag, exit 3 for credentials or an unreachable registry."""
    missing = f"{logged_in.address}/{unique_name}/team-base:nope"
    recipe = _base_recipe(tmp_path, missing, os_line)
    code, out, err = run_cli("plan", str(recipe), "--json")
    assert code == 2, err
    assert err.startswith(f"imgbuild: error: {recipe}:5: base.image: the base image {missing} is not in its "
                          "registry (MANIFEST_UNKNOWN: manifest unknown)"), err
    assert "cannot tell which OS" not in err
    doc = json.loads(out)
    assert (doc["error"], doc["exit_code"]) == ("BaseImageNotFound", 2)
    assert [(i["line"], i["key"]) for i in doc["issues"]] == [(5, "base.image")]

    (tmp_path / "wrong").mkdir()
    (tmp_path / "wrong" / "config.json").write_text(json.dumps({"auths": {logged_in.address: {
        "auth": base64.b64encode(f"{logged_in.user}:wrong-{logged_in.password}".encode()).decode()}}}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DOCKER_CONFIG", str(tmp_path / "wrong"))
        code, _, err = run_cli("plan", str(recipe))
    assert code == 3, err
    assert err.startswith(f"imgbuild: error: cannot read the base image {missing} ({recipe}:5: base.image): "
                          f"registry {logged_in.address} rejected the credentials of 'ci'"), err
    assert "cannot tell which OS" not in err and "wrong-" not in err

    closed = free_port()  # a port nothing listens on
    code, _, err = run_cli("plan", str(_base_recipe(tmp_path / "down", f"127.0.0.1:{closed}/team/base:1", os_line)))
    assert code == 3, err
    assert "cannot reach registry" in err and "cannot tell which OS" not in err


def test_base_missing_from_the_mirror_names_base_mirror_and_how_to_fill_it(tmp_path, logged_in, unique_name):
    mirror = f"{logged_in.address}/{unique_name}/mirror"
    recipe = _base_recipe(tmp_path, "ghcr.io/team/base:1", f"  mirror: {mirror}\n  os: debian12\n")
    code, _, err = run_cli("plan", str(recipe))
    assert code == 2, err
    assert f"{recipe}:6: base.mirror: the base image {mirror}/team/base:1 is not in its registry" in err
    assert f"hint: copy it into the mirror first: imgbuild mirror ghcr.io/team/base:1 --to-mirror {mirror}" in err
