"""NVIDIA's nvidia/cuda images (images.json): the tags published for each CUDA release (flavor, cuDNN, OS),
the nearest ones where a tag is missing, and each release's end of life under NVIDIA's support policy."""

from __future__ import annotations

import datetime
import functools
import re
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from buildkit_py.compat.tables import CompatGap, bad_entry, check_ascending, known_versions, load_raw
from buildkit_py.versions import major_minor as _mm  # short: it sits in many messages


@dataclass(frozen=True)
class ImageEol:
    """When NVIDIA's support policy makes a release's nvidia/cuda tags unsupported (images.json
    ``end_of_life``). ``basis``: chart (dated in NVIDIA's EOL chart), driver (the chart's rule: the
    last driver branch it supports reached end of life), newer-patch (a newer patch of the minor has
    images; the date is no later than the real one), major (CUDA 13 is out: 11.x left the two
    supported majors). ``deletion``: the date the policy deletes the tags from, where one follows."""
    cuda: str
    date: datetime.date
    basis: str
    deletion: datetime.date | None
    source: str

    @property
    def why(self) -> str:
        """The policy rule behind the date, for a person."""
        return {"chart": "NVIDIA's EOL chart",
                "driver": "NVIDIA's EOL chart: the last driver branch they support reached its end of life",
                "newer-patch": f"NVIDIA supports only the newest {_mm(self.cuda)} patch, and a newer one was out",
                "major": "NVIDIA supports two CUDA majors, and CUDA 13 was out"}[self.basis]


@dataclass(frozen=True)
class ImageSet:
    """The nvidia/cuda tags of one CUDA release: ``os_cudnn`` pairs each Ubuntu release that has
    the base/runtime/devel tags with the cuDNN majors that also have cudnn-runtime/-devel tags for
    it. Nothing outside these pairs is assumed to exist."""
    cuda: str
    os_cudnn: tuple[tuple[str, tuple[str, ...]], ...]
    cudnn_tag: str
    source: str
    end_of_life: ImageEol | None = None
    end_of_life_unknown: str | None = None

    @property
    def oses(self) -> tuple[str, ...]:
        return tuple(os_ for os_, _ in self.os_cudnn)

    @property
    def cudnn(self) -> tuple[str, ...]:
        """Every cuDNN major with images on some OS, ascending."""
        return tuple(sorted({c for _, majors in self.os_cudnn for c in majors}, key=int))

    def cudnn_on(self, os_: str) -> tuple[str, ...] | None:
        """The cuDNN majors with images for ``os_``; None: no image of this release for that OS."""
        return dict(self.os_cudnn).get(os_)


@functools.cache
def image_data() -> tuple[dict[str, Any], dict[str, ImageSet]]:
    """images.json: one row per CUDA release (known toolkit, ascending, no duplicate), each OS with
    its cuDNN majors; a row a newer patch of its minor supersedes carries its end of life (NVIDIA
    supports only the latest patch) or says why it has no date."""
    f = "images.json"
    raw = load_raw(f)
    known = known_versions()
    versions = [e.get("cuda") for e in raw["images"]]
    check_ascending(f, versions)
    out: dict[str, ImageSet] = {}
    for e in raw["images"]:
        v = e["cuda"]
        if v not in known:
            raise bad_entry(f, v, "image CUDA version is not a known toolkit (toolkits.json)")
        out[v] = _image_row(f, e)
    for v, img in out.items():
        newer = [w for w in out if _mm(w) == _mm(v) and Version(w) > Version(v)]
        if newer and img.end_of_life is None and not img.end_of_life_unknown:
            raise bad_entry(f, v, f"{newer[0]} supersedes it (NVIDIA supports only the latest patch): give its "
                                  "end_of_life, or end_of_life_unknown with the reason")
        if img.end_of_life is not None and img.end_of_life.basis == "newer-patch" and not newer:
            raise bad_entry(f, v, "end_of_life basis 'newer-patch' but no newer patch of its minor has images")
    absent = raw.get("absent", {})
    for v in absent:
        if v not in known or v in out:
            raise bad_entry(f, v, "an 'absent' entry must be a known toolkit without image rows")
    meta = {"flavors": tuple(raw["flavors"]), "cudnn_flavors": tuple(raw["cudnn_flavors"]),
            "policy": raw.get("support_policy", {}), "absent": {v: why["reason"] for v, why in absent.items()}}
    return meta, out


