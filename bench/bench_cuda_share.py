"""CUDA layers shared across OSes and Pythons (issue 33 item 2): the bytes a node that holds one
image must pull for the same CUDA on another OS and Python, with the CUDA wheels in the venv (the
layout before: /opt/venv/lib/python3.X/site-packages) and in the shared prefix (now:
/opt/imgbuild/cuda-wheels), both built and pushed in this one run.

The matrix: the same recipe (CUDA 12.4 from wheels, the runtime tier: cuBLAS, cuFFT, cuSOLVER,
cuSPARSE, NCCL in layers of their own, the small libraries in one) on Debian 12 / Python 3.11
and Debian 13 / Python 3.13, the two OS x Python pairs this machine has bases for (no Ubuntu
archive, no deadsnakes here). The before arm is the same plan with its prefix steps turned back
into venv steps (``venv_layout``): what imgbuild rendered before the prefix, the rest identical.
The bytes come from `imgbuild diff A B --json` on the registry's manifests (a layer is shared
when the node has its blob), as a user would read them.

One engine: Docker 26 with buildx and the containerd store, gzip layers, the local registry.
Each image leaves the engine and the registry at the end. Needs the Debian 13 base
(debian:trixie-slim in that engine; tests/test_e2e_cuda_prefix.py makes it, or
`mmdebstrap --variant=minbase --include=ca-certificates trixie t.tar http://deb.debian.org/debian`
and `docker import t.tar debian:trixie-slim`); skips (exit 0) without it or the engine, fails under CI=true.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_reuse import CA, REGISTRY, need_disk, setup  # noqa: E402

from buildkit_py import oci  # noqa: E402
from buildkit_py.cli.main import main as cli  # noqa: E402
from buildkit_py.pipeline import plan_from_data  # noqa: E402
from buildkit_py.pipeline.build import BuildOptions, build_checked  # noqa: E402
from buildkit_py.plan.build_plan import BuildPlan  # noqa: E402
from buildkit_py.plan.steps import LdconfigStep, PipStep, PrefixPathStep, PrefixPipStep, Step  # noqa: E402
from buildkit_py.recipe.model import load_recipe  # noqa: E402

BOOKWORM = os.environ.get("IMGBUILD_TEST_BASE_IMAGE", "debian:bookworm-slim")
TRIXIE = "debian:trixie-slim"
# A runtime-tier image costs about 12 GB while it builds here (4.2 GB in the image store, the build
# cache's snapshots, 1.6 GB of blobs in the engine and again in the registry); a run of this bench
# once died in its fourth build with the disk full (15 GB free on the shared machine).
IMAGE_GB = 12.0
# runtime (default): the tier's ~1.5 GB of CUDA layers; base (libcudart alone) for a quick run
FLAVOR = os.environ.get("IMGBUILD_BENCH_CUDA_FLAVOR", "runtime")
# The torch pair instead (IMGBUILD_BENCH_CUDA_TORCH=2.14.1): torch from the Python registry with the
# CUDA 13.0 wheels it pins (~3 GB of them), the cp311 and the cp313 wheel; ~21 GB of disk per build here
TORCH = os.environ.get("IMGBUILD_BENCH_CUDA_TORCH", "")
TORCH_IMAGE_GB = 21.0
PAIRS = (("debian12-py3.11", BOOKWORM, "3.11"), ("debian13-py3.13", TRIXIE, "3.13"))

RECIPE = """\
name: imgbuild-bench/cuda-share-{run}
version: "{key}"
cuda: {{version: "12.4", source: wheels, flavor: {flavor}}}
base: {{image: {base}}}
python: "{python}"
build: {{installer: pip}}
"""
TORCH_RECIPE = """\
name: imgbuild-bench/cuda-share-{run}
version: "{key}"
cuda: {{version: "13.0", source: wheels, flavor: base}}
base: {{image: {base}}}
python: "{python}"
torch: "{torch}"
build: {{installer: pip}}
"""


def recipe_text(run: str, key: str, base: str, python: str) -> str:
    if TORCH:
        return TORCH_RECIPE.format(run=run, key=key, base=base, python=python, torch=TORCH)
    return RECIPE.format(run=run, key=key, base=base, python=python, flavor=FLAVOR)


def what() -> str:
    return f"torch {TORCH} with its CUDA 13.0 wheels" if TORCH else f"CUDA 12.4 {FLAVOR}-tier wheels"


def venv_layout(plan: BuildPlan) -> BuildPlan:
    """The plan as imgbuild made it before the shared prefix: each PrefixPipStep a reproducible
    venv PipStep with the same pins, no .pth step, the loader's config over the venv only."""
    fields = [f.name for f in dataclasses.fields(PipStep)]

    def back(step: Step) -> Step | None:
        if isinstance(step, PrefixPipStep):
            return PipStep(**{name: getattr(step, name) for name in fields})
        if isinstance(step, PrefixPathStep):
            return None
        if isinstance(step, LdconfigStep):
            return dataclasses.replace(step, prefix=None)
        return step

    stages = tuple(dataclasses.replace(s, steps=tuple(x for x in map(back, s.steps) if x is not None))
                   for s in plan.stages)
    return dataclasses.replace(plan, stages=stages)


