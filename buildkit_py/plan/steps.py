"""The plan -> template contract: one frozen type per kind of build step.

Each type names the macro of ``templates/steps.j2`` that places it (``MACRO``) and carries
exactly the values that macro reads, already computed, sorted and validated by Python; the
template only places them. A step the template does not know cannot be written: the macro
name is part of the type, and ``tests/test_steps.py`` renders each type to its exact text.

Files a step bind-mounts from the build context are part of the step (``ContextFile``), so
the Dockerfile and the context assembled for it always agree (``BuildPlan.context_files``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import ClassVar

from buildkit_py.plan.installer import PIP_INSTALLER, Installer


def _parents(path: str) -> tuple[str, ...]:
    """The folders above an absolute ``path``, nearest first, "/" left out."""
    return tuple(str(p) for p in PurePosixPath(path).parents if str(p) != "/")


@dataclass(frozen=True)
class ContextFile:
    """A file written into the build context for a step to bind-mount (never into a layer)."""

    path: str  # relative to the context root
    text: str
    # Its text never changes (the mount stubs' tree), so the context writer may date it
    # SOURCE_DATE_EPOCH; a file whose text changes must keep a fresh mtime (engine/build.py write_context).
    dated: bool = False


@dataclass(frozen=True)
class Step:
    """Common to every step: its id (unique within its stage, written into the RUN as
    ``imgbuild-step=<id>`` so `inspect` maps layers back to steps) and its layer group (one
    of plan.GROUPS, by which sizes are reported)."""

    MACRO: ClassVar[str] = ""

    id: str
    group: str

    @property
    def macro(self) -> str:
        return self.MACRO

    @property
    def context_files(self) -> tuple[ContextFile, ...]:
        return ()

    @property
    def is_run(self) -> bool:
        """Whether the step is one RUN instruction (copy and metadata steps are not)."""
        return True


@dataclass(frozen=True)
class AptStep(Step):
    """``apt-get install`` of sorted Debian/Ubuntu packages, with the apt caches mounted."""

    MACRO: ClassVar[str] = "step_apt"
    packages: tuple[str, ...]


@dataclass(frozen=True)
class DeadsnakesStep(Step):
    """Adds the deadsnakes PPA, which has the CPython the OS lacks."""

    MACRO: ClassVar[str] = "step_deadsnakes"
    python: str  # X.Y


@dataclass(frozen=True)
class VenvStep(Step):
    """Creates the virtual environment every later pip step installs into, and puts it first on PATH."""

    MACRO: ClassVar[str] = "step_venv"
    python: str  # interpreter command, e.g. python3 or python3.11
    venv: str


@dataclass(frozen=True)
class PipStep(Step):
    """``pip install`` (or ``uv pip install``, by ``installer``) of requirement specifiers (with
    their dependencies), in the order given. uv compiles bytecode as pip does.

    ``no_deps``: the requirements are a complete set of exact pins (the CUDA wheels of a torch
    release), installed without resolving. ``reproducible``: the layer is byte-identical
    wherever the same pins are installed on the same base: /tmp is a tmpfs, bytecode is
    compiled after every new file's mtime is set to SOURCE_DATE_EPOCH (timestamp pycs, fixed
    hash seed), and the changed directories up to / get that mtime too; no pip cache or log
    reaches the layer (the cache is a mount). Needs a ``MountStubsStep`` earlier in the stage."""

    MACRO: ClassVar[str] = "step_pip"
    requirements: tuple[str, ...]
    index_url: str | None = None  # replaces the Python registry (the torch index), or None
    no_deps: bool = False
    reproducible: bool = False
    installer: Installer = PIP_INSTALLER  # uv: the same install by uv (plan/installer.py)


@dataclass(frozen=True)
class LockedPipStep(Step):
    """A pip step of a locked build (lock.apply_lock): the exact wheels by sha256, installed
    with ``--no-deps --require-hashes`` from a requirements file bind-mounted from the context."""

    MACRO: ClassVar[str] = "step_pip_locked"
    requirements_file: ContextFile
    mount_target: str  # where the RUN sees the file
    index_url: str | None
    extra_index_urls: tuple[str, ...]
    reproducible: bool = False  # as PipStep.reproducible
    installer: Installer = PIP_INSTALLER  # as PipStep.installer

    @property
    def context_files(self) -> tuple[ContextFile, ...]:
        return (self.requirements_file,)


# The one folder, outside every venv, that the Python-independent CUDA wheels install into.
CUDA_PREFIX = "/opt/imgbuild/cuda-wheels"


@dataclass(frozen=True)
class PrefixPipStep(PipStep):
    """A reproducible pip step whose wheels, all Python-independent (py3-none: the nvidia-* CUDA
    wheels), go into ``prefix`` instead of the venv's lib/pythonX.Y/site-packages: the layer then
    holds the same bytes whatever OS and Python lie under it, so a node pulls it once for all of
    them. Staged by ``--target`` in the tmpfs /tmp and copied in (``--target`` on the prefix itself
    would skip, or with --upgrade replace, the nvidia/ folder an earlier layer made); no bytecode,
    whose file names carry the Python version. A ``PrefixPathStep`` makes the prefix visible."""

    MACRO: ClassVar[str] = "step_pip_prefix"
    prefix: str = CUDA_PREFIX


@dataclass(frozen=True)
class LockedPrefixPipStep(LockedPipStep):
    """A ``PrefixPipStep`` of a locked build: its exact wheels by sha256, into ``prefix``."""

    MACRO: ClassVar[str] = "step_pip_locked_prefix"
    prefix: str = CUDA_PREFIX


@dataclass(frozen=True)
class PrefixPathStep(Step):
    """A ``.pth`` file in the venv's site-packages naming ``prefix``, so Python (importlib.metadata,
    pip, torch's preload of nvidia/*/lib from sys.path) sees the wheels installed there. A small
    layer of its own, after the prefix's: the one part that names the Python version."""

    MACRO: ClassVar[str] = "step_prefix_path"
    venv: str
    prefix: str
    pth: str  # the file's name


