"""Compatibility tables: load the sourced JSON files, check their invariants, answer look-ups.

Every data file is ``{"schema": 1, "source": ..., ...}`` with a ``source`` on every entry; its
shape is its ``$defs`` entry in ``buildkit_py/schemas/compat.schema.json``, checked when the file
is first read (every problem at once, at ``file:line: key``). The invariants a schema cannot
state (ascending versions, driver floors, references between files) are checked once, at first
load; a broken file raises CompatDataError naming the file and the entry. Code here holds rules
only; numbers live in ``data/*.json``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from buildkit_py.errors import CompatDataError, RecipeIssue
from buildkit_py.schemas import json_lines, line_of, load_schema, validate
from buildkit_py.versions import major_minor as _mm  # short: it sits in many messages

if TYPE_CHECKING:
    from importlib.abc import Traversable  # importlib.resources.abc only from Python 3.11

SCHEMA = 1


# ----------------------------------------------------------------------------- dataclasses
@dataclass(frozen=True)
class Toolkit:
    """``linux_min_driver`` is the native floor: NVIDIA's Table 3 value (``min_driver_basis``
    "table3"), or the newest Table 3 value of the same minor where NVIDIA publishes no row for the
    release ("same-minor"). Where the whole minor has no row ("unpublished") the native floor is
    unknown and ``linux_min_driver`` is None: only the major's minor-version floor (minor_compat.json)
    is known, and a driver NVIDIA's installer bundles (``runfile_driver``) is known to run it
    natively. A runfile driver is never a floor. Its PyPI wheels are in wheels.json."""
    version: str
    linux_min_driver: str | None
    windows_min_driver: str | None
    source: str
    notes: str | None = None
    min_driver_basis: str = "table3"
    runfile_driver: str | None = None

    @property
    def major_minor(self) -> str:
        return _mm(self.version)

    @property
    def native_floor_known(self) -> bool:
        return self.linux_min_driver is not None


@dataclass(frozen=True)
class MinorCompatFloor:
    major: int
    linux_min_driver: str
    windows_min_driver: str | None
    below_branch: str | None
    source: str


@dataclass(frozen=True)
class _RangeEntry:
    cuda: SpecifierSet
    values: tuple[str, ...]
    source: str


# ----------------------------------------------------------------------------- helpers
class CompatGap(LookupError):
    """A question the shipped data has no row for. Carries what was asked, the known values
    nearest to it and a hint that names the newest release that fits, so the resolver can turn
    it into a resolution error at the recipe key (never an internal error)."""

    def __init__(self, what: str, value: str, reason: str, *, nearest: tuple[str, ...] = (),
                 hint: str | None = None):
        self.what, self.value, self.reason = what, str(value), reason
        self.nearest, self.hint = tuple(nearest), hint
        text = f"{what} {value}: {reason}"
        if nearest:
            text += f"; known near it: {', '.join(nearest)}"
        super().__init__(text)

    def __str__(self) -> str:
        return str(self.args[0])   # the text given to __init__ (args are typed Any)


def arch_key(arch: str) -> tuple[int, int, str]:
    """Sort key of a compute capability: 9.0 < 9.0a < 9.0f < 10.0 (Version() would read 9.0a as a pre-release)."""
    m = re.match(r"^(\d+)\.(\d+)([af]?)", arch)
    return (int(m.group(1)), int(m.group(2)), m.group(3)) if m else (0, 0, arch)


def arch_base(arch: str) -> str:
    """``9.0a+PTX`` -> ``9.0``: the compute capability a GPU reports."""
    return re.sub(r"[af]$", "", arch.replace("+PTX", ""))


def sass_runs_on(sm: str, arch: str) -> bool:
    """Whether SASS compiled for ``sm`` runs on a GPU of compute capability ``arch``: a cubin for
    X.y runs on X.z with z >= y, never on another major (CUDA C++ Programming Guide, "Binary
    Compatibility"); arch-specific ``a``/``f`` targets are compared by their base."""
    s, a = arch_key(arch_base(sm)), arch_key(arch_base(arch))
    return s[0] == a[0] and s[1] <= a[1]


def nearest_versions(value: str, known: Iterable[str], n: int = 4) -> tuple[str, ...]:
    """The ``n`` known versions closest to ``value`` (major.minor distance, then newest), ascending."""
    known = list(dict.fromkeys(known))
    try:
        t = Version(str(value))
        tv = t.major * 1000 + t.minor + (t.micro / 1000 if len(t.release) > 2 else 0)
    except InvalidVersion:
        return tuple(sorted(known, key=Version)[-n:])

    def dist(v: str) -> tuple[float, int]:
        x = Version(v)
        xv = x.major * 1000 + x.minor + (x.micro / 1000 if len(x.release) > 2 else 0)
        return abs(xv - tv), -x.major * 1000 - x.minor

    return tuple(sorted(sorted(known, key=dist)[:n], key=Version))


def bad_entry(file: str, entry: Any, why: str) -> CompatDataError:
    return CompatDataError(f"compat data {file}: entry {entry!r}: {why}",
                           hint="this is a bug in the shipped data; fix the file and its source")


def entry_version(file: str, entry: Any, text: Any) -> Version:
    try:
        return Version(str(text))
    except InvalidVersion:
        raise bad_entry(file, entry, f"not a version: {text!r}") from None


def entry_specifier(file: str, entry: Any, text: Any) -> SpecifierSet:
    try:
        return SpecifierSet(text or "")
    except InvalidSpecifier:
        raise bad_entry(file, entry, f"not a specifier: {text!r}") from None


def check_ascending(file: str, keys: list[str]) -> None:
    vs = [entry_version(file, k, k) for k in keys]
    for a, b, ka, kb in zip(vs, vs[1:], keys, keys[1:], strict=False):
        if not a < b:
            raise bad_entry(file, kb, f"versions must be strictly ascending and unique ({ka} then {kb})")


# Another folder of data files, set only in the child process ``imgbuild data refresh`` validates
# the files it is about to write in (``validate_folder``); no variable is read for it.
_OTHER_FOLDER: dict[str, Path] = {}


def data_dir() -> Traversable:
    """The shipped data files, or the folder ``validate_folder`` is checking."""
    other = _OTHER_FOLDER.get("data")
    return other if other is not None else resources.files(__package__).joinpath("data")


def validate_folder(folder: str) -> None:
    """Load every data file from ``folder`` instead of the shipped ones (CompatDataError on the
    first broken invariant): run in a child process by ``refresh.validate_files``."""
    _OTHER_FOLDER["data"] = Path(folder)
    clear_caches()
    validate_all()


def load_raw(name: str) -> dict[str, Any]:
    """A data file's JSON, checked against its schema (compat.schema.json, ``$defs/<name>``)."""
    path = data_dir().joinpath(name)
    try:
        text = path.read_text(encoding="utf-8")
        data: dict[str, Any] = json.loads(text)   # _check_schema below refuses anything but its $defs/<name> object
    except (OSError, json.JSONDecodeError) as exc:
        raise CompatDataError(f"compat data {name}: cannot be read: {exc}") from exc
    _check_schema(str(path), name, text)
    return data


@functools.lru_cache(maxsize=32)
def _check_schema(where: str, name: str, text: str) -> None:
    """Each file's text is checked once per process (look-ups read some files again)."""
    data = json.loads(text)
    issues = validate(data, {"$ref": f"#/$defs/{name}"}, root=load_schema("compat"))
    if issues:
        lines = json_lines(text)
        raise CompatDataError(f"compat data {name} breaks its schema:\n" + "\n".join(
            RecipeIssue(where, line_of(lines, i.key), i.key, i.message).render() for i in issues),
            hint="this is a bug in the shipped data; fix the file and its source")


# ----------------------------------------------------------------------------- loaders (validated)
@functools.cache
def _toolkit_data() -> tuple[tuple[Toolkit, ...], dict[str, tuple[str, ...]]]:
    f = "toolkits.json"
    raw = load_raw(f)
    out = [_toolkit_row(f, e) for e in raw["toolkits"]]
    check_ascending(f, [t.version for t in out])
    _check_driver_floors(f, out)
    skipped = {k: tuple(v) for k, v in raw.get("skipped_minors", {}).items()}
    _check_release_lines(f, out, skipped)
    return tuple(out), skipped


def _toolkit_row(f: str, e: dict[str, Any]) -> Toolkit:
    v = e.get("version")
    entry_version(f, v, v)
    basis = e.get("min_driver_basis", "table3")
    runfile = e.get("runfile_driver")
    windows = e.get("windows_min_driver")
    return Toolkit(str(v), e["linux_min_driver"], windows, e["source"], e.get("notes"), basis, runfile)


def _check_driver_floors(f: str, toolkits: list[Toolkit]) -> None:
    """Table 3 floors never go down; an 'unpublished' floor is null and its major has a minor-version
    floor (the only floor then known); a 'same-minor' floor is the newest earlier Table 3 value of its
    minor."""
    floors = _minor_floors()
    published = [t for t in toolkits if t.min_driver_basis != "unpublished"]
    for a, b in zip(published, published[1:], strict=False):
        if a.linux_min_driver is None or b.linux_min_driver is None:
            raise bad_entry(f, (b if b.linux_min_driver is None else a).version,
                            "only an 'unpublished' floor may be null")
        if Version(b.linux_min_driver) < Version(a.linux_min_driver):
            raise bad_entry(f, b.version,
                            f"Linux driver {b.linux_min_driver} lower than {a.version}'s {a.linux_min_driver}")
    for t in toolkits:
        mj = int(t.version.split(".")[0])
        if t.min_driver_basis == "unpublished":
            if t.linux_min_driver is not None:
                raise bad_entry(f, t.version, "an 'unpublished' floor must be null (NVIDIA publishes none)")
            if mj not in floors:
                raise bad_entry(f, t.version, f"an 'unpublished' floor needs the CUDA {mj}.x minor-version floor "
                                              "(minor_compat.json)")
        elif t.min_driver_basis == "same-minor":
            same = [x for x in published if x.major_minor == t.major_minor and x.min_driver_basis == "table3"
                    and Version(x.version) < Version(t.version)]
            if not same or same[-1].linux_min_driver != t.linux_min_driver:
                raise bad_entry(f, t.version,
                                "a 'same-minor' floor must equal the newest earlier Table 3 value of its minor")


def _check_release_lines(f: str, toolkits: list[Toolkit], skipped: dict[str, tuple[str, ...]]) -> None:
    """No gaps inside a release line: every minor from 0 to the last known one, except declared skips."""
    by_major: dict[int, set[int]] = {}
    for t in toolkits:
        mj, mn, _ = (int(x) for x in t.version.split("."))
        by_major.setdefault(mj, set()).add(mn)
    for mj, mins in by_major.items():
        skip = {int(x) for x in skipped.get(str(mj), ())}
        for mn in range(0, max(mins) + 1):
            if mn not in mins and mn not in skip:
                raise bad_entry(f, f"{mj}.{mn}", f"gap in the {mj}.x line: {mj}.{mn} missing and not in skipped_minors")
            if mn in mins and mn in skip:
                raise bad_entry(f, f"{mj}.{mn}", "listed as skipped but present")


def known_major_minors() -> set[str]:
    return {t.major_minor for t in _toolkit_data()[0]}


def known_versions() -> set[str]:
    return {t.version for t in _toolkit_data()[0]}


@functools.cache
def _minor_floors() -> dict[int, MinorCompatFloor]:
    f = "minor_compat.json"
    raw = load_raw(f)
    out: dict[int, MinorCompatFloor] = {}
    for e in raw["floors"]:
        mj = e["major"]
        if mj in out:
            raise bad_entry(f, mj, "major must be unique")
        windows = e.get("windows_min_driver")
        out[mj] = MinorCompatFloor(mj, e["linux_min_driver"], windows, e.get("below_branch"), e["source"])
    check_ascending(f, [str(k) for k in out])
    return out


@functools.cache
def _forward_compat() -> tuple[_RangeEntry, ...]:
    f = "forward_compat.json"
    raw = load_raw(f)
    out = []
    for e in raw["entries"]:
        key = e.get("cuda")
        branches = tuple(e["branches"])
        if not branches and not e.get("none_supported"):
            raise bad_entry(f, key, "an entry without branches must say why (none_supported)")
        eol = set(raw.get("end_of_life", {})) & set(branches)
        if eol:
            raise bad_entry(f, key, f"branch(es) {', '.join(sorted(eol))} reached end of life (end_of_life) "
                                    "and are no target")
        out.append(_RangeEntry(entry_specifier(f, key, key), branches, e["source"]))
    return tuple(out)


def check_archs(f: str, key: Any, archs: tuple[str, ...]) -> None:
    if list(archs) != sorted(set(archs), key=arch_key):
        raise bad_entry(f, key, "compute capabilities must be unique and ascending")


@functools.cache
def _archs() -> tuple[_RangeEntry, ...]:
    f = "archs.json"
    raw = load_raw(f)
    out = []
    for e in raw["entries"]:
        key = e.get("cuda")
        archs = tuple(e.get("archs", ()))
        check_archs(f, key, archs)
        out.append(_RangeEntry(entry_specifier(f, key, key), archs, e["source"]))
    return tuple(out)


@dataclass(frozen=True)
class WheelSet:
    """The nvidia-* wheels of one CUDA toolkit release on PyPI, by ``cuda-toolkit`` extra
    (cudart, cublas, nvcc, ...). ``naming``: "suffixed" (-cu11/-cu12 names) or "unsuffixed"
    (CUDA 13: nvidia-cuda-runtime, ...). ``meta_package``: the cuda-toolkit release they were
    read from, None where the toolkit predates that package."""
    toolkit: str
    naming: str
    meta_package: str | None
    extras: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
    source: str

    def has(self, extra: str) -> bool:
        return any(name == extra for name, _ in self.extras)

    def pins(self, *extras: str) -> tuple[str, ...]:
        """``name==version`` of every wheel the extras install, sorted and unique."""
        want = dict(self.extras)
        out = {f"{pkg}=={ver}" for e in extras if e in want for pkg, ver in want[e]}
        return tuple(sorted(out))

    def package(self, extra: str) -> str:
        """The wheel that carries an extra's main library (e.g. cudart -> nvidia-cuda-runtime-cu12)."""
        pkgs = [p for p, _ in dict(self.extras).get(extra, ())]
        return pkgs[0] if pkgs else ""


@dataclass(frozen=True)
class CudnnWheel:
    cuda: SpecifierSet
    cudnn: str  # major, as recipes spell cuda.cudnn
    wheel: str
    version: str
    source: str


@dataclass(frozen=True)
class _WheelData:
    releases: tuple[WheelSet, ...]
    cudnn: tuple[CudnnWheel, ...]
    absent: dict[str, str]  # CUDA major.minor -> why no wheels exist
    devel_extras: tuple[str, ...]
    devel_from: Version  # first CUDA whose nvcc wheel holds a working nvcc (not only ptxas)
    devel_source: str
    tiers: dict[str, tuple[str, ...]]  # base / runtime -> the cuda-toolkit extras NVIDIA's tier carries
    nccl: dict[str, str]  # CUDA major -> "nvidia-nccl-cuXX==version" (libnccl2 of the runtime tier)


@functools.cache
def _wheels() -> _WheelData:
    f = "wheels.json"
    raw = load_raw(f)
    known_versions()
    families = raw.get("families", {})
    releases = []
    for e in raw["releases"]:
        v = e.get("toolkit")
        entry_version(f, v, v)
        if _mm(str(v)) not in known_major_minors():
            raise bad_entry(f, v, "not of a known toolkit major.minor (toolkits.json)")
        fam = families.get(v.split(".")[0])
        if fam is None:
            raise bad_entry(f, v, "no 'families' entry for this CUDA major")
        extras = e.get("extras", {})
        rt = dict(extras.get("cudart", {}))
        rt_name = "nvidia-cuda-runtime" + fam["suffix"]
        if rt_name not in rt or not rt[rt_name].startswith(_mm(v) + "."):
            raise bad_entry(f, v, f"extra cudart must hold {rt_name} of the same major.minor")
        for extra, pkgs in extras.items():
            for pkg, ver in pkgs.items():
                entry_version(f, v, ver)
                if fam["naming"] == "suffixed" and pkg.startswith("nvidia-") and not pkg.endswith(fam["suffix"]):
                    raise bad_entry(f, v, f"{extra}: {pkg} lacks the {fam['suffix']} suffix of this family")
        releases.append(WheelSet(v, fam["naming"], e.get("meta_package"),
                                 tuple((x, tuple(sorted(p.items()))) for x, p in sorted(extras.items())),
                                 e["source"]))
    check_ascending(f, [r.toolkit for r in releases])
    cudnn = []
    for e in raw.get("cudnn", ()):
        key = f"cudnn {e.get('cudnn')} for {e.get('cuda')}"
        entry_version(f, key, e.get("version"))
        if not str(e.get("version")).startswith(f"{e.get('cudnn')}."):
            raise bad_entry(f, key, "version must be of the cudnn major it is listed under")
        cudnn.append(CudnnWheel(entry_specifier(f, key, e.get("cuda")), str(e["cudnn"]), e["wheel"], e["version"],
                                e["source"]))
    absent = {}
    for mm, why in raw.get("absent", {}).items():
        if any(_mm(r.toolkit) == mm for r in releases):
            raise bad_entry(f, mm, "listed as absent but has releases")
        absent[mm] = why["reason"]
    devel = raw.get("devel", {})
    tiers, nccl = _tiers_and_nccl(f, raw, releases)
    return _WheelData(tuple(releases), tuple(cudnn), absent, tuple(devel.get("extras", ())),
                      entry_version(f, "devel", devel.get("needs_nvcc_binary_from", "999")), devel.get("source", ""),
                      tiers, nccl)


def _tiers_and_nccl(f: str, raw: dict[str, Any],
                    releases: list[WheelSet]) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """wheels.json's image tiers (each extra one some release has) and its NCCL wheel per CUDA major."""
    tiers = {name: tuple(raw.get("tiers", {}).get(name, ())) for name in ("base", "runtime")}
    known_extras = {x for r in releases for x, _ in r.extras}
    for name, extras in tiers.items():
        if unknown := sorted(set(extras) - known_extras):
            raise bad_entry(f, f"tiers.{name}", f"not an extra of any cuda-toolkit release: {', '.join(unknown)}")
    nccl = {}
    for e in raw.get("nccl", ()):
        entry_version(f, f"nccl {e.get('major')}", e.get("version"))
        nccl[str(e["major"])] = f"{e['wheel']}=={e['version']}"
    if missing := sorted(set(raw.get("families", {})) - set(nccl), key=int):
        raise bad_entry(f, "nccl", f"no NCCL wheel for CUDA {', '.join(missing)} (the runtime tier carries NCCL)")
    return tiers, nccl


@functools.cache
def _coverage() -> None:
    """Cross-file check: every toolkit minor has CUDA wheels, an nvcc architecture list and
    nvidia/cuda images, or the file in question says why it deliberately has none."""
    from buildkit_py.compat.images import image_data  # noqa: PLC0415  # it reads tables: a top-level import would circle

    wheels = _wheels()
    archs = _archs()
    meta, images = image_data()
    img_absent = set(meta.get("absent", {}))
    by_minor: dict[str, list[str]] = {}
    for t in _toolkit_data()[0]:
        by_minor.setdefault(t.major_minor, []).append(t.version)
    for mm, versions in by_minor.items():
        if not any(_mm(r.toolkit) == mm for r in wheels.releases) and mm not in wheels.absent:
            raise bad_entry("wheels.json", mm, "toolkit minor without wheel releases and not listed under 'absent'")
        for v in versions:
            if not any(Version(v) in e.cuda for e in archs):
                raise bad_entry("archs.json", v, "toolkit without an nvcc architecture list")
        if not any(_mm(v) == mm for v in images) and not set(versions) <= img_absent:
            raise bad_entry("images.json", mm, "toolkit minor without nvidia/cuda images and not listed under 'absent'")


@dataclass(frozen=True)
class CudnnSupport:
    """One row of NVIDIA's cuDNN support matrix: a cuDNN major and the CUDA toolkits it supports."""
    cudnn: str
    cuda: SpecifierSet
    newest: str | None
    source: str


@functools.cache
def _cudnn_support() -> tuple[CudnnSupport, ...]:
    f = "cudnn.json"
    raw = load_raw(f)
    out = [CudnnSupport(str(e["cudnn"]), entry_specifier(f, e.get("cudnn"), e.get("cuda")), e.get("newest"),
                        e["source"]) for e in raw["majors"]]
    for w in _wheels().cudnn:  # a wheel row may not claim a CUDA the support matrix does not list
        for t in _toolkit_data()[0]:
            if Version(t.version) in w.cuda and not cudnn_supported(t.version, w.cudnn, rows=out):
                raise bad_entry("wheels.json", f"cudnn {w.cudnn} for {w.cuda}",
                                f"CUDA {t.version} is outside cuDNN {w.cudnn}'s support matrix (cudnn.json)")
    return tuple(out)


def cudnn_supported(cuda: str, cudnn: str, *, rows: list[CudnnSupport] | None = None) -> bool:
    """Does NVIDIA's support matrix list CUDA ``cuda`` for cuDNN major ``cudnn``?"""
    v = Version(_mm(str(cuda)))
    major = str(cudnn).split(".")[0]
    return any(r.cudnn == major and v in r.cuda for r in (rows if rows is not None else _cudnn_support()))


def cudnn_majors_for(cuda: str) -> tuple[str, ...]:
    """The cuDNN majors NVIDIA's support matrix lists for that CUDA, ascending."""
    v = Version(_mm(str(cuda)))
    return tuple(sorted({r.cudnn for r in _cudnn_support() if v in r.cuda}, key=int))


def cudnn_support(cudnn: str) -> tuple[CudnnSupport, ...]:
    """The support-matrix rows of one cuDNN major (empty: a major NVIDIA never published)."""
    return tuple(r for r in _cudnn_support() if r.cudnn == str(cudnn).split(".")[0])


DATA_FILES = ("toolkits.json", "minor_compat.json", "forward_compat.json", "images.json", "torch.json",
              "flash_attn.json", "bitsandbytes.json", "cxx_std.json", "archs.json", "wheels.json", "cudnn.json",
              "torch_cuda_pins.json", "platforms.json", "gpu_kernels.json", "wheel_kernels.json",
              "wheel_contents.json")


def _loaders() -> tuple[Any, ...]:
    """Every cached loader, in the order their invariants depend on each other."""
    from buildkit_py.compat import (  # noqa: PLC0415  # they read tables: a top-level import would circle
        bitsandbytes,
        cuda_pins,
        flash_attn,
        gpu_kernels,
        images,
        platforms,
        torch_data,
        torch_pins,
        wheel_contents,
    )

    return (_toolkit_data, _minor_floors, _forward_compat, images.image_data, torch_data._torch, flash_attn._flash_attn,
            bitsandbytes._bnb, torch_data._cxx_std, _archs, _wheels, _cudnn_support, torch_pins.rows, _coverage,
            platforms.data, gpu_kernels._gpu_kernels, gpu_kernels._wheel_kernels, _data_as_of,
            cuda_pins.wheel_owners, wheel_contents.model)


def validate_all() -> None:
    """Load every data file (raising CompatDataError on the first broken invariant)."""
    for load in _loaders():
        load()


def clear_caches() -> None:
    """Forget every loaded file (tests that serve other data; ``data refresh`` after writing)."""
    for load in _loaders():
        load.cache_clear()


# ----------------------------------------------------------------------------- public API
def toolkits() -> tuple[Toolkit, ...]:
    return _toolkit_data()[0]


def _cuda_gap(spec: str, reason: str) -> CompatGap:
    vs = [t.version for t in toolkits()]
    try:
        major = Version(spec).major
        same = [v for v in vs if Version(v).major == major]
    except InvalidVersion:
        same = []
    pick = (same or vs)[-1]
    return CompatGap("CUDA", spec, reason, nearest=nearest_versions(spec, vs),
                     hint=f"use a released CUDA toolkit, e.g. \"{_mm(pick)}\" (newest: {pick})")


def resolve_cuda(spec: str) -> Toolkit:
    """``"12.4"`` -> newest known 12.4.x; ``"12.4.1"`` exact; ``"12"`` or unknown -> CompatGap."""
    _coverage()
    spec = str(spec).strip()
    parts = spec.split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts) or len(parts) > 3:
        raise _cuda_gap(spec, "not major.minor or major.minor.patch")
    if len(parts) == 3:
        for t in toolkits():
            if Version(t.version) == Version(spec):
                return t
    else:
        matches = [t for t in toolkits() if t.major_minor == f"{int(parts[0])}.{int(parts[1])}"]
        if matches:
            return matches[-1]
    raise _cuda_gap(spec, "not a CUDA toolkit release imgbuild knows")