def diff(a: str, b: str) -> dict:
    """`imgbuild diff A B --json` from the registry, as a user runs it."""
    out, err = io.StringIO(), io.StringIO()
    code = cli(["diff", a, b, "--json", "--source", "registry", "--no-uncompressed"], stdout=out, stderr=err)
    if code != 0:
        raise RuntimeError(f"imgbuild diff {a} {b} failed ({code}): {err.getvalue()}")
    return json.loads(out.getvalue())


# CUDA-group steps that are per image by design: the venv's .pth and the loader's cache (ldconfig), and
# a layer's wheels built for one Python (``<layer>-py``: cuda-bindings, cp313 is not cp311), which no
# prefix can share
PER_IMAGE = ("cuda-path", "ldconfig")


def per_image(step: str | None) -> bool:
    return step in PER_IMAGE or (step or "").endswith("-py")


def cuda_bytes(d: dict, status: str | None = None) -> int:
    """Compressed bytes of the CUDA wheels' layers (group cuda, less the per-image steps)."""
    return sum(x["compressed_size"] for x in d["layers"]
               if x["group"] == "cuda" and not per_image(x["step"]) and status in (None, x["status"]))


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_out", nargs="?", help="write the figures here as JSON")
    args = parser.parse_args(argv)
    try:
        engine = setup()
        if engine.image_attrs(TRIXIE) is None:
            raise RuntimeError(f"no {TRIXIE} base in the engine (see bench/bench_cuda_share.py)")
    except Exception as exc:  # noqa: BLE001 - whatever is missing, say it and skip (fail in CI)
        print(f"CUDA sharing benchmark skipped: {exc}")
        return 1 if os.environ.get("CI") == "true" else 0

    def say(text: str) -> None:
        print(text, flush=True)

    run = uuid.uuid4().hex[:8]
    say(f"CUDA layers across OS x Python ({what()}), {engine.describe()}, gzip layers, registry {REGISTRY}")
    refs: list[str] = []
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="imgbuild-bench-cuda-share-") as tmp:
        try:
            for arm in ("venv", "prefix"):
                images = []
                for key, base, python in PAIRS:
                    folder = Path(tmp) / arm / key
                    folder.mkdir(parents=True)
                    recipe = folder / "recipe.yaml"
                    recipe.write_text(recipe_text(run, key, base, python))
                    plan = plan_from_data(load_recipe(recipe))
                    plan = venv_layout(plan) if arm == "venv" else plan
                    ref = f"{REGISTRY}/imgbuild-bench/cuda-share-{run}-{arm}:{key}"
                    need_disk(TORCH_IMAGE_GB if TORCH else IMAGE_GB if FLAVOR == "runtime" else 2.0,
                              f"the {arm} {key} build")
                    refs.append(ref)  # removed at the end even when its build fails after pushing
                    start = time.monotonic()
                    # no layer cache: a cached step whose image another build removed fails the export
                    # with `failed to solve: not found` on this engine (moby/moby#48700; seen here); the
                    # pip download cache stays warm
                    build_checked(plan, engine, BuildOptions(tags=(ref,), push=True, ca_cert=CA, no_cache=True),
                              lambda _l: None)
                    images.append(ref)
                    # the diff reads the registry: the engine's copy (4.2 GB unpacked for the runtime tier)
                    # goes now, so that four builds need the disk of one (every build here is no-cache)
                    engine.remove(ref)
                    say(f"  {arm:6} {key}: built and pushed in {time.monotonic() - start:.0f} s")
                d = diff(*images)
                t = d["totals"]
                results[arm] = {"total": t["compressed_size"], "new": t["new_compressed_size"],
                                "shared": t["shared_compressed_size"], "cuda": cuda_bytes(d),
                                "cuda_new": cuda_bytes(d, "new"), "layers": t["layers"], "new_layers": t["new_layers"]}
                say(f"  {arm:6} {PAIRS[1][0]} for a node holding {PAIRS[0][0]}: {t['new_compressed_size']:,} B of "
                    f"{t['compressed_size']:,} B to pull; CUDA layers {cuda_bytes(d, 'new'):,} B "
                    f"of {cuda_bytes(d):,} B")
        finally:
            for ref in refs:
                engine.remove(ref)
                try:
                    oci.delete_manifest(ref)
                except Exception as exc:  # noqa: BLE001 - cleanup goes on; say what is left
                    say(f"    could not delete {ref}: {exc}")
    v, p = results["venv"], results["prefix"]
    say("")
    say(f"(11) {what()}, {PAIRS[1][0]} for a node holding {PAIRS[0][0]} (compressed bytes to pull)")
    for label, x in (("CUDA in the venv (before)", v), ("CUDA in the shared prefix", p)):
        say(f"    {label:27} {x['new']:>15,} B of {x['total']:>15,} B   CUDA layers {x['cuda_new']:>15,} B "
            f"of {x['cuda']:,} B")
    say(f"    => the node pulls {v['new'] / max(p['new'], 1):.1f}x fewer bytes; the CUDA layers once "
        f"({'met' if p['cuda_new'] == 0 else 'MISSED'})")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))
    return 0 if p["cuda_new"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
