"""The flash-attn rule (the 6th of ``rules``): a flash-attn pin against torch, CUDA, Python and the
architectures, as its release wheel where one fits, else as a source build; the data it reads is
compat/flash_attn.py."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

from buildkit_py import compat
from buildkit_py.compat.flash_attn import FlashAttnRelease
from buildkit_py.compat.rules import (
    cuda_in,
    fitting_words,
    newest_hint,
    pinned_release,
    pip_pin,
    refusal_at,
)
from buildkit_py.compat.torch_rule import torch_cxx11_abi
from buildkit_py.recipe.model import Recipe
from buildkit_py.versions import major_minor as _mm  # short: it sits in many messages


@dataclass(frozen=True)
class FlashAttnPart:
    compile: frozenset[str] = frozenset()  # {"flash-attn"} when it builds from source
    prebuilt: tuple[tuple[str, str], ...] = ()  # (package, wheel URL) taken instead of building


def flash_attn_wheel_url(fa_version: str, wheel_cuda: str, torch_mm: str, python: str, torch_version: str) -> str:
    """The GitHub release wheel flash-attn's own setup.py would fetch for this combination."""
    abi = "TRUE" if torch_cxx11_abi(torch_version) else "FALSE"
    cu = "cu" + wheel_cuda.replace(".", "")
    py = "cp" + python.replace(".", "")
    return (f"https://github.com/Dao-AILab/flash-attention/releases/download/v{fa_version}/"
            f"flash_attn-{fa_version}+{cu}torch{torch_mm}cxx11abi{abi}-{py}-{py}-linux_x86_64.whl")
def flash_attn_rule(recipe: Recipe, cuda: str, python: str, torch: str | None, archs: tuple[str, ...]) -> FlashAttnPart:
    """A flash-attn pin must fit torch, CUDA, Python and the architectures; it comes as its
    GitHub release wheel where its release workflow built one for that combination whose SASS
    runs on every build.cuda_arch, else it builds from source, which its C++ standard and the
    toolkit's nvcc must allow."""
    fa = pip_pin(recipe, "flash-attn")
    if not fa:
        return FlashAttnPart()
    i, version = fa
    key = f"pip[{i}]"
    rel = _check_flash_attn(recipe, key, version, cuda, python, torch)
    for j, arch in enumerate(archs):
        if compat.arch_base(arch) not in rel.archs:
            raise refusal_at(recipe, f"build.cuda_arch[{j}]", "flash-attn", version, "cuda_arch", arch,
                             f"flash-attn {version} runs on compute capabilities {', '.join(rel.archs)}",
                             hint="FlashAttention 2 needs Ampere (8.0) or newer")
    torch_version = torch or ""  # _check_flash_attn refused a recipe without torch
    wheel = None if "flash-attn" in recipe.build.from_source else compat.flash_attn_prebuilt(
        version, cuda, _mm(torch_version), python, archs=tuple(compat.arch_base(a) for a in archs),
        cxx11abi=torch_cxx11_abi(torch_version))
    if wheel is None:
        _check_flash_attn_source_build(recipe, key, rel, cuda, python, torch_version, archs)
        return FlashAttnPart(compile=frozenset({"flash-attn"}))
    url = flash_attn_wheel_url(version, wheel.cuda, _mm(torch_version), python, torch_version)
    return FlashAttnPart(prebuilt=(("flash-attn", url),))


def fa_fits(cuda: str, python: str, torch: str | None) -> list[str]:
    """The fully recorded flash-attn releases that accept this CUDA, Python and torch, ascending; with
    torch, only those that install here: a release wheel for the combination, or a source build whose
    C++ standard torch's headers accept (_check_flash_attn_source_build)."""
    need = compat.torch_cxx_std(torch) if torch else None
    out = []
    for r in compat.flash_attn_releases():
        if r.partial or not cuda_in(r.cuda, cuda) or python not in r.python or (torch and torch not in r.torch):
            continue
        if torch and need is not None and r.cxx_std is not None and need > r.cxx_std and compat.flash_attn_prebuilt(
                r.version, cuda, _mm(torch), python, cxx11abi=torch_cxx11_abi(torch)) is None:
            continue
        out.append(r.version)
    return out


def _flash_attn_fit_hint(version: str, cuda: str, python: str, torch: str, wants: str) -> str:
    """The fully recorded flash-attn release nearest the pin that fits the rest of the recipe (not the
    newest, never one that clashes with torch, CUDA or Python); none: keep the pin, move the other side."""
    fits = fa_fits(cuda, python, torch)
    if not fits:
        return f"no flash-attn release imgbuild knows fits torch {torch}, CUDA {_mm(cuda)} and Python {python}: " \
               f"keep flash-attn {version} and move to {wants}"
    nearest = compat.nearest_versions(version, fits, n=1)[0]
    return f"use flash-attn=={nearest} (the nearest release that fits torch {torch}, CUDA {_mm(cuda)} and " \
           f"Python {python})"


