"""The plan-time look-up of pins newer than the shipped data, and its cache: the CLI's and the
pipeline's business, never the resolver's (which gets what was found as ``LookedUp``).

``ensure_torch`` reads a ``torch:`` pin that neither the shipped ``torch.json`` nor the cache knows
from the index pip would use (its Linux wheel's METADATA: CUDA variant, pins, Python range) and
stores it in the cache folder it is given (the CLI's: ``$XDG_CACHE_HOME/imgbuild/compat/``) with
the index URL and the date read;
``looked_up`` turns the cache and the look-up's outcome into the facts the resolver takes. A file
that is unreadable or of another schema counts as empty. With ``--offline`` nothing is looked up;
an unknown pin stays an error naming what is missing.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from buildkit_py.compat import index, platforms, refresh, torch_data, wheel_contents
from buildkit_py.compat.rules import LookedUp
from buildkit_py.compat.torch_data import TorchRelease
from buildkit_py.errors import CompatDataError, PackageIndexError
from buildkit_py.files import write_atomic
from buildkit_py.recipe.model import Recipe, pin_name
from buildkit_py.schemas import load_schema, validate

CACHE_SCHEMA = 1


@dataclass(frozen=True)
class Lookup:
    """How the plan-time look-up reaches the package index and its cache, as the CLI read them once
    (cli/settings.py): nothing here reads the environment."""

    offline: bool = False
    index_url: str | None = None  # --index-url
    pip_config: str | None = None  # --pip-config
    environ: Mapping[str, str] = field(default_factory=dict)  # pip's variables (PIP_INDEX_URL, PIP_CERT, HOME)
    cache: Path | None = None  # the look-up cache's folder; None: none (a row looked up serves this run only)

    def index_settings(self) -> index.IndexSettings:
        return index.index_settings(index_url=self.index_url, pip_config=self.pip_config, env=self.environ)


OFFLINE = Lookup(offline=True)  # neither the index nor a cache: the shipped data alone


def torch_file(cache: Path) -> Path:
    return cache / "torch.json"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("schema") == CACHE_SCHEMA else {}


def cached_rows(cache: Path | None) -> dict[str, dict[str, Any]]:
    """version -> cached torch.json row (with its ``index`` and ``read``)."""
    rows = _read(torch_file(cache)).get("releases", {}) if cache is not None else {}
    return rows if isinstance(rows, dict) else {}


def store(cache: Path, version: str, row: dict[str, Any]) -> Path:
    """Add (or replace) one torch row; the file is written atomically."""
    path = torch_file(cache)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _read(path) or {"schema": CACHE_SCHEMA, "releases": {}}
    data["releases"][version] = row
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


def cached_torch_releases(cache: Path | None) -> tuple[TorchRelease, ...]:
    """Every cache row the current data can accept, as a checked ``TorchRelease`` (``from_cache``
    set); a row of another shape, or with a CUDA variant no shipped toolkit knows, is left out."""
    return _checked(cached_rows(cache), str(torch_file(cache)) if cache is not None else "")


def _checked(rows: dict[str, dict[str, Any]], where: str) -> tuple[TorchRelease, ...]:
    out = []
    for row in rows.values():
        try:
            Version(str(row.get("version")))
            if validate(row, {"$ref": "#/$defs/torch_release"}, root=load_schema("compat")):
                continue  # not the shape of a torch.json row
            rel = torch_data.torch_row("look-up cache torch.json", row)
        except (InvalidVersion, CompatDataError, AttributeError, TypeError):
            continue
        out.append(dataclasses.replace(rel, from_cache=where))
    return tuple(sorted(out, key=lambda r: Version(r.version)))


class NotOnIndex(LookupError):
    """The index answered, and it has no such release: the version does not exist (not "unknown")."""

    def __init__(self, version: str, url: str, releases: tuple[str, ...]):
        self.version, self.url, self.releases = version, url, releases
        super().__init__(f"torch {version} is not on the package index {url} (newest there: "
                         f"{', '.join(releases[-3:])})")


def torch_row_from_index(version: str, settings: index.IndexSettings, *, today: str | None = None) -> dict[str, Any]:
    """Read torch ``version`` from the index: a torch.json row (source = index URL + wheel)."""
    client = index.client_for(settings)
    project = client.project("torch")
    hits = [v for v in project.versions if Version(v) == Version(version)]
    if not hits:
        raise NotOnIndex(version, index.redact(settings.url), project.releases())
    return refresh.torch_row(client, project, hits[0], today=today or _dt.date.today().isoformat())


def _known(version: str, extra: tuple[TorchRelease, ...]) -> bool:
    try:
        torch_data.torch_release(version, extra=extra)
    except LookupError:
        return False
    return True


def ensure_torch(version: str, settings: index.IndexSettings, *,
                 cache: Path | None) -> tuple[str, tuple[TorchRelease, ...]]:
    """Read torch ``version``, which neither the shipped data nor the cache knows, from the index
    and keep it in the cache (without one, for this run only). Returns a note for the user and the
    releases beyond the shipped data now known. Raises LookupError / PackageIndexError."""
    row = torch_row_from_index(version, settings)
    row["index"] = index.redact(settings.url)
    if cache is not None:
        kept = f"cached it in {store(cache, row['version'], row)}"
        known = cached_torch_releases(cache)
    else:
        kept, known = "kept it for this run (no cache folder)", _checked({row["version"]: row}, "no cache folder")
    if not _known(version, known):   # e.g. a CUDA the shipped toolkits do not know yet
        variant = row.get("pypi_variant")
        raise LookupError(f"torch {version} on {index.redact(settings.url)} is a {variant} build, a CUDA "
                          "imgbuild's shipped data does not know yet")
    return f"looked torch {version} up on {index.redact(settings.url)} (its Linux wheel's METADATA) and {kept}", known


def looked_up(recipe: Recipe, lookup: Lookup, *, warn: Callable[[str], None] | None = None,
              note: Callable[[str], None] | None = None) -> LookedUp:
    """The facts beyond the shipped data a recipe's resolution may need: a torch pin the data lacks
    is read from the package index (and cached) unless ``offline``; the cache's releases are passed
    on; what the look-up did goes with them, so a refusal says why. A multi-platform recipe's pins
    that platforms.json has no row for are read from the index too (their files: which machines)."""
    facts = _torch_looked_up(recipe, lookup, warn=warn, note=note)
    facts = _wheels_looked_up(recipe, facts, lookup, warn=warn)
    if not recipe.multi_platform:
        return facts
    untabled = untabled_pins(recipe)
    # a pin whose release the content model records (triton, xformers) is judged from it, offline too
    recorded = tuple(f for n, v in _exact_pins(recipe) if n in untabled and wheel_contents.model().knows(n, v)
                     and (f := wheel_contents.model().pin_files(n)) is not None)
    rest = tuple(n for n in untabled if n not in {f.name for f in recorded})
    if lookup.offline:
        if rest and warn:
            warn(f"--offline: {', '.join(rest)} not checked for {', '.join(recipe.platforms)} (imgbuild's "
                 "platform data has no row for them and the package index was not read)")
        return dataclasses.replace(facts, pin_files=recorded)
    return dataclasses.replace(facts, pin_files=recorded + read_pin_files(rest, lookup.index_settings(), warn=warn))


def _exact_pins(recipe: Recipe) -> tuple[tuple[str, str], ...]:
    return tuple((canonicalize_name(pin_name(spec)), spec.split("==", 1)[1].strip())
                 for spec in recipe.pip if "==" in spec)


def _wheels_looked_up(recipe: Recipe, facts: LookedUp, lookup: Lookup, *,
                      warn: Callable[[str], None] | None) -> LookedUp:
    """Read what each pinned CUDA wheel the content model lacks brings (its METADATA and zip directory,
    by HTTP range), as a torch pin the data lacks is read; --offline leaves the image's CUDA libraries
    known only in part, and says so."""
    unread = wheel_contents.unrecorded_cuda_pins(spec.replace(" ", "") for spec in recipe.pip)
    if not unread:
        return facts
    if lookup.offline:
        if warn:
            warn(f"--offline: {', '.join(unread)} not read: the CUDA libraries they bring are known only in part")
        return facts
    client = index.client_for(lookup.index_settings())
    today = _dt.date.today().isoformat()
    rows = []
    for pin in unread:
        name, _, version = pin.partition("==")
        try:
            row = wheel_contents.read_wheel(client, client.project(name), version, "x86_64", today)
        except PackageIndexError as exc:
            if warn:
                warn(f"{pin} could not be read, so the CUDA libraries it brings are known only in part: {exc}")
            continue
        if row is not None:
            rows.append(row)
    return dataclasses.replace(facts, wheels=tuple(rows))


def untabled_pins(recipe: Recipe) -> tuple[str, ...]:
    """The exact pip pins whose platforms platforms.json does not record (flash-attn has its own rule)."""
    names = [canonicalize_name(pin_name(spec)) for spec in recipe.pip if "==" in spec]
    return tuple(n for n in names if platforms.untabled(n))


def read_pin_files(names: tuple[str, ...], settings: index.IndexSettings, *,
                   warn: Callable[[str], None] | None = None) -> tuple[platforms.PinFiles, ...]:
    """Each project's file list from the index (one request each, PEP 691 JSON), as the machines of
    each release's Linux wheels and whether it has an sdist. A project the index cannot list is left
    out, with a warning: it is not judged per platform."""
    client = index.client_for(settings)
    out = []
    for name in names:
        try:
            project = client.project(name)
        except PackageIndexError as exc:
            if warn:
                warn(f"{name} not checked for every platform: {exc}")
            continue
        out.append(platforms.PinFiles(name, _releases(project), index.redact(settings.url)))
    return tuple(out)


def _releases(project: index.Project) -> tuple[tuple[str, frozenset[str], bool], ...]:
    out = []
    for version in project.versions:
        files = project.files_of(version)
        machines = frozenset(m for f in files for tag in f.tags if (m := _linux_machine(tag)))
        out.append((version, machines, any(not f.is_wheel for f in files)))
    return tuple(out)


def _linux_machine(tag: str) -> str | None:
    """cp311-cp311-manylinux_2_28_x86_64 -> x86_64; py3-none-any -> any; macOS, Windows, musl -> None."""
    plat = tag.rsplit("-", 1)[-1]
    if plat == "any":
        return "any"
    if plat.startswith(("manylinux", "linux_")):
        return next((m for m in ("x86_64", "aarch64") if plat.endswith(m)), None)
    return None


def _torch_looked_up(recipe: Recipe, lookup: Lookup, *, warn: Callable[[str], None] | None,
                     note: Callable[[str], None] | None) -> LookedUp:
    cached = cached_torch_releases(lookup.cache)
    if not recipe.torch or _known(recipe.torch, cached):
        return LookedUp(torch=cached)
    if lookup.offline:
        return LookedUp(torch=cached, offline=True)
    try:
        text, known = ensure_torch(recipe.torch, lookup.index_settings(), cache=lookup.cache)
    except NotOnIndex as exc:  # no such release: the resolver says so, with the nearest that exists
        if warn:
            warn(str(exc))
        return LookedUp(torch=cached_torch_releases(lookup.cache), index_releases=exc.releases, index_url=exc.url)
    except (PackageIndexError, LookupError) as exc:
        reason = str(exc).strip(chr(39))
        if warn:
            warn(f"torch {recipe.torch} is not in imgbuild's compatibility data and could not be looked up: {reason}")
        return LookedUp(torch=cached_torch_releases(lookup.cache), failure=reason)
    if note:
        note(text)
    return LookedUp(torch=known)
