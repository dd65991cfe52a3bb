"""What each pinned wheel brings, read from the wheel itself: the content model the plan's claims
about CUDA libraries and cuDNN are derived from (issue 29, item 1).

One ``WheelContents`` per (project, version, Linux machine), from data/wheel_contents.json (written by
scripts/wheel_contents.py from the package index: PEP 691 file lists, PEP 658 METADATA, the zip
directory of one wheel read with HTTP range requests; download.pytorch.org's large torch wheels from
PyTorch's build script, which names the libraries it copies into torch/lib). A pin the data has no row
for is read live by ``read_wheel`` (pipeline/lookups.py decides when; --offline leaves it unknown).

The rules over the model are small functions here: which shared libraries a set of wheels puts in the
image (``image_libraries``: each wheel's own, and those of the nvidia-* wheels its Requires-Dist pins),
which CUDA libraries those are (``cuda_libraries``), which cuDNN major they load (``cudnn_major``), and
whether a wheel carries its own CUDA runtime (``bundles_cuda_runtime``), and all of it for one image
(``image_cuda``: what resolve stamps on the Resolution and checks the cuda.* and cudnn labels against).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from buildkit_py.compat import tables
from buildkit_py.compat.platforms import PinFiles
from buildkit_py.compat.torch_data import TorchRelease
from buildkit_py.errors import CompatDataError
from buildkit_py.versions import major_minor

if TYPE_CHECKING:   # index is imported only where a lookup goes to the network (its docstring)
    from buildkit_py.compat.index import IndexClient, Project

FILE = "wheel_contents.json"
MACHINES = ("x86_64", "aarch64")
_SHARED = re.compile(r"^(lib[^/]*?)\.so(\.[0-9][0-9.]*)?$")
_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_(\w+)$")
_LEGACY = {"manylinux1": "2.5", "manylinux2010": "2.12", "manylinux2014": "2.17"}
# the soname stem -> the CUDA library NVIDIA's tiers name it by (wheels.json ``tiers`` extras)
_CUDA_STEMS = {"libcudart": "cudart", "libcublas": "cublas", "libcublasLt": "cublas", "libcufft": "cufft",
               "libcurand": "curand", "libcusolver": "cusolver", "libcusparse": "cusparse", "libnvrtc": "nvrtc",
               "libnvToolsExt": "nvtx", "libnvtx3interop": "nvtx", "libnvJitLink": "nvjitlink", "libcupti": "cupti",
               "libcufile": "cufile", "libnccl": "nccl", "libcudnn": "cudnn", "libcusparseLt": "cusparselt",
               "libnvshmem_host": "nvshmem", "libnvjpeg": "nvjpeg", "libOpenCL": "opencl", "libnvfatbin": "nvfatbin",
               "libnvblas": "cublas"}
_NPP = re.compile(r"^libnpp[a-z]*$")   # libnppc, libnppial ... libnpps: NPP's parts


@dataclass(frozen=True)
class FileFacts:
    """What a wheel's file name says: the machines it runs on ("any" for a pure wheel), its Python
    tags, and the glibc its manylinux tag asks for (None: not a manylinux wheel)."""
    machines: frozenset[str]
    python: tuple[str, ...]
    glibc: str | None


def file_facts(filename: str) -> FileFacts:
    tags = parse_wheel_filename(filename)[3]
    machines: set[str] = set()
    glibc: list[str] = []
    for tag in tags:
        plat = tag.platform
        if plat == "any":
            machines.add("any")
            continue
        if (m := _MANYLINUX.match(plat)) is not None:
            machines.add(m.group(3))
            glibc.append(f"{m.group(1)}.{m.group(2)}")
            continue
        for legacy, floor in _LEGACY.items():
            if plat.startswith(legacy + "_"):
                machines.add(plat[len(legacy) + 1:])
                glibc.append(floor)
        if plat.startswith("linux_"):
            machines.add(plat[len("linux_"):])
    return FileFacts(frozenset(machines), tuple(sorted({t.interpreter for t in tags})),
                     min(glibc, key=Version) if glibc else None)


def shared_libraries(members: Iterable[str]) -> list[str]:
    """The shared libraries (lib*.so[.N]) among a wheel's file names, as sorted basenames."""
    return sorted({base for name in members if _SHARED.match(base := name.rsplit("/", 1)[-1])})


