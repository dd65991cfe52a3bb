"""Tests run in a built image: the recipe's ``test:`` commands, and two that need nothing written,
every io.imgbuild.* label checked against what the image really holds (a plan that passes is a
promise: each label must be true of the image) and the import of each pinned package.

The image is started through the engine (``Engine.run_argv``: docker's ``--gpus all``, podman's
CDI device where a test asks for a GPU), with no network. The facts the labels are checked
against come from one container run (``FACTS_SCRIPT``: installed distributions and who installed
them, the loader cache, the CUDA runtime's own version, Python, the OS, nvcc); the verdicts are a
pure function of labels and facts (``label_checks``), so each can be shown to fail on a false label
without building one. Progress goes through ``on_event``; a failure is a typed error
(``ImageTestFailed``) raised by ``require_passed``, and the caller decides what happens to the
image (a build keeps it as REPO:rejected and pushes nothing)."""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from buildkit_py import compat
from buildkit_py import label_keys as K
from buildkit_py.analysis.gpu_coverage import gpu_report, loaded_alternatives, read_image_kernels, resolve_gpu
from buildkit_py.analysis.kernels import FileKernels
from buildkit_py.analysis.saved_image import IterStream, scan_kernels
from buildkit_py.compat.cudnn_source import is_cudnn_wheel
from buildkit_py.engine.run import BindMount, ContainerExit, RunSpec, run_container
from buildkit_py.errors import ImageFactsUnreadable, ImageTestFailed, InspectError, UsageError
from buildkit_py.plan import labels as L
from buildkit_py.plan.steps import LOCAL_WHEELS_MOUNT
from buildkit_py.recipe.model import Recipe, TestSpec, pin_name
from buildkit_py.versions import major_minor

if TYPE_CHECKING:
    from buildkit_py.analysis.kernels import FileKernels
    from buildkit_py.analysis.lazy import Tracer
    from buildkit_py.engine.base import Engine, ImageInfo

    Traced = tuple[Tracer, str]  # the tracer, and the name of this test's log

EventSink = Callable[[str], None]
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
OUTPUT_LINES = 200  # the last lines of a failed test's output its error shows (once)
SCRIPT_DIR = "/imgbuild-test"  # where a test's script is mounted (read-only) in the container
_MARK = "IMGBUILD-FACTS "  # the facts line, told apart from what an import prints
# An import that fails only because the container has no NVIDIA driver: a skip where the engine
# has no GPU runtime, not a failure of the image.
_NEEDS_DRIVER = re.compile(r"libcuda\.so|libnvidia-ml\.so|no CUDA-capable device|NVIDIA driver")

# Runs in the image with its own python (argv[1]: the pins as JSON, [[name, version], ...]).
FACTS_SCRIPT = r"""
import ctypes, importlib, json, os, platform, re, shutil, subprocess, sys, traceback
from importlib import metadata
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
pkgs, installers, wheel_libs, compiled = {}, {}, {}, {}
shared = re.compile(r"^lib[^/]+\.so(\.\d+)*$")
sofile = re.compile(r"\.so(\.\d+)*$")
for d in metadata.distributions():
    name = norm(d.metadata["Name"] or "")
    pkgs[name] = d.version
    installers[name] = (d.read_text("INSTALLER") or "").strip()
    try:
        url = json.loads(d.read_text("direct_url.json") or "{}").get("url") or ""
    except ValueError:
        url = ""
    if url.startswith("file://" + IMGBUILD_WHEELS_MOUNT + "/"):
        compiled[name] = sorted({os.path.realpath(str(d.locate_file(f))) for f in d.files or ()
                                 if sofile.search(f.name)})
    for f in d.files or ():
        if shared.match(f.name):
            wheel_libs.setdefault(f.name, name)
ld = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
sonames = sorted({l.split()[0] for l in ld.splitlines()[1:] if l.strip()})
cudart = {}
for so in (s for s in sonames if s.startswith("libcudart.so.")):
    try:
        v = ctypes.c_int()
        ctypes.CDLL(so).cudaRuntimeGetVersion(ctypes.byref(v))
        cudart[so] = v.value
    except Exception as exc:
        cudart[so] = str(exc)
osr = {}
for line in open("/etc/os-release").read().splitlines():
    k, _, v = line.partition("=")
    osr[k] = v.strip().strip('"')
def modules(dist):
    top = (dist.read_text("top_level.txt") or "").split()
    if not top:
        for f in dist.files or ():
            parts = f.parts
            if not parts or parts[0].endswith((".dist-info", ".data")) or parts[0] in ("..", "__pycache__"):
                continue
            if len(parts) == 1 and parts[0].endswith((".py", ".so")):
                top.append(parts[0].split(".")[0])
            elif len(parts) > 1 and parts[-1].endswith((".py", ".so")):
                top.append(parts[0])
    return sorted({m for m in top if m.isidentifier() and not m.startswith("_")})
imports = []
real_stdout, sys.stdout = sys.stdout, sys.stderr
for name, want in json.loads(sys.argv[1]):
    rec = {"name": name, "want": want, "version": None, "modules": [], "error": None}
    try:
        dist = metadata.distribution(name)
        rec["version"] = dist.version
        rec["modules"] = modules(dist)
        for m in rec["modules"]:
            importlib.import_module(m)
    except metadata.PackageNotFoundError:
        rec["error"] = "not installed"
    except BaseException:
        rec["error"] = traceback.format_exc(limit=4)
    imports.append(rec)
sys.stdout = real_stdout
print("IMGBUILD-FACTS " + json.dumps({"pkgs": pkgs, "installers": installers, "sonames": sonames,
      "wheel_libs": wheel_libs, "compiled": compiled,
      "cudart": cudart, "python": platform.python_version(),
      "os": osr.get("ID", "") + osr.get("VERSION_ID", ""), "nvcc": bool(shutil.which("nvcc")),
      "imports": imports}))
""".replace("IMGBUILD_WHEELS_MOUNT", repr(LOCAL_WHEELS_MOUNT))


