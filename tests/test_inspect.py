"""imgbuild inspect: pure helpers on synthetic tars, then real images built with BuildKit."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest
from fakes import FakeEngine, image_info
from helpers import REPO, RUN_LABEL, RUN_MARK, plan_of, unique

from buildkit_py.analysis import inspect as I
from buildkit_py.analysis import layer_paths as P
from buildkit_py.analysis import saved_image as S
from buildkit_py.cli.common import Out
from buildkit_py.engine import HistoryEntry, cold_start
from buildkit_py.errors import ImageMissing, InspectError, SizeBudgetExceeded
from buildkit_py.plan import history as H
from buildkit_py.recipe.model import load_recipe
from buildkit_py.text_table import TextTable

FIXTURES = Path(__file__).parent / "fixtures" / "inspect"
MiB = 1 << 20


# ---------------------------------------------------------------- path rules


@pytest.mark.parametrize(("path", "size", "expected"), [
    ("/models/model.safetensors", 12 * MiB, [(I.WEIGHTS, "/models/model.safetensors")]),
    ("/models/model.safetensors", 5 * MiB, []),  # under the threshold
    ("/w/pytorch_model.BIN", 11 * MiB, [(I.WEIGHTS, "/w/pytorch_model.BIN")]),
    ("/w/m.gguf", 11 * MiB, [(I.WEIGHTS, "/w/m.gguf")]),
    ("/w/notes.txt", 50 * MiB, []),
    ("/root/.cache/pip/http/a/b", 10, [(I.CACHE, "/root/.cache/pip")]),
    ("/home/app/.cache/pip/wheels/x.whl", 10, [(I.CACHE, "/home/app/.cache/pip")]),
    ("/root/.cache/huggingface/hub/models--x/blobs/abc", 10, [(I.CACHE, "/root/.cache/huggingface")]),
    ("/var/cache/apt/archives/curl_8.0_amd64.deb", 10, [(I.CACHE, "/var/cache/apt/archives")]),
    ("/var/cache/apt/archives/partial/curl_8.0_amd64.deb", 10, [(I.CACHE, "/var/cache/apt/archives")]),
    ("/var/cache/apt/archives/lock", 0, []),
    ("/var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_InRelease", 10, [(I.CACHE, "/var/lib/apt/lists")]),
    ("/var/lib/apt/lists/lock", 0, []),
    ("/var/lib/apt/lists/partial/x", 10, []),
    ("/opt/conda/pkgs/numpy-1.26.tar.bz2", 10, [(I.CACHE, "/opt/conda/pkgs")]),
    ("/root/miniconda3/pkgs/cache/x.json", 10, [(I.CACHE, "/root/miniconda3/pkgs")]),
    ("/opt/venv/lib/python3.11/site-packages/__pycache__/x.pyc", 10, []),
    ("/root/.cache/pip/__pycache__/x.pyc", 10, []),
    ("/usr/bin/gcc", 0, [(I.COMPILER, "/usr/bin/gcc")]),
    ("/usr/bin/gcc-12", 10, [(I.COMPILER, "/usr/bin/gcc-12")]),
    ("/usr/bin/x86_64-linux-gnu-g++-12", 10, [(I.COMPILER, "/usr/bin/x86_64-linux-gnu-g++-12")]),
    ("/usr/lib/gcc/x86_64-linux-gnu/12/cc1", 10, [(I.COMPILER, "/usr/lib/gcc/x86_64-linux-gnu/12/cc1")]),
    ("/usr/bin/nvcc", 10, [(I.COMPILER, "/usr/bin/nvcc")]),
    ("/usr/local/cuda-12.4/bin/nvcc", 10, [(I.COMPILER, "/usr/local/cuda-12.4/bin/nvcc")]),
    ("/usr/local/cuda/targets/x86_64-linux/include/cuda.h", 10,
     [(I.COMPILER, "/usr/local/cuda/targets/x86_64-linux/include/cuda.h")]),
    ("/usr/bin/gzip", 10, []),
    ("/opt/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/include/cuda.h", 10, []),
    ("/usr/local/cuda-12.4/targets/x86_64-linux/lib/libcublas.so.12.4.5.8", 10,
     [(I.CUDA_DUPLICATE, "libcublas.so.12:system")]),
    ("/opt/venv/lib/python3.11/site-packages/nvidia/cublas/lib/libcublasLt.so.12", 10,
     [(I.CUDA_DUPLICATE, "libcublasLt.so.12:wheel")]),
    ("/opt/venv/lib/python3.11/site-packages/nvidia/cudnn/lib/libcudnn_ops.so.9", 10,
     [(I.CUDA_DUPLICATE, "libcudnn_ops.so.9:wheel")]),
    ("/opt/imgbuild/cuda-wheels/nvidia/cudnn/lib/libcudnn.so.9", 10,  # the wheels' shared prefix
     [(I.CUDA_DUPLICATE, "libcudnn.so.9:wheel")]),
    ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", 10, []),  # the driver, not a toolkit library
    ("/srv/libcudart.so.12", 10, []),  # neither a toolkit tree nor a wheel
])
def test_classify_path(path, size, expected):
    assert P.classify_path(path, size, weight_threshold=10 * MiB) == expected


def test_member_names_and_whiteouts():
    assert P.normalize_member("./usr/bin/") == "/usr/bin"
    assert P.normalize_member("usr/bin/env") == "/usr/bin/env"
    assert P.normalize_member("./") is None and P.normalize_member(".") is None
    assert P.whiteout_target("/tmp/.wh.scratch") == ("/tmp/scratch", False)
    assert P.whiteout_target("/opt/app/.wh..wh..opq") == ("/opt/app", True)
    assert P.whiteout_target("/.wh.top") == ("/top", False)
    assert P.whiteout_target("/tmp/what.wh.not") is None


def test_instruction_of():
    assert H.instruction_of("RUN /bin/sh -c set -eu; : imgbuild-step=os; x # buildkit") == "RUN"
    assert H.instruction_of("RUN |1 BASE=x /bin/sh -c true # buildkit") == "RUN"
    assert H.instruction_of("/bin/sh -c #(nop) COPY file:abc in /app ") == "COPY"
    assert H.instruction_of("/bin/sh -c apt-get update") == "RUN"
    assert H.instruction_of("COPY app.txt /app/app.txt # buildkit") == "COPY"
    assert H.instruction_of("WORKDIR /app") == "WORKDIR"
    assert H.instruction_of("") == ""


def _h(created_by: str, empty: bool = False) -> dict:
    return {"created_by": created_by, **({"empty_layer": True} if empty else {})}


def test_attribute_layers_maps_markers_copies_and_base():
    history = [
        _h("/bin/sh -c #(nop) ADD file:abc in / "),  # base
        _h("/bin/sh -c #(nop) COPY file:lic in / "),  # a COPY of the base: not copy-0
        _h('/bin/sh -c #(nop)  CMD ["bash"]', empty=True),
        _h("RUN /bin/sh -c set -eu; : imgbuild-step=os; apt-get install x # buildkit"),
        _h("RUN /bin/sh -c set -eu; : imgbuild-step=ldconfig; ldconfig # buildkit"),
        _h("ENV PATH=/opt/venv/bin:$PATH", empty=True),
        _h("RUN /bin/sh -c set -eu; : imgbuild-step=compiled; pip install x # buildkit"),
        _h("RUN /bin/sh -c echo hand-written # buildkit"),
        _h("COPY src /app/src # buildkit"),
        _h("COPY cfg /app/cfg # buildkit"),
        _h("WORKDIR /app"),
        _h("LABEL a=b", empty=True),
    ]
    got = [(a.step, a.group, a.instruction) for a in H.attribute_layers(history, 9)]
    assert got == [
        (None, "base", "ADD"), (None, "base", "COPY"),
        ("os", "os", "RUN"), ("ldconfig", "cuda", "RUN"), ("compiled", "heavy", "RUN"),
        (None, "other", "RUN"), ("copy-0", "app", "COPY"), ("copy-1", "app", "COPY"),
        ("meta", "meta", "WORKDIR"),
    ]
    # A plan's own table wins over the defaults.
    custom = H.attribute_layers(history, 9, {"os": "python", "copy-1": "heavy"})
    assert custom[2].group == "python" and custom[7].group == "heavy"


def test_the_mount_stubs_copy_is_not_the_recipes_copy_0():
    """issue 22: 11: the COPY of the mount stubs (.imgbuild/empty to /etc/hosts) was labelled
    copy-0 (group app) and the recipe's copy[0] copy-1. History as BuildKit records a wheels
    recipe with one copy: entry (docker20's and docker26's read the same)."""
    history = [
        _h("/bin/sh -c #(nop) ADD file:abc in / "),
        _h("RUN /bin/sh -c set -eu; : imgbuild-step=os; apt-get install x # buildkit"),
        _h("RUN /bin/sh -c set -eu; : imgbuild-step=python; python3 -m venv /opt/venv # buildkit"),
        _h("ENV PATH=/opt/venv/bin:$PATH", empty=True),
        _h("COPY .imgbuild/empty /etc/hosts # buildkit"),
        _h("RUN /bin/sh -c set -eu; : imgbuild-step=mount-stubs; mkdir -p /root/.cache/uv # buildkit"),
        _h("RUN /bin/sh -c set -eu; : imgbuild-step=cuda; uv pip install x # buildkit"),
        _h("RUN /bin/sh -c set -eu; : imgbuild-step=ldconfig; ldconfig # buildkit"),
        _h("COPY app/ /app # buildkit"),
        _h("WORKDIR /app"),
    ]
    got = [(a.step, a.group) for a in H.attribute_layers(history, 9)]
    assert got == [(None, "base"), ("os", "os"), ("python", "python"), ("mount-stubs", "python"),
                   ("mount-stubs", "python"), ("cuda", "cuda"), ("ldconfig", "cuda"), ("copy-0", "app"),
                   ("meta", "meta")]
    # With the plan's own table (what a build's size breakdown passes): the same steps and groups.
    plan = plan_of(load_recipe(REPO / "recipes" / "demo.yaml"))
    table = {st.id: st.group for st in plan.final.steps}
    assert [(a.step, a.group) for a in H.attribute_layers(history, 9, table)] == got
    assert table["copy-0"] == "app" and table["mount-stubs"] == "python"


def test_attribute_layers_with_a_short_history():
    got = H.attribute_layers([_h("RUN /bin/sh -c : imgbuild-step=pins; x")], 3)
    assert [(a.step, a.group) for a in got] == [(None, "base"), (None, "base"), ("pins", "pins")]


# ---------------------------------------------------------------- gzip estimate


@pytest.mark.parametrize("workers", [1, 3])
def test_gzip_counter_matches_gzip_6(workers):
    data = os.urandom(700_000) + b"abcdefgh" * 400_000 + os.urandom(1_500_000) + bytes(2_000_000)
    expected = len(gzip.compress(data, compresslevel=6, mtime=0))
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        counter = S.GzipCounter(pool if workers > 1 else None, workers)
        for i in range(0, len(data), 77_777):  # odd feed sizes
            counter.update(data[i:i + 77_777])
        got = counter.finish()
    assert abs(got - expected) <= expected * 0.002 + 64
    assert S.GzipCounter().finish() == len(gzip.compress(b"", 6, mtime=0))


# ---------------------------------------------------------------- synthetic docker save streams


def _layer_tar(entries: list[tuple[str, bytes | None, str | None]]) -> bytes:
    """entries: (name, data for a file | None for a dir, symlink target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data, link in entries:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                t.addfile(info)
            elif data is None:
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            else:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _save_tar(layers: list[bytes], history: list[dict], *, oci: bool = False) -> tuple[bytes, str, list[str]]:
    diff_ids = ["sha256:" + hashlib.sha256(b).hexdigest() for b in layers]
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": diff_ids}, "history": history}).encode()
    image_id = "sha256:" + hashlib.sha256(config).hexdigest()
    buf = io.BytesIO()

    def add(t, name, data):
        info = tarfile.TarInfo(name)
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))

    with tarfile.open(fileobj=buf, mode="w") as t:
        if oci:
            add(t, "blobs/sha256/" + image_id[7:], config)
            for d, blob in zip(diff_ids, layers, strict=False):
                add(t, "blobs/sha256/" + d[7:], blob)
            add(t, "index.json", b"{}")
        else:
            seen: dict[str, str] = {}
            for n, (d, blob) in enumerate(zip(diff_ids, layers, strict=False)):
                v1 = hashlib.sha256(f"v1-{n}".encode()).hexdigest()
                if d in seen:  # what docker save does with a repeated layer
                    info = tarfile.TarInfo(f"{v1}/layer.tar")
                    info.type, info.linkname = tarfile.SYMTYPE, f"../{seen[d]}/layer.tar"
                    t.addfile(info)
                    continue
                seen[d] = v1
                add(t, f"{v1}/json", b"{}")
                add(t, f"{v1}/layer.tar", blob)
            add(t, image_id[7:] + ".json", config)
        add(t, "manifest.json", b"[]")
    return buf.getvalue(), image_id, diff_ids


