"""What is in a built image, layer by layer, and what should not be there.

``inspect_image`` streams the image out of the engine once (``Engine.save``: the bytes of
``docker save`` or ``podman save``), parses that tar on the fly and, for
each layer tar inside it, in the same pass:

- hashes it (sha256 = the layer's diff id, which is how a layer blob is matched to its
  position in the image config: ``docker save`` names layers by v1 ids, not diff ids);
- gzips it at level 6 only to count the bytes (the estimate of what a registry stores and a
  pull moves), in 1 MiB pieces on a thread pool, each piece primed with the 32 KiB before
  it the way pigz does, so the count matches one-stream ``gzip -6`` to a few bytes per MiB
  and big images use every core; nothing is written to disk;
- walks the layer's members (paths, sizes, whiteouts) without reading file contents.

The image config (found in the same stream: the member whose sha256 is the image id) gives
the history; each non-empty history entry is one layer. imgbuild writes
``: imgbuild-step=<id>;`` into every RUN it renders (``plan.STEP_MARK``), so a layer maps to
the step and the layer group that made it. COPY entries carry no marker: the COPY of the mount
stubs is known by its source (``plan.MOUNT_STUB_FILE``) and belongs to their step; the n-th other
COPY after the first marked step is ``copy-<n>``, the recipe's ``copy[n]`` (how ``plan``
numbers them). Layers before the first marked step came with the base image (group ``base``).

Sizes: a layer's ``size`` is the engine's own number for it (``docker history``; they sum to
the SIZE of ``docker images``), so a budget reads the same as the tools users know. The
engine counts symlinks for some layers and not for others (an imported layer is measured on
disk, a BuildKit one from its tar headers), so it is taken from the engine, not recomputed;
where the engine's history does not line up with the config, the content bytes counted
while walking the tar stand in. ``blob_size`` is the uncompressed layer tar and
``compressed_size`` the gzip estimate.

The streaming pass is ``saved_image.analyze_save_stream``; what a path is (cache, compiler,
CUDA library, weights, whiteout) is ``layer_paths``. Everything after the pass is pure:
``attribute_layers``, ``classify_path``, ``analyze_save_stream`` and the finding rules take
plain values and are unit-tested without an engine.
"""

from __future__ import annotations

import collections
import io
import posixpath
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from buildkit_py import label_keys as L
from buildkit_py import oci
from buildkit_py.analysis.gpu_coverage import KernelCoverage, coverage_table, kernel_coverage
from buildkit_py.analysis.layer_paths import CACHE, COMPILER, CUDA_DUPLICATE, DELETED, WEIGHTS, FindingKind
from buildkit_py.analysis.saved_image import IterStream, LayerScan, SaveScan, analyze_save_stream
from buildkit_py.analysis.severity import Severity
from buildkit_py.engine.cold_start import ready_seconds
from buildkit_py.errors import ImageMissing, ImgbuildError, InspectError, SizeBudgetExceeded
from buildkit_py.file_kinds import WEIGHT_FILE_LIMIT, over_weight_limit
from buildkit_py.plan.history import GROUP_ORDER, attribute_layers
from buildkit_py.sizes import human_size
from buildkit_py.text_table import Block, TextTable

if TYPE_CHECKING:
    from buildkit_py.engine.base import Engine, HistoryEntry

# Finding severities (the kinds are layer_paths': WEIGHTS, CACHE, COMPILER, CUDA_DUPLICATE, DELETED).
WARNING, INFO = Severity.WARNING, Severity.INFO



# ---------------------------------------------------------------- the report


@dataclass(frozen=True)
class Layer:
    index: int  # position in the image's rootfs, 0 = bottom
    digest: str  # diff id: sha256 of the uncompressed layer tar
    size: int  # content bytes, as the engine reports them (docker history)
    blob_size: int  # uncompressed tar bytes
    compressed_size: int | None  # see ImageReport.compressed_source; None when not known
    files: int  # members in the layer tar
    step: str | None  # imgbuild step id; None for base layers and unmarked RUNs
    group: str
    created_by: str
    instruction: str  # RUN, COPY, WORKDIR ...