@dataclass(frozen=True)
class TestResult:
    """One test's verdict: ``kind`` label (a label against the image), import (a pinned package)
    or command (a ``test:`` entry); ``detail`` says what was compared or why it was skipped;
    a command's ``output`` (its stdout and stderr) is kept only when it failed."""

    __test__ = False  # not a pytest class, whatever its name

    name: str
    kind: str
    status: str
    detail: str = ""
    command: str | None = None
    exit_code: int | None = None
    output: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "status": self.status, "detail": self.detail,
                "command": self.command, "exit_code": self.exit_code, "output": self.output,
                "seconds": round(self.seconds, 2)}


@dataclass(frozen=True)
class TestReport:
    """The tests of one platform's image: ``platform`` is the one asked for, or the engine's own
    (what its image inspect says) where none was."""

    __test__ = False

    image: str
    gpu: bool  # did the engine offer GPUs
    results: tuple[TestResult, ...] = ()
    platform: str | None = None  # os/arch; None only where the engine did not say

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def failed(self) -> tuple[TestResult, ...]:
        return tuple(r for r in self.results if r.status == FAILED)

    def summary(self) -> str:
        return f"{self.count(PASSED)} passed, {self.count(FAILED)} failed, {self.count(SKIPPED)} skipped"

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image, "gpu": self.gpu, "platform": self.platform, "passed": self.count(PASSED),
                "failed": self.count(FAILED), "skipped": self.count(SKIPPED),
                "results": [r.to_json() for r in self.results]}


@dataclass(frozen=True)
class TestRun:
    """What `imgbuild test` prints: the image and one report per platform tested, in order. Its
    --json document (``to_json``) and its text (``lines``) read these fields."""

    __test__ = False

    image: str
    reports: tuple[TestReport, ...]

    def to_json(self) -> dict[str, Any]:
        """The totals over every platform tested, each result naming its platform, and each
        platform's own report (``platform_tests``, as `build --json` has them)."""
        results = [{**r.to_json(), "platform": report.platform} for report in self.reports for r in report.results]
        return {"image": self.image, "gpu": any(r.gpu for r in self.reports),
                "platforms": [r.platform for r in self.reports],
                **{status: sum(r.count(status) for r in self.reports) for status in (PASSED, FAILED, SKIPPED)},
                "results": results, "platform_tests": [r.to_json() for r in self.reports]}

    def lines(self) -> list[str]:
        return [f"tests    {self.image} ({report.platform or 'platform unknown'}): {report.summary()}"
                for report in self.reports]


@dataclass(frozen=True)
class ImageFacts:
    """What the image holds, read in one container run (``read_facts``)."""

    pkgs: Mapping[str, str]  # normalized distribution name -> version
    installers: Mapping[str, str]  # name -> its INSTALLER record (uv, pip)
    sonames: tuple[str, ...]  # the loader cache (ldconfig -p)
    cudart: Mapping[str, int | str]  # libcudart soname -> cudaRuntimeGetVersion, or why it failed
    python: str
    os: str  # ID + VERSION_ID of /etc/os-release: debian12, ubuntu22.04
    nvcc: bool  # nvcc on the image's PATH
    imports: tuple[Mapping[str, Any], ...] = field(default=())  # one record per pin asked for
    # shared libraries the installed distributions ship (file name -> distribution), loaded through
    # their RPATH rather than the loader cache: torch's nvidia-* wheels where no ldconfig step ran
    wheel_libs: Mapping[str, str] = field(default_factory=dict)
    # what imgbuild compiled: each distribution installed from the compile stage's wheels (its
    # direct_url.json names LOCAL_WHEELS_MOUNT) -> the real paths of its shared objects
    compiled: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


# --- running things in the image ----------------------------------------------------------------


