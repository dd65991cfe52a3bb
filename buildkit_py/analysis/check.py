"""Pure verdict logic: can this CUDA toolkit run on this driver?"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from buildkit_py.compat import (
    CompatGap,
    DriverFloor,
    FloorSource,
    codes,
    driver_branch_end_of_life,
    driver_floor,
    forward_compat_branches,
    toolkits,
)
from buildkit_py.compat.codes import RecipeWarning
from buildkit_py.text_enum import TextEnum
from buildkit_py.versions import major_minor


class Verdict(TextEnum):
    """Whether a driver runs a CUDA toolkit, and how."""

    NATIVE = "native"  # at or above the toolkit's minimum driver
    MINOR = "minor-version"  # minor-version compatibility: the major's floor, with limits
    FORWARD = "forward-compat"  # only with NVIDIA's forward-compatibility package (data-centre GPUs)
    INCOMPATIBLE = "incompatible"

    @property
    def compatible(self) -> bool:
        """Runs as it is, without a compatibility package."""
        return self in (Verdict.NATIVE, Verdict.MINOR)


NATIVE, MINOR, FORWARD, INCOMPATIBLE = Verdict.NATIVE, Verdict.MINOR, Verdict.FORWARD, Verdict.INCOMPATIBLE


@dataclass(frozen=True)
class CheckResult:
    driver: str
    floor: DriverFloor  # what the verdict rests on: an image's labels (its contract) or imgbuild's data
    verdict: Verdict
    compatible: bool
    message: str
    remedy: str | None = None
    warnings: tuple[RecipeWarning, ...] = ()  # key None: about the image as a whole

    @property
    def cuda(self) -> str:
        return self.floor.cuda

    @property
    def min_driver(self) -> str | None:  # None: no native floor (NVIDIA publishes none for this CUDA)
        return self.floor.native

    @property
    def min_driver_compat(self) -> str | None:
        return self.floor.minor_compat

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cuda": self.cuda, "driver": self.driver, "min_driver": self.min_driver,
               "min_driver_compat": self.min_driver_compat, "floor_source": self.floor.source,
               "verdict": self.verdict, "compatible": self.compatible, "message": self.message}
        if self.remedy:
            out["remedy"] = self.remedy
        if self.warnings:
            out["warnings"] = [w.to_json() for w in self.warnings]
        return out


def newest_native_toolkit(driver: str) -> str | None:
    """Newest known toolkit whose Linux minimum driver is <= ``driver``."""
    d = Version(driver)
    ok = [t.version for t in toolkits() if (need := driver_floor(t.version).native) and Version(need) <= d]
    return ok[-1] if ok else None


_LIMITS = ("features are limited: PTX newer than the driver cannot be JIT-compiled (ship SASS for your GPUs) "
           "and some APIs return cudaErrorCallRequiresNewerDriver")


def check_compat(cuda: str, driver: str, *, datacenter: bool | None = None,
                 driver_cuda: str | None = None, floor: DriverFloor | None = None) -> CheckResult:
    """``driver_cuda``: the CUDA version the driver itself reports (NVML, nvidia-smi's header), when
    read from the host: the driver's own word on what it runs natively. ``floor``: the floors to
    judge by; an image's labels (compat.floor_from_labels) are its contract and are followed even
    where imgbuild's data now says otherwise (a warning says so); default: the data's floors for
    ``cuda`` (an unknown version raises CompatGap)."""
    floor = floor or driver_floor(cuda)
    result = _verdict(floor, driver, datacenter, driver_cuda)
    if floor.source != FloorSource.LABELS:
        return result
    return dataclasses.replace(result, warnings=_data_differs(floor, driver, datacenter, driver_cuda, result.verdict))


def _data_differs(floor: DriverFloor, driver: str, datacenter: bool | None, driver_cuda: str | None,
                  verdict: Verdict) -> tuple[RecipeWarning, ...]:
    """Where imgbuild's data no longer gives the floors an image carries: what it says now, and the
    verdict it would give. The image's labels stay the answer: they are what it was built and
    tested against, and the data is what changed."""
    try:
        data = driver_floor(floor.cuda)
    except CompatGap:
        return (RecipeWarning(codes.FLOOR_CUDA_UNKNOWN, None, f"imgbuild's data does not know CUDA {floor.cuda}: "
                              "the verdict rests on the image's labels alone"),)
    if not data.differs_from(floor):
        return ()
    by_data = _verdict(data, driver, datacenter, driver_cuda).verdict
    return (RecipeWarning(codes.FLOOR_LABELS_DIFFER, None,
                          f"imgbuild's data now differs for CUDA {floor.cuda}: {data.describe()} (the image's labels "
                          f"say {floor.describe()}); the verdict follows the labels"
                          + ("" if by_data == verdict else f", by the data it would be {by_data}"),
                          f"to judge by the data instead: imgbuild check --cuda {floor.cuda} --driver {driver}"),)


def _verdict(floor: DriverFloor, driver: str, datacenter: bool | None, driver_cuda: str | None) -> CheckResult:
    d = Version(driver)
    cuda, need, compat_floor, major = floor.cuda, floor.native, floor.minor_compat, floor.major
    native_tk = newest_native_toolkit(driver)
    runs_natively = f"; the newest CUDA this driver runs natively is {native_tk}" if native_tk else ""

    def result(verdict: Verdict, message: str, remedy: str | None) -> CheckResult:
        return CheckResult(driver, floor, verdict, verdict.compatible, message, remedy)

    if driver_cuda and Version(driver_cuda) >= Version(floor.major_minor):
        return result(NATIVE, f"driver {driver} reports CUDA {driver_cuda}, which covers CUDA {cuda}", None)
    if need is None:
        return _unpublished_floor(floor, driver, result)
    if d >= Version(need):
        return result(NATIVE, f"driver {driver} meets CUDA {cuda}'s minimum {need}", None)
    if compat_floor is not None and d >= Version(compat_floor):
        return result(MINOR,
                      f"driver {driver} is older than CUDA {cuda}'s minimum {need} but within CUDA {major}.x "
                      f"minor-version compatibility (>= {compat_floor}): {_LIMITS}",
                      f"upgrade the driver to >= {need} for full support, or use CUDA <= {native_tk}" if native_tk
                      else f"upgrade the driver to >= {need}")
    branch = str(d.major)
    mj, mn = major_minor(cuda).split(".")
    if branch in _forward_compat_branches(cuda):
        if datacenter:
            return result(FORWARD,
                          f"driver {driver} is too old for CUDA {cuda} (minimum {need}, minor-version floor "
                          f"{compat_floor}), but branch R{branch} is supported by cuda-compat for this toolkit on "
                          "data-center GPUs",
                          f"install cuda-compat-{mj}-{mn} in the image "
                          f"and put it on LD_LIBRARY_PATH, or upgrade the driver to >= {need}")
        why = ("forward compatibility needs a data-center GPU, and this host's GPUs are not" if datacenter is False
               else "forward compatibility (cuda-compat) would work only on data-center GPUs; GPU type unknown")
        return result(INCOMPATIBLE, f"driver {driver} is too old for CUDA {cuda} (minimum {need}"
                      + (f", minor-version floor {compat_floor}" if compat_floor else "") + f"); {why}",
                      f"upgrade the driver to >= {need}{runs_natively}")
    eol = driver_branch_end_of_life(branch)
    why_not = (f"R{branch} reached end of life ({eol}), so forward compatibility (cuda-compat) is no longer "
               "supported on it" if eol else f"R{branch} is not a cuda-compat branch for it")
    return result(INCOMPATIBLE,
                  f"driver {driver} is too old for CUDA {cuda} (minimum {need}"
                  + (f", minor-version floor {compat_floor}" if compat_floor else "") + ") and " + why_not,
                  f"upgrade the driver to >= {compat_floor or need}{runs_natively}")


def _forward_compat_branches(cuda: str) -> tuple[str, ...]:
    """The cuda-compat branches for ``cuda``; none where the data does not know it (an image's labels
    can name a CUDA newer than this imgbuild's data)."""
    try:
        return forward_compat_branches(cuda)
    except CompatGap:
        return ()


def _unpublished_floor(floor: DriverFloor, driver: str,
                       result: Callable[[Verdict, str, str | None], CheckResult]) -> CheckResult:
    """A toolkit whose native floor NVIDIA does not publish (CUDA 13.3-13.5): native only above a
    driver known to run it (an installer of its minor bundles it), minor-version above the major's
    floor, else incompatible (forward compatibility needs a published floor to aim at)."""
    d = Version(driver)
    known, compat_floor, mm = floor.evidence, floor.minor_compat, floor.major_minor
    if known is not None and d >= Version(known.driver):
        return result(NATIVE, f"NVIDIA publishes no minimum driver for CUDA {mm}; driver {driver} is at "
                              f"or above {known.driver}, {known.why}, so it runs CUDA {floor.cuda} natively", None)
    native = (f"a driver >= {known.driver} ({known.why}) runs it natively" if known
              else f"a driver released with or after CUDA {mm} runs it natively")
    if compat_floor is not None and d >= Version(compat_floor):
        return result(MINOR, f"native floor unknown: NVIDIA publishes no minimum driver for CUDA {mm}; "
                             f"driver {driver} is within CUDA {floor.major}.x minor-version "
                             f"compatibility (>= {compat_floor}): {_LIMITS}",
                      f"for full support: {native}")
    return result(INCOMPATIBLE, f"driver {driver} is below CUDA {floor.major}.x minor-version "
                                f"compatibility (>= {compat_floor}) and NVIDIA publishes no minimum driver for CUDA "
                                f"{mm}", f"upgrade the driver to >= {compat_floor}; {native}")
