"""imgbuild diff on manifests, configs and engine histories recorded from the local registry
and engine (tests/fixtures/diff: two images, the second differing only in its COPY layer)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from buildkit_py import oci
from buildkit_py.analysis import diff as D
from buildkit_py.engine.kinds.docker_format import history_entries, image_info
from buildkit_py.errors import RegistryError, UsageError

FIX = Path(__file__).parent / "fixtures" / "diff"


def recorded(name: str) -> dict:
    return json.loads((FIX / f"{name}.json").read_text())


def typed(r: dict) -> tuple[oci.Manifest, oci.ImageConfig]:
    """A recorded manifest and config as the registry client parses them (the recorded digest: the
    fixture keeps the parsed JSON, not the bytes it was served as)."""
    manifest = oci.parse_manifest(oci.canonical_json(r["manifest"]), r.get("digest") or "", oci.MEDIA_OCI_MANIFEST,
                                  r["image"])
    assert isinstance(manifest, oci.Manifest)
    return manifest, oci.parse_image_config(oci.canonical_json(r["config"]), manifest.config.digest, r["image"])


def from_registry(name: str, sizes=None) -> D.ImageLayers:
    r = recorded(name)
    return D.layers_from_manifest(r["image"], *typed(r), sizes=sizes)


def from_engine(name: str) -> D.ImageLayers:
    r = recorded(name)
    # recorded from docker's inspect and history API (newest first), parsed as the docker kinds parse them
    return D.layers_from_engine(r["image"], image_info(r["engine_attrs"]), history_entries(r["engine_history"][::-1]))


def test_registry_images_share_by_blob_digest():
    a, b = from_registry("t1"), from_registry("t2")
    d = D.diff_layers(a, b, bandwidth_mbps=100)
    assert [(x.status, x.matched_by) for x in d.layers] == [("shared", "digest"), ("shared", "digest"), ("new", None)]
    assert [(x.layer.step, x.layer.group) for x in d.layers] == [(None, "base"), ("pins", "pins"), ("copy-0", "app")]
    assert d.totals.compressed_size == 65775542 + 3001212 + 141
    assert d.totals.new_compressed_size == 141 and d.totals.new_layers == 1
    assert d.totals.pull_seconds == pytest.approx(141 * 8 / 100e6)
    assert d.totals.size is None  # the manifest alone does not tell unpacked bytes of gzip layers


def test_identical_image_downloads_nothing():
    d = D.diff_layers(from_registry("t2"), from_registry("t2"))
    assert d.totals.new_layers == 0 and d.totals.new_compressed_size == 0 and d.totals.new_fraction == 0


def test_counted_sizes_are_summed_for_new_layers():
    b = from_registry("t2", sizes=[180098560, 3002368, 2560])
    d = D.diff_layers(from_registry("t1"), b)
    assert (d.totals.size, d.totals.new_size) == (180098560 + 3002368 + 2560, 2560)


def test_engine_history_gives_sizes_and_steps_but_no_blobs():
    b = from_engine("t2")
    assert [x.diff_id for x in b.layers] == recorded("t2")["config"]["rootfs"]["diff_ids"]
    assert [x.size for x in b.layers] == [173254345, 3000000, 2]  # the engine's own counts (docker history)
    assert [x.step for x in b.layers] == [None, "pins", "copy-0"]
    assert all(x.digest is None and x.compressed_size is None for x in b.layers)


def test_engine_side_matches_by_diff_id():
    d = D.diff_layers(from_engine("t1"), from_registry("t2"))
    assert [(x.status, x.matched_by) for x in d.layers] == [("shared", "diff-id"), ("shared", "diff-id"), ("new", None)]
    assert d.totals.new_compressed_size == 141
    d = D.diff_layers(from_engine("t1"), from_engine("t2"))
    assert d.totals.new_compressed_size is None and d.totals.new_size == 2 and d.totals.pull_seconds is None


def test_same_content_other_compression_is_downloaded_again():
    # An engine pulling B checks blob digests: a recompressed layer is fetched although its
    # content (diff id) is already there.
    a = from_registry("t1")
    a = replace(a, layers=tuple(replace(x, digest="sha256:" + "0" * 64) if x.index == 1 else x for x in a.layers))
    d = D.diff_layers(a, from_registry("t2"))
    assert [x.status for x in d.layers] == ["shared", "new", "new"]
    assert d.totals.new_compressed_size == 3001212 + 141


def test_a_blob_twice_in_b_is_downloaded_once():
    b = from_registry("t2")
    copy = replace(b.layers[2], index=3)
    b = replace(b, layers=b.layers + (copy,))
    d = D.diff_layers(from_registry("t1"), b)
    assert [(x.status, x.matched_by) for x in d.layers][2:] == [("new", None), ("shared", "earlier-layer")]
    assert d.totals.new_compressed_size == 141


def test_json_schema_1():
    d = D.diff_layers(from_registry("t1"), from_registry("t2"))
    out = d.to_json()
    assert out["schema"] == 1
    assert out["a"]["digest"] == recorded("t1")["digest"] and out["b"]["source"] == "registry"
    assert out["totals"]["shared_compressed_size"] == 65775542 + 3001212
    assert out["totals"]["new_fraction"] == round(141 / (65775542 + 3001212 + 141), 6)
    assert out["layers"][2] == {
        "index": 2, "digest": recorded("t2")["manifest"]["layers"][2]["digest"],
        "diff_id": recorded("t2")["config"]["rootfs"]["diff_ids"][2], "step": "copy-0", "group": "app",
        "created_by": "COPY v.txt /app/v.txt # buildkit", "compressed_size": 141, "size": None,
        "status": "new", "matched_by": None}
    json.dumps(out)


def test_manifest_and_config_must_agree():
    r = recorded("t2")
    r["manifest"]["layers"] = r["manifest"]["layers"][:2]
    with pytest.raises(RegistryError, match="manifest lists 2 layers but the config 3"):
        D.layers_from_manifest(r["image"], *typed(r))


def test_bad_bandwidth_and_source_are_usage_errors():
    with pytest.raises(UsageError):
        D.diff_layers(from_registry("t1"), from_registry("t2"), bandwidth_mbps=0)
    with pytest.raises(UsageError):
        D.read_image("x/y:1", source="s3")


def test_pull_time_adds_unpacking_of_the_new_bytes():
    b = from_registry("t2", sizes=[180098560, 3002368, 2560])
    d = D.diff_layers(from_registry("t1"), b, bandwidth_mbps=80, unpack_mbps=2)
    assert d.totals.pull_seconds == pytest.approx(141 * 8 / 80e6 + 2560 / 2e6)
    assert d.to_json()["totals"]["unpack_mbps"] == 2
    # unpacked bytes unknown: no figure rather than a network-only one that claims to include unpacking
    assert D.diff_layers(from_registry("t1"), from_registry("t2"), unpack_mbps=2).totals.pull_seconds is None
    with pytest.raises(UsageError):
        D.diff_layers(from_registry("t1"), b, unpack_mbps=0)


def test_a_node_holding_several_images_shares_what_any_of_them_has():
    """--node: B's layers that A lacks but another image on the node has are not pulled again
    (the CUDA layers of an image on another OS or Python)."""
    t1, t2 = from_registry("t1"), from_registry("t2")
    only_base = replace(t1, image="base-only", layers=t1.layers[:1])
    only_app = replace(t2, image="app-only", layers=t2.layers[2:])
    alone = D.diff_layers(only_base, t2)
    assert [x.status for x in alone.layers] == ["shared", "new", "new"]
    node = D.held_by_node([only_base, only_app])
    assert node.image == "base-only + app-only" and node.source == D.SOURCE_REGISTRY
    both = D.diff_layers(node, t2)
    assert [(x.status, x.matched_by) for x in both.layers] == [
        ("shared", "digest"), ("new", None), ("shared", "digest")]
    assert both.totals.new_compressed_size == 3001212
    # one image from the engine: no blob digests to match on, so diff ids, as for one A
    mixed = D.held_by_node([only_base, from_engine("t2")])
    assert mixed.source == D.SOURCE_ENGINE
    assert all(x.matched_by == "diff-id" for x in D.diff_layers(mixed, t2).layers)
    assert D.held_by_node([t1]) is t1


def test_the_diff_says_what_the_node_already_has():
    text = D.diff_blocks(D.diff_layers(from_registry("t1"), from_registry("t2")))
    assert "already on the node: 2 of 3 layers, 65.6 MiB compressed" in [b for b in text if isinstance(b, str)]
