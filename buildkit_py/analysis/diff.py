"""What a node that holds image A must download to run image B (``imgbuild diff A B``).

Each image is read either from its registry (manifest and config only; the layer blobs of B
are streamed once, when asked, to count their uncompressed bytes, nothing is written to
disk) or from the local engine store (the engine keeps no compressed blobs, so compressed
sizes are unknown there).

A may be several images (``--node``: what the node already holds); their layers count together.
A layer of B is *shared* when A has the same blob: same compressed digest when both images
come from a registry (that is what an engine pulling B checks: a blob it has not seen is
downloaded even when its content turns out to be a layer it holds), else the same diff id
(uncompressed digest) when one side is the local store and has no blob digests. A blob that
occurs twice in B is downloaded once: its second occurrence is shared with B itself.

The recipe step and layer group of each layer come from the image's history, attributed as
``imgbuild inspect`` does (``inspect.attribute_layers``: the ``imgbuild-step=`` marker each
rendered RUN carries).

Everything past reading (``diff_layers`` and the JSON/table output) is pure and works on the
frozen ``ImageLayers`` values, so it is unit-tested on manifests recorded from the registry.
"""

from __future__ import annotations

import concurrent.futures
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from buildkit_py import oci
from buildkit_py.analysis.inspect import pull_seconds, short_created
from buildkit_py.errors import ImageMissing, ManifestNotFound, RegistryError, UsageError
from buildkit_py.oci.transport import Progress
from buildkit_py.plan.history import attribute_layers, instruction_of
from buildkit_py.reference import names_registry
from buildkit_py.sizes import human_size
from buildkit_py.text_table import Block, TextTable

if TYPE_CHECKING:
    from buildkit_py.engine.base import Engine, HistoryEntry, ImageInfo

SCHEMA = 1
SOURCE_REGISTRY, SOURCE_ENGINE = "registry", "engine"
SHARED, NEW = "shared", "new"
BY_DIGEST, BY_DIFF_ID, BY_SELF = "digest", "diff-id", "earlier-layer"

_GZIP_TYPES = ("application/vnd.oci.image.layer.v1.tar+gzip",
               "application/vnd.docker.image.rootfs.diff.tar.gzip")
_TAR_TYPES = ("application/vnd.oci.image.layer.v1.tar",
              "application/vnd.docker.image.rootfs.diff.tar")
_ZSTD_TYPES = ("application/vnd.oci.image.layer.v1.tar+zstd",)


@dataclass(frozen=True)
class LayerInfo:
    index: int  # position in the image's rootfs, 0 = bottom
    digest: str | None  # blob digest (compressed); None from the engine store
    diff_id: str  # sha256 of the uncompressed layer tar
    compressed_size: int | None  # blob bytes; None from the engine store
    size: int | None  # uncompressed bytes (tar from a registry, the engine's count locally); None if not counted
    media_type: str | None
    step: str | None
    group: str
    created_by: str


@dataclass(frozen=True)
class ImageLayers:
    image: str  # the reference as given
    source: str  # SOURCE_REGISTRY or SOURCE_ENGINE
    digest: str | None  # manifest digest (registry) or image id (engine)
    layers: tuple[LayerInfo, ...]
    labels: Mapping[str, str]


def held_by_node(images: Sequence[ImageLayers]) -> ImageLayers:
    """What a node holding every one of ``images`` has: their layers together, as one A. Blob
    digests count only where every image came from a registry (else diff ids, as for one A)."""
    if len(images) == 1:
        return images[0]
    source = SOURCE_REGISTRY if all(x.source == SOURCE_REGISTRY for x in images) else SOURCE_ENGINE
    return ImageLayers(" + ".join(x.image for x in images), source, None,
                       tuple(layer for x in images for layer in x.layers), {})


@dataclass(frozen=True)
class LayerDiff:
    layer: LayerInfo
    status: str  # SHARED or NEW
    matched_by: str | None  # BY_DIGEST, BY_DIFF_ID, BY_SELF; None when new


@dataclass(frozen=True)
class Totals:
    layers: int
    new_layers: int
    compressed_size: int | None  # all of B
    new_compressed_size: int | None  # what must be downloaded
    size: int | None
    new_size: int | None
    pull_seconds: float | None  # new compressed bytes at bandwidth_mbps (+ their unpacking at unpack_mbps)
    bandwidth_mbps: float
    unpack_mbps: float | None = None

    @property
    def new_fraction(self) -> float | None:
        if not self.compressed_size or self.new_compressed_size is None:
            return None
        return self.new_compressed_size / self.compressed_size