def _image_row(f: str, e: dict[str, Any]) -> ImageSet:
    v = e["cuda"]
    os_cudnn = tuple((os_, tuple(majors)) for os_, majors in e["os"].items())
    majors = {c for _, cs in os_cudnn for c in cs}
    tag = e.get("cudnn_tag", "")
    if majors and not tag:
        raise bad_entry(f, v, "cuDNN images listed but no cudnn_tag (the tag's cudnn part, e.g. cudnn8)")
    if len(majors) > 1:
        raise bad_entry(f, v, f"cuDNN majors {', '.join(sorted(majors))} under one cudnn_tag: the tags would clash")
    if tag not in ("", "cudnn") and tag != f"cudnn{next(iter(majors), '')}":
        raise bad_entry(f, v, f"cudnn_tag {tag!r} names another cuDNN major than the images list")
    eol, unknown = e.get("end_of_life"), e.get("end_of_life_unknown")
    if eol and unknown:
        raise bad_entry(f, v, "end_of_life and end_of_life_unknown both given")
    record = None
    if eol:
        date = _date(f, v, eol["date"])
        deletion = _date(f, v, eol["deletion"]) if eol.get("deletion") else None
        if deletion is not None and deletion < date:
            raise bad_entry(f, v, f"deletion {deletion} before end of life {date}")
        record = ImageEol(v, date, eol["basis"], deletion, eol["source"])
    return ImageSet(v, os_cudnn, tag, e["source"], record, unknown)


def _date(f: str, entry: Any, text: str) -> datetime.date:
    try:
        return datetime.date.fromisoformat(text)
    except ValueError:
        raise bad_entry(f, entry, f"not a date: {text!r}") from None


def cuda_image_oses(cuda: str) -> tuple[str, ...]:
    """The OSes with images of ``cuda`` ("X.Y": its newest patch with images)."""
    img = _image_for(cuda)
    return img.oses if img else ()


def _image_for(cuda: str) -> ImageSet | None:
    images = image_data()[1]
    parts = str(cuda).split(".")
    if len(parts) == 3:
        return images.get(cuda)
    cands = [v for v in images if _mm(v) == str(cuda)]
    return images[max(cands, key=Version)] if cands else None


def _cudnn_major(cudnn: str) -> str:
    return str(cudnn).split(".", maxsplit=1)[0]


def _has_image(img: ImageSet, flavor: str, cudnn: str | None, os_: str) -> bool:
    """Whether the data records that tag: the OS is listed, and with cuDNN, its major too."""
    meta = image_data()[0]
    majors = img.cudnn_on(os_)
    if majors is None:
        return False
    if cudnn is None:
        return flavor in meta["flavors"]
    return flavor in meta["cudnn_flavors"] and _cudnn_major(cudnn) in majors


def _tag(img: ImageSet, flavor: str, cudnn: str | None, os_: str) -> str:
    return f"{img.cuda}-{flavor}-{os_}" if cudnn is None else f"{img.cuda}-{img.cudnn_tag}-{flavor}-{os_}"


def cuda_image_tags(cuda: str) -> tuple[str, ...]:
    """Every tag the data records for ``cuda`` ("X.Y": its newest patch with images)."""
    meta, _ = image_data()
    img = _image_for(cuda)
    if img is None:
        return ()
    tags = []
    for os_, majors in img.os_cudnn:
        tags += [f"{img.cuda}-{fl}-{os_}" for fl in meta["flavors"]]
        if majors:
            tags += [f"{img.cuda}-{img.cudnn_tag}-{fl}-{os_}" for fl in meta["cudnn_flavors"]]
    return tuple(tags)


class ImageGap(CompatGap):
    """No nvidia/cuda image of a release (or minor) for a flavor, cuDNN and OS. ``reason`` says
    which OSes that release or minor has the image for and the newest release that has it for the
    asked OS; ``hint`` names the newest releases that fit, newest first. ``key`` is the recipe key
    to blame, ``other``/``other_value`` the clashing side."""

    def __init__(self, value: str, reason: str, *, hint: str, key: str, other: str, other_value: str):
        super().__init__("nvidia/cuda", value, reason, hint=hint)
        self.key, self.other, self.other_value = key, other, other_value


def image_release(cuda: str, flavor: str, cudnn: str | None, os_: str, *, any_patch: bool = False) -> str:
    """The CUDA release whose nvidia/cuda image serves ``cuda`` on ``os_``: "X.Y" -> the newest
    X.Y.z the data records that image for; "X.Y.Z" -> itself (any_patch: else the newest other
    X.Y.z with it, for a compile stage). ImageGap when there is none."""
    images = image_data()[1]
    spec = str(cuda).strip()
    exact = spec.count(".") == 2
    same_minor = sorted((v for v in images if _mm(v) == _mm(spec)), key=Version, reverse=True)
    if not exact:
        cands = same_minor
    else:
        cands = [spec] if spec in images else []
        if any_patch:
            cands += [v for v in same_minor if v != spec]
    for v in cands:
        if _has_image(images[v], flavor, cudnn, os_):
            return v
    raise image_gap(spec, flavor, cudnn, os_)


def cuda_image_tag(cuda: str, flavor: str, cudnn: str | None, os: str) -> str:
    """nvidia/cuda tag, e.g. ``12.4.1-cudnn-runtime-ubuntu22.04``, only ever one the data records;
    "X.Y" takes the newest X.Y.z with that image for the OS. ImageGap (a LookupError) saying what
    exists otherwise."""
    v = image_release(cuda, flavor, cudnn, os)
    return _tag(image_data()[1][v], flavor, cudnn, os)


