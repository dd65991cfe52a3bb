#!/usr/bin/env python3
"""Write buildkit_py/compat/data/wheel_contents.json: what each wheel the data pins brings, read from
the wheels themselves on the package index (compat/wheel_contents.py is the model that reads it).

    python scripts/wheel_contents.py            # print the file
    python scripts/wheel_contents.py --write    # rewrite it in this checkout

For every release the other data files name (torch.json's releases, the nvidia-* wheels of wheels.json
and of torch's pins, bitsandbytes.json's releases, the triton releases torch's pins allow, xformers and
flash-attn releases from 2.0 / 0.0.20 on), and for each Linux machine (x86_64, aarch64) it has a wheel
for, one row: the Python tags and the glibc floor of that machine's wheels (the file list, PEP 691), and
of one wheel (cp312 where there is one): its Requires-Dist (PEP 658 METADATA) and the shared libraries
it bundles (the file names of its zip central directory, read with HTTP range requests: no wheel is
downloaded whole). The machine's pip configuration is ignored: the index is PyPI unless --index-url
names another.

PyTorch's own per-CUDA index (download.pytorch.org) is not reachable from the machines this runs on.
Its large wheels (every CUDA variant but the PyPI one before torch 2.2.0, pytorch PR #114620) are
recorded from PyTorch's build script instead, pytorch/builder manywheel/build_cuda.sh (commit 009ed170,
the 2.0/2.1 release branch): with no PYTORCH_EXTRA_INSTALL_REQUIREMENTS (the download.pytorch.org
builds) it copies DEPS_SONAME into torch/lib. Those rows say so in their source.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout

from buildkit_py.compat.index import PYPI, IndexClient, Project, redact  # noqa: E402
from buildkit_py.compat.wheel_contents import FILE, read_wheel  # noqa: E402
from buildkit_py.errors import PackageIndexError  # noqa: E402

DATA = ROOT / "buildkit_py" / "compat" / "data"
MACHINES = ("x86_64", "aarch64")

# pytorch/builder manywheel/build_cuda.sh @ 009ed170cd2b5f504c174ee3dda6a3c6a356a6ee: DEPS_SONAME of the
# builds without PYTORCH_EXTRA_INSTALL_REQUIREMENTS ("Bundling with cudnn and cublas"), by CUDA minor.
_BUILDER = ("pytorch/builder manywheel/build_cuda.sh @ 009ed170cd2b5f504c174ee3dda6a3c6a356a6ee "
            "(DEPS_SONAME copied into torch/lib when PYTORCH_EXTRA_INSTALL_REQUIREMENTS is empty, as for "
            "download.pytorch.org's builds; large wheels until pytorch PR #114620, torch 2.2.0)")
_CUDNN8 = ["libcudnn_adv_infer.so.8", "libcudnn_adv_train.so.8", "libcudnn_cnn_infer.so.8", "libcudnn_cnn_train.so.8",
           "libcudnn_ops_infer.so.8", "libcudnn_ops_train.so.8", "libcudnn.so.8"]
_BUNDLED = {
    "11.6": ["libcudart.so.11.0", "libnvToolsExt.so.1", "libnvrtc.so.11.2", "libnvrtc-builtins.so.11.6",
             *_CUDNN8, "libcublas.so.11", "libcublasLt.so.11", "libgomp.so.1"],
    "11.7": ["libgomp.so.1", *_CUDNN8, "libcublas.so.11", "libcublasLt.so.11", "libcudart.so.11.0",
             "libnvToolsExt.so.1", "libnvrtc.so.11.2", "libnvrtc-builtins.so.11.7"],
    "11.8": ["libgomp.so.1", *_CUDNN8, "libcublas.so.11", "libcublasLt.so.11", "libcudart.so.11.0",
             "libnvToolsExt.so.1", "libnvrtc.so.11.2", "libnvrtc-builtins.so.11.8"],
}


def _load(name: str) -> dict:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


def targets() -> dict[str, list[str]]:
    """project -> the releases the other data files name."""
    torch = _load("torch.json")
    wheels = _load("wheels.json")
    out: dict[str, set[str]] = {"torch": {r["version"] for r in torch["releases"]}}
    nvidia: set[tuple[str, str]] = set()
    for row in wheels["releases"]:
        for pkgs in row["extras"].values():
            nvidia |= {(canonicalize_name(p), v) for p, v in pkgs.items()}
    for key in ("nccl", "cudnn"):
        nvidia |= {(canonicalize_name(r["wheel"]), r["version"]) for r in wheels[key]}
    for r in torch["releases"]:
        nvidia |= {(canonicalize_name(p), v) for p, v in r.get("pypi_cuda_wheels", {}).items()
                   if p.startswith("nvidia-")}
    for p, v in nvidia:
        out.setdefault(p, set()).add(v)
    out["bitsandbytes"] = {r["version"] for r in _load("bitsandbytes.json")["releases"]}
    out["triton"] = {"*"}
    out["xformers"] = {"*"}
    out["flash-attn"] = {"*"}
    return {p: sorted(vs) for p, vs in out.items()}


# the releases of these projects read from the index: those torch's pins allow (triton), or from a floor
_FROM = {"triton": "2.0.0", "xformers": "0.0.20", "flash-attn": "2.0.0"}


def _expand(project: Project, versions: list[str], triton_specs: list[SpecifierSet]) -> list[str]:
    if versions != ["*"]:
        return versions
    floor = Version(_FROM[project.name])
    found = [v for v in project.releases() if Version(v) >= floor]
    if project.name == "triton":
        found = [v for v in found if any(Version(v) in s for s in triton_specs)]
    return found


def rows_of(client: IndexClient, project: Project, version: str, today: str) -> list[dict]:
    """A row per machine with a wheel (one "any" row for a release of pure wheels only), or one
    "source" row for a release with an sdist only."""
    rows: dict[str, dict] = {}
    for machine in MACHINES:
        w = read_wheel(client, project, version, machine, today, source="")
        if w is not None:
            rows[w.machine] = {**dataclasses.asdict(w), "python": list(w.python), "libraries": list(w.libraries),
                               "requires_dist": list(w.requires_dist or ()),
                               "source": f"{w.file}: METADATA, zip directory (HTTP range), read {today}"}
    if not rows and any(not f.is_wheel for f in project.files_of(version)):
        # e.g. flash-attn on PyPI: an sdist only (its wheels are on GitHub releases)
        rows["source"] = {"project": project.name, "version": version, "machine": "source", "python": [],
                          "glibc": None, "sdist": True, "file": None, "requires_dist": None, "libraries": [],
                          "source": f"{project.name}/ file list: an sdist and no Linux wheel, read {today}"}
    return list(rows.values())


def large_torch_rows(torch: dict) -> list[dict]:
    rows = []
    before = Version(torch["large_wheels"]["before"])
    for r in torch["releases"]:
        if Version(r["version"]) >= before:
            continue
        for variant, cuda in sorted(r["variants"].items()):
            if variant == r["pypi_variant"] or cuda not in _BUNDLED:
                continue
            rows.append({"project": "torch", "version": f"{r['version']}+{variant}", "machine": "x86_64",
                         "python": [], "glibc": None, "sdist": False, "file": None, "requires_dist": None,
                         "libraries": sorted(_BUNDLED[cuda]),
                         "source": f"{_BUILDER}; download.pytorch.org is not reachable here, so its Requires-Dist "
                                   "and Python tags are not recorded"})
    return rows


def build(client: IndexClient, today: str) -> dict:
    torch = _load("torch.json")
    triton_specs = [SpecifierSet(t if t[0] in "<>=!~" else f"=={t}")
                    for r in torch["releases"] if (t := r.get("triton"))]
    jobs = []
    for name, versions in sorted(targets().items()):
        try:
            project = client.project(name)
        except PackageIndexError as exc:  # a name the index lacks (a stub family): said, not fatal
            print(f"skipped {name}: {exc}", file=sys.stderr)
            continue
        for v in _expand(project, versions, triton_specs):
            jobs.append((project, v))
    with ThreadPoolExecutor(8) as pool:
        found = list(pool.map(lambda job: rows_of(client, job[0], job[1], today), jobs))
    rows = [row for rs in found for row in rs] + large_torch_rows(torch)
    rows.sort(key=lambda r: (r["project"], Version(r["version"]), r["machine"]))
    return {
        "schema": 1,
        "source": f"{redact(client.index_url)}<project>/ (PEP 691 file lists, PEP 658 METADATA, zip directories "
                  "by HTTP range; each row names the wheel read) "
                  f"and, for download.pytorch.org's large torch wheels, {_BUILDER}; written by "
                  "scripts/wheel_contents.py",
        "as_of": today,
        "notes": "One row per (project, version, Linux machine): the Python tags and glibc floor of that machine's "
                 "wheels, and of one of them (file) its Requires-Dist and the shared libraries (.so basenames) it "
                 "bundles. requires_dist null: not read (an sdist only, or a wheel of an index not reachable here).",
        "wheels": rows,
    }


def dump(raw: dict) -> str:
    """The header indented, one row a line: 1,500 rows stay a reviewable diff and under 1 MB."""
    head = json.dumps({k: v for k, v in raw.items() if k != "wheels"}, indent=1, ensure_ascii=False)
    rows = ",\n  ".join(json.dumps(r, ensure_ascii=False) for r in raw["wheels"])
    return head[:-2] + f',\n "wheels": [\n  {rows}\n ]\n}}\n'


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"rewrite compat/data/{FILE}")
    ap.add_argument("--index-url", default=PYPI)
    args = ap.parse_args(argv)
    client = IndexClient(args.index_url, timeout=60)
    raw = build(client, datetime.date.today().isoformat())
    text = dump(raw)
    if args.write:
        (DATA / FILE).write_text(text, encoding="utf-8")
        print(f"wrote {DATA / FILE}: {len(raw['wheels'])} rows, {client.requests} requests, "
              f"{client.bytes_read / 1e6:.1f} MB read", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
