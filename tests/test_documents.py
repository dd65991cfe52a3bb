"""The --json documents as frozen dataclasses (issue 32, item 3): each document's JSON has the
keys the README documents, and the text output reads the same fields, so the two cannot disagree."""

from __future__ import annotations

import json

from buildkit_py.analysis.image_checks import PASSED, TestReport, TestResult
from buildkit_py.analysis.sbom import AttachedSbom
from buildkit_py.compat.codes import RecipeWarning, WarningCode
from buildkit_py.engine import BuildResult, ImageSizes
from buildkit_py.engine.push import PushResult
from buildkit_py.oci.signatures import SignedManifest
from buildkit_py.pipeline import build as build_mod

# README, the command table and "The --json contract": `build --json`
BUILD_KEYS = {"image_id", "tags", "size", "engine", "backend", "size_uncompressed", "size_compressed", "seconds",
              "steps_run", "steps_cached", "steps_rerun", "groups", "labels", "warnings", "pushes", "sboms",
              "signatures", "tests", "cold_start", "platforms", "platform_tests"}


def _build_document(platforms: tuple[str, ...] = ()) -> build_mod.BuildDocument:
    image = "sha256:" + "ab" * 32
    result = BuildResult(image, ("reg/team/app:1",), "", cached_steps=3, run_steps=2, seconds=12.345,
                         rerun=("pip-torch", "copy"))
    push = PushResult("reg/team/app@sha256:" + "cd" * 32, "reg/team/app:1", "sha256:" + "cd" * 32, 2048, 1)
    outcome = build_mod.BuildOutcome(None, "docker", result, size=5_000_000, pushes=(push,),  # no plan: not read
                                     groups={"cuda": 4_000_000}, labels={"io.imgbuild.cuda": "12.4.1"},
                                     sizes=ImageSizes(5_000_000, 2_000_000))
    tests = tuple(TestReport(f"reg/team/app:1 ({p})", False, (TestResult("import torch", "import", PASSED),), p)
                  for p in platforms or ("linux/amd64",))
    sbom = AttachedSbom("reg/team/app@sha256:" + "ef" * 32, "sha256:" + "ef" * 32, push.digest, "linux/amd64",
                        "referrers-api", None, 42, 900)
    signed = SignedManifest(push.digest, None, "sha256-" + "cd" * 32 + ".sig", 1)
    report = build_mod.BuildReport(outcome, tests, (sbom,), (signed,))
    warning = RecipeWarning(WarningCode.CUDA_TWICE, "torch", "torch ships CUDA a second time")
    return build_mod.BuildDocument.of(report, (warning,), platforms)


def test_build_document_has_the_documented_keys_and_the_values_it_was_built_from():
    doc = _build_document()
    data = doc.to_json()
    assert set(data) == BUILD_KEYS
    json.dumps(data)  # plain JSON all through
    assert data["backend"] == data["engine"] == "docker"
    assert (data["seconds"], data["steps_run"], data["steps_cached"], data["steps_rerun"]) == (12.35, 2, 3,
                                                                                               ["pip-torch", "copy"])
    assert (data["size"], data["size_uncompressed"], data["size_compressed"]) == (5_000_000, 5_000_000, 2_000_000)
    assert data["pushes"] == [{"ref": doc.pushes[0].ref, "tag": "reg/team/app:1", "digest": doc.pushes[0].digest,
                               "size": 2048}]
    assert data["warnings"] == [{"code": "cuda-twice", "key": "torch", "message": "torch ships CUDA a second time",
                                 "hint": None}]
    assert data["tests"]["passed"] == 1 and data["platform_tests"] == []  # one platform: no per-platform list
    assert data["sboms"][0]["components"] == 42 and data["signatures"][0]["tag"].endswith(".sig")
    assert data["cold_start"] is None


def test_build_text_reads_the_document():
    doc = _build_document()
    data = doc.to_json()
    lines = doc.lines()
    assert lines[0] == f"image    {data['image_id']}"
    assert lines[1] == f"tags     {', '.join(data['tags'])}"
    assert lines[2] == "size     4.8 MiB (5000000 bytes) uncompressed, 1.9 MiB compressed"
    assert lines[3] == "steps    2 run, 3 cached, 12.3s"
    assert f"pushed   {data['pushes'][0]['ref']}" in lines
    assert any(x.startswith("sbom     ") and "(42 components, referrers-api)" in x for x in lines)
    assert f"signed   {data['signatures'][0]['digest']} (manifest, {data['signatures'][0]['tag']})" in lines


