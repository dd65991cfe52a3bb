"""What the package index says about a release, turned into rows of the compat data files.

Pure functions over ``index.Metadata`` and ``index.Project`` (no I/O of their own), shared by
``imgbuild data refresh`` / ``scripts/refresh_compat.py --write`` (rewrite the shipped files) and
the plan-time live lookup (a pin newer than the shipped data, see ``compat.live``).

torch: the CUDA variant comes from the CUDA wheels its Linux wheel requires —
``nvidia-cuda-runtime-cu11/cu12==X.Y.*`` up to CUDA 12, ``cuda-toolkit[...]==X.Y.Z`` from CUDA 13
(whose wheels have no suffix); the Python range from the CPython tags of its manylinux x86_64
wheels (``Requires-Python`` has no upper bound and admits Pythons without a wheel).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from buildkit_py.compat import fa_repo, tables
from buildkit_py.compat.index import DistFile, IndexClient, Metadata, Project, redact
from buildkit_py.errors import CompatDataError, PackageIndexError
from buildkit_py.files import write_atomic
from buildkit_py.versions import major_minor

if TYPE_CHECKING:
    from importlib.abc import Traversable  # importlib.resources.abc only from Python 3.11

# The environment a Linux x86_64 wheel is installed in, for evaluating Requires-Dist markers.
_LINUX = {"platform_system": "Linux", "sys_platform": "linux", "platform_machine": "x86_64",
          "os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython"}
_RUNTIME_RE = re.compile(r"^nvidia-cuda-runtime(?:-cu(\d+))?$")


@dataclass(frozen=True)
class TorchFacts:
    version: str
    variant: str | None                 # e.g. "cu130": the CUDA build PyPI's Linux wheel is
    python: str                         # e.g. ">=3.10,<3.15" from the cpXY tags
    requires_python: str | None         # the wheel's own Requires-Python (lower bound)
    cuda_wheels: dict[str, str]         # == pins of nvidia-* / cuda-toolkit for Linux x86_64
    cuda_toolkit_extras: tuple[str, ...]
    ranges: dict[str, str]              # nvidia-* requirements that are ranges, not pins
    triton: str | None
    source: str


def linux_x86_64_wheels(project: Project, version: str) -> tuple[DistFile, ...]:
    return tuple(f for f in project.files_of(version) if f.is_wheel
                 and any("manylinux" in t and t.endswith("x86_64") for t in f.tags))


def cpython_range(files: tuple[DistFile, ...]) -> str | None:
    """``>=3.10,<3.15`` from the cpXY interpreter tags (free-threaded ``t`` builds ignored)."""
    minors = set()
    for f in files:
        for t in f.tags:
            interp, abi = t.split("-")[0], t.split("-")[1]
            m = re.fullmatch(r"cp3(\d+)", interp)
            if m and not abi.endswith("t"):
                minors.add(int(m.group(1)))
    if not minors:
        return None
    lo, hi = min(minors), max(minors)
    return f">=3.{lo},<3.{hi + 1}"


def pick_wheel(files: tuple[DistFile, ...], prefer: str = "cp312") -> DistFile | None:
    """One representative wheel (its METADATA is the same for every cpXY)."""
    for f in files:
        if any(t.startswith(f"{prefer}-{prefer}-") for t in f.tags):
            return f
    return files[0] if files else None


def _linux_reqs(meta: Metadata, python: str = "3.12") -> list[Requirement]:
    env = dict(_LINUX, python_version=python, python_full_version=python + ".0", extra="")
    out = []
    for text in meta.requires_dist:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is None or Marker(str(req.marker)).evaluate(env):
            out.append(req)
    return out


def _pin(req: Requirement) -> str | None:
    specs = list(req.specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "==="):
        return specs[0].version.removesuffix(".*")
    return None


def torch_facts(meta: Metadata, files: tuple[DistFile, ...]) -> TorchFacts:
    wheels: dict[str, str] = {}
    ranges: dict[str, str] = {}
    extras: tuple[str, ...] = ()
    variant = triton = None
    python = cpython_range(files) or (meta.requires_python or "")
    lowest = re.search(r">=\s*(3\.\d+)", python)
    for req in _linux_reqs(meta, lowest.group(1) if lowest else "3.12"):  # markers like python_version < "3.12"
        name = req.name.lower()
        pin = _pin(req)
        if name == "triton":
            triton = pin or str(req.specifier)
            continue
        if name == "cuda-toolkit":
            extras = tuple(sorted(req.extras))
            if pin:
                wheels[name] = pin
                variant = "cu" + major_minor(pin).replace(".", "")
            continue
        if not name.startswith("nvidia-"):
            continue
        if pin:
            wheels[name] = pin
        else:
            ranges[name] = str(req.specifier)
        m = _RUNTIME_RE.match(name)
        if m and pin and variant is None:
            variant = "cu" + major_minor(pin).replace(".", "")
    return TorchFacts(meta.version, variant, python, meta.requires_python, dict(sorted(wheels.items())), extras,
                      dict(sorted(ranges.items())), triton, meta.source)


def toolkit_extras(meta: Metadata) -> dict[str, dict[str, str]]:
    """NVIDIA's ``cuda-toolkit`` meta package: extra -> {wheel: specifier} for Linux x86_64."""
    extras = set(meta.provides_extra)
    for text in meta.requires_dist:
        extras.update(re.findall(r"extra\s*==\s*['\"]([\w-]+)['\"]", text))
    extras.discard("all")
    out: dict[str, dict[str, str]] = {}
    for extra in sorted(extras):
        env = dict(_LINUX, python_version="3.12", python_full_version="3.12.0", extra=extra)
        for text in meta.requires_dist:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if req.marker is not None and "extra" in str(req.marker) and req.marker.evaluate(env):
                out.setdefault(extra, {})[req.name.lower()] = str(req.specifier)
    return out


