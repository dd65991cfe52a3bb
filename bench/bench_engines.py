"""Benchmarks on the modern engine (Docker 26 + buildx + the containerd image store), printed
as ratios from one run:

  (a) pull + unpack time of the same image stored with gzip vs zstd layers: push both, remove
      them locally with the build cache (`buildx prune -af`, so no snapshot is reused), timed
      `docker pull` of each;
  (b) build-and-push time with the push done by BuildKit itself (buildx --output push=true)
      vs a build kept in the engine then pushed through the engine's API (the SDK path, what
      20.10 does): the same recipe, each arm with fresh app content (a 64 MiB random file) to
      a fresh repository, so both upload the same number of new bytes.

Needs the registry and the Docker 26 engine `scripts/services.sh up` starts; skips (exit 0)
without them, fails under CI=true.
"""

from __future__ import annotations

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

from buildkit_py.engine import select_engine  # noqa: E402
from buildkit_py.oci import auth  # noqa: E402
from buildkit_py.pipeline import plan_from_data  # noqa: E402
from buildkit_py.pipeline.build import BuildOptions, build_checked  # noqa: E402
from buildkit_py.recipe.model import load_recipe  # noqa: E402

CA = Path("/etc/ssl/certs/ca-certificates.crt")
BASE = os.environ.get("IMGBUILD_TEST_BASE_IMAGE", "debian:bookworm-slim")
REGISTRY = os.environ.get("IMGBUILD_TEST_REGISTRY", "127.0.0.1:5000")
RECIPE = """\
name: imgbuild-bench/{name}
version: "1"
cuda: {{version: "12.4", source: wheels, flavor: base}}
base: {{image: {base}}}
python: "3.11"
pip: ["numpy==1.26.4"]
copy: [{{src: app/, dest: /app}}]
workdir: /app
"""


def project(tmp: Path, name: str, random_mib: int = 0) -> Path:
    folder = tmp / name
    (folder / "app").mkdir(parents=True)
    (folder / "app" / "main.py").write_text(f"print({uuid.uuid4().hex!r})\n")
    if random_mib:
        (folder / "app" / "blob.bin").write_bytes(os.urandom(random_mib << 20))
    (folder / "recipe.yaml").write_text(RECIPE.format(name=name, base=BASE))
    return folder / "recipe.yaml"


