"""The driver floors of a CUDA toolkit: the one place they are computed (issue 29: 2).

Resolve (and through it the plan's labels), the image's label checks and ``imgbuild check`` all
ask ``driver_floor``; an image built by imgbuild carries the answer in two labels, and
``floor_labels`` / ``floor_from_labels`` are the two directions of that mapping, so what one
imgbuild stamps another reads back the same way. A floor read from an image's labels is its
contract: the data it was computed from may have changed since (a corrected Table 3 row), and
``check`` follows the labels, saying where the data now differs (``differs_from``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from buildkit_py import label_keys as K
from buildkit_py.compat.tables import (
    CompatGap,
    NativeEvidence,
    known_native_driver,
    minor_compat_floor,
    resolve_cuda,
)
from buildkit_py.errors import UsageError
from buildkit_py.text_enum import TextEnum
from buildkit_py.versions import major_minor


class FloorSource(TextEnum):
    """Where a floor was read: imgbuild's data (toolkits.json, minor_compat.json) or an image's labels."""

    DATA = "data"
    LABELS = "labels"


@dataclass(frozen=True)
class DriverFloor:
    """The Linux drivers a CUDA toolkit needs. ``native``: NVIDIA's minimum for the toolkit (None where
    NVIDIA publishes none, e.g. CUDA 13.3-13.5); ``minor_compat``: the major's minor-version
    compatibility floor (None where there is none); ``evidence``: where ``native`` is None, the lowest
    driver known to run the toolkit natively and why (always from the data: a label holds no evidence)."""

    cuda: str  # the toolkit release, e.g. 12.4.1
    native: str | None
    minor_compat: str | None
    evidence: NativeEvidence | None
    source: FloorSource = FloorSource.DATA

    @property
    def major(self) -> int:
        return int(self.cuda.split(".")[0])

    @property
    def major_minor(self) -> str:
        return major_minor(self.cuda)

    def describe(self, *, evidence: bool = False) -> str:
        """``>= 550.54.15 native, >= 525.60.13 with minor-version compatibility``; an unpublished native
        floor is said to be unknown; ``evidence``: add the driver known to run it natively, and why."""
        text = (f">= {self.native} native" if self.native
                else f"native floor unknown (NVIDIA publishes none for CUDA {self.major_minor})")
        text += f", >= {self.minor_compat} with minor-version compatibility" if self.minor_compat else ""
        if evidence and self.evidence:
            text += f"; >= {self.evidence.driver} known to run it natively ({self.evidence.why})"
        return text

    def differs_from(self, other: DriverFloor) -> bool:
        return (self.native, self.minor_compat) != (other.native, other.minor_compat)


def driver_floor(cuda: str) -> DriverFloor:
    """The floors imgbuild's data gives ``cuda`` ("12.4" -> its newest patch, "12.4.1" exact); a
    version the data does not know raises CompatGap."""
    toolkit = resolve_cuda(cuda)
    major = int(toolkit.version.split(".")[0])
    return DriverFloor(toolkit.version, toolkit.linux_min_driver, minor_compat_floor(major),
                       known_native_driver(toolkit.version))


def floor_labels(floor: DriverFloor) -> dict[str, str]:
    """The labels that stamp ``floor`` on an image: no native label where NVIDIA publishes no floor
    (a label that claimed one would be false), none for an absent minor-version floor either."""
    labels = {K.DRIVER_MIN: floor.native, K.DRIVER_MIN_COMPAT: floor.minor_compat}
    return {k: v for k, v in labels.items() if v}


def floor_from_labels(labels: Mapping[str, str], cuda: str) -> DriverFloor | None:
    """The floor an image carries (its io.imgbuild.cuda.driver.* labels) for its CUDA ``cuda``, or
    None where it carries neither label (not built by imgbuild, or built before it stamped them).
    One label alone is a whole contract: an image of CUDA 13.4 carries only the minor-version floor.
    An empty label is none (a Dockerfile cannot remove a label it inherits, only empty it). A label
    that is no driver version is refused (UsageError), never read as no floor."""
    carried = {k: labels[k] for k in (K.DRIVER_MIN, K.DRIVER_MIN_COMPAT) if labels.get(k)}
    if not carried:
        return None
    for key, value in carried.items():
        try:
            Version(value)
        except InvalidVersion:
            raise UsageError(f"the image's label {key}={value!r} is not a driver version",
                             hint=f"check it against imgbuild's data instead: imgbuild check --cuda {cuda} "
                                  "--driver VERSION") from None
    try:  # the evidence of a native driver is data, not contract: only where the data knows the CUDA
        evidence = known_native_driver(cuda) if K.DRIVER_MIN not in carried else None
    except CompatGap:
        evidence = None
    return DriverFloor(cuda, carried.get(K.DRIVER_MIN), carried.get(K.DRIVER_MIN_COMPAT), evidence, FloorSource.LABELS)
