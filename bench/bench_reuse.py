"""What a GPU node must pull again after a change, on real PyTorch images: imgbuild's layering
beside the Dockerfile users write by hand, both built and pushed in this one run.

Scenarios, each from the same starting image A (torch 2.14.0 + numpy + requests + an app):
  (a) an app-only change                         goal <= 1 % of the image's compressed bytes
  (b) a non-torch pin bumped (requests)          goal <= 5 %
  (c) torch 2.14.0 -> 2.14.1 (identical CUDA pins) goal <= 25 %
and the image sizes (compressed, uncompressed) of both. The bytes to pull come from
`imgbuild diff A B --json` on the registry's manifests (a layer is shared when the node has
its blob digest), for ours and the hand-written images alike.

The hand-written Dockerfile is what users write: a slim Python base (python:3.11-slim is not
reachable here; a stand-in is built from the local Debian base with Debian's Python 3.11 and a
venv, the same Python our recipe gets), COPY requirements.txt, one `RUN pip install -r`, COPY
the app. It gets the CA bundle as a BuildKit secret and the pip cache mount as our builds do,
so wheels download once for both.

One engine: Docker 26 with buildx and the containerd image store (what users have), pushing to
the local registry with gzip layers (the default). Each variant's image leaves the engine once
pushed and diffed, the starting image A when its arm ends (removing A earlier deletes blobs its
build cache still points at: moby/moby#48700, `failed to solve: not found`); the hand-written
images' build cache (found by a marker unique to this run in their RUN line)
is pruned by record id once no later scenario needs it; registry manifests are deleted at the
end (the registry keeps blobs until its garbage collection). Refuses to start when the disk
has less than FULL_GB free, and stops before any build the disk cannot hold: a torch image is
about 3.5 GB compressed, 7 GB unpacked, and costs about 21 GB here while it is being built.

Needs the registry and the Docker 26 engine (`scripts/services.sh up`); skips (exit 0) without
them, fails under CI=true.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from buildkit_py import oci  # noqa: E402
from buildkit_py.cli.main import main as cli  # noqa: E402
from buildkit_py.engine import BuildRequest, select_engine  # noqa: E402
from buildkit_py.pipeline import plan_from_data  # noqa: E402
from buildkit_py.pipeline.build import BuildOptions, build_checked  # noqa: E402
from buildkit_py.recipe.model import load_recipe  # noqa: E402

CA = Path("/etc/ssl/certs/ca-certificates.crt")
BASE = os.environ.get("IMGBUILD_TEST_BASE_IMAGE", "debian:bookworm-slim")
REGISTRY = os.environ.get("IMGBUILD_TEST_REGISTRY", "127.0.0.1:5000")
# Measured on Docker 26 with the containerd store: a torch image built from nothing takes about
# 21 GB (7 GB of build-cache snapshots, 7 GB unpacked again into the image store, 3.5 GB of
# compressed blobs in the engine and 3.5 GB more in the registry); a variant that reuses it, ~2 GB.
FULL_GB = float(os.environ.get("IMGBUILD_BENCH_REUSE_FULL_GB", "22"))
DELTA_GB = 4.0

TORCH_A, TORCH_C = "2.14.0", "2.14.1"  # identical nvidia-* pins (compat/data/torch_cuda_pins.json)
PINS_A = ("numpy==2.2.6", "requests==2.32.3")
PINS_B = ("numpy==2.2.6", "requests==2.32.4")
GOALS = {"app": 0.01, "pin": 0.05, "torch": 0.25}

RECIPE = """\
name: imgbuild-bench/reuse-{run}
version: "{version}"
cuda: {{version: "13.0", source: wheels, flavor: base}}
base: {{image: {base}}}
python: "3.11"
torch: "{torch}"
pip: [{pins}]
copy: [{{src: app/, dest: /app}}]
workdir: /app
"""

HANDWRITTEN = """\
FROM {base}
# stand-in for python:3.11-slim (no public registry here): Debian's Python 3.11 in a venv
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \\
    && rm -rf /var/lib/apt/lists/* && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
COPY requirements.txt .
RUN --mount=type=secret,id=cacert --mount=type=cache,target=/root/.cache/pip \\
    PIP_CERT=/run/secrets/cacert pip install -r requirements.txt  # {marker}
COPY app/ /app
"""


@dataclass(frozen=True)
class Variant:
    key: str  # a0 (the starting image), a (app change), b (pin bump), c (torch bump)
    torch: str
    pins: tuple[str, ...]
    app: str


VARIANTS = (
    Variant("a0", TORCH_A, PINS_A, "print('v1')\n"),
    Variant("a", TORCH_A, PINS_A, "print('v2')  # app-only change\n"),
    Variant("b", TORCH_A, PINS_B, "print('v1')\n"),
    Variant("c", TORCH_C, PINS_A, "print('v1')\n"),
)
FULL = {("ours", "a0"), ("handwritten", "a0"), ("handwritten", "b"), ("handwritten", "c")}  # a new torch layer
SCENARIOS = (("a", "app", "(a) app-only change"), ("b", "pin", "(b) non-torch pin bumped (requests)"),
             ("c", "torch", f"(c) torch {TORCH_A} -> {TORCH_C}"))


def free_gb(path: str = "/") -> float:
    return shutil.disk_usage(path).free / 1e9


def need_disk(gb: float, what: str) -> None:
    free = free_gb()
    if free < gb:
        raise SystemExit(f"reuse benchmark: {free:.1f} GB free on /, {what} needs {gb:.0f} GB; "
                         "free some space (or set IMGBUILD_BENCH_REUSE_FULL_GB) and rerun")


def diff(a: str, b: str, *, uncompressed: bool) -> dict:
    """`imgbuild diff A B --json` from the registry, as a user runs it."""
    out, err = io.StringIO(), io.StringIO()
    argv = ["diff", a, b, "--json", "--source", "registry"] + ([] if uncompressed else ["--no-uncompressed"])
    code = cli(argv, stdout=out, stderr=err)
    if code != 0:
        raise RuntimeError(f"imgbuild diff {a} {b} failed ({code}): {err.getvalue()}")
    return json.loads(out.getvalue())


class Arm:
    """Builds and pushes one variant of one arm (ours or the hand-written Dockerfile)."""

    def __init__(self, name: str, engine, tmp: Path, run: str) -> None:
        self.name, self.engine, self.tmp, self.run = name, engine, tmp, run
        self.refs: dict[str, str] = {}

    def ref(self, v: Variant) -> str:
        return f"{REGISTRY}/imgbuild-bench/reuse-{self.run}-{self.name}:{v.key}"

    def folder(self, v: Variant) -> Path:
        folder = self.tmp / self.name / v.key
        (folder / "app").mkdir(parents=True)
        (folder / "app" / "main.py").write_text(v.app)
        return folder

    def build(self, v: Variant) -> str:
        ref = self.ref(v)
        if self.name == "ours":
            folder = self.folder(v)
            recipe = folder / "recipe.yaml"
            recipe.write_text(RECIPE.format(run=self.run, version=v.key, base=BASE, torch=v.torch,
                                            pins=", ".join(v.pins)))
            build_checked(plan_from_data(load_recipe(recipe)), self.engine,
                          BuildOptions(tags=(ref,), push=True, ca_cert=CA), lambda _l: None)
        else:
            folder = self.folder(v)
            (folder / "requirements.txt").write_text("\n".join((f"torch=={v.torch}", *v.pins)) + "\n")
            (folder / "Dockerfile").write_text(HANDWRITTEN.format(base=BASE, marker=self.marker))
            request = BuildRequest(context_dir=folder, dockerfile=folder / "Dockerfile", tags=(ref,),
                                   secrets={"cacert": CA}, push=True, load=False, progress="plain")
            self.engine.build(request, lambda _l: None)
        self.refs[v.key] = ref
        return ref

    @property
    def marker(self) -> str:
        return f"imgbuild-bench-reuse-{self.run}"


def prune_marked(engine, marker: str) -> int:
    """Remove the build-cache records whose description carries ``marker`` (this run's
    hand-written pip step), by record id: nothing of other builds is touched."""
    env = engine.environment()
    du = subprocess.run([*engine.buildx, "du", "--verbose"], capture_output=True, text=True, env=env, check=True)
    ids, current = [], None
    for line in du.stdout.splitlines():
        if line.startswith("ID:"):
            current = line.split()[1]
        elif line.startswith("Description:") and marker in line and current:
            ids.append(current)
    for record in ids:
        subprocess.run([*engine.buildx, "prune", "-f", "--filter", f"id={record}"], capture_output=True,
                       env=env, check=False)
    return len(ids)


def fraction(d: dict) -> float:
    return d["totals"]["new_compressed_size"] / d["totals"]["compressed_size"]


def steps_of_new_layers(d: dict) -> str:
    return ", ".join(f"{x['step'] or x['created_by'][:40]} {x['compressed_size'] / 1e6:.1f} MB"
                     for x in d["layers"] if x["status"] == "new")


def run_arm(arm: Arm, say: Callable[[str], None]) -> dict:
    """Build A and each changed variant, diff each against A (printed as it comes), free what
    is no longer needed."""
    out: dict = {}
    labels = {key: label for key, _g, label in SCENARIOS}
    for v in VARIANTS:
        need_disk(FULL_GB if (arm.name, v.key) in FULL else DELTA_GB, f"the {arm.name} {v.key} build")
        start = time.monotonic()
        arm.build(v)
        say(f"  {arm.name} {v.key}: built and pushed in {time.monotonic() - start:.0f} s")
        if v.key == "a0":
            continue
        d = diff(arm.refs["a0"], arm.refs[v.key], uncompressed=v.key == "a")
        out[v.key] = d
        t = d["totals"]
        say(f"  {arm.name} {labels[v.key]}: {t['new_compressed_size']:,} B of {t['compressed_size']:,} B "
            f"({fraction(d):.2%}); new layers: {steps_of_new_layers(d)}")
        # Pushed, so the engine's copy of the variant can go; A stays until the arm ends: with the
        # containerd store, removing an image deletes blobs the build cache still points at, and
        # the next build that reuses A's layers fails with `failed to solve: not found`
        # (moby/moby#48700). What a variant adds beyond A no later build reuses.
        arm.engine.remove(arm.refs[v.key])
        if arm.name == "handwritten":
            prune_marked(arm.engine, arm.marker)  # A's pip layer served (a); (b), (c) re-run pip anyway
    arm.engine.remove(arm.refs["a0"])
    return out


def print_results(ours: dict, hand: dict, say: Callable[[str], None]) -> dict:
    results: dict = {}
    for key, goal_key, label in SCENARIOS:
        o, h = ours[key]["totals"], hand[key]["totals"]
        fo, fh = fraction(ours[key]), fraction(hand[key])
        goal = GOALS[goal_key]
        say(f"{label}")
        say(f"    ours        {o['new_compressed_size']:>15,} B of {o['compressed_size']:>15,} B  {fo:8.2%}  "
            f"(goal <= {goal:.0%}: {'met' if fo <= goal else 'MISSED'})  new: {steps_of_new_layers(ours[key])}")
        say(f"    hand-written {h['new_compressed_size']:>14,} B of {h['compressed_size']:>15,} B  {fh:8.2%}")
        say(f"    => ours pulls {o['new_compressed_size'] / max(h['new_compressed_size'], 1):.4f}x the bytes "
            f"of the hand-written image")
        results[key] = {"ours_new": o["new_compressed_size"], "ours_total": o["compressed_size"], "ours_fraction": fo,
                        "hand_new": h["new_compressed_size"], "hand_total": h["compressed_size"],
                        "hand_fraction": fh, "goal": goal, "met": fo <= goal,
                        "ours_layers": o["layers"], "hand_layers": h["layers"]}
    oa, ha = ours["a"]["b"], hand["a"]["b"]
    say(f"image size       ours {oa['compressed_size']:,} B compressed, {oa['size']:,} B uncompressed, "
        f"{oa['layers']} layers")
    say(f"                 hand-written {ha['compressed_size']:,} B compressed, {ha['size']:,} B uncompressed, "
        f"{ha['layers']} layers")
    say(f"    => ours/hand-written: {oa['compressed_size'] / ha['compressed_size']:.3f}x compressed, "
        f"{oa['size'] / ha['size']:.3f}x uncompressed")
    results["size"] = {"ours": {k: oa[k] for k in ("compressed_size", "size", "layers")},
                       "hand": {k: ha[k] for k in ("compressed_size", "size", "layers")}}
    return results


def setup():
    os.environ["IMGBUILD_DOCKER"] = os.environ.get("IMGBUILD_TEST_DOCKER26_CLIENT", "/opt/engine26/usr/bin/docker")
    os.environ["DOCKER_HOST"] = os.environ.get("IMGBUILD_TEST_DOCKER26_HOST", "unix:///run/docker26.sock")
    pw_file = Path(os.environ.get("IMGBUILD_TEST_REGISTRY_PASSWORD_FILE",
                                  "/var/lib/imgbuild-services/registry/password"))
    engine = select_engine("buildx")
    engine.sdk()
    if not engine.containerd_store():
        raise RuntimeError("the engine does not use the containerd image store")
    if not CA.exists():
        raise RuntimeError(f"no CA bundle at {CA}")
    os.environ["IMGBUILD_REGISTRY_USER"] = os.environ.get("IMGBUILD_TEST_REGISTRY_USER", "ci")
    os.environ["IMGBUILD_REGISTRY_PASSWORD"] = pw_file.read_text().strip()
    os.environ["IMGBUILD_REGISTRY_HOST"] = REGISTRY
    return engine


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_out", nargs="?", help="write the figures here as JSON")
    parser.add_argument("--arm", choices=("both", "ours", "handwritten"), default="both",
                        help="build one arm only (its diffs are printed; the comparison needs both)")
    args = parser.parse_args(argv)
    try:
        engine = setup()
    except Exception as exc:  # noqa: BLE001 - whatever is missing, say it and skip (fail in CI)
        print(f"reuse benchmarks skipped: {exc}")
        return 1 if os.environ.get("CI") == "true" else 0
    need_disk(FULL_GB, "the reuse benchmark (a torch image at a time, each arm)")

    def say(text: str) -> None:
        print(text, flush=True)

    say(f"imgbuild reuse benchmarks on real torch images, {engine.describe()}, gzip layers, registry {REGISTRY}\n")
    run = uuid.uuid4().hex[:8]
    names = ("ours", "handwritten") if args.arm == "both" else (args.arm,)
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="imgbuild-bench-reuse-") as tmp_name:
        arms = [Arm(name, engine, Path(tmp_name), run) for name in names]
        try:
            diffs = {arm.name: run_arm(arm, say) for arm in arms}
            if len(diffs) == 2:
                say("")
                results = print_results(diffs["ours"], diffs["handwritten"], say)
            else:
                results = {name: {k: d["totals"] for k, d in out.items()} for name, out in diffs.items()}
        finally:
            for arm in arms:
                for ref in arm.refs.values():
                    engine.remove(ref)
                    try:
                        oci.delete_manifest(ref)
                    except Exception as exc:  # noqa: BLE001 - cleanup goes on; say what is left
                        say(f"    could not delete {ref}: {exc}")
                if arm.name == "handwritten":
                    prune_marked(engine, arm.marker)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
