"""Secrets (issue #8): the registry password, a registry identity token, the CA bundle and pip
index credentials never appear in a layer, the image config or history, the rendered
Dockerfile, build args, labels, the registry's copy, or any output. One build uses all of
them; then the saved image and every output are scanned for each canary."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import tarfile
import uuid

from conftest import unavailable
from helpers import run_cli, write_recipe
from pyindex import LocalIndex

from buildkit_py import oci

CA = "/etc/ssl/certs/ca-certificates.crt"
RECIPE = """\
name: {name}
version: "1.0"
cuda:
  version: "12.4"
  source: wheels
  flavor: base  # a CUDA step with the secrets mounted, without the runtime tier's ~2 GB of wheels
base:
  image: {base}
python: "3.11"
pip: ["{probe}==1.0"]
"""


def _canary_cert(tmp_path) -> tuple[str, str]:
    """A CA bundle: the system one plus a fresh self-signed cert (the canary: its base64)."""
    key, crt = tmp_path / "canary.key", tmp_path / "canary.crt"
    out = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                          "-out", str(crt), "-days", "1", "-subj", f"/CN=imgbuild-canary-{uuid.uuid4().hex[:8]}"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        unavailable(f"openssl cannot make a cert: {out.stderr}")
    pem = crt.read_text()
    bundle = tmp_path / "bundle.pem"
    bundle.write_text((open(CA).read() if os.path.exists(CA) else "") + pem)
    body = "".join(pem.strip().splitlines()[1:-1])
    return str(bundle), body[40:100]  # a piece of the cert's base64 no other cert has


def _variants(secret: str) -> set[str]:
    b = secret.encode()
    return {secret, base64.b64encode(b).decode().rstrip("="), b.hex()}


def test_no_secret_reaches_image_registry_or_output(tmp_path, docker_client, base_image, registry, docker_config,
                                                    cleanup_images, unique_name, monkeypatch):
    bundle, cert_canary = _canary_cert(tmp_path)
    pip_token = "pypi-CANARY" + uuid.uuid4().hex
    identity_token = "idtok-CANARY" + uuid.uuid4().hex
    # A private index that wants a token: the installer (uv by default) must read it from the
    # pip.conf secret and send it, and nothing may keep it.
    probe = f"imgbuild-secret-probe-{uuid.uuid4().hex[:8]}"  # only this index has it
    pip_conf = tmp_path / "secrets" / "pip.conf"
    pip_conf.parent.mkdir()
    # A docker config with an identity token for another registry (must not leak either) ...
    (docker_config / "config.json").write_text(json.dumps(
        {"auths": {"registry.example.com": {"identitytoken": identity_token}}}))
    # ... and the real registry's password from the CI environment.
    monkeypatch.setenv("IMGBUILD_REGISTRY_USER", registry.user)
    monkeypatch.setenv("IMGBUILD_REGISTRY_PASSWORD", registry.password)
    monkeypatch.setenv("IMGBUILD_REGISTRY_HOST", registry.address)
    recipe = write_recipe(tmp_path / "project", RECIPE.format(name=unique_name, base=base_image, probe=probe))

    outputs: dict[str, str] = {}
    code, out, err = run_cli("plan", str(recipe), "--json", "--registry", registry.address)
    assert code == 0, err
    outputs["plan"] = out + err
    with LocalIndex(tmp_path / "index") as index:
        index.add_wheel(probe, "1.0")
        pip_conf.write_text(f"[global]\nextra-index-url = {index.url.replace('http://', f'http://__token__:{pip_token}@')}\n"
                            "trusted-host = 127.0.0.1\n")
        code, out, err = run_cli("build", str(recipe), "--registry", registry.address, "--push", "--json",
                                 "--progress", "plain", "--ca-cert", bundle, "--pip-config", str(pip_conf),
                                 "--no-cache")  # every step runs with the secrets, on every run
    outputs["build"] = out + err
    assert code == 0, err[-4000:]
    report = json.loads(out)
    cleanup_images.extend(report["tags"])
    # the installer read the index and its token from the secret
    assert f"/simple/{probe}/" in index.requests, index.requests
    sent = base64.b64encode(f"__token__:{pip_token}".encode()).decode()
    assert f"Basic {sent}" in index.authorizations, index.authorizations

    image_id = report["image_id"]
    attrs = docker_client.images.get(image_id).attrs
    outputs["inspect"] = json.dumps(attrs)
    outputs["history"] = json.dumps(docker_client.api.history(image_id))
    ref = report["tags"][0]
    outputs["registry-manifest"] = json.dumps(oci.get_manifest(ref)[0])
    outputs["registry-config"] = json.dumps(oci.get_image_config(ref))
    code, out, err = run_cli("inspect", image_id, "--json", "--no-compressed")
    outputs["inspect-cli"] = out + err

    saved = tmp_path / "image.tar"
    with saved.open("wb") as f:
        for chunk in docker_client.images.get(image_id).save(named=True):
            f.write(chunk)
    # every member of the saved image, layer tars opened too
    blobs: dict[str, bytes] = {}
    with tarfile.open(saved) as outer:
        for m in outer.getmembers():
            if not m.isfile():
                continue
            data = outer.extractfile(m).read()
            blobs[m.name] = data
            # layer tars: <v1>/layer.tar on 20.10; gzip blobs without a suffix in the containerd
            # store's OCI layout
            if m.name.endswith(".tar") or m.name.startswith("blobs/"):
                import io

                try:
                    layer = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
                except tarfile.ReadError:
                    continue  # a config, manifest or index: kept whole above
                with layer:
                    for lm in layer.getmembers():
                        blobs[f"{m.name}!{lm.name}"] = lm.name.encode() + (
                            layer.extractfile(lm).read() if lm.isfile() else lm.linkname.encode())

    canaries = {"registry password": registry.password, "pip token": pip_token, "pip credential": sent,
                "identity token": identity_token,
                "CA bundle cert": cert_canary}
    assert len(blobs) > 10
    module = probe.replace("-", "_")
    assert any(n.endswith(f"site-packages/{module}/__init__.py") for n in blobs), "the scan must see the layers' files"
    for what, secret in canaries.items():
        for variant in _variants(secret):
            for name, text in outputs.items():
                assert variant not in text, f"{what} in {name}"
            for name, data in blobs.items():
                assert variant.encode() not in data, f"{what} in the saved image: {name}"
    # no secret file or path in the image either
    names = " ".join(blobs)
    assert "pip.conf" not in names and "bundle.pem" not in names and "/run/secrets/" not in names
    labels = attrs["Config"]["Labels"]
    assert not any("secret" in k.lower() or "token" in k.lower() for k in labels)