@dataclass(frozen=True)
class Finding:
    kind: FindingKind
    severity: Severity
    layer: int | None  # index into ImageReport.layers of the layer that ships the bytes
    step: str | None
    path: str
    size: int
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "severity": self.severity, "layer": self.layer, "step": self.step,
                "path": self.path, "size": self.size, "message": self.message}


@dataclass(frozen=True)
class ImageReport:
    image: str  # the reference asked for
    id: str
    size: int
    blob_size: int
    compressed_size: int | None
    pull_seconds: float | None
    bandwidth_mbps: float
    layers: tuple[Layer, ...]
    labels: Mapping[str, str]  # io.imgbuild.* only
    findings: tuple[Finding, ...]
    # Where compressed sizes come from: "registry" (its manifest), "store" (the engine's own
    # compressed blobs: the containerd store's OCI layout), "estimate" (gzip -6 of each layer)
    # or None (not estimated).
    compressed_source: str | None = None
    unpack_mbps: float | None = None  # MB/s of unpacking counted in pull_seconds; None: network only
    kernels: KernelCoverage | None = None  # with InspectOptions.kernels: architectures x libraries

    @property
    def flavor(self) -> str | None:
        return self.labels.get(L.CUDA_FLAVOR)

    def findings_of(self, kind: str) -> list[Finding]:
        return [f for f in self.findings if f.kind == kind]

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "id": self.id,
            "size": self.size,
            "blob_size": self.blob_size,
            "compressed_size": self.compressed_size,
            # the same two numbers under names that say which is which
            "size_uncompressed": self.size,
            "size_compressed": self.compressed_size,
            "compressed_source": self.compressed_source,
            "pull_seconds": None if self.pull_seconds is None else round(self.pull_seconds, 3),
            "bandwidth_mbps": self.bandwidth_mbps,
            "unpack_mbps": self.unpack_mbps,
            "labels": dict(self.labels),
            "layers": [
                {"digest": x.digest, "size": x.size, "step": x.step, "group": x.group, "created_by": x.created_by,
                 "blob_size": x.blob_size, "compressed_size": x.compressed_size, "files": x.files}
                for x in self.layers
            ],
            "groups": group_sizes(self),
            "findings": [f.to_json() for f in self.findings],
        } | ({"kernels": self.kernels.to_json()} if self.kernels is not None else {})


# ---------------------------------------------------------------- pure helpers


def pull_seconds(layers: Sequence[tuple[int, int | None]], bandwidth_mbps: float,
                 unpack_mbps: float | None = None) -> float:
    """Seconds to pull ``layers`` (each its compressed and unpacked bytes, bottom first) at
    ``bandwidth_mbps`` megabits (10^6) per second; with ``unpack_mbps``, each layer also unpacked at that
    many megabytes (10^6) per second as soon as its download has ended and the layer below is unpacked
    (``engine.cold_start.ready_seconds``, the model budget.cold_start is checked with): on a fast link the
    unpacking, not the network, is most of a pull (see the E2E pull test)."""
    if bandwidth_mbps <= 0:
        raise ValueError("bandwidth_mbps must be positive")
    if unpack_mbps is not None and unpack_mbps <= 0:
        raise ValueError("unpack_mbps must be positive")
    link = bandwidth_mbps * 1e6 / 8
    return ready_seconds((compressed / link, (unpacked or 0) / (unpack_mbps * 1e6) if unpack_mbps else 0.0)
                         for compressed, unpacked in layers)


def _ancestors(path: str) -> Iterator[str]:
    while True:
        parent = posixpath.dirname(path)
        if parent == path:
            return
        yield parent
        path = parent


