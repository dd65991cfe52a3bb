"""Benchmark: a 2x2 matrix (CUDA 12.1/12.4 from the runtime wheels x two pin sets) built with
`build --all` vs the same four variants built as separate cold builds (--no-cache), side by
side in one run, printed as ratios: wall time, and layer bytes (what a registry or a node's
disk holds for the four images, and how much of it the variants share).

    python bench/bench_matrix.py [--jobs 2] [--json FILE]

Needs the Docker engine and the base image (`make bench` starts them). Each arm builds on a
base image of its own (the base plus a one-file layer with a fresh id), so every cache key
above it is new: the matrix arm is cold too, though it shares within itself.
pip and apt download caches stay warm in both arms (cache mounts), so the ratios measure
layer sharing, not the network.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from buildkit_py import pipeline
from buildkit_py.engine import select_engine
from buildkit_py.pipeline.build import BuildOptions, build_checked
from buildkit_py.pipeline.matrix_build import build_all
from buildkit_py.plan import matrix as mx

DOCKER = "/usr/bin/docker"
CA = Path("/etc/ssl/certs/ca-certificates.crt")
BASE = os.environ.get("IMGBUILD_TEST_BASE_IMAGE", "debian:bookworm-slim")

RECIPE = """\
name: {name}
version: "1"
cuda: {{version: "12.4", source: wheels, flavor: base}}
base: {{image: {base}, os: debian12}}
python: "3.11"
pip: [numpy==1.26.4]
matrix:
  cuda.version: ["12.1", "12.4"]
  pip: [[numpy==1.26.4, idna==3.7], [numpy==1.26.4, idna==3.8]]
  tags: ["{{variant}}"]
"""


def fresh_base(tag: str) -> str:
    """BASE plus a one-file layer with a fresh id: nothing in the layer cache builds on it
    (BuildKit keys a local image by its layers, so a label alone would not do)."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "Dockerfile").write_text(f"FROM {BASE}\nRUN echo {uuid.uuid4().hex} > /etc/imgbuild-bench-id\n")
        subprocess.run([DOCKER, "build", "-q", "--network", "host", "-t", tag, tmp], check=True, capture_output=True,
                       env={**os.environ, "DOCKER_BUILDKIT": "1"})
    return tag


def layers(client, image: str, skip: set[str]) -> dict[str, int]:
    """diff id -> bytes of an image's own layers (the base's left out). History entries of
    metadata-only instructions make no layer; the others align with RootFS.Layers."""
    diff_ids = client.images.get(image).attrs["RootFS"]["Layers"]
    metadata_only = ("ENV", "LABEL", "ENTRYPOINT", "CMD", "VOLUME", "ARG", "EXPOSE", "USER", "SHELL", "WORKDIR")
    history = [h for h in reversed(client.api.history(image))
               if not h.get("CreatedBy", "").removeprefix("/bin/sh -c #(nop) ").lstrip().startswith(metadata_only)]
    if len(history) < len(diff_ids):
        raise SystemExit(f"{image}: cannot align {len(diff_ids)} layers with its history")
    sized = {d: int(h.get("Size") or 0) for d, h in zip(diff_ids, history[-len(diff_ids):], strict=False)}
    return {d: s for d, s in sized.items() if d not in skip}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2, help="parallel builds in the matrix arm (default 2)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    engine = select_engine(os.environ.get("IMGBUILD_ENGINE"))
    client = engine.sdk()
    run_id = uuid.uuid4().hex[:8]
    tmp = Path(tempfile.mkdtemp(prefix="imgbuild-bench-matrix-"))
    made: list[str] = []
    ca = CA if CA.exists() else None
    print(f"imgbuild matrix benchmark on {engine.name} ({engine.client}), base {BASE}, -j {args.jobs}\n", flush=True)
    skip: dict[str, set[str]] = {}
    try:
        def load(arm: str) -> mx.Matrix:
            base = fresh_base(f"imgbuild-bench/base-{arm}:{run_id}")
            made.append(base)
            skip[arm] = set(client.images.get(base).attrs["RootFS"]["Layers"])
            folder = tmp / arm
            folder.mkdir()
            path = folder / "recipe.yaml"
            path.write_text(RECIPE.format(name=f"imgbuild-bench/matrix-{arm}-{run_id}", base=base))
            return pipeline.load_matrix(path)

        # (a) separate cold builds, one after the other, as four CI jobs without a shared cache do
        sep = load("separate")
        start = time.monotonic()
        sep_images = []
        for v in sep.variants:
            outcome = build_checked(mx.variant_plan(v), engine, BuildOptions(ca_cert=ca, no_cache=True),
                                    lambda _l: None).outcome
            made.extend(outcome.result.tags)
            sep_images.append(outcome.result.image_id)
        separate_s = time.monotonic() - start

        # (b) the matrix: build --all, shared stages once, then reused from the cache
        mat = load("matrix")
        result = build_all(mat, engine, BuildOptions(ca_cert=ca), jobs=args.jobs)
        for b in result.builds:
            made.extend(b.plan.tags)
        if result.failed:
            raise SystemExit("matrix build failed:\n" + "\n".join(b.error.render() for b in result.failed))
        matrix_s = result.seconds
        mat_images = [b.outcome.result.image_id for b in result.builds]

        def footprint(images, arm):
            per_image = [layers(client, i, skip[arm]) for i in images]
            total = sum(sum(p.values()) for p in per_image)
            distinct = sum({d: s for p in per_image for d, s in p.items()}.values())
            return total, distinct

        _, sep_distinct = footprint(sep_images, "separate")
        mat_total, mat_distinct = footprint(mat_images, "matrix")
        cached = []
        for b in result.builds:
            r = b.outcome.result
            cached.append(f"{b.variant.id} {r.cached_steps}/{r.cached_steps + r.run_steps}")
        shared_mb, total_mb = (mat_total - mat_distinct) / 1e6, mat_total / 1e6
        rows = [
            ("4 variants, separate cold builds",
             f"{separate_s:7.1f} s, {sep_distinct / 1e6:7.1f} MB of distinct layers"),
            (f"4 variants, build --all -j {args.jobs}",
             f"{matrix_s:7.1f} s, {mat_distinct / 1e6:7.1f} MB of distinct layers "
             f"({shared_mb:.1f} MB of {total_mb:.1f} MB shared)"),
            ("    steps from the cache", ", ".join(cached)),
            ("    => matrix faster by", f"{separate_s / matrix_s:7.2f}x"),
            ("    => fewer layer bytes by", f"{sep_distinct / mat_distinct:7.2f}x"),
        ]
        for label, text in rows:
            print(f"{label:<40} {text}", flush=True)
        figures = {"separate_s": separate_s, "matrix_s": matrix_s, "time_ratio": separate_s / matrix_s,
                   "separate_distinct_bytes": sep_distinct, "matrix_distinct_bytes": mat_distinct,
                   "matrix_total_bytes": mat_total, "matrix_shared_bytes": mat_total - mat_distinct,
                   "bytes_ratio": sep_distinct / mat_distinct, "jobs": args.jobs, "cached": cached}
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))
    finally:
        for ref in made:
            subprocess.run([DOCKER, "image", "rm", "-f", ref], capture_output=True)  # noqa: PLW1510
        subprocess.run(["rm", "-rf", str(tmp)])  # noqa: PLW1510
    return 0


if __name__ == "__main__":
    sys.exit(main())
