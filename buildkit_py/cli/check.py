"""imgbuild check: a host driver against an image, a recipe or a CUDA version."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildkit_py import label_keys as K
from buildkit_py.cli.common import AddCommand, Out, engine_option, image_labels, is_recipe, json_option, reading_engine
from buildkit_py.cli.settings import settings_of
from buildkit_py.errors import ExitStatus, UsageError

if TYPE_CHECKING:
    from packaging.version import Version

    from buildkit_py.analysis.check import CheckResult
    from buildkit_py.analysis.driver import HostDriver
    from buildkit_py.analysis.gpu_coverage import GpuReport, GpuTarget
    from buildkit_py.compat import DriverFloor
    from buildkit_py.engine import Engine

# Where the floors a verdict rests on came from (text and --json "floors_from")
FROM_LABELS = "from the image's labels"
FROM_DATA = "from imgbuild's data"
FROM_DATA_UNLABELLED = "from imgbuild's data, the image carries no floor"


def register(add: AddCommand) -> None:
    c = add("check", "Verdicts: native, minor-version, forward-compat, incompatible. Exit 0 when the image\n"
            "can run (native or minor-version), 1 when not, 2 for bad input.")
    target = c.add_argument_group("target (one of)")
    target.add_argument("target", nargs="?", help="an image (local or in a registry) or a recipe file")
    target.add_argument("--cuda", help="a CUDA toolkit version instead of an image or recipe")
    c.add_argument("--driver", help="driver version to check (default: read the host with NVML or nvidia-smi)")
    c.add_argument("--datacenter", action=argparse.BooleanOptionalAction, default=None,
                   help="the GPU is a data-center part (forward compatibility); default: from the GPU name")
    engine_option(c)
    c.add_argument("--gpu", metavar="NAME|sm_XY|host",
                   help="check the image's CUDA kernels for this GPU (H100, B200, RTX 5090, sm_90 ...; host: this "
                        "host's GPUs and driver): SASS that runs on it, PTX the driver must JIT-compile, or none; "
                        "with --driver, the driver too")
    json_option(c)
    c.set_defaults(handler=cmd_check)


def cmd_check(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py.analysis.check import check_compat

    if bool(args.target) == bool(args.cuda):
        raise UsageError("check needs exactly one of IMAGE, RECIPE or --cuda VERSION")
    if args.gpu is not None:
        return _check_gpu(args, out)
    if args.driver is not None and not args.driver.strip():
        raise UsageError("--driver '': give a driver version such as 550.54.15",
                         hint="leave --driver out to read the host's driver")
    if args.cuda:
        cuda, what, floor, floors_from = args.cuda, f"CUDA {args.cuda}", None, FROM_DATA
    else:
        cuda, what, floor, floors_from = _cuda_of_target(None if is_recipe(args.target) else reading_engine(args),
                                                         args.target, settings_of(args).compat_cache)
    datacenter = args.datacenter
    driver_cuda = None
    if args.driver:
        driver = args.driver
    else:
        host = _host_driver(args, cuda, floor)
        driver, driver_cuda = host.version, host.cuda_version
        if datacenter is None:
            datacenter = host.datacenter
    try:
        result = check_compat(cuda, driver, datacenter=datacenter, driver_cuda=driver_cuda, floor=floor)
    except LookupError as exc:
        raise UsageError(f"unknown CUDA version {cuda}: {str(exc).strip(chr(39))}") from None
    except ValueError as exc:
        raise UsageError(f"bad driver version {driver!r}: {exc}") from None
    out.document(DriverCheck(what, floors_from, driver, result), as_json=args.json)
    return 0 if result.compatible else ExitStatus.FAILED


@dataclass(frozen=True)
class DriverCheck:
    """What `check` prints for a driver: the verdict on what was checked (``target``) and where its
    floors came from; the --json document and the text read these fields."""

    target: str
    floors_from: str
    driver: str
    result: CheckResult

    def to_json(self) -> dict[str, Any]:
        return {**self.result.to_json(), "target": self.target, "floors_from": self.floors_from}

    def lines(self) -> list[str]:
        r = self.result
        return [f"{self.target}: {r.verdict} on driver {self.driver}",
                f"  driver floors {self.floors_from}: {r.floor.describe()}", f"  {r.message}",
                *([f"  remedy: {r.remedy}"] if r.remedy else []),
                *(f"  warning: {warning.render()}" for warning in r.warnings)]


def _check_gpu(args: argparse.Namespace, out: Out) -> int:
    """``--gpu``: the kernels of every CUDA library in the image against that GPU's compute
    capability (analysis.gpu_coverage); with a driver (--driver, or the host's with ``--gpu
    host``), the driver verdict as well, and PTX that driver is too old to JIT-compile counts
    as no kernel. ``--gpu host`` checks each compute capability this host's GPUs report."""
    from buildkit_py.analysis.gpu_coverage import gpu_report, loaded_alternatives, read_image_kernels

    if not args.target or is_recipe(args.target):
        raise UsageError("--gpu checks an image's kernels: give an IMAGE",
                         hint="a recipe's kernels are known once it is built: imgbuild build, then check the image")
    targets, driver, datacenter = _gpu_targets(args)
    if driver:
        _driver_version(driver)  # a malformed --driver is refused before the image is read
    engine = reading_engine(args)
    files, unreadable = read_image_kernels(engine, args.target)
    try:
        cuda: str | None = _cuda_of_target(engine, args.target, settings_of(args).compat_cache)[0]
    except UsageError:
        cuda = None  # no CUDA label or env: every per-CUDA build of a library counts
    driver_result = None
    if driver:
        from buildkit_py.analysis.check import check_compat

        if cuda is None:
            raise UsageError(f"image {args.target} has no {K.CUDA_VERSION} label and no CUDA_VERSION env",
                             hint="leave --driver out to check its kernels only")
        driver_result = check_compat(cuda, driver, datacenter=datacenter)
    checks = []
    for gpu in targets:
        report = gpu_report(args.target, gpu, loaded_alternatives(files, cuda), unreadable)
        checks.append(GpuCheck(report, driver, driver_result, tuple(_driver_too_old_for_ptx(report, driver))))
    result = GpuChecks(tuple(checks), driver, driver_result)
    out.document(result, as_json=args.json)
    return 0 if result.runs else ExitStatus.FAILED


