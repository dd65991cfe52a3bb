"""Signatures in cosign's format (issue 31 item 2), against the real registry: what `imgbuild sign`
writes (the payload byte for byte, the tag, the layer and its annotation), verification under
the right key, another key and none, an index and its platforms, keys refused with a hint, a
recipe's base.verify before building; and `mirror` taking an image's referrers with it (item 3).
The cosign and oras CLIs themselves are in test_e2e_signing.py."""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
from pathlib import Path

import pytest
from helpers import run_cli, write_recipe

from buildkit_py import oci
from buildkit_py.errors import SignatureError, UsageError
from buildkit_py.oci import signatures as sig
from buildkit_py.pipeline import OFFLINE


@pytest.fixture
def client(registry_client):
    return registry_client


@pytest.fixture
def keys(tmp_path):
    """Two key pairs: the team's and someone else's."""
    team = sig.generate_key(tmp_path / "team.key")
    other = sig.generate_key(tmp_path / "other.key")
    return {"team": team, "other": other}


def push_image(client, ref: oci.Reference, arch: str) -> tuple[str, int]:
    """A small image (one layer) by digest: (digest, manifest size)."""
    layer = oci.upload_bytes(ref, f"layer of {arch} {ref.repository}".encode(), client=client)
    config = oci.upload_bytes(ref, oci.canonical_json({"architecture": arch, "os": "linux", "config": {},
                                                       "rootfs": {"type": "layers", "diff_ids": [layer.digest]}}),
                              client=client)
    raw = oci.canonical_json({"schemaVersion": 2, "mediaType": oci.MEDIA_OCI_MANIFEST,
                              "config": {"mediaType": oci.MEDIA_OCI_CONFIG, "digest": config.digest,
                                         "size": config.size},
                              "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer.digest,
                                          "size": layer.size}]})
    return oci.put_manifest(ref.with_tag(None).with_digest(oci.sha256_bytes(raw)), raw, client=client), len(raw)


def push_index(client, ref: oci.Reference) -> tuple[str, dict[str, str]]:
    """amd64 and arm64 under one index tagged ``ref``, plus a BuildKit attestation manifest."""
    entries, platforms = [], {}
    for arch in ("amd64", "arm64"):
        digest, size = push_image(client, ref, arch)
        platforms[f"linux/{arch}"] = digest
        entries.append({"mediaType": oci.MEDIA_OCI_MANIFEST, "digest": digest, "size": size,
                        "platform": {"os": "linux", "architecture": arch}})
    att, att_size = push_image(client, ref, "unknown")
    entries.append({"mediaType": oci.MEDIA_OCI_MANIFEST, "digest": att, "size": att_size,
                    "platform": {"os": "unknown", "architecture": "unknown"},
                    "annotations": {"vnd.docker.reference.type": "attestation-manifest",
                                    "vnd.docker.reference.digest": platforms["linux/amd64"]}})
    index = oci.put_manifest(ref, {"schemaVersion": 2, "mediaType": oci.MEDIA_OCI_INDEX, "manifests": entries},
                             client=client)
    return index, platforms