@dataclass(frozen=True)
class NativeEvidence:
    """The lowest driver known to run a toolkit natively where NVIDIA publishes no floor for it:
    ``driver``, and ``why`` (which installer bundles it, or which newer toolkit's floor it is)."""
    driver: str
    why: str


def known_native_driver(version: str) -> NativeEvidence | None:
    """For a toolkit without a published floor: the lowest driver known to run it natively. A driver
    runs natively every CUDA minor up to the one it was released for, so the evidence is a driver
    bundled with an installer of the same minor, or the published floor of any later minor. None
    where neither exists (or where the floor is published: that floor is the answer)."""
    tk = resolve_cuda(version)
    if tk.native_floor_known:
        return None
    v_mm = Version(tk.major_minor)
    found: list[NativeEvidence] = []
    for t in toolkits():
        t_mm = Version(t.major_minor)
        if t_mm == v_mm and t.runfile_driver:
            found.append(NativeEvidence(t.runfile_driver, f"the driver NVIDIA's CUDA {t.version} installer bundles"))
        elif t_mm > v_mm and t.linux_min_driver:
            found.append(NativeEvidence(t.linux_min_driver, f"CUDA {t.version}'s published minimum, which covers "
                                                            f"every earlier CUDA minor"))
    return min(found, key=lambda e: Version(e.driver)) if found else None


