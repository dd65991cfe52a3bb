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
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from buildkit_py.compat import tables
from buildkit_py.compat.index import DistFile, Metadata, PackageIndexError, Project, redact
from buildkit_py.errors import CompatDataError
from buildkit_py.files import write_atomic

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


def _mm(version: str) -> str:
    v = Version(version)
    return f"{v.major}.{v.minor}"


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
                variant = "cu" + _mm(pin).replace(".", "")
            continue
        if not name.startswith("nvidia-"):
            continue
        if pin:
            wheels[name] = pin
        else:
            ranges[name] = str(req.specifier)
        m = _RUNTIME_RE.match(name)
        if m and pin and variant is None:
            variant = "cu" + _mm(pin).replace(".", "")
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


def torch_row(client, project: Project, version: str, *, today: str) -> dict:
    """A torch.json row for ``version`` from its Linux x86_64 wheel's METADATA."""
    files = linux_x86_64_wheels(project, version)
    wheel = pick_wheel(files)
    if wheel is None:
        raise PackageIndexError(f"package index: torch {version} has no manylinux x86_64 wheel")
    f = torch_facts(client.metadata(wheel), files)
    row: dict = {"version": version, "python": f.python}
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
    files: dict                  # name -> new raw data (only files that changed)

    def to_json(self) -> dict:
        return {"index": self.index_url, "date": self.today, "changes": [c.__dict__ for c in self.changes],
                "review": list(self.review), "files_changed": sorted(self.files)}


_TORCH_KEYS = ("python", "pypi_variant", "pypi_cuda_wheels", "pypi_cuda_toolkit_extras", "triton")


def _merge_torch(old: dict | None, new: dict, changes: list[Change], known_mm: set[str]) -> dict | None:
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


def _sorted_rows(rows, key="version"):
    return sorted(rows, key=lambda r: Version(r[key]))


def refresh(client, data: dict[str, dict], *, today: str, since: str = "1.13") -> RefreshReport:
    """Compare the shipped data (``data``: file name -> raw JSON) with the index; return the
    changed files and what changed. Rows keep their hand-sourced fields (variants from PyTorch's
    matrix, Table 3 drivers); only what the index serves is rewritten, each with its source and date."""
    run = _Refresh(client, copy.deepcopy(data), today)
    run.torch(since)
    run.toolkits()
    run.new_releases()
    run.bitsandbytes()
    for name in run.touched:
        run.data[name]["as_of"] = today
    return RefreshReport(redact(client.index_url), today, tuple(run.changes), tuple(run.review),
                         {name: run.data[name] for name in sorted(run.touched)})


class _Refresh:
    """One refresh run: the data being rewritten, and what changed, what needs a person, which files."""

    def __init__(self, client, data: dict[str, dict], today: str):
        self.client, self.data, self.today = client, data, today
        self.changes: list[Change] = []
        self.review: list[str] = []
        self.touched: set[str] = set()
        self._projects: dict[str, Project] = {}

    def project(self, name: str) -> Project:
        if name not in self._projects:
            self._projects[name] = self.client.project(name)
        return self._projects[name]

    # --- torch: every release on the index, by version ---------------------------------------
    def torch(self, since: str) -> None:
        data = self.data
        known_mm = {".".join(t["version"].split(".")[:2]) for t in data["toolkits.json"]["toolkits"]}
        torch = self.client.project("torch")
        rows = {r["version"]: r for r in data["torch.json"]["releases"]}
        for v in torch.releases():
            if Version(v) < Version(since):
                continue
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
        tk = self.client.project("cuda-toolkit")
        tk_rows = {t["version"]: t for t in data["toolkits.json"]["toolkits"]}
        wheel_rows = {r["toolkit"]: r for r in data["wheels.json"]["releases"]}
        for mv in tk.releases():
            tv = toolkit_version(mv)
            wheels = [f for f in tk.files_of(mv) if f.is_wheel]
            if not wheels or Version(tv).major < 11:
                continue
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

    def _new_toolkit(self, tk: Project, mv: str, tv: str, wheel: DistFile) -> dict | None:
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

    def _merge_wheels(self, wheel_rows: dict[str, dict], tv: str, mv: str, extras: dict[str, dict[str, str]],
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

    # --- flash-attn and bitsandbytes: release lists; bnb wheel METADATA -----------------------
    def new_releases(self) -> None:
        for name, file in (("flash-attn", "flash_attn.json"), ("bitsandbytes", "bitsandbytes.json")):
            listing = self.client.project(name)
            shipped = {r["version"] for r in self.data[file]["releases"]}
            newest_shipped = max((Version(v) for v in shipped), default=Version("0"))
            for v in listing.releases():
                if v not in shipped and Version(v) > newest_shipped:
                    self.review.append(f"{name} {v}: new on the index (shipped data ends at {newest_shipped}); "
                                       "its CUDA/torch support needs reading its sources")

    def bitsandbytes(self) -> None:
        bnb = self.client.project("bitsandbytes")
        for row in self.data["bitsandbytes.json"]["releases"]:
            wheels = list(linux_x86_64_wheels(bnb, row["version"])) or \
                [f for f in bnb.files_of(row["version"]) if f.is_wheel and any(t.endswith("-any") for t in f.tags)]
            if not wheels or Version(row["version"]) < Version("0.45"):
                continue
            meta = self.client.metadata(wheels[0])
            torch_req = next((r for r in _linux_reqs(meta) if r.name.lower() == "torch"), None)
            torch_spec = str(torch_req.specifier) if torch_req is not None and str(torch_req.specifier) else None
            checks: tuple[tuple[str, str | None], ...] = (("torch", torch_spec), ("python", meta.requires_python))
            for key, val in checks:
                if val and SpecifierSet(val) != SpecifierSet(row.get(key) or ""):
                    self.changes.append(Change("bitsandbytes.json", row["version"],
                                               f"{key}: {row.get(key)!r} -> {val!r}"))
                    row[key] = val
                    row["read"] = self.today
                    self.touched.add("bitsandbytes.json")


def dump(raw: dict) -> str:
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
        env = dict(os.environ, IMGBUILD_COMPAT_DATA=tmp)
        proc = subprocess.run([sys.executable, "-c", "from buildkit_py.compat import validate_all; validate_all()"],
                              env=env, capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode:
            last = (proc.stderr.strip().splitlines() or ["?"])[-1]
            raise CompatDataError(f"refreshed data would not load: {last}",
                                  hint="nothing was written; fix the data by hand or report the index answer")


def write_files(files: dict[str, str], directory) -> list[str]:
    written = []
    for name, text in files.items():
        path = Path(directory) / name
        if not (path.is_file() and path.read_text(encoding="utf-8") == text):
            write_atomic(path, text)
            written.append(name)
    return written
