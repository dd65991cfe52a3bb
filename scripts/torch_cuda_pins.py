#!/usr/bin/env python3
"""Write buildkit_py/compat/data/torch_cuda_pins.json: the CUDA wheels (and Triton) each torch
release on the Python registry installs, at exact versions, for the reproducible layers below
torch's own (plan/build_plan.py).

    python scripts/torch_cuda_pins.py                # print the file
    python scripts/torch_cuda_pins.py --write        # rewrite it in this checkout
    python scripts/torch_cuda_pins.py --since 2.13.0 # only these releases (the rest kept)

How: for each torch release of compat/data/torch.json, pip resolves ``torch==X`` for Linux
x86_64 and one CPython the release supports (``--dry-run --report``, wheels only, reading the
index's PEP 658 METADATA, so no big wheel is downloaded), with the machine's pip configuration
ignored (``PIP_CONFIG_FILE=/dev/null``, ``--isolated``); from the report it keeps the nvidia-*
and cuda-* distributions and triton (name, version, sha256 and size of the wheel chosen). Versions torch
pins exactly (cuda-toolkit, cuDNN, NCCL, ...) are the release's; the few it leaves open
(e.g. nvidia-nvjitlink through cuda-toolkit) are the newest on the read date, which the row
records.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout

from buildkit_py.compat.index import PYPI, IndexClient  # noqa: E402
from buildkit_py.compat.torch_pins import is_cuda_wheel  # noqa: E402

DATA = ROOT / "buildkit_py" / "compat" / "data"
OUT = DATA / "torch_cuda_pins.json"
PLATFORMS = [f"manylinux_2_{m}_x86_64" for m in range(39, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def is_layered_wheel(name: str) -> bool:
    """The wheels that get layers before torch's own: its CUDA libraries, and Triton (torch's
    one big non-CUDA dependency, 200-290 MB, which torch patch releases keep)."""
    return is_cuda_wheel(name) or canonicalize_name(name) in ("triton", "pytorch-triton")


def pick_python(spec: str) -> str:
    s = SpecifierSet(spec)
    for py in ("3.12", "3.11", "3.10", "3.13", "3.9", "3.8"):
        if Version(py) in s:
            return py
    raise SystemExit(f"no Python for {spec}")


def resolve(version: str, python: str) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        args = [sys.executable, "-m", "pip", "install", "--isolated", "--disable-pip-version-check", "--quiet",
                "--dry-run", "--ignore-installed", "--only-binary=:all:", "--report", str(report),
                "--python-version", python, "--implementation", "cp", "--abi", "cp" + python.replace(".", ""),
                "--index-url", PYPI]
        for p in PLATFORMS:
            args += ["--platform", p]
        env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
        env = {k: v for k, v in env.items() if k not in {"PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"}}
        proc = subprocess.run([*args, f"torch=={version}"], capture_output=True, text=True, env=env, timeout=600,
                              check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"torch {version}: pip failed: {proc.stderr.strip()[-400:]}")
        return json.loads(report.read_text())["install"]


def sizes(client: IndexClient, name: str, cache: dict) -> dict[str, int | None]:
    if name not in cache:
        cache[name] = {f.filename: f.size for f in client.project(name).files}
    return cache[name]


def row(client: IndexClient, release: dict, today: str, cache: dict) -> dict:
    python = pick_python(release["python"])
    items = resolve(release["version"], python)
    wheels = []
    for item in items:
        name = item["metadata"]["name"]
        if not is_layered_wheel(name):
            continue
        url = item["download_info"]["url"]
        filename = url.rsplit("/", 1)[-1]
        wheels.append({
            "name": canonicalize_name(name),
            "version": item["metadata"]["version"],
            "size": sizes(client, name, cache).get(filename),
            "sha256": item["download_info"]["archive_info"]["hashes"]["sha256"],
            "file": filename,
        })
    wheels.sort(key=lambda w: w["name"])
    return {
        "torch": release["version"],
        "variant": release["pypi_variant"],
        "python": python,
        "wheels": wheels,
        "source": f"pip --dry-run --report of torch=={release['version']} for CPython {python} manylinux x86_64 "
                  "from https://pypi.org/simple/ (PEP 658 METADATA, PIP_CONFIG_FILE=/dev/null)",
        "read": today,
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--since", default="2.0.0")
    ap.add_argument("--jobs", type=int, default=4)
    args = ap.parse_args(argv)
    today = datetime.date.today().isoformat()
    releases = [r for r in json.loads((DATA / "torch.json").read_text())["releases"]
                if Version(r["version"]) >= Version(args.since) and r.get("pypi_variant")]
    client = IndexClient(PYPI, cafile=os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE"))
    cache: dict = {}
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda r: row(client, r, today, cache), releases))
    old = json.loads(OUT.read_text())["releases"] if OUT.exists() else []
    merged = {r["torch"]: r for r in old}
    merged.update({r["torch"]: r for r in rows})
    doc = {
        "schema": 1,
        "source": "the Python registry's torch wheels and their CUDA dependencies and Triton, resolved by pip "
                  "from PEP 658 METADATA (scripts/torch_cuda_pins.py)",
        "as_of": today,
        "notes": "Per torch release on PyPI (its default CUDA variant): every nvidia-* / cuda-* wheel pip installs "
                 "with it on Linux x86_64, and triton, at the version resolved on the read date, with the chosen "
                 "wheel's size and sha256. imgbuild installs these with --no-deps in their own layers before torch.",
        "releases": [merged[v] for v in sorted(merged, key=Version)],
    }
    text = json.dumps(doc, indent=1) + "\n"
    if args.write:
        OUT.write_text(text)
        print(f"wrote {OUT} ({len(doc['releases'])} releases)")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