def test_a_multi_platform_build_lists_each_platforms_tests():
    doc = _build_document(("linux/amd64", "linux/arm64"))
    data = doc.to_json()
    assert [t["platform"] for t in data["platform_tests"]] == ["linux/amd64", "linux/arm64"]
    assert data["tests"]["platform"] == "linux/arm64"  # the last platform's, as before
    assert [x for x in doc.lines() if x.startswith("tests")] == [
        "tests    1 passed, 0 failed, 0 skipped (reg/team/app:1 (linux/amd64))",
        "tests    1 passed, 0 failed, 0 skipped (reg/team/app:1 (linux/arm64))"]


# README: `test --json`
TEST_KEYS = {"image", "gpu", "platforms", "passed", "failed", "skipped", "results", "platform_tests"}
TEST_RESULT_KEYS = {"name", "kind", "status", "detail", "command", "exit_code", "output", "seconds", "platform"}


def test_test_run_document_and_text():
    from buildkit_py.analysis.image_checks import FAILED, TestRun

    reports = (TestReport("app:1", True, (TestResult("import torch", "import", PASSED),), "linux/amd64"),
               TestReport("app:1", False, (TestResult("smoke", "command", FAILED, command="true", exit_code=1),),
                          "linux/arm64"))
    run = TestRun("app:1", reports)
    data = run.to_json()
    assert set(data) == TEST_KEYS
    assert all(set(r) == TEST_RESULT_KEYS for r in data["results"])
    assert (data["gpu"], data["platforms"], data["passed"], data["failed"]) == (True, ["linux/amd64", "linux/arm64"],
                                                                                1, 1)
    assert [r["platform"] for r in data["results"]] == data["platforms"]
    assert run.lines() == [f"tests    app:1 ({p}): {t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped"
                           for p, t in zip(data["platforms"], data["platform_tests"], strict=True)]


def test_sign_and_verify_documents_and_text(tmp_path):
    from buildkit_py.cli.sign import SignDocument, VerifyDocument
    from buildkit_py.oci.signatures import VerifiedManifest

    key = tmp_path / "team.key"
    signed = (SignedManifest("sha256:" + "1" * 64, None, "sha256-" + "1" * 64 + ".sig", 1),
              SignedManifest("sha256:" + "2" * 64, "linux/amd64", "sha256-" + "2" * 64 + ".sig", 2))
    sign = SignDocument("reg/app:1", key, signed)
    data = sign.to_json()
    assert set(data) == {"image", "key", "signed"} and data["key"] == str(key)
    assert all(set(s) == {"digest", "platform", "tag", "signatures"} for s in data["signed"])
    assert sign.lines() == [f"signed   reg/app:1 {what} {s['digest']} ({s['tag']}, {s['signatures']} signature(s))"
                            for what, s in zip(("index", "linux/amd64"), data["signed"], strict=True)]

    manifests = (VerifiedManifest("sha256:" + "1" * 64, None, False, 0, "no signature"),
                 VerifiedManifest("sha256:" + "2" * 64, "linux/amd64", True, 1, "layer 0"))
    verify = VerifyDocument("reg/app:1", key, manifests)
    data = verify.to_json()
    assert set(data) == {"image", "key", "verified", "manifests"} and data["verified"] is False  # the index's
    assert all(set(m) == {"digest", "platform", "verified", "signatures", "reason"} for m in data["manifests"])
    assert verify.lines() == [f"unsigned index {data['manifests'][0]['digest']}: no signature",
                              f"verified linux/amd64 {data['manifests'][1]['digest']}: layer 0"]


def test_diff_document_has_the_documented_keys():
    from buildkit_py.analysis import diff as D

    a = D.ImageLayers("a:1", D.SOURCE_REGISTRY, "sha256:" + "a" * 64, (), {})
    data = D.diff_layers(a, a).to_json()
    assert set(data) == {"schema", "a", "b", "layers", "totals"}  # README: `diff --json`
    assert set(data["a"]) == {"image", "source", "digest", "layers", "compressed_size", "size", "labels"}


