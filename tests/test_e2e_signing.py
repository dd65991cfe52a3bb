"""End to end, signatures and per-platform referrers with the real third-party CLIs (issue 31
items 2 and 3): Debian 13's cosign 2.5 and oras 1.2, which scripts/services.sh unpacks.

On Docker 26 the recipe is two platforms (one index), on Docker 20.10 one: `build --push --sign
KEY` signs every pushed manifest and `cosign verify --key` accepts each; `imgbuild verify`
accepts what `cosign sign` wrote, cosign accepts what imgbuild signed with a cosign.key, and both
refuse another key; each platform's SBOM is found from that platform's manifest digest; `mirror`
takes the SBOMs and signatures with the image, where `oras discover` lists the SBOM and cosign
verifies the copy; a recipe with base.verify builds on
the signed image and refuses it under another key before building. In CI a missing cosign or
oras fails (conftest.unavailable)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import unavailable
from helpers import CA_ARGS, run_cli, write_recipe
from test_e2e_platforms import BOTH, RECIPE

from buildkit_py import oci

pytestmark = pytest.mark.e2e
CYCLONEDX = "application/vnd.cyclonedx+json"


def tool(name: str) -> str:
    """cosign or oras: scripts/services.sh's (IMGBUILD_TEST_COSIGN / _ORAS), else on PATH."""
    path = os.environ.get(f"IMGBUILD_TEST_{name.upper()}") or shutil.which(name)
    if not path or not Path(path).is_file():
        unavailable(f"{name} is not installed (scripts/services.sh install unpacks Debian 13's)")
    return str(path)


def cosign(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # cosign reads the registry credentials from $DOCKER_CONFIG/config.json (imgbuild login's)
    return subprocess.run([tool("cosign"), *args], capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "COSIGN_PASSWORD": "", **(env or {})})


def cosign_verify(ref: str, key: Path) -> subprocess.CompletedProcess:
    return cosign("verify", "--key", str(key), "--insecure-ignore-tlog", "--allow-insecure-registry", ref)


def oras_discover(ref: str) -> subprocess.CompletedProcess:
    config = Path(os.environ["DOCKER_CONFIG"]) / "config.json"
    return subprocess.run([tool("oras"), "discover", "--plain-http", "--registry-config", str(config),
                           "--format", "json", ref], capture_output=True, text=True, timeout=120, check=False)