@dataclass(frozen=True)
class GpuCheck:
    """`check --gpu` for one GPU: the image's kernels on it and, with a driver, the libraries whose
    PTX that driver is too old to JIT-compile (they count as no kernel)."""

    report: GpuReport
    driver: str | None
    driver_result: CheckResult | None  # with a driver: the image's CUDA against it
    too_old: tuple[str, ...]  # library paths

    @property
    def runs(self) -> bool:
        return self.report.runs and not self.too_old

    def to_json(self) -> dict[str, Any]:
        data = self.report.to_json()
        if self.driver_result is not None:
            data["driver"] = self.driver_result.to_json()
            data["driver_too_old_for_ptx"] = list(self.too_old)
        return data

    def lines(self) -> list[str]:
        from buildkit_py.compat.gpu_fit import Coverage
        from buildkit_py.sizes import human_size

        report = self.report
        lines = [f"image {report.image} on {report.gpu.label}: {report.verdict}", f"  {report.message()}"]
        for lib in report.libraries:
            how = (", ".join(lib.sass) if lib.coverage == Coverage.SASS else
                   f"{', '.join(lib.ptx)}, {human_size(lib.ptx_bytes)} to JIT" if lib.coverage == Coverage.PTX else
                   f"carries {', '.join(lib.archs) or 'no SASS'}")
            note = "" if lib.decides else "  (no real kernels in its fat binaries: not counted)"
            lines.append(f"  {lib.coverage:<9} {lib.path}: {how}{note}")
        lines += [f"  unreadable {path}: {why}" for path, why in report.unreadable]
        return lines + [f"  driver {self.driver} is too old to JIT-compile the PTX of {path}" for path in self.too_old]


