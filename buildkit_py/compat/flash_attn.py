"""flash-attn's releases (flash_attn.json): each release's torch, CUDA and Python ranges, the
SASS its setup.py compiles with each nvcc, its GitHub release wheels, and what a source build
must be told to compile only the architectures a recipe asks for."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from buildkit_py.compat.tables import (
    arch_base,
    bad_entry,
    check_archs,
    check_ascending,
    entry_specifier,
    entry_version,
    load_raw,
    sass_runs_on,
)
from buildkit_py.versions import major_minor as _mm  # short: it sits in many messages


@dataclass(frozen=True)
class PrebuiltWheel:
    """One group of flash-attn's GitHub release wheels, as its release workflow (publish.yml)
    builds them: the CUDA in the wheel's name (``12`` for cu12, ``12.3`` for cu123), the torch
    major.minor in it, the toolkit whose nvcc compiled it, the torch release it was built
    against, and the CPython versions and C++ ABIs built."""
    cuda: str
    torch: str
    python: tuple[str, ...]
    cxx11abi: tuple[bool, ...]
    build_cuda: str
    torch_build: str


@dataclass(frozen=True)
class FlashAttnRelease:
    """``gencode``: setup.py's SASS targets, each with the nvcc versions that compile it (sm_90
    only from nvcc 11.8, sm_100/sm_120 only from 12.8); ``cxx_std``: the C++ standard setup.py
    compiles the extension as. ``partial`` says why a row lacks the build facts (a release known
    from the package index only): plans refuse such a release."""
    version: str
    torch: SpecifierSet
    cuda: SpecifierSet
    python: SpecifierSet
    archs: tuple[str, ...]
    prebuilt: tuple[PrebuiltWheel, ...]
    source: str
    notes: str | None = None
    cxx_std: int | None = None
    gencode: tuple[tuple[str, SpecifierSet], ...] = ()
    partial: str | None = None

    def sms(self, nvcc: str) -> tuple[str, ...]:
        """The SASS targets setup.py compiles with that nvcc (a wheel's, or the recipe's toolkit)."""
        v = Version(str(nvcc))
        return tuple(sm for sm, spec in self.gencode if spec.contains(v, prereleases=True))


_FA_BUILD_KEYS = ("torch", "cuda", "archs", "cxx_std", "gencode")


@functools.cache
def _flash_attn() -> tuple[FlashAttnRelease, ...]:
    f = "flash_attn.json"
    raw = load_raw(f)
    out = [_flash_attn_row(f, e) for e in raw["releases"]]
    check_ascending(f, [r.version for r in out])
    return tuple(out)


def _flash_attn_row(f: str, e: dict[str, Any]) -> FlashAttnRelease:
    v = e.get("version")
    partial = e.get("partial")
    missing = [k for k in _FA_BUILD_KEYS if k not in e]
    if missing and not partial:
        raise bad_entry(f, v, f"no {', '.join(missing)}: a row without them must say why (partial)")
    archs = tuple(e.get("archs", ()))
    check_archs(f, v, archs)
    gencode = tuple((g["sm"], entry_specifier(f, v, g["nvcc"])) for g in e.get("gencode", ()))
    check_archs(f, v, tuple(sm for sm, _ in gencode))
    pre = []
    for p in e.get("prebuilt", ()):
        key = f"{v} prebuilt cu{p['cuda']} torch {p['torch_build']}"
        build, built = entry_version(f, key, p["build_cuda"]), entry_version(f, key, p["torch_build"])
        if f"{built.major}.{built.minor}" != p["torch"]:
            raise bad_entry(f, key, f"built against torch {built}, named torch{p['torch']}")
        if str(build.major) != p["cuda"].split(".")[0]:
            raise bad_entry(f, key, f"compiled with CUDA {build}, named cu{p['cuda']}")
        if list(p["python"]) != sorted(set(p["python"]), key=Version) or not p["cxx11abi"]:
            raise bad_entry(f, key, "python must be unique and ascending, cxx11abi not empty")
        pre.append(PrebuiltWheel(p["cuda"], p["torch"], tuple(p["python"]), tuple(p["cxx11abi"]), str(build),
                                 str(built)))
    return FlashAttnRelease(str(v), entry_specifier(f, v, e.get("torch")), entry_specifier(f, v, e.get("cuda")),
                            entry_specifier(f, v, e.get("python")), archs, tuple(pre), e["source"], e.get("notes"),
                            e.get("cxx_std"), gencode, partial)


def flash_attn_arch_env() -> str:
    """The environment variable flash-attn's setup.py reads for the gencodes it compiles."""
    return str(load_raw("flash_attn.json")["arch_env"]["name"])


