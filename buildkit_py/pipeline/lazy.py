"""Lazy pulling on paper, run: the image's tests under the tracer, then what they read charged to
the image's layers (analysis/lazy.py computes; this wires the engine, the registry and the tests)."""

from __future__ import annotations

import io
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildkit_py.analysis.image_checks import TestReport, TestRun, run_image_tests
from buildkit_py.analysis.lazy import (
    LayerFiles,
    LazyReport,
    RemoteLayer,
    lazy_report,
    make_tracer,
    read_traces,
    remote_layers,
)
from buildkit_py.analysis.saved_image import IterStream, analyze_save_stream
from buildkit_py.errors import InspectError
from buildkit_py.reference import names_registry

if TYPE_CHECKING:
    from buildkit_py.engine.base import Engine
    from buildkit_py.recipe.model import Recipe

# LazyReport and RemoteLayer are analysis/lazy.py's, exported here so that cli/test.py types
# what it shows without one more cli -> analysis edge (tests/test_layers.py).
__all__ = ["LazyReport", "LazyTestRun", "RemoteLayer", "image_layers", "lazy_tests", "pushed_ref"]


def image_layers(engine: Engine, image: str, remote: list[RemoteLayer] | None = None) -> list[LayerFiles]:
    """The image's layers from one ``save`` stream (their files, links, whiteouts), sized by the
    registry's blobs when ``remote`` lines up with them, else by the engine's compressed blobs
    (the containerd store) or a gzip -6 estimate; an eStargz layer of ``remote`` brings its spans."""
    info = engine.image(image)
    if info is None:
        raise InspectError(f"no image {image} in the {engine.describe()}")
    diff_ids = list(info.layers)
    stream = io.BufferedReader(IterStream(engine.save(image)), 1 << 20)
    saved = analyze_save_stream(stream, image_id=info.id, diff_ids=diff_ids, estimate_compressed=remote is None)
    if remote is not None and len(remote) != len(diff_ids):
        raise InspectError(f"the registry's image has {len(remote)} layers, the engine's {len(diff_ids)}",
                           hint="test the image the registry holds: pull it, or push this one")
    out = []
    for i, d in enumerate(diff_ids):
        scan = saved.layers[d]
        there = remote[i] if remote is not None else None
        out.append(LayerFiles(d, there.size if there else scan.compressed_size or scan.blob_size, scan.blob_size,
                              dict(scan.files), dict(scan.link_targets), tuple(scan.whiteouts),
                              there.toc.spans if there and there.toc else None,
                              there.toc.toc_bytes if there and there.toc else 0))
    return out


def lazy_tests(engine: Engine, image: str, *, recipe: Recipe | None = None, defaults: bool = True,
               on_event: Callable[[str], None] | None = None,
               ) -> tuple[TestReport, LazyReport, list[RemoteLayer] | None]:
    """Run the image's tests under the tracer (its copy of strace and the logs in a temporary
    folder), then charge what they read to the image's layers: those its registry holds (with
    their eStargz TOCs) where the image was pushed or pulled (``pushed_ref``), else the engine's."""
    with tempfile.TemporaryDirectory(prefix="imgbuild-lazy-") as work:
        tracer = make_tracer(Path(work))
        tests = run_image_tests(engine, image, recipe=recipe, defaults=defaults, on_event=on_event, tracer=tracer)
        reads = read_traces(tracer)
    registry_ref = pushed_ref(engine, image)
    remote = remote_layers(registry_ref) if registry_ref else None
    return tests, lazy_report(registry_ref or image, image_layers(engine, image, remote), reads), remote


def pushed_ref(engine: Engine, image: str) -> str | None:
    """The reference to measure in its registry: ``image`` itself where the engine records it as
    pulled or pushed (its registry digests) and its name starts with a registry host
    (reference.names_registry); None: measure the engine's copy."""
    info = engine.image(image)
    return image if info is not None and info.repo_digests and names_registry(image) else None


@dataclass(frozen=True)
class LazyTestRun:
    """What `test --lazy` prints: the tests' verdicts and the lazy-pull report of what they read
    (``registry_layers``: the pushed layers' exact figures, None where the image was not measured
    in its registry). Its --json document and its text read these fields."""

    __test__ = False

    run: TestRun
    lazy: LazyReport
    remote: tuple[RemoteLayer, ...] | None

    def to_json(self) -> dict[str, Any]:
        registry_layers = [x.to_json() for x in self.remote] if self.remote is not None else None
        return {**self.run.to_json(), "lazy": {**self.lazy.to_json(), "registry_layers": registry_layers}}

    def lines(self) -> list[str]:
        return [*self.lazy.lines(), *self.run.lines()]