def test_weights_documents_and_text(tmp_path):
    from buildkit_py.artifacts.weights import ArtifactFile, PullResult, PushedArtifact, PushedFile
    from buildkit_py.cli.weights import WeightsListed, WeightsPulled, WeightsPushed

    digest = "sha256:" + "5" * 64
    pushed = WeightsPushed(PushedArtifact("reg/models/m:1", "sha256:" + "6" * 64, (
        PushedFile("model.safetensors", 3000, digest, "application/vnd.cncf.model.weight.v1.raw", 3000),
        PushedFile("config.json", 10, "sha256:" + "7" * 64, "application/vnd.cncf.model.weight.config.v1.raw", 0))))
    data = pushed.to_json()
    assert set(data) == {"ref", "digest", "pinned", "uploaded_bytes", "files"}
    assert data["pinned"] == f"{data['ref']}@{data['digest']}" and data["uploaded_bytes"] == 3000
    assert all(set(f) == {"path", "size", "digest", "media_type", "uploaded_bytes"} for f in data["files"])
    assert pushed.lines() == [f"pushed 2 files (2.9 KiB uploaded): {data['pinned']}"]

    files = (ArtifactFile("model.safetensors", 3000, digest), ArtifactFile("config.json", 10, "sha256:" + "7" * 64))
    pulled = WeightsPulled("reg/models/m:1", tmp_path, PullResult(files, 3000, ("config.json",)))
    data = pulled.to_json()
    assert set(data) == {"ref", "directory", "downloaded_bytes", "files", "skipped", "replaced"}
    assert data["files"][0] == {"path": "model.safetensors", "size": 3000, "digest": digest}
    assert pulled.lines() == [f"2 files in {tmp_path}: 2.9 KiB downloaded, 1 already present"]

    listed = WeightsListed("reg/models/m:1", files)
    data = listed.to_json()
    assert set(data) == {"ref", "files"} and [f["path"] for f in data["files"]] == ["model.safetensors", "config.json"]
    assert listed.lines()[0] == f"   2.9 KiB  {digest[:19]}  model.safetensors"


# README: `mirror --json`
MIRROR_KEYS = {"source", "dest", "digest", "source_digest", "same_digest", "platforms", "left_out", "attestations",
               "manifests", "media_type", "pinned", "referrers"}


def test_mirror_and_login_documents_and_text():
    from buildkit_py import oci
    from buildkit_py.cli.registry import LoggedIn, Mirrored
    from buildkit_py.oci.copy import CopiedReferrer
    from buildkit_py.oci.login import LoginResult

    digest, other = "sha256:" + "8" * 64, "sha256:" + "9" * 64
    copied = oci.CopyResult(digest, other, oci.MEDIA_OCI_INDEX, ("linux/amd64",), ("linux/arm64",), 1, 3,
                            (CopiedReferrer(digest, "sha256:" + "a" * 64, "cosign signature", "x.sig"),))
    mirrored = Mirrored("nvidia/cuda:12.4.1", "127.0.0.1:5000/mirror/cuda:12.4.1", copied)
    data = mirrored.to_json()
    assert set(data) == MIRROR_KEYS
    assert data["pinned"] == f"127.0.0.1:5000/mirror/cuda@{digest}" and data["same_digest"] is False
    assert all(set(r) == {"subject", "digest", "kind", "tag"} for r in data["referrers"])
    assert mirrored.lines() == [
        f"mirrored {data['source']} -> {data['dest']}",
        "copied   linux/amd64, 1 attestation manifest (left out: linux/arm64)",
        f"digest   {digest}: a new index of the chosen platforms; the source's is {other}",
        "referrers 1 copied (1 cosign signature)", f"pin with {data['pinned']}"]

    logged = LoggedIn(LoginResult("127.0.0.1:5000", "ci", "/home/ci/.docker/config.json"))
    assert logged.to_json() == {"registry": "127.0.0.1:5000", "username": "ci",
                                "stored_in": "/home/ci/.docker/config.json"}
    assert logged.lines() == ["logged in to 127.0.0.1:5000 as ci (stored in /home/ci/.docker/config.json)"]