class _Deletions:
    """Whiteouts by path, with the layers they are in, for "is this deleted above layer i"."""

    def __init__(self, scans: list[LayerScan]):
        self.removed: dict[str, list[int]] = collections.defaultdict(list)  # path and all below
        self.opaque: dict[str, list[int]] = collections.defaultdict(list)  # strictly below
        for j, scan in enumerate(scans):
            for path, opaque in scan.whiteouts:
                (self.opaque if opaque else self.removed)[path].append(j)

    def __bool__(self) -> bool:
        return bool(self.removed or self.opaque)

    def alive(self, path: str, layer: int) -> bool:
        """Not deleted by any layer above ``layer``."""
        return not self or self.deleted_by(path, layer) is None

    def deleted_by(self, path: str, layer: int) -> tuple[str, int] | None:
        """(whiteout path, layer) of the lowest deletion above ``layer`` hiding ``path``."""
        best: tuple[str, int] | None = None
        candidates = [(path, self.removed.get(path, ()))]
        for a in _ancestors(path):
            candidates.append((a, self.removed.get(a, ())))
            candidates.append((a, self.opaque.get(a, ())))
        for where, js in candidates:
            for j in js:
                if j > layer and (best is None or j < best[1]):
                    best = (where, j)
        return best


def _where(layers: list[Layer], i: int) -> str:
    layer = layers[i]
    return f"layer {i} (step {layer.step})" if layer.step else f"layer {i} ({layer.group})"


def find_problems(layers: list[Layer], scans: list[LayerScan], *, flavor: str | None,
                  weight_threshold: int = WEIGHT_FILE_LIMIT) -> list[Finding]:
    """Every finding for an image whose layer ``i`` is ``layers[i]`` scanned as ``scans[i]``:
    weights, caches, compilers (runtime flavour only), CUDA shipped twice, bytes deleted later."""
    deletions = _Deletions(scans)
    hits = _Hits.collect(scans)
    findings = [*_weight_findings(layers, hits.weights, weight_threshold),
                *_cache_findings(layers, hits.caches, weight_threshold)]
    if flavor == "runtime":
        findings += _compiler_findings(layers, hits.compilers, deletions)
    findings += _cuda_findings(layers, hits.cuda, deletions)
    if deletions:
        findings += _deleted_findings(layers, scans, deletions, weight_threshold)
    findings.sort(key=lambda f: (f.severity.rank, -f.size, f.layer or 0, f.path, f.kind))
    return findings


@dataclass
class _Hits:
    """The scans' rule hits by kind, as the finders need them."""

    weights: list[tuple[int, str, int]] = field(default_factory=list)  # (layer, path, size)
    caches: dict[tuple[int, str], list[int]] = field(default_factory=dict)  # (layer, root) -> [files, bytes]
    compilers: dict[str, tuple[int, int]] = field(default_factory=dict)  # path -> (layer, size); the top copy wins
    # soname -> origin (system | wheel) -> path -> (layer, size)
    cuda: dict[str, dict[str, dict[str, tuple[int, int]]]] = field(default_factory=dict)

    @classmethod
    def collect(cls, scans: list[LayerScan]) -> _Hits:
        hits = cls()
        for i, scan in enumerate(scans):
            for kind, detail, path, size in scan.hits:
                if kind == WEIGHTS:
                    hits.weights.append((i, path, size))
                elif kind == CACHE:
                    acc = hits.caches.setdefault((i, detail), [0, 0])
                    acc[0] += 1
                    acc[1] += size
                elif kind == COMPILER:
                    hits.compilers[path] = (i, size)
                elif kind == CUDA_DUPLICATE:
                    soname, origin = detail.split(":")
                    hits.cuda.setdefault(soname, {}).setdefault(origin, {})[path] = (i, size)
        return hits


def _finding(layers: list[Layer], kind: FindingKind, severity: Severity, i: int, path: str, size: int,
             message: str) -> Finding:
    return Finding(kind, severity, i, layers[i].step, path, size, message)