def minor_compat_floor(major: int) -> str | None:
    floor = _minor_floors().get(int(major))
    return floor.linux_min_driver if floor else None


def minor_compat(major: int) -> MinorCompatFloor | None:
    return _minor_floors().get(int(major))


def driver_branch_end_of_life(branch: str) -> str | None:
    """``"July 2024"`` where NVIDIA's data-center driver pages list the branch as ended, else None."""
    _forward_compat()
    entry = load_raw("forward_compat.json").get("end_of_life", {}).get(str(branch))
    return entry["eol"] if entry else None


def forward_compat_branches(cuda: str) -> tuple[str, ...]:
    v = Version(resolve_cuda(cuda).version)
    out: list[str] = []
    for e in _forward_compat():
        if v in e.cuda:
            out.extend(b for b in e.values if b not in out)
    return tuple(sorted(out, key=int))


def data_files_as_of() -> dict[str, str | None]:
    """Each shipped data file's "as of" date (None where the file records none)."""
    return {name: load_raw(name).get("as_of") for name in DATA_FILES}


def cuda_archs(cuda: str) -> tuple[str, ...]:
    """Compute capabilities nvcc of that toolkit targets (with a/f variants); CompatGap where
    no list is recorded."""
    v = Version(resolve_cuda(cuda).version)
    for e in _archs():
        if v in e.cuda:
            return e.values
    raise CompatGap("nvcc architecture list for CUDA", cuda, "no list recorded",
                    nearest=tuple(str(e.cuda) for e in _archs()))