def _check_flash_attn(recipe: Recipe, key: str, version: str, cuda: str, python: str,
                      torch: str | None) -> FlashAttnRelease:
    rel = pinned_release(recipe, key, "flash-attn", version, compat.flash_attn_release, compat.flash_attn_releases,
                         fa_fits)
    if rel.partial:
        fits = fa_fits(cuda, python, torch)
        newest = sorted(fits, key=Version, reverse=True)[:4]
        raise refusal_at(recipe, key, "flash-attn", version, "imgbuild's flash-attn table", compat.data_as_of(),
                         f"flash-attn {version} is {rel.partial}",
                         hint=f"use flash-attn {', '.join(newest)} (the newest fully recorded that fit"
                         f"{f' torch {torch},' if torch else ''} CUDA {_mm(cuda)} and Python {python})" if fits else
                         newest_hint("flash-attn", [r.version for r in compat.flash_attn_releases() if not r.partial],
                                     fitting_words(cuda, python, torch)),
                         partial=True)
    if not torch:
        raise refusal_at(recipe, key, "flash-attn", version, "torch", "(none)",
                         "flash-attn builds against torch", hint="pin torch: in the recipe")
    if torch not in rel.torch:
        raise refusal_at(recipe, key, "flash-attn", version, "torch", torch,
                         f"flash-attn {version} supports torch {rel.torch}",
                         hint=_flash_attn_fit_hint(version, cuda, python, torch, f"torch {rel.torch}"))
    if cuda not in rel.cuda and _mm(cuda) not in rel.cuda:
        raise refusal_at(recipe, key, "flash-attn", version, "cuda", cuda,
                         f"flash-attn {version} supports CUDA {rel.cuda}",
                         hint=_flash_attn_fit_hint(version, cuda, python, torch, f"CUDA {rel.cuda}"))
    if python not in rel.python:
        raise refusal_at(recipe, key, "flash-attn", version, "python", python,
                         f"flash-attn {version} supports Python {rel.python}",
                         hint=_flash_attn_fit_hint(version, cuda, python, torch, f"a Python in {rel.python}"))
    return rel


def _check_flash_attn_source_build(recipe: Recipe, key: str, rel: FlashAttnRelease, cuda: str, python: str,
                                   torch: str, archs: tuple[str, ...]) -> None:
    """A source build compiles as the C++ standard flash-attn's setup.py passes (-std=c++17 for
    nvcc and the host compiler), which torch's headers must accept; and only the SASS targets
    setup.py compiles with this toolkit's nvcc (sm_100/sm_120 from 12.8)."""
    need = compat.torch_cxx_std(torch)
    if need is not None and rel.cxx_std is not None and need > rel.cxx_std:
        older = [t.version for t in compat.torch_releases()
                 if (compat.torch_cxx_std(t.version) or need) <= rel.cxx_std and t.version in rel.torch
                 and python in t.python and _mm(cuda) in t.variants.values()]
        newer_fa = [r.version for r in compat.flash_attn_releases()
                    if not r.partial and (r.cxx_std or 0) >= need and torch in r.torch]
        hints = []
        if newer_fa:
            hints.append(f"use flash-attn {', '.join(sorted(newer_fa, key=Version, reverse=True)[:3])} "
                         f"(compiles as C++{need})")
        if older:
            hints.append(f"use torch {', '.join(sorted(older, key=Version, reverse=True)[:3])} "
                         f"(the newest whose headers compile as C++{rel.cxx_std}, with a CUDA {_mm(cuda)} build)")
        else:
            any_older = [t.version for t in compat.torch_releases()
                         if (compat.torch_cxx_std(t.version) or need) <= rel.cxx_std and t.version in rel.torch]
            if any_older:
                hints.append(f"use torch {max(any_older, key=Version)} (the newest whose headers compile as "
                             f"C++{rel.cxx_std}) with a CUDA it has a build for")
        if not newer_fa:
            hints.append(f"no flash-attn release imgbuild knows compiles as C++{need}")
        raise refusal_at(recipe, key, "flash-attn", rel.version, "torch", torch,
                         f"flash-attn {rel.version} builds from source here and its setup.py compiles as "
                         f"-std=c++{rel.cxx_std}, but torch {torch}'s headers need C++{need} "
                         f"('#error C++{need} or later compatible compiler is required')",
                         hint="; ".join(hints))
    sms = rel.sms(cuda)
    for j, arch in enumerate(archs):
        if not any(compat.sass_runs_on(sm, arch) for sm in sms):
            raise refusal_at(recipe, f"build.cuda_arch[{j}]", "flash-attn", rel.version, "cuda", cuda,
                             f"flash-attn {rel.version} builds from source here, and its setup.py compiles "
                             f"{', '.join('sm_' + sm.replace('.', '') for sm in sms) or 'no SASS'} with nvcc "
                             f"{_mm(cuda)}: nothing runs on {arch}",
                             hint="use a CUDA whose nvcc flash-attn compiles that architecture with "
                                  "(sm_100/sm_120: 12.8+)")