@dataclass(frozen=True)
class MountStubsStep(Step):
    """Creates, in a layer of its own, the paths BuildKit would otherwise create and remove
    around each RUN's mounts (/etc/hosts, the pip cache and secret targets). Each creation
    changes the parent directory's mtime, which would make every later layer differ from one
    build to the next; after this step the reproducible pip steps change nothing outside the venv."""

    MACRO: ClassVar[str] = "step_mount_stubs"
    hosts: ContextFile  # an empty file COPYed to /etc/hosts (a RUN cannot create it: it is mounted there)
    dirs: tuple[str, ...]
    files: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.hosts.path.endswith("/etc/hosts"):
            raise ValueError(f"mount stubs: {self.hosts.path!r} is not the etc/hosts of a tree")

    @property
    def tree(self) -> str:
        """The context folder COPYed onto / (``hosts`` is its etc/hosts)."""
        return str(PurePosixPath(self.hosts.path).parent.parent) + "/"

    @property
    def context_files(self) -> tuple[ContextFile, ...]:
        return (self.hosts,)

    @property
    def stamped(self) -> tuple[str, ...]:
        """What the step creates or changes (/etc by the COPY of hosts), each given
        SOURCE_DATE_EPOCH as mtime: the same layer on an engine that does not rewrite times."""
        made = {"/etc", *self.dirs, *self.files}
        return tuple(sorted(made | {p for m in made for p in _parents(m)}))


@dataclass(frozen=True)
class WheelBuildStep(Step):
    """``pip wheel`` from source into /wheels of the builder stage (CUDA kernels)."""

    MACRO: ClassVar[str] = "step_pip_wheel"
    requirements: tuple[str, ...]
    arch_list: str  # TORCH_CUDA_ARCH_LIST, space-separated
    jobs: int  # MAX_JOBS
    no_isolation: bool  # build against the torch installed earlier in the stage
    no_binary: str  # comma-separated names: a source build even where a binary wheel exists
    env: tuple[tuple[str, str], ...] = ()  # each package's own architecture setting (FLASH_ATTN_CUDA_ARCHS)


# Where the final stage mounts the compile stage's wheels to install them: the installers record
# it in each one's direct_url.json, which is how the image test tells what imgbuild compiled.
LOCAL_WHEELS_MOUNT = "/tmp/wheels"  # noqa: S108 - a path inside the image, bind-mounted for one RUN


@dataclass(frozen=True)
class LocalWheelsStep(Step):
    """Installs the wheels another stage built, bind-mounted from its /wheels at ``mount``."""

    MACRO: ClassVar[str] = "step_local_wheels"
    packages: tuple[str, ...]  # what was built, written as a comment for the reader
    wheels_from: str  # stage name
    mount: str = LOCAL_WHEELS_MOUNT
    installer: Installer = PIP_INSTALLER  # as PipStep.installer


@dataclass(frozen=True)
class LdconfigStep(Step):
    """Registers the lib folders of the nvidia-* wheels with the dynamic linker."""

    MACRO: ClassVar[str] = "step_ldconfig"
    venv: str
    prefix: str | None = None  # and those under the prefix the CUDA wheels went into (PrefixPipStep)


@dataclass(frozen=True)
class CudaHomeStep(Step):
    """Makes the toolkit tree of the CUDA 13 wheels (site-packages/<tree>, or <prefix>/<tree>
    where a PrefixPipStep installed them) CUDA_HOME."""

    MACRO: ClassVar[str] = "step_cuda_home"
    venv: str
    tree: str  # relative to site-packages, e.g. nvidia/cu13
    home: str  # the symlink, e.g. /usr/local/cuda
    prefix: str | None = None


@dataclass(frozen=True)
class CopyStep(Step):
    """COPY of one recipe path from the context."""

    MACRO: ClassVar[str] = "step_copy"
    src: str
    dest: str

    @property
    def is_run(self) -> bool:
        return False


@dataclass(frozen=True)
class MetaStep(Step):
    """The image's metadata: WORKDIR, ENV, VOLUME, LABEL, ENTRYPOINT, CMD (sorted pairs)."""

    MACRO: ClassVar[str] = "step_meta"
    workdir: str | None
    env: tuple[tuple[str, str], ...]
    volumes: tuple[str, ...]
    labels: tuple[tuple[str, str], ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]

    @property
    def is_run(self) -> bool:
        return False


STEP_TYPES: tuple[type[Step], ...] = (AptStep, DeadsnakesStep, VenvStep, PipStep, LockedPipStep, PrefixPipStep,
                                      LockedPrefixPipStep, PrefixPathStep, MountStubsStep, WheelBuildStep,
                                      LocalWheelsStep, LdconfigStep, CudaHomeStep, CopyStep, MetaStep)