def all_cuda_wheel_sets() -> tuple[WheelSet, ...]:
    """Every toolkit release's PyPI wheels wheels.json records, oldest first."""
    return _wheels().releases


def cuda_wheel_sets(cuda: str) -> tuple[WheelSet, ...]:
    """The PyPI wheel releases of a CUDA major.minor (or of one exact X.Y.Z), oldest first."""
    parts = str(cuda).split(".")
    known = known_versions()  # a release of a patch toolkits.json lacks is no answer
    if len(parts) >= 3:
        return tuple(r for r in _wheels().releases if Version(r.toolkit) == Version(cuda) and r.toolkit in known)
    return tuple(r for r in _wheels().releases if _mm(r.toolkit) == _mm(str(cuda)) and r.toolkit in known)


def cuda_wheel_set(cuda: str) -> WheelSet:
    """The wheels of that toolkit (X.Y: its newest release with wheels); CompatGap with the
    nearest toolkits that have wheels and a hint naming the newest that fits."""
    hits = cuda_wheel_sets(cuda)
    if hits:
        return hits[-1]
    data = _wheels()
    have = [r.toolkit for r in data.releases]
    same = [t for t in have if _mm(t) == _mm(str(cuda))]
    why = data.absent.get(_mm(str(cuda)))
    if same:
        reason = f"PyPI has wheels for {', '.join(same)} of this line, not for {cuda}"
        hint = f"use cuda.version \"{same[-1]}\" (or \"{_mm(same[-1])}\") for source: wheels"
    else:
        reason = why or "no PyPI CUDA wheel versions recorded"
        newer = [t for t in have if Version(t).major == Version(str(cuda)).major]
        pick = newer[-1] if newer else have[-1]
        hint = f"use cuda.version \"{_mm(pick)}\" (newest with wheels: {pick}) or cuda.source: nvidia"
    raise CompatGap("PyPI CUDA wheels for CUDA", cuda, reason, nearest=nearest_versions(str(cuda), have), hint=hint)