def _os_key(os_: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", os_))


def newest_images(flavor: str, cudnn: str | None, os_: str, *, major: int | None = None) -> tuple[str, ...]:
    """The newest patch of each CUDA minor with that image for ``os_`` (of one major if given), newest first."""
    images = image_data()[1]
    best: dict[str, str] = {}
    for v, img in images.items():
        if (major is None or Version(v).major == major) and _has_image(img, flavor, cudnn, os_):
            best[_mm(v)] = v  # rows ascend: the last one of a minor is its newest
    return tuple(sorted(best.values(), key=Version, reverse=True))


def image_gap(cuda: str, flavor: str, cudnn: str | None, os_: str) -> ImageGap:
    """Why there is no nvidia/cuda ``flavor`` image of ``cuda`` ("X.Y" or "X.Y.Z") with ``cudnn``
    for ``os_``, and what fits instead."""
    meta, images = image_data()
    spec = str(cuda).strip()
    exact = spec.count(".") == 2
    label = spec if exact else f"{_mm(spec)}.x"
    what = flavor if cudnn is None else f"cuDNN {_cudnn_major(cudnn)} {flavor}"
    with_cudnn = "" if cudnn is None else f" with cuDNN {_cudnn_major(cudnn)}"
    group = [v for v in images if (v == spec if exact else _mm(v) == _mm(spec))]
    where: dict[str, str] = {}
    for v in group:
        for o in images[v].oses:
            if _has_image(images[v], flavor, cudnn, o):
                where[o] = v
    if where:
        reason = f"nvidia/cuda publishes {label} {what} images for {', '.join(sorted(where, key=_os_key))}"
    elif group:
        reason = f"nvidia/cuda publishes no {label} {what} image for any OS"
    else:
        why = meta["absent"].get(spec) or next((r for v, r in meta["absent"].items() if _mm(v) == _mm(spec)), None)
        reason = f"nvidia/cuda publishes no {label} image" + (f" ({why})" if why else "")
    fits = newest_images(flavor, cudnn, os_)
    try:
        spec_major = Version(spec).major
    except InvalidVersion:
        spec_major = None
    same_major = newest_images(flavor, cudnn, os_, major=spec_major) if spec_major is not None else ()
    if fits:
        reason += f"; for {os_} the newest{with_cudnn} is {fits[0]}"
        if same_major and Version(fits[0]).major != spec_major:
            reason += f" ({spec_major}.x: {same_major[0]})"
    else:
        reason += f"; no release has one for {os_}"
    hints = []
    if fits:
        hints.append(f"use cuda: \"{_mm(fits[0])}\" on {os_} (the newest that fit: {', '.join(fits[:3])})")
        if same_major and Version(fits[0]).major != spec_major:
            hints.append(f"\"{_mm(same_major[0])}\" ({same_major[0]}) to stay on CUDA {spec_major}")
    if where:
        newest_os = sorted(where, key=_os_key, reverse=True)
        hints.append("base.os: " + ", ".join(f"{o} ({where[o]})" for o in newest_os) + f" for {label}")
    if not hints:
        hints.append("use cuda.source: wheels with a base.image for that OS")
    key, other, other_value = "cuda.version", "base.os", os_
    on_os = [v for v in group if images[v].cudnn_on(os_) is not None]
    if cudnn is not None and on_os:
        key, other, other_value = "cuda.cudnn", "cuda.cudnn", f"{_cudnn_major(cudnn)} on {os_}"
    elif not fits:  # no CUDA release has this image for the OS: the OS is what is wrong (issue 21: 11)
        key, other, other_value = "base.os", "cuda", spec
    return ImageGap(spec, reason, hint=", or ".join(hints), key=key, other=other, other_value=other_value)


def image_end_of_life(cuda: str, today: datetime.date) -> ImageEol | None:
    """The end of life of ``cuda``'s nvidia/cuda images when ``today`` is on or past it; None while
    supported or where NVIDIA publishes no date."""
    img = _image_for(cuda)
    eol = img.end_of_life if img else None
    return eol if eol is not None and today >= eol.date else None


def image_releases() -> tuple[ImageSet, ...]:
    """Every CUDA release with nvidia/cuda images, ascending."""
    return tuple(image_data()[1].values())


def image_support_policy() -> dict[str, str]:
    """NVIDIA's support policy for the images as images.json records it (summary, source, read)."""
    return dict(image_data()[0]["policy"])


def cudnn_versions(cuda: str, os_: str | None = None) -> tuple[str, ...]:
    """cuDNN majors with images of ``cuda`` (on any OS, or on ``os_``)."""
    img = _image_for(cuda)
    if img is None:
        return ()
    return img.cudnn if os_ is None else (img.cudnn_on(os_) or ())
