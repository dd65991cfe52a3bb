"""What a path in a layer is: a whiteout, a cache left in the image, a compiler, a CUDA library
(and from where), or a weight-like file. Pure functions on path strings and sizes; the layer
scan (``saved_image``) applies them to every member, the finding rules (``inspect``) to the hits."""

from __future__ import annotations

import posixpath
import re

from buildkit_py.file_kinds import WEIGHT_FILE_LIMIT, is_weight_file, over_weight_limit
from buildkit_py.plan.steps import CUDA_PREFIX
from buildkit_py.text_enum import TextEnum


class FindingKind(TextEnum):
    """What classify_path reports, and (with DELETED) what inspect's findings are."""

    WEIGHTS = "weights"
    CACHE = "cache"
    COMPILER = "compiler-in-runtime"
    CUDA_DUPLICATE = "cuda-duplicate"
    DELETED = "deleted-later"


WEIGHTS, CACHE, COMPILER = FindingKind.WEIGHTS, FindingKind.CACHE, FindingKind.COMPILER
CUDA_DUPLICATE, DELETED = FindingKind.CUDA_DUPLICATE, FindingKind.DELETED

# (regex, the cache's root as reported). A file under one of these in a layer is a cache that
# was left in the image instead of on a build cache mount. __pycache__ is deliberately absent.
_CACHE_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^(/root|/home/[^/]+)/\.cache/pip/"), r"\1/.cache/pip"),
    (re.compile(r"^(/root|/home/[^/]+)/\.cache/huggingface/"), r"\1/.cache/huggingface"),
    (re.compile(r"^/var/cache/apt/archives/(?:partial/)?[^/]+\.deb$"), "/var/cache/apt/archives"),
    # The lists' lock file and partial/ are in every Debian image; the indexes are not.
    (re.compile(r"^/var/lib/apt/lists/(?!lock$|partial(?:/|$)|auxfiles(?:/|$))"), "/var/lib/apt/lists"),
    (re.compile(r"^(.*/(?:conda|miniconda3?|miniforge3?|mambaforge|anaconda3?|\.conda))/pkgs/"), r"\1/pkgs"),
)

# Build tools that a ``runtime`` flavour image should not carry. Symlinks count (usr/bin/gcc).
_COMPILER_RULES: tuple[re.Pattern[str], ...] = (
    re.compile(r"^/usr/bin/(?:[\w.-]+-linux-gnu-)?(?:gcc|g\+\+)[^/]*$"),
    re.compile(r"^/usr/bin/(?:cc|c\+\+)$"),
    re.compile(r"^/usr/(?:lib|libexec)/gcc/.+/cc1(?:plus)?$"),
    re.compile(r"(?:^|/)bin/nvcc$"),  # /usr/bin, /usr/local/cuda*/bin, site-packages/nvidia/cuda_nvcc/bin
    re.compile(r"^/usr/local/cuda[^/]*/(?:targets/[^/]+/)?include/cuda\.h$"),
    re.compile(r"^/usr/include/cuda\.h$"),
)

# CUDA user-space libraries that come both with NVIDIA's images and as nvidia-*-cu12 wheels.
_CUDA_LIB_RE = re.compile(
    r"^lib(cudart|cublas|cublasLt|cufft|cufftw|curand|cusolver|cusolverMg|cusparse|cusparseLt|"
    r"cudnn(?:_[a-z_]+)?|nccl|nvrtc(?:-builtins)?|nvJitLink|cupti|nvToolsExt|nvjpeg|npp[a-z]*|cufile)"
    r"\.so\.(\d+)(?:\.[\d.]+)?$")
_CUDA_SYSTEM_RE = re.compile(r"^/usr/local/cuda[^/]*/|^/usr/lib/[^/]*-linux-gnu/")
# in a venv, or in the prefix the CUDA wheels share outside it (plan.PrefixPipStep)
_CUDA_WHEEL_RE = re.compile(rf"(?:/site-packages|^{re.escape(CUDA_PREFIX)})/nvidia/[^/]+/lib/")

WHITEOUT_PREFIX = ".wh."
OPAQUE = ".wh..wh..opq"


def normalize_member(name: str) -> str | None:
    """A tar member name as an absolute path ('./usr/bin/' -> '/usr/bin'); None for the root."""
    while name.startswith("./"):
        name = name[2:]
    name = name.strip("/")
    if name in ("", "."):
        return None
    return "/" + name


def whiteout_target(path: str) -> tuple[str, bool] | None:
    """For an overlay whiteout entry, (the path it deletes, opaque?); None for other paths.
    ``/a/.wh.b`` deletes ``/a/b``; ``/a/.wh..wh..opq`` hides everything lower layers had in /a."""
    parent, base = posixpath.split(path)
    if base == OPAQUE:
        return parent or "/", True
    if base.startswith(WHITEOUT_PREFIX):
        return posixpath.join(parent, base[len(WHITEOUT_PREFIX):]), False
    return None


def cache_root(path: str) -> str | None:
    """The cache directory ``path`` lies in (pip, apt, Hugging Face, conda), or None."""
    if "/__pycache__/" in path:
        return None
    for rule, root in _CACHE_RULES:
        m = rule.search(path)
        if m:
            return m.expand(root)
    return None


def is_compiler(path: str) -> bool:
    return any(rule.search(path) for rule in _COMPILER_RULES)


def cuda_library(path: str) -> tuple[str, str] | None:
    """(soname like 'libcublas.so.12', 'system' | 'wheel') for a CUDA library file, else None."""
    m = _CUDA_LIB_RE.match(posixpath.basename(path))
    if not m:
        return None
    soname = f"lib{m.group(1)}.so.{m.group(2)}"
    if _CUDA_WHEEL_RE.search(path):
        return soname, "wheel"
    if _CUDA_SYSTEM_RE.search(path):
        return soname, "system"
    return None


def classify_path(path: str, size: int, *, weight_threshold: int = WEIGHT_FILE_LIMIT) -> list[tuple[FindingKind, str]]:
    """Every rule a file at ``path`` of ``size`` bytes matches, as (kind, detail) pairs; detail is
    the cache root, the CUDA soname and origin ('libcudart.so.12:wheel'), or the path itself.
    The compiler rule only matters in runtime images; the caller decides that."""
    out: list[tuple[FindingKind, str]] = []
    if over_weight_limit(size, weight_threshold) and is_weight_file(path):
        out.append((WEIGHTS, path))
    root = cache_root(path)
    if root:
        out.append((CACHE, root))
    if is_compiler(path):
        out.append((COMPILER, path))
    lib = cuda_library(path)
    if lib:
        out.append((CUDA_DUPLICATE, f"{lib[0]}:{lib[1]}"))
    return out