def run_in_image(engine: Engine, image: str, command: tuple[str, ...], *, entrypoint: str, gpu: bool = False,  # noqa: PLR0913 - every one a RunSpec field or the trace's
                 mounts: tuple[tuple[Path, str], ...] = (), platform: str | None = None,
                 timeout: float | None = None, trace: Traced | None = None) -> tuple[ContainerExit, str]:
    """Run ``entrypoint command...`` in a throw-away container of ``image`` (no network, the
    engine's GPU flags when ``gpu``, each (host file, path) of ``mounts`` bound read-only;
    ``platform``: that platform's image of a multi-platform one), removed after ``timeout``
    seconds; (how it ended, stdout and stderr together). ``trace``: run it under the tracer,
    its log named by the test (lazy.py)."""
    bound = tuple(BindMount(host, target) for host, target in mounts)
    if trace is not None:
        tracer, name = trace
        bound += tracer.mounts()
        entrypoint, command = tracer.wrap(name, entrypoint, command)
    spec = RunSpec(image, gpu=gpu, network="none", entrypoint=entrypoint, command=command, platform=platform,
                   mounts=bound)
    lines: list[str] = []
    ended = run_container(engine, spec, what=f"test container of {image}", timeout=timeout, on_line=lines.append)
    return ended, "\n".join(lines)


def read_facts(engine: Engine, image: str, pins: tuple[tuple[str, str], ...] = (),
               platform: str | None = None, tracer: Tracer | None = None) -> ImageFacts:
    """The image's facts (``platform``'s image of a multi-platform one), and the import of each
    (name, version) of ``pins``; ImageFactsUnreadable when the image's python cannot report them (the
    output says why)."""
    ended, output = run_in_image(engine, image, ("-c", FACTS_SCRIPT, json.dumps([list(p) for p in pins])),
                                 entrypoint="python", platform=platform,
                                 trace=(tracer, "facts") if tracer else None)
    code = ended.code
    line = next((ln for ln in reversed(output.splitlines()) if ln.startswith(_MARK)), None)
    if code != 0 or line is None:
        raise ImageFactsUnreadable(f"cannot read what {image} holds: {_python_failure(code)}\n{_tail(output)}",
                                   exit_code=code, output=_tail(output),
                                   hint="the labels are checked with the image's own python (python on its PATH)")
    raw = json.loads(line[len(_MARK):])
    return ImageFacts(raw["pkgs"], raw["installers"], tuple(raw["sonames"]), raw["cudart"], raw["python"],
                      raw["os"], raw["nvcc"], tuple(raw["imports"]), raw.get("wheel_libs", {}),
                      {n: tuple(p) for n, p in raw.get("compiled", {}).items()})


def _python_failure(code: int) -> str:
    """Why the image's python gave no facts, from the container's exit code: 127 and 126 are the
    engines' "not found" and "cannot execute" (docker's and podman's alike)."""
    if code == 127:
        return "there is no python on the image's PATH (exit 127)"
    if code == 126:
        return "python on the image's PATH cannot be executed (exit 126)"
    return f"its python exited {code}" + ("" if code else " without reporting them")


def _tail(output: str, lines: int = OUTPUT_LINES) -> str:
    kept = output.rstrip("\n").splitlines()
    cut = len(kept) - lines
    return ("".join([f"[{cut} earlier lines not shown]\n"] if cut > 0 else []) + "\n".join(kept[-lines:])).rstrip()


# --- the labels, against the facts ----------------------------------------------------------------


def _unsuffixed(name: str) -> str:
    return re.sub(r"-cu\d+$", "", name)


def tier_packages(flavor: str, cuda: str) -> set[str]:
    """The wheels (names without -cuXX) of NVIDIA's tier for that CUDA, from wheels.json: what an
    image of that flavor must carry."""
    ws = compat.cuda_wheel_set(cuda)
    names = {_unsuffixed(p) for extra in compat.tier_extras(flavor, cuda) for p, _ in dict(ws.extras)[extra]}
    if flavor != "base":
        names.add(_unsuffixed(compat.nccl_pin(cuda).split("==")[0]))
    return names




class _Verdicts:
    """The results of the label checks, one per label, with what was compared."""

    def __init__(self, labels: Mapping[str, str]):
        self.labels = labels
        self.results: list[TestResult] = []

    def verdict(self, label: str, ok: bool, found: str) -> None:
        want = self.labels.get(label)
        detail = f"{want!r}: {found}" if ok else f"says {want!r}, but {found}"
        self.results.append(TestResult(f"label {label}", "label", PASSED if ok else FAILED, detail))

    def missing(self, label: str, found: str) -> None:
        self.results.append(TestResult(f"label {label}", "label", FAILED, f"is missing, but {found}"))

    def skip(self, label: str, why: str) -> None:
        self.results.append(TestResult(f"label {label}", "label", SKIPPED, why))


def label_checks(labels: Mapping[str, str], facts: ImageFacts, recipe: Recipe | None = None) -> list[TestResult]:
    """Each io.imgbuild.* label against the image's facts: passed with what was found, failed with
    what the image holds instead (or a label missing for what it holds: cuDNN, torch), skipped
    where the label is no fact of the image's content, with the reason. ``recipe``: the recipe the
    image was built from, where known (its digest, weights and pins are then compared too)."""
    v = _Verdicts({k: val for k, val in labels.items() if k.startswith(K.PREFIX)})
    _cuda_labels(v, facts)
    _library_labels(v, facts)
    _recipe_labels(v, facts, recipe)
    # cuda.arch and gpus are held to the image's kernels, which these facts do not hold
    # (arch_label_checks, gpus_label_checks)
    known = {r.name.removeprefix("label ") for r in v.results} | {K.CUDA_ARCH, K.GPUS}
    for label in sorted(set(v.labels) - known):
        v.skip(label, "imgbuild has no check of this label against the image's content")
    return v.results