@dataclass(frozen=True)
class ImageDiff:
    a: ImageLayers
    b: ImageLayers
    layers: tuple[LayerDiff, ...]
    totals: Totals

    def to_json(self) -> dict[str, Any]:
        t = self.totals
        frac = t.new_fraction
        return {
            "schema": SCHEMA,
            "a": _image_json(self.a),
            "b": _image_json(self.b),
            "layers": [
                {"index": x.layer.index, "digest": x.layer.digest, "diff_id": x.layer.diff_id, "step": x.layer.step,
                 "group": x.layer.group, "created_by": x.layer.created_by, "compressed_size": x.layer.compressed_size,
                 "size": x.layer.size, "status": x.status, "matched_by": x.matched_by}
                for x in self.layers],
            "totals": {
                "layers": t.layers, "new_layers": t.new_layers, "shared_layers": t.layers - t.new_layers,
                "compressed_size": t.compressed_size, "new_compressed_size": t.new_compressed_size,
                "shared_compressed_size": (None if t.compressed_size is None or t.new_compressed_size is None
                                           else t.compressed_size - t.new_compressed_size),
                "size": t.size, "new_size": t.new_size,
                "new_fraction": None if frac is None else round(frac, 6),
                "pull_seconds": None if t.pull_seconds is None else round(t.pull_seconds, 3),
                "bandwidth_mbps": t.bandwidth_mbps, "unpack_mbps": t.unpack_mbps,
            },
        }


# ---------------------------------------------------------------- pure


def _sum(values: list[int | None]) -> int | None:
    return None if any(v is None for v in values) else sum(v or 0 for v in values)


def diff_layers(a: ImageLayers, b: ImageLayers, *, bandwidth_mbps: float = 1000,
                unpack_mbps: float | None = None) -> ImageDiff:
    """Which layers of ``b`` a holder of ``a`` already has, and what the rest weighs."""
    if bandwidth_mbps <= 0:
        raise UsageError(f"bandwidth must be positive, got {bandwidth_mbps} Mbit/s")
    if unpack_mbps is not None and unpack_mbps <= 0:
        raise UsageError(f"unpack rate must be positive, got {unpack_mbps} MB/s")
    by_digest = both_have_digests = a.source == SOURCE_REGISTRY and b.source == SOURCE_REGISTRY
    have_digests = {x.digest for x in a.layers if x.digest}
    have_diff_ids = {x.diff_id for x in a.layers}
    seen: set[str] = set()
    out: list[LayerDiff] = []
    for layer in b.layers:
        key = (layer.digest if by_digest else None) or layer.diff_id
        if both_have_digests and layer.digest in have_digests:
            status, how = SHARED, BY_DIGEST
        elif not both_have_digests and layer.diff_id in have_diff_ids:
            status, how = SHARED, BY_DIFF_ID
        elif key in seen:
            status, how = SHARED, BY_SELF
        else:
            status, how = NEW, None
        seen.add(key)
        out.append(LayerDiff(layer, status, how))
    new = [d.layer for d in out if d.status == NEW]
    new_compressed = _sum([x.compressed_size for x in new])
    new_size = _sum([x.size for x in new])
    seconds = None
    if new_compressed is not None and (unpack_mbps is None or new_size is not None):
        seconds = pull_seconds([(x.compressed_size or 0, x.size) for x in new], bandwidth_mbps, unpack_mbps)
    totals = Totals(
        layers=len(out), new_layers=len(new),
        compressed_size=_sum([x.compressed_size for x in b.layers]), new_compressed_size=new_compressed,
        size=_sum([x.size for x in b.layers]), new_size=new_size, pull_seconds=seconds,
        bandwidth_mbps=bandwidth_mbps, unpack_mbps=unpack_mbps)
    return ImageDiff(a, b, tuple(out), totals)


def layers_from_manifest(image: str, manifest: oci.Manifest, config: oci.ImageConfig, *,
                         sizes: list[int | None] | None = None,
                         step_groups: Mapping[str, str] | None = None) -> ImageLayers:
    """An image as a registry describes it: manifest (blob digests, compressed sizes) and
    config (diff ids, history, labels). ``sizes``: uncompressed bytes per layer, if counted."""
    descs, diff_ids = manifest.layers, config.diff_ids
    if len(descs) != len(diff_ids):
        raise RegistryError(f"{image}: the manifest lists {len(descs)} layers but the config {len(diff_ids)}")
    attributions = attribute_layers([dict(h) for h in config.history], len(descs), step_groups)
    sizes = sizes if sizes is not None else [_known_size(d) for d in descs]
    layers = tuple(
        LayerInfo(index=i, digest=d.digest, diff_id=diff_id, compressed_size=d.size,
                  size=sizes[i], media_type=d.media_type or None, step=at.step, group=at.group,
                  created_by=at.created_by)
        for i, (d, diff_id, at) in enumerate(zip(descs, diff_ids, attributions, strict=True)))
    return ImageLayers(image, SOURCE_REGISTRY, manifest.digest, layers, dict(sorted(config.labels.items())))


