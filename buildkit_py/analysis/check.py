"""Pure verdict logic: can this CUDA toolkit run on this driver?"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from buildkit_py.compat import (
    driver_branch_end_of_life,
    forward_compat_branches,
    known_native_driver,
    minor_compat_floor,
    resolve_cuda,
    toolkits,
)
from buildkit_py.compat.tables import Toolkit
from buildkit_py.text_enum import TextEnum


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
    cuda: str
    driver: str
    min_driver: str | None  # None: NVIDIA publishes no native floor for this CUDA
    min_driver_compat: str | None
    verdict: Verdict
    compatible: bool
    message: str
    remedy: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cuda": self.cuda, "driver": self.driver, "min_driver": self.min_driver,
               "min_driver_compat": self.min_driver_compat, "verdict": self.verdict,
               "compatible": self.compatible, "message": self.message}
        if self.remedy:
            out["remedy"] = self.remedy
        return out


def newest_native_toolkit(driver: str) -> str | None:
    """Newest known toolkit whose Linux minimum driver is <= ``driver``."""
    d = Version(driver)
    ok = [t.version for t in toolkits() if t.linux_min_driver and Version(t.linux_min_driver) <= d]
    return ok[-1] if ok else None


_LIMITS = ("features are limited: PTX newer than the driver cannot be JIT-compiled (ship SASS for your GPUs) "
           "and some APIs return cudaErrorCallRequiresNewerDriver")


def check_compat(cuda: str, driver: str, *, datacenter: bool | None = None,
                 driver_cuda: str | None = None) -> CheckResult:
    """``driver_cuda``: the CUDA version the driver itself reports (NVML, nvidia-smi's header), when
    read from the host: the driver's own word on what it runs natively."""
    tk = resolve_cuda(cuda)
    d = Version(driver)
    need = tk.linux_min_driver
    major = int(tk.version.split(".")[0])
    floor = minor_compat_floor(major)
    native_tk = newest_native_toolkit(driver)
    runs_natively = f"; the newest CUDA this driver runs natively is {native_tk}" if native_tk else ""

    def result(verdict: Verdict, message: str, remedy: str | None) -> CheckResult:
        return CheckResult(tk.version, driver, need, floor, verdict, verdict.compatible, message, remedy)

    if driver_cuda and Version(driver_cuda) >= Version(tk.major_minor):
        return result(NATIVE, f"driver {driver} reports CUDA {driver_cuda}, which covers CUDA {tk.version}", None)
    if need is None:
        return _unpublished_floor(tk, driver, floor, result)
    if d >= Version(need):
        return result(NATIVE, f"driver {driver} meets CUDA {tk.version}'s minimum {need}", None)
    if floor is not None and d >= Version(floor):
        return result(MINOR,
                      f"driver {driver} is older than CUDA {tk.version}'s minimum {need} but within CUDA {major}.x "
                      f"minor-version compatibility (>= {floor}): {_LIMITS}",
                      f"upgrade the driver to >= {need} for full support, or use CUDA <= {native_tk}" if native_tk
                      else f"upgrade the driver to >= {need}")
    branch = str(d.major)
    if branch in forward_compat_branches(tk.version):
        if datacenter:
            return result(FORWARD,
                          f"driver {driver} is too old for CUDA {tk.version} (minimum {need}, minor-version floor "
                          f"{floor}), but branch R{branch} is supported by cuda-compat for this toolkit on "
                          "data-center GPUs",
                          f"install cuda-compat-{tk.version.split('.')[0]}-{tk.version.split('.')[1]} in the image "
                          f"and put it on LD_LIBRARY_PATH, or upgrade the driver to >= {need}")
        why = ("forward compatibility needs a data-center GPU, and this host's GPUs are not" if datacenter is False
               else "forward compatibility (cuda-compat) would work only on data-center GPUs; GPU type unknown")
        return result(INCOMPATIBLE, f"driver {driver} is too old for CUDA {tk.version} (minimum {need}"
                      + (f", minor-version floor {floor}" if floor else "") + f"); {why}",
                      f"upgrade the driver to >= {need}{runs_natively}")
    eol = driver_branch_end_of_life(branch)
    why_not = (f"R{branch} reached end of life ({eol}), so forward compatibility (cuda-compat) is no longer "
               "supported on it" if eol else f"R{branch} is not a cuda-compat branch for it")
    return result(INCOMPATIBLE,
                  f"driver {driver} is too old for CUDA {tk.version} (minimum {need}"
                  + (f", minor-version floor {floor}" if floor else "") + ") and " + why_not,
                  f"upgrade the driver to >= {floor or need}{runs_natively}")


def _unpublished_floor(tk: Toolkit, driver: str, floor: str | None,
                       result: Callable[[Verdict, str, str | None], CheckResult]) -> CheckResult:
    """A toolkit whose native floor NVIDIA does not publish (CUDA 13.3-13.5): native only above a
    driver known to run it (an installer of its minor bundles it), minor-version above the major's
    floor, else incompatible (forward compatibility needs a published floor to aim at)."""
    d = Version(driver)
    known = known_native_driver(tk.version)
    if known is not None and d >= Version(known.driver):
        return result(NATIVE, f"NVIDIA publishes no minimum driver for CUDA {tk.major_minor}; driver {driver} is at "
                              f"or above {known.driver}, {known.why}, so it runs CUDA {tk.version} natively", None)
    native = (f"a driver >= {known.driver} ({known.why}) runs it natively" if known
              else f"a driver released with or after CUDA {tk.major_minor} runs it natively")
    if floor is not None and d >= Version(floor):
        return result(MINOR, f"native floor unknown: NVIDIA publishes no minimum driver for CUDA {tk.major_minor}; "
                             f"driver {driver} is within CUDA {tk.version.split('.')[0]}.x minor-version "
                             f"compatibility (>= {floor}): {_LIMITS}",
                      f"for full support: {native}")
    return result(INCOMPATIBLE, f"driver {driver} is below CUDA {tk.version.split('.')[0]}.x minor-version "
                                f"compatibility (>= {floor}) and NVIDIA publishes no minimum driver for CUDA "
                                f"{tk.major_minor}", f"upgrade the driver to >= {floor}; {native}")