def _weight_findings(layers: list[Layer], weights: list[tuple[int, str, int]], threshold: int) -> list[Finding]:
    return [_finding(layers, WEIGHTS, WARNING, i, path, size,
                     f"model weights ({human_size(size)}) baked into {_where(layers, i)}: every pull "
                     f"moves them; fetch them at run time (recipe `weights:`) or mount them")
            for i, path, size in weights if over_weight_limit(size, threshold)]


def _cache_findings(layers: list[Layer], caches: dict[tuple[int, str], list[int]], threshold: int) -> list[Finding]:
    return [_finding(layers, CACHE, WARNING if size >= threshold else INFO, i, root, size,
                     f"{root} left in {_where(layers, i)}: {count} file(s), {human_size(size)}; use a build "
                     f"cache mount (RUN --mount=type=cache) or clean it in the same RUN")
            for (i, root), (count, size) in caches.items()]


def _compiler_findings(layers: list[Layer], compilers: dict[str, tuple[int, int]],
                       deletions: _Deletions) -> list[Finding]:
    """One finding per folder and layer (apt's gcc alone brings ~10 names to /usr/bin)."""
    folders: dict[tuple[int, str], list[tuple[str, int]]] = {}
    for path, (i, size) in sorted(compilers.items()):
        if deletions.alive(path, i):
            folders.setdefault((i, posixpath.dirname(path)), []).append((path, size))
    out = []
    for (i, folder), files in sorted(folders.items()):
        size = sum(s for _, s in files)
        if len(files) == 1:
            path, what = files[0][0], files[0][0]
        else:
            names = [posixpath.basename(p) for p, _ in files]
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            path, what = folder, f"{len(files)} compiler files in {folder} ({shown})"
        out.append(_finding(layers, COMPILER, WARNING, i, path, size,
                            f"{what} in a runtime-flavour image ({_where(layers, i)}): compilers and CUDA "
                            f"headers belong in a builder stage or a devel flavour"))
    return out


def _cuda_findings(layers: list[Layer], cuda: dict[str, dict[str, dict[str, tuple[int, int]]]],
                   deletions: _Deletions) -> list[Finding]:
    out = []
    for soname, origins in sorted(cuda.items()):
        live = {o: {p: v for p, v in paths.items() if deletions.alive(p, v[0])} for o, paths in origins.items()}
        system, wheel = live.get("system") or {}, live.get("wheel") or {}
        if not system or not wheel:
            continue
        sys_bytes, wheel_bytes = sum(s for _, s in system.values()), sum(s for _, s in wheel.values())
        wpath, (wi, _) = min(wheel.items())
        spath, (si, _) = min(system.items())
        out.append(_finding(layers, CUDA_DUPLICATE, WARNING, wi, wpath, min(sys_bytes, wheel_bytes),
                            f"{soname} is shipped twice: {spath} ({_where(layers, si)}, {human_size(sys_bytes)}) and "
                            f"{wpath} ({_where(layers, wi)}, {human_size(wheel_bytes)}); the nvidia-*-cu12 wheels "
                            f"bring their own CUDA, so use a plain base or CUDA from wheels only"))
    return out


def _deleted_findings(layers: list[Layer], scans: list[LayerScan], deletions: _Deletions,
                      threshold: int) -> list[Finding]:
    wasted: dict[tuple[int, str, int], list[int]] = {}
    for i, scan in enumerate(scans):
        for path, size in scan.files:
            hit = deletions.deleted_by(path, i)
            if hit:
                acc = wasted.setdefault((i, hit[0], hit[1]), [0, 0])
                acc[0] += 1
                acc[1] += size
    return [_finding(layers, DELETED, WARNING if size >= threshold else INFO, i, path, size,
                     f"{path} ({count} file(s), {human_size(size)}) shipped in {_where(layers, i)} but "
                     f"deleted in {_where(layers, j)}: the bytes are still pulled; delete in the same RUN "
                     f"that creates them")
            for (i, path, j), (count, size) in wasted.items()]


