"""What a flash-attention git repository says about one release tag, as flash_attn.json fields.

``imgbuild data refresh --flash-attn-repo PATH`` reads a clone (or a bare mirror) of
Dao-AILab/flash-attention with ``git show TAG:FILE``; nothing is fetched. Per tag:

- ``.github/workflows/publish.yml``: the release wheel matrix (python x torch x CUDA x
  cxx11abi, minus ``exclude``), and how the wheel is named (``tmpname=cu${MATRIX_CUDA_VERSION}``:
  CUDA major.minor, ``cu${WHEEL_CUDA_VERSION}``: the major only);
- ``setup.py``: the nvcc floor (``bare_metal_version < Version("11.7")``), each ``-gencode``
  SASS target with the nvcc versions it is compiled for, and the ``-std=c++NN`` it compiles as;
- ``README.md``: "PyTorch X and above" and the GPU families ("Ampere, Ada, or Hopper GPUs").

``tag_facts`` parses; ``read_tag`` runs git. What a tag does not say is left out and named in
``missing``, so the caller writes a partial row instead of a guess.
"""

from __future__ import annotations

import itertools
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.version import InvalidVersion, Version

from buildkit_py.compat.tables import sass_runs_on
from buildkit_py.errors import PackageIndexError

# The GPU families flash-attn's README names, as the compute capabilities imgbuild checks
# build.cuda_arch against (Jetson's 8.7 left out: no flash-attn release names it).
GPU_FAMILIES = {"Turing": ("7.5",), "Ampere": ("8.0", "8.6"), "Ada": ("8.9",), "Hopper": ("9.0",)}


@dataclass(frozen=True)
class TagFacts:
    tag: str
    commit: str
    torch: str | None = None            # ">=2.2" from the README
    cuda: str | None = None             # ">=11.7" from setup.py's nvcc check
    archs: tuple[str, ...] = ()
    cxx_std: int | None = None
    gencode: tuple[tuple[str, str], ...] = ()      # (sm, nvcc specifier)
    prebuilt: tuple[dict[str, Any], ...] = ()   # flash_attn.json ``prebuilt`` entries, written as they are
    prebuilt_note: str | None = None    # why no wheels are recorded, where none are
    missing: tuple[str, ...] = field(default_factory=tuple)

    def source(self) -> str:
        return (f"Dao-AILab/flash-attention tag {self.tag} ({self.commit[:8]}): .github/workflows/publish.yml "
                "(release wheel matrix), setup.py (nvcc check, -gencode list, -std), README.md (PyTorch floor, GPUs)")


def _git(repo: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "--no-optional-locks", "-C", str(repo), *args], capture_output=True,  # noqa: PLW1510
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def read_tag(repo: Path, version: str) -> TagFacts | None:
    """The facts of tag ``v<version>`` in ``repo``; None where the repository has no such tag."""
    if _git(repo, "rev-parse", "--git-dir") is None:
        raise PackageIndexError(f"--flash-attn-repo {repo}: not a git repository",
                                hint="give a clone (or bare mirror) of Dao-AILab/flash-attention")
    tag = f"v{version}"
    commit = _git(repo, "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}")
    if not commit:
        return None
    files = {name: _git(repo, "show", f"{tag}:{name}") for name in
             (".github/workflows/publish.yml", "setup.py", "README.md")}
    return tag_facts(tag, commit.strip(), files[".github/workflows/publish.yml"], files["setup.py"],
                     files["README.md"])


# ----------------------------------------------------------------------------- parsing
def tag_facts(tag: str, commit: str, publish: str | None, setup: str | None, readme: str | None) -> TagFacts:
    missing: list[str] = []
    cuda = cxx = None
    gencode: tuple[tuple[str, str], ...] = ()
    if setup is None:
        missing.append("setup.py")
    else:
        floor = re.search(r'bare_metal_version\s*<\s*Version\("(\d+\.\d+)"\)', setup)
        cuda = f">={floor.group(1)}" if floor else None
        std = re.search(r"-std=c\+\+(\d\d)", setup)   # the CUDA build comes first in every setup.py
        cxx = int(std.group(1)) if std else None
        gencode = setup_gencode(setup)
        missing += [k for k, v in (("cuda", cuda), ("cxx_std", cxx), ("gencode", gencode)) if not v]
    torch, families = readme_requirements(readme or "")
    if torch is None:
        missing.append("torch (README 'PyTorch X and above')")
    archs: tuple[str, ...] = ()
    if families:
        # the README's families that some -gencode target runs on (2.2.4 compiled sm_80 only: no Hopper),
        # plus the Blackwell targets setup.py compiles (the README never named them)
        ccs = {cc for fam in families for cc in GPU_FAMILIES[fam] if any(sass_runs_on(sm, cc) for sm, _ in gencode)}
        ccs |= {sm for sm, _ in gencode if Version(sm).major >= 10}
        archs = tuple(sorted(ccs, key=Version))
    else:
        missing.append("archs (README GPU families)")
    prebuilt, note = publish_matrix(publish) if publish else ((), "the tag has no .github/workflows/publish.yml")
    return TagFacts(tag, commit, torch, cuda, archs, cxx, gencode, prebuilt, note, tuple(missing))


