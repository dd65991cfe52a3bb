"""Benchmark: `imgbuild weights` push and pull beside its peers, measured in this one run.

    python bench/bench_weights.py [--shards 8 --shard-mib 96 --single-mib 768 --pull-repeat 5]

Two artifacts: a sharded model (8 x 96 MiB) and a single large shard (768 MiB). For each:

- verified pull: imgbuild (every sha256 checked) against raw curl's single stream (the goal
  since issue 33: no slower than an unverified ``curl -o``, the files in sequence) and the
  verifying clients a user would script (issue 24's bar, still printed), measured in the same
  run, interleaved, ``--pull-repeat`` times, median: ``curl URL | tee FILE | sha256sum`` per file
  with the digest compared, the files in parallel (``xargs -P``, as many at once as imgbuild
  moves) and in sequence, and the ``oras`` Python SDK's pull. Printed beside: curl ``-Z``,
  and the same pipeline with ``openssl dgst -sha256`` as the hasher (OpenSSL's SHA-NI code,
  which Debian's coreutils ``sha256sum`` lacks and other distributions' has). ``--baseline
  DIR`` adds another checkout's imgbuild (e.g. main's) as one more arm: before and after in
  one run; the single blob is also pulled as ``--ranges`` parallel Range requests;
- the same over TLS (``--tls``, the default where ``docker-registry`` and ``openssl`` are
  installed): a second registry serves the same storage read-only with a self-signed
  certificate on another port, and every client verifies the certificate;
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
one run. Pushes and resumes report the best wall time of ``--repeat`` runs, with how busy the
machine's cores were during it (registry included: on loopback it shares them), and the
one-core sha256 rate measured in the same run, the ceiling for a verified pull of one blob.
Needs the local registry (scripts/services.sh up), curl, bash, xargs and the ``oras`` package
(the ``bench`` extra); removes what it made (temp dir, manifests, blob links; the registry
frees bytes at its next GC). ``--pull-only`` measures the pulls alone.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
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

# Runs argv[1:] as a child, passes stdin through, reports wall time, the child's peak RSS and the
# CPU time of the child and everything it waited for (a pipeline's processes too; not the registry's).
_MEASURE = r"""
import json, resource, subprocess, sys, time
t = time.perf_counter()
rc = subprocess.run(sys.argv[1:], stdin=sys.stdin).returncode
wall = time.perf_counter() - t
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": rc, "wall_s": wall, "maxrss_kib": usage.ru_maxrss,
                  "own_cpu_s": usage.ru_utime + usage.ru_stime}))
"""

# IMGBUILD_BENCH_CA: the TLS registry's certificate (https to a loopback address, which is plain http otherwise).
_IMGBUILD_PULL = r"""
import os, sys
sys.path.insert(0, os.environ.get("IMGBUILD_BENCH_TREE", ""))
from buildkit_py import oci
from buildkit_py.artifacts import weights
ca = os.environ.get("IMGBUILD_BENCH_CA")
weights.pull(sys.argv[1], sys.argv[2], client=oci.Client(ca_cert=ca, plain_http=False) if ca else None,
             streams=int(os.environ.get("IMGBUILD_BENCH_STREAMS") or 0) or None)
"""
_IMGBUILD_PUSH = "import sys; from buildkit_py.artifacts import weights; weights.push(sys.argv[1], sys.argv[2])"
# oras-py: basic auth against the htpasswd registry; credentials from the environment.
_ORAS = r"""
import os, sys
import oras.provider
ca = os.environ.get("IMGBUILD_BENCH_CA")
reg = oras.provider.Registry(insecure=not ca, tls_verify=ca or True, auth_backend="basic")
reg.login(username=os.environ["IMGBUILD_REGISTRY_USER"], password=os.environ["IMGBUILD_REGISTRY_PASSWORD"],
          hostname=sys.argv[2].split("/")[0])
if sys.argv[1] == "pull":
    reg.pull(target=sys.argv[2], outdir=sys.argv[3])
else:
    os.chdir(sys.argv[3])
    reg.push(target=sys.argv[2], files=sorted(os.listdir(".")), quiet=True)
