"""bitsandbytes' releases (bitsandbytes.json): the CUDA binaries each wheel ships (a range, or
the exact libraries its loader needs), the Python and torch it accepts, and the compute
capabilities its kernels and LLM.int8() need."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from buildkit_py.compat.tables import (
    bad_entry,
    check_archs,
    check_ascending,
    entry_specifier,
    known_major_minors,
    load_raw,
)


@dataclass(frozen=True)
class BnbRelease:
    """``cuda`` is a SpecifierSet (any CUDA in range works) or, for releases whose loader needs an exact
    ``libbitsandbytes_cudaXYZ.so``, the tuple of CUDA major.minor versions shipped in the wheel.
    ``cuda_nocublaslt``: where it differs from ``cuda``, the CUDA versions with the
    ``_nocublaslt`` library the loader takes on GPUs below compute capability 7.5. ``partial``
    says why a row is incomplete (plans refuse such a release)."""
    version: str
    cuda: SpecifierSet | tuple[str, ...]
    python: SpecifierSet
    source: str
    notes: str | None = None
    torch: SpecifierSet = SpecifierSet()        # the wheel's Requires-Dist on torch (empty: none declared)
    min_compute_capability: str | None = None   # GPUs below it have no kernels in the PyPI wheel
    int8_compute_capability: str | None = None  # LLM.int8() needs at least this
    cuda_nocublaslt: tuple[str, ...] | None = None
    partial: str | None = None


@functools.cache
def _bnb() -> tuple[BnbRelease, ...]:
    f = "bitsandbytes.json"
    raw = load_raw(f)
    known = known_major_minors()
    out = []
    for e in raw["releases"]:
        v = e["version"]
        cuda = e.get("cuda")
        if isinstance(cuda, list):
            cuda_v: SpecifierSet | tuple[str, ...] = _cuda_list(f, v, cuda, known)
        else:
            cuda_v = entry_specifier(f, v, cuda)
        nocublaslt = e.get("cuda_nocublaslt")
        if nocublaslt is not None:
            if not isinstance(cuda, list):
                raise bad_entry(f, v, "cuda_nocublaslt goes with a cuda list (releases that need an exact library)")
            nocublaslt = _cuda_list(f, v, nocublaslt, known)
        ccs = [e.get("min_compute_capability"), e.get("int8_compute_capability")]
        check_archs(f, v, tuple(c for c in ccs if c is not None))
        if not e.get("partial") and (cuda is None or ccs[0] is None):
            raise bad_entry(f, v, "no cuda or min_compute_capability: a row without them must say why (partial)")
        out.append(BnbRelease(v, cuda_v, entry_specifier(f, v, e.get("python")), e["source"], e.get("notes"),
                              entry_specifier(f, v, e.get("torch")), ccs[0], ccs[1], nocublaslt, e.get("partial")))
    check_ascending(f, [r.version for r in out])
    return tuple(out)


def _cuda_list(f: str, v: str, cuda: list[Any], known: set[str]) -> tuple[str, ...]:
    for c in cuda:
        if c not in known:
            raise bad_entry(f, v, f"CUDA {c!r} is not a known toolkit major.minor (toolkits.json)")
    if cuda != sorted(set(cuda), key=Version):
        raise bad_entry(f, v, "CUDA list must be unique and ascending")
    return tuple(cuda)


def bitsandbytes_releases() -> tuple[BnbRelease, ...]:
    return _bnb()


def bitsandbytes_release(version: str) -> BnbRelease:
    for r in _bnb():
        if Version(r.version) == Version(version):
            return r
    raise LookupError(f"unknown bitsandbytes release {version!r}; known: {', '.join(r.version for r in _bnb())}")