@dataclass(frozen=True)
class WheelContents:
    project: str                          # canonical name
    version: str                          # a local version (2.1.0+cu118) for PyTorch's own index
    machine: str                          # x86_64 / aarch64 (a pure wheel: "any"; an sdist only: "source")
    python: tuple[str, ...]               # the Python tags of that machine's wheels (cp310, cp311, py3)
    glibc: str | None                     # the lowest manylinux glibc of those wheels
    sdist: bool                           # the release has an sdist to build from
    file: str | None                      # the wheel read (None: not read from an index)
    requires_dist: tuple[str, ...] | None  # None: not read (recorded from a build script, or an sdist only)
    libraries: tuple[str, ...]            # .so basenames it bundles
    source: str

    def requirements(self, python: str = "3.12") -> dict[str, Requirement]:
        """Its Requires-Dist for a Linux interpreter of this machine (no extras), by canonical name."""
        env = {k: str(v) for k, v in default_environment().items()}
        env.update({"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
                    "platform_machine": self.machine if self.machine in MACHINES else "x86_64",
                    "python_version": python, "python_full_version": f"{python}.0", "implementation_name": "cpython",
                    "platform_python_implementation": "CPython", "extra": ""})
        out: dict[str, Requirement] = {}
        for line in self.requires_dist or ():
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is None or req.marker.evaluate(env):
                out[canonicalize_name(req.name)] = req
        return out

    def pins(self, python: str = "3.12") -> dict[str, str]:
        """The exact (==) requirements, name -> version: what pip installs with it, no choice left."""
        out = {}
        for name, req in self.requirements(python).items():
            specs = list(req.specifier)
            if len(specs) == 1 and specs[0].operator == "==" and "*" not in specs[0].version:
                out[name] = specs[0].version
        return out

    def bundled(self, stem: str) -> tuple[str, ...]:
        """The sonames it bundles of one library (``libcudart`` -> ("libcudart.so.11.0",))."""
        return tuple(lib for lib in self.libraries if (m := _SHARED.match(lib)) and m.group(1) == stem)


@dataclass(frozen=True)
class ContentModel:
    rows: dict[tuple[str, str, str], WheelContents]
    as_of: str

    def wheel(self, project: str, version: str, machine: str = "x86_64") -> WheelContents | None:
        """The row of one release for ``machine`` (a pure wheel's row serves every machine)."""
        name = canonicalize_name(project)
        key = _version_key(version)
        return self.rows.get((name, key, machine)) or self.rows.get((name, key, "any"))

    def knows(self, project: str, version: str) -> bool:
        name, key = canonicalize_name(project), _version_key(version)
        return any(n == name and v == key for n, v, _ in self.rows)

    def machines(self, project: str, version: str) -> frozenset[str] | None:
        """The Linux machines the release has a wheel for (None: the data has no row for it)."""
        name, key = canonicalize_name(project), _version_key(version)
        found = {m for n, v, m in self.rows if n == name and v == key}
        return frozenset(found - {"source"}) if found else None


    def has_sdist(self, project: str, version: str) -> bool | None:
        """Whether the release has an sdist to build from (None: the data has no row for it)."""
        name, key = canonicalize_name(project), _version_key(version)
        found = [w.sdist for (n, v, _), w in self.rows.items() if n == name and v == key]
        return any(found) if found else None

    def with_rows(self, wheels: Iterable[WheelContents]) -> ContentModel:
        """This model and rows read live (a pin the data has no row for): the live rows win."""
        extra = {(w.project, _version_key(w.version), w.machine): w for w in wheels}
        return ContentModel({**self.rows, **extra}, self.as_of) if extra else self

    def pin_files(self, project: str) -> PinFiles | None:
        """The releases of ``project`` the data records, as the platform rule reads a live file list
        (the machines of each release's Linux wheels, whether it has an sdist): a pin the model knows
        is judged per platform offline too. None: the data has no row of it."""
        name = canonicalize_name(project)
        by_version: dict[str, tuple[set[str], bool]] = {}
        for w in self.rows.values():
            if w.project == name and not Version(w.version).local:
                machines, sdist = by_version.setdefault(w.version, (set(), False))
                machines |= {w.machine} - {"source"}
                by_version[w.version] = (machines, sdist or w.sdist)
        if not by_version:
            return None
        releases = tuple((v, frozenset(m), sd)
                         for v, (m, sd) in sorted(by_version.items(), key=lambda i: Version(i[0])))
        return PinFiles(name, releases, f"imgbuild's {FILE} (as of {self.as_of})")


def _version_key(version: str) -> str:
    try:
        return str(Version(version))
    except InvalidVersion:
        return version