"""
# The verifying client a user scripts: curl URL | tee FILE | HASHER, then the digest compared.
# $1 URL, $2 FILE, $3 the expected sha256 (hex); curl's config (auth header, CA) in $CURL_CONFIG.
_VERIFY_ONE = r"""set -o pipefail
out=$(curl -sSf -K "$CURL_CONFIG" "$1" | tee "$2" | $HASHER) || exit 1
[ "${out%% *}" = "$3" ] || { echo "$2: sha256 ${out%% *}, expected $3" >&2; exit 1; }
"""
HASHERS = {"sha256sum": "sha256sum", "openssl": "openssl dgst -sha256 -r"}
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


def make_file(path: Path, size: int, seed: str) -> str:
    """Pseudo-random bytes (incompressible) from ``seed``; returns their digest. The same
    files every run: a registry keeps a deleted blob's bytes until its garbage collection,
    so random files left 1.5 GiB more on its disk at each run; these are stored once."""
    rng = random.Random(seed)  # noqa: S311 (test data, not a secret)
    hasher = hashlib.sha256()
    with open(path, "wb") as fh:
        left = size
        while left:
            piece = rng.randbytes(min(4 << 20, left))
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
        self.curl_file = work / "curl.conf"  # the same config as a file: xargs takes curl's stdin
        self.curl_file.write_text(curl_config)
        self.tls: TlsRegistry | None = None
        self.tls_curl_file = work / "curl-tls.conf"

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

    def verified_pulls(self, ref: str, digests: dict[str, str], total: int) -> dict:
        """The pull of ``ref`` against the verifying clients (PullComparison), over http and,
        with ``--tls``, over https from the TLS registry on the same storage."""
        verified = PullComparison(self, ref, digests, total, registry=self.args.registry,
                                  curl_config=self.curl_file).measure_all(self.args.pull_repeat)
        out = {"verified_pull": verified,
               "pull": {"imgbuild": verified["arms"]["imgbuild"], "curl": verified["arms"][verified["raw_curl"]],
                        "oras": verified["arms"]["oras-py"]}}
        if self.tls:
            over_tls = ref.replace(self.args.registry, self.tls.address, 1)
            out["verified_pull_tls"] = PullComparison(self, over_tls, digests, total, registry=self.tls.address,
                                                      curl_config=self.tls_curl_file, ca=self.tls.cert,
                                                      ).measure_all(self.args.pull_repeat)
        return out

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
        if self.args.pull_only:
            imgbuild_push(0)
        else:
            out["push"] = {"imgbuild": self.best(imgbuild_push, push_repeat),
                           "curl": self.best(curl_push, push_repeat), "oras": self.best(oras_push, push_repeat)}
            out["push_resumed"] = {"imgbuild": self.best(imgbuild_push_cut, push_repeat), "curl": out["push"]["curl"]}
        ref = self.pushed[first][0]  # this scenario's first imgbuild push: the artifact every pull reads
        if not self.args.pull_only:
            out["push_again"] = self.best(lambda _i: measure([sys.executable, "-c", _IMGBUILD_PUSH, str(src), ref],
                                                             env=env), 1)

        # pull
        repo = oci.parse_reference(ref).repository
        urls = [f"{base}/v2/{repo}/blobs/{digests[rel]}" for rel in sorted(digests)]

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

        out.update(self.verified_pulls(ref, digests, total))
        if self.args.pull_only:
            return out
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


class TlsRegistry:
    """A second registry over https that serves the local registry's storage read-only, with a
    self-signed certificate for 127.0.0.1: the TLS path every real registry takes (a loopback
    registry is plain http otherwise). For the bench only, never in CI: it needs
    ``docker-registry`` and ``openssl`` and adds a process."""

    def __init__(self, work: Path, registry_config: Path):
        import yaml

        self.work = work / "tls-registry"
        self.work.mkdir()
        main = yaml.safe_load(registry_config.read_text())
        self.cert, key = self.work / "cert.pem", self.work / "key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-keyout", str(key), "-out", str(self.cert), "-days", "1",
                        "-subj", "/CN=imgbuild-bench", "-addext", "subjectAltName=IP:127.0.0.1"],
                       check=True, capture_output=True)
        with socket.create_server(("127.0.0.1", 0)) as probe:
            self.address = f"127.0.0.1:{probe.getsockname()[1]}"
        config = {  # YAML is a superset of JSON
            "version": 0.1, "log": {"level": "error"},
            "storage": {"filesystem": main["storage"]["filesystem"],
                        "maintenance": {"uploadpurging": {"enabled": False}, "readonly": {"enabled": True}}},
            "http": {"addr": self.address, "tls": {"certificate": str(self.cert), "key": str(key)}},
            "auth": main["auth"]}
        (self.work / "config.yml").write_text(json.dumps(config))
        self.log = open(self.work / "registry.log", "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(["docker-registry", "serve", str(self.work / "config.yml")],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        for _ in range(100):
            probe = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", str(self.cert),
                                    f"https://{self.address}/v2/"], capture_output=True, text=True, check=False)
            if probe.stdout == "401":
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise SystemExit(f"the TLS registry did not come up: {(self.work / 'registry.log').read_text()[-2000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def median(values):
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


# The clients the verified pull is held to (issue 24): the faster of them is the bar.
BAR = ("sha256sum", "oras-py")


class PullComparison:
    """imgbuild's pull and the other clients', interleaved: each repetition runs every arm
    once, in an order rotated by one each time, so a busy moment on the shared machine falls on
    all of them alike; each arm's median is reported."""

    def __init__(self, run: Run, ref: str, digests: dict[str, str], total: int, *, registry: str,
                 curl_config: Path, ca: Path | None = None):
        self.run, self.ref, self.digests, self.total = run, ref, digests, total
        self.curl_config, self.ca = curl_config, ca
        repo = oci.parse_reference(ref).repository
        scheme = "https" if ca else "http"
        self.urls = {rel: f"{scheme}://{registry}/v2/{repo}/blobs/{d}" for rel, d in digests.items()}
        self.env = {**run.env, "CURL_CONFIG": str(curl_config)}
        if ca:
            # requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE (set on machines behind a proxy with its own CA)
            # override a session's own CA bundle, so the children's environment names this one
            self.env.update({"IMGBUILD_BENCH_CA": str(ca), "REQUESTS_CA_BUNDLE": str(ca), "CURL_CA_BUNDLE": str(ca)})
        self.jobs = weights.DEFAULT_JOBS
        self.verify_script = run.work / "verify-one.sh"
        self.verify_script.write_text(_VERIFY_ONE)

    def arms(self) -> dict[str, tuple[str, Callable[[Path], dict]]]:
        """name -> (kind, measure into a folder); kind is the column the arm counts in."""
        many = len(self.digests) > 1
        out: dict[str, tuple[str, Callable[[Path], dict]]] = {
            "imgbuild": ("imgbuild", lambda d: measure([sys.executable, "-c", _IMGBUILD_PULL, self.ref, str(d)],
                                                      env=self.env))}
        if self.run.args.baseline:
            tree = str(self.run.args.baseline.resolve())
            out["imgbuild, baseline"] = ("baseline", lambda d: measure(
                [sys.executable, "-c", _IMGBUILD_PULL, self.ref, str(d)],
                env={**self.env, "IMGBUILD_BENCH_TREE": tree, "PYTHONPATH": tree}))
        if self.run.args.ranges > 1 and not many:
            out[f"imgbuild, {self.run.args.ranges} ranges"] = ("ranges", lambda d: measure(
                [sys.executable, "-c", _IMGBUILD_PULL, self.ref, str(d)],
                env={**self.env, "IMGBUILD_BENCH_STREAMS": str(self.run.args.ranges)}))
        for hasher in HASHERS:
            out[f"curl | tee | {hasher} -P {self.jobs}" if many else f"curl | tee | {hasher}"] = (
                hasher, lambda d, h=hasher: self.verifying(d, h, self.jobs))
            if many:
                out[f"curl | tee | {hasher}, in sequence"] = (hasher, lambda d, h=hasher: self.verifying(d, h, 1))
        out["oras-py"] = ("oras-py", lambda d: measure([sys.executable, "-c", _ORAS, "pull", self.ref, str(d)],
                                                       env=self.env))
        out["curl, in sequence" if many else "curl"] = ("curl", lambda d: self.raw_curl(d, parallel=False))
        if many:
            out[f"curl -Z --parallel-max {self.jobs}"] = ("curl", lambda d: self.raw_curl(d, parallel=True))
        return out

    def verifying(self, dest: Path, hasher: str, jobs: int) -> dict:
        lines = "".join(f"{self.urls[rel]} {dest / rel} {digest.removeprefix('sha256:')}\n"
                        for rel, digest in sorted(self.digests.items()))
        return measure(["xargs", "-P", str(jobs), "-n", "3", "bash", str(self.verify_script)], stdin=lines,
                       env={**self.env, "HASHER": HASHERS[hasher]})

    def raw_curl(self, dest: Path, *, parallel: bool) -> dict:
        cmd = ["curl", "-sSf", "-K", str(self.curl_config)]
        if parallel:
            cmd += ["-Z", "--parallel-max", str(self.jobs)]
        for rel in sorted(self.digests):
            cmd += ["-o", str(dest / rel), self.urls[rel]]
        return measure(cmd, env=self.env)

    def measure_all(self, repeat: int) -> dict:
        arms = self.arms()
        names = list(arms)
        runs: dict[str, list[dict]] = {name: [] for name in names}
        loads = [os.getloadavg()[0]]
        for i in range(repeat):
            for name in names[i % len(names):] + names[:i % len(names)]:
                dest = self.run.fresh("pull")
                dest.mkdir()
                os.sync()  # start without the previous run's dirty pages being written back
                runs[name].append(arms[name][1](dest))
                got = sum(p.stat().st_size for p in dest.iterdir())
                if got != self.total:
                    raise SystemExit(f"{name} pulled {got} bytes, not {self.total}")
                shutil.rmtree(dest)
            loads.append(os.getloadavg()[0])
        arm_figures = {name: {"kind": arms[name][0], "wall_s": median([r["wall_s"] for r in rs]),
                              "walls": [round(r["wall_s"], 3) for r in rs],
                              "cpu_s": median([r["cpu_s"] for r in rs]),
                              "own_cpu_s": median([r["own_cpu_s"] for r in rs]),
                              "maxrss_mib": max(r["maxrss_kib"] for r in rs) / 1024}
                       for name, rs in runs.items()}

        def fastest(kind: str) -> str:
            return min((n for n, a in arm_figures.items() if a["kind"] == kind), key=lambda n: arm_figures[n]["wall_s"])

        bar = min((fastest(kind) for kind in BAR), key=lambda n: arm_figures[n]["wall_s"])
        mine = arm_figures["imgbuild"]["wall_s"]
        single_stream = "curl, in sequence" if len(self.digests) > 1 else "curl"
        return {"arms": arm_figures, "repeat": repeat, "load": [min(loads), max(loads)], "cores": os.cpu_count(),
                "bar": bar, "ratio": mine / arm_figures[bar]["wall_s"],
                "vs_curl_single": mine / arm_figures[single_stream]["wall_s"], "curl_single": single_stream,
                "vs_openssl": mine / arm_figures[fastest("openssl")]["wall_s"],
                "vs_raw_curl": mine / arm_figures[fastest("curl")]["wall_s"],
                "openssl": fastest("openssl"), "raw_curl": fastest("curl")}