def setup_gencode(setup: str) -> tuple[tuple[str, str], ...]:
    """``(("8.0", ""), ("9.0", ">=11.8"), ...)``: each ``arch=compute_XY,code=sm_XY`` of the CUDA build
    with the nvcc condition of the ``if`` it sits in (none: every nvcc setup.py accepts)."""
    lines = setup.splitlines()
    out: dict[str, str] = {}
    for i, line in enumerate(lines):
        m = re.search(r"arch=compute_(\d+),code=sm_(\d+)", line)
        if not m or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        cond = ""
        for prev in reversed(lines[:i]):
            if not prev.strip() or prev.lstrip().startswith("#"):
                continue
            p_indent = len(prev) - len(prev.lstrip())
            if p_indent < indent:
                c = re.search(r'bare_metal_version\s*>=\s*Version\("(\d+\.\d+)"\)', prev)
                cond = f">={c.group(1)}" if c and prev.lstrip().startswith(("if ", "elif ")) else ""
                break
        sm = m.group(2)
        out.setdefault(f"{int(sm[:-1])}.{sm[-1]}", cond)
    return tuple(sorted(out.items(), key=lambda kv: Version(kv[0])))


def readme_requirements(readme: str) -> tuple[str | None, tuple[str, ...]]:
    """(">=1.12", ("Ampere", "Ada", "Hopper")) from the README's requirements and GPU list."""
    torch = re.search(r"PyTorch (\d+\.\d+) and above", readme)
    fams: tuple[str, ...] = ()
    gpus = re.search(r"^[ \t]*1\.[ \t]+((?:\w+,?[ \t]+(?:or[ \t]+)?)+)GPUs", readme, re.MULTILINE)
    if gpus:
        names = re.findall(r"\w+", gpus.group(1))
        fams = tuple(n for n in names if n in GPU_FAMILIES)
        if any(n not in GPU_FAMILIES and n != "or" for n in names):
            fams = ()   # a family imgbuild has no compute capabilities for: say so, do not guess
    return (f">={torch.group(1)}" if torch else None), fams


def publish_matrix(publish: str) -> tuple[tuple[dict[str, Any], ...], str | None]:
    """The wheels publish.yml builds, grouped as flash_attn.json ``prebuilt`` entries; or () and why."""
    try:
        doc = yaml.safe_load(publish)
    except yaml.YAMLError as exc:
        return (), f"publish.yml does not parse: {exc}"
    label = re.search(r"tmpname=cu\$\{(MATRIX_CUDA_VERSION|WHEEL_CUDA_VERSION)\}torch\$\{MATRIX_TORCH_VERSION\}"
                      r"cxx11abi\$\{\{\s*matrix\.cxx11_abi\s*\}\}", publish)
    if not label:
        return (), "publish.yml names its wheels without the cu{CUDA}torch{X.Y}cxx11abi{ABI} label setup.py fetches"
    matrix = next((job.get("strategy", {}).get("matrix") for job in (doc.get("jobs") or {}).values()
                   if isinstance(job, dict) and isinstance((job.get("strategy") or {}).get("matrix"), dict)
                   and "cuda-version" in job["strategy"]["matrix"]), None)
    if matrix is None:
        return (), "publish.yml has no build matrix with cuda-version"
    axes = ("python-version", "torch-version", "cuda-version", "cxx11_abi")
    values = [matrix.get(a) for a in axes]
    if not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in values) or "include" in matrix:
        return (), "publish.yml's matrix is not plain lists of quoted versions (an expression, an include)"
    combos = [dict(zip(axes, c, strict=True)) for c in itertools.product(*values)]
    for ex in matrix.get("exclude") or ():
        combos = [c for c in combos if not all(str(c.get(k)) == str(v) for k, v in ex.items())]
    major_only = label.group(1) == "WHEEL_CUDA_VERSION"
    by_build: dict[tuple[str, str], dict[str, set[bool]]] = {}   # (CUDA, torch) -> python -> ABIs
    for c in combos:
        try:
            cuda_v, torch_v = Version(c["cuda-version"]), Version(c["torch-version"])
        except InvalidVersion:
            return (), f"publish.yml matrix value is not a version: {c}"
        abi = c["cxx11_abi"].upper() == "TRUE"
        by_build.setdefault((str(cuda_v), str(torch_v)), {}).setdefault(c["python-version"], set()).add(abi)
    groups: dict[tuple[str, str, tuple[bool, ...]], list[str]] = {}   # Pythons built with the same ABIs
    for (cuda, torch), pythons in by_build.items():
        for py, abis in pythons.items():
            groups.setdefault((cuda, torch, tuple(sorted(abis))), []).append(py)
    out: list[dict[str, Any]] = []
    for (cuda, torch, abi_set), pys in groups.items():
        b, t = Version(cuda), Version(torch)
        out.append({"cuda": str(b.major) if major_only else f"{b.major}.{b.minor}", "build_cuda": cuda,
                    "torch": f"{t.major}.{t.minor}", "torch_build": torch,
                    "python": sorted(pys, key=Version), "cxx11abi": list(abi_set)})
    out.sort(key=lambda w: (Version(w["build_cuda"]), Version(w["torch_build"]), w["cxx11abi"]))
    return tuple(out), None


def combinations(prebuilt: Iterable[Mapping[str, Any]]) -> int:
    """How many wheels the entries stand for (python x cxx11abi per entry)."""
    return sum(len(w["python"]) * len(w["cxx11abi"]) for w in prebuilt)