def _cuda_labels(v: _Verdicts, facts: ImageFacts) -> None:
    """CUDA version (the runtime's own cudaRuntimeGetVersion), source, flavor, driver floors."""
    cuda, flavor, source = v.labels.get(K.CUDA_VERSION), v.labels.get(K.CUDA_FLAVOR), v.labels.get(K.CUDA_SOURCE)
    wheels = {n: ver for n, ver in facts.pkgs.items() if n.startswith("nvidia-")}
    if cuda is not None:
        soname = f"libcudart.so.{cuda.split('.')[0]}"
        got = [f"{r // 1000}.{r % 1000 // 10}" if isinstance(r, int) else f"{so} fails to load: {r}"
               for so, r in facts.cudart.items() if so == soname]
        v.verdict(K.CUDA_VERSION, major_minor(cuda) in got,
                  f"the CUDA runtime reports {', '.join(got)}" if got else f"no {soname} in the loader cache")
        _check_floor_labels(v, cuda)
    if source == "wheels":
        runtime = {n: ver for n, ver in wheels.items() if n.startswith("nvidia-cuda-runtime")}
        same_minor = all(major_minor(r) == major_minor(cuda or "") for r in runtime.values())
        v.verdict(K.CUDA_SOURCE, bool(runtime) and same_minor,
                  f"runtime wheel {', '.join(f'{n}=={r}' for n, r in runtime.items())}" if runtime
                  else "no nvidia-cuda-runtime wheel is installed")
    elif source is not None:
        ok = any(s.startswith("libcudart.so.") for s in facts.sonames)
        v.verdict(K.CUDA_SOURCE, ok, "the CUDA runtime comes with the base image (libcudart in the loader cache)"
                  if ok else "no libcudart in the loader cache")
    if flavor is not None:
        problems = [] if facts.nvcc == (flavor == "devel") else ["nvcc is on PATH" if facts.nvcc else "no nvcc on PATH"]
        if source == "wheels" and cuda:
            have = {_unsuffixed(n) for n in wheels}
            try:
                tier = tier_packages(flavor, cuda)
            except compat.CompatGap as exc:  # e.g. devel from CUDA 12 wheels, which hold no nvcc
                problems.append(f"no such tier of wheels: {exc}")
                tier = have
            if not tier <= have:
                problems.append(f"it lacks {', '.join(sorted(tier - have))}")
            if flavor == "base" and not {K.TORCH_VERSION, K.CUDNN_VERSION} & set(v.labels) and have - tier:
                problems.append(f"it carries more than cudart: {', '.join(sorted(have - tier))}")
        found = ("NVIDIA's tier of wheels, " if source == "wheels" else "") + \
            ("nvcc on PATH" if facts.nvcc else "no nvcc on PATH")
        v.verdict(K.CUDA_FLAVOR, not problems, "; ".join(problems) or found)


def _library_labels(v: _Verdicts, facts: ImageFacts) -> None:
    """cuDNN and torch: each label true, and no such library in the image without its label."""
    cudnn = v.labels.get(K.CUDNN_VERSION)
    cached = sorted(s for s in facts.sonames if s.startswith("libcudnn.so."))
    shipped = {s: d for s, d in facts.wheel_libs.items() if s.startswith("libcudnn.so.")}
    libs = sorted(set(cached) | set(shipped))
    where = "; ".join(filter(None, [f"the loader cache has {', '.join(cached)}" if cached else "",
                                    ", ".join(f"{d} ships {s}" for s, d in sorted(shipped.items()))]))
    if cudnn is not None:
        found = where or "no libcudnn in the loader cache or any installed wheel"
        v.verdict(K.CUDNN_VERSION, f"libcudnn.so.{cudnn.split('.')[0]}" in libs and _cudnn_wheel_matches(cudnn, facts),
                  found + _cudnn_wheels_said(cudnn, facts))
    elif libs:
        v.missing(K.CUDNN_VERSION, f"the image has {', '.join(libs)} ({where})")
    torch, installed = v.labels.get(K.TORCH_VERSION), facts.pkgs.get("torch")
    if torch is not None:
        # PyPI's build records 2.4.1, PyTorch's index 2.4.1+cu124: the label names the build, either way
        v.verdict(K.TORCH_VERSION, installed in (torch, torch.split("+")[0]),
                  f"torch {installed} is installed" if installed else "torch is not installed")
    elif installed:
        v.missing(K.TORCH_VERSION, f"torch {installed} is installed")
    if K.PYTHON_VERSION in v.labels:
        v.verdict(K.PYTHON_VERSION, facts.python.startswith(v.labels[K.PYTHON_VERSION] + "."),
                  f"python is {facts.python}")
    if K.OS in v.labels:
        v.verdict(K.OS, facts.os == v.labels[K.OS], f"/etc/os-release says {facts.os}")