@dataclass(frozen=True)
class GpuChecks:
    """`check --gpu`: one GpuCheck per GPU (``--gpu host``: per compute capability), and the driver
    verdict once. --json: the one check's document, or {"reports": [...]} for several."""

    checks: tuple[GpuCheck, ...]
    driver: str | None
    driver_result: CheckResult | None

    @property
    def runs(self) -> bool:
        return (self.driver_result is None or self.driver_result.compatible) and all(c.runs for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        documents = [c.to_json() for c in self.checks]
        return documents[0] if len(documents) == 1 else {"reports": documents}

    def lines(self) -> list[str]:
        lines = [line for c in self.checks for line in c.lines()]
        if self.driver_result is None:
            return lines
        return [*lines, f"driver {self.driver}: {self.driver_result.verdict}: {self.driver_result.message}"]


def _gpu_targets(args: argparse.Namespace) -> tuple[list[GpuTarget], str | None, bool | None]:
    """The GPUs to check (``--gpu NAME|sm_XY``, or each compute capability of this host's GPUs
    for ``--gpu host``), the driver to hold the PTX to, and whether the GPUs are data-center parts."""
    from buildkit_py.analysis.gpu_coverage import GpuTarget, resolve_gpu
    from buildkit_py.analysis.kernels import Arch

    if args.gpu.strip().lower() != "host":
        return [resolve_gpu(args.gpu)], args.driver, args.datacenter
    from buildkit_py.analysis.driver import read_host_driver
    from buildkit_py.errors import DriverCheckError

    try:
        host = read_host_driver()
    except DriverCheckError as exc:
        raise DriverCheckError(f"--gpu host: cannot read this host's GPUs: {exc.message}",
                               hint="name the GPU instead: --gpu H100 (or its capability: --gpu sm_90)") from None
    targets: dict[str, GpuTarget] = {}
    for g in host.gpus:
        if g.compute_cap and g.compute_cap not in targets:
            major, minor = g.compute_cap.split(".")
            targets[g.compute_cap] = GpuTarget(g.name, Arch(int(major), int(minor)), "this host (nvidia-smi or NVML)")
    if not targets:
        raise DriverCheckError("--gpu host: this host's GPUs report no compute capability (nvidia-smi older than 510?)",
                               hint="name the GPU instead: --gpu H100")
    datacenter = args.datacenter if args.datacenter is not None else host.datacenter
    return list(targets.values()), args.driver or host.version, datacenter


def _driver_too_old_for_ptx(report: GpuReport, driver: str | None) -> list[str]:
    """The libraries that run only through PTX whose PTX ISA needs a newer driver than ``driver``."""
    if not driver:
        return []
    from packaging.version import Version

    given = _driver_version(driver)
    return [lib.path for lib in report.jit_libraries() if lib.need and lib.need.driver
            and Version(lib.need.driver) > given]


def _driver_version(driver: str) -> Version:
    """--driver as a version, or the usage error that names it (before anything reads the image)."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(driver)
    except InvalidVersion:
        raise UsageError(f"bad driver version {driver!r}", hint="give it as nvidia-smi prints it: 580.65.06") from None


def _host_driver(args: argparse.Namespace, cuda: str, floor: DriverFloor | None) -> HostDriver:
    """The host's driver; where none can be read (no GPU here), the error says how to check
    against a driver version instead (issue 22: 12)."""
    from buildkit_py.analysis.driver import read_host_driver
    from buildkit_py.compat import driver_floor
    from buildkit_py.errors import DriverCheckError

    try:
        return read_host_driver()
    except DriverCheckError as exc:
        try:  # the CUDA's native floor, or a driver known to run it where the floor is unpublished
            floor = floor or driver_floor(cuda)
            example = floor.native or (floor.evidence.driver if floor.evidence else None) or "580.65.06"
        except LookupError:  # an unknown version: check_compat says so once a driver is given
            example = "580.65.06"
        target = f"--cuda {args.cuda}" if args.cuda else args.target
        raise DriverCheckError(f"cannot read this host's NVIDIA driver: {exc.message}",
                               hint=f"to check for another machine, give its driver: imgbuild check {target} "
                                    f"--driver {example} (`nvidia-smi` there prints it); "
                                    + (exc.hint or "or run where the GPU is visible")) from None


def _cuda_of_target(engine: Engine | None, target: str,
                    cache: Path) -> tuple[str, str, DriverFloor | None, str]:
    """The target's CUDA, its name, the floors to judge by (None: imgbuild's data for that CUDA) and
    where they come from (a recipe is planned offline, with the look-up ``cache``). An image's floor
    labels are its contract: they are used where it carries them, the data only for an image without
    them."""
    from buildkit_py.compat import floor_from_labels

    if is_recipe(target):
        from buildkit_py import pipeline

        offline = pipeline.Lookup(offline=True, cache=cache)
        res = pipeline.plan_recipe(Path(target), lookup=offline).resolution
        return res.cuda_version, f"recipe {target}", res.driver_floor, FROM_DATA
    labels, env = image_labels(engine, target)
    cuda = labels.get(K.CUDA_VERSION) or env.get("CUDA_VERSION")
    if not cuda:
        raise UsageError(f"image {target} has no {K.CUDA_VERSION} label and no CUDA_VERSION env",
                         hint="check it with --cuda VERSION")
    floor = floor_from_labels(labels, cuda)
    return cuda, f"image {target}", floor, FROM_LABELS if floor else FROM_DATA_UNLABELLED