VERIFIES = {"imgbuild": "yes", "baseline": "yes", "ranges": "yes", "sha256sum": "yes", "openssl": "yes", "curl": "no",
            "oras-py": "no (0.2.43 writes 8 KiB pieces, hashes nothing)"}


def report_pull(title: str, total: int, r: dict) -> None:
    mib = total / (1 << 20)
    print(f"\n{title} ({mib:.0f} MiB): verified pull, median of {r['repeat']} interleaved runs")
    print(f"{'':34}{'time':>8}{'MiB/s':>8}{'CPU':>8}{'own CPU':>9}{'RSS':>7}  verifies")
    for name, a in r["arms"].items():
        print(f"{name:34}{a['wall_s']:>7.2f}s{mib / a['wall_s']:>8.0f}{a['cpu_s']:>7.2f}s{a['own_cpu_s']:>8.2f}s"
              f"{a['maxrss_mib']:>6.0f}M  {VERIFIES[a['kind']]}")
    verdict = "met" if r["vs_curl_single"] <= 1.0 else "NOT met"
    print(f"=> imgbuild / raw curl's single stream ({r['curl_single']}, verifies nothing): "
          f"{r['vs_curl_single']:.2f} (<= 1.00: {verdict})")
    if "imgbuild, baseline" in r["arms"]:
        print(f"   baseline / raw curl's single stream: "
              f"{r['arms']['imgbuild, baseline']['wall_s'] / r['arms'][r['curl_single']]['wall_s']:.2f}")
    print(f"   imgbuild / the faster of curl|tee|sha256sum and oras-py ({r['bar']}): {r['ratio']:.2f} "
          f"(issue 24's bar, <= 1.00: {'met' if r['ratio'] <= 1.0 else 'NOT met'})")
    print(f"   beside: imgbuild / {r['openssl']}: {r['vs_openssl']:.2f}; imgbuild / the faster raw curl "
          f"({r['raw_curl']}): {r['vs_raw_curl']:.2f}")
    walls = " ".join(f"{w:.2f}" for w in r["arms"]["imgbuild"]["walls"])
    print(f"   machine load (1-minute average) during these runs: {r['load'][0]:.1f}-{r['load'][1]:.1f} on "
          f"{r['cores']} cores")
    print(f"   imgbuild's runs: {walls} s. CPU: every core's busy time during a run, the registry's (and, on a "
          "shared machine, everyone's) included; own CPU: the client's processes alone")