def _cudnn_wheel_matches(label: str, facts: ImageFacts) -> bool:
    """A cudnn label more precise than its major (9.1.0.70: what a wheel pin said) must be the version
    of an installed nvidia-cudnn wheel; a major alone is held to the library files only."""
    if "." not in label:
        return True
    return any(_version_is(version, label) for name, version in facts.pkgs.items() if is_cudnn_wheel(name))


def _cudnn_wheels_said(label: str, facts: ImageFacts) -> str:
    wheels = [f"{n} {v}" for n, v in sorted(facts.pkgs.items()) if is_cudnn_wheel(n)]
    return f"; installed: {', '.join(wheels)}" if "." in label and wheels else ""


def _version_is(version: str, label: str) -> bool:
    """9.1.0.70 is 9.1.0.70 and is 9.1; 9.10.2.21 is not 9.1."""
    return version.split(".")[:label.count(".") + 1] == label.split(".")


def _recipe_labels(v: _Verdicts, facts: ImageFacts, recipe: Recipe | None) -> None:
    """What the recipe put there: installer, recipe digest, weights (cuda.arch: arch_label_checks)."""
    if K.INSTALLER in v.labels:
        v.results.append(_installer_check(v.labels[K.INSTALLER], facts, recipe))
    digest = v.labels.get(K.RECIPE_DIGEST)
    if digest is not None and recipe is None:
        v.skip(K.RECIPE_DIGEST, "no recipe given to compare with (imgbuild test RECIPE checks it)")
    elif digest is not None and recipe is not None:
        v.verdict(K.RECIPE_DIGEST, digest == recipe.digest, f"{recipe.path} is {recipe.digest}"
                  + ("" if digest == recipe.digest else " (the recipe changed since the image was built)"))
    if K.WEIGHTS in v.labels:
        pairs = L.weights_from_labels(dict(v.labels))
        if recipe is None:
            v.verdict(K.WEIGHTS, bool(pairs), f"it names {len(pairs)} weights artifact(s)" if pairs else
                      "it is not a JSON list of {ref, mount}")
        else:
            want = [(w.ref, w.mount) for w in recipe.weights]
            v.verdict(K.WEIGHTS, pairs == want, f"the recipe lists {want}")


# --- io.imgbuild.cuda.arch against the kernels the source builds put into the image (issue 30) -------

_ARCH_ITEM = re.compile(r"(\d{1,2})\.(\d)([af]?)(\+PTX)?")


def _arch_claim(label: str) -> tuple[set[str], set[str]] | None:
    """``8.0;9.0a;10.0+PTX`` -> (SASS, PTX) in cuobjdump's spelling: ({sm_80, sm_90a, sm_100},
    {compute_100}); family code (10.0f) is named sm_100 as the reader names it. None: no such list."""
    sass: set[str] = set()
    ptx: set[str] = set()
    for item in label.split(";"):
        m = _ARCH_ITEM.fullmatch(item.strip())
        if m is None:
            return None
        kind = "a" if m[3] == "a" else ""
        sass.add(f"sm_{m[1]}{m[2]}{kind}")
        if m[4]:
            ptx.add(f"compute_{m[1]}{m[2]}{kind}")
    return sass, ptx


def _arch_key(name: str) -> tuple[int, str]:
    digits = re.search(r"\d+", name)
    return (int(digits[0]) if digits else 0, name)


def _carried(k: FileKernels) -> tuple[set[str], set[str]]:
    """(SASS, PTX) of the code the CUDA runtime loads from a file, named as ``_arch_claim`` names them."""
    return ({a.name for a in k.sass_archs()},
            {f"compute_{a.number}{'a' if a.specific else ''}" for a, _ in k.ptx()})


def _listed(names: set[str]) -> str:
    return ", ".join(sorted(names, key=_arch_key))


def arch_label_check(label: str | None, compiled: Mapping[str, tuple[str, ...]],
                     kernels: Mapping[str, FileKernels], unreadable: Mapping[str, str]) -> TestResult | None:
    """io.imgbuild.cuda.arch against the fat binaries of the files the source builds installed
    (``compiled``: distribution -> its shared objects; ``kernels``: what the reader found in them):
    each architecture it names present as SASS in one of them (arch-specific kinds exact), the PTX
    of each ``+PTX`` one, and no file carrying code the label omits. The failure names the file
    that decides. None: no label and nothing compiled carries kernels (nothing to check)."""
    name = f"label {K.CUDA_ARCH}"
    owner = {path: dist for dist, paths in compiled.items() for path in paths}
    carried = {p: kernels[p] for p in sorted(owner) if p in kernels and kernels[p].runnable}

    def failed(detail: str) -> TestResult:
        return TestResult(name, "label", FAILED, detail)

    if label is None:
        if not carried:
            return None
        path, k = next(iter(carried.items()))
        sass, ptx = _carried(k)
        return failed(f"is missing, but {path} ({owner[path]}, compiled from source) carries {_listed(sass | ptx)}")
    claim = _arch_claim(label)
    if claim is None:
        return failed(f"says {label!r}, which is no list of compute capabilities like 8.0;9.0a;10.0+PTX")
    if bad := sorted(p for p in owner if p in unreadable):
        return failed(f"says {label!r}, but the kernels of {bad[0]} ({owner[bad[0]]}) cannot be read: "
                      f"{unreadable[bad[0]]}")
    if not carried:
        built = (f"the packages compiled from source ({', '.join(sorted(compiled))}) carry no CUDA kernels"
                 if compiled else f"no package was installed from the compile stage's wheels ({LOCAL_WHEELS_MOUNT})")
        return failed(f"says {label!r}, but {built}")
    want_sass, want_ptx = claim
    have_sass: set[str] = set()
    have_ptx: set[str] = set()
    for path, k in carried.items():
        sass, ptx = _carried(k)
        if extra := (sass - want_sass) | (ptx - want_ptx):
            return failed(f"says {label!r}, but {path} ({owner[path]}) carries {_listed(extra)}, which it omits")
        have_sass |= sass
        have_ptx |= ptx
    if missing := (want_sass - have_sass) | (want_ptx - have_ptx):
        return failed(f"says {label!r}, but no file compiled from source carries {_listed(missing)} "
                      f"(read: {', '.join(carried)})")
    dists = sorted({owner[p] for p in carried})
    return TestResult(name, "label", PASSED, f"{label!r}: {len(carried)} file(s) compiled from source "
                      f"({', '.join(dists)}) carry {_listed(have_sass | have_ptx)}")


