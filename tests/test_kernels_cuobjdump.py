"""The fat binary reader agrees with NVIDIA's cuobjdump on real CUDA libraries from the Python
registry: torch's, cuBLAS, cuDNN (every sub-library with kernels), NCCL, cuFFT, cuRAND,
cuSOLVER, cuSPARSE, cuSPARSELt, NVSHMEM, bitsandbytes, xformers and sgl-kernel's FlashAttention
kernels (flash-attn itself is an sdist on the registry; its wheels are not reachable here).

For every library: the same SASS and PTX entries, counted per architecture, as
``cuobjdump --list-elf --list-ptx`` (and with ``-all`` where the file has relocatable fatbins
too); and where the PTX is small enough to dump, the same PTX ISA versions as ``cuobjdump -ptx``
prints. cuobjdump runs live. The wheels (3.6 GB, about 60 s to download here) and the libraries
taken from them stay in /var/cache/imgbuild-test (IMGBUILD_TEST_WHEEL_CACHE), which
``services.sh reclaim`` leaves alone: a warm run only reads them. With CI=true a wheel that
cannot be fetched or a cuobjdump that does not run fails the test.

Two libraries are left out because cuobjdump 13.2 to 13.5 (every release on the registry) stops
on them with "Invalid ELF" after the first cubin: bitsandbytes' libbitsandbytes_cuda121.so and
vllm-flash-attn 2.6.2's extension."""

from __future__ import annotations

import collections
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
from conftest import unavailable

from buildkit_py.analysis.kernels import RELOCATABLE_SECTION, CodeKind, FatbinEntry, read_kernels_path

pytestmark = pytest.mark.e2e

CACHE = Path(os.environ.get("IMGBUILD_TEST_WHEEL_CACHE", "/var/cache/imgbuild-test/wheels"))
LIBS = CACHE.parent / "libs"  # the members below, taken out of their wheels once
CUOBJDUMP = ("nvidia-cuda-cuobjdump==13.4.92", "nvidia/cu13/bin/cuobjdump")

CUDNN = "nvidia/cudnn/lib/libcudnn_"
CU13 = "nvidia/cu13/lib/"
BNB = "bitsandbytes/libbitsandbytes_cuda"
# pin -> the members whose kernels are compared (torch 2.14.1's CUDA 13.0 stack, as test_e2e_torch builds)
LIBRARIES: dict[str, tuple[str, ...]] = {
    "torch==2.14.1": ("torch/lib/libtorch_cuda.so", "torch/lib/libtorch_cuda_linalg.so",
                      "torch/lib/libtorch_nvshmem.so", "torch/lib/libc10_cuda.so"),
    "nvidia-cublas==13.1.1.3": (CU13 + "libcublas.so.13", CU13 + "libcublasLt.so.13"),
    "nvidia-cudnn-cu13==9.24.0.43": tuple(CUDNN + n + ".so.9" for n in (
        "adv", "cnn", "ops", "ext", "engines_precompiled", "engines_runtime_compiled", "engines_tensor_ir")),
    "nvidia-nccl-cu13==2.30.7": ("nvidia/nccl/lib/libnccl.so.2",),
    "nvidia-cufft==12.0.0.61": (CU13 + "libcufft.so.12", CU13 + "libcufftw.so.12"),
    "nvidia-curand==10.4.0.35": (CU13 + "libcurand.so.10",),
    "nvidia-cusolver==12.0.4.66": (CU13 + "libcusolver.so.12", CU13 + "libcusolverMg.so.12"),
    "nvidia-cusparse==12.6.3.3": (CU13 + "libcusparse.so.12",),
    "nvidia-cusparselt-cu13==0.8.1": ("nvidia/cusparselt/lib/libcusparseLt.so.0",),
    "nvidia-nvshmem-cu13==3.4.5": ("nvidia/nvshmem/lib/libnvshmem_host.so.3",),
    "nvidia-cuda-runtime==13.0.96": (CU13 + "libcudart.so.13",),  # no device code: both must say so
    "bitsandbytes==0.50.2": tuple(f"{BNB}{v}.so" for v in ("118", "124", "126", "128", "130", "132")),
    "xformers==0.0.35": ("xformers/_C.so",),
    "sgl-kernel==0.3.21": ("sgl_kernel/flash_ops.abi3.so", "sgl_kernel/flashmla_ops.abi3.so"),
}
# libraries whose PTX is small enough for `cuobjdump -ptx` to print every .version in a second or two
PTX_DUMPED = ("xformers/_C.so", CUDNN + "cnn.so.9", CUDNN + "ext.so.9", CUDNN + "engines_tensor_ir.so.9",
              CU13 + "libcurand.so.10", "nvidia/nccl/lib/libnccl.so.2")

LISTED = re.compile(r"^(ELF|PTX) file\s+\d+: .*\.(sm_\d+a?)\.(cubin|ptx)$")


def _wheel(pin: str) -> Path:
    """The cached wheel of ``pin``, downloaded (no dependencies, the registry only) when missing."""
    name, version = pin.split("==")
    stem = re.sub(r"[-_.]+", "_", name).lower()
    found = sorted(CACHE.glob(f"{stem}-{version}-*.whl"))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")}
    env["PIP_CONFIG_FILE"] = os.devnull  # the registry's own files, not this machine's pip settings
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                               "--quiet", "-d", tmp, pin], env=env, capture_output=True, text=True, check=False)
        got = list(Path(tmp).glob("*.whl"))
        if done.returncode or len(got) != 1:
            unavailable(f"could not download {pin}: {done.stderr.strip()[-400:]}")
        return got[0].replace(CACHE / got[0].name)