SYNTH_HISTORY = [
    _h("/bin/sh -c #(nop) ADD file:abc in / "),
    _h("RUN /bin/sh -c : imgbuild-step=os; x # buildkit"),
    _h("RUN /bin/sh -c : imgbuild-step=pins; x # buildkit"),
    _h("RUN /bin/sh -c : imgbuild-step=heavy; x # buildkit"),
]


def _synthetic_layers() -> list[bytes]:
    base = _layer_tar([("./", None, None), ("./usr/", None, None), ("./usr/bin/", None, None),
                       ("./usr/bin/env", b"e" * 100, None), ("./usr/bin/cc", None, "gcc-12"),
                       ("./opt/", None, None), ("./opt/app/", None, None),
                       ("./opt/app/old.py", b"o" * 3000, None), ("./opt/app/sub/x.py", b"x" * 500, None)])
    os_layer = _layer_tar([("var/cache/apt/archives/a_1_amd64.deb", b"d" * 2000, None),
                           ("root/.cache/pip/http/1/2", b"p" * 700, None),
                           ("data/big.bin", b"b" * 4096, None),
                           ("data/weights.pt", b"w" * 5000, None)])
    pins = _layer_tar([("data/.wh.big.bin", b"", None), ("opt/app/.wh..wh..opq", b"", None),
                       ("opt/app/new.py", b"n" * 10, None)])
    heavy = _layer_tar([("var/cache/apt/archives/b_1_amd64.deb", b"d" * 10, None)])
    return [base, os_layer, pins, heavy]


