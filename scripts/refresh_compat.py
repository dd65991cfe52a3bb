#!/usr/bin/env python3
"""Refresh what can be fetched mechanically and print a diff against the shipped data.

Never writes the data files: compatibility data stays reviewed by hand (each entry needs a
source). Network access is needed; tests never run this.

    python scripts/refresh_compat.py            # all checks
    python scripts/refresh_compat.py --only pypi
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import urllib.request
from importlib import resources
from pathlib import Path
from urllib.parse import urljoin

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

DATA = resources.files("buildkit_py.compat").joinpath("data")
WHEELS = ["nvidia-cuda-runtime-cu12", "nvidia-cublas-cu12", "nvidia-cudnn-cu12"]


def load(name: str) -> dict:
    return json.loads(DATA.joinpath(name).read_text())


def pypi_json(pkg: str) -> dict:
    with urllib.request.urlopen(f"https://pypi.org/pypi/{pkg}/json", timeout=30) as r:
        return json.load(r)


def pip_versions(pkg: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", pkg], capture_output=True, text=True, timeout=120)
    for line in out.stdout.splitlines():
        if line.startswith("Available versions:"):
            return [v.strip() for v in line.split(":", 1)[1].split(",")]
    return []


def requires_python(release_files: list[dict]) -> str:
    return sorted({f.get("requires_python") or "" for f in release_files})[-1] if release_files else ""


def diff_requires_python(file: str, pkg: str, *, check_python: bool = True) -> None:
    shipped = {r["version"]: r.get("python", "") for r in load(file)["releases"]}
    rel = pypi_json(pkg)["releases"]
    for v, files in rel.items():
        if check_python and v in shipped and requires_python(files) != shipped[v]:
            print(f"{file}: {pkg} {v}: python {shipped[v]!r} -> PyPI {requires_python(files)!r}")
    new = [v for v in rel if rel[v] and v not in shipped and not any(c in v for c in "abrc+")]
    if new:
        print(f"{file}: {pkg} releases on PyPI not in data: {', '.join(new[-10:])}")


def wheel_python_range(pkg: str, version: str) -> str:
    """'>=3.8,<3.13' from the cpXY tags of the Linux x86_64 wheels of a release on PyPI."""
    files = pypi_json(pkg)["releases"].get(version, [])
    tags = sorted({(int(m.group(1)), int(m.group(2))) for f in files
                   if (m := re.search(r"-cp(\d)(\d+)-cp\d+t?-(?:manylinux|linux)\S*x86_64\.whl$", f["filename"]))})
    if not tags:
        return ""
    (lo_major, lo_minor), (hi_major, hi_minor) = tags[0], tags[-1]
    return f">={lo_major}.{lo_minor},<{hi_major}.{hi_minor + 1}"


def diff_torch_python() -> None:
    for r in load("torch.json")["releases"]:
        found = wheel_python_range("torch", r["version"])
        if found and found != r["python"]:
            print(f"torch.json: torch {r['version']}: python {r['python']!r} -> wheels {found!r}")


def torch_pins() -> None:
    data = pypi_json("torch")
    shipped = {r["version"]: r for r in load("torch.json")["releases"]}
    for v, r in shipped.items():
        whl = [f for f in data["releases"].get(v, []) if "manylinux" in f["filename"] and "x86_64" in f["filename"] and "cp311" in f["filename"]]
        if not whl:
            continue
        try:
            with urllib.request.urlopen(urljoin("https://pypi.org/pypi/torch/json", whl[0]["url"]) + ".metadata", timeout=30) as resp:
                meta = resp.read().decode()
        except OSError as exc:
            print(f"torch.json: {v}: metadata not readable ({exc})")
            continue
        pins = {}
        for line in meta.splitlines():
            if line.startswith("Requires-Dist: nvidia-") and "==" in line:
                spec = line.split(":", 1)[1].split(";")[0].replace(" (", "").replace(")", "").strip()
                name, ver = spec.split("==")
                if name in r.get("pypi_cuda_wheels", {}) or name.startswith("nvidia-cuda-runtime"):
                    pins[name] = ver
        for name, ver in pins.items():
            if r["pypi_cuda_wheels"].get(name) != ver:
                print(f"torch.json: {v}: {name} {r['pypi_cuda_wheels'].get(name)!r} -> PyPI {ver!r}")


def wheel_versions() -> None:
    shipped = {w: v for e in load("wheels.json")["entries"] for w, v in e["wheels"].items()}
    for pkg in WHEELS:
        avail = pip_versions(pkg)
        for w, v in shipped.items():
            if w == pkg and avail and v not in avail:
                print(f"wheels.json: {pkg}=={v} not on PyPI")
        minors = sorted({".".join(v.split(".")[:2]) for v in avail})
        print(f"{pkg}: PyPI minors {', '.join(minors)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", choices=["pypi", "wheels", "torch"], default=None)
    args = ap.parse_args(argv)
    if args.only in (None, "pypi"):
        diff_requires_python("torch.json", "torch", check_python=False)
        diff_torch_python()  # torch's requires_python has no upper bound: its wheels say more
        diff_requires_python("flash_attn.json", "flash-attn")
        diff_requires_python("bitsandbytes.json", "bitsandbytes")
    if args.only in (None, "torch"):
        torch_pins()
    if args.only in (None, "wheels"):
        wheel_versions()
    print("(data files unchanged; edit them by hand with a source for every entry)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