def test_driver_check_document_and_text():
    from buildkit_py.analysis.check import check_compat
    from buildkit_py.cli.check import DriverCheck

    result = check_compat("12.4.1", "535.104.05", datacenter=False)
    check = DriverCheck("CUDA 12.4.1", "the shipped data", "535.104.05", result)
    data = check.to_json()
    assert set(result.to_json()) | {"target", "floors_from"} == set(data)
    assert (data["target"], data["floors_from"], data["verdict"]) == ("CUDA 12.4.1", "the shipped data",
                                                                      str(result.verdict))
    lines = check.lines()
    assert lines[0] == f"CUDA 12.4.1: {data['verdict']} on driver 535.104.05"
    assert lines[2] == f"  {data['message']}"
    assert (f"  remedy: {data['remedy']}" in lines) == bool(data["remedy"])


def test_render_document_and_text(tmp_path):
    from buildkit_py.cli.recipe import Rendered

    warning = RecipeWarning(WarningCode.CUDA_TWICE, "torch", "torch ships CUDA a second time")
    text = 'FROM nvidia/cuda:12.4.1-runtime-ubuntu22.04 AS runtime\nLABEL a=x\u2028y\n'
    rendered = Rendered(tmp_path / "r.yaml", text, ("app:1",), (warning,), None)
    data = rendered.to_json()
    assert set(data) == {"recipe", "dockerfile", "tags", "warnings", "output"}  # README: `render --json`
    assert (data["dockerfile"], data["tags"], data["output"]) == (text, ["app:1"], None)
    assert data["warnings"] == [warning.to_json()]
    assert "".join(x + "\n" for x in rendered.lines()) == data["dockerfile"]  # the text is the Dockerfile itself
    written = Rendered(tmp_path / "r.yaml", text, ("app:1",), (), tmp_path / "Dockerfile")
    assert written.to_json()["output"] == str(tmp_path / "Dockerfile") and written.lines() == []


# README: `data status --json`
DATA_STATUS_KEYS = {"shipped_as_of", "files", "cache", "cached", "images", "partial"}
IMAGES_KEYS = {"today", "releases", "policy", "end_of_life", "end_of_life_unknown", "no_end_of_life"}


def test_data_status_document_and_text():
    from buildkit_py.cli.data import CachedRelease, DataStatus, ImageEndOfLife, ImagesStatus

    images = ImagesStatus("2026-12-05", 3, "latest patch only",
                          (ImageEndOfLife("12.4.1", "2026-06-01", "driver", "2026-12-01", True),
                           ImageEndOfLife("13.0.3", "2027-03-01", "patch", None, False)), ("13.2.1",), ())
    cached = (CachedRelease("2.16.0", "http://ix/simple/", "2026-12-01", "cu135", False),
              CachedRelease("2.5.1", "http://ix/simple/", "2026-11-01", None, True))
    status = DataStatus("2026-12-04", {"torch.json": "2026-12-03", "archs.json": None}, "/c", cached, images,
                        {"torch": ("2.15.0",), "flash-attn": ()})
    data = status.to_json()
    assert set(data) == DATA_STATUS_KEYS and set(data["images"]) == IMAGES_KEYS
    json.dumps(data)
    assert data["cached"][1] == {"component": "torch", "version": "2.5.1", "index": "http://ix/simple/",
                                 "read": "2026-11-01", "pypi_variant": None, "shipped": True}
    assert data["images"]["end_of_life"][1] == {"cuda": "13.0.3", "date": "2027-03-01", "basis": "patch",
                                                "deletion": None, "past": False}
    assert data["partial"] == {"torch": ["2.15.0"], "flash-attn": []}
    assert status.lines() == [
        f"shipped compatibility data as of {data['shipped_as_of']}",
        "  torch.json           2026-12-03", "  archs.json           -",
        "nvidia/cuda images: 3 releases, 1 past NVIDIA's end of life on 2026-12-05 (newest: 12.4.1, 2026-06-01)",
        "  end of life ahead: 13.0.3 (2027-03-01)", "  end of life, no date: 13.2.1",
        "  no end-of-life date published: -", "  policy: latest patch only",
        "known only in part: torch 2.15.0",
        "look-up cache (/c) adds:",
        "  torch 2.16.0    cu135  from http://ix/simple/ (read 2026-12-01)",
        "  torch 2.5.1     ?      from http://ix/simple/ (read 2026-11-01)  [now also shipped]"]
    empty = DataStatus(None, {}, "/c", (), images, {})
    assert empty.lines()[0] == "shipped compatibility data as of unknown"
    assert empty.lines()[-1] == "look-up cache (/c): empty" and empty.to_json()["cached"] == []