def cudnn_wheel(cuda: str, cudnn: str) -> CudnnWheel:
    """The nvidia-cudnn wheel for a cuDNN major on that CUDA; CompatGap listing the majors there are."""
    v = Version(str(cuda))
    fits = [c for c in _wheels().cudnn if v in c.cuda]
    for c in fits:
        if c.cudnn == str(cudnn).split(".")[0]:
            return c
    majors = [c.cudnn for c in fits]
    raise CompatGap("cuDNN wheel", cudnn, f"PyPI has no nvidia-cudnn wheel of that major for CUDA {cuda}",
                    nearest=tuple(majors), hint=f"use cudnn: \"{majors[-1]}\"" if majors else "drop cuda.cudnn")


def cudnn_wheel_majors(cuda: str) -> tuple[str, ...]:
    v = Version(str(cuda))
    return tuple(c.cudnn for c in _wheels().cudnn if v in c.cuda)


def devel_wheel_extras(cuda: str) -> tuple[str, ...]:
    """The cuda-toolkit extras that make a devel toolkit (nvcc, headers, math libraries) from
    wheels, for toolkits whose nvcc wheel holds nvcc itself; CompatGap where it holds only ptxas."""
    data = _wheels()
    ws = cuda_wheel_set(cuda)
    if Version(ws.toolkit) < data.devel_from:
        newest = data.releases[-1].toolkit
        raise CompatGap("devel toolkit from wheels for CUDA", ws.toolkit,
                        f"the nvidia-cuda-nvcc wheels of CUDA < {data.devel_from} hold ptxas only, no nvcc "
                        f"({data.devel_source.split(':')[0]})",
                        hint=f"use cuda.source: nvidia (a devel image), or CUDA >= {data.devel_from} "
                             f"(newest with wheels: {newest})")
    return tuple(x for x in data.devel_extras if ws.has(x))


