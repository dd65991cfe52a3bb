"""imgbuild diff against the real registry (htpasswd auth) and engine: two small images that
differ only in their last layer, checked against what `docker pull` itself reports."""

import gzip
import io
import json
import subprocess
import tarfile
import uuid

from helpers import run_cli

from buildkit_py import oci

DOCKERFILE = """\
FROM {base}
RUN : imgbuild-step=pins; head -c 3000000 /dev/urandom > /big
COPY v.txt /app/v.txt
"""
GZIP_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"


def build_and_push(tmp_path, base: str, ref: str, cleanup: list) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(DOCKERFILE.format(base=base))
    (ctx / "v.txt").write_text("1")
    env = {"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin", "DOCKER_CONFIG": str(tmp_path / "docker-config")}
    subprocess.run(["/usr/bin/docker", "build", "-q", "--network", "host", "-t", ref, str(ctx)], check=True,
                   capture_output=True, env=env)
    cleanup.append(ref)
    subprocess.run(["/usr/bin/docker", "push", "-q", ref], check=True, capture_output=True, env=env)


def gzip_layer(files: dict[str, bytes]) -> tuple[bytes, str, int]:
    """(gzip blob, diff id, tar bytes) of a layer tar holding ``files``."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    tar_bytes = raw.getvalue()
    return gzip.compress(tar_bytes, compresslevel=6, mtime=0), oci.sha256_bytes(tar_bytes), len(tar_bytes)


def push_remote_image(ref: str, layers: list[tuple[str, dict[str, bytes]]],
                      base: str | None = None) -> list[tuple[int, int]]:
    """Push an image made here with the registry API, as if built on another machine: this
    engine has never seen its new layers (a local build would leave them in BuildKit's cache,
    and `docker pull` would then find them without downloading). Returns (compressed, unpacked)
    bytes of each new layer."""
    client = oci.Client()
    if base:
        manifest = oci.get_manifest(base, client=client)[0]
        config = oci.get_image_config(base, client=client)
    else:
        manifest = {"schemaVersion": 2, "layers": []}
        config = {"architecture": "amd64", "os": "linux", "config": {}, "history": [],
                  "rootfs": {"type": "layers", "diff_ids": []}}
    sizes = []
    for created_by, files in layers:
        blob, diff_id, tar_size = gzip_layer(files)
        digest = oci.upload_bytes(ref, blob, client=client).digest
        manifest["layers"].append({"mediaType": GZIP_LAYER, "digest": digest, "size": len(blob)})
        config["rootfs"]["diff_ids"].append(diff_id)
        config["history"].append({"created_by": created_by})
        sizes.append((len(blob), tar_size))
    raw = oci.canonical_json(config)
    config_digest = oci.upload_bytes(ref, raw, client=client).digest
    manifest["config"] = {"mediaType": oci.MEDIA_DOCKER_CONFIG, "digest": config_digest, "size": len(raw)}
    manifest["mediaType"] = oci.MEDIA_DOCKER_MANIFEST
    oci.put_manifest(ref, manifest, oci.MEDIA_DOCKER_MANIFEST, client=client)
    return sizes


FETCHED = {"Downloading", "Download complete", "Verifying Checksum", "Pull complete"}


def pulled_blobs(docker_client, ref: str) -> set[str]:
    """The short ids of the blobs the engine downloaded while pulling ``ref``. The classic store
    says "Already exists" for a layer it has; the containerd store does not mention it."""
    from buildkit_py.registry import auth_config_for

    repo, _, tag = ref.rpartition(":")
    statuses: dict[str, set[str]] = {}
    for ev in docker_client.api.pull(repo, tag=tag, stream=True, decode=True, auth_config=auth_config_for(ref)):
        assert "error" not in ev, ev
        if ev.get("id") and ev.get("status"):
            statuses.setdefault(ev["id"], set()).add(ev["status"])
    return {k for k, v in statuses.items() if v & FETCHED and "Already exists" not in v}


def test_diff_matches_what_docker_pull_downloads(tmp_path, logged_in, base_image, docker_client, cleanup_images):
    name = f"{logged_in.address}/imgbuild-test/diff-{uuid.uuid4().hex[:8]}"
    a, b = f"{name}:a", f"{name}:b"
    build_and_push(tmp_path, base_image, a, cleanup_images)
    app = {"/app/main.py": b"print('v2')\n" * 1000}
    [(new_compressed, new_size)] = push_remote_image(b, [("COPY app/ /app # buildkit", app)], base=a)

    code, out, err = run_cli("diff", a, b, "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["schema"] == 1 and d["a"]["source"] == d["b"]["source"] == "registry"
    assert [(x["status"], x["step"]) for x in d["layers"]] == [
        ("shared", None), ("shared", "pins"), ("shared", "copy-0"), ("new", "copy-1")]
    manifest, _, _ = oci.get_manifest(b)
    assert d["totals"]["compressed_size"] == sum(x["size"] for x in manifest["layers"])
    assert d["totals"]["new_compressed_size"] == new_compressed and d["totals"]["new_layers"] == 1
    assert d["layers"][3]["size"] == d["totals"]["new_size"] == new_size  # B's blobs were streamed and counted

    # A node that pulled A (on the containerd store a layer built here and pushed is not in the
    # content store as the pushed blob until pulled) and not B: docker pull of B fetches exactly
    # the layers diff calls new.
    pulled_blobs(docker_client, a)
    cleanup_images.append(b)
    fetched = pulled_blobs(docker_client, b)
    short = {x["digest"].split(":")[1][:12]: x["status"] for x in d["layers"]}
    assert {k for k in fetched if k in short} == {k for k, status in short.items() if status == "new"}, fetched

    # Read from the engine (no blobs there): the same layers, matched by diff id, sizes the engine's.
    code, out, err = run_cli("diff", a, b, "--json", "--source", "engine")
    assert code == 0, err
    local = json.loads(out)
    assert [x["status"] for x in local["layers"]] == [x["status"] for x in d["layers"]]
    assert {x["matched_by"] for x in local["layers"][:3]} == {"diff-id"}
    # The engine's own counts (content bytes on the classic store, snapshot usage on containerd's).
    assert all(x["size"] > 0 and x["compressed_size"] is None for x in local["layers"])

    code, out, _ = run_cli("diff", a, b)
    assert code == 0 and "to download: 1 of 4 layers" in out and "copy-1" in out


def test_diff_of_a_missing_image_is_an_error(logged_in, unique_name):
    code, _, err = run_cli("diff", f"{logged_in.address}/{unique_name}:a", f"{logged_in.address}/{unique_name}:b")
    assert code != 0 and "Traceback" not in err and err.strip()
