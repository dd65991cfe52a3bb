"""The CUDA wheels each torch release of the Python registry installs (data/torch_cuda_pins.json),
and the rule that splits them into layers.

The file is written by scripts/torch_cuda_pins.py from pip's resolution of ``torch==X`` (PEP 658
METADATA); each row has its source and read date. Checked when loaded: exact versions, sha256,
sizes, one row per torch release.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from buildkit_py.compat.tables import _fail, _load_raw

FILE = "torch_cuda_pins.json"
_SUFFIX_RE = re.compile(r"-cu\d+$")

# Wheels at least this big (compressed, as the index serves them) get a layer of their own:
# the seven biggest CUDA libraries of a torch release (cuDNN, cuBLAS, NCCL, cuFFT, cuSOLVER,
# cuSPARSELt, cuSPARSE: 146-553 MB each, 87% of the 2.2 GB for torch 2.14) change
# independently between releases; the others (under 100 MB each, 280 MB together) share one.
OWN_LAYER_BYTES = 100 * 10**6


@dataclass(frozen=True)
class CudaWheel:
    name: str  # canonical
    version: str
    size: int  # bytes of the wheel file pip chose for the read
    sha256: str

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def short(self) -> str:
        """cudnn for nvidia-cudnn-cu13, cublas for nvidia-cublas: the layer's step id."""
        return _SUFFIX_RE.sub("", self.name.removeprefix("nvidia-"))

    @property
    def is_toolkit_part(self) -> bool:
        """Unsuffixed CUDA 13 names (nvidia-cublas) move with the cuda-toolkit pin; suffixed
        libraries (nvidia-cudnn-cu13, nvidia-nccl-cu13, every cu11/cu12 wheel) move on their own."""
        return not _SUFFIX_RE.search(self.name)


@dataclass(frozen=True)
class TorchCudaPins:
    torch: str
    variant: str
    python: str
    wheels: tuple[CudaWheel, ...]
    source: str
    read: str


@dataclass(frozen=True)
class CudaLayer:
    id: str  # step id: cuda-libs, cuda-cudnn, ...
    wheels: tuple[CudaWheel, ...]

    @property
    def pins(self) -> tuple[str, ...]:
        return tuple(w.pin for w in self.wheels)


@functools.lru_cache(maxsize=1)
def _rows() -> dict[str, TorchCudaPins]:
    raw = _load_raw(FILE)
    out: dict[str, TorchCudaPins] = {}
    for e in raw.get("releases", []):
        key = e.get("torch")
        try:
            Version(str(key))
        except InvalidVersion:
            raise _fail(FILE, key, "torch must be a version") from None
        if key in out:
            raise _fail(FILE, key, "one row per torch release")
        wheels = []
        for w in e.get("wheels", []):
            name, version, size, sha = w.get("name"), w.get("version"), w.get("size"), w.get("sha256")
            if not isinstance(name, str) or canonicalize_name(name) != name:
                raise _fail(FILE, key, f"wheel name {name!r} is not canonical")
            try:
                Version(str(version))
            except InvalidVersion:
                raise _fail(FILE, key, f"{name}: version {version!r} is not exact") from None
            wheels.append(CudaWheel(name, str(version), size, sha))
        if [w.name for w in wheels] != sorted({w.name for w in wheels}):
            raise _fail(FILE, key, "wheels are sorted by name, each once")
        out[key] = TorchCudaPins(key, str(e.get("variant")), str(e.get("python")), tuple(wheels),
                                 e["source"], str(e.get("read")))
    return out


def torch_cuda_pins(torch: str) -> TorchCudaPins | None:
    """The row of a torch release of the Python registry, or None where none was read."""
    return _rows().get(torch)


def cuda_layers(wheels: tuple[CudaWheel, ...], own_layer_bytes: int = OWN_LAYER_BYTES) -> tuple[CudaLayer, ...]:
    """The layers, least often changed first: the small wheels together, then each big toolkit
    part (moves with the cuda-toolkit pin), then each big library pinned on its own (cuDNN,
    NCCL, ...: these change between torch releases that keep the toolkit). Names sort within."""
    small = tuple(w for w in wheels if w.size < own_layer_bytes)
    big = sorted((w for w in wheels if w.size >= own_layer_bytes), key=lambda w: (not w.is_toolkit_part, w.name))
    layers = [CudaLayer("cuda-libs", small)] if small else []
    return tuple(layers + [CudaLayer(f"cuda-{w.short}", (w,)) for w in big])