def _known_size(desc: oci.Descriptor) -> int | None:
    """Uncompressed bytes a descriptor tells without reading the blob: only an uncompressed tar."""
    return desc.size if desc.media_type in _TAR_TYPES else None


def layers_from_engine(image: str, info: ImageInfo, engine_history: list[HistoryEntry], *,
                       step_groups: Mapping[str, str] | None = None) -> ImageLayers:
    """An image as the local engine describes it (``Engine.image`` and ``Engine.history``,
    oldest entry first). That history has no ``empty_layer`` flag: an entry makes a layer when
    it is a RUN, COPY or ADD, or made bytes (an imported base)."""
    diff_ids = list(info.layers)
    history: list[dict[str, Any]] = []
    for entry in engine_history:
        created, size = entry.created_by, entry.size
        makes_layer = instruction_of(created) in ("RUN", "COPY", "ADD") or size > 0
        history.append({"created_by": created, "empty_layer": not makes_layer, "size": size})
    layer_entries = [h for h in history if not h["empty_layer"]]
    sizes: list[int | None] = ([int(h["size"]) for h in layer_entries] if len(layer_entries) == len(diff_ids)
                               else [None] * len(diff_ids))
    attributions = attribute_layers(history, len(diff_ids), step_groups)
    layers = tuple(
        LayerInfo(index=i, digest=None, diff_id=diff_id, compressed_size=None, size=sizes[i], media_type=None,
                  step=at.step, group=at.group, created_by=at.created_by)
        for i, (diff_id, at) in enumerate(zip(diff_ids, attributions, strict=True)))
    return ImageLayers(image, SOURCE_ENGINE, info.id or None, layers, dict(sorted(info.labels.items())))


# ---------------------------------------------------------------- reading


def count_uncompressed(ref: oci.Reference, desc: oci.Descriptor, *, client: oci.Client,
                       progress: Progress | None = None) -> int | None:
    """Stream one layer blob and count its uncompressed bytes (gzip or plain tar); None for
    compressions this cannot read (zstd: no decoder in the standard library). ``progress("read",
    digest, done, size)`` hears the blob's bytes as they arrive."""
    media_type = desc.media_type
    if media_type in _TAR_TYPES:
        return desc.size
    if media_type not in _GZIP_TYPES:
        return None
    resp = client.request("GET", ref.api_host, f"/v2/{ref.repository}/blobs/{desc.digest}",
                          scope=oci.pull_scope(ref.repository), stream=True)
    total = 0
    size, label, done = desc.size, desc.digest[:19], 0
    with resp:
        inflater = zlib.decompressobj(wbits=31)
        for received in resp.iter_content(oci.CHUNK):
            done += len(received)
            if progress is not None:
                progress("read", label, done, size)
            data = received
            while data:
                total += len(inflater.decompress(data, 16 * oci.CHUNK))
                data = inflater.unconsumed_tail
                if inflater.eof:  # a multi-member gzip: start the next member
                    data = inflater.unused_data + data
                    inflater = zlib.decompressobj(wbits=31)
        total += len(inflater.flush())
    return total


def read_registry(image: str, *, client: oci.Client | None = None, uncompressed: bool = True,
                  workers: int = 4, platform: str = oci.DEFAULT_PLATFORM,
                  progress: Progress | None = None) -> ImageLayers:
    """``image`` from its registry: manifest and config; with ``uncompressed`` each gzip layer
    blob is streamed once (in parallel, nothing written) to count its uncompressed bytes."""
    ref = oci.parse_reference(image)
    client = client or oci.Client()
    manifest = oci.read_manifest(ref, platform=platform, client=client)
    config = oci.read_image_config(ref.with_digest(manifest.digest), client=client, manifest=manifest)
    descs = manifest.layers
    sizes: list[int | None] | None = None
    if uncompressed and descs:
        with concurrent.futures.ThreadPoolExecutor(max(1, min(workers, len(descs)))) as pool:
            sizes = list(pool.map(lambda d: count_uncompressed(ref, d, client=client, progress=progress), descs))
    return layers_from_manifest(image, manifest, config, sizes=sizes)


