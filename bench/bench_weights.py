"""Benchmark: `imgbuild weights` push and pull beside its peers, measured in this one run.

    python bench/bench_weights.py [--shards 8 --shard-mib 96 --single-mib 1024 --repeat 3]

Two artifacts: a sharded model (8 x 96 MiB) and a single large shard (1 GiB). For each:

- pull: imgbuild (sha256 verified) vs curl fetching the same blobs in sequence (no
  verification) vs the ``oras`` Python SDK pulling the same artifact;
- resumed pull: every file's download stopped half-way (imgbuild's ``.partial`` left by a
  real interrupted ``get_blob``, with its saved hash state; curl's ``-C -`` from a file of the
  same length), and again with the saved hash removed (a partial from a killed process:
  imgbuild re-hashes it);
- push: imgbuild (hashes once) vs a monolithic ``curl -T`` per blob (POST, then PUT
  ?digest=, digests known beforehand: curl does not hash) vs oras ``push``; each push goes
  to a fresh repository, so every byte is really sent;
- second push (nothing to upload) and second pull (all present).

Each measured command runs in a fresh child process started by a tiny wrapper that reads
the child's peak RSS from getrusage(RUSAGE_CHILDREN), so one number is the peak of exactly
one run. The best wall time of ``--repeat`` runs is reported, with how busy the machine's
cores were during it (registry included: on loopback it shares them), and the one-core
sha256 rate measured in the same run, the ceiling for a verified pull of one blob. Needs the local registry
(scripts/services.sh up), curl and the ``oras`` package (the ``bench`` extra); removes what
it made (temp dir, manifests, blob links; the registry frees bytes at its next GC).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from buildkit_py import oci
from buildkit_py.artifacts import weights  # noqa: E402
from buildkit_py.errors import RegistryError  # noqa: E402
from buildkit_py.oci import auth, download

STATE_DIR = Path(os.environ.get("IMGBUILD_STATE_DIR", "/var/lib/imgbuild-services"))
RSS_LIMIT_MB = 150
LABELS = {"pull": "pull", "resume": "resume", "resume_rehash": "resume, re-hash", "push": "push",
          "push_resumed": "push, cut & resumed"}

# Runs argv[1:] as a child, passes stdin through, reports wall time and the child's peak RSS.
_MEASURE = r"""
import json, resource, subprocess, sys, time
t = time.perf_counter()
rc = subprocess.run(sys.argv[1:], stdin=sys.stdin).returncode
wall = time.perf_counter() - t
print(json.dumps({"rc": rc, "wall_s": wall,
                  "maxrss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""

_IMGBUILD_PULL = "import sys; from buildkit_py.artifacts import weights; weights.pull(sys.argv[1], sys.argv[2])"
_IMGBUILD_PUSH = "import sys; from buildkit_py.artifacts import weights; weights.push(sys.argv[1], sys.argv[2])"
# oras-py: basic auth against the htpasswd registry; credentials from the environment.
_ORAS = r"""
import os, sys
import oras.provider
reg = oras.provider.Registry(insecure=True, auth_backend="basic")
reg.login(username=os.environ["IMGBUILD_REGISTRY_USER"], password=os.environ["IMGBUILD_REGISTRY_PASSWORD"],
          hostname=sys.argv[2].split("/")[0])
if sys.argv[1] == "pull":
    reg.pull(target=sys.argv[2], outdir=sys.argv[3])
else:
    os.chdir(sys.argv[3])
    reg.push(target=sys.argv[2], files=sorted(os.listdir(".")), quiet=True)
"""
# curl -T per blob, digests known: POST for a session, then the monolithic PUT.
_CURL_PUSH = r"""
import json, subprocess, sys
base, repo, config = sys.argv[1], sys.argv[2], sys.stdin.read()
for path, digest in json.loads(sys.argv[3]):
    head = subprocess.run(["curl", "-sS", "-f", "-K", "-", "-X", "POST", "-o", "/dev/null", "-D", "-",
                           f"{base}/v2/{repo}/blobs/uploads/"], input=config, capture_output=True, text=True,
                          check=True).stdout
    location = next(l.split(":", 1)[1].strip() for l in head.splitlines() if l.lower().startswith("location:"))
    url = (location if location.startswith("http") else base + location)
    url += ("&" if "?" in url else "?") + "digest=" + digest
    subprocess.run(["curl", "-sS", "-f", "-K", "-", "-T", path, "-H", "Content-Type: application/octet-stream",
                    "-o", "/dev/null", url], input=config, text=True, check=True)
"""


def cpu_times() -> tuple[float, float]:
    """(all, idle) seconds of every core since boot, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    return sum(fields) / tick, (fields[3] + fields[4]) / tick


def sha256_one_core(mib: int = 1024) -> float:
    """MiB/s of hashlib's sha256 over a 1 MiB buffer that stays in the CPU's cache."""
    buf = os.urandom(1 << 20)
    hasher = hashlib.sha256()
    start = time.perf_counter()
    for _ in range(mib):
        hasher.update(buf)
    return mib / (time.perf_counter() - start)


def measure(cmd: list[str], *, stdin: str | None = None, env: dict | None = None, cwd: Path | None = None) -> dict:
    before = cpu_times()
    proc = subprocess.run([sys.executable, "-c", _MEASURE, *cmd], check=False, input=stdin, capture_output=True,
                          text=True, env=env, cwd=cwd)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"measurement failed: {' '.join(cmd[:3])}...\n{proc.stderr[-2000:]}")
    result = json.loads(lines[-1])
    after = cpu_times()
    spent = after[0] - before[0]
    result["cpu_s"] = spent - (after[1] - before[1])  # every core's busy time, the registry's included
    if result["rc"] != 0:
        raise SystemExit(f"{cmd[0]} {cmd[1][:40]!r} exited {result['rc']}:\n{proc.stderr[-2000:]}")
    return result


def make_file(path: Path, size: int) -> str:
    """Random bytes (incompressible); returns their digest."""
    hasher = hashlib.sha256()
    with open(path, "wb") as fh:
        left = size
        while left:
            piece = os.urandom(min(4 << 20, left))
            fh.write(piece)
            hasher.update(piece)
            left -= len(piece)
    return "sha256:" + hasher.hexdigest()


def interrupted_partials(ref: str, files: dict[str, str], sizes: dict[str, int], dest: Path,
                         client: oci.Client) -> dict[str, int]:
    """Each file's download stopped half-way as Ctrl-C stops it: a real ``get_blob`` whose
    progress callback raises once half is in (after letting the hashing thread catch up,
    as it does while Python handles the signal). Returns each partial's length."""
    dest.mkdir(parents=True)
    reference = oci.parse_reference(ref)
    lengths = {}
    for rel, digest in files.items():
        def stop(_event, _label, done, total):
            if done >= total // 2:
                time.sleep(0.2)
                raise KeyboardInterrupt
        partial = dest / (rel + weights.PARTIAL_SUFFIX)
        with open(partial, "w+b") as fh:
            try:
                oci.get_blob(reference, digest, fh, size=sizes[rel], client=client, progress=stop)
            except KeyboardInterrupt:
                pass
        lengths[rel] = partial.stat().st_size
    return lengths


def copy_partials(src: Path, dest: Path, lengths: dict[str, int], *, suffix: str = "") -> None:
    """Files of the given lengths cut from the sources (curl's ``-C -`` starting points)."""
    dest.mkdir(parents=True)
    for rel, length in lengths.items():
        with open(src / rel, "rb") as fh, open(dest / (rel + suffix), "wb") as out:
            out.write(fh.read(length))


class CuttingProxy:
    """A TCP relay to the registry that breaks one upload: once PATCH requests have carried
    ``cut_after`` bytes since ``arm``, the connection carrying the next loses its link, as a
    dropped link does. The push then asks the registry how far the upload got and sends the
    rest."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream, self.cut_after, self.cuts, self.patched = upstream, 0, 0, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self._armed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, cut_after: int) -> None:
        self.cut_after, self.patched = cut_after, 0
        self._armed.set()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(downstream, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, downstream, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, request_side: bool) -> None:
        in_patch = 0  # body bytes of the PATCH under way, -1 when none is
        try:
            while data := source.recv(1 << 20):
                if request_side:
                    if data.startswith(b"PATCH "):
                        in_patch = 0
                    elif data[:8].isupper() and b" /" in data[:16]:  # another request on the connection
                        in_patch = -1
                    if in_patch >= 0:
                        in_patch += len(data)
                        self.patched += len(data)  # approximate under parallel uploads: a cut point, not a count
                        if self._armed.is_set() and self.patched > self.cut_after:
                            self._armed.clear()
                            self.cuts += 1
                            raise ConnectionResetError("cut")
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()


class Run:
    def __init__(self, args, work: Path, env: dict, curl_config: str, client: oci.Client):
        self.args, self.work, self.env, self.curl_config, self.client = args, work, env, curl_config, client
        self.pushed: list[tuple[str, list[str]]] = []  # (ref, blob digests) to delete at the end

    def ref(self, what: str) -> str:
        return f"{self.args.registry}/imgbuild-bench/{what}-{uuid.uuid4().hex[:10]}:v1"

    def best(self, fn, repeat: int | None = None) -> dict:
        runs = []
        for i in range(repeat or self.args.repeat):
            os.sync()  # start without the previous run's dirty pages being written back
            runs.append(fn(i))
        best = min(runs, key=lambda r: r["wall_s"])
        return {"wall_s": best["wall_s"], "maxrss_mib": max(r["maxrss_kib"] for r in runs) / 1024,
                "cpu_s": best["cpu_s"]}

    def fresh(self, name: str) -> Path:
        path = self.work / f"{name}-{uuid.uuid4().hex[:6]}"
        return path

    def scenario(self, name: str, src: Path, digests: dict[str, str]) -> dict:
        env = self.env
        total = sum(p.stat().st_size for p in src.iterdir())
        base = self.client.base_url(self.args.registry)
        out: dict = {"bytes": total}

        # push, each into a fresh repository
        def imgbuild_push(_i):
            ref = self.ref(name)
            r = measure([sys.executable, "-c", _IMGBUILD_PUSH, str(src), ref], env=env)
            self.pushed.append((ref, list(digests.values())))
            return r

        def curl_push(_i):
            ref = oci.parse_reference(self.ref(name + "-curl"))
            pairs = json.dumps([[str(src / rel), d] for rel, d in sorted(digests.items())])
            r = measure([sys.executable, "-c", _CURL_PUSH, base, ref.repository, pairs], stdin=self.curl_config,
                        env=env)
            self.pushed.append((str(ref), list(digests.values())))
            return r

        def oras_push(_i):
            ref = self.ref(name + "-oras")
            r = measure([sys.executable, "-c", _ORAS, "push", ref, str(src)], env=env)
            self.pushed.append((ref, list(digests.values())))
            return r

        def imgbuild_push_cut(_i):
            """Through the relay, one file's upload broken half-way and resumed."""
            ref = self.ref(name + "-cut")
            via = ref.replace(self.args.registry, self.proxy.address, 1)
            self.proxy.arm(sum(sizes.values()) // 2)
            cuts = self.proxy.cuts
            r = measure([sys.executable, "-c", _IMGBUILD_PUSH, str(src), via], env=env)
            self.pushed.append((ref, list(digests.values())))
            if self.proxy.cuts != cuts + 1:
                raise SystemExit("the relay did not break the upload: the resumed push was not measured")
            return r

        sizes = {rel: (src / rel).stat().st_size for rel in digests}
        push_repeat = self.args.push_repeat
        first = len(self.pushed)
        out["push"] = {"imgbuild": self.best(imgbuild_push, push_repeat), "curl": self.best(curl_push, push_repeat),
                       "oras": self.best(oras_push, push_repeat)}
        out["push_resumed"] = {"imgbuild": self.best(imgbuild_push_cut, push_repeat), "curl": out["push"]["curl"]}
        ref = self.pushed[first][0]  # this scenario's first imgbuild push: the artifact every pull reads
        out["push_again"] = self.best(lambda _i: measure([sys.executable, "-c", _IMGBUILD_PUSH, str(src), ref],
                                                         env=env), 1)

        # pull
        repo = oci.parse_reference(ref).repository
        urls = [f"{base}/v2/{repo}/blobs/{digests[rel]}" for rel in sorted(digests)]

        def imgbuild_pull(_i):
            dest = self.fresh("pull")
            r = measure([sys.executable, "-c", _IMGBUILD_PULL, ref, str(dest)], env=env)
            assert sum(p.stat().st_size for p in dest.iterdir()) == total
            shutil.rmtree(dest)
            return r

        cut_at: list[dict[str, int]] = []  # each imgbuild resume's partial lengths: curl resumes from the same

        def curl_pull(i, *, resume: bool = False):
            dest = self.fresh("curl")
            if resume:
                copy_partials(src, dest, cut_at[i % len(cut_at)])
            else:
                dest.mkdir()
            cmd = ["curl", "-sS", "-f", "-K", "-"] + (["-C", "-"] if resume else [])
            for rel, url in zip(sorted(digests), urls, strict=True):
                cmd += ["-o", str(dest / rel), url]
            r = measure(cmd, stdin=self.curl_config, env=env)
            assert sum(p.stat().st_size for p in dest.iterdir()) == total
            shutil.rmtree(dest)
            return r

        def oras_pull(_i):
            dest = self.fresh("oras")
            r = measure([sys.executable, "-c", _ORAS, "pull", ref, str(dest)], env=env)
            assert sum(p.stat().st_size for p in dest.iterdir()) == total
            shutil.rmtree(dest)
            return r

        def imgbuild_resume(_i, *, saved_hash: bool = True):
            dest = self.fresh("resume")
            lengths = interrupted_partials(ref, digests, sizes, dest, self.client)
            if saved_hash:
                cut_at.append(lengths)
            else:  # as a killed process leaves it: the bytes, not the hash
                for partial in dest.iterdir():
                    os.removexattr(partial, download.HASH_STATE_XATTR)
            os.sync()
            r = measure([sys.executable, "-c", _IMGBUILD_PULL, ref, str(dest)], env=env)
            assert sum(p.stat().st_size for p in dest.iterdir()) == total
            shutil.rmtree(dest)
            return r

        out["pull"] = {"imgbuild": self.best(imgbuild_pull), "curl": self.best(curl_pull),
                       "oras": self.best(oras_pull)}
        out["resume"] = {"imgbuild": self.best(imgbuild_resume),
                         "curl": self.best(lambda i: curl_pull(i, resume=True))}
        out["resume_rehash"] = {"imgbuild": self.best(lambda i: imgbuild_resume(i, saved_hash=False)),
                                "curl": out["resume"]["curl"]}
        dest = self.fresh("again")
        weights.pull(ref, dest, client=self.client)
        out["pull_again"] = self.best(lambda _i: measure([sys.executable, "-c", _IMGBUILD_PULL, ref, str(dest)],
                                                         env=env), 1)
        shutil.rmtree(dest)
        return out


def report(name: str, r: dict) -> None:
    mib = r["bytes"] / (1 << 20)

    def tput(x: dict) -> float:
        return mib / x["wall_s"]

    print(f"\n{name} ({mib:.0f} MiB), best of the runs; throughput in MiB/s, peak RSS in MiB")
    print(f"{'':18}{'imgbuild':>10}{'curl':>10}{'oras-py':>10}{'vs curl':>10}{'vs oras':>10}"
          f"{'RSS imgb.':>11}{'RSS curl':>10}{'RSS oras':>10}")
    for op, label in LABELS.items():
        row = r[op]
        mine, curl, oras = row["imgbuild"], row["curl"], row.get("oras")
        oras_tput = f"{tput(oras):.0f}" if oras else "-"
        vs_oras = f"{tput(mine) / tput(oras):.2f}x" if oras else "-"
        oras_rss = f"{oras['maxrss_mib']:.0f}" if oras else "-"
        print(f"{label:18}{tput(mine):>10.0f}{tput(curl):>10.0f}{oras_tput:>10}{tput(mine) / tput(curl):>9.2f}x"
              f"{vs_oras:>10}{mine['maxrss_mib']:>11.0f}{curl['maxrss_mib']:>10.0f}{oras_rss:>10}")
    print(f"{'second push':18}{r['push_again']['wall_s']:>9.2f}s (nothing uploaded)   "
          f"second pull {r['pull_again']['wall_s']:.2f}s (all present, re-hashed)")
    mine, curl = r["pull"]["imgbuild"], r["pull"]["curl"]
    floor = mine["cpu_s"] / (os.cpu_count() or 1)  # the pull's CPU work spread perfectly over every core
    print(f"{'CPU, pull':18}{mine['cpu_s']:>8.2f}s imgbuild, {curl['cpu_s']:.2f}s curl (core-seconds, registry "
          f"included): on {os.cpu_count()} cores imgbuild's pull cannot take under {floor:.2f}s, "
          f"{curl['wall_s'] / floor:.2f}x curl's time; sha256 on one core {r['sha256_mib_s']:.0f} MiB/s")
    peak = max(r[op]["imgbuild"]["maxrss_mib"] for op in LABELS)
    print(f"{'imgbuild peak RSS':18}{peak:>9.0f} MiB ({'within' if peak * 1.048576 <= RSS_LIMIT_MB else 'OVER'}"
          f" the {RSS_LIMIT_MB} MB goal); sha256 verified: imgbuild yes, curl no, oras-py no")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--shard-mib", type=int, default=96)
    parser.add_argument("--single-mib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--push-repeat", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--registry", default=os.environ.get("IMGBUILD_TEST_REGISTRY", "127.0.0.1:5000"))
    parser.add_argument("--user", default=os.environ.get("IMGBUILD_TEST_REGISTRY_USER", "ci"))
    parser.add_argument("--password-file", default=os.environ.get(
        "IMGBUILD_TEST_REGISTRY_PASSWORD_FILE", str(STATE_DIR / "registry" / "password")))
    args = parser.parse_args(argv)
    if not shutil.which("curl"):
        raise SystemExit("curl is needed for the comparison")
    try:
        import oras.provider  # noqa: F401  (the peer SDK; run in children, checked here)
    except ImportError:
        raise SystemExit("the oras package is needed for the comparison: pip install -e '.[bench]'") from None

    password = Path(args.password_file).read_text().strip()
    work = Path(tempfile.mkdtemp(prefix="imgbuild-bench-weights-"))
    # Children get the credentials through the environment, never argv.
    env = {**os.environ, auth.ENV_USER: args.user, auth.ENV_PASSWORD: password,
           "PYTHONPATH": str(REPO), "DOCKER_CONFIG": str(work / "docker-config")}
    env.pop(auth.ENV_HOST, None)
    os.environ.update({k: env[k] for k in (auth.ENV_USER, auth.ENV_PASSWORD, "DOCKER_CONFIG")})
    basic = base64.b64encode(f"{args.user}:{password}".encode()).decode()
    curl_config = f'header = "Authorization: Basic {basic}"\n'  # on stdin, not argv
    client = oci.Client()
    run = Run(args, work, env, curl_config, client)
    host, _, port = args.registry.rpartition(":")
    run.proxy = CuttingProxy((host, int(port)))
    results = {}
    try:
        for name, count, mib in (("sharded", args.shards, args.shard_mib), ("single", 1, args.single_mib)):
            src = work / f"src-{name}"
            src.mkdir()
            digests = {}
            for i in range(count):
                rel = f"model-{i + 1:05d}-of-{count:05d}.safetensors"
                digests[rel] = make_file(src / rel, mib << 20)
            results[name] = run.scenario(f"{name}", src, digests)
            results[name]["sha256_mib_s"] = sha256_one_core()
            report(f"{name}: {count} x {mib} MiB" if count > 1 else f"{name}: 1 x {mib} MiB", results[name])
            shutil.rmtree(src)  # the big files go as soon as they are measured
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        return 0
    finally:
        for ref, blobs in run.pushed:
            try:
                for digest in blobs:
                    oci.delete_blob(ref, digest, client=client)
                try:
                    oci.delete_manifest(ref, client=client)
                except RegistryError:
                    pass  # curl pushes made no manifest
            except (RegistryError, OSError) as exc:  # cleanup is best effort; say so
                print(f"cleanup in the registry failed: {exc}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
        run.proxy.close()
        client.close()


if __name__ == "__main__":
    sys.exit(main())