def test_sign_writes_cosigns_format(client, registry, unique_name, keys):
    ref = oci.parse_reference(registry.repo(unique_name) + ":1")
    digest, _ = push_image(client, ref, "amd64")
    oci.put_manifest(ref, oci.fetch_manifest(ref.with_digest(digest), client=client)[0], client=client)
    [signed] = sig.sign_image(ref, sig.load_signing_key(keys["team"][0]), client=client)
    assert (signed.digest, signed.platform, signed.signatures) == (digest, None, 1)
    assert signed.tag == "sha256-" + digest.removeprefix("sha256:") + ".sig"

    raw, _, media_type = oci.fetch_manifest(ref.with_tag(signed.tag), client=client)
    manifest = json.loads(raw)
    assert media_type == oci.MEDIA_OCI_MANIFEST and manifest["config"]["mediaType"] == oci.MEDIA_OCI_CONFIG
    [layer] = manifest["layers"]
    assert layer["mediaType"] == "application/vnd.dev.cosign.simplesigning.v1+json"
    payload = oci.read_blob(ref, layer["digest"], client=client)
    # byte for byte what cosign signs (Go's encoding/json: no spaces, this key order)
    assert payload == (f'{{"critical":{{"identity":{{"docker-reference":"{registry.address}/{unique_name}"}},'
                       f'"image":{{"docker-manifest-digest":"{digest}"}},'
                       '"type":"cosign container image signature"},"optional":null}').encode()
    config = json.loads(oci.read_blob(ref, manifest["config"]["digest"], client=client))
    assert config["rootfs"]["diff_ids"] == [layer["digest"]]  # go-containerregistry reads layers by them
    # ECDSA P-256 over SHA-256 of the payload, DER, base64: checked with the public key directly
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    public = sig.load_verifying_key(keys["team"][1]).key
    public.verify(base64.b64decode(layer["annotations"]["dev.cosignproject.cosign/signature"]), payload,
                  ec.ECDSA(hashes.SHA256()))

    [ok] = sig.verify_image(ref, sig.load_verifying_key(keys["team"][1]), client=client)
    assert ok.verified and ok.signatures == 1
    [refused] = sig.verify_image(ref, sig.load_verifying_key(keys["other"][1]), client=client)
    assert not refused.verified and "signed by another key" in refused.reason

    # a second key's signature is appended: both verify, each under its own key
    [again] = sig.sign_image(ref, sig.load_signing_key(keys["other"][0]), client=client)
    assert again.signatures == 2
    for name in ("team", "other"):
        assert sig.verify_image(ref, sig.load_verifying_key(keys[name][1]), client=client)[0].verified
    # signing again with the same key lists nothing twice (ECDSA signatures differ each time: a
    # new layer annotation, so one more entry; the payload blob is shared)
    assert sig.sign_image(ref, sig.load_signing_key(keys["team"][0]), client=client)[0].signatures == 3


def test_an_unsigned_image_and_a_signature_of_another_digest_are_refused(client, registry, unique_name, keys):
    ref = oci.parse_reference(registry.repo(unique_name) + ":1")
    digest, _ = push_image(client, ref, "amd64")
    other, _ = push_image(client, ref, "arm64")
    oci.put_manifest(ref, oci.fetch_manifest(ref.with_digest(digest), client=client)[0], client=client)
    public = sig.load_verifying_key(keys["team"][1])
    [unsigned] = sig.verify_image(ref, public, client=client)
    assert not unsigned.verified and unsigned.signatures == 0 and "no signature" in unsigned.reason
    # a valid signature of another digest copied under this digest's tag: the claim names the other
    key = sig.load_signing_key(keys["team"][0])
    sig.sign_manifest(ref, other, key, client=client)
    moved = oci.fetch_manifest(ref.with_tag(sig.signature_tag(other)), client=client)[0]
    oci.put_manifest(ref.with_tag(sig.signature_tag(digest)), moved, client=client)
    [wrong] = sig.verify_image(ref, public, client=client)
    assert not wrong.verified and f"a signature of another digest ({other})" in wrong.reason


def test_an_index_and_each_platform_are_signed_and_verified(client, registry, unique_name, keys):
    ref = oci.parse_reference(registry.repo(unique_name) + ":1")
    index, platforms = push_index(client, ref)
    signed = sig.sign_image(ref, sig.load_signing_key(keys["team"][0]), client=client)
    # the attestation manifest is no image: not signed
    assert [(s.platform, s.digest) for s in signed] == [(None, index), *platforms.items()]
    public = sig.load_verifying_key(keys["team"][1])
    assert [(r.platform, r.verified) for r in sig.verify_image(ref, public, client=client)] == [
        (None, True), ("linux/amd64", True), ("linux/arm64", True)]
    # what a node that pulled arm64 holds: the platform's digest, verified on its own
    [arm] = sig.verify_image(ref.with_tag(None).with_digest(platforms["linux/arm64"]), public, client=client)
    assert arm.verified and arm.platform is None

    code, out, err = run_cli("verify", str(ref), "--key", str(keys["other"][1]), "--json")
    assert code == 1 and json.loads(out)["verified"] is False, err
    code, out, err = run_cli("verify", str(ref), "--key", str(keys["other"][1]))
    assert code == 1 and "is not signed by" in err and "signed by another key" in err
    assert "refused  index" in out and "hint:" in err
    code, out, err = run_cli("verify", str(ref), "--key", str(keys["team"][1]))
    assert code == 0, err
    assert out.splitlines()[0].startswith(f"verified index {index}")


