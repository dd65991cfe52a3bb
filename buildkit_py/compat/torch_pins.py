"""The CUDA wheels each torch release of the Python registry installs, and Triton, its one big
other dependency (data/torch_cuda_pins.json), and the rule that splits them into layers.

The file is written by scripts/torch_cuda_pins.py from pip's resolution of ``torch==X`` (PEP 658
METADATA); each row has its source and read date. Checked when loaded: exact versions, sha256,
sizes, one row per torch release.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from buildkit_py.compat.tables import bad_entry, load_raw
from buildkit_py.recipe.model import pin_name

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
    file: str = ""  # that wheel's file name, whose tags say which Pythons it serves

    @property
    def python_independent(self) -> bool:
        return is_python_independent(self.name, self.file)

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def short(self) -> str:
        """cudnn for nvidia-cudnn-cu13, cublas for nvidia-cublas: the layer's step id."""
        return _short(self.name)


def is_cuda_wheel(name: str) -> bool:
    """nvidia-* and cuda-* distributions: the CUDA libraries and toolkit parts."""
    return canonicalize_name(name).startswith(("nvidia-", "cuda-"))


def is_python_independent(name: str, file: str = "") -> bool:
    """Whether a wheel installs the same files under every Python (py3-none, py2.py3-none): by
    its file's tags where the file is known; else by name, an nvidia-* wheel (NVIDIA publishes
    its CUDA libraries as py3-none wheels: every one in data/torch_cuda_pins.json is, which
    tests/test_torch_layers.py checks). Such wheels can live outside the venv, in one prefix
    that images on any Python share byte for byte (plan.PrefixPipStep)."""
    if file:
        try:
            tags = parse_wheel_filename(file)[3]
        except InvalidWheelFilename:
            return False
        return all(t.abi == "none" and t.interpreter.startswith("py") for t in tags)
    return canonicalize_name(name).startswith("nvidia-")


@dataclass(frozen=True)
class TorchCudaPins:
    torch: str
    variant: str
    python: str
    wheels: tuple[CudaWheel, ...]  # the CUDA wheels and Triton, as pip resolved torch==X
    source: str
    read: str

    @property
    def cuda_wheels(self) -> tuple[CudaWheel, ...]:
        return tuple(w for w in self.wheels if is_cuda_wheel(w.name))

    @property
    def dependency_wheels(self) -> tuple[CudaWheel, ...]:
        """Triton: ~250 MB that torch patch releases keep (2.14.0 and 2.14.1 both pin 3.8.0),
        so it gets a layer of its own below torch's instead of riding in it."""
        return tuple(w for w in self.wheels if not is_cuda_wheel(w.name))


@dataclass(frozen=True)
class CudaLayer:
    id: str  # step id: cuda-libs, cuda-cudnn, ...
    pins: tuple[str, ...]  # name==version, sorted by name
    own: bool = False  # one big library in a layer of its own (installed --no-deps)


@functools.lru_cache(maxsize=1)
def rows() -> dict[str, TorchCudaPins]:
    """Every row of the file, checked; loaded once."""
    raw = load_raw(FILE)
    out: dict[str, TorchCudaPins] = {}
    for e in raw.get("releases", []):
        key = e.get("torch")
        try:
            Version(str(key))
        except InvalidVersion:
            raise bad_entry(FILE, key, "torch must be a version") from None
        if key in out:
            raise bad_entry(FILE, key, "one row per torch release")
        wheels = []
        for w in e.get("wheels", []):
            name, version, size, sha = w.get("name"), w.get("version"), w.get("size"), w.get("sha256")
            if not isinstance(name, str) or canonicalize_name(name) != name:
                raise bad_entry(FILE, key, f"wheel name {name!r} is not canonical")
            try:
                Version(str(version))
            except InvalidVersion:
                raise bad_entry(FILE, key, f"{name}: version {version!r} is not exact") from None
            wheels.append(CudaWheel(name, str(version), size, sha, str(w.get("file") or "")))
        if [w.name for w in wheels] != sorted({w.name for w in wheels}):
            raise bad_entry(FILE, key, "wheels are sorted by name, each once")
        out[key] = TorchCudaPins(key, str(e.get("variant")), str(e.get("python")), tuple(wheels),
                                 e["source"], str(e.get("read")))
    return out


def torch_cuda_pins(torch: str) -> TorchCudaPins | None:
    """The row of a torch release of the Python registry, or None where none was read."""
    return rows().get(torch)


def cuda_layers(wheels: tuple[CudaWheel, ...], own_layer_bytes: int = OWN_LAYER_BYTES) -> tuple[CudaLayer, ...]:
    """The layers of a torch release's CUDA wheels, by their measured sizes: see split_layers."""
    big = {w.name for w in wheels if w.size >= own_layer_bytes}
    return split_layers(tuple(w.pin for w in wheels), lambda name: name in big)


def dependency_layers(wheels: tuple[CudaWheel, ...]) -> tuple[CudaLayer, ...]:
    """One layer per non-CUDA wheel of the row (Triton): ``torch-<name>``, installed --no-deps."""
    return tuple(CudaLayer(f"torch-{w.name}", (w.pin,), own=True) for w in sorted(wheels, key=lambda w: w.name))


@functools.lru_cache(maxsize=1)
def big_libraries(own_layer_bytes: int = OWN_LAYER_BYTES) -> frozenset[str]:
    """Short names (cudnn, cublas, ...) of the CUDA libraries whose wheel measured at least
    ``own_layer_bytes`` in some torch release's row: the rule for CUDA wheels whose sizes were
    not read (``cuda.source: wheels`` without torch), whatever CUDA major names them."""
    return frozenset(w.short for row in rows().values() for w in row.cuda_wheels if w.size >= own_layer_bytes)


def cuda_pin_layers(pins: tuple[str, ...], *, small_id: str = "cuda") -> tuple[CudaLayer, ...]:
    """The layers of CUDA wheel pins without a torch row (``cuda.source: wheels``): a library
    that is big in the torch data (big_libraries) gets a layer of its own. ``small_id`` names
    the layer of the small ones ("cuda", as the single CUDA step has always been called)."""
    big = big_libraries()
    return split_layers(pins, lambda name: _short(name) in big, small_id=small_id)


def split_layers(pins: tuple[str, ...], is_big: Callable[[str], bool], *,
                 small_id: str = "cuda-libs") -> tuple[CudaLayer, ...]:
    """The layers, least often changed first: the small wheels together, then each big toolkit
    part (moves with the cuda-toolkit pin), then each big library pinned on its own (cuDNN,
    NCCL, ...: these change between releases that keep the toolkit). Names sort within, so the
    same pins give the same layers whatever else the image holds."""
    named = sorted(((canonicalize_name(pin_name(p)), p) for p in pins), key=lambda x: x[0])
    small = tuple(p for n, p in named if not is_big(n))
    big = sorted(((n, p) for n, p in named if is_big(n)), key=lambda x: (bool(_SUFFIX_RE.search(x[0])), x[0]))
    layers = [CudaLayer(small_id, small)] if small else []
    return tuple(layers + [CudaLayer(f"cuda-{_short(n)}", (p,), own=True) for n, p in big])


def _short(name: str) -> str:
    """cudnn for nvidia-cudnn-cu13, cublas for nvidia-cublas: a layer's step id."""
    return _SUFFIX_RE.sub("", canonicalize_name(name).removeprefix("nvidia-"))