def arch_label_checks(engine: Engine, image_id: str, labels: Mapping[str, str], facts: ImageFacts,
                      *, other_platform: bool = False) -> list[TestResult]:
    """``arch_label_check`` on the image: the files the source builds installed are read from one
    streamed export of its file system (the rest of it skipped unread). ``other_platform``: the
    image tested is not the engine's own platform's, which is the one an export reads: skipped."""
    label = labels.get(K.CUDA_ARCH)
    if label is None and not facts.compiled:
        return []
    if other_platform:
        return [TestResult(f"label {K.CUDA_ARCH}", "label", SKIPPED, "the kernels are read from the engine's "
                           "own platform's image; this is another platform's")]
    files = {p for paths in facts.compiled.values() for p in paths}
    kernels: Mapping[str, FileKernels] = {}
    errors: Mapping[str, str] = {}
    if files:
        with engine.filesystem(image_id) as chunks:
            scan = scan_kernels(io.BufferedReader(IterStream(chunks), 1 << 20), wanted=files.__contains__)
        kernels, errors = scan.kernels, scan.errors
    found = arch_label_check(label, facts.compiled, kernels, errors)
    return [found] if found else []


def gpus_label_checks(label: str, files: Iterable[FileKernels], unreadable: Iterable[tuple[str, str]] = (),
                      cuda: str | None = None) -> list[TestResult]:
    """io.imgbuild.gpus against the kernels read from the image (gpu_coverage): one test per GPU
    it names, passed when every CUDA library has SASS that runs on it or PTX the driver JITs (said
    in the detail), failed with the library that has no kernel for it. ``cuda``: the image's CUDA
    (its label), so that of per-CUDA builds side by side only the one loaded counts."""
    files = loaded_alternatives(files, cuda)
    results = []
    for name in (n.strip() for n in label.split(";") if n.strip()):
        test = f"label {K.GPUS}: {name}"
        try:
            gpu = resolve_gpu(name)
        except UsageError as exc:
            results.append(TestResult(test, "label", "failed", f"the label names {exc.message}"))
            continue
        report = gpu_report("", gpu, files, unreadable)
        detail = report.message() + (f" ({len(report.unreadable)} file(s) unreadable)" if report.unreadable else "")
        results.append(TestResult(test, "label", "passed" if report.runs else "failed", detail))
    return results


def _check_floor_labels(v: _Verdicts, cuda: str) -> None:
    """The driver floors against imgbuild's data for the image's CUDA (compat.floors, which stamped
    them): checked when absent too, as no floor may be claimed where NVIDIA publishes none (CUDA
    13.3+). A CUDA the data does not know (an image from a newer imgbuild) has nothing to compare with."""
    try:
        want = compat.floor_labels(compat.driver_floor(cuda))
    except compat.CompatGap:
        for label in sorted({K.DRIVER_MIN, K.DRIVER_MIN_COMPAT} & set(v.labels)):
            v.skip(label, f"imgbuild's data does not know CUDA {cuda}: nothing to compare the floor with")
        return
    for label in (K.DRIVER_MIN, K.DRIVER_MIN_COMPAT):
        v.verdict(label, v.labels.get(label) == want.get(label),
                  f"imgbuild's data for CUDA {cuda} says {want.get(label) or 'none (NVIDIA publishes none): no label'}")