def test_data_refresh_document_and_text():
    from buildkit_py.cli.data import DataRefreshed
    from buildkit_py.compat.refresh import Change, RefreshReport

    report = RefreshReport("http://ix/simple/", "2026-12-24", (Change("torch.json", "2.16.0", "new release"),),
                           ("bitsandbytes 0.51.0: read its wheels",), {"torch.json": {}})
    refreshed = DataRefreshed(report, ("torch.json",), 12, 4096)
    data = refreshed.to_json()
    # README: `data refresh --json`
    assert set(data) == {"index", "date", "changes", "review", "files_changed", "written", "requests", "bytes_read"}
    assert data["changes"] == [{"file": "torch.json", "key": "2.16.0", "what": "new release"}]
    assert (data["written"], data["requests"], data["bytes_read"]) == (["torch.json"], 12, 4096)
    assert refreshed.lines() == ["torch.json: 2.16.0: new release", f"review: {data['review'][0]}"]
    same = DataRefreshed(RefreshReport("http://ix/simple/", "2026-12-24", (), (), {}), (), 3, 10)
    assert same.lines() == ["the data matches the index"] and same.to_json()["files_changed"] == []


# README: `sbom --json`; read attached adds artifact_type and others, generated adds source
SBOM_KEYS = {"image", "subject", "sbom", "via", "platform", "format", "output", "components", "document"}


def _sbom_contents():
    from buildkit_py.analysis import sbom

    return sbom.ImageContents("reg/app:1", sbom.SOURCE_ENGINE, "sha256:" + "1" * 64, "linux/amd64", None, (),
                              sbom.OsRelease("debian", "12", "Debian 12"),
                              (sbom.PythonDist("numpy", "2.0.0", "/site/numpy-2.0.0.dist-info", "ab" * 32, "lock"),),
                              (sbom.DebPackage("libc6", "2.36-9", "amd64"),))


def test_sbom_documents_and_text(tmp_path):
    from buildkit_py import oci
    from buildkit_py.analysis import sbom
    from buildkit_py.cli.sbom import SbomShown

    contents = _sbom_contents()
    document = json.loads(sbom.cyclonedx_document(contents))
    generated = SbomShown.generated("reg/app:1", contents, None, document, tmp_path / "app.cdx.json")
    data = generated.to_json()
    assert set(data) == SBOM_KEYS | {"source"}
    assert (data["subject"], data["sbom"], data["via"], data["source"]) == (contents.image_id, None, None, "engine")
    assert data["format"] == "CycloneDX 1.6" and data["output"] == str(tmp_path / "app.cdx.json")
    assert [c["type"] for c in data["components"]] == ["os", "deb", "python"]
    assert generated.lines() == [
        f"image      reg/app:1 ({data['subject']})",
        "format     CycloneDX 1.6, 3 components: 1 os, 1 deb, 1 python", f"written    {data['output']}",
        "os     debian                                   12",
        "deb    libc6                                    2.36-9 (amd64)",
        "python numpy                                    2.0.0                                sha256:" + "ab" * 32]

    referrer = oci.Referrer("sha256:" + "2" * 64, oci.MEDIA_OCI_MANIFEST, 100, sbom.ARTIFACT_TYPE,
                            {sbom.ANNOTATION_PLATFORM: "linux/amd64"})
    other = oci.Referrer("sha256:" + "3" * 64, oci.MEDIA_OCI_MANIFEST, 100, None, {})
    found = sbom.FoundSbom("reg/app:1", "sha256:" + "4" * 64, referrer, "referrers-api", b"", (other,))
    read = SbomShown.read("reg/app:1", found, document, None)
    data = read.to_json()
    assert set(data) == SBOM_KEYS | {"artifact_type", "others"}
    assert (data["sbom"], data["artifact_type"], data["others"], data["output"]) == (
        referrer.digest, sbom.ARTIFACT_TYPE, [other.digest], None)
    assert read.lines()[:2] == [f"image      reg/app:1 ({found.subject})",
                                f"sbom       {referrer.digest} (referrers-api, linux/amd64)"]


