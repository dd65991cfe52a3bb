"""How long a fresh node takes to start an image, predicted, and the recipe's ``budget.cold_start``.

    cold start = the pull (download and unpack, layer by layer, overlapped) + the entrypoint's start

The pull is a timeline (``ready_seconds``): the layers download one after another on the node's one
link, and each unpacks once its download has ended and the layer below it is unpacked, as Docker 26
(containerd) does; the plain sum of download and unpack time over-predicted every image whose
download is a real share by 20-34 % (docs/benchmarks.md, cold start run 3) and stays in the report as
the upper bound.

The bytes to pull are the compressed sizes of the image's layers (its manifest's) less the layers the
node already holds (the images already on it: ``budget.cold_start.node``). The bytes unpacked are the
uncompressed sizes of the layers whose *chain* the node lacks: containerd and the classic store keep
an unpacked layer per chain (the layer and every layer under it, OCI's ChainID), so a layer the node
holds under another parent (the shared CUDA layers above another OS) is not downloaded but is
unpacked again. The unpack rate is a measurement (``MEASURED_UNPACK_RATE``, from
bench/bench_cold_start.py on the build machine) that a recipe may replace with its nodes' own
(``budget.cold_start.unpack_rate``). The entrypoint's start is what the image's first test took in its
test container (a container's start plus, say, ``import torch``), measured by the build's tests.

Pure: frozen values in and out. It lives in engine/ (not analysis/) because the build checks the
budget where it checks budget.max_size, before the push, and the engine layer may not import analysis.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from buildkit_py.errors import BudgetExceeded
from buildkit_py.recipe.model import ColdStartBudget
from buildkit_py.sizes import human_size

# Bytes/s of uncompressed layer content the Docker 26 engine (containerd store, overlayfs) unpacks on
# the build machine with nothing else running (2 cores, load 1-2): bench/bench_cold_start.py's
# calibration pull on 2026-12-06 (docs/benchmarks.md, cold start run 3), the rate a node with cores of
# its own sees. The same machine shared by other builds (load 9-15) unpacked 12-18 MB/s: a node's own
# disks and load differ, so a recipe sets its nodes' rate in budget.cold_start.unpack_rate.
MEASURED_UNPACK_RATE = 65e6


@dataclass(frozen=True)
class Layer:
    """One layer as a pull sees it: what names its content (the blob digest, or the diff id where the
    blob's is not known yet) and both sizes."""

    digest: str
    compressed: int  # bytes downloaded (the manifest's size)
    uncompressed: int  # bytes unpacked onto the node's disk


@dataclass(frozen=True)
class ColdStartInputs:
    layers: tuple[Layer, ...]
    bandwidth: float  # bytes/s of the node's link to the registry
    unpack_rate: float = MEASURED_UNPACK_RATE  # bytes/s
    start_seconds: float | None = None  # the entrypoint's own start; None: not measured
    start_source: str = ""  # what was timed, e.g. 'test "python -c import torch"'
    held: frozenset[str] = frozenset()  # layer digests already on the node (not downloaded)
    held_chains: frozenset[str] = frozenset()  # chain ids already unpacked on the node (node_holds)


@dataclass(frozen=True)
class ColdStartPrediction:
    pull_bytes: int
    unpack_bytes: int
    layers_pulled: int
    layers_held: int  # distinct layers not downloaded
    download_seconds: float  # the pull bytes at the bandwidth, all of them
    unpack_seconds: float  # the unpack bytes at the unpack rate, all of them
    ready_seconds: float  # until the last layer is unpacked, downloads and unpacks overlapped (ready_seconds())
    start_seconds: float | None
    bandwidth: float
    unpack_rate: float
    start_source: str = ""
    pull_exact: bool = True  # False: the compressed size was unknown, the uncompressed stood in (upper bound)
    layers_unpacked_held: int = 0  # layers not unpacked: their chain is on the node

    @property
    def total_seconds(self) -> float:
        return self.ready_seconds + (self.start_seconds or 0.0)

    @property
    def sequential_seconds(self) -> float:
        """The upper bound: nothing unpacked before everything is downloaded."""
        return self.download_seconds + self.unpack_seconds + (self.start_seconds or 0.0)

    def summary(self) -> str:
        """One line: the total, then each part and the two overlapped."""
        start = (f"{self.start_seconds:.1f}s start ({self.start_source})" if self.start_seconds is not None
                 else "start not measured (no test ran)")
        held = (f", {self.layers_held} layers already on the node ({self.layers_unpacked_held} of them unpacked "
                "there under the same layers)" if self.layers_held else "")
        bound = "" if self.pull_exact else " (at most: uncompressed size, the engine knows no compressed one)"
        return (f"{self.total_seconds:.1f}s on a fresh node at {bandwidth_text(self.bandwidth)}: "
                f"pull {human_size(self.pull_bytes)}{bound} {self.download_seconds:.1f}s and unpack "
                f"{human_size(self.unpack_bytes)} {self.unpack_seconds:.1f}s, overlapped layer by layer "
                f"{self.ready_seconds:.1f}s, + {start}{held}")

    def to_json(self) -> dict[str, Any]:
        return {"seconds": round(self.total_seconds, 2), "pull_bytes": self.pull_bytes,
                "unpack_bytes": self.unpack_bytes, "layers_pulled": self.layers_pulled,
                "layers_held": self.layers_held, "download_seconds": round(self.download_seconds, 2),
                "unpack_seconds": round(self.unpack_seconds, 2), "ready_seconds": round(self.ready_seconds, 2),
                "sequential_seconds": round(self.sequential_seconds, 2),
                "start_seconds": None if self.start_seconds is None else round(self.start_seconds, 2),
                "start_source": self.start_source, "bandwidth": self.bandwidth, "unpack_rate": self.unpack_rate,
                "pull_exact": self.pull_exact, "layers_unpacked_held": self.layers_unpacked_held}


def bandwidth_text(rate: float) -> str:
    """125e6 bytes/s -> '1000 Mbit/s': links are spoken of in bits."""
    return f"{rate * 8 / 1e6:.0f} Mbit/s"


def chain_ids(digests: Sequence[str]) -> tuple[str, ...]:
    """The chain id of each layer of an image, bottom first (the OCI image spec's ChainID: the first
    layer's is its own; each next one is sha256 of "<chain below> <layer>"): what an engine keys an
    unpacked layer by."""
    out: list[str] = []
    for digest in digests:
        out.append(digest if not out else "sha256:" + hashlib.sha256(f"{out[-1]} {digest}".encode()).hexdigest())
    return tuple(out)


def node_holds(images: Sequence[Sequence[str]]) -> tuple[frozenset[str], frozenset[str]]:
    """What a node holding ``images`` (each its layers' digests, bottom first) has: the layer digests
    (for ``ColdStartInputs.held``) and the chains unpacked (``held_chains``)."""
    return (frozenset(d for image in images for d in image),
            frozenset(c for image in images for c in chain_ids(image)))


def ready_seconds(steps: Iterable[tuple[float, float]]) -> float:
    """Seconds until the last layer is unpacked, from each layer's (download, unpack) seconds, bottom
    first (0 for a part the node skips): downloads follow one another on the one link (an engine fetches
    a few at once, but they share the link); a layer unpacks once its download has ended and the layer
    below it is unpacked (its snapshot is made on its parent's). Never more than the plain sum."""
    link = unpacked = 0.0
    for download, unpack in steps:
        link += download
        unpacked = max(unpacked, link) + unpack
    return max(link, unpacked)


def predict(inputs: ColdStartInputs) -> ColdStartPrediction:
    """The prediction for ``inputs``: each distinct layer the node does not hold is downloaded once (an
    image that repeats a blob pulls it once); each layer whose chain the node lacks is unpacked, in order,
    as its download ends (``ready_seconds``)."""
    chains = chain_ids([layer.digest for layer in inputs.layers])
    fetched: set[str] = set(inputs.held)
    downloads, unpacks = [], []
    for layer, chain in zip(inputs.layers, chains, strict=True):
        downloads.append(0 if layer.digest in fetched else layer.compressed)
        fetched.add(layer.digest)
        unpacks.append(0 if chain in inputs.held_chains else layer.uncompressed)
    distinct = {layer.digest for layer in inputs.layers}
    pulled = len(distinct - inputs.held)
    pull, unpack = sum(downloads), sum(unpacks)
    return ColdStartPrediction(
        pull_bytes=pull, unpack_bytes=unpack, layers_pulled=pulled, layers_held=len(distinct) - pulled,
        download_seconds=pull / inputs.bandwidth, unpack_seconds=unpack / inputs.unpack_rate,
        ready_seconds=ready_seconds((d / inputs.bandwidth, u / inputs.unpack_rate)
                                    for d, u in zip(downloads, unpacks, strict=True)),
        start_seconds=inputs.start_seconds, bandwidth=inputs.bandwidth, unpack_rate=inputs.unpack_rate,
        start_source=inputs.start_source,
        layers_unpacked_held=sum(1 for chain in chains if chain in inputs.held_chains))


class ColdStartOverBudget(BudgetExceeded):
    """The predicted cold start is over ``budget.cold_start.max`` (exit 1, as budget.max_size)."""

    def __init__(self, message: str, *, prediction: ColdStartPrediction, max_seconds: float, hint: str | None = None):
        self.prediction, self.max_seconds = prediction, max_seconds
        super().__init__(message, hint=hint)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = super().to_json()
        out.update(cold_start=self.prediction.to_json(), max_seconds=self.max_seconds)
        return out


@dataclass(frozen=True)
class StartTime:
    """The entrypoint's own start as the build's tests measured it: what was timed, and how long."""

    seconds: float
    source: str


DEFAULT_BANDWIDTH = 125e6  # 1 Gbit/s: what the build report assumes where the recipe sets no budget


@dataclass(frozen=True)
class NodeLayer:
    """A layer of an image already on the node: its diff id and the compressed size its registry gives."""

    diff_id: str
    compressed: int


def build_prediction(budget: ColdStartBudget | None, compressed: int | None, uncompressed: int,
                     started: StartTime | None, *, layers: Sequence[tuple[str, int]] = (),
                     node: Sequence[Sequence[NodeLayer]] = ()) -> ColdStartPrediction:
    """The prediction for a freshly built image at the budget's bandwidth and unpack rate (no budget:
    1 Gbit/s and the measured rate), on a node that holds ``node`` (the images of
    ``budget.cold_start.node``), or none of it. ``layers``: the built image's (diff id, unpacked bytes),
    bottom first, as its engine gives them; layers are matched by diff id (the engine knows no blob
    digest before a push). A held layer weighs what its node's manifest says; the rest of the image's
    compressed size is the pull, exactly, split between the new layers in proportion to their unpacked
    bytes (the engine gives no per-layer compressed size before a push: the sums are exact, the
    timeline's shape an estimate). Without ``layers`` the image is one layer (no overlap: the plain
    sum). Where the engine does not know the compressed size before a push (Docker 20.10's classic
    store) the uncompressed size stands in for it: an upper bound, marked so."""
    rate = budget.bandwidth if budget else DEFAULT_BANDWIDTH
    unpack = budget.unpack_rate if budget and budget.unpack_rate else MEASURED_UNPACK_RATE
    total = compressed if compressed is not None else uncompressed
    on_node: Mapping[str, int] = {x.diff_id: x.compressed for image in node for x in image}
    if layers:
        distinct = dict(layers)  # a layer repeated in the image is pulled once
        new = [d for d in distinct if d not in on_node]
        # another compression of the same layers may weigh more than this image's: never below nothing
        rest = max(total - sum(on_node[d] for d in distinct if d not in new), 0)
        weight = dict(zip(new, split(rest, [distinct[d] for d in new]), strict=True))
        parts = tuple(Layer(d, weight[d] if d in weight else on_node[d], size) for d, size in layers)
        held, chains = node_holds([[x.diff_id for x in image] for image in node])
    else:
        parts, held, chains = (Layer("image", total, uncompressed),), frozenset(), frozenset()
    found = predict(ColdStartInputs(parts, rate, unpack, started.seconds if started else None,
                                    started.source if started else "", held, chains))
    return found if compressed is not None else replace(found, pull_exact=False)


def split(total: int, sizes: Sequence[int]) -> list[int]:
    """``total`` in whole parts in proportion to ``sizes`` (equal parts where they are all 0); the
    parts sum to ``total`` exactly, the last taking what rounding left."""
    if not sizes:
        return []
    weights = list(sizes) if any(sizes) else [1] * len(sizes)
    whole = sum(weights)
    parts = [total * w // whole for w in weights[:-1]]
    return [*parts, total - sum(parts)]


def over_budget(budget: ColdStartBudget | None, prediction: ColdStartPrediction | None) -> bool:
    return budget is not None and prediction is not None and prediction.total_seconds > budget.max_seconds


def check_budget(prediction: ColdStartPrediction, budget: ColdStartBudget, image: str, kept_as: str = "") -> None:
    """ColdStartOverBudget when the prediction is over the budget's max, naming the biggest part."""
    if prediction.total_seconds <= budget.max_seconds:
        return
    parts = {"the pull": prediction.download_seconds, "the unpack": prediction.unpack_seconds,
             "the entrypoint's start": prediction.start_seconds or 0.0}
    biggest = max(parts, key=lambda k: parts[k])
    raise ColdStartOverBudget(
        f"image {image[:19]} would take {prediction.total_seconds:.1f}s to start on a fresh node, over the "
        f"recipe's budget.cold_start.max of {budget.max_seconds:g}s: {prediction.summary()}"
        + (f"; kept as {kept_as}" if kept_as else ""),
        prediction=prediction, max_seconds=budget.max_seconds,
        hint=f"{biggest} takes the most; " + (
            "fewer or smaller layers pull faster (drop heavy pins, keep weights out: imgbuild weights push)"
            if biggest != "the entrypoint's start" else "the image's first test times the start: make the "
            "entrypoint import less") + ", or raise budget.cold_start.max")