def newest_matching(project: Project, spec: str) -> str | None:
    """The newest release of ``project`` with a Linux x86_64 (or pure) wheel that ``spec`` admits
    (``==13.5.37.*`` admits 13.5.37 and 13.5.37.post1)."""
    want = SpecifierSet(spec)
    best = None
    for f in project.files:
        if f.yanked or not f.is_wheel or not any(t.endswith(("x86_64", "-any")) and "macosx" not in t and "win" not in t
                                                 for t in f.tags):
            continue
        v = Version(f.version)
        if want.contains(v, prereleases=True) and (best is None or v > best):
            best = v
    return str(best) if best is not None else None


def toolkit_version(cuda_toolkit_version: str) -> str:
    """``12.8.2.0`` (the meta package's spelling) -> ``12.8.2``."""
    r = Version(cuda_toolkit_version).release
    return ".".join(str(x) for x in (r + (0, 0))[:3])


# ----------------------------------------------------------------------------- rows and the refresh run
_NO_VARIANTS_NOTE = ("only the PyPI build is known from the index; PyTorch's other CUDA variants "
                     "(download.pytorch.org/whl/<variant>) are not read")


def torch_row(client: IndexClient, project: Project, version: str, *, today: str) -> dict[str, Any]:
    """A torch.json row for ``version`` from its Linux x86_64 wheel's METADATA."""
    files = linux_x86_64_wheels(project, version)
    wheel = pick_wheel(files)
    if wheel is None:
        raise PackageIndexError(f"package index: torch {version} has no manylinux x86_64 wheel")
    f = torch_facts(client.metadata(wheel), files)
    row: dict[str, Any] = {"version": version, "python": f.python}
    if f.variant:
        v = f.variant
        row["variants"] = {v: f"{int(v[2:-1])}.{v[-1]}"}
    else:
        row["variants"] = {}
    row.update({"pypi_variant": f.variant, "pypi_cuda_wheels": f.cuda_wheels})
    if f.cuda_toolkit_extras:
        row["pypi_cuda_toolkit_extras"] = list(f.cuda_toolkit_extras)
    row["triton"] = f.triton
    row["source"] = (f"python (cpXY tags of the manylinux x86_64 wheels), pypi_variant, pins and triton from "
                     f"{redact(project.index_url)}torch/ {wheel.filename} METADATA, read {today}")
    row["read"] = today
    notes = [_NO_VARIANTS_NOTE]
    if f.ranges:
        notes.append("the PyPI wheel also requires " + ", ".join(f"{k}{s}" for k, s in f.ranges.items()))
    row["notes"] = "; ".join(notes)
    return row