# README: `check --gpu --json`
GPU_REPORT_KEYS = {"image", "gpu", "capability", "verdict", "runs", "decided_by", "message", "jit_bytes",
                   "libraries", "unreadable"}


def test_check_gpu_documents_and_text():
    from buildkit_py.analysis.check import check_compat
    from buildkit_py.analysis.gpu_coverage import gpu_report, resolve_gpu
    from buildkit_py.cli.check import GpuCheck, GpuChecks

    report = gpu_report("img:1", resolve_gpu("H100"), [], (("/bad.so", "garbled"),))
    alone = GpuChecks((GpuCheck(report, None, None, ()),), None, None)
    data = alone.to_json()
    assert set(data) == GPU_REPORT_KEYS and data["unreadable"] == [{"path": "/bad.so", "error": "garbled"}]
    assert alone.runs and alone.lines() == [f"image img:1 on {report.gpu.label}: {data['verdict']}",
                                            f"  {data['message']}", "  unreadable /bad.so: garbled"]

    driver = check_compat("12.4.1", "535.104.05", datacenter=False)
    b200 = gpu_report("img:1", resolve_gpu("B200"), [], ())
    checks = GpuChecks((GpuCheck(report, "535.104.05", driver, ("/venv/x/liby.so",)),
                        GpuCheck(b200, "535.104.05", driver, ())), "535.104.05", driver)
    data = checks.to_json()
    assert set(data) == {"reports"} and [r["gpu"] for r in data["reports"]] == ["H100", "B200"]
    assert all(set(r) == GPU_REPORT_KEYS | {"driver", "driver_too_old_for_ptx"} for r in data["reports"])
    assert data["reports"][0]["driver_too_old_for_ptx"] == ["/venv/x/liby.so"]
    assert not checks.runs  # PTX the driver cannot JIT-compile counts as no kernel
    lines = checks.lines()
    assert "  driver 535.104.05 is too old to JIT-compile the PTX of /venv/x/liby.so" in lines
    assert lines[-1] == f"driver 535.104.05: {driver.verdict}: {driver.message}"


def test_compose_document_and_text(tmp_path):
    from pathlib import Path

    import yaml

    from buildkit_py.cli.run import Composed
    from buildkit_py.engine.run import compose_document, compose_text
    from buildkit_py.recipe.model import load_recipe

    recipe = load_recipe(Path(__file__).parent.parent / "recipes" / "demo.yaml")
    composed = Composed("app:1", compose_document("app:1", recipe), compose_text("app:1", recipe), None)
    data = composed.to_json()
    assert set(data) == {"image", "compose", "output"}  # README: `compose --json`
    assert data["output"] is None and data["compose"]["services"]["app"]["image"] == data["image"]
    text = "".join(x + "\n" for x in composed.lines())
    assert text == composed.text and yaml.safe_load(text) == data["compose"]  # the text is compose.yaml itself
    written = Composed("app:1", data["compose"], composed.text, tmp_path / "compose.yaml")
    assert written.lines() == [] and written.to_json()["output"] == str(tmp_path / "compose.yaml")