def flash_attn_compiled(version: str, archs: tuple[str, ...], nvcc: str) -> tuple[str, ...]:
    """The SASS a source build of flash-attn ``version`` by ``nvcc`` compiles when imgbuild sets
    ``flash_attn_build_env`` for ``archs`` (build.cuda_arch): from 2.7.3 each arch's newest gencode
    of its major at or below it (sm_80 runs on 8.6 and 8.9); before, setup.py's whole gencode list
    that this nvcc compiles, whatever the recipe asks: its ``-gencode`` flags make torch's
    cpp_extension ignore TORCH_CUDA_ARCH_LIST (``_get_cuda_arch_flags`` returns nothing when a flag
    names an arch). Never PTX: setup.py passes only ``code=sm_XY``."""
    env = load_raw("flash_attn.json")["arch_env"]
    usable = flash_attn_release(version).sms(nvcc)
    if Version(version) < Version(env["since"]):
        return tuple(sorted(usable, key=Version))
    picked: set[str] = set()
    for arch in archs:
        base = Version(arch_base(arch))
        same = [sm for sm in usable if Version(sm).major == base.major and Version(sm) <= base]
        if same:
            picked.add(max(same, key=Version))
    return tuple(sorted(picked, key=Version))


def flash_attn_build_env(version: str, archs: tuple[str, ...], nvcc: str) -> tuple[tuple[str, str], ...]:
    """What a source build of flash-attn ``version`` by ``nvcc`` must be told so that it compiles SASS
    for ``archs`` (build.cuda_arch, 8.6 or 9.0+PTX) and no more (``flash_attn_compiled``): from 2.7.3
    its setup.py compiles only the gencodes FLASH_ATTN_CUDA_ARCHS lists (flash_attn.json ``arch_env``;
    default every one of them). Before 2.7.3 setup.py reads no such setting: ()."""
    env = load_raw("flash_attn.json")["arch_env"]
    if Version(version) < Version(env["since"]):
        return ()
    picked = flash_attn_compiled(version, archs, nvcc)
    return ((env["name"], ";".join(sm.replace(".", "") for sm in picked)),) if picked else ()


def flash_attn_release(version: str) -> FlashAttnRelease:
    for r in _flash_attn():
        if Version(r.version) == Version(version):
            return r
    raise LookupError(f"unknown flash-attn release {version!r}; known: {', '.join(r.version for r in _flash_attn())}")


def flash_attn_prebuilt(version: str, cuda: str, torch: str, python: str, *, archs: tuple[str, ...] = (),
                        cxx11abi: bool | None = None) -> PrebuiltWheel | None:
    """The GitHub release wheel flash-attn's publish workflow built for (torch's CUDA, torch
    major.minor, Python, C++ ABI), whose SASS runs on every compute capability in ``archs``;
    None where no such wheel was built (then it builds from source).

    The CUDA in the wheel's name is the one setup.py's get_wheel_url asks for: the build of
    torch's own CUDA major.minor where the release has one (2.0-2.2 built cu116/cu117/cu118 and
    cu121/cu122), else the release's only build of that CUDA major (cu118 and cu122/cu123 for
    2.3-2.6, cu12 from 2.7). Wheels built against a torch pre-release are not taken."""
    rel = flash_attn_release(version)
    if rel.partial:
        return None
    cuda_mm, major = _mm(str(cuda)), str(cuda).split(".")[0]
    torch_mm, py = _mm(str(torch)), _mm(str(python))
    labels = {w.cuda for w in rel.prebuilt if w.cuda.split(".")[0] == major}
    label = cuda_mm if cuda_mm in labels else (labels.pop() if len(labels) == 1 else None)
    for w in rel.prebuilt:
        if (w.cuda == label and w.torch == torch_mm and py in w.python and not Version(w.torch_build).is_prerelease
                and (cxx11abi is None or cxx11abi in w.cxx11abi)
                and all(any(sass_runs_on(sm, a) for sm in rel.sms(w.build_cuda)) for a in archs)):
            return w
    return None


def flash_attn_releases() -> tuple[FlashAttnRelease, ...]:
    return _flash_attn()