# ---------------------------------------------------------------- the entry point


@dataclass(frozen=True)
class InspectOptions:
    """How to inspect: the link a pull is timed on, what counts as weights, what to estimate."""

    bandwidth_mbps: float = 1000
    weight_threshold: int = WEIGHT_FILE_LIMIT  # what counts as weights: above this
    estimate_compressed: bool = True  # False skips the gzip estimate: several times faster on big images
    step_groups: Mapping[str, str] | None = None  # a plan's step -> group table (else build_plan.STEP_GROUPS)
    workers: int | None = None  # gzip threads; None: by the cores
    registry_sizes: bool = True  # take compressed sizes from the registry's manifest when it has the image
    unpack_mbps: float | None = None  # MB/s of unpacking counted in the pull time; None: network only
    kernels: bool = False  # also read the CUDA kernels of every ELF file, in the same pass


@dataclass(frozen=True)
class ImageFacts:
    """What the engine (and the registry) say about an image, beside its saved layers."""

    ref: str
    image_id: str
    diff_ids: list[str]
    history: list[dict[str, Any]]  # the image config's history
    labels: Mapping[str, str]  # io.imgbuild.* only
    engine_sizes: list[int] | None = None  # per-layer sizes from the engine's history
    registry_sizes: list[int] | None = None  # compressed layer sizes from the registry's manifest


def inspect_image(engine: Engine, ref: str, options: InspectOptions | None = None,
                  progress: Callable[[str, str, int, int], None] | None = None) -> ImageReport:
    """Read image ``ref`` from ``engine`` (an engine.Engine) and report on it.

    One ``docker save`` stream is read (the classic layout or, on the containerd store, an
    OCI layout with compressed blobs); nothing is written to disk. Compressed sizes come from
    the registry's manifest when ``ref`` is there with the same layers, else from the saved
    blobs when they are compressed, else from a gzip -6 estimate; with
    ``estimate_compressed=False`` the estimate is skipped, which makes inspection of a large
    image several times faster. ``progress("read", ref, done, total)`` hears the bytes of the
    stream as they are read (``total``: the engine's size of the image, what the stream is about;
    the last call has the real count), as a transfer callback does: the pass takes a minute on a
    few GB."""
    opts = options or InspectOptions()
    if opts.bandwidth_mbps <= 0:
        raise InspectError(f"bandwidth must be positive, got {opts.bandwidth_mbps} Mbit/s")
    if opts.unpack_mbps is not None and opts.unpack_mbps <= 0:
        raise InspectError(f"unpack rate must be positive, got {opts.unpack_mbps} MB/s")
    info = engine.image(ref)
    if info is None:
        raise ImageMissing(f"no image {ref!r} in the engine",
                           hint="build it first, or pull it (`docker pull`)")
    image_id = info.id
    diff_ids = list(info.layers)
    labels = {k: v for k, v in sorted(info.labels.items()) if k.startswith(L.PREFIX)}
    remote = registry_layer_sizes(ref, len(diff_ids)) if opts.registry_sizes and info.repo_digests else None
    # An engine that cannot export the image raises InspectError from the stream (Engine.save).
    counted = _Counted(engine.save(ref), progress, ref, info.size)
    stream = io.BufferedReader(IterStream(iter(counted)), 1 << 20)
    saved = analyze_save_stream(stream, image_id=image_id, diff_ids=diff_ids,
                                estimate_compressed=opts.estimate_compressed and remote is None,
                                workers=opts.workers, kernels=opts.kernels)
    counted.finish()
    history = (saved.config or {}).get("history") or []
    try:
        engine_history = list(reversed(engine.history(image_id)))
    except InspectError:
        engine_history = []
    facts = ImageFacts(ref, image_id, diff_ids, history, labels,
                       engine_sizes=engine_layer_sizes(history, engine_history, len(diff_ids)),
                       registry_sizes=remote)
    return build_report(facts, saved, opts)


