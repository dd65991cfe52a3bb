#!/usr/bin/env python3
"""Write the wheel-read rows of buildkit_py/compat/data/wheel_kernels.json: which CUDA
architectures (SASS and PTX) each CUDA library inside a prebuilt wheel carries, read from the
wheel's own ELF files with imgbuild's fat binary reader (analysis.kernels), as cuobjdump lists them.

    python scripts/wheel_kernels.py WHEEL...            # print the file
    python scripts/wheel_kernels.py --write WHEEL...    # rewrite it in this checkout

Get the wheels from the package index with the machine's pip configuration ignored, e.g.
``PIP_CONFIG_FILE=/dev/null pip download --no-deps torch==2.14.1 -d wheels/``. Rows the script
did not read from a wheel (torch releases known from PyTorch's build scripts) are kept as they
are; a row read from a wheel replaces the row of the same package, version and variant.

Variants: torch's is the CUDA build of the index's wheel (torch.json ``pypi_variant``);
bitsandbytes ships one library per CUDA (libbitsandbytes_cuda130.so, before 0.44 with a
_nocublaslt build beside it) and loads torch's: one row per CUDA, variant ``cu130``; nvidia-*
wheels have none.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout

from buildkit_py import compat  # noqa: E402
from buildkit_py.analysis.gpu_coverage import TRIVIAL_BYTES  # noqa: E402
from buildkit_py.analysis.kernels import FileKernels, read_kernels  # noqa: E402

OUT = ROOT / "buildkit_py" / "compat" / "data" / "wheel_kernels.json"
_BNB = re.compile(r"libbitsandbytes_cuda(\d+)(?:_nocublaslt)?\.so$")


def wheel_name(path: Path) -> tuple[str, str]:
    """(project, version) from a wheel's file name, the project as the index spells it."""
    name, version = path.name.split("-")[:2]
    return name.replace("_", "-").lower(), version.split("+")[0]


def library_row(kernels: FileKernels) -> dict:
    sass = sorted({f"{a.major}.{a.minor}{'a' if a.specific else ''}" for a in kernels.sass_archs()},
                  key=compat.arch_key)
    ptx = sorted({f"{a.major}.{a.minor}{'a' if a.specific else ''}" for a, _ in kernels.ptx()}, key=compat.arch_key)
    row: dict = {"path": kernels.path, "sass": sass, "ptx": ptx}
    if sum(e.inflated_size for e in kernels.runnable) < TRIVIAL_BYTES:
        row["decides"] = False  # no real kernels here (cuFFT 12's are in a store of its own): see gpu_coverage
    return row


def read_wheel(path: Path) -> list[tuple[str, dict]]:
    """(member, library row) of each ELF file in the wheel whose fat binaries hold code."""
    out = []
    with zipfile.ZipFile(path) as zf:
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            if ".so" not in info.filename.rsplit("/", 1)[-1]:
                continue
            kernels = read_kernels(zf.read(info), info.filename)
            if kernels is not None and kernels.runnable:
                out.append((info.filename, library_row(kernels)))
    return out


def rows_of(path: Path, today: str) -> list[dict]:
    name, version = wheel_name(path)
    libs = read_wheel(path)
    source = f"{path.name}: the fat binaries of its ELF files, read by scripts/wheel_kernels.py"
    if name == "bitsandbytes":  # before 0.44 a _nocublaslt build beside each: both go in its CUDA's row
        by_cuda: dict[str, list[dict]] = {}
        for member, lib in libs:
            if m := _BNB.search(member):
                by_cuda.setdefault(f"cu{m[1]}", []).append(lib)
        return [{"package": name, "version": version, "variant": cu, "libraries": found, "source": source,
                 "read": today} for cu, found in by_cuda.items()]
    variant = ""
    if name == "torch":
        variant = compat.torch_release(version).pypi_variant or ""
    return [{"package": name, "version": version, "variant": variant, "libraries": [lib for _, lib in libs],
             "source": source, "read": today}]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheels", nargs="+", type=Path)
    ap.add_argument("--write", action="store_true", help=f"rewrite {OUT.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    data = json.loads(OUT.read_text())
    today = datetime.date.today().isoformat()
    new = [row for w in args.wheels for row in rows_of(w, today)]
    keys = {(r["package"], r["version"], r["variant"]) for r in new}
    rows = [r for r in data["rows"] if (r["package"], r["version"], r["variant"]) not in keys] + new
    data["rows"] = sorted(rows, key=lambda r: (r["package"], tuple(int(p) for p in re.findall(r"\d+", r["version"])),
                                               r["variant"]))
    data["as_of"] = today
    text = json.dumps(data, indent=1) + "\n"
    if args.write:
        OUT.write_text(text)
        print(f"wrote {OUT.relative_to(ROOT)}: {len(new)} rows read from {len(args.wheels)} wheels")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