@functools.cache
def model() -> ContentModel:
    raw = tables.load_raw(FILE)
    rows = {}
    for i, r in enumerate(raw["wheels"]):
        try:
            w = WheelContents(canonicalize_name(r["project"]), r["version"], r["machine"], tuple(r["python"]),
                              r["glibc"], bool(r["sdist"]), r["file"],
                              None if r["requires_dist"] is None else tuple(r["requires_dist"]),
                              tuple(r["libraries"]), r["source"])
            Version(w.version)
        except (KeyError, TypeError, InvalidVersion) as exc:
            raise CompatDataError(f"compat data {FILE}: wheels[{i}]: {exc}") from None
        if not w.source:
            raise CompatDataError(f"compat data {FILE}: wheels[{i}] ({w.project} {w.version}): no source")
        rows[(w.project, _version_key(w.version), w.machine)] = w
    return ContentModel(rows, str(raw["as_of"]))


def read_wheel(client: IndexClient, project: Project, version: str, machine: str, today: str, *,
               source: str | None = None) -> WheelContents | None:
    """Read one release's row from an index (a ``compat.index.IndexClient`` and its ``Project``): of its
    wheels for ``machine``, else of its pure wheels (a row for machine "any"); None where it has neither.
    Two or three range reads (PEP 658 METADATA, the zip's central directory): no wheel downloaded whole."""
    wheels = [(f, file_facts(f.filename)) for f in project.files_of(version) if f.is_wheel]
    files = [(f, x) for f, x in wheels if machine in x.machines]
    if not files:
        files, machine = [(f, x) for f, x in wheels if "any" in x.machines], "any"
    if not files:
        return None
    pick = next((f for f, _ in files if any(t.startswith("cp312-") for t in f.tags)),
                sorted((f for f, _ in files), key=lambda f: f.filename)[-1])
    glibcs = [x.glibc for _, x in files if x.glibc]
    meta = client.metadata(pick)
    return WheelContents(canonicalize_name(project.name), version, machine,
                         tuple(sorted({t for _, x in files for t in x.python})),
                         min(glibcs, key=Version) if glibcs else None,
                         any(not f.is_wheel for f in project.files_of(version)), pick.filename,
                         meta.requires_dist, tuple(shared_libraries(client.members(pick))),
                         source or f"{project.index_url}{project.name}/ {pick.filename}, read live {today}")


# ----------------------------------------------------------------------------- rules over the model
def image_libraries(wheels: Iterable[WheelContents], m: ContentModel | None = None,
                    python: str = "3.12") -> frozenset[str]:
    """The shared libraries these wheels put in the image: each one's own, and those of every wheel
    its Requires-Dist pins exactly (one level: NVIDIA's wheels pin nothing that bundles more CUDA)."""
    m = m or model()
    out: set[str] = set()
    for w in wheels:
        out |= set(w.libraries)
        for name, version in w.pins(python).items():
            dep = m.wheel(name, version, w.machine)
            if dep is not None:
                out |= set(dep.libraries)
    return frozenset(out)


def cuda_libraries(libraries: Iterable[str]) -> frozenset[str]:
    """The CUDA libraries (wheels.json's extra names: cudart, cublas, cudnn, nccl ...) among sonames."""
    out = set()
    for lib in libraries:
        if (m := _SHARED.match(lib)) is None:
            continue
        if m.group(1) in _CUDA_STEMS:
            out.add(_CUDA_STEMS[m.group(1)])
        elif _NPP.match(m.group(1)):
            out.add("npp")
    return frozenset(out)


def cudnn_major(libraries: Iterable[str]) -> str | None:
    """The cuDNN major the image loads, from libcudnn.so.N (None: no cuDNN among them)."""
    majors = {m.group(2)[1:].split(".")[0] for lib in libraries
              if (m := _SHARED.match(lib)) is not None and m.group(1) == "libcudnn" and m.group(2)}
    return max(majors, key=int) if majors else None


def bundles_cuda_runtime(w: WheelContents) -> bool:
    """The wheel carries its own libcudart (a large torch wheel): its CUDA sits in its own lib folder,
    loaded by its RPATH, where nothing else in the image finds it."""
    return bool(w.bundled("libcudart"))


def torch_wheel(release: TorchRelease, variant: str, machine: str = "x86_64") -> WheelContents | None:
    """The content row of torch ``release``'s ``variant``: its PyPI wheel for the PyPI build, the
    download.pytorch.org one (``2.1.0+cu118``) otherwise; None where the data has none (PyTorch's own
    index is not readable here: only its large wheels are recorded, from its build script)."""
    version = release.version if variant == release.pypi_variant else f"{release.version}+{variant}"
    return model().wheel("torch", version, machine)


def torch_bundles_cuda(release: TorchRelease, variant: str) -> bool:
    """Does torch ``release``'s ``variant`` carry its own CUDA runtime in torch/lib (a large wheel: the
    download.pytorch.org builds before pytorch PR #114620)? Read from the wheel's recorded libraries;
    then torch brings no CUDA library another package can load."""
    w = torch_wheel(release, variant)
    return w is not None and bundles_cuda_runtime(w)


