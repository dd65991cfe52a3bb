#!/usr/bin/env python3
"""Refresh the compatibility data from the package index: same as ``imgbuild data refresh``.

    python scripts/refresh_compat.py                 # show what the index says differently
    python scripts/refresh_compat.py --write         # rewrite the data files in this checkout
    python scripts/refresh_compat.py --index-url URL # another index (default: the one pip would use)
    python scripts/refresh_compat.py --flash-attn-repo DIR  # flash-attn rows from a clone's tags

What it reads: torch's Linux wheel METADATA per release (CUDA variant from the nvidia-*-cu11/cu12
pins or the cuda-toolkit pin of CUDA 13 builds, Python range from the wheel tags, triton), NVIDIA's
cuda-toolkit meta package per toolkit release (cudart/nvcc wheels), bitsandbytes' wheel METADATA and
the libbitsandbytes_cudaXYZ.so files in each wheel, and every release of flash-attn and
bitsandbytes (each one the data lacks is added; flash-attn from its tag's publish.yml, setup.py and
README when a clone of Dao-AILab/flash-attention is given, else as a partial row). PEP 658 metadata
where the index has it, otherwise the METADATA member of the wheel by HTTP range requests.
Hand-sourced fields (NVIDIA's Table 3 drivers, PyTorch's variant matrix, images) are kept; what
needs a person is printed as ``review:`` lines. Written files are validated by the loader before
they replace the old ones.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from buildkit_py.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["data", "refresh", *sys.argv[1:]]))