def main() -> int:
    os.environ["IMGBUILD_DOCKER"] = os.environ.get("IMGBUILD_TEST_DOCKER26_CLIENT", "/opt/engine26/usr/bin/docker")
    os.environ["DOCKER_HOST"] = os.environ.get("IMGBUILD_TEST_DOCKER26_HOST", "unix:///run/docker26.sock")
    pw_file = Path(os.environ.get("IMGBUILD_TEST_REGISTRY_PASSWORD_FILE",
                                  "/var/lib/imgbuild-services/registry/password"))
    try:
        engine = select_engine("buildx")
        engine.sdk()
        if not engine.containerd_store():
            raise RuntimeError("the engine does not use the containerd image store")
        password = pw_file.read_text().strip()
    except Exception as exc:  # noqa: BLE001 - whatever is missing, say it and skip (fail in CI)
        print(f"engine benchmarks skipped: {exc}")
        return 1 if os.environ.get("CI") == "true" else 0
    os.environ["IMGBUILD_REGISTRY_USER"] = os.environ.get("IMGBUILD_TEST_REGISTRY_USER", "ci")
    os.environ["IMGBUILD_REGISTRY_PASSWORD"] = password
    os.environ["IMGBUILD_REGISTRY_HOST"] = REGISTRY
    assert auth.resolve(REGISTRY) is not None
    print(f"imgbuild engine benchmarks on the {engine.describe()}\n", flush=True)
    ca = CA if CA.exists() else None
    run_id = uuid.uuid4().hex[:8]
    made: list[str] = []
    results: dict = {}

    def docker(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*engine.client_argv(), *args], capture_output=True, text=True, check=True,
                              env=engine.environment(), timeout=1800)

    def prune() -> None:
        subprocess.run([*engine.buildx, "prune", "-af"], capture_output=True, check=True, env=engine.environment())

    with tempfile.TemporaryDirectory(prefix="imgbuild-bench-engines-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            # (a) gzip vs zstd: the same image pushed twice, then pulled cold
            recipe = project(tmp, f"comp-{run_id}")
            plan = plan_from_data(load_recipe(recipe))
            refs = {}
            for algo in ("gzip", "zstd"):
                ref = f"{REGISTRY}/imgbuild-bench/comp-{run_id}:{algo}"
                out = build_checked(plan, engine, BuildOptions(tags=(ref,), push=True, ca_cert=ca, compression=algo,
                                                               oci_mediatypes=True), lambda _l: None).outcome
                refs[algo] = (ref, out.sizes.compressed if out.sizes else None, out.size)
                made.append(ref)
            pulls: dict[str, list[float]] = {"gzip": [], "zstd": []}
            for _ in range(2):
                for algo in ("gzip", "zstd"):
                    for ref, _c, _u in refs.values():
                        subprocess.run([*engine.client_argv(), "image", "rm", "-f", ref], capture_output=True,
                                       env=engine.environment(), check=False)
                    prune()
                    start = time.monotonic()
                    docker("pull", "-q", refs[algo][0])
                    pulls[algo].append(time.monotonic() - start)
            best = {a: min(t) for a, t in pulls.items()}
            for algo in ("gzip", "zstd"):
                print(f"(a) pull+unpack {algo:<5} {refs[algo][1] or 0:>12,} B compressed   "
                      f"{best[algo]:6.2f} s (best of {len(pulls[algo])}: {', '.join(f'{t:.2f}' for t in pulls[algo])})")
            print(f"    uncompressed {refs['gzip'][2]:,} B; zstd/gzip bytes "
                  f"{(refs['zstd'][1] or 0) / max(refs['gzip'][1] or 1, 1):.2f}, "
                  f"pull time gzip/zstd {best['gzip'] / best['zstd']:.2f}x\n", flush=True)
            results["pull"] = {"seconds": pulls, "compressed": {a: refs[a][1] for a in refs},
                               "uncompressed": refs["gzip"][2]}

            # (b) build-and-push: from BuildKit vs kept in the engine + pushed through its API
            times = {}
            # warm-up, not timed: (a) pruned the build cache, and both arms share the steps before the app
            warm = project(tmp, f"push-warm-{run_id}")
            made.extend(build_checked(plan_from_data(load_recipe(warm)), engine, BuildOptions(ca_cert=ca),
                                      lambda _l: None).outcome.result.tags)
            for arm in ("buildkit", "sdk", "sdk2", "buildkit2"):
                recipe = project(tmp, f"push-{arm}-{run_id}", random_mib=64)
                plan = plan_from_data(load_recipe(recipe))
                ref = f"{REGISTRY}/imgbuild-bench/push-{arm}-{run_id}:1"
                made.append(ref)
                start = time.monotonic()
                if arm.startswith("buildkit"):
                    out = build_checked(plan, engine, BuildOptions(tags=(ref,), push=True, ca_cert=ca),
                                        lambda _l: None).outcome
                    digest = out.pushes[0].digest
                else:
                    build_checked(plan, engine, BuildOptions(tags=(ref,), ca_cert=ca), lambda _l: None)
                    digest = engine.push(ref).digest
                times[arm] = time.monotonic() - start
                print(f"(b) build+push {arm:<10} {times[arm]:6.2f} s  ({digest[:19]})", flush=True)
            bk, sdk = min(times["buildkit"], times["buildkit2"]), min(times["sdk"], times["sdk2"])
            print(f"    => push from BuildKit vs build + API push: {sdk / bk:.2f}x", flush=True)
            results["push"] = times
        finally:
            for ref in made:
                subprocess.run([*engine.client_argv(), "image", "rm", "-f", ref], capture_output=True,
                               env=engine.environment(), check=False)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
