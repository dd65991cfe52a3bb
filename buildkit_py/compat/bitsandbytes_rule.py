"""The bitsandbytes rule (the 7th of ``rules``): a bitsandbytes pin against CUDA, Python, torch and the
architectures (its CUDA binaries, LLM.int8()'s compute capability floor); the data it reads is
compat/bitsandbytes.py."""

from __future__ import annotations

from packaging.version import Version

from buildkit_py import compat
from buildkit_py.compat import codes
from buildkit_py.compat.bitsandbytes import BnbRelease
from buildkit_py.compat.codes import RecipeWarning
from buildkit_py.compat.rules import (
    Warnings,
    cuda_in,
    describe_cuda,
    fitting_words,
    newest_hint,
    pinned_release,
    pip_pin,
    refusal_at,
)
from buildkit_py.compat.wheel_contents import model
from buildkit_py.recipe.model import Recipe
from buildkit_py.versions import major_minor as _mm  # short: it sits in many messages


def bitsandbytes_rule(recipe: Recipe, cuda: str, python: str, torch: str | None, archs: tuple[str, ...]) -> Warnings:
    """A bitsandbytes pin must ship binaries for the CUDA, accept the Python and torch, and
    have kernels for every architecture; LLM.int8() needs a newer GPU than the rest."""
    bnb = pip_pin(recipe, "bitsandbytes")
    if not bnb:
        return ()
    i, version = bnb
    rel = _check_bitsandbytes(recipe, f"pip[{i}]", version, cuda, python, torch)
    warnings = []
    for j, arch in enumerate(archs):
        cc = compat.arch_base(arch)
        if rel.min_compute_capability and Version(cc) < Version(rel.min_compute_capability):
            raise refusal_at(recipe, f"build.cuda_arch[{j}]", "bitsandbytes", version, "cuda_arch", arch,
                             f"bitsandbytes {version}'s PyPI wheel has kernels for compute capability "
                             f"{rel.min_compute_capability} and newer",
                             hint=f"drop {arch}" + (" or build bitsandbytes from source"
                                                    if model().has_sdist("bitsandbytes", version) is not False
                                                    else f" (bitsandbytes {version} has no sdist to build from)"))
        # below the LLM.int8() floor (cuBLASLt's, 7.5) the loader opens the _nocublaslt library
        below_lt = rel.int8_compute_capability and Version(cc) < Version(rel.int8_compute_capability)
        if rel.cuda_nocublaslt is not None and below_lt and not cuda_in(rel.cuda_nocublaslt, cuda):
            raise refusal_at(recipe, f"build.cuda_arch[{j}]", "bitsandbytes", version, "cuda_arch", arch,
                             f"bitsandbytes {version} loads "
                             f"libbitsandbytes_cuda{_mm(cuda).replace('.', '')}_nocublaslt.so "
                             f"below compute capability {rel.int8_compute_capability}, and its wheel has that library "
                             "only for CUDA "
                             f"{describe_cuda(rel.cuda_nocublaslt)}",
                             hint=_bnb_hint(cuda, python, torch))
        if rel.int8_compute_capability and Version(cc) < Version(rel.int8_compute_capability):
            warnings.append(RecipeWarning(
                codes.BNB_INT8_ARCH, f"build.cuda_arch[{j}]",
                f"bitsandbytes: LLM.int8() needs compute capability {rel.int8_compute_capability}+; "
                f"on {arch} only 8-bit optimizers and NF4/FP4 quantization work"))
    return tuple(warnings)


def _check_bitsandbytes(recipe: Recipe, key: str, version: str, cuda: str, python: str,
                        torch: str | None) -> BnbRelease:
    rel = pinned_release(recipe, key, "bitsandbytes", version, compat.bitsandbytes_release,
                         compat.bitsandbytes_releases, bnb_fits)
    if rel.partial:
        raise refusal_at(recipe, key, "bitsandbytes", version, "imgbuild's bitsandbytes table", compat.data_as_of(),
                         f"bitsandbytes {version} is known only in part: {rel.partial}",
                         hint=_bnb_hint(cuda, python, torch), partial=True)
    if not cuda_in(rel.cuda, cuda):
        raise refusal_at(recipe, key, "bitsandbytes", version, "cuda", cuda,
                         f"bitsandbytes {version} ships CUDA binaries for {describe_cuda(rel.cuda)}",
                         hint=_bnb_nearest_hint(version, cuda, python, torch) or
                         f"use a CUDA it ships binaries for ({describe_cuda(rel.cuda)}); no bitsandbytes release "
                         f"imgbuild knows fits {fitting_words(cuda, python, torch)}")
    if python not in rel.python:
        raise refusal_at(recipe, key, "bitsandbytes", version, "python", python,
                         f"bitsandbytes {version} supports Python {rel.python}",
                         hint=_bnb_nearest_hint(version, cuda, python, torch) or f"use a Python in {rel.python}")
    if torch and rel.torch and torch not in rel.torch:
        fits = bnb_fits(cuda, python, torch)
        raise refusal_at(recipe, key, "bitsandbytes", version, "torch", torch,
                         f"bitsandbytes {version} requires torch {rel.torch}",
                         hint=(f"use bitsandbytes=={fits[-1]} (the newest that accepts torch {torch})"
                               if fits else f"use a torch in {rel.torch}"))
    return rel


def bnb_fits(cuda: str, python: str, torch: str | None) -> list[str]:
    """The fully recorded bitsandbytes releases that accept this CUDA, Python and torch, ascending."""
    return [r.version for r in compat.bitsandbytes_releases() if not r.partial and cuda_in(r.cuda, cuda)
            and python in r.python and (not torch or torch in r.torch)]


def _bnb_nearest_hint(version: str, cuda: str, python: str, torch: str | None) -> str | None:
    """The fully recorded bitsandbytes release nearest the pin that fits CUDA, Python and torch (None: none)."""
    fits = bnb_fits(cuda, python, torch)
    if not fits:
        return None
    return (f"use bitsandbytes=={compat.nearest_versions(version, fits, n=1)[0]} (the nearest release that fits "
            f"{fitting_words(cuda, python, torch)})")


def _bnb_hint(cuda: str, python: str, torch: str | None) -> str:
    fits = bnb_fits(cuda, python, torch)
    if fits:
        return f"use bitsandbytes=={fits[-1]} (the newest that fits CUDA {_mm(cuda)}" + \
            (f" and torch {torch})" if torch else ")")
    return newest_hint("bitsandbytes", [r.version for r in compat.bitsandbytes_releases() if not r.partial],
                       fitting_words(cuda, python, torch))