@pytest.mark.parametrize("oci", [False, True])
def test_analyze_save_stream_on_a_synthetic_image(oci):
    layers = _synthetic_layers()
    raw, image_id, diff_ids = _save_tar(layers, SYNTH_HISTORY, oci=oci)
    saved = S.analyze_save_stream(io.BytesIO(raw), image_id=image_id, diff_ids=diff_ids, workers=1)
    assert saved.config and saved.config["history"] == SYNTH_HISTORY
    report = I.build_report(I.ImageFacts("synthetic:1", image_id, diff_ids, saved.config["history"],
                                         {"io.imgbuild.cuda.flavor": "runtime"}),
                            saved, I.InspectOptions(bandwidth_mbps=8, weight_threshold=4096))
    assert [x.digest for x in report.layers] == diff_ids
    assert [x.blob_size for x in report.layers] == [len(b) for b in layers]
    assert report.layers[0].size == 100 + 3000 + 500 + len("gcc-12")
    assert [(x.step, x.group) for x in report.layers] == [(None, "base"), ("os", "os"), ("pins", "pins"),
                                                          ("heavy", "heavy")]
    for x, blob in zip(report.layers, layers, strict=False):
        assert abs(x.compressed_size - len(gzip.compress(blob, 6))) <= 32
    assert report.pull_seconds == pytest.approx(report.compressed_size * 8 / 8e6)
    with_unpack = I.build_report(I.ImageFacts("synthetic:1", image_id, diff_ids, saved.config["history"], {}),
                                 saved, I.InspectOptions(bandwidth_mbps=8, unpack_mbps=0.5))
    # each layer unpacks as its download ends (the cold-start model): below the plain sum, above either part
    download, unpack = report.compressed_size * 8 / 8e6, report.blob_size / 0.5e6
    assert max(download, unpack) < with_unpack.pull_seconds < download + unpack
    assert with_unpack.pull_seconds == pytest.approx(cold_start.ready_seconds(
        [(x.compressed_size / 1e6, x.blob_size / 0.5e6) for x in report.layers]))
    assert with_unpack.to_json()["unpack_mbps"] == 0.5

    found = {(f.kind, f.layer, f.path): f for f in report.findings}
    assert found[(I.WEIGHTS, 1, "/data/weights.pt")].size == 5000
    assert (I.WEIGHTS, 1, "/data/big.bin") not in found  # 4096 is not over a 4096 threshold
    assert found[(I.CACHE, 1, "/var/cache/apt/archives")].size == 2000
    assert found[(I.CACHE, 1, "/root/.cache/pip")].size == 700
    assert found[(I.CACHE, 3, "/var/cache/apt/archives")].step == "heavy"
    assert found[(I.COMPILER, 0, "/usr/bin/cc")].step is None
    deleted = found[(I.DELETED, 1, "/data/big.bin")]
    assert deleted.size == 4096 and "step pins" in deleted.message and deleted.step == "os"
    opaque = found[(I.DELETED, 0, "/opt/app")]
    assert opaque.size == 3500 and "2 file(s)" in opaque.message
    assert sum(I.group_sizes(report).values()) == report.size


