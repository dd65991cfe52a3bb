"""torch's releases (torch.json): each release's Python range, its CUDA wheel variants and their
package index, and the C++ standard its headers need (cxx_std.json)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from buildkit_py.compat.tables import (
    bad_entry,
    check_ascending,
    entry_specifier,
    entry_version,
    known_major_minors,
    load_raw,
)

_VARIANT_RE = re.compile(r"^cu(\d{2})(\d)$")


@dataclass(frozen=True)
class TorchRelease:
    version: str
    python: SpecifierSet
    variants: dict[str, str]
    pypi_variant: str | None
    pypi_cuda_wheels: dict[str, str]
    triton: str | None
    source: str
    notes: str | None = None
    pypi_cuda_toolkit_extras: tuple[str, ...] = ()   # cuda-toolkit[...] extras the PyPI wheel asks for (CUDA 13+)
    from_cache: str | None = None   # the look-up cache file it came from (newer than the shipped data)
    partial: str | None = None   # why some of its facts (its other CUDA variants) are not recorded

    @property
    def unknown_variants(self) -> str | None:
        """Why a CUDA variant the row lacks may still exist (None: the row lists every variant)."""
        if self.partial:
            return self.partial
        if self.from_cache:
            return f"only its PyPI build ({self.pypi_variant}) was read from the package index"
        return None


@dataclass(frozen=True)
class CxxStd:
    """The C++ standard an extension must compile as to include the headers of torch releases in ``torch``."""
    torch: SpecifierSet
    cxx_std: int
    source: str


@functools.cache
def _torch() -> tuple[str, tuple[TorchRelease, ...]]:
    f = "torch.json"
    raw = load_raw(f)
    known = known_major_minors()
    out = [torch_row(f, e, known) for e in raw["releases"]]
    check_ascending(f, [t.version for t in out])
    return raw["index_url"], tuple(out)


def torch_row(f: str, e: dict[str, Any], known: set[str] | None = None) -> TorchRelease:
    """One torch.json row, checked (also for rows from the live look-up cache)."""
    known = known_major_minors() if known is None else known
    v = e.get("version")
    entry_version(f, v, v)
    variants = dict(e.get("variants", {}))
    for var, cuda in variants.items():
        m = _VARIANT_RE.match(var)
        if not m or f"{int(m.group(1))}.{m.group(2)}" != cuda:
            raise bad_entry(f, v, f"variant {var!r} does not spell CUDA {cuda!r}")
        if cuda not in known:
            raise bad_entry(f, v, f"variant {var} maps to CUDA {cuda}, not a known toolkit major.minor")
    pv = e.get("pypi_variant")
    if pv is not None and pv not in variants:
        raise bad_entry(f, v, f"pypi_variant {pv} is not one of the variants")
    return TorchRelease(str(v), entry_specifier(f, v, e.get("python")), variants, pv,
                        dict(e.get("pypi_cuda_wheels", {})), e.get("triton"), e["source"], e.get("notes"),
                        tuple(e.get("pypi_cuda_toolkit_extras", ())), partial=e.get("partial"))


@functools.cache
def _cxx_std() -> tuple[CxxStd, ...]:
    f = "cxx_std.json"
    raw = load_raw(f)
    out = tuple(CxxStd(entry_specifier(f, e.get("torch"), e.get("torch")), e["cxx_std"], e["source"])
                for e in raw["torch"])
    for t in _torch()[1]:  # every torch release imgbuild knows falls in exactly one range
        hits = [str(e.torch) for e in out if e.torch.contains(t.version, prereleases=True)]
        if len(hits) != 1:
            raise bad_entry(f, t.version, f"torch {t.version} falls in {len(hits)} ranges "
                                          f"({', '.join(hits) or 'none'}); it must fall in exactly one")
    return out


def torch_releases() -> tuple[TorchRelease, ...]:
    return _torch()[1]


def torch_release(version: str, *, extra: tuple[TorchRelease, ...] = ()) -> TorchRelease:
    """The shipped data's row, else one of ``extra`` (releases newer than the shipped data that the
    pipeline looked up on the package index and passes in; they have ``from_cache`` set)."""
    for r in (*torch_releases(), *extra):
        if Version(r.version) == Version(version):
            return r
    known = ", ".join(r.version for r in torch_releases())
    raise LookupError(f"unknown torch release {version!r}; known: {known}")


@functools.cache
def large_wheels_before() -> str:
    """The first torch release whose every CUDA variant depends on nvidia-* wheels (torch.json)."""
    return str(load_raw("torch.json")["large_wheels"]["before"])


def torch_index_url(variant: str) -> str:
    if not _VARIANT_RE.match(variant) and variant != "cpu":
        raise LookupError(f"not a PyTorch wheel variant: {variant!r} (expected e.g. 'cu124' or 'cpu')")
    return _torch()[0].format(variant=variant)


def torch_cxx_std(version: str) -> int | None:
    """The C++ standard an extension including torch ``version``'s headers must compile as
    (cxx_std.json); None for a torch no range covers."""
    for e in _cxx_std():
        if e.torch.contains(str(version), prereleases=True):
            return e.cxx_std
    return None