@dataclass(frozen=True)
class Change:
    file: str
    key: str
    what: str

    def render(self) -> str:
        return f"{self.file}: {self.key}: {self.what}"


@dataclass(frozen=True)
class RefreshReport:
    index_url: str
    today: str
    changes: tuple[Change, ...]
    review: tuple[str, ...]      # what the index alone cannot settle (a person reads the source)
    files: dict[str, dict[str, Any]]   # name -> new raw data (only files that changed)

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index_url, "date": self.today, "changes": [c.__dict__ for c in self.changes],
                "review": list(self.review), "files_changed": sorted(self.files)}


_TORCH_KEYS = ("python", "pypi_variant", "pypi_cuda_wheels", "pypi_cuda_toolkit_extras", "triton")


def _merge_torch(old: dict[str, Any] | None, new: dict[str, Any], changes: list[Change],
                 known_mm: set[str]) -> dict[str, Any] | None:
    v = new["version"]
    if old is None:
        cuda = next(iter(new["variants"].values()), None)
        if cuda not in known_mm:
            return None
        changes.append(Change("torch.json", v, f"new release ({new['pypi_variant']} on PyPI, Python {new['python']})"))
        return new
    row = dict(old)
    for k in _TORCH_KEYS:
        if row.get(k) != new.get(k) and not (k == "pypi_cuda_toolkit_extras" and not new.get(k) and k not in row):
            changes.append(Change("torch.json", v, f"{k}: {row.get(k)!r} -> {new.get(k)!r}"))
            if new.get(k) is None and k == "pypi_cuda_toolkit_extras":
                row.pop(k, None)
            else:
                row[k] = new.get(k)
    pv = new["pypi_variant"]
    if pv and pv not in row.get("variants", {}):
        row["variants"] = dict(sorted({**row.get("variants", {}), **new["variants"]}.items()))
        changes.append(Change("torch.json", v, f"variants: + {pv} (the PyPI build)"))
    head = row.get("source", "").split("; python (cpXY tags")[0]
    if head.startswith("python (cpXY tags"):
        head = ""
    row["source"] = f"{head}; {new['source']}" if head else new["source"]
    row["read"] = new["read"]
    return row


def _sorted_rows(rows: Iterable[dict[str, Any]], key: str = "version") -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: Version(r[key]))


def refresh(client: IndexClient, data: dict[str, dict[str, Any]], *, today: str, since: str = "1.13",
            flash_attn_repo: Path | None = None, on_status: Callable[[str], None] | None = None) -> RefreshReport:
    """Compare the shipped data (``data``: file name -> raw JSON) with the index; return the
    changed files and what changed. Rows keep their hand-sourced fields (variants from PyTorch's
    matrix, Table 3 drivers); only what the index serves is rewritten, each with its source and date.
    Every flash-attn and bitsandbytes release on the index that the data lacks is added: from the
    index (and, for flash-attn, from its tag in ``flash_attn_repo``, a clone of
    Dao-AILab/flash-attention), as a ``partial`` row where those do not say enough.
    ``on_status`` hears what is being read (a refresh makes a few hundred requests)."""
    run = _Refresh(client, copy.deepcopy(data), today, on_status or (lambda _text: None))
    run.torch(since)
    run.toolkits()
    run.flash_attn(flash_attn_repo)
    run.bitsandbytes()
    for name in run.touched:
        run.data[name]["as_of"] = today
    return RefreshReport(redact(client.index_url), today, tuple(run.changes), tuple(run.review),
                         {name: run.data[name] for name in sorted(run.touched)})


