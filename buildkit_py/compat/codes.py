"""Warnings the pipeline returns about a recipe, each with a stable code and the recipe key it
is about. ``lint``, ``inspect`` and the CLI read the code, never the text: the text may be
reworded, a code is renamed only with a note in the README ("Warning and finding codes").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from buildkit_py.text_enum import TextEnum


class WarningCode(TextEnum):
    """The codes of the resolver's and the plan's warnings; CODES says what each means."""

    TORCH_FROM_INDEX = "torch-from-index"
    CUDA_TWICE = "cuda-twice"
    BNB_INT8_ARCH = "bitsandbytes-int8-arch"
    EOL_IMAGE = "eol-image"
    DEVEL_WITHOUT_COMPILE = "devel-without-compile"
    JIT_WITHOUT_RUNTIME_COMPILE = "jit-without-runtime-compile"
    RUNTIME_COMPILE_WITHOUT_NVCC = "runtime-compile-without-nvcc"
    WEIGHTS_IN_COPY = "weights-in-copy"
    FLOOR_LABELS_DIFFER = "floor-labels-differ"
    FLOOR_CUDA_UNKNOWN = "floor-cuda-unknown"
    GPU_PTX_JIT = "gpu-ptx-jit"
    GPU_KERNELS_UNKNOWN = "gpu-kernels-unknown"


# The rules name their codes by these (codes.CUDA_TWICE).
TORCH_FROM_INDEX, CUDA_TWICE = WarningCode.TORCH_FROM_INDEX, WarningCode.CUDA_TWICE
BNB_INT8_ARCH, EOL_IMAGE = WarningCode.BNB_INT8_ARCH, WarningCode.EOL_IMAGE
DEVEL_WITHOUT_COMPILE = WarningCode.DEVEL_WITHOUT_COMPILE
JIT_WITHOUT_RUNTIME_COMPILE = WarningCode.JIT_WITHOUT_RUNTIME_COMPILE
RUNTIME_COMPILE_WITHOUT_NVCC = WarningCode.RUNTIME_COMPILE_WITHOUT_NVCC
WEIGHTS_IN_COPY = WarningCode.WEIGHTS_IN_COPY
FLOOR_LABELS_DIFFER, FLOOR_CUDA_UNKNOWN = WarningCode.FLOOR_LABELS_DIFFER, WarningCode.FLOOR_CUDA_UNKNOWN
GPU_PTX_JIT, GPU_KERNELS_UNKNOWN = WarningCode.GPU_PTX_JIT, WarningCode.GPU_KERNELS_UNKNOWN

# code -> what it means (the README's table is checked against this one).
CODES: dict[WarningCode, str] = {
    TORCH_FROM_INDEX: "the torch pin is newer than the shipped data; its CUDA variant, pins and Python range "
                      "come from the package index (or its cache)",
    CUDA_TWICE: "torch brings its CUDA libraries as wheels and the nvidia/cuda base carries them again",
    BNB_INT8_ARCH: "a build.cuda_arch is below what bitsandbytes' LLM.int8() needs; only its 8-bit optimizers "
                   "and NF4/FP4 work there",
    EOL_IMAGE: "the nvidia/cuda image is past NVIDIA's support window and may be deleted from Docker Hub",
    DEVEL_WITHOUT_COMPILE: "cuda.flavor devel, but the recipe compiles nothing at run time",
    JIT_WITHOUT_RUNTIME_COMPILE: "a pinned package compiles CUDA kernels at run time, and runtime_compile is not set",
    RUNTIME_COMPILE_WITHOUT_NVCC: "runtime_compile is set, but the final image has no nvcc",
    WEIGHTS_IN_COPY: "a copy: source holds model weights, which would be baked into a layer",
    FLOOR_LABELS_DIFFER: "check: the image's driver floor labels differ from imgbuild's data for its CUDA; the "
                         "verdict follows the labels",
    FLOOR_CUDA_UNKNOWN: "check: imgbuild's data does not know the image's CUDA; the verdict rests on its floor "
                        "labels alone",
    GPU_PTX_JIT: "a target GPU (gpus:, --gpu) gets a package's kernels only as PTX, which the driver JIT-compiles "
                 "at first start",
    GPU_KERNELS_UNKNOWN: "imgbuild's data records no kernels for a package's wheel: whether it runs on a target "
                         "GPU is unknown",
}


@dataclass(frozen=True)
class RecipeWarning:
    """One warning: ``code`` (a key of ``CODES``), the recipe ``key`` it is about (None: the
    recipe as a whole), the ``message`` a person reads and, where there is one, a ``hint``."""

    code: WarningCode
    key: str | None
    message: str
    hint: str | None = None

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"unknown warning code {self.code!r}: add it to compat.codes.CODES and the README")
        object.__setattr__(self, "code", WarningCode(self.code))  # a word (a test's, a rewording's): the member

    def render(self) -> str:
        """One line for a terminal: ``[code] message (hint)``."""
        return f"[{self.code}] {self.message}" + (f" ({self.hint})" if self.hint else "")

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "key": self.key, "message": self.message, "hint": self.hint}