class _Counted:
    """The chunks of a stream, reporting the bytes read so far against ``total``, an estimate:
    the stream may run past it (tar headers) or stop short of it (the reader stops at the tar's
    end), so the count stays short of it until ``finish`` reports the real one."""

    def __init__(self, chunks: Iterable[bytes], progress: Callable[[str, str, int, int], None] | None,
                 label: str, total: int):
        self.chunks, self.progress, self.label, self.total = chunks, progress, label, total
        self.done = 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.chunks:
            self.done += len(chunk)
            if self.progress is not None:
                self.progress("read", self.label, min(self.done, self.total - 1) if self.total else self.done,
                              self.total)
            yield chunk

    def finish(self) -> None:
        if self.progress is not None:
            self.progress("read", self.label, self.done, self.done)


def registry_layer_sizes(ref: str, n_layers: int) -> list[int] | None:
    """Compressed layer sizes from ``ref``'s manifest in its registry (what a pull moves);
    None when it is not there or its layers are not the image's."""
    try:
        manifest = oci.read_manifest(ref, client=oci.Client(max_retries=1, timeout=(5.0, 30.0)))
    except (ImgbuildError, ValueError):
        return None
    sizes = [layer.size for layer in manifest.layers]
    return sizes if len(sizes) == n_layers else None


def engine_layer_sizes(config_history: list[dict[str, Any]], engine_history: list[HistoryEntry],
                       n_layers: int) -> list[int] | None:
    """Per-layer sizes from the engine's history (newest first, one entry per config history
    entry), bottom layer first; None when the two histories do not line up."""
    if not config_history or len(config_history) != len(engine_history):
        return None
    sizes = [e.size for c, e in zip(config_history, reversed(engine_history), strict=False)
             if not c.get("empty_layer")]
    return sizes if len(sizes) == n_layers else None


def build_report(facts: ImageFacts, saved: SaveScan, options: InspectOptions | None = None) -> ImageReport:
    """The pure half of inspect_image: scans + history (+ the engine's layer sizes, + the
    registry's compressed sizes) -> report."""
    opts = options or InspectOptions()
    diff_ids, registry_sizes = facts.diff_ids, facts.registry_sizes
    attributions = attribute_layers(facts.history, len(diff_ids), opts.step_groups)
    scans = [saved.layers[d] for d in diff_ids]
    source = "registry" if registry_sizes is not None else \
        "store" if scans and all(s.compression for s in scans) else \
        "estimate" if scans and all(s.compressed_size is not None for s in scans) else None
    if registry_sizes is not None:
        for scan, remote in zip(scans, registry_sizes, strict=False):
            scan.compressed_size = remote
    sizes = facts.engine_sizes if facts.engine_sizes is not None else [s.content_size for s in scans]
    layers = [
        Layer(index=i, digest=d, size=sizes[i], blob_size=s.blob_size, compressed_size=s.compressed_size,
              files=s.members, step=a.step, group=a.group, created_by=a.created_by, instruction=a.instruction)
        for i, (d, s, a) in enumerate(zip(diff_ids, scans, attributions, strict=False))
    ]
    compressed: int | None = None
    if all(s.compressed_size is not None for s in scans):
        compressed = sum(s.compressed_size or 0 for s in scans)
    findings = find_problems(layers, scans, flavor=facts.labels.get(L.CUDA_FLAVOR),
                             weight_threshold=opts.weight_threshold)
    blob_size = sum(x.blob_size for x in layers)
    pull = None if compressed is None else pull_seconds(
        [(s.compressed_size or 0, x.blob_size) for s, x in zip(scans, layers, strict=False)], opts.bandwidth_mbps,
        opts.unpack_mbps)
    return ImageReport(
        image=facts.ref, id=facts.image_id, size=sum(x.size for x in layers), blob_size=blob_size,
        compressed_size=compressed, unpack_mbps=opts.unpack_mbps, pull_seconds=pull,
        bandwidth_mbps=opts.bandwidth_mbps, layers=tuple(layers), labels=dict(facts.labels),
        findings=tuple(findings), compressed_source=source if compressed is not None else None,
        kernels=kernel_coverage(saved.kernels(diff_ids).kernels.values()) if opts.kernels else None,
    )