def _member(wheel: Path, member: str) -> Path:
    """``member`` of ``wheel`` as a file under LIBS, taken out once (then renamed into place)."""
    target = LIBS / wheel.stem / member
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z, z.open(member) as src, \
                tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as out:
            shutil.copyfileobj(src, out, 1 << 20)
        Path(out.name).chmod(0o755)
        Path(out.name).replace(target)
    return target


@pytest.fixture(scope="session")
def cuobjdump() -> str:
    pin, member = CUOBJDUMP
    binary = _member(_wheel(pin), member)
    probe = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False)
    if probe.returncode:
        unavailable(f"{binary} does not run: {probe.stderr.strip()}")
    return str(binary)


@pytest.fixture(scope="session")
def libraries() -> dict[str, Path]:
    out = {}
    for pin, members in LIBRARIES.items():
        wheel = _wheel(pin)
        out |= {member: _member(wheel, member) for member in members}
    return out


def _cuobjdump(binary: str, path: Path, *extra: str) -> collections.Counter:
    done = subprocess.run([binary, "--list-elf", "--list-ptx", *extra, str(path)], capture_output=True, text=True,
                          check=False)
    if done.returncode and "does not contain device code" not in done.stderr:
        pytest.fail(f"cuobjdump failed on {path}: {done.stderr.strip()}")
    return collections.Counter((m[1], m[2]) for line in done.stdout.splitlines() if (m := LISTED.match(line)))


def _ours(entries: tuple[FatbinEntry, ...]) -> collections.Counter:
    return collections.Counter(("ELF" if e.kind == CodeKind.SASS else "PTX", e.arch.name) for e in entries)


def _by_kind(counts: collections.Counter, kind: str) -> str:
    return " ".join(f"{arch}x{n}" for (k, arch), n in sorted(counts.items(), key=lambda i: (len(i[0][1]), i[0][1]))
                    if k == kind) or "-"


def test_the_reader_agrees_with_cuobjdump_on_every_library(cuobjdump, libraries):
    assert len([m for m in libraries if "cudart" not in m]) >= 20

    def compare(member: str) -> tuple[str, collections.Counter, collections.Counter, bool]:
        path = libraries[member]
        kernels = read_kernels_path(str(path))
        ours = _ours(kernels.listed) if kernels else collections.Counter()
        theirs = _cuobjdump(cuobjdump, path)
        agree = ours == theirs
        if kernels and any(e.section == RELOCATABLE_SECTION for e in kernels.entries):
            agree = agree and _ours(kernels.entries) == _cuobjdump(cuobjdump, path, "-all")
        return member, ours, theirs, agree

    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # cuobjdump waits on the disk half the time
        rows = list(pool.map(compare, libraries))
    table = [f"{'library':<48} {'SASS (ours = cuobjdump)':<60} PTX"]
    table += [f"{m.rsplit('/', 1)[-1]:<48} {_by_kind(o, 'ELF'):<60} {_by_kind(o, 'PTX')}" for m, o, _, _ in rows]
    print("\n".join(table))
    disagree = [(m, o - t, t - o) for m, o, t, ok in rows if not ok]
    assert disagree == []
    assert sum(1 for _, o, _, _ in rows if o) >= 20  # libraries that do carry kernels


def test_ptx_versions_agree_with_the_ptx_cuobjdump_prints(cuobjdump, libraries):
    for member in PTX_DUMPED:
        path = libraries[member]
        kernels = read_kernels_path(str(path))
        assert kernels is not None
        done = subprocess.run([cuobjdump, "-ptx", str(path)], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        versions = re.findall(r"^\.version (\d+\.\d+)\s*\n\.target (sm_\d+a?)", done.stdout, re.MULTILINE)
        theirs = collections.Counter((f"sm_{t[3:]}", v) for v, t in versions)
        ours = collections.Counter((e.arch.name, e.ptx_version) for e in kernels.listed if e.kind == CodeKind.PTX)
        assert ours == theirs, member
        assert theirs, member


def _label_from_cuobjdump(counts: collections.Counter) -> str:
    """io.imgbuild.cuda.arch as cuobjdump's listing says it: each SASS arch (sm_90a -> 9.0a), +PTX
    where that arch's PTX is listed too."""
    ptx = {arch for kind, arch in counts if kind == "PTX"}
    sass = sorted({arch for kind, arch in counts if kind == "ELF"}, key=lambda a: int(re.sub(r"\D", "", a)))
    return ";".join("{}.{}{}".format(*re.fullmatch(r"sm_(\d+)(\d)(a?)", a).groups()) + ("+PTX" if a in ptx else "")
                    for a in sass)


def test_the_arch_label_check_agrees_with_cuobjdump_on_a_real_torch_extension(cuobjdump, libraries):
    """issue 30: xformers' _C.so is a torch extension as a source build makes one (sm_75, sm_80 with
    its PTX, and the arch-specific sm_90a): the label cuobjdump's listing gives passes the image
    test's check, and the label a recipe would naively write (7.5;8.0;9.0) fails on the file."""
    from buildkit_py.analysis.image_checks import FAILED, PASSED, arch_label_check  # noqa: PLC0415

    member = "xformers/_C.so"
    path = libraries[member]
    label = _label_from_cuobjdump(_cuobjdump(cuobjdump, path))
    assert label == "7.5;8.0+PTX;9.0a"
    ours = {str(path): read_kernels_path(str(path))}
    compiled = {"xformers": (str(path),)}
    assert arch_label_check(label, compiled, ours, {}).status == PASSED
    naive = arch_label_check("7.5;8.0;9.0", compiled, ours, {})
    assert naive.status == FAILED and "carries compute_80, sm_90a, which it omits" in naive.detail
