"""uv vs pip as the installer of the pip steps (issue 15 item 7): build time of the same recipe
with `build.installer: uv` and `build.installer: pip`, side by side in one run, as ratios.

  cold: nothing cached. No layer cache (--no-cache) and empty download caches: the recipe's
        Dockerfile is built with its cache mounts (pip's or uv's download cache, uv itself)
        turned into tmpfs mounts, so every wheel (and uv) is downloaded from the Python registry
        as on a machine that never built it. Nothing of it is left behind in the builder.
  warm: no layer cache (--no-cache), download caches warm (a builder that built the recipe
        before, e.g. a CI runner with a persistent cache): the time it takes to install.

Arms alternate (cold uv, cold pip, then warm uv, warm pip) so machine load falls on both alike.
The stacks:
  torch (default): torch 2.14.1 (the cu130 build on the Python registry, ~3 GB of wheels,
        a ~7 GB image) with transformers 4.44.2, datasets 2.21.0, accelerate 0.34.2, numpy,
        pandas, scipy: the stack issue 15 measured in a venv. Needs ~20 GB free on / .
  small: the same without torch and its CUDA wheels (transformers, datasets, accelerate's
        pure-Python part is left out as it requires torch; numpy, pandas, scipy).

Usage: python bench/bench_installer.py [--stack torch|small] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
from buildkit_py.engine.build import BuildOptions, assemble_context  # noqa: E402
from buildkit_py.pipeline import plan_from_data  # noqa: E402
from buildkit_py.pipeline.build import build_checked  # noqa: E402
from buildkit_py.recipe.model import InstallerName, load_recipe  # noqa: E402
from buildkit_py.render.dockerfile import render_dockerfile  # noqa: E402

DOCKER = "/usr/bin/docker"
CA = Path("/etc/ssl/certs/ca-certificates.crt")
BASE = os.environ.get("IMGBUILD_TEST_BASE_IMAGE", "debian:bookworm-slim")
INSTALLERS = InstallerName.words()
COMMON = ["numpy==1.26.4", "pandas==2.2.2", "scipy==1.13.1", "transformers==4.44.2", "datasets==2.21.0"]
STACKS = {
    "torch": {"cuda": "13.0", "torch": "2.14.1", "pins": [*COMMON, "accelerate==0.34.2"], "free_gb": 20},
    "small": {"cuda": "12.4", "torch": None, "pins": COMMON, "free_gb": 3},
}
RECIPE = """\
name: imgbuild-bench/installer-{installer}
version: "{run}"
cuda: {{version: "{cuda}", source: wheels, flavor: base}}
base: {{image: {base}}}
python: "3.11"
{torch}pip: [{pins}]
build: {{installer: {installer}}}
"""
# The download caches and uv's own cache mount of a rendered Dockerfile (steps.j2 install_mounts).
CACHE_MOUNT = re.compile(r"--mount=type=cache,target=(/root/\.cache/pip|/root/\.cache/uv|/run/imgbuild-uv)")


def cold_dockerfile(text: str) -> str:
    """The Dockerfile with every download cache a tmpfs: nothing cached, nothing kept."""
    return CACHE_MOUNT.sub(r"--mount=type=tmpfs,target=\1", text)


class InstallerBench:
    def __init__(self, stack: str) -> None:
        self.stack = STACKS[stack]
        self.engine = select_engine(os.environ.get("IMGBUILD_ENGINE"))
        self.tmp = Path(tempfile.mkdtemp(prefix="imgbuild-bench-installer-"))
        self.run = uuid.uuid4().hex[:8]
        self.tags: list[str] = []

    def recipe(self, installer: str) -> Path:
        folder = self.tmp / installer
        folder.mkdir(parents=True, exist_ok=True)
        torch = f'torch: "{self.stack["torch"]}"\n' if self.stack["torch"] else ""
        path = folder / "recipe.yaml"
        path.write_text(RECIPE.format(installer=installer, run=self.run, cuda=self.stack["cuda"], base=BASE,
                                      torch=torch, pins=", ".join(self.stack["pins"])))
        return path

    def cold(self, installer: str) -> float:
        """A --no-cache build of the recipe's own Dockerfile with the download caches as tmpfs."""
        plan = plan_from_data(load_recipe(self.recipe(installer)))
        work = self.tmp / f"cold-{installer}"
        work.mkdir()
        context, dockerfile = assemble_context(plan, cold_dockerfile(render_dockerfile(plan)), work)
        tag = f"imgbuild-bench/installer-{installer}:cold-{self.run}"
        cmd = [DOCKER, "build", "--no-cache", "--network", "host", "-t", tag, "-f", str(dockerfile),
               "--progress", "plain"]
        if CA.exists():
            cmd += ["--secret", f"id=cacert,src={CA}"]
        start = time.monotonic()
        proc = subprocess.run([*cmd, str(context)], capture_output=True, text=True, check=False,
                              env={**os.environ, "DOCKER_BUILDKIT": "1"})
        seconds = time.monotonic() - start
        self.tags.append(tag)
        if proc.returncode != 0:
            raise SystemExit(f"cold {installer} build failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        self._drop(tag)
        return seconds

    def warm(self, installer: str) -> float:
        """imgbuild's own build, --no-cache, with its download caches as they are."""
        plan = plan_from_data(load_recipe(self.recipe(installer)))
        options = BuildOptions(ca_cert=CA if CA.exists() else None, no_cache=True)
        outcome = build_checked(plan, self.engine, options, on_line=lambda _line: None).outcome
        self.tags.extend(outcome.result.tags)
        for tag in outcome.result.tags:
            self._drop(tag)
        return outcome.result.seconds

    def _drop(self, tag: str) -> None:
        """Remove an image as soon as it is measured (a torch image is ~7 GB)."""
        subprocess.run([DOCKER, "image", "rm", "-f", tag], capture_output=True, check=False)

    def cleanup(self) -> None:
        for tag in self.tags:
            self._drop(tag)
        shutil.rmtree(self.tmp, ignore_errors=True)


def report(label: str, text: str) -> None:
    print(f"{label:<44} {text}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stack", choices=sorted(STACKS), default=os.environ.get("IMGBUILD_BENCH_STACK", "torch"))
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    free_gb = shutil.disk_usage("/").free / 1e9
    if free_gb < STACKS[args.stack]["free_gb"]:
        print(f"(9) installer: skipped, {free_gb:.0f} GB free on / (the {args.stack} stack needs "
              f"{STACKS[args.stack]['free_gb']} GB); run with --stack small", flush=True)
        return 0
    b = InstallerBench(args.stack)
    pins = ", ".join(([f"torch=={b.stack['torch']}"] if b.stack["torch"] else []) + b.stack["pins"])
    print(f"(9) installer, {args.stack} stack on {b.engine.name}: {pins}", flush=True)
    results: dict = {"stack": args.stack, "pins": pins}
    try:
        for installer in INSTALLERS:
            results[f"cold_{installer}_s"] = b.cold(installer)
            report(f"    cold, {installer}", f"{results[f'cold_{installer}_s']:7.1f} s")
        for installer in INSTALLERS:
            b.warm(installer)  # fills the download cache (not timed)
        for installer in INSTALLERS:
            results[f"warm_{installer}_s"] = b.warm(installer)
            report(f"    warm, {installer}", f"{results[f'warm_{installer}_s']:7.1f} s")
    finally:
        b.cleanup()
    results["cold_ratio"] = results["cold_pip_s"] / results["cold_uv_s"]
    results["warm_ratio"] = results["warm_pip_s"] / results["warm_uv_s"]
    report("    => uv faster than pip, cold / warm", f"{results['cold_ratio']:7.2f}x / {results['warm_ratio']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