class _Refresh:
    """One refresh run: the data being rewritten, and what changed, what needs a person, which files."""

    def __init__(self, client: IndexClient, data: dict[str, dict[str, Any]], today: str, status: Callable[[str], None]):
        self.client, self.data, self.today, self.status = client, data, today, status
        self.changes: list[Change] = []
        self.review: list[str] = []
        self.touched: set[str] = set()
        self._projects: dict[str, Project] = {}

    def project(self, name: str) -> Project:
        if name not in self._projects:
            self.status(f"reading the {name} releases")
            self._projects[name] = self.client.project(name)
        return self._projects[name]

    # --- torch: every release on the index, by version ---------------------------------------
    def torch(self, since: str) -> None:
        data = self.data
        known_mm = {major_minor(t["version"]) for t in data["toolkits.json"]["toolkits"]}
        self.status("reading the torch releases")
        torch = self.client.project("torch")
        rows = {r["version"]: r for r in data["torch.json"]["releases"]}
        releases = [v for v in torch.releases() if Version(v) >= Version(since)]
        for n, v in enumerate(releases, 1):
            self.status(f"reading torch {v}'s wheel METADATA ({n} of {len(releases)})")
            try:
                new = torch_row(self.client, torch, v, today=self.today)
            except Exception as exc:  # one bad release must not stop the refresh; say which
                self.review.append(f"torch {v}: {exc}")
                continue
            before = len(self.changes)
            merged = _merge_torch(rows.get(v), new, self.changes, known_mm)
            if merged is None:
                self.review.append(f"torch {v}: its PyPI build {new['pypi_variant']} is a CUDA no shipped toolkit "
                                   "knows; add the toolkit (toolkits.json) first")
                continue
            rows[v] = merged
            if len(self.changes) > before:
                self.touched.add("torch.json")
        data["torch.json"]["releases"] = _sorted_rows(rows.values())

    # --- CUDA toolkits: NVIDIA's cuda-toolkit meta package -> wheels.json releases ----------
    def toolkits(self) -> None:
        data = self.data
        self.status("reading the cuda-toolkit releases")
        tk = self.client.project("cuda-toolkit")
        tk_rows = {t["version"]: t for t in data["toolkits.json"]["toolkits"]}
        wheel_rows = {r["toolkit"]: r for r in data["wheels.json"]["releases"]}
        for mv in tk.releases():
            tv = toolkit_version(mv)
            wheels = [f for f in tk.files_of(mv) if f.is_wheel]
            if not wheels or Version(tv).major < 11:
                continue
            self.status(f"reading cuda-toolkit {mv}'s extras and their wheels")
            extras = self._toolkit_extras(mv, wheels[0])
            if tv not in tk_rows:
                row = self._new_toolkit(tk, mv, tv, wheels[0])
                if row is None:
                    continue
                tk_rows[tv] = row
            src = (f"{redact(tk.index_url)}cuda-toolkit/ {wheels[0].filename} METADATA Requires-Dist per extra, "
                   f"each pin resolved to the newest Linux x86_64 wheel of that package on {redact(tk.index_url)}")
            self._merge_wheels(wheel_rows, tv, mv, extras, src)
        data["toolkits.json"]["toolkits"] = _sorted_rows(tk_rows.values())
        data["wheels.json"]["releases"] = _sorted_rows(wheel_rows.values(), key="toolkit")

    def _toolkit_extras(self, mv: str, wheel: DistFile) -> dict[str, dict[str, str]]:
        """cuda-toolkit's extras, each pin resolved to the newest wheel on the index that matches."""
        extras: dict[str, dict[str, str]] = {}
        for extra, reqs in toolkit_extras(self.client.metadata(wheel)).items():
            for name, spec in reqs.items():
                got = newest_matching(self.project(name), spec)
                if got is None:
                    self.review.append(f"cuda-toolkit {mv}: extra {extra}: no {name} wheel matches {spec}")
                    continue
                extras.setdefault(extra, {})[name] = got
        return extras

    def _new_toolkit(self, tk: Project, mv: str, tv: str, wheel: DistFile) -> dict[str, Any] | None:
        """A toolkit the data lacks: its native floor unpublished (null) until a person reads Table 3; its
        major must have a minor-version floor, the only one then known."""
        major = Version(tv).major
        floor = {f["major"]: f for f in self.data["minor_compat.json"]["floors"]}.get(major)
        if floor is None:
            self.review.append(f"cuda-toolkit {mv}: CUDA {major}.x has no minor-version floor recorded")
            return None
        self.changes.append(Change("toolkits.json", tv, f"new toolkit (cuda-toolkit {mv} on the index; native "
                                                        "floor unpublished until a person reads Table 3; minor-"
                                                        f"version floor {floor['linux_min_driver']})"))
        self.review.append(f"toolkit {tv}: its Table 3 minimum driver, nvcc architectures (archs.json) and "
                           "nvidia/cuda images (images.json) need reading NVIDIA's pages")
        self.data["images.json"].setdefault("absent", {})[tv] = {
            "reason": f"added by imgbuild data refresh on {self.today}: no nvidia/cuda tags read for it yet",
            "read": self.today}
        self.touched.update({"toolkits.json", "images.json"})
        return {"version": tv, "linux_min_driver": None, "windows_min_driver": None,
                "min_driver_basis": "unpublished",
                "source": f"{redact(tk.index_url)}cuda-toolkit/ {wheel.filename} (the release); no native floor "
                          f"read: the CUDA {major}.x minor-version floor (minor_compat.json) is the only one known",
                "read": self.today,
                "notes": "added by imgbuild data refresh from the package index: look its minimum driver "
                         "up in NVIDIA's release notes Table 3"}

    def _merge_wheels(self, wheel_rows: dict[str, dict[str, Any]], tv: str, mv: str, extras: dict[str, dict[str, str]],
                      src: str) -> None:
        old = wheel_rows.get(tv)
        if old is None:
            wheel_rows[tv] = {"toolkit": tv, "meta_package": f"cuda-toolkit=={mv}",
                              "extras": dict(sorted(extras.items())), "source": src, "read": self.today}
            self.changes.append(Change("wheels.json", tv, f"new release from cuda-toolkit {mv} "
                                                          f"(cudart {extras.get('cudart')})"))
            self.touched.add("wheels.json")
        elif old.get("extras") != extras:
            diff = sorted(x for x in set(extras) | set(old.get("extras", {}))
                          if extras.get(x) != old.get("extras", {}).get(x))
            self.changes.append(Change("wheels.json", tv, f"extras changed: {', '.join(diff)}"))
            wheel_rows[tv] = {**old, "extras": dict(sorted(extras.items())), "meta_package": f"cuda-toolkit=={mv}",
                              "source": src, "read": self.today}
            self.touched.add("wheels.json")

    # --- flash-attn: every release on the index; build facts from its tag -------------------
    def flash_attn(self, repo: Path | None) -> None:
        file = "flash_attn.json"
        listing = self.project("flash-attn")
        rows = {r["version"]: r for r in self.data[file]["releases"]}
        on_index = set(listing.releases())
        for v in sorted(set(rows) - on_index, key=Version):
            self.review.append(f"flash-attn {v}: in {file} but not a release on the index (yanked or removed)")
        for v in listing.releases():
            self.status(f"reading flash-attn {v}")
            facts = fa_repo.read_tag(repo, v) if repo is not None else None
            old = rows.get(v)
            if old is None:
                rows[v], what = self._fa_new_row(listing, v, facts, repo)
                self._change(file, v, what)
                continue
            if facts is None or facts.missing:
                continue
            if old.get("partial"):
                rows[v], what = self._fa_new_row(listing, v, facts, repo)
                self._change(file, v, what.replace("new release", "was partial, now filled", 1))
                continue
            self._fa_update(old, facts)
        self.data[file]["releases"] = [_in_order(r, _FA_KEYS) for r in _sorted_rows(rows.values())]

    def _fa_new_row(self, listing: Project, v: str, facts: fa_repo.TagFacts | None,
                    repo: Path | None) -> tuple[dict[str, Any], str]:
        """A flash_attn.json row for release ``v`` and what to report about it."""
        sdist = next(iter(listing.files_of(v)), None)
        row: dict[str, Any] = {"version": v, "python": (sdist.requires_python if sdist else None) or ""}
        where = f"{redact(listing.index_url)}flash-attn/ {sdist.filename if sdist else v} (Requires-Python)"
        if facts is not None and not facts.missing:
            row.update({"torch": facts.torch, "cuda": facts.cuda, "archs": list(facts.archs), "cxx_std": facts.cxx_std,
                        "gencode": [{"sm": sm, "nvcc": nvcc} for sm, nvcc in facts.gencode],
                        "prebuilt": list(facts.prebuilt)})
            row["source"] = f"{where}; {facts.source()}"
            n = fa_repo.combinations(facts.prebuilt)
            row["notes"] = facts.prebuilt_note or (
                f"{n} release wheels per the tag's publish.yml matrix (the GitHub release's assets are not read)")
            dev = sorted({w["torch_build"] for w in facts.prebuilt if Version(w["torch_build"]).is_prerelease})
            if dev:
                row["notes"] += (f"; the wheels built against torch pre-releases ({', '.join(dev)}) are recorded "
                                 "but never taken for a torch release")
            what = f"new release (from the index and tag {facts.tag}: {n} release wheels)"
        else:
            if repo is None:
                why = "no flash-attention repository given (--flash-attn-repo)"
            elif facts is None:
                why = f"no tag v{v} in {repo}"
            else:
                why = f"tag {facts.tag} does not say: {', '.join(facts.missing)}"
            row["partial"] = (f"known from the package index only ({why}): its torch, CUDA, GPU and C++ "
                              "requirements and release wheels are not recorded")
            row["source"] = where
            what = f"new release, partial ({why})"
            self.review.append(f"flash-attn {v}: partial row ({why}); plans refuse it until its build facts "
                               "are read")
        row["read"] = self.today
        return row, what

    def _fa_update(self, row: dict[str, Any], facts: fa_repo.TagFacts) -> None:
        """A known release whose tag was read: its wheels, -gencode list and C++ standard follow the tag."""
        new: dict[str, Any] = {"cxx_std": facts.cxx_std,
                               "gencode": [{"sm": sm, "nvcc": nvcc} for sm, nvcc in facts.gencode],
                               "prebuilt": list(facts.prebuilt)}
        changed = [k for k, val in new.items() if row.get(k) != val]
        if not changed:
            return
        for k in changed:
            if k == "prebuilt":
                before, after = fa_repo.combinations(row.get("prebuilt", ())), fa_repo.combinations(new[k])
                self._change("flash_attn.json", row["version"], f"prebuilt: {before} -> {after} release wheels "
                                                               f"({facts.tag} publish.yml)")
            else:
                self._change("flash_attn.json", row["version"], f"{k}: {row.get(k)!r} -> {new[k]!r}")
            row[k] = new[k]
        head = row.get("source", "").split("; Dao-AILab/flash-attention tag ")[0]
        row["source"] = f"{head}; {facts.source()}"
        row["read"] = self.today

    def _change(self, file: str, key: str, what: str) -> None:
        self.changes.append(Change(file, key, what))
        self.touched.add(file)

    # --- bitsandbytes: every release on the index; CUDA libraries and METADATA of its wheel --
    def bitsandbytes(self) -> None:
        file = "bitsandbytes.json"
        bnb = self.project("bitsandbytes")
        rows = {r["version"]: r for r in self.data[file]["releases"]}
        known = {major_minor(t["version"]) for t in self.data["toolkits.json"]["toolkits"]}
        for v in sorted(set(rows) - set(bnb.releases()), key=Version):
            self.review.append(f"bitsandbytes {v}: in {file} but not a release on the index (yanked or removed)")
        for v in bnb.releases():
            self.status(f"reading bitsandbytes {v}'s wheel")
            wheel = _bnb_wheel(bnb, v)
            row = rows.get(v)
            if wheel is None:
                if row is None:
                    self.review.append(f"bitsandbytes {v}: no Linux x86_64 wheel on the index; not added")
                continue
            if row is None:
                rows[v] = self._bnb_new_row(bnb, v, wheel, known)
                continue
            if Version(v) >= Version("0.45"):
                self._bnb_metadata(row, wheel)
            if isinstance(row.get("cuda"), list):
                libs = self._bnb_libs(wheel, known)
                if libs.cuda != row["cuda"]:
                    self._change(file, v, f"cuda: {row['cuda']} -> {libs.cuda} (the wheel's CUDA libraries)")
                    row["cuda"] = libs.cuda
                    row["read"] = self.today
        self.data[file]["releases"] = _sorted_rows(rows.values())

    def _bnb_metadata(self, row: dict[str, Any], wheel: DistFile) -> None:
        meta = self.client.metadata(wheel)
        torch_req = next((r for r in _linux_reqs(meta) if r.name.lower() == "torch"), None)
        torch_spec = str(torch_req.specifier) if torch_req is not None and str(torch_req.specifier) else None
        checks: tuple[tuple[str, str | None], ...] = (("torch", torch_spec), ("python", meta.requires_python))
        for key, val in checks:
            if val and SpecifierSet(val) != SpecifierSet(row.get(key) or ""):
                self._change("bitsandbytes.json", row["version"], f"{key}: {row.get(key)!r} -> {val!r}")
                row[key] = val
                row["read"] = self.today

    def _bnb_libs(self, wheel: DistFile, known: set[str]) -> BnbLibs:
        return bnb_libs(self.client.members(wheel), known)

    def _bnb_new_row(self, bnb: Project, v: str, wheel: DistFile, known: set[str]) -> dict[str, Any]:
        meta = self.client.metadata(wheel)
        libs = self._bnb_libs(wheel, known)
        torch_req = next((r for r in _linux_reqs(meta) if r.name.lower() == "torch"), None)
        row: dict[str, Any] = {"version": v, "cuda": libs.cuda}
        if libs.nocublaslt and libs.nocublaslt != libs.cuda:   # loaders after 0.44 have no _nocublaslt variant
            row["cuda_nocublaslt"] = libs.nocublaslt
        row["python"] = meta.requires_python or ""
        if torch_req is not None and str(torch_req.specifier):
            row["torch"] = str(torch_req.specifier)
        row["partial"] = ("added by imgbuild data refresh from the index: the wheel's CUDA libraries and METADATA "
                          "are read; which library its loader picks and the GPUs it has kernels for are not")
        row["source"] = (f"{redact(bnb.index_url)}bitsandbytes/ {wheel.filename}: libbitsandbytes_cuda*.so files "
                         "in its zip central directory (HTTP range) and METADATA (Requires-Python, Requires-Dist)")
        row["read"] = self.today
        notes = [f"wheel tags: {', '.join(sorted(wheel.tags))}"]
        if libs.unknown:
            notes.append(f"also ships libraries for CUDA {', '.join(libs.unknown)}, which no toolkit imgbuild knows")
        row["notes"] = "; ".join(notes)
        self._change("bitsandbytes.json", v, f"new release, partial (CUDA libraries {', '.join(libs.cuda) or 'none'})")
        self.review.append(f"bitsandbytes {v}: partial row; read its loader (cextension.py / cuda_setup) and "
                           "installation guide for the CUDA rule and compute capability floors")
        return row