def test_keys(tmp_path, keys):
    private, public = keys["team"]
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert private.read_text().startswith("-----BEGIN PRIVATE KEY-----")  # PKCS#8
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    with pytest.raises(UsageError, match="exists"):
        sig.generate_key(private)  # a key is never replaced
    cosign_key = tmp_path / "cosign.key"
    cosign_key.write_text("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\neyJrZGYiOnt9fQ==\n"
                          "-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n")
    with pytest.raises(UsageError, match="is not a cosign key this reads") as err:
        sig.load_signing_key(cosign_key)
    with pytest.raises(UsageError, match="is a private key: verify with its public key"):
        sig.load_verifying_key(private)
    with pytest.raises(UsageError, match="is not a PEM private key"):
        sig.load_signing_key(public)
    with pytest.raises(UsageError, match="no such file"):
        sig.load_signing_key(tmp_path / "missing.key")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    p384 = tmp_path / "p384.key"
    p384.write_bytes(ec.generate_private_key(ec.SECP384R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    with pytest.raises(UsageError, match="not an EC P-256 key"):
        sig.load_signing_key(p384)
    # SEC1, as `openssl ecparam -name prime256v1 -genkey -noout` writes it
    sec1 = tmp_path / "sec1.key"
    sec1.write_bytes(sig.load_signing_key(private).key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()))
    assert sec1.read_text().startswith("-----BEGIN EC PRIVATE KEY-----")
    assert sig.load_signing_key(sec1).public_pem() == public.read_bytes()
    # an encrypted PEM key (openssl pkcs8 -topk8 -v2 aes256) with its password
    locked = tmp_path / "locked.key"
    locked.write_bytes(sig.load_signing_key(private).key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"s3cret")))
    with pytest.raises(UsageError, match="key is encrypted") as err:
        sig.load_signing_key(locked)
    assert "IMGBUILD_KEY_PASSWORD" in (err.value.hint or "")
    assert sig.load_signing_key(locked, b"s3cret").public_pem() == public.read_bytes()


COSIGN_FIXTURE = Path(__file__).parent / "fixtures" / "cosign"


def test_cosigns_own_key_file_is_read(monkeypatch):
    """cosign.key as `cosign generate-key-pair` wrote it (scrypt, NaCl secretbox, PKCS#8 inside):
    opened with its password, it is the private half of cosign.pub; a wrong password, or no
    PyNaCl, is a usage error saying what to do."""
    key = sig.load_signing_key(COSIGN_FIXTURE / "cosign.key", b"imgbuild-test")
    public = sig.load_verifying_key(COSIGN_FIXTURE / "cosign.pub").key
    assert key.key.public_key().public_numbers() == public.public_numbers()
    payload = sig.simple_signing_payload("r/x", "sha256:" + "0" * 64)
    assert sig.payload_verifies(sig.VerifyingKey(COSIGN_FIXTURE, public), payload, sig.sign_payload(key, payload))
    with pytest.raises(UsageError, match="the password does not open this cosign key") as err:
        sig.load_signing_key(COSIGN_FIXTURE / "cosign.key", b"wrong")
    assert "COSIGN_PASSWORD" in (err.value.hint or "")
    monkeypatch.setitem(sys.modules, "nacl.secret", None)  # PyNaCl not installed
    with pytest.raises(UsageError, match="needs PyNaCl") as err:
        sig.load_signing_key(COSIGN_FIXTURE / "cosign.key", b"imgbuild-test")
    assert "imgbuild[cosign]" in (err.value.hint or "")


