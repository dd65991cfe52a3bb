"""imgbuild check: a host driver against an image, a recipe or a CUDA version."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from buildkit_py import label_keys as K
from buildkit_py.cli.common import AddCommand, Out, engine_option, image_labels, is_recipe, json_option, reading_engine
from buildkit_py.errors import ExitStatus, UsageError

if TYPE_CHECKING:
    from buildkit_py.analysis.driver import HostDriver
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
    json_option(c)
    c.set_defaults(handler=cmd_check)


def cmd_check(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py.analysis.check import check_compat

    if bool(args.target) == bool(args.cuda):
        raise UsageError("check needs exactly one of IMAGE, RECIPE or --cuda VERSION")
    if args.driver is not None and not args.driver.strip():
        raise UsageError("--driver '': give a driver version such as 550.54.15",
                         hint="leave --driver out to read the host's driver")
    if args.cuda:
        cuda, what, floor, floors_from = args.cuda, f"CUDA {args.cuda}", None, FROM_DATA
    else:
        cuda, what, floor, floors_from = _cuda_of_target(None if is_recipe(args.target) else reading_engine(args),
                                                         args.target)
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
    if args.json:
        data = result.to_json()
        data["target"] = what
        data["floors_from"] = floors_from
        out.data(data)
    else:
        out.line(f"{what}: {result.verdict} on driver {driver}")
        out.line(f"  driver floors {floors_from}: {result.floor.describe()}")
        out.line(f"  {result.message}")
        if result.remedy:
            out.line(f"  remedy: {result.remedy}")
        for warning in result.warnings:
            out.line(f"  warning: {warning.render()}")
    return 0 if result.compatible else ExitStatus.FAILED


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


def _cuda_of_target(engine: Engine | None, target: str) -> tuple[str, str, DriverFloor | None, str]:
    """The target's CUDA, its name, the floors to judge by (None: imgbuild's data for that CUDA) and
    where they come from. An image's floor labels are its contract: they are used where it carries
    them, the data only for an image without them."""
    from buildkit_py.compat import floor_from_labels

    if is_recipe(target):
        from buildkit_py import pipeline

        res = pipeline.plan_recipe(Path(target), offline=True).resolution
        return res.cuda_version, f"recipe {target}", res.driver_floor, FROM_DATA
    labels, env = image_labels(engine, target)
    cuda = labels.get(K.CUDA_VERSION) or env.get("CUDA_VERSION")
    if not cuda:
        raise UsageError(f"image {target} has no {K.CUDA_VERSION} label and no CUDA_VERSION env",
                         hint="check it with --cuda VERSION")
    floor = floor_from_labels(labels, cuda)
    return cuda, f"image {target}", floor, FROM_LABELS if floor else FROM_DATA_UNLABELLED
