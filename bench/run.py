"""imgbuild benchmarks: every figure is measured side by side in this one run and printed as
a ratio. Needs the Docker engine and the base image (`make bench` starts them).

  (1) rebuild after an app-only change vs a cold build (time, steps re-run)
  (2) final image size: builder stage + runtime vs the naive single-stage build with the compiler
  (3) two variants sharing a prefix vs two separate cold builds (time and bytes)
  (4) a 2x2 matrix built with --all vs four separate cold builds (bench_matrix.py)
  (5) weights push, pull and resumed pull vs curl and oras-py (bench_weights.py), when the registry runs
  (6) CLI start-up vs a bare interpreter (bench_startup.py)
  (7) on Docker 26 + buildx + containerd store: pull+unpack gzip vs zstd, build-and-push from
      BuildKit vs build + API push (bench_engines.py), when that engine runs
  (8) on real torch images: bytes a node pulls again after an app change, a pin bump and a
      torch patch bump, ours vs the hand-written Dockerfile (bench_reuse.py); needs ~22 GB free
  (8) the schema validator: import and validation time vs jsonschema and pydantic (bench_schemas.py)
  (9) uv vs pip as the installer: cold and warm build time of a torch recipe (bench_installer.py;
      IMGBUILD_BENCH_STACK=small for the stack without torch)
  (10) the CUDA kernels of a whole torch image read as `check --gpu` reads them, against the bare
      stream (bench_kernels.py); target under 30 s
  (11) on Docker 26: the bytes a node holding a Debian 12 / Python 3.11 CUDA image pulls for the
      same CUDA on Debian 13 / Python 3.13, CUDA wheels in the venv vs in the shared prefix
      (bench_cuda_share.py); goal: the CUDA layers pulled once
  (12) cold start: predicted against measured pulls of 3 images at 3 link speeds through a rate-limited
      relay, on Docker 26 (bench_cold_start.py); target within 20%

"Cold" means no layer cache (--no-cache); pip and apt download caches stay warm in both arms,
so the ratios measure layering, not the network.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from buildkit_py.engine import select_engine  # noqa: E402
from buildkit_py.pipeline import plan_from_data  # noqa: E402
from buildkit_py.pipeline.build import BuildOptions, build_checked  # noqa: E402
from buildkit_py.recipe.model import load_recipe  # noqa: E402

DOCKER = "/usr/bin/docker"
CA = Path("/etc/ssl/certs/ca-certificates.crt")
BASE = os.environ.get("IMGBUILD_TEST_BASE_IMAGE", "debian:bookworm-slim")

RECIPE = """\
name: {name}
version: "{version}"
cuda: {{version: "{cuda}", source: wheels, flavor: base}}
base: {{image: {base}}}
python: "3.11"
pip: [{pins}]
copy: [{{src: app/, dest: /app}}]
workdir: /app
{extra}
"""

NAIVE = """\
FROM {base}
RUN apt-get update && apt-get install -y build-essential python3-dev python3-venv
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN --mount=type=secret,id=cacert PIP_CERT=/run/secrets/cacert pip install nvidia-cuda-runtime==13.0.96
RUN --mount=type=secret,id=cacert PIP_CERT=/run/secrets/cacert pip install --no-binary markupsafe markupsafe==2.1.5 numpy==1.26.4
COPY app/ /app
WORKDIR /app
"""  # noqa: E501


class Bench:
    def __init__(self) -> None:
        self.engine = select_engine(os.environ.get("IMGBUILD_ENGINE"))
        self.client = self.engine.sdk()
        self.tmp = Path(tempfile.mkdtemp(prefix="imgbuild-bench-"))
        self.images: list[str] = []
        self.rows: list[tuple[str, str]] = []

    def project(self, name: str, pins: str, extra: str = "", version: str = "1", cuda: str = "12.4") -> Path:
        folder = self.tmp / name
        (folder / "app").mkdir(parents=True, exist_ok=True)
        (folder / "app" / "main.py").write_text(f"print({uuid.uuid4().hex!r})\n")
        path = folder / "recipe.yaml"
        path.write_text(RECIPE.format(name=f"imgbuild-bench/{name}", version=version, base=BASE, pins=pins,
                                      extra=extra, cuda=cuda))
        return path

    def build(self, recipe: Path, *, no_cache: bool = False):
        plan = plan_from_data(load_recipe(recipe))
        options = BuildOptions(ca_cert=CA if CA.exists() else None, no_cache=no_cache)
        outcome = build_checked(plan, self.engine, options, on_line=lambda _l: None).outcome
        self.images.extend(outcome.result.tags)
        return outcome

    def layers(self, image: str) -> dict[str, int]:
        """diff id -> bytes, for counting what two images share. History entries of
        metadata-only instructions make no layer; the others align with RootFS.Layers."""
        diff_ids = self.client.images.get(image).attrs["RootFS"]["Layers"]
        metadata_only = ("ENV", "LABEL", "ENTRYPOINT", "CMD", "VOLUME", "ARG", "EXPOSE", "USER", "SHELL")
        with_layer = [h for h in reversed(self.client.api.history(image))
                      if not h.get("CreatedBy", "").startswith(metadata_only)]
        return {d: int(h["Size"]) for d, h in zip(diff_ids, with_layer[-len(diff_ids):], strict=False)}

    def report(self, label: str, text: str) -> None:
        self.rows.append((label, text))
        print(f"{label:<44} {text}", flush=True)

    def cleanup(self) -> None:
        for ref in self.images:
            subprocess.run([DOCKER, "image", "rm", "-f", ref], capture_output=True)  # noqa: PLW1510
        shutil.rmtree(self.tmp, ignore_errors=True)


def bench_rebuild(b: Bench) -> dict:
    recipe = b.project("rebuild", "numpy==1.26.4")
    cold = b.build(recipe, no_cache=True)
    (recipe.parent / "app" / "main.py").write_text(f"print({uuid.uuid4().hex!r})  # app change\n")
    warm = b.build(recipe)
    ratio = cold.result.seconds / max(warm.result.seconds, 1e-3)
    b.report("(1) cold build", f"{cold.result.seconds:7.1f} s, {cold.result.run_steps} steps run")
    b.report("    rebuild after app-only change", f"{warm.result.seconds:7.1f} s, {warm.result.run_steps} steps "
             f"re-ran ({', '.join(warm.result.rerun)}), {warm.result.cached_steps} cached")
    b.report("    => rebuild is faster by", f"{ratio:7.1f}x")
    return {"cold_s": cold.result.seconds, "rebuild_s": warm.result.seconds, "ratio": ratio,
            "rerun": list(warm.result.rerun), "cached": warm.result.cached_steps}


def bench_multistage(b: Bench) -> dict:
    # CUDA 13: a source build gets the CUDA devel toolchain, which CUDA 12's wheels cannot give on Debian
    recipe = b.project("multistage", "markupsafe==2.1.5, numpy==1.26.4", extra="build: {from_source: [markupsafe]}",
                       cuda="13.0")
    slim = b.build(recipe, no_cache=True)
    naive_dir = b.tmp / "naive"
    shutil.copytree(recipe.parent / "app", naive_dir / "app")
    (naive_dir / "Dockerfile").write_text(NAIVE.format(base=BASE))
    tag = "imgbuild-bench/naive:1"
    start = time.monotonic()
    cmd = [DOCKER, "build", "--no-cache", "--network", "host", "-t", tag, "--progress", "plain"]
    if CA.exists():
        cmd += ["--secret", f"id=cacert,src={CA}"]
    proc = subprocess.run(cmd + [str(naive_dir)], capture_output=True, text=True, env={**os.environ, "DOCKER_BUILDKIT": "1"})  # noqa: E501, PLW1510
    if proc.returncode != 0:
        raise SystemExit(f"naive build failed:\n{proc.stdout[-3000:]}")
    naive_s = time.monotonic() - start
    b.images.append(tag)
    naive_size = int(b.client.images.get(tag).attrs["Size"])
    ratio = naive_size / slim.size
    b.report("(2) imgbuild builder stage + runtime image", f"{slim.size / 1e6:7.1f} MB ({slim.result.seconds:.1f} s)")
    b.report("    naive single stage with the compiler", f"{naive_size / 1e6:7.1f} MB ({naive_s:.1f} s)")
    b.report("    => final image is smaller by", f"{ratio:7.2f}x ({(naive_size - slim.size) / 1e6:.1f} MB less)")
    return {"imgbuild_bytes": slim.size, "naive_bytes": naive_size, "ratio": ratio}


def bench_prefix(b: Bench) -> dict:
    a = b.project("variant-a", "numpy==1.26.4, idna==3.7", version="a")
    c = b.project("variant-b", "numpy==1.26.4, idna==3.8", version="b")
    # separate cold builds: no layer reused
    sep_a = b.build(a, no_cache=True)
    sep_c = b.build(c, no_cache=True)
    separate_s = sep_a.result.seconds + sep_c.result.seconds
    separate_bytes = sum(b.layers(sep_a.result.image_id).values()) + sum(b.layers(sep_c.result.image_id).values())
    # shared: the first cold, the second reusing the common prefix from the cache
    sh_a = b.build(a, no_cache=True)
    (c.parent / "app" / "main.py").write_text(f"print({uuid.uuid4().hex!r})\n")
    sh_c = b.build(c)
    shared_s = sh_a.result.seconds + sh_c.result.seconds
    la, lc = b.layers(sh_a.result.image_id), b.layers(sh_c.result.image_id)
    distinct = {**la, **lc}
    shared_bytes = sum(distinct.values())
    common = sum(v for k, v in la.items() if k in lc)
    b.report("(3) two variants, separate cold builds", f"{separate_s:7.1f} s, {separate_bytes / 1e6:.1f} MB of layers")
    b.report("    two variants sharing the prefix", f"{shared_s:7.1f} s, {shared_bytes / 1e6:.1f} MB of distinct "
             f"layers ({common / 1e6:.1f} MB shared; second re-ran {sh_c.result.run_steps} steps)")
    b.report("    => faster by / fewer bytes by", f"{separate_s / shared_s:7.2f}x / {separate_bytes / shared_bytes:.2f}x")  # noqa: E501
    return {"separate_s": separate_s, "shared_s": shared_s, "separate_bytes": separate_bytes,
            "shared_bytes": shared_bytes, "common_bytes": common}


BENCHES = ("rebuild", "multistage", "prefix", "matrix", "weights", "startup", "engines", "schemas", "installer",
           "kernels", "cuda-share", "coldstart")



# The benches that run as scripts of their own, in the order `make bench` runs them: (name, script, args).
SEPARATE_BENCHES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("matrix", "bench_matrix.py", ("--jobs", "2")),
    ("weights", "bench_weights.py", ()),
    ("startup", "bench_startup.py", ()),
    ("engines", "bench_engines.py", ()),
    ("schemas", "bench_schemas.py", ()),
    ("installer", "bench_installer.py", ()),
    ("kernels", "bench_kernels.py", ()),
    ("cuda-share", "bench_cuda_share.py", ()),
    ("coldstart", "bench_cold_start.py", ()),
    ("reuse", "bench_reuse.py", ()),
)

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=BENCHES, action="append")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    chosen = args.only or list(BENCHES)
    b = Bench()
    results: dict = {}
    print(f"imgbuild benchmarks on {b.engine.name} ({b.engine.client}), base {BASE}\n", flush=True)
    try:
        for name, fn in (("rebuild", bench_rebuild), ("multistage", bench_multistage), ("prefix", bench_prefix)):
            if name in chosen:
                results[name] = fn(b)
                print(flush=True)
    finally:
        b.cleanup()
    for name, script, extra in SEPARATE_BENCHES:  # each its own script, run in turn: its exit status kept
        if name in chosen and (REPO / "bench" / script).exists():
            proc = subprocess.run([sys.executable, str(REPO / "bench" / script), *extra], text=True, check=False)
            results[f"{name.replace('-', '_')}_exit"] = proc.returncode
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
