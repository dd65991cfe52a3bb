"""End to end (issue 33 item 4): lazy pulling on paper and in bytes. On Docker 26 + buildx a
small image is built with --compression estargz and pushed; our own reader finds a TOC behind
each pushed layer's footer with the digest its descriptor announces, the image still runs its
tests, and `imgbuild test --lazy` charges what those tests read to the registry's layers by
their TOCs (exact). On every engine the tests are traced (the host's strace, nothing from the
image) and the share estimated from the engine's own layers. The classic 20.10 client and podman
refuse --compression estargz before building."""

import json

import pytest
from conftest import on_every_engine
from helpers import CA_ARGS, run_cli
from test_e2e_image_tests import _recipe  # six pinned, a script: test that imports it, a gpu: test skipped here

from buildkit_py.analysis.lazy import TOC_DIGEST_ANNOTATION, remote_layers
from buildkit_py.oci.manifests import get_manifest

pytestmark = pytest.mark.e2e


def _lazy(target: str, *extra: str) -> dict:
    code, out, err = run_cli("test", target, "--lazy", "--json", *extra)
    assert code == 0, err
    return json.loads(out)


def _reads_python_and_six(doc: dict) -> None:
    files = {f["path"] for f in doc["lazy"]["files"]}
    # six itself, from its source or its byte code; python's binary (through its symlinks)
    assert any(p.endswith(("/six.py", "/six.cpython-311.pyc")) for p in files), (
        [p for p in files if "six" in p], [p for p in doc["lazy"]["outside_image"] if "six" in p])
    assert any("/libpython3" in p or p.startswith("/usr/bin/python3") for p in files), sorted(files)
    assert "/usr/bin/dash" not in files or "/usr/lib/x86_64-linux-gnu/libc.so.6" in files


def test_estargz_build_push_verify_and_lazy_share(tmp_path, engine, logged_in, base_image, unique_name,
                                                  cleanup_images, registry_refs):
    if getattr(engine, "buildx", None) is None:
        pytest.skip("estargz is a buildx output; test_classic_and_podman_refuse_estargz covers the others")
    recipe = _recipe(tmp_path, unique_name, base_image)
    code, out, err = run_cli("build", str(recipe), "--registry", logged_in.address, "--push", "--compression",
                             "estargz", "--json", "--progress", "quiet", *CA_ARGS)
    assert code == 0, err
    report = json.loads(out)
    cleanup_images.extend(report["tags"])
    registry_refs.extend(p["ref"] for p in report["pushes"])
    assert report["tests"]["failed"] == 0  # the estargz image runs its tests before the push
    tag = report["tags"][0]
    manifest, _, _ = get_manifest(tag)
    assert {x["mediaType"] for x in manifest["layers"]} == {"application/vnd.oci.image.layer.v1.tar+gzip"}
    assert all(TOC_DIGEST_ANNOTATION in (x.get("annotations") or {}) for x in manifest["layers"])
    # our reader, by ranged GETs as a lazy puller: a TOC behind every footer, the announced digest
    layers = remote_layers(tag)
    assert layers and all(x.verified for x in layers), [x.to_json() for x in layers]
    assert all(x.toc is not None and x.toc.landmark is None for x in layers)  # BuildKit writes no prefetch list
    doc = _lazy(str(recipe), "--registry", logged_in.address)  # with the recipe: its pins and test: too
    lazy = doc["lazy"]
    assert doc["failed"] == 0 and lazy["image"] == tag and lazy["exact"] is True
    assert [x["verified"] for x in lazy["registry_layers"]] == [True] * len(layers)
    assert lazy["compressed_size"] == sum(x["size"] for x in manifest["layers"])
    assert 0 < lazy["needed"] < lazy["compressed_size"] and lazy["fraction"] == round(
        lazy["needed"] / lazy["compressed_size"], 4)
    # every layer costs at least its TOC: a node mounts each one before it reads a file
    assert all(x["needed"] >= y.toc.toc_bytes for x, y in zip(lazy["layers"], layers, strict=True) if y.toc)
    _reads_python_and_six(doc)


@on_every_engine
def test_lazy_report_traces_the_tests_on_the_engines_own_layers(tmp_path, engine, base_image, unique_name,
                                                                cleanup_images):
    recipe = _recipe(tmp_path, unique_name, base_image)
    code, out, err = run_cli("build", str(recipe), "--json", "--progress", "quiet", *CA_ARGS)
    assert code == 0, err
    report = json.loads(out)
    cleanup_images.extend(report["tags"])
    doc = _lazy(str(recipe))
    lazy = doc["lazy"]
    assert doc["failed"] == 0 and lazy["registry_layers"] is None and lazy["exact"] is False
    assert 0 < lazy["needed"] < lazy["compressed_size"]
    assert sum(x["files_read"] for x in lazy["layers"]) == len(lazy["files"])
    _reads_python_and_six(doc)
    code, out, _ = run_cli("test", str(recipe), "--lazy")
    assert code == 0 and "before the tests pass" in out


def test_classic_and_podman_refuse_estargz(tmp_path, base_image, unique_name, monkeypatch):
    """The 20.10 client has no output options at all; podman's build has no estargz exporter: both
    refuse with exit 3 before building, naming the capability."""
    recipe = _recipe(tmp_path, unique_name, base_image)
    monkeypatch.setenv("IMGBUILD_DOCKER", "/usr/bin/docker")  # the 20.10 client
    code, _, err = run_cli("build", str(recipe), "--engine", "docker", "--compression", "estargz",
                           "--progress", "quiet")
    assert code == 3 and "compression" in err, err
    code, _, err = run_cli("build", str(recipe), "--engine", "podman", "--compression", "estargz",
                           "--progress", "quiet")
    assert code == 3 and "compression" in err, err