def report(name: str, r: dict) -> None:
    mib = r["bytes"] / (1 << 20)
    report_pull(f"{name}, over http (loopback)", r["bytes"], r["verified_pull"])
    if "verified_pull_tls" in r:
        report_pull(f"{name}, over https (TLS registry on loopback)", r["bytes"], r["verified_pull_tls"])
    if "push" not in r:  # --pull-only
        return

    def tput(x: dict) -> float:
        return mib / x["wall_s"]

    print(f"\n{name} ({mib:.0f} MiB): pull as above (median; curl: the faster raw curl), the rest best of the "
          "runs; throughput in MiB/s, peak RSS in MiB")
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
    parser.add_argument("--single-mib", type=int, default=768)
    parser.add_argument("--pull-repeat", type=int, default=5, help="interleaved runs of each verified pull")
    parser.add_argument("--pull-only", action="store_true", help="measure the verified pulls alone")
    parser.add_argument("--tls", action=argparse.BooleanOptionalAction, default=None,
                        help="also pull over https from a second, TLS registry on the same storage "
                             "(default: where docker-registry and openssl are installed)")
    parser.add_argument("--baseline", type=Path, help="another checkout of imgbuild (e.g. main's) whose pull runs "
                        "as one more arm, interleaved: before and after in one run")
    parser.add_argument("--ranges", type=int, default=2, help="the single blob's pull also as this many parallel "
                        "Range requests, one more arm (imgbuild's default is one per two cores); 1: no such arm")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--push-repeat", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--registry", default=os.environ.get("IMGBUILD_TEST_REGISTRY", "127.0.0.1:5000"))
    parser.add_argument("--user", default=os.environ.get("IMGBUILD_TEST_REGISTRY_USER", "ci"))
    parser.add_argument("--password-file", default=os.environ.get(
        "IMGBUILD_TEST_REGISTRY_PASSWORD_FILE", str(STATE_DIR / "registry" / "password")))
    args = parser.parse_args(argv)
    for tool in ("curl", "bash", "xargs", "openssl"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is needed for the comparison")
    if args.tls is None:
        args.tls = bool(shutil.which("docker-registry")) and (STATE_DIR / "registry" / "config.yml").exists()
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
        if args.tls:
            run.tls = TlsRegistry(work, STATE_DIR / "registry" / "config.yml")
            run.tls_curl_file.write_text(f'{curl_config}cacert = "{run.tls.cert}"\n')
        for name, count, mib in (("sharded", args.shards, args.shard_mib), ("single", 1, args.single_mib)):
            src = work / f"src-{name}"
            src.mkdir()
            digests = {}
            for i in range(count):
                rel = f"model-{i + 1:05d}-of-{count:05d}.safetensors"
                digests[rel] = make_file(src / rel, mib << 20, f"imgbuild-bench {rel} {mib}")
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
        if run.tls:
            run.tls.stop()
        shutil.rmtree(work, ignore_errors=True)
        run.proxy.close()
        client.close()


if __name__ == "__main__":
    sys.exit(main())