def _installer_check(label: str, facts: ImageFacts, recipe: Recipe | None) -> TestResult:
    """io.imgbuild.installer ("uv 0.13.9", "pip") against the INSTALLER record of what imgbuild
    installed: every pin of the recipe where it has pins, else at least one package of the image."""
    tool = label.split(maxsplit=1)[0]
    name = f"label {K.INSTALLER}"
    pins = [pin_name(p) for p in recipe.pip] + (["torch"] if recipe.torch else []) if recipe else []
    if pins:
        wrong = {n: facts.installers.get(_norm(n)) for n in pins if facts.installers.get(_norm(n)) != tool}
        if wrong:
            found = ", ".join(f"{n} by {r or 'nothing recorded'}" for n, r in sorted(wrong.items()))
            return TestResult(name, "label", FAILED, f"says {label!r}, but the recipe's pins were installed "
                                                     f"otherwise: {found}")
        return TestResult(name, "label", PASSED, f"{label!r}: each pin of the recipe records {tool} as its installer")
    by_tool = sorted(n for n, r in facts.installers.items() if r == tool)
    if not by_tool:
        return TestResult(name, "label", FAILED, f"says {label!r}, but no package of the image records {tool} "
                                                 "as its installer")
    return TestResult(name, "label", PASSED, f"{label!r}: {len(by_tool)} package(s) record {tool} as their "
                                             f"installer (e.g. {by_tool[0]})")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def import_checks(facts: ImageFacts, *, gpu: bool) -> list[TestResult]:
    """Each pinned package: installed at its pinned version, and its top-level modules import.
    An import that fails only for want of an NVIDIA driver is skipped where the engine has no GPU."""
    out = []
    for rec in facts.imports:
        name, want, version = rec["name"], rec["want"], rec["version"]
        mods = ", ".join(rec["modules"]) or "no module"
        title = f"import {name}"
        command = f"import {mods}" if rec["modules"] else None
        if rec["error"] == "not installed":
            out.append(TestResult(title, "import", FAILED, f"{name}=={want} is pinned but not installed"))
        elif version != want:
            out.append(TestResult(title, "import", FAILED, f"{name}=={want} is pinned, but {version} is installed"))
        elif rec["error"] and not gpu and _NEEDS_DRIVER.search(rec["error"]):
            out.append(TestResult(title, "import", SKIPPED, f"import {mods} needs an NVIDIA driver, and this "
                                  "engine has no GPU runtime", command=command, output=_tail(rec["error"])))
        elif rec["error"]:
            out.append(TestResult(title, "import", FAILED, f"{name}=={version}: import {mods} failed",
                                  command=command, output=_tail(rec["error"])))
        elif not rec["modules"]:
            out.append(TestResult(title, "import", SKIPPED, f"{name}=={version} is installed; it has no "
                                  "top-level module to import"))
        else:
            out.append(TestResult(title, "import", PASSED, f"{name}=={version}: import {mods}", command=command))
    return out