def tier_extras(flavor: str, cuda: str) -> tuple[str, ...]:
    """The cuda-toolkit extras NVIDIA's ``flavor`` tier carries that this CUDA's wheels have:
    base (cudart), runtime (the runtime libraries), devel (runtime plus nvcc, headers and the
    compiler's parts; CompatGap where that CUDA's wheels hold no nvcc)."""
    data = _wheels()
    ws = cuda_wheel_set(cuda)
    extras = data.tiers["runtime"] if flavor in ("runtime", "devel") else data.tiers["base"]
    if flavor == "devel":
        extras = tuple(dict.fromkeys(extras + devel_wheel_extras(cuda)))
    return tuple(x for x in extras if ws.has(x))


def nccl_pin(cuda: str) -> str:
    """The NCCL wheel of the runtime tier for that CUDA's major (``nvidia-nccl-cu12==2.32.3``)."""
    return _wheels().nccl[str(cuda).split(".", maxsplit=1)[0]]


def cuda_wheel_home(cuda: str) -> str | None:
    """Where that CUDA's wheels lay out one toolkit tree, relative to site-packages (nvidia/cu13)."""
    prefix: dict[str, str] = load_raw("wheels.json").get("devel", {}).get("prefix", {})
    return prefix.get(str(cuda).split(".")[0])


def data_as_of() -> str:
    """The date the shipped data was last read from its sources."""
    return _data_as_of()


@functools.cache
def _data_as_of() -> str:
    """Once per process: every refusal that rests on the data names it, and reading the files again
    for each cost ~30 ms a refusal (tests/test_plan_space.py plans thousands)."""
    dates = [load_raw(n).get("as_of") for n in DATA_FILES]
    return "as of " + max((d for d in dates if d), default="an unknown date")


def cuda_runtime_wheels(cuda: str) -> dict[str, str]:
    """Package -> version of every wheel of that toolkit's release (all extras)."""
    ws = cuda_wheel_set(cuda)
    return dict(p.split("==") for p in ws.pins(*dict(ws.extras)))


def data_sources() -> dict[str, str]:
    return {name: load_raw(name)["source"] for name in DATA_FILES}
