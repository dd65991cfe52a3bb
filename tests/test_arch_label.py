"""issue 30: io.imgbuild.cuda.arch against the kernels the source builds put into the image, read
from hand-built ELF files with fat binaries (tests/fatbin_bytes.py) by the same reader check and
inspect use; a real torch extension's label is checked against cuobjdump in
tests/test_kernels_cuobjdump.py, and on a built image in tests/test_e2e_arch_label.py."""

from __future__ import annotations

import io
import tarfile

import fakes
import pytest
from fatbin_bytes import PTX, SASS, SPECIFIC, elf, entry, fatbin

from buildkit_py.analysis.image_checks import (
    FAILED,
    PASSED,
    SKIPPED,
    ImageFacts,
    arch_label_check,
    arch_label_checks,
)
from buildkit_py.analysis.kernels import read_kernels
from buildkit_py.analysis.saved_image import scan_kernels

EXT = "/opt/venv/lib/python3.11/site-packages/myext/_C.so"
OTHER = "/opt/venv/lib/python3.11/site-packages/flash_attn_2_cuda.so"


def so(*entries: bytes):
    return elf({".nv_fatbin": fatbin(*entries)})


def kernels(files: dict[str, bytes]):
    return {p: k for p, data in files.items() if (k := read_kernels(data, p)) is not None}


SM80, SM90, SM90A = entry(SASS, 80), entry(SASS, 90), entry(SASS, 90, flags=0x11 | SPECIFIC)
PTX90 = entry(PTX, 90, version=(8, 4))


def facts_with(**extra) -> ImageFacts:
    return ImageFacts(pkgs={}, installers={}, sonames=(), cudart={}, python="3.11.2", os="debian12", nvcc=False,
                      **extra)


def check(label, files, compiled=None):
    compiled = {"myext": tuple(files)} if compiled is None else compiled
    return arch_label_check(label, compiled, kernels(files), {})


def test_a_label_naming_exactly_the_sass_and_ptx_compiled_passes():
    r = check("8.0;9.0+PTX", {EXT: so(SM80, SM90, PTX90)})
    assert r.status == PASSED and r.detail == "'8.0;9.0+PTX': 1 file(s) compiled from source (myext) carry " \
                                              "sm_80, compute_90, sm_90"


def test_the_label_is_held_to_every_compiled_file_together():
    """flash-attn compiles sm_80 for 8.6 while a torch extension compiles sm_86: the label names both."""
    files = {OTHER: so(SM80), EXT: so(entry(SASS, 86))}
    compiled = {"flash-attn": (OTHER,), "myext": (EXT,)}
    assert check("8.0;8.6", files, compiled).status == PASSED


@pytest.mark.parametrize(("label", "files", "says"), [
    # a file carries an arch the label omits: that file decides
    ("9.0", {EXT: so(SM90), OTHER: so(SM80, SM90)}, f"but {OTHER} (myext) carries sm_80, which it omits"),
    # an arch the label names that no file carries
    ("8.6;9.0", {EXT: so(SM90)}, f"but no file compiled from source carries sm_86 (read: {EXT})"),
    # arch-specific kinds are exact: sm_90a is not sm_90
    ("9.0", {EXT: so(SM90A)}, f"but {EXT} (myext) carries sm_90a, which it omits"),
    ("9.0a", {EXT: so(SM90)}, f"but {EXT} (myext) carries sm_90, which it omits"),
    # +PTX claims the PTX, and PTX the label does not claim is code it omits
    ("9.0+PTX", {EXT: so(SM90)}, "but no file compiled from source carries compute_90"),
    ("9.0", {EXT: so(SM90, PTX90)}, f"but {EXT} (myext) carries compute_90, which it omits"),
    ("sm_90", {EXT: so(SM90)}, "which is no list of compute capabilities like 8.0;9.0a;10.0+PTX"),
])
def test_a_false_label_fails_naming_the_file_that_decides(label, files, says):
    r = check(label, files)
    assert r.status == FAILED and says in r.detail, r.detail


def test_a_label_with_nothing_compiled_behind_it_fails_and_kernels_without_a_label_fail():
    r = arch_label_check("9.0", {}, {}, {})
    assert r.status == FAILED and "no package was installed from the compile stage's wheels (/tmp/wheels)" in r.detail
    r = arch_label_check("9.0", {"pure": ("/x/_pure.so",)}, {}, {})
    assert r.status == FAILED and "the packages compiled from source (pure) carry no CUDA kernels" in r.detail
    r = check(None, {EXT: so(SM80, SM90)})
    assert r.status == FAILED
    assert r.detail == f"is missing, but {EXT} (myext, compiled from source) carries sm_80, sm_90"
    assert check(None, {}) is None  # no label, nothing compiled: nothing to say
    # a file compiled from source whose fat binary is garbled cannot vouch for the label
    r = arch_label_check("9.0", {"myext": (EXT,)}, {}, {EXT: "fat binary cut short"})
    assert r.status == FAILED and f"the kernels of {EXT} (myext) cannot be read: fat binary cut short" in r.detail


def test_only_the_compiled_files_are_read_from_the_image_stream():
    """arch_label_checks reads one export of the image and parses only the files the source builds
    installed: torch's own libraries in the same image are skipped unread (and not held to the label)."""
    torch_lib = "/opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so"
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as t:
        for path, data in ((torch_lib, so(entry(SASS, 50), SM80)), (EXT, so(SM90))):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))

    class Engine(fakes.FakeEngine):
        def __init__(self):
            super().__init__(files=tar.getvalue())

        def filesystem(self, ref, chunk_size=1 << 20):
            assert ref == "sha256:img"
            return super().filesystem(ref, chunk_size)

    facts = facts_with(compiled={"myext": (EXT,)})
    [r] = arch_label_checks(Engine(), "sha256:img", {"io.imgbuild.cuda.arch": "9.0"}, facts)
    assert r.status == PASSED, r.detail
    [r] = arch_label_checks(Engine(), "sha256:img", {"io.imgbuild.cuda.arch": "8.0;9.0"}, facts)
    assert r.status == FAILED and "no file compiled from source carries sm_80" in r.detail  # torch's not counted
    scan = scan_kernels(io.BytesIO(tar.getvalue()), wanted={EXT}.__contains__)
    assert set(scan.kernels) == {EXT}
    [r] = arch_label_checks(Engine(), "sha256:img", {"io.imgbuild.cuda.arch": "9.0"}, facts, other_platform=True)
    assert r.status == SKIPPED
    assert arch_label_checks(Engine(), "sha256:img", {}, facts_with()) == []