def test_signed_push_verified_by_cosign_and_referrers_mirrored(tmp_path, engine, logged_in, multiarch_base,
                                                               unique_name, cleanup_images, registry_refs,
                                                               monkeypatch):
    tool("cosign"), tool("oras")  # before the build: a missing CLI fails (CI) or skips in a second
    two = engine.test_name != "docker20"  # the classic builder makes one platform (test_e2e_platforms)
    reg = logged_in.address
    code, _, err = run_cli("sign", "--generate-key", str(tmp_path / "team.key"))
    assert code == 0, err
    team_pub = tmp_path / "team.key.pub"
    recipe = write_recipe(tmp_path / "app", RECIPE.format(name=unique_name, base=multiarch_base,
                                                         platforms=BOTH if two else ""))
    code, out, err = run_cli("build", str(recipe), "--registry", reg, "--push", "--sign", str(tmp_path / "team.key"),
                             "--no-test", "--json", "--progress", "quiet", *CA_ARGS)
    assert code == 0, err
    report = json.loads(out)
    cleanup_images.extend(report["tags"])
    tag = f"{reg}/{unique_name}:1.0"
    repo = f"{reg}/{unique_name}"
    top = report["pushes"][0]["digest"]
    registry_refs.append(f"{repo}@{top}")
    raw, _, media_type = oci.fetch_manifest(tag)
    platforms = {oci.platform_of(e): e["digest"] for e in json.loads(raw)["manifests"]
                 if oci.platform_of(e) != "unknown/unknown"} if media_type in oci.INDEX_TYPES else {"linux/amd64": top}
    assert sorted(platforms) == (["linux/amd64", "linux/arm64"] if two else ["linux/amd64"])

    # every pushed manifest signed: the index and each platform's (one manifest on 20.10)
    signed = {s["digest"] for s in report["signatures"]}
    assert signed == {top, *platforms.values()}
    for ref in [tag, *(f"{repo}@{d}" for d in platforms.values())]:
        verified = cosign_verify(ref, team_pub)
        assert verified.returncode == 0, verified.stderr
        claims = json.loads(verified.stdout)
        assert {c["critical"]["image"]["docker-manifest-digest"] for c in claims} <= {top, *platforms.values()}

    # each platform's SBOM has that platform's manifest as subject: found from its digest
    assert sorted((s["platform"], s["subject"]) for s in report["sboms"]) == sorted(platforms.items())
    for platform, digest in platforms.items():
        code, out, err = run_cli("sbom", f"{repo}@{digest}", "--json")
        assert code == 0, err
        assert (json.loads(out)["subject"], json.loads(out)["platform"]) == (digest, platform)

    # cosign signs (the index only, as cosign does without --recursive); imgbuild verifies it
    (tmp_path / "cosign").mkdir()
    monkeypatch.setenv("COSIGN_PASSWORD", "")  # the key's password, for cosign and imgbuild alike
    made = cosign("generate-key-pair", "--output-key-prefix", str(tmp_path / "cosign" / "cosign"))
    assert made.returncode == 0, made.stderr
    sign = cosign("sign", "--key", str(tmp_path / "cosign" / "cosign.key"), "--tlog-upload=false",
                  "--allow-insecure-registry", "-y", f"{repo}@{top}")
    assert sign.returncode == 0, sign.stderr
    code, out, err = run_cli("verify", tag, "--key", str(tmp_path / "cosign" / "cosign.pub"), "--json")
    assert code == 0, err
    verdict = json.loads(out)
    assert verdict["verified"] and verdict["manifests"][0]["signatures"] == 2  # ours, then cosign's appended
    # imgbuild signs with cosign's own cosign.key; cosign accepts it on a platform manifest (which
    # cosign sign, without --recursive, did not sign)
    last = list(platforms.values())[-1]
    code, _, err = run_cli("sign", f"{repo}@{last}", "--key", str(tmp_path / "cosign" / "cosign.key"))
    assert code == 0, err
    assert cosign_verify(f"{repo}@{last}", tmp_path / "cosign" / "cosign.pub").returncode == 0
    # another key: refused by both
    code, _, err = run_cli("sign", "--generate-key", str(tmp_path / "other.key"))
    assert code == 0, err
    code, _, err = run_cli("verify", tag, "--key", str(tmp_path / "other.key.pub"))
    assert code == 1 and "signed by another key" in err, err
    assert cosign_verify(tag, tmp_path / "other.key.pub").returncode != 0

    # mirror: the SBOMs and signatures go with the image; oras and cosign find them at the copy
    copy = f"{reg}/{unique_name}-copy:1.0"
    code, out, err = run_cli("mirror", tag, copy)
    assert code == 0, err
    registry_refs.append(f"{reg}/{unique_name}-copy@{top}")
    line = next(x for x in out.splitlines() if x.startswith("referrers "))
    # one .sig tag per manifest signed, one SBOM per platform
    assert f"{len(signed)} cosign signature" in line and f"{len(platforms)} {CYCLONEDX}" in line, out
    print(f"\n{engine.test_name}: {line}")
    for digest in platforms.values():
        found = oras_discover(f"{reg}/{unique_name}-copy@{digest}")
        assert found.returncode == 0, found.stderr
        listed = json.loads(found.stdout)
        entries = listed.get("manifests") or listed.get("referrers") or []
        assert [m["artifactType"] for m in entries] == [CYCLONEDX], listed
    assert cosign_verify(copy, team_pub).returncode == 0
    assert cosign_verify(copy, tmp_path / "cosign" / "cosign.pub").returncode == 0

    # base.verify: a recipe on the signed image builds with the team's key, is refused with another
    for name, key, expected in (("stranger", tmp_path / "other.key.pub", 1), ("team", team_pub, 0)):
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(key, folder / "signer.pub")
        on_signed = write_recipe(folder, RECIPE.format(name=f"{unique_name}-{name}", base=tag, platforms="")
                                 .replace("base: {image: " + tag + "}",
                                          "base: {image: " + tag + ", verify: signer.pub}"))
        code, out, err = run_cli("build", str(on_signed), "--json", "--progress", "quiet", *CA_ARGS)
        if expected:
            assert code == 1 and "is not signed by" in err and "base.verify" in err, err
            assert engine.image_attrs(f"{unique_name}-{name}:1.0") is None  # refused before building
        else:
            assert code == 0, err
            cleanup_images.extend(json.loads(out)["tags"])