def test_the_cli_reads_cosigns_password_variable(monkeypatch, tmp_path):
    from buildkit_py.cli.sign import signing_key

    monkeypatch.delenv("IMGBUILD_KEY_PASSWORD", raising=False)
    monkeypatch.setenv("COSIGN_PASSWORD", "imgbuild-test")
    assert signing_key(COSIGN_FIXTURE / "cosign.key").key.curve.name == "secp256r1"
    monkeypatch.setenv("COSIGN_PASSWORD", "")  # as cosign users set it: a plain PEM key still loads
    private, _ = sig.generate_key(tmp_path / "plain.key")
    assert signing_key(private).path == private


def test_cli_usage(tmp_path, keys):
    code, out, err = run_cli("sign", "--generate-key", str(tmp_path / "k"), "--json")
    assert code == 0 and json.loads(out) == {"schema": 1, "key": str(tmp_path / "k"),
                                             "public_key": str(tmp_path / "k.pub")}, err
    code, _, err = run_cli("sign", "team/app:1", "--key", str(keys["team"][0]))
    assert code == 2 and "names no registry" in err
    code, _, err = run_cli("sign", "127.0.0.1:5000/team/app:1")
    assert code == 2 and "sign needs IMAGE and --key KEY" in err
    recipe = write_recipe(tmp_path, "name: team/x\ncuda: {version: '12.4'}\npython: '3.11'\n")
    code, _, err = run_cli("build", str(recipe), "--sign", str(keys["team"][0]))
    assert code == 2 and "--sign signs the pushed image: use it with --push" in err
    # a key that cannot sign is refused before the engine or the registry is asked (127.0.0.1:1 answers
    # nothing: reaching it would be exit 3)
    code, _, err = run_cli("build", str(recipe), "--push", "--sign", str(keys["team"][1]), "--engine", "podman",
                           "--registry", "127.0.0.1:1")
    assert code == 2 and "is not a PEM private key" in err, err


BASE_RECIPE = """\
name: team/app
version: "1"
cuda: {{version: "12.4", source: wheels, flavor: base}}
base: {{image: {base}, os: debian12, verify: {key}}}
python: "3.11"
"""


def test_base_verify_refuses_an_unsigned_base_before_building(client, registry, unique_name, keys, tmp_path,
                                                              monkeypatch):
    from buildkit_py import pipeline
    from buildkit_py.errors import RecipeError
    from buildkit_py.pipeline.bases import verify_base

    ref = oci.parse_reference(registry.repo(unique_name) + ":bookworm")
    digest, _ = push_image(client, ref, "amd64")
    oci.put_manifest(ref, oci.fetch_manifest(ref.with_digest(digest), client=client)[0], client=client)
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "team.pub").write_bytes(keys["team"][1].read_bytes())
    recipe = write_recipe(tmp_path, BASE_RECIPE.format(base=ref, key="keys/team.pub"))

    plan = pipeline.plan_recipe(recipe, lookup=OFFLINE)
    assert plan.recipe.base.verify == (tmp_path / "keys" / "team.pub").resolve()
    # a check before building, not an input of the image: the recipe's digest (and its golden
    # Dockerfile's header) is the same without it
    from buildkit_py.recipe.model import load_recipe

    unchecked = write_recipe(tmp_path, BASE_RECIPE.format(base=ref, key="x").replace(", verify: x", ""), "plain.yaml")
    assert load_recipe(unchecked).digest == plan.recipe.digest
    with pytest.raises(SignatureError, match=f"the base image {ref} .* is not signed by .*team.pub") as err:
        verify_base(plan, client=client)
    assert f"{recipe}:4: base.verify" in err.value.message and "no signature" in err.value.message
    assert "imgbuild sign" in (err.value.hint or "")
    sig.sign_image(ref, sig.load_signing_key(keys["other"][0]), client=client)
    with pytest.raises(SignatureError, match="signed by another key"):
        verify_base(plan, client=client)
    sig.sign_image(ref, sig.load_signing_key(keys["team"][0]), client=client)
    verified = verify_base(plan, client=client)
    assert verified.final.base == f"{ref}@{digest}"  # the build pulls the digest verified, not the tag

    # the CLI refuses before any engine is chosen (no engine is needed to get this far)
    monkeypatch.setenv("IMGBUILD_REGISTRY_USER", registry.user)
    monkeypatch.setenv("IMGBUILD_REGISTRY_PASSWORD", registry.password)
    _, stranger = sig.generate_key(tmp_path / "stranger.key")
    other = write_recipe(tmp_path, BASE_RECIPE.format(base=ref, key=stranger.name), "other.yaml")
    code, _, err = run_cli("build", str(other), "--engine", "docker", "--progress", "quiet")
    assert code == 1 and "is not signed by" in err and "base.verify" in err, err

    missing = write_recipe(tmp_path, BASE_RECIPE.format(base=ref, key="nowhere.pub"), "missing.yaml")
    with pytest.raises(RecipeError, match="base.verify.*no such key file"):
        pipeline.plan_recipe(missing, lookup=OFFLINE)