def read_engine(image: str, engine: Engine) -> ImageLayers:
    """``image`` from the local store of ``engine`` (an engine.Engine); no blob digests or
    compressed sizes there."""
    info = engine.image(image)
    if info is None:
        raise ImageMissing(f"no image {image!r} in the engine",
                           hint="pull it, or name it with its registry to read it from there")
    return layers_from_engine(image, info, engine.history(info.id))


def read_image(image: str, *, source: str = "auto", client: oci.Client | None = None, engine: Engine | None = None,
               uncompressed: bool = True, progress: Progress | None = None) -> ImageLayers:
    """``source``: ``registry``, ``engine``, or ``auto`` (the registry when the reference names
    one and has the image there, else the engine)."""
    if source not in ("auto", SOURCE_REGISTRY, SOURCE_ENGINE):
        raise UsageError(f"unknown source {source!r}", hint="use auto, registry or engine")
    if source == SOURCE_REGISTRY or (source == "auto" and names_registry(image)):
        try:
            return read_registry(image, client=client, uncompressed=uncompressed, progress=progress)
        except ManifestNotFound:
            if source == SOURCE_REGISTRY:
                raise
    if engine is None:  # the CLI passes the engine it created; a library caller may have none
        raise ImageMissing(f"{image}: not in its registry, and no engine was given to read it from",
                           hint="pass the engine (the CLI does), or read the image from its registry")
    return read_engine(image, engine)


@dataclass(frozen=True)
class DiffOptions:
    """How to diff: where the images are read, the link (and unpack rate) a pull is timed on, and
    whether B's blobs are streamed to count what they unpack to."""

    source: str = "auto"  # auto | registry | engine
    bandwidth_mbps: float = 1000
    unpack_mbps: float | None = None
    uncompressed: bool = True


def diff_images(image_a: str, image_b: str, options: DiffOptions = DiffOptions(), *,
                client: oci.Client | None = None, engine: Engine | None = None, progress: Progress | None = None,
                node: Sequence[str] = ()) -> ImageDiff:
    """``progress``: the bytes of B's layer blobs as they are streamed to count what they unpack to.
    ``node``: other images the node holds besides A (held_by_node)."""
    client = client or oci.Client()
    # only B's bytes matter
    a = held_by_node([read_image(x, source=options.source, client=client, engine=engine, uncompressed=False)
                      for x in (image_a, *node)])
    b = read_image(image_b, source=options.source, client=client, engine=engine, uncompressed=options.uncompressed,
                   progress=progress)
    return diff_layers(a, b, bandwidth_mbps=options.bandwidth_mbps, unpack_mbps=options.unpack_mbps)


# ---------------------------------------------------------------- output


def _image_json(x: ImageLayers) -> dict[str, Any]:
    return {"image": x.image, "source": x.source, "digest": x.digest, "layers": len(x.layers),
            "compressed_size": _sum([y.compressed_size for y in x.layers]), "size": _sum([y.size for y in x.layers]),
            "labels": dict(x.labels)}


def diff_blocks(d: ImageDiff) -> list[Block]:
    """The diff as the CLI prints it (text_table: rich on a terminal, aligned columns in a pipe)."""
    t = d.totals
    layers = TextTable("Layers of B", ("#", "step", "group", "compressed", "size", "status", "created by"), tuple(
        (str(x.layer.index), x.layer.step or "-", x.layer.group, human_size(x.layer.compressed_size),
         human_size(x.layer.size), "shared" if x.status == SHARED else "new", short_created(x.layer.created_by))
        for x in d.layers), right=frozenset({"#", "compressed", "size"}), styles={"shared": "green", "new": "yellow"})
    frac = t.new_fraction
    share = "" if frac is None else f" ({100 * frac:.1f}% of B's {human_size(t.compressed_size)})"
    pull = "" if t.pull_seconds is None else f", about {t.pull_seconds:.1f} s at {t.bandwidth_mbps:g} Mbit/s"
    if t.pull_seconds is not None and t.unpack_mbps:
        pull += f" unpacking at {t.unpack_mbps:g} MB/s"
    shared = (None if t.compressed_size is None or t.new_compressed_size is None
              else t.compressed_size - t.new_compressed_size)
    return [f"{d.b.image} for a node holding {d.a.image} (A from the {d.a.source}, B from the {d.b.source})", layers,
            f"already on the node: {t.layers - t.new_layers} of {t.layers} layers, {human_size(shared)} compressed",
            f"to download: {t.new_layers} of {t.layers} layers, {human_size(t.new_compressed_size)} "
            f"compressed{share}, {human_size(t.new_size)} unpacked{pull}"]
