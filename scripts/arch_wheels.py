#!/usr/bin/env python3
"""Write buildkit_py/compat/data/platforms.json: which releases of the pinned packages imgbuild
installs have a Linux wheel for each CPU architecture (x86_64 = linux/amd64, aarch64 =
linux/arm64), read from the package index's own file lists and METADATA.

    python scripts/arch_wheels.py            # print the file
    python scripts/arch_wheels.py --write    # rewrite it in this checkout

How: for every nvidia-* wheel that compat/data/wheels.json pins (each CUDA extra, cuDNN, NCCL),
for bitsandbytes and flash-attn, the index's file list (PEP 691 JSON) says which releases carry
a manylinux wheel for each architecture (a pure py3-none-any wheel counts for both). For torch,
the aarch64 wheel's METADATA (PEP 658, no big wheel downloaded) says whether that wheel is a CUDA
build: its Requires-Dist pins cuda-toolkit / nvidia-cuda-runtime* for a Linux aarch64 machine, or
nothing (a CPU-only wheel). The machine's pip configuration is ignored: the index is PyPI unless
--index-url names another.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout

from buildkit_py.compat.index import PYPI, IndexClient, Project, redact  # noqa: E402
from buildkit_py.versions import major_minor  # noqa: E402

DATA = ROOT / "buildkit_py" / "compat" / "data"
OUT = DATA / "platforms.json"
ARCHS = ("x86_64", "aarch64")
# The environment of a Linux aarch64 interpreter, for torch's Requires-Dist markers.
_AARCH64 = {"platform_system": "Linux", "sys_platform": "linux", "platform_machine": "aarch64",
            "os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "python_version": "3.12", "python_full_version": "3.12.0", "extra": ""}


# Pure-looking py3-none-any wheels that carry native libraries of one architecture (bitsandbytes
# before 0.43 shipped its x86_64 libbitsandbytes_cuda*.so so): only a wheel tagged for an
# architecture counts for these.
NATIVE_ANY = frozenset({"bitsandbytes"})


def wheel_archs(project: Project, version: str) -> list[str]:
    """The architectures with a Linux wheel of ``version`` (a py3-none-any wheel serves both,
    except for the packages of NATIVE_ANY)."""
    found = set()
    for f in project.files_of(version):
        for tag in f.tags:
            if tag.endswith("-any") and project.name not in NATIVE_ANY:
                found.update(ARCHS)
            found.update(a for a in ARCHS if "linux" in tag and tag.endswith(a))
    return sorted(found)


def pinned_wheels() -> list[str]:
    data = json.loads((DATA / "wheels.json").read_text())
    names = {w for r in data["releases"] for extra in r["extras"].values() for w in extra}
    names |= {row["wheel"] for row in data["cudnn"]} | {row["wheel"] for row in data["nccl"]}
    return sorted(names)


def releases_by_arch(client: IndexClient, name: str, today: str) -> dict:
    project = client.project(name)
    row: dict = {a: [] for a in ARCHS}
    for v in project.releases():
        for a in wheel_archs(project, v):
            row[a].append(v)
    row["source"] = f"{redact(client.index_url)}{name}/ file list (manylinux wheel tags per release)"
    row["read"] = today
    return row


def torch_cuda_of(client: IndexClient, project: Project, version: str) -> dict:
    """What the Linux aarch64 wheel of torch ``version`` is: a CUDA build (which CUDA) or CPU only."""
    files = sorted((f for f in project.files_of(version)
                    if any("linux" in t and t.endswith("aarch64") for t in f.tags)), key=lambda f: f.filename)
    if not files:
        return {"version": version, "aarch64": None, "source": f"{redact(client.index_url)}torch/: no aarch64 wheel"}
    md = client.metadata(files[-1])
    cuda = None
    for text in md.requires_dist:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(_AARCH64):
            continue
        pin = next((str(s.version) for s in req.specifier if s.operator == "=="), None)
        if pin and req.name in ("cuda-toolkit", "nvidia-cuda-runtime") or (
                pin and req.name.startswith("nvidia-cuda-runtime-cu")):
            cuda = major_minor(pin)
            break
    return {"version": version, "aarch64": {"cuda": cuda, "wheel": files[-1].filename},
            "source": f"{redact(client.index_url)}torch/ {files[-1].filename} METADATA Requires-Dist "
                      f"for platform_machine == 'aarch64' ({'CUDA ' + cuda if cuda else 'no CUDA wheel: a CPU build'})"}


def build(client: IndexClient) -> dict:
    today = datetime.date.today().isoformat()
    names = [*pinned_wheels(), "bitsandbytes", "flash-attn"]
    with ThreadPoolExecutor(8) as pool:
        rows = dict(zip(names, pool.map(lambda n: releases_by_arch(client, n, today), names), strict=True))
        torch = client.project("torch")
        versions = [v for v in torch.releases() if Version(v) >= Version("2.0")]
        torch_rows = list(pool.map(lambda v: torch_cuda_of(client, torch, v), versions))
    for r in torch_rows:
        r["read"] = today
    return {
        "schema": 1,
        "source": f"{redact(client.index_url)} file lists and wheel METADATA (PEP 691 / PEP 658), written by "
                  "scripts/arch_wheels.py",
        "as_of": today,
        "notes": "Per CPU architecture: 'wheels' lists, per package, the releases with a Linux wheel for "
                 "x86_64 (linux/amd64) and aarch64 (linux/arm64). 'torch' says per release whether the "
                 "index's aarch64 wheel is a CUDA build (and which CUDA) or CPU only; PyTorch's own wheel "
                 "index (download.pytorch.org, per-CUDA sbsa builds) is not read, so a release whose "
                 "aarch64 wheel here is CPU only is refused as unknown (partial), not as a fact. "
                 "'platforms' maps each platform to its wheel tag and NVIDIA's name for it (NVARCH in "
                 "NVIDIA's image Dockerfiles and its apt repository paths: x86_64, sbsa).",
        "platforms": {
            "linux/amd64": {"wheel_arch": "x86_64", "nvidia_arch": "x86_64", "debian_arch": "amd64"},
            "linux/arm64": {"wheel_arch": "aarch64", "nvidia_arch": "sbsa", "debian_arch": "arm64"},
        },
        "wheels": rows,
        "torch": torch_rows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"rewrite {OUT.relative_to(ROOT)}")
    ap.add_argument("--index-url", default=PYPI)
    ap.add_argument("--cafile", default=None, help="CA bundle for the index (a proxy's CA)")
    args = ap.parse_args(argv)
    data = build(IndexClient(args.index_url, cafile=args.cafile))
    text = json.dumps(data, indent=1, sort_keys=False) + "\n"
    if args.write:
        OUT.write_text(text)
        print(f"wrote {OUT.relative_to(ROOT)}: {len(data['wheels'])} packages, {len(data['torch'])} torch releases")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