# ---------------------------------------------------------------- budget and output


def group_sizes(report: ImageReport) -> dict[str, int]:
    """Bytes per layer group, in build order (base first); the values sum to ``report.size``."""
    sizes: dict[str, int] = {}
    for layer in report.layers:
        sizes[layer.group] = sizes.get(layer.group, 0) + layer.size
    order = {g: i for i, g in enumerate(GROUP_ORDER)}
    return dict(sorted(sizes.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))


def check_budget(report: ImageReport, max_size: int) -> None:
    """Raise SizeBudgetExceeded, with the breakdown by layer group, when the image is over."""
    if report.size <= max_size:
        return
    groups = group_sizes(report)
    biggest = max(report.layers, key=lambda x: x.size)
    breakdown = ", ".join(f"{g} {human_size(b)}" for g, b in sorted(groups.items(), key=lambda kv: -kv[1]))
    raise SizeBudgetExceeded(
        f"{report.image} is {human_size(report.size)}, over the budget of {human_size(max_size)}: {breakdown}",
        size=report.size, max_size=max_size, groups=groups,
        hint=f"the biggest layer is {biggest.index} ({biggest.step or biggest.group}, {human_size(biggest.size)}); "
             f"see `imgbuild inspect {report.image}`")


def short_created(created_by: str, width: int = 60) -> str:
    s = " ".join(created_by.replace("/bin/sh -c #(nop) ", "").replace(" # buildkit", "").split())
    return s if len(s) <= width else s[: width - 1] + "…"


def report_blocks(report: ImageReport) -> list[Block]:
    """The report as the CLI prints it: summary lines, then the layers, groups and findings
    tables (text_table: rich on a terminal, aligned columns in a pipe)."""
    pull = "-" if report.pull_seconds is None else f"{report.pull_seconds:.1f} s at {report.bandwidth_mbps:g} Mbit/s"
    if report.pull_seconds is not None and report.unpack_mbps:
        pull += f", unpacking at {report.unpack_mbps:g} MB/s"
    blocks: list[Block] = [f"{report.image}  {report.id[:19]}  size {human_size(report.size)}, "
                           f"compressed {human_size(report.compressed_size)}, pull {pull}"]
    if report.labels:
        blocks.append(", ".join(f"{k.removeprefix(L.PREFIX)}={v}" for k, v in report.labels.items()))
    blocks.append(TextTable("Layers", ("#", "step", "group", "size", "compressed", "created by"), tuple(
        (str(x.index), x.step or "-", x.group, human_size(x.size), human_size(x.compressed_size),
         short_created(x.created_by)) for x in report.layers), right=frozenset({"#", "size", "compressed"})))
    blocks.append(TextTable("Groups", ("group", "size", "share"), tuple(
        (g, human_size(b), f"{100 * b / report.size:.1f}%" if report.size else "-")
        for g, b in group_sizes(report).items()), right=frozenset({"size", "share"})))
    if not report.findings:
        blocks.append("No findings.")
    else:
        blocks.append(TextTable("Findings", ("severity", "kind", "layer", "path", "size", "message"), tuple(
            (f.severity, f.kind, f"{f.layer} {f.step}" if f.step else str(f.layer), f.path, human_size(f.size),
             f.message) for f in report.findings), right=frozenset({"size"}), styles={WARNING: "yellow", INFO: "dim"}))
    if report.kernels is not None:
        blocks.append(coverage_table(report.kernels) if report.kernels.libraries else "No CUDA kernels.")
    return blocks