def _containerd_save_tar(layers: list[bytes], history: list[dict]) -> tuple[bytes, str, list[str], list[int]]:
    """What `docker save` writes from the containerd image store: an OCI layout whose image id
    is an index (image + attestation manifest), layers compressed (gzip and zstd here)."""
    import zstandard

    diff_ids = ["sha256:" + hashlib.sha256(b).hexdigest() for b in layers]
    blobs = [gzip.compress(b, 6) if n % 2 == 0 else zstandard.ZstdCompressor(level=3).compress(b)
             for n, b in enumerate(layers)]
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": diff_ids}, "history": history}).encode()

    def desc(data: bytes, media_type: str, **kw) -> dict:
        return {"mediaType": media_type, "digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data), **kw}  # noqa: E501

    manifest = json.dumps({"schemaVersion": 2, "config": desc(config, "application/vnd.oci.image.config.v1+json"),
                           "layers": [desc(b, "application/vnd.oci.image.layer.v1.tar+gzip") for b in blobs]}).encode()
    attestation = json.dumps({"schemaVersion": 2, "config": desc(b"{}", "application/vnd.oci.image.config.v1+json"),
                              "layers": []}).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [
        desc(attestation, "application/vnd.oci.image.manifest.v1+json",
             platform={"os": "unknown", "architecture": "unknown"}),
        desc(manifest, "application/vnd.oci.image.manifest.v1+json",
             platform={"os": "linux", "architecture": "amd64"})]}).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for data in [*blobs, config, manifest, attestation, b"{}", index]:
            info = tarfile.TarInfo("blobs/sha256/" + hashlib.sha256(data).hexdigest())
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        for name, data in (("index.json", b"{}"), ("oci-layout", b"{}"), ("manifest.json", b"[]")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue(), "sha256:" + hashlib.sha256(index).hexdigest(), diff_ids, [len(b) for b in blobs]


def test_analyze_the_containerd_stores_oci_layout():
    layers = _synthetic_layers()
    raw, image_id, diff_ids, blob_sizes = _containerd_save_tar(layers, SYNTH_HISTORY)
    saved = S.analyze_save_stream(io.BytesIO(raw), image_id=image_id, diff_ids=diff_ids, workers=1)
    assert saved.config and saved.config["history"] == SYNTH_HISTORY
    assert [saved.layers[d].compression for d in diff_ids] == ["gzip", "zstd", "gzip", "zstd"]
    report = I.build_report(I.ImageFacts("c:1", image_id, diff_ids, saved.config["history"], {}), saved)
    # uncompressed from the tars inside, compressed exactly the stored blobs (no estimate)
    assert [x.blob_size for x in report.layers] == [len(b) for b in layers]
    assert [x.compressed_size for x in report.layers] == blob_sizes
    assert report.compressed_source == "store" and report.compressed_size == sum(blob_sizes)
    out = report.to_json()
    assert out["size_uncompressed"] == report.size and out["size_compressed"] == sum(blob_sizes)
    remote = I.build_report(I.ImageFacts("c:1", image_id, diff_ids, saved.config["history"], {},
                                         registry_sizes=[1, 2, 3, 4]), saved)
    assert remote.compressed_size == 10 and remote.compressed_source == "registry"


def test_resolve_config_follows_index_and_manifest():
    config = {"rootfs": {"diff_ids": []}}
    blobs = {"c" * 64: config, "m" * 64: {"config": {"digest": "sha256:" + "c" * 64}, "layers": []},
             "i" * 64: {"manifests": [{"digest": "sha256:" + "m" * 64,
                                       "platform": {"os": "linux", "architecture": "amd64"}}]}}
    assert S.resolve_config(blobs, "i" * 64) is config and S.resolve_config(blobs, "m" * 64) is config
    assert S.resolve_config(blobs, "c" * 64) is config and S.resolve_config(blobs, "x" * 64) is None


def test_repeated_layers_and_missing_layers():
    layer = _layer_tar([("a", b"a" * 10, None)])
    raw, image_id, diff_ids = _save_tar([layer, layer], [_h("ADD a /"), _h("ADD a /")])
    saved = S.analyze_save_stream(io.BytesIO(raw), image_id=image_id, diff_ids=diff_ids,
                                  estimate_compressed=False)
    report = I.build_report(I.ImageFacts("r", image_id, diff_ids, saved.config["history"], {}), saved)
    assert [x.size for x in report.layers] == [10, 10] and report.compressed_size is None
    assert report.pull_seconds is None
    with pytest.raises(InspectError, match="lacks layer"):
        S.analyze_save_stream(io.BytesIO(raw), image_id=image_id, diff_ids=diff_ids + ["sha256:" + "0" * 64])


def _tiny_report() -> I.ImageReport:
    raw, image_id, diff_ids = _save_tar(_synthetic_layers(), SYNTH_HISTORY)
    saved = S.analyze_save_stream(io.BytesIO(raw), image_id=image_id, diff_ids=diff_ids, workers=1)
    return I.build_report(I.ImageFacts("synthetic:1", image_id, diff_ids, saved.config["history"],
                                       {"io.imgbuild.cuda.flavor": "devel"}),
                          saved, I.InspectOptions(weight_threshold=4096))


def test_report_json_keys_and_budget():
    report = _tiny_report()
    out = report.to_json()
    assert {"image", "id", "size", "compressed_size", "pull_seconds", "bandwidth_mbps", "layers", "groups",
            "findings"} <= set(out)
    assert set(out["layers"][0]) >= {"digest", "size", "step", "group", "created_by"}
    assert set(out["findings"][0]) >= {"kind", "severity", "layer", "path", "size", "message"}
    assert list(out["groups"]) == ["base", "os", "heavy", "pins"]  # build order, not size order
    json.dumps(out)  # serialisable as is
    assert not any(f["kind"] == I.COMPILER for f in out["findings"])  # devel flavour may have cc

    I.check_budget(report, report.size)
    with pytest.raises(SizeBudgetExceeded) as exc:
        I.check_budget(report, report.size - 1)
    assert exc.value.groups == I.group_sizes(report) and "base" in exc.value.message
    assert exc.value.to_json()["max_size"] == report.size - 1


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


BOX = set("┃│━─┏┡└")


def test_report_is_aligned_text_in_a_pipe():
    """issue 22: 9: inspect drew 160-column box tables into a pipe; off a terminal it prints
    aligned columns, as build --all does."""
    stdout = io.StringIO()
    Out(stdout, io.StringIO()).blocks(I.report_blocks(_tiny_report()))
    text = stdout.getvalue()
    assert not BOX & set(text) and "\x1b[" not in text
    for needle in ("synthetic:1", "\nLayers\n", "\nGroups\n", "\nFindings\n", "weights", "deleted-later",
                   "/data/big.bin"):
        assert needle in text
    lines = text.splitlines()
    header = lines[lines.index("Layers") + 1]
    assert header.split() == ["#", "STEP", "GROUP", "SIZE", "COMPRESSED", "CREATED", "BY"]
    rows = lines[lines.index("Layers") + 2:lines.index("Groups") - 1]
    size_end = header.index("SIZE") + len("SIZE")  # right-aligned: every size ends under the header's end
    assert rows and all(row[size_end - 1] != " " and row[size_end] == " " for row in rows)
    assert all(line == line.rstrip() for line in lines)


def test_report_is_a_rich_table_on_a_terminal():
    stdout = _Terminal()
    Out(stdout, io.StringIO()).blocks(I.report_blocks(_tiny_report()))
    text = stdout.getvalue()
    assert BOX & set(text)
    for needle in ("synthetic:1", "Layers", "Groups", "Findings", "weights", "deleted-later", "/data/big.bin"):
        assert needle in text


def test_the_save_stream_is_counted_against_the_engines_size():
    heard: list[tuple[str, str, int, int]] = []
    chunks = [b"x" * 40, b"x" * 40, b"x" * 40]  # 120 bytes where the engine said 100 (tar headers)
    counted = I._Counted(iter(chunks), lambda *a: heard.append(a), "img:1", 100)
    assert b"".join(counted) == b"x" * 120
    counted.finish()
    assert heard == [("read", "img:1", 40, 100), ("read", "img:1", 80, 100), ("read", "img:1", 99, 100),
                     ("read", "img:1", 120, 120)]  # short of the estimate until the real count at the end
    heard.clear()
    counted = I._Counted(iter(chunks), lambda *a: heard.append(a), "img:1", 200)
    next(iter(counted))  # the tar reader stops at the archive's end, before the stream does
    counted.finish()
    assert heard == [("read", "img:1", 40, 200), ("read", "img:1", 40, 40)]
    heard.clear()
    counted = I._Counted(iter(chunks), lambda *a: heard.append(a), "img:1", 0)  # size unknown
    list(counted)
    counted.finish()
    assert heard[0] == ("read", "img:1", 40, 0) and heard[-1] == ("read", "img:1", 120, 120)


def test_text_table_columns():
    table = TextTable("T", ("name", "size"), (("a", "1 B"), ("long-name", "10.0 MiB")), right=frozenset({"size"}))
    assert table.lines() == ["T", "NAME           SIZE", "a               1 B", "long-name  10.0 MiB"]


# ---------------------------------------------------------------- real images (BuildKit, real engine)


def _build(base_image: str, dockerfile: str, tag: str, tmp: Path) -> str:
    context = tmp / "context"
    context.mkdir()
    shutil.copy(FIXTURES / "app.txt", context / "app.txt")
    shutil.copy(FIXTURES / dockerfile, tmp / "Dockerfile")
    iid = tmp / "iid"
    cmd = ["/usr/bin/docker", "build", "--network", "host", "--build-arg", f"BASE={base_image}",
           "--label", f"{RUN_LABEL}={RUN_MARK}",
           "-f", str(tmp / "Dockerfile"), "-t", tag, "--iidfile", str(iid), str(context)]
    proc = subprocess.run(cmd, check=False, env={**os.environ, "DOCKER_BUILDKIT": "1"}, capture_output=True, text=True,
                          timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"building {dockerfile} failed:\n{proc.stderr[-3000:]}", pytrace=False)
    return iid.read_text().strip()


@pytest.fixture(scope="module")
def built(docker_client, base_image, tmp_path_factory):
    """The dirty and the clean image, built once for the module and removed after it."""
    name = unique("imgbuild-test/inspect")
    tags = {"dirty": f"{name}:dirty", "clean": f"{name}:clean"}
    try:
        for kind, tag in tags.items():
            _build(base_image, f"{kind}.Dockerfile", tag, tmp_path_factory.mktemp(kind))
        yield tags
    finally:
        for tag in tags.values():
            subprocess.run(["/usr/bin/docker", "image", "rm", "-f", tag], check=False, capture_output=True)


@pytest.fixture(scope="module")
def dirty(engine, built):
    # No gzip pass here (the clean image checks it): it is most of the time on a small machine.
    return I.inspect_image(engine, built["dirty"], I.InspectOptions(estimate_compressed=False))


@pytest.fixture(scope="module")
def clean(engine, built):
    return I.inspect_image(engine, built["clean"], I.InspectOptions(bandwidth_mbps=100))


def _one(report: I.ImageReport, kind: str, path: str) -> I.Finding:
    hits = [f for f in report.findings if f.kind == kind and f.path == path]
    assert len(hits) == 1, f"{kind} {path}: {report.findings}"
    return hits[0]


def test_layers_map_to_steps(dirty, docker_client, engine, built):
    steps = [(x.step, x.group) for x in dirty.layers]
    assert steps[0] == (None, "base")
    assert steps[1:] == [("os", "os"), ("python", "python"), ("cuda", "cuda"), ("heavy", "heavy"),
                         ("pins", "pins"), ("copy-0", "app")]
    assert dirty.layers[-1].instruction == "COPY"
    image = docker_client.images.get(built["dirty"])
    assert dirty.id == image.id and dirty.size == engine.image_sizes(built["dirty"]).uncompressed
    assert [x.digest for x in dirty.layers] == image.attrs["RootFS"]["Layers"]
    assert dirty.labels == {"io.imgbuild.cuda.flavor": "runtime", "io.imgbuild.cuda.version": "12.4"}
    groups = I.group_sizes(dirty)
    assert sum(groups.values()) == dirty.size
    assert groups["heavy"] >= 12 * MiB + 1 * MiB + 5 * MiB


def test_weights_found_in_their_layer(dirty):
    f = _one(dirty, I.WEIGHTS, "/models/model.safetensors")
    assert (f.step, f.size, f.severity) == ("heavy", 12 * MiB, "warning")
    assert not [x for x in dirty.findings if x.path == "/models/small.bin"]


def test_caches_found_in_their_layer(dirty):
    pip = _one(dirty, I.CACHE, "/root/.cache/pip")
    apt = _one(dirty, I.CACHE, "/var/cache/apt/archives")
    assert (pip.step, pip.size) == ("os", 4096)
    assert (apt.step, apt.size) == ("os", 8192)
    assert not [x for x in dirty.findings if "__pycache__" in x.path]


def test_nvcc_in_a_runtime_image_and_duplicate_cudart(dirty):
    nvcc = _one(dirty, I.COMPILER, "/usr/bin/nvcc")
    assert nvcc.step == "cuda"
    wheel_copy = "/opt/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12"
    dup = _one(dirty, I.CUDA_DUPLICATE, wheel_copy)
    assert dup.step == "cuda" and dup.size == 32768 and "/usr/local/cuda-12.4/" in dup.message


def test_deleted_files_still_shipped(dirty):
    scratch = _one(dirty, I.DELETED, "/tmp/scratch")
    data = _one(dirty, I.DELETED, "/opt/data.bin")
    assert (scratch.step, scratch.size) == ("heavy", 3 * MiB)
    assert (data.step, data.size) == ("heavy", 2 * MiB)
    assert "step pins" in scratch.message


def test_clean_image_has_no_findings(clean, engine, built):
    assert clean.findings == ()
    assert [x.step for x in clean.layers[1:]] == ["os", "pins", "cuda", "copy-0"]
    assert clean.labels == {"io.imgbuild.cuda.flavor": "devel"}  # nvcc is fine in a devel flavour
    sizes = engine.image_sizes(built["clean"])
    assert sum(I.group_sizes(clean).values()) == clean.size == sizes.uncompressed
    # gzip -6 of random-free OS files (or the store's own gzip blobs): well under the tar size,
    # and a pull time that follows from it
    assert 0 < clean.compressed_size < clean.blob_size
    assert clean.compressed_source == ("store" if engine.containerd_store() else "estimate")
    if sizes.compressed is not None:  # the containerd store counts its blobs (+ config, manifests)
        assert clean.compressed_size <= sizes.compressed
    assert clean.pull_seconds == pytest.approx(clean.compressed_size * 8 / 100e6)
    out = clean.to_json()
    assert out["findings"] == [] and out["bandwidth_mbps"] == 100
    assert [x["step"] for x in out["layers"]][1:] == ["os", "pins", "cuda", "copy-0"]


def test_missing_image(engine):
    with pytest.raises(ImageMissing):
        I.inspect_image(engine, f"imgbuild-test/absent-{uuid.uuid4().hex[:8]}:nope")


def test_engine_layer_sizes_line_up_with_the_config_history():
    config = [_h("ADD a /"), _h("ENV X=1", empty=True), _h("RUN x"), _h("LABEL a=b", empty=True)]
    engine = [HistoryEntry("", size) for size in (0, 30, 0, 100)]  # newest first
    assert I.engine_layer_sizes(config, engine, 2) == [100, 30]
    assert I.engine_layer_sizes(config, engine[1:], 2) is None  # histories that do not line up
    assert I.engine_layer_sizes(config, engine, 3) is None


def test_compilers_grouped_by_folder_and_layer():
    # What `apt-get install gcc` leaves in /usr/bin: one finding for the folder, not one per name
    names = ["gcc", "gcc-12", "x86_64-linux-gnu-gcc", "x86_64-linux-gnu-gcc-12", "cc", "c++", "g++"]
    layer = _layer_tar([(f"usr/bin/{n}", b"g" * 10, None) for n in names]
                       + [("usr/lib/gcc/x86_64-linux-gnu/12/cc1", b"c" * 100, None)])
    history = [_h("RUN /bin/sh -c : imgbuild-step=os; x # buildkit")]
    raw, image_id, diff_ids = _save_tar([layer], history)
    saved = S.analyze_save_stream(io.BytesIO(raw), image_id=image_id, diff_ids=diff_ids, workers=1)
    report = I.build_report(I.ImageFacts("gcc:1", image_id, diff_ids, history, {"io.imgbuild.cuda.flavor": "runtime"}),
                            saved, I.InspectOptions(bandwidth_mbps=8, weight_threshold=4096))
    compilers = {f.path: f for f in report.findings if f.kind == I.COMPILER}
    assert {p: f.size for p, f in compilers.items()} == {"/usr/bin": 70, "/usr/lib/gcc/x86_64-linux-gnu/12/cc1": 100}
    assert "7 compiler files in /usr/bin (c++, cc, g++, gcc, gcc-12 and 2 more)" in compilers["/usr/bin"].message


@pytest.mark.parametrize("layout", ["classic", "containerd"])
def test_inspect_kernels_reads_the_coverage_in_the_same_pass_over_the_layers(layout):
    """issue 30: inspect --kernels lists architectures x libraries (bytes of SASS per architecture) from
    the one `docker save` stream it reads anyway, stacked as a container sees the layers: a library a
    later layer replaces counts as replaced, one it deletes not at all; the image's file system is not
    exported a second time."""
    from fatbin_bytes import PTX, SASS, elf, entry, fatbin

    def so(*entries: bytes) -> bytes:
        return elf({".nv_fatbin": fatbin(*entries)})

    big = b"k" * 4000
    base = _layer_tar([("venv/torch/lib/libtorch_cuda.so", so(entry(SASS, 80, payload=big),
                                                              entry(SASS, 90, payload=big)), None),
                       ("venv/old/libgone.so", so(entry(SASS, 70, payload=big)), None),
                       ("venv/ext/_C.so", so(entry(SASS, 80, payload=big)), None)])
    top = _layer_tar([("venv/old/.wh.libgone.so", b"", None),
                      ("venv/ext/_C.so", so(entry(SASS, 90, payload=b"s" * 1000), entry(PTX, 90, version=(8, 4))),
                       None)])
    history = [_h("/bin/sh -c #(nop) ADD file:abc in / "), _h("RUN /bin/sh -c : imgbuild-step=pins; x # buildkit")]
    if layout == "classic":
        raw, image_id, diff_ids = _save_tar([base, top], history)
    else:
        raw, image_id, diff_ids, _ = _containerd_save_tar([base, top], history)

    class Engine(FakeEngine):
        saves = 0

        def __init__(self):
            super().__init__(images={"img:1": image_info(image_id, layers=diff_ids, size=len(raw))}, files=raw)

        def save(self, ref, chunk_size=1 << 20):
            Engine.saves += 1
            return super().save(ref, chunk_size)

        def filesystem(self, ref, chunk_size=1 << 20):
            raise AssertionError("inspect --kernels must not export the image a second time")

    report = I.inspect_image(Engine(), "img:1", I.InspectOptions(estimate_compressed=False, registry_sizes=False,
                                                                 kernels=True))
    assert Engine.saves == 1
    cov = report.kernels
    assert cov is not None and cov.archs == ("sm_80", "sm_90")
    assert [(p, b, x) for p, b, x in cov.libraries] == [
        ("/venv/ext/_C.so", {"sm_90": 1000}, ("compute_90 (8.4)",)),
        ("/venv/torch/lib/libtorch_cuda.so", {"sm_80": 4000, "sm_90": 4000}, ())]
    assert report.to_json()["kernels"]["sass_bytes"] == {"sm_80": 4000, "sm_90": 5000}
    table = I.report_blocks(report)[-1]
    assert isinstance(table, TextTable) and table.title == "CUDA kernels (bytes of SASS per architecture)"
    assert table.rows[-1][:3] == ("all libraries", "3.9 KiB", "4.9 KiB")
    plain = I.inspect_image(Engine(), "img:1", I.InspectOptions(estimate_compressed=False, registry_sizes=False))
    assert plain.kernels is None and "kernels" not in plain.to_json()