_FA_KEYS = ("version", "python", "torch", "cuda", "archs", "cxx_std", "gencode", "prebuilt", "partial", "source",
            "read", "notes")


def _in_order(row: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The row with its keys in the file's order (unknown keys last, as they were)."""
    return {**{k: row[k] for k in keys if k in row}, **{k: v for k, v in row.items() if k not in keys}}


@dataclass(frozen=True)
class BnbLibs:
    cuda: list[str]          # CUDA X.Y with libbitsandbytes_cudaXY.so, of toolkits imgbuild knows
    nocublaslt: list[str]    # CUDA X.Y with libbitsandbytes_cudaXY_nocublaslt.so
    unknown: list[str]       # CUDA X.Y libraries of toolkits imgbuild does not know (e.g. 10.2)


def bnb_libs(names: Iterable[str], known: set[str]) -> BnbLibs:
    """The CUDA versions a bitsandbytes wheel carries libraries for, from its file names."""
    main: set[str] = set()
    nocublaslt: set[str] = set()
    for n in names:
        m = re.fullmatch(r"(?:.*/)?libbitsandbytes_cuda(\d\d+)(_nocublaslt)?\.so", n)
        if m:   # cuda118 -> 11.8, cuda102 -> 10.2: the minor is the last digit
            digits = m.group(1)
            (nocublaslt if m.group(2) else main).add(f"{int(digits[:-1])}.{digits[-1]}")
    order = sorted(main | nocublaslt, key=Version)
    return BnbLibs([c for c in order if c in main and c in known], [c for c in order if c in nocublaslt and c in known],
                   [c for c in order if c not in known])


def _bnb_wheel(project: Project, version: str) -> DistFile | None:
    """The Linux x86_64 wheel of a bitsandbytes release (py3-none-any before 0.43)."""
    wheels = list(linux_x86_64_wheels(project, version)) or \
        [f for f in project.files_of(version) if f.is_wheel and any(t.endswith("-any") for t in f.tags)]
    return wheels[0] if wheels else None


def dump(raw: dict[str, Any]) -> str:
    """The data files' own layout: one-space indent, keys in file order, UTF-8, final newline."""
    return json.dumps(raw, indent=1, ensure_ascii=False) + "\n"


def validate_files(files: dict[str, str]) -> None:
    """Load the shipped data with ``files`` (name -> text) swapped in, in a child process, and
    raise CompatDataError with the loader's message if any invariant breaks."""
    with tempfile.TemporaryDirectory(prefix="imgbuild-compat-") as tmp:
        for name in tables.DATA_FILES:
            shutil.copyfile(str(tables.data_dir().joinpath(name)), Path(tmp) / name)
        for name, text in files.items():
            (Path(tmp) / name).write_text(text, encoding="utf-8")
        code = "import sys; from buildkit_py.compat.tables import validate_folder; validate_folder(sys.argv[1])"
        proc = subprocess.run([sys.executable, "-c", code, tmp], capture_output=True, text=True, timeout=120,
                              check=False)
        if proc.returncode:
            last = (proc.stderr.strip().splitlines() or ["?"])[-1]
            raise CompatDataError(f"refreshed data would not load: {last}",
                                  hint="nothing was written; fix the data by hand or report the index answer")


def write_files(files: dict[str, str], directory: str | os.PathLike[str] | Traversable) -> list[str]:
    written = []
    for name, text in files.items():
        # A Traversable is tables.data_dir()'s: a pathlib.Path for the package on disk, the only one
        # a refresh can write into (Path() refuses a zipped package's, as it did untyped).
        path = Path(directory) / name  # type: ignore[arg-type]
        if not (path.is_file() and path.read_text(encoding="utf-8") == text):
            write_atomic(path, text)
            written.append(name)
    return written