def pinned(recipe: Recipe | None, labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """(name, version) of each package the recipe pins (torch included); without a recipe, torch
    from its label, as that is the one pin an image names."""
    pins = [(pin_name(p), p.split("==", 1)[1]) for p in recipe.pip] if recipe else []
    torch = recipe.torch if recipe else (labels.get(K.TORCH_VERSION) or "").split("+")[0] or None
    if torch:
        pins.append(("torch", torch.split("+")[0]))
    return tuple(pins)


# --- the recipe's test: commands -------------------------------------------------------------------


def _command_of(test: TestSpec, recipe: Recipe) -> tuple[str, tuple[str, ...], tuple[tuple[Path, str], ...]]:
    """(entrypoint, arguments, mounts) that run ``test`` in the image."""
    if test.run is not None:
        return "sh", ("-c", test.run), ()
    assert test.script is not None  # noqa: S101 - the recipe loader gives one of the two
    target = str(PurePosixPath(SCRIPT_DIR) / PurePosixPath(test.script).name)
    mounts = ((recipe.context_dir.resolve() / test.script, target),)
    suffix = PurePosixPath(test.script).suffix
    if suffix == ".py":
        return "python", (target,), mounts
    if suffix == ".sh":
        return "sh", (target,), mounts
    return target, (), mounts


def no_gpu_reason(engine: Engine) -> str:
    return (f"needs a GPU (gpu: true), and the {engine.describe()} has no GPU runtime (no nvidia runtime "
            "registered, no NVIDIA CDI spec in /etc/cdi or /var/run/cdi)")


def command_test(engine: Engine, image: str, test: TestSpec, recipe: Recipe, *, gpu: bool,
                 platform: str | None = None, tracer: Tracer | None = None, number: int = 0) -> TestResult:
    shown = test.run if test.run is not None else f"{test.script} (mounted at {SCRIPT_DIR})"
    if test.gpu and not gpu:
        return TestResult(test.name, "command", SKIPPED, no_gpu_reason(engine), command=shown)
    entrypoint, args, mounts = _command_of(test, recipe)
    start = time.monotonic()
    ended, output = run_in_image(engine, image, args, entrypoint=entrypoint, gpu=test.gpu, mounts=mounts,
                                 platform=platform, timeout=test.timeout,
                                 trace=(tracer, f"test-{number}") if tracer else None)
    took = time.monotonic() - start
    code = ended.code
    if ended.timed_out:
        return TestResult(test.name, "command", FAILED,
                          f"still running after its timeout of {test.timeout} s: the container was removed",
                          command=shown, exit_code=code, output=_tail(output), seconds=took)
    if code == 0:
        return TestResult(test.name, "command", PASSED, f"exit 0{' on a GPU' if test.gpu else ''}", command=shown,
                          exit_code=0, seconds=took)
    return TestResult(test.name, "command", FAILED, f"exit {code}", command=shown, exit_code=code,
                      output=_tail(output), seconds=took)


# --- everything, and the verdict ----------------------------------------------------------------------


def run_image_tests(engine: Engine, image: str, *, recipe: Recipe | None = None, defaults: bool = True,
                    on_event: EventSink | None = None, shown_as: str | None = None,
                    platform: str | None = None, tracer: Tracer | None = None) -> TestReport:
    """Every test of ``image``: with ``defaults``, its io.imgbuild.* labels against its content and
    the import of each pin (one container); then the recipe's ``test:`` commands, one container
    each. Each verdict is told to ``on_event`` as it comes; ``shown_as`` names the image in the
    report (a build tests its image by id, before it has its tags). ``platform``: test that
    platform's image of a multi-platform one (every platform carries the same labels: one Dockerfile),
    its verdicts told with the platform first; None: the engine's own platform's, which the report names.
    ``tracer``: every test container runs under it, which records the files each one reads (lazy.py)."""
    say = on_event or (lambda _line: None)
    note = (lambda line: say(f"[{platform}] {line}")) if platform else say
    gpu = engine.gpu_available()
    if any(t.gpu for t in (recipe.tests if recipe else ())) and not gpu:
        note(f"no GPU here: the {engine.describe()} has no GPU runtime; tests with gpu: true are skipped")
    results: list[TestResult] = []

    def add(found: list[TestResult]) -> None:
        for r in found:
            results.append(r)
            note(_event(r))

    info = engine.image(image)
    if info is None:
        raise InspectError(f"no image {image} in the {engine.describe()}")
    if defaults:
        labels = info.labels
        try:
            facts = read_facts(engine, image, pinned(recipe, labels), platform=platform, tracer=tracer)
        except ImageFactsUnreadable as exc:  # the image fails its test; its labels and pins go unchecked
            add([facts_failure(exc)])
        else:
            add(label_checks(labels, facts, recipe))
            add(arch_label_checks(engine, info.id, labels, facts,
                                  other_platform=platform is not None and platform != info.platform))
            add(import_checks(facts, gpu=gpu))
        if K.GPUS in labels:
            add(_gpus_test(engine, image, labels, info, platform))
    if recipe is not None:
        for number, test in enumerate(recipe.tests):
            add([command_test(engine, image, test, recipe, gpu=gpu, platform=platform, tracer=tracer,
                              number=number)])
    return TestReport(shown_as or image, gpu, tuple(results), platform or info.platform)


def _gpus_test(engine: Engine, image: str, labels: Mapping[str, str], info: ImageInfo,
               platform: str | None) -> list[TestResult]:
    """The GPUs label against the kernels of the image the engine holds (one streamed read of its
    file system); another platform's image of a multi-platform build is not what it exports."""
    if platform and platform != info.platform:
        return [TestResult(f"label {K.GPUS}", "label", "skipped", f"the engine's image is {info.platform}'s, "
                                                       f"not {platform}'s: its kernels are read there")]
    files, unreadable = read_image_kernels(engine, image)
    return gpus_label_checks(labels[K.GPUS], files, unreadable, labels.get(K.CUDA_VERSION))


FACTS_TEST = "python on PATH"  # the default tests' first need: the image's own python runs


def facts_failure(exc: ImageFactsUnreadable) -> TestResult:
    """The failed test of an image whose python cannot report its facts: a fault of the image (no
    python on its PATH, one that crashes), so the build keeps it as rejected like any failed test."""
    why = _python_failure(exc.exit_code)
    return TestResult(FACTS_TEST, "label", FAILED, f"{why}: the label and import checks run the image's own "
                      "python, so none of them could run", command="python -c FACTS_SCRIPT (imgbuild's)",
                      exit_code=exc.exit_code, output=exc.output)


def _event(r: TestResult) -> str:
    return f"test {r.status:7} {r.name}: {r.detail}"


def require_passed(report: TestReport) -> None:
    """ImageTestFailed naming every failed test with its output (once) when one failed."""
    if report.failed:
        raise failure_of(report)


def failure_of(report: TestReport, *, kept_as: str | None = None,
                 reports: tuple[TestReport, ...] = ()) -> ImageTestFailed:
    """The error of a report with failed tests: every failed test with its output (once); for a
    build, what the refused image is kept as and the reports of the platforms tested."""
    failed = report.failed
    parts = [f"{len(failed)} of {len(report.results)} tests of {report.image} failed:"]
    for r in failed:
        parts.append(f"- {r.name}: {r.detail}" + (f"\n  command: {r.command}" if r.command else ""))
        if r.output:
            parts.append(f"--- output of {r.name} ---\n{r.output}\n--- end of output ---")
    if kept_as is not None:
        parts[-1] += f"\nnothing was pushed; the image is kept as {kept_as}"
    return ImageTestFailed("\n".join(parts), failures=[r.to_json() for r in failed], kept_as=kept_as,
                           reports=reports, hint="fix the image (or the test), then build again; "
                                                 "`imgbuild test IMAGE|RECIPE` runs the tests alone")