def test_mirror_copies_the_referrers(client, registry, unique_name, keys):
    """An index with an SBOM on each platform (OCI referrers, tag schema), a cosign signature on
    the index and each platform: mirrored, the copy lists and verifies the same; mirrored again,
    nothing is listed twice. A platform filter makes a new index: the source index's referrers
    stay behind (they name its digest), the platform's go."""
    from buildkit_py.analysis import sbom

    src = oci.parse_reference(registry.repo(unique_name) + ":1")
    index, platforms = push_index(client, src)
    for platform, digest in platforms.items():
        pinned = src.with_tag(None).with_digest(digest)
        document = json.dumps({"bomFormat": "CycloneDX", "p": platform}).encode()
        oci.push_referrer(pinned, oci.descriptor_of(pinned, client=client), sbom.ARTIFACT_TYPE,
                          [oci.Blob(sbom.ARTIFACT_TYPE, document)],
                          annotations={sbom.ANNOTATION_PLATFORM: platform}, client=client)
    sig.sign_image(src, sig.load_signing_key(keys["team"][0]), client=client)
    public = sig.load_verifying_key(keys["team"][1])

    dest = oci.parse_reference(registry.repo(unique_name + "-copy") + ":1")
    copied = oci.copy_image(src, dest, client=client)
    assert copied.same_digest
    kinds = sorted(r.kind for r in copied.referrers)
    assert kinds == [sbom.ARTIFACT_TYPE] * 2 + ["cosign signature"] * 3
    assert all(r.verified for r in sig.verify_image(dest, public, client=client))
    for platform, digest in platforms.items():
        listed = oci.list_referrers(dest, digest, client=client)
        assert [r.artifact_type for r in listed.items] == [sbom.ARTIFACT_TYPE]
        assert listed.items[0].annotations[sbom.ANNOTATION_PLATFORM] == platform
    again = oci.copy_image(src, dest, client=client)
    assert len(again.referrers) == 5
    assert len(oci.list_referrers(dest, platforms["linux/arm64"], client=client).items) == 1
    assert sig.verify_image(dest, public, client=client)[0].signatures == 1

    code, out, err = run_cli("mirror", str(src), str(dest))
    assert code == 0, err
    assert f"referrers 5 copied (3 cosign signature, 2 {sbom.ARTIFACT_TYPE})" in out

    arm_only = oci.parse_reference(registry.repo(unique_name + "-arm") + ":1")
    filtered = oci.copy_image(src, arm_only, platforms=("linux/arm64",), client=client)
    assert not filtered.same_digest
    assert sorted((r.subject, r.kind) for r in filtered.referrers) == sorted(
        [(platforms["linux/arm64"], sbom.ARTIFACT_TYPE), (platforms["linux/arm64"], "cosign signature")])
    [top] = sig.verify_image(arm_only.with_tag(None).with_digest(platforms["linux/arm64"]), public, client=client)
    assert top.verified
