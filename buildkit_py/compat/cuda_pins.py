"""A ``pip:`` pin of one of NVIDIA's CUDA library wheels (nvidia-cublas-cu12, nvidia-cuda-runtime, ...)
must belong to the image's CUDA, and must not be another version of a wheel torch requires.

Which CUDA a wheel version belongs to is read from wheels.json (each toolkit release's wheels, read
from the cuda-toolkit meta package's METADATA on the package index), not guessed from its number:
nvidia-cublas-cu12 12.1.3.1 is CUDA 12.1's cuBLAS, and an image labelled CUDA 12.4 with it inside
would not be what its label says. The pin is installed after the toolkit's own wheels and replaces
them, so the plan refuses it before building, naming the version of that library for the image's CUDA.
"""

from __future__ import annotations

import functools

from packaging.utils import canonicalize_name

from buildkit_py import compat
from buildkit_py.compat.rules import refusal_at
from buildkit_py.compat.torch_rule import TorchPart
from buildkit_py.recipe.model import Recipe, pin_name
from buildkit_py.versions import major_minor as _mm  # short: it sits in messages


def cuda_pins_rule(recipe: Recipe, cuda: str, torch: TorchPart) -> None:
    """Refuse a pip pin of a CUDA library wheel of another CUDA minor than ``cuda``, or of another
    version than the one torch's wheel requires (pip would replace torch's, which it was built with)."""
    owners = wheel_owners()
    torch_pins = _torch_pins(torch)
    for i, spec in enumerate(recipe.pip):
        if "==" not in spec:
            continue
        name = canonicalize_name(pin_name(spec))
        version = spec.split("==", 1)[1].strip()
        if name.startswith("nvidia-cudnn"):
            continue  # the cuDNN has its own rule (cudnn_source): not tied to one CUDA minor
        if name in torch_pins and torch_pins[name] != version:
            raise refusal_at(recipe, f"pip[{i}]", name, version, "torch", torch.label or "",
                             f"torch {torch.label} requires {name}=={torch_pins[name]} (its wheel's METADATA); "
                             "the pin would replace the library torch was built with",
                             hint=f"drop pip[{i}] (torch brings {name}=={torch_pins[name]})")
        toolkits = owners.get((name, version))
        if not toolkits or any(_mm(t) == _mm(cuda) for t in toolkits):
            continue  # of this CUDA, or a version wheels.json does not record (e.g. a newer patch)
        raise refusal_at(recipe, f"pip[{i}]", name, version, "cuda", cuda,
                         f"{name}=={version} is the CUDA {_mm(toolkits[-1])} release of that library "
                         f"(the cuda-toolkit {toolkits[-1]} wheels), and the image's CUDA is {_mm(cuda)}",
                         hint=_hint(i, name, cuda))


@functools.cache
def wheel_owners() -> dict[tuple[str, str], list[str]]:
    """(wheel, version) -> the toolkit releases whose wheel set installs exactly it. Built once per
    process (~15 ms; tables.clear_caches forgets it with the data it is read from)."""
    out: dict[tuple[str, str], list[str]] = {}
    for ws in compat.all_cuda_wheel_sets():
        for _, pkgs in ws.extras:
            for pkg, ver in pkgs:
                owners = out.setdefault((canonicalize_name(pkg), ver), [])
                if ws.toolkit not in owners:
                    owners.append(ws.toolkit)
    return out


def _torch_pins(torch: TorchPart) -> dict[str, str]:
    """The exact CUDA wheels torch's PyPI build requires (its other variants' are not recorded)."""
    release = torch.release
    if release is None or torch.variant != release.pypi_variant:
        return {}
    return {canonicalize_name(n): v for n, v in release.pypi_cuda_wheels.items()}


def _hint(i: int, name: str, cuda: str) -> str:
    try:
        ws = compat.cuda_wheel_set(cuda)
    except LookupError:
        return f"drop pip[{i}]"
    same = [ver for _, pkgs in ws.extras for pkg, ver in pkgs if canonicalize_name(pkg) == name]
    if same:
        return f"use {name}=={same[0]} (CUDA {ws.toolkit}'s) or drop pip[{i}]"
    return f"drop pip[{i}] (CUDA {_mm(cuda)} has no {name} wheel)"