def test_plan_document_and_text(tmp_path):
    from pathlib import Path

    from buildkit_py import pipeline
    from buildkit_py.cli.recipe import Planned
    from buildkit_py.compat.gpu_fit import gpus_rule
    from buildkit_py.plan.build_plan import plan_json
    from buildkit_py.render.dockerfile import render_dockerfile

    recipe = Path(__file__).parent.parent / "recipes" / "demo.yaml"
    plan = pipeline.plan_recipe(recipe, lookup=pipeline.Lookup(offline=True, cache=tmp_path))
    dockerfile = render_dockerfile(plan)
    planned = Planned(plan, dockerfile, None, plan.warnings)
    data = planned.to_json()
    assert data == plan_json(plan, dockerfile) and "gpus" not in data  # no GPU named: the plan's JSON as it is
    lines = planned.lines()
    assert lines[1] == f"  cuda      {data['resolution']['cuda']} {data['resolution']['flavor']} " \
                       f"from {data['resolution']['source']}"
    assert f"  tags      {', '.join(data['tags'])}" in lines
    assert [x for x in lines if x.startswith("  stage ")] == [
        f"  stage {s['name']:<8} FROM {s['base']}: " + ", ".join(st["id"] for st in s["steps"]) for s in data["stages"]]

    fits, warnings = gpus_rule(plan.recipe, plan.resolution, [("--gpu", "H100")])
    checked = Planned(plan, dockerfile, fits, warnings)
    data = checked.to_json()
    assert set(data) == set(plan_json(plan, dockerfile)) | {"gpus", "gpus_partial"}  # README: `plan --json`
    assert data["gpus_partial"] == any(f["partial"] for f in data["gpus"])
    assert data["warnings"] == [w.to_json() for w in warnings]  # the GPU check's replace resolve's
    gpu_lines = [x for x in checked.lines() if x.startswith("  gpu ")]
    assert len(gpu_lines) == len(data["gpus"]) == 1 and gpu_lines[0].startswith("  gpu       H100 (compute")
    assert checked.lines()[-len(warnings):] == [f"  warning   {w.render()}" for w in warnings]


def test_matrix_build_document_and_text(tmp_path):
    from pathlib import Path

    from buildkit_py import pipeline
    from buildkit_py.errors import BuildFailed
    from buildkit_py.pipeline.matrix_build import MatrixBuild, MatrixBuildDocument, VariantBuild
    from buildkit_py.plan.matrix import variant_plan

    matrix = pipeline.load_matrix(Path(__file__).parent.parent / "recipes" / "matrix.yaml",
                                  lookup=pipeline.Lookup(offline=True, cache=tmp_path))
    ok, bad = matrix.variants[:2]
    report = _build_document().to_json()  # the single build's pieces, reused below
    single = build_mod.BuildReport(
        build_mod.BuildOutcome(None, "docker", BuildResult(report["image_id"], (), "", cached_steps=3, run_steps=2,
                                                           seconds=12.0),
                               size=5_000_000),
        (), (AttachedSbom("r/a@sha256:" + "e" * 64, "sha256:" + "e" * 64, "sha256:" + "d" * 64, "linux/amd64",
                          "referrers-api", None, 42, 900),),
        (SignedManifest("sha256:" + "d" * 64, None, "sha256-" + "d" * 64 + ".sig", 1),))
    result = MatrixBuild(matrix, (VariantBuild(ok, variant_plan(ok), single, seconds=12.0),
                                  VariantBuild(bad, variant_plan(bad), None, BuildFailed("step 3 failed"), 1.5)), 13.5)
    doc = MatrixBuildDocument(result)
    data = doc.to_json()
    # README: `build --all --json`
    assert set(data) == {"recipe", "name", "seconds", "ok", "failed", "variants", "dropped"}
    assert (data["ok"], data["failed"], [v["status"] for v in data["variants"]]) == (1, 1, ["ok", "failed"])
    lines = doc.lines()
    assert lines[0].split() == ["VARIANT", "STATUS", "SIZE", "DIGEST", "TIME", "CACHED", "TAGS"]
    assert lines[1].split()[:2] == [ok.id, "ok"] and lines[2].split()[:2] == [bad.id, "FAILED"]
    assert f"{data['ok']} built, {data['failed']} failed, {len(data['dropped'])} dropped, in 13.5s" in lines
    assert doc.artifact_lines() == [
        f"sbom     [{ok.id}] r/a@sha256:{'e' * 64} (42 components, referrers-api) for sha256:{'d' * 64}",
        f"signed   [{ok.id}] sha256:{'d' * 64} (sha256-{'d' * 64}.sig)"]
    assert lines[-2:] == doc.artifact_lines()