@dataclass(frozen=True)
class ImageCuda:
    """The CUDA libraries an image gets from its wheels, as the content model says: ``loadable``, those
    of nvidia-* wheels in site-packages (any package finds them: bitsandbytes loads libcudart so);
    ``private``, those a wheel keeps in its own lib folder (a large torch wheel's torch/lib: only it
    loads them); ``cudnn``, the cuDNN major among all of them; ``unread``, the pins the model has no
    row for (what they bring is not known: the set is partial)."""
    loadable: frozenset[str]
    private: frozenset[str]
    cudnn: str | None
    unread: tuple[str, ...]
    cudart: tuple[str, ...] = ()   # the versions of the runtime wheels that bring a loadable libcudart

    def lacks(self, extras: Iterable[str]) -> frozenset[str]:
        """The CUDA libraries of ``extras`` (a tier: wheels.json ``tiers``) none of the image's wheels
        brings loadable: what a cuda.flavor label of that tier would claim falsely. Extras without a
        shared library (nvcc, headers) are not counted."""
        return frozenset(set(extras) & set(_CUDA_STEMS.values()) | ({"npp"} & set(extras))) - self.loadable

    @property
    def cuda_minors(self) -> frozenset[str]:
        """The CUDA major.minor of the loadable runtime (nvidia-cuda-runtime's version is its CUDA's:
        12.1.105 is CUDA 12.1): what the cuda.version label must name for a wheels image."""
        return frozenset(major_minor(v) for v in self.cudart)

    @property
    def partial(self) -> bool:
        return bool(self.unread)


def image_cuda(pins: Iterable[str], torch: WheelContents | None = None, machine: str = "x86_64",
               python: str = "3.12", m: ContentModel | None = None) -> ImageCuda:
    """What ``pins`` (name==version: the CUDA wheels the plan installs and the recipe's exact pip pins)
    and ``torch`` (its content row) put in the image, by the rules above."""
    m = m or model()
    loadable: set[str] = set()
    private: set[str] = set()
    sonames: set[str] = set()
    unread = []
    wheels = []
    for pin in pins:
        name, _, version = pin.partition("==")
        w = m.wheel(name, version.strip(), machine)
        if w is None:
            if canonicalize_name(name).startswith("nvidia-") or canonicalize_name(name) == "cuda-toolkit":
                unread.append(pin)
            continue
        wheels.append(w)
    if torch is not None:
        wheels.append(torch)
    cudart: set[str] = set()

    def add_loadable(w: WheelContents) -> None:
        loadable.update(cuda_libraries(w.libraries))
        sonames.update(w.libraries)
        if w.bundled("libcudart"):
            cudart.add(w.version)

    for w in wheels:
        if w.project.startswith("nvidia-"):
            add_loadable(w)
        else:
            private.update(cuda_libraries(w.libraries))
            sonames.update(w.libraries)
        requirements = w.requirements(python)
        for name, version in w.pins(python).items():
            deps = ([f"{name}=={version}"] if name != "cuda-toolkit"
                    else _toolkit_pins(version, requirements[name].extras))
            for dep_pin in deps:
                dep_name, _, dep_version = dep_pin.partition("==")
                if (dep := m.wheel(dep_name, dep_version, machine)) is not None:
                    add_loadable(dep)
                elif dep_name.startswith("nvidia-") or dep_name == "cuda-toolkit":
                    unread.append(dep_pin)
    return ImageCuda(frozenset(loadable), frozenset(private), cudnn_major(sonames), tuple(sorted(set(unread))),
                     tuple(sorted(cudart, key=Version)))


def _toolkit_pins(version: str, extras: Iterable[str]) -> list[str]:
    """NVIDIA's cuda-toolkit meta package (torch's CUDA 13 builds require ``cuda-toolkit[cudart,...]==X``):
    the nvidia-* wheels its extras pin, as wheels.json read them from its METADATA."""
    for ws in tables.all_cuda_wheel_sets():
        if ws.meta_package == f"cuda-toolkit=={version}" or ws.toolkit == version:
            return list(ws.pins(*extras))
    return [f"cuda-toolkit=={version}"]   # a release wheels.json does not record: unread


def unrecorded_cuda_pins(pins: Iterable[str]) -> tuple[str, ...]:
    """The exact pins of NVIDIA's CUDA wheels (nvidia-*) the data has no x86_64 row for: what the plan-time
    look-up reads live, since what they bring decides the image's CUDA libraries."""
    out = []
    for spec in pins:
        name, sep, version = spec.partition("==")
        name = canonicalize_name(name.strip())
        if sep and name.startswith("nvidia-") and model().wheel(name, version.strip()) is None:
            out.append(f"{name}=={version.strip()}")
    return tuple(out)
