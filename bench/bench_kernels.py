"""Reading the CUDA kernels of a whole torch image (issue 30: under 30 s on this machine).

Three arms on the same image, interleaved, best of N (the machine is shared, so the best run is
the one least slowed by others):

  raw       the engine streams the image's file system (a container exported) and nothing reads it:
            the floor every arm pays
  check     what `imgbuild check IMAGE --gpu` reads: that stream through saved_image.scan_kernels,
            every ELF file read whole and its fat binaries listed
  save      `docker save` streamed and nothing read: the floor of the next arm (20.10 copies the
            image to a temporary folder before it streams a byte)
  layers    every layer tar of `docker save` through scan_kernels: every ELF of every layer,
            including files a later layer replaces
  inspect   `imgbuild inspect IMAGE --no-compressed`: its one pass over `docker save`
  inspect+k `imgbuild inspect IMAGE --kernels --no-compressed`: the same pass reading the kernels
            too (until issue 30 it exported the file system a second time, the check arm's cost)

The target applies to the check arm, the path `check --gpu` takes.

The image is torch 2.14.1 (cu130) with its CUDA wheels, as tests/test_e2e_torch.py builds it
(--image to name another); one built here is removed afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from buildkit_py.analysis.saved_image import (  # noqa: E402
    IterStream,
    _blob_compression,
    decompressing,
    scan_kernels,
)
from buildkit_py.engine import engine_for_reading  # noqa: E402

TARGET_S = 30.0
CA = Path("/etc/ssl/certs/ca-certificates.crt")
BASE = os.environ.get("IMGBUILD_TEST_BASE_IMAGE", "debian:bookworm-slim")
RECIPE = """\
name: imgbuild-bench/kernels-torch
version: "2.14.1"
cuda: {{version: "13.0", source: wheels, flavor: base}}
base: {{image: {base}}}
python: "3.11"
torch: "2.14.1"
"""


def build_torch_image() -> str:
    from buildkit_py.cli.main import main as cli  # noqa: PLC0415

    folder = Path(tempfile.mkdtemp(prefix="imgbuild-bench-kernels-"))
    (folder / "recipe.yaml").write_text(RECIPE.format(base=BASE))
    out = io.StringIO()
    ca = ["--ca-cert", str(CA)] if CA.exists() else []
    code = cli(["build", str(folder / "recipe.yaml"), "--json", "--progress", "quiet", *ca], stdout=out,
               stderr=sys.stderr)
    if code:
        raise SystemExit(f"building the torch image failed ({code})")
    return json.loads(out.getvalue())["tags"][0]


def arm_raw(engine, image_id: str) -> dict:
    n = 0
    with engine.filesystem(image_id) as chunks:
        for chunk in chunks:
            n += len(chunk)
    return {"bytes": n}


def arm_check(engine, image_id: str) -> dict:
    with engine.filesystem(image_id) as chunks:
        scan = scan_kernels(io.BufferedReader(IterStream(chunks), 1 << 20))
    return {"bytes": None, "libraries": len(scan.kernels), "files": scan.files, "elf_bytes": scan.elf_bytes,
            "entries": sum(len(k.entries) for k in scan.kernels.values()), "errors": len(scan.errors)}


def arm_save(engine, image_id: str) -> dict:
    return {"bytes": sum(len(chunk) for chunk in engine.save(image_id))}


def arm_layers(engine, image_id: str) -> dict:
    libraries = entries = layers = elf = 0
    stream = io.BufferedReader(IterStream(engine.save(image_id)), 1 << 20)
    with tarfile.open(fileobj=stream, mode="r|") as outer:  # type: ignore[arg-type]
        for m in outer:
            if not m.isreg() or not (m.name.endswith("layer.tar") or m.name.startswith("blobs/sha256/")):
                continue
            f = outer.extractfile(m)
            if f is None:
                continue
            head = f.peek(4)[:4]  # type: ignore[attr-defined]
            compression = _blob_compression(head)
            if m.name.startswith("blobs/") and compression is None and head[:1] == b"{":
                continue  # a manifest or config of the OCI layout
            inner = decompressing(f, compression) if compression else f
            scan = scan_kernels(inner)  # type: ignore[arg-type]
            layers += 1
            libraries += len(scan.kernels)
            entries += sum(len(k.entries) for k in scan.kernels.values())
            elf += scan.elf_bytes
    return {"layers": layers, "libraries": libraries, "entries": entries, "elf_bytes": elf}


def arm_inspect(engine, image_id: str, kernels: bool = False) -> dict:
    from buildkit_py.analysis.inspect import InspectOptions, inspect_image  # noqa: PLC0415

    report = inspect_image(engine, image_id, InspectOptions(estimate_compressed=False, registry_sizes=False,
                                                            kernels=kernels))
    return {"layers": len(report.layers), "libraries": len(report.kernels.libraries) if report.kernels else None}


def arm_inspect_kernels(engine, image_id: str) -> dict:
    return arm_inspect(engine, image_id, kernels=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", help="an image in the engine (default: build the torch 2.14.1 image)")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the image this built")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    engine = engine_for_reading(os.environ.get("IMGBUILD_ENGINE"))
    built = None
    image = args.image
    if image is None:
        image = built = build_torch_image()
    attrs = engine.image_attrs(image)
    if attrs is None:
        raise SystemExit(f"no image {image} in the engine")
    image_id = attrs["Id"]
    arms: dict[str, Callable] = {"raw": arm_raw, "check": arm_check, "save": arm_save, "layers": arm_layers,
                                 "inspect": arm_inspect, "inspect+k": arm_inspect_kernels}
    times: dict[str, list[float]] = {name: [] for name in arms}
    facts: dict[str, dict] = {}
    try:
        for _ in range(args.runs):
            for name, arm in arms.items():
                start = time.perf_counter()
                facts[name] = arm(engine, image_id)
                times[name].append(time.perf_counter() - start)
    finally:
        if built and not args.keep:
            engine.sdk().images.remove(built, force=True)
    size = facts["raw"]["bytes"]
    print(f"(10) kernels of {image}: {size / 1e9:.2f} GB file system, {facts['check']['files']} files, "
          f"{facts['check']['elf_bytes'] / 1e9:.2f} GB of ELF, on {engine.name}; best of {args.runs}", flush=True)
    results = {"image": image, "bytes": size, "facts": facts, "seconds": {}}
    for name, values in times.items():
        best = min(values)
        results["seconds"][name] = {"best": best, "all": values}
        verdict = "" if name != "check" else ("  ok" if best <= TARGET_S else f"  over {TARGET_S:.0f} s")
        detail = {"raw": "file system stream only", "save": "docker save stream only",
                  "check": f"{facts['check']['libraries']} libraries, {facts['check']['entries']} fatbin entries",
                  "layers": f"{facts['layers']['layers']} layers, {facts['layers']['libraries']} libraries, "
                            f"{facts['layers']['entries']} entries",
                  "inspect": f"{facts['inspect']['layers']} layers",
                  "inspect+k": f"{facts['inspect+k']['libraries']} libraries in the same pass"}[name]
        print(f"    {name:<9} {best:7.1f} s  (runs: {', '.join(f'{v:.1f}' for v in values)})  {detail}{verdict}",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if min(times["check"]) <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
