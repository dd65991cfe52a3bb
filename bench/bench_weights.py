"""Benchmark: weights pull of one big artifact vs curl fetching the same blob, and a
second push of an unchanged artifact vs the first.

    python bench/bench_weights.py [--size-mib 1024] [--repeat 2]

Needs the local registry (scripts/services.sh up). It generates a random file in a temp
dir, pushes it once, measures, and removes what it made (temp dir, manifest, blob links;
the registry frees the bytes at its next garbage collection).

Pull and curl each run in a fresh child process, itself started by a tiny wrapper that
reads the child's peak RSS from getrusage(RUSAGE_CHILDREN), so one number is the peak of
exactly one download. imgbuild verifies sha256 while it streams; curl does not, so curl
is the floor. The best of ``--repeat`` runs is reported for each.
"""

from __future__ import annotations

import argparse
import base64
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

from buildkit_py import auth, oci, weights
from buildkit_py.errors import RegistryError

STATE_DIR = Path(os.environ.get("IMGBUILD_STATE_DIR", "/var/lib/imgbuild-services"))

# Runs argv[1:] as a child, passes stdin through, reports wall time and the child's peak RSS.
_MEASURE = r"""
import json, resource, subprocess, sys, time
t = time.perf_counter()
rc = subprocess.run(sys.argv[1:], stdin=sys.stdin).returncode
wall = time.perf_counter() - t
print(json.dumps({"rc": rc, "wall_s": wall,
                  "maxrss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""

_PULL = "import sys; from buildkit_py import weights; weights.pull(sys.argv[1], sys.argv[2])"


def measure(cmd: list[str], *, stdin: str | None = None, env: dict | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-c", _MEASURE, *cmd], check=False, input=stdin, capture_output=True,
                          text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"measurement failed: {' '.join(cmd[:3])}...\n{proc.stderr[-2000:]}")
    result = json.loads(lines[-1])
    if result["rc"] != 0:
        raise SystemExit(f"{cmd[0]} exited {result['rc']}:\n{proc.stderr[-2000:]}")
    return result


def make_file(path: Path, size: int) -> None:
    chunk = 1 << 20
    with open(path, "wb") as fh:
        left = size
        while left:
            n = min(chunk, left)
            fh.write(os.urandom(n))
            left -= n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--registry", default=os.environ.get("IMGBUILD_TEST_REGISTRY", "127.0.0.1:5000"))
    parser.add_argument("--user", default=os.environ.get("IMGBUILD_TEST_REGISTRY_USER", "ci"))
    parser.add_argument("--password-file", default=os.environ.get(
        "IMGBUILD_TEST_REGISTRY_PASSWORD_FILE", str(STATE_DIR / "registry" / "password")))
    args = parser.parse_args(argv)
    if not shutil.which("curl"):
        raise SystemExit("curl is needed for the comparison")

    password = Path(args.password_file).read_text().strip()
    size = args.size_mib << 20
    ref = f"{args.registry}/imgbuild-bench/{uuid.uuid4().hex[:10]}:v1"
    work = Path(tempfile.mkdtemp(prefix="imgbuild-bench-"))
    # Children get the credentials through the environment, never argv.
    env = {**os.environ, auth.ENV_USER: args.user, auth.ENV_PASSWORD: password,
           "PYTHONPATH": str(REPO), "DOCKER_CONFIG": str(work / "docker-config")}
    env.pop(auth.ENV_HOST, None)
    os.environ.update({k: env[k] for k in (auth.ENV_USER, auth.ENV_PASSWORD, "DOCKER_CONFIG")})
    client = oci.Client()
    pushed = None
    try:
        src = work / "src"
        src.mkdir()
        t = time.perf_counter()
        make_file(src / "model.safetensors", size)
        print(f"generated {args.size_mib} MiB of random data in {time.perf_counter() - t:.1f}s", flush=True)

        t = time.perf_counter()
        pushed = weights.push(src, ref, client=client)
        push1 = time.perf_counter() - t
        t = time.perf_counter()
        again = weights.push(src, ref, client=client)
        push2 = time.perf_counter() - t
        assert again.digest == pushed.digest

        blob = pushed.files[0].digest
        url = f"{client.base_url(args.registry)}/v2/{oci.parse_reference(ref).repository}/blobs/{blob}"
        basic = base64.b64encode(f"{args.user}:{password}".encode()).decode()
        curl_config = f'header = "Authorization: Basic {basic}"\n'  # on stdin, not argv

        runs = {"curl": [], "imgbuild": []}
        for i in range(args.repeat):
            out = work / f"curl-{i}.bin"
            os.sync()  # start each run without the previous one's dirty pages being written back
            runs["curl"].append(measure(["curl", "-sS", "-f", "-K", "-", "-o", str(out), url],
                                        stdin=curl_config, env=env))
            assert out.stat().st_size == size
            out.unlink()
            dest = work / f"pull-{i}"
            os.sync()
            runs["imgbuild"].append(measure([sys.executable, "-c", _PULL, ref, str(dest)], env=env))
            assert (dest / "model.safetensors").stat().st_size == size
            shutil.rmtree(dest)
        dest = work / "pull-again"
        weights.pull(ref, dest, client=client)
        t = time.perf_counter()
        skip = weights.pull(ref, dest, client=client)
        pull2 = time.perf_counter() - t

        best = {k: min(v, key=lambda r: r["wall_s"]) for k, v in runs.items()}
        peak = {k: max(r["maxrss_kib"] for r in v) / 1024 for k, v in runs.items()}
        mib = size / (1 << 20)
        tput = {k: mib / best[k]["wall_s"] for k in best}
        print()
        print(f"pull of a {args.size_mib} MiB artifact (1 file), best of {args.repeat}:")
        print(f"{'':24}{'imgbuild pull':>16}{'curl':>12}{'imgbuild/curl':>16}")
        print(f"{'time (s)':24}{best['imgbuild']['wall_s']:>16.2f}{best['curl']['wall_s']:>12.2f}"
              f"{best['imgbuild']['wall_s'] / best['curl']['wall_s']:>16.2f}")
        print(f"{'throughput (MiB/s)':24}{tput['imgbuild']:>16.0f}{tput['curl']:>12.0f}"
              f"{tput['imgbuild'] / tput['curl']:>16.2f}")
        print(f"{'peak RSS (MiB)':24}{peak['imgbuild']:>16.1f}{peak['curl']:>12.1f}"
              f"{peak['imgbuild'] / peak['curl']:>16.2f}")
        print(f"{'sha256 verified':24}{'yes':>16}{'no':>12}")
        print()
        print("push of the same artifact:")
        print(f"{'':24}{'first':>16}{'second':>12}{'second/first':>16}")
        print(f"{'time (s)':24}{push1:>16.2f}{push2:>12.2f}{push2 / push1:>16.3f}")
        print(f"{'bytes uploaded':24}{pushed.uploaded_bytes:>16}{again.uploaded_bytes:>12}"
              f"{again.uploaded_bytes / max(pushed.uploaded_bytes, 1):>16.3f}")
        print()
        print(f"second pull (all present, re-hashed locally): {pull2:.2f}s, "
              f"{skip.downloaded_bytes} bytes downloaded")
        print("(push time includes hashing the file first; the second push hashes it again and only HEADs the blob)")
        return 0
    finally:
        if pushed is not None:
            try:
                oci.delete_manifest(f"{pushed.ref}@{pushed.digest}", client=client)
                for f in pushed.files:
                    oci.delete_blob(ref, f.digest, client=client)
            except (RegistryError, OSError) as exc:  # cleanup is best effort; say so
                print(f"cleanup in the registry failed: {exc}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
        client.close()


if __name__ == "__main__":
    sys.exit(main())
