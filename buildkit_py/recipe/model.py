"""Load and validate a recipe file into a frozen ``Recipe``.

The recipe's schema (``buildkit_py/schemas/recipe.schema.json``, the one editors use) checks
keys, types and value shapes; the small functions below check what a schema cannot (pins,
paths inside the recipe's folder, one key that needs another). Every problem is reported with
the file, line and key path where it sits, and all of them are collected before raising, so a
user fixes a recipe in one pass.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import InvalidRequirement, Requirement

from buildkit_py import label_keys
from buildkit_py.errors import RecipeError, RecipeIssue, UsageError
from buildkit_py.reference import parse_reference
from buildkit_py.schemas import (
    line_of,
    load_schema,
    prune,
    read_as_written,
    resolve_ref,
    schema_path,
    type_name,
    validate,
)
from buildkit_py.text_enum import TextEnum

RECIPE_SCHEMA_VERSION = 1


def _exact(pattern: str, flags: int = 0) -> re.Pattern[str]:
    """A whole-string, ASCII-only pattern. Python's '$' also matches before a trailing newline
    (so "git\\n" passed r"^[a-z]+$" and broke the rendered Dockerfile), and \\w or \\d match
    any Unicode letter or digit: recipe values that reach a Dockerfile must be plain ASCII."""
    return re.compile(pattern.removesuffix("$") + r"\Z", flags | re.ASCII)


SCHEMA_PATH = schema_path("recipe")
_SCHEMA = load_schema("recipe")


def recipe_schema() -> dict[str, Any]:
    """The recipe's JSON Schema (published by `imgbuild schema` for editors): the recipe's keys,
    types and value shapes. ``parse_recipe`` validates against it; a fresh copy."""
    schema: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return schema


def _node(*keys: str) -> dict[str, Any]:
    node = _SCHEMA
    for key in keys:
        node = resolve_ref(node["properties"][key], _SCHEMA)
    return node


TAG_RE = _exact(_node("version")["pattern"])  # matrix tag templates render to tags
# Compose's short volume syntax, [SOURCE:]TARGET[:OPTIONS] (compose-go format.ParseVolume): a
# SOURCE starting with '.', '/' or '~' is a host path, anything else a named volume, which the
# file must also declare under the top-level `volumes:`.
VOLUME_NAME_RE = _exact(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
VOLUME_OPTIONS = frozenset({"ro", "rw", "nocopy", "z", "Z", "shared", "rshared", "slave", "rslave", "private",
                            "rprivate"})
# No '$' (Dockerfile variable expansion), quotes, backslashes or control characters.
SAFE_PATH_RE = _exact(r"^[A-Za-z0-9._/@+=,: -]+$")
SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
# budget.cold_start: a duration (90s, 1.5min, 2m, 1h; a bare number is seconds) and a rate, either in
# bits (1Gbit, 100Mbps, 1Gbit/s: how links are sold) or in bytes (125MB/s, 10MiB/s: how tools report)
DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|m|min|h)?\s*$", re.IGNORECASE)
BANDWIDTH_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt]?)(?:bit/s|bit|bps)|([kmgt]?i?b)/s)\s*$", re.IGNORECASE)

PLATFORMS = tuple(_node("platforms")["items"]["enum"])  # linux/amd64, linux/arm64
DEFAULT_PLATFORMS = ("linux/amd64",)


class CudaFlavor(TextEnum):
    """``cuda.flavor``: NVIDIA's image tiers, each holding the one before it."""

    BASE = "base"  # cudart
    RUNTIME = "runtime"  # the runtime libraries and NCCL
    DEVEL = "devel"  # and nvcc, headers, static libraries

    @property
    def rank(self) -> int:
        """Its place in the order above: a higher tier holds every lower one."""
        return list(CudaFlavor).index(self)


class CudaSource(TextEnum):
    """``cuda.source``: where the CUDA libraries come from."""

    NVIDIA = "nvidia"  # an nvidia/cuda base image
    WHEELS = "wheels"  # NVIDIA's pip wheels on base.image


class InstallerName(TextEnum):
    """``build.installer``: what installs the pip steps (plan/installer.py)."""

    UV = "uv"
    PIP = "pip"


@dataclass(frozen=True)
class CudaSpec:
    version: str
    flavor: CudaFlavor = CudaFlavor.RUNTIME
    cudnn: str | None = None
    source: CudaSource = CudaSource.NVIDIA


@dataclass(frozen=True)
class BaseSpec:
    image: str | None = None
    os: str = "ubuntu22.04"
    mirror: str | None = None
    verify: Path | None = None  # the public key the base's cosign signature must verify under


@dataclass(frozen=True)
class CopySpec:
    src: str  # relative to the recipe's folder, checked to stay inside it
    dest: str


@dataclass(frozen=True)
class BuildSpec:
    from_source: tuple[str, ...] = ()
    cuda_arch: tuple[str, ...] = ()
    jobs: int | None = None
    installer: InstallerName | None = None  # None: imgbuild's default (plan/installer.py)


@dataclass(frozen=True)
class WeightsSpec:
    ref: str
    mount: str


@dataclass(frozen=True)
class TestSpec:
    """One entry of ``test:``: a shell command (``run``) or a file of the recipe's folder
    (``script``, relative, checked to stay inside it), run in the built image before a push.
    ``gpu``: run with the engine's GPU flags; skipped where the engine has no GPU runtime.
    ``timeout``: seconds it may run (a hung smoke test must not hold a CI job to its own limit)."""

    __test__ = False  # not a pytest class, whatever its name

    name: str
    run: str | None = None
    script: str | None = None
    gpu: bool = False
    key: str = "test"  # where the recipe writes it ("test[2]"), for errors and reports
    timeout: int = 600  # seconds it may run; then it fails and its container is removed


@dataclass(frozen=True)
class ServiceSpec:
    """A companion container that `imgbuild compose` puts beside the image."""

    name: str
    image: str
    ports: tuple[str, ...] = ()
    environment: tuple[tuple[str, str], ...] = ()
    volumes: tuple[str, ...] = ()
    command: tuple[str, ...] = ()


@dataclass(frozen=True)
class ColdStartBudget:
    """``budget.cold_start``: the longest a fresh node may take to start the image (pull, unpack,
    the entrypoint's own start) over a link of ``bandwidth``; ``unpack_rate`` (bytes/s) replaces the
    rate measured on imgbuild's build machine (engine/cold_start.py) where the node's disks differ;
    ``node``: images the node already holds (registry references), whose layers it neither pulls nor,
    under the same layers, unpacks again."""

    max_seconds: float
    bandwidth: float  # bytes/s
    unpack_rate: float | None = None  # bytes/s
    node: tuple[str, ...] = ()  # image references already on the node


@dataclass(frozen=True)
class Recipe:
    path: Path
    name: str
    cuda: CudaSpec
    python: str
    version: str | None = None
    base: BaseSpec = field(default_factory=BaseSpec)
    torch: str | None = None
    pip: tuple[str, ...] = ()
    apt: tuple[str, ...] = ()
    copy: tuple[CopySpec, ...] = ()
    workdir: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    volumes: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    build: BuildSpec = field(default_factory=BuildSpec)
    runtime_compile: bool = False
    max_size: int | None = None  # bytes, from budget.max_size
    cold_start: ColdStartBudget | None = None  # budget.cold_start
    weights: tuple[WeightsSpec, ...] = ()
    services: tuple[ServiceSpec, ...] = ()
    platforms: tuple[str, ...] = DEFAULT_PLATFORMS  # os/arch, in the recipe's order
    gpus: tuple[str, ...] = ()  # the GPUs it targets, as written (H100, sm_90): plan checks each
    # Run in the image, never part of it: left out of ``normalized`` (and so of the digest and
    # the io.imgbuild.recipe.digest label), so editing a test rebuilds nothing.
    tests: tuple[TestSpec, ...] = ()
    # key path ("cuda.version", "pip[1]") -> line, for errors raised after loading
    lines: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    @property
    def context_dir(self) -> Path:
        return self.path.parent

    def line_of(self, key: str) -> int | None:
        """The line of a key path (``pip[1]``, ``cuda.cudnn``), else of its closest parent in the file."""
        return line_of(self.lines, key)

    def normalized(self) -> dict[str, Any]:
        """The recipe as plain sorted data: the input of ``digest``."""

        def spec(obj: object) -> dict[str, Any]:
            return dict(vars(obj))

        return {
            "schema": RECIPE_SCHEMA_VERSION,
            "name": self.name,
            "version": self.version,
            "cuda": spec(self.cuda),
            # base.verify is a check before building, not an input of the image (and its path is
            # this machine's): out of the digest, so a recipe gains it without a new digest
            "base": {k: v for k, v in spec(self.base).items() if k != "verify"},
            "python": self.python,
            "torch": self.torch,
            "pip": list(self.pip),
            "apt": list(self.apt),
            "copy": [spec(c) for c in self.copy],
            "workdir": self.workdir,
            "env": dict(self.env),
            "volumes": list(self.volumes),
            "entrypoint": list(self.entrypoint),
            "cmd": list(self.cmd),
            "labels": dict(self.labels),
            # an unset installer is left out, so recipes that do not name one keep their digest
            "build": {k: list(v) if isinstance(v, tuple) else v for k, v in spec(self.build).items()
                      if not (k == "installer" and v is None)},
            "runtime_compile": self.runtime_compile,
            "max_size": self.max_size,
            # left out when unset, so recipes without it keep their digest
            # and without node images, so budgets written before the key keep theirs
            **({"cold_start": {k: list(v) if k == "node" else v for k, v in spec(self.cold_start).items()
                               if not (k == "node" and not v)}} if self.cold_start else {}),
            "weights": [spec(w) for w in self.weights],
            "services": [{**spec(x), "ports": list(x.ports), "environment": dict(x.environment),
                          "volumes": list(x.volumes), "command": list(x.command)} for x in self.services],
            # the default is left out, so recipes that do not name platforms keep their digest
            **({"platforms": list(self.platforms)} if self.platforms != DEFAULT_PLATFORMS else {}),
            # left out when unset, so recipes without it keep their digest; set, the label records it
            **({"gpus": list(self.gpus)} if self.gpus else {}),
        }

    @property
    def multi_platform(self) -> bool:
        """Built for anything but linux/amd64 alone: the build names its platforms."""
        return self.platforms != DEFAULT_PLATFORMS

    @property
    def digest(self) -> str:
        blob = json.dumps(self.normalized(), sort_keys=True, separators=(",", ":")).encode()
        return "sha256:" + hashlib.sha256(blob).hexdigest()


# --- YAML with positions -------------------------------------------------------------


_MAX_NODES = 100_000  # values in one recipe document, aliases expanded
_MAX_DEPTH = 64


class _Located:
    """Parsed YAML values plus the line of every key path."""

    def __init__(self, text: str, file: str):
        self.file = file
        self.lines: dict[str, int] = {}
        self.raw_scalars: dict[str, str] = {}  # the source text of each plain scalar
        self.issues: list[RecipeIssue] = []
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                self.data = None
                return
            self._budget = _MAX_NODES
            self._walk(node, "")
            self.data = loader.construct_document(node)
        finally:
            loader.dispose()

    def _walk(self, node: yaml.Node, path: str, depth: int = 0) -> None:
        # YAML aliases share nodes: "billion laughs" expand to millions of paths and a
        # self-referencing alias never ends. Recipes are small; refuse such documents.
        self._budget -= 1
        if self._budget < 0 or depth > _MAX_DEPTH:
            raise RecipeError([RecipeIssue(self.file, node.start_mark.line + 1, path,
                                           f"the document is too large or too deep (over {_MAX_NODES} values "
                                           f"or {_MAX_DEPTH} levels, e.g. through YAML aliases)")])
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key_node, value_node in node.value:
                key = str(key_node.value)
                sub = f"{path}.{key}" if path else key
                if key in seen:
                    self.issues.append(RecipeIssue(self.file, key_node.start_mark.line + 1, sub, "duplicate key"))
                seen.add(key)
                self.lines[sub] = key_node.start_mark.line + 1
                self._walk(value_node, sub, depth + 1)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._walk(item, f"{path}[{i}]", depth + 1)
        elif isinstance(node, yaml.ScalarNode) and node.style is None:
            self.raw_scalars[path] = node.value


class _Issues:
    """Issues of one recipe file: each key path gets its line from the YAML loader's table."""

    def __init__(self, located: _Located):
        self.loc = located
        self.issues = located.issues

    def fail(self, key: str, message: str) -> None:
        line = line_of(self.loc.lines, key) or self.loc.lines.get("") or 1  # every issue has a line
        self.issues.append(RecipeIssue(self.loc.file, line, key, message))


def _key_types(node: dict[str, Any]) -> dict[str, type]:
    # Versions may be written unquoted (["string", "number"]); the parser reads them as text.
    types = {"string": str, "object": dict, "array": list, "boolean": bool, "integer": int}
    out = {}
    for key, spec in node["properties"].items():
        kind = resolve_ref(spec, _SCHEMA)["type"]
        out[key] = types[kind if isinstance(kind, str) else kind[0]]
    return out


TOP_KEYS = _key_types(_SCHEMA)
CUDA_KEYS = _key_types(_node("cuda"))
BASE_KEYS = _key_types(_node("base"))
BUILD_KEYS = _key_types(_node("build"))
BUDGET_KEYS = _key_types(_node("budget"))


def parse_size(text: str) -> int | None:
    """'6GB' -> 6_000_000_000, '512MiB' -> 536_870_912; None when malformed."""
    m = SIZE_RE.match(str(text))
    if not m:
        return None
    number, unit = float(m.group(1)), (m.group(2) or "B").upper()
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}[unit]
    return int(number * scale)


_DURATION_SCALE = {"ms": 1e-3, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_PREFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_duration(text: str | float) -> float | None:
    """'90s' -> 90.0, '1.5min' -> 90.0, '500ms' -> 0.5, 90 -> 90.0 (seconds); None when malformed."""
    m = DURATION_RE.match(str(text))
    if not m:
        return None
    return float(m.group(1)) * _DURATION_SCALE[(m.group(2) or "s").lower()]


def parse_bandwidth(text: str) -> float | None:
    """A rate in bytes/s: '1Gbit' -> 125_000_000.0 (links are sold in bits), '125MB/s' -> 125e6,
    '10MiB/s' -> 10_485_760.0; None when malformed. Bytes are written with a B and '/s'."""
    m = BANDWIDTH_RE.match(str(text))
    if not m:
        return None
    bit_prefix, byte_unit = m.group(2), m.group(3)
    if byte_unit is None:
        return float(m.group(1)) * _PREFIX[bit_prefix.lower()] / 8
    size = parse_size(f"{m.group(1)}{byte_unit}")  # B, KB, MiB...: the size units, per second
    return None if size is None else float(size)


def pin_name(spec: str) -> str:
    """The project name of a normalized pin: 'flash-attn[x]==2.6.3' -> 'flash-attn'."""
    return spec.split("==", 1)[0].split("[", 1)[0]


# --- what the schema cannot say: rules across keys, paths on disk, pins --------------------


def _normal_pin(spec: str, key: str, report: _Issues) -> str | None:
    try:
        req = Requirement(spec)
    except InvalidRequirement as exc:
        report.fail(key, f"{spec!r} is not a valid requirement ({exc})")
        return None
    if req.url:
        report.fail(key, f"{spec!r}: direct URLs are not supported; pin a version with ==")
        return None
    pins = [s for s in req.specifier if s.operator in ("==", "===")]
    if len(list(req.specifier)) != 1 or not pins or "*" in pins[0].version:
        report.fail(key, f"{spec!r} is not pinned; write it as {req.name}==<version>")
        return None
    if req.marker:
        report.fail(key, f"{spec!r}: environment markers are not supported in recipes")
        return None
    # Normalized form: stable across spellings, safe to place in a shell word.
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return f"{req.name.lower()}{extras}=={pins[0].version}"


def _pins(items: list[Any], report: _Issues) -> tuple[str, ...]:
    """pip: each entry a valid, exactly pinned requirement, each project once, torch not here."""
    pins = [(i, _normal_pin(s, f"pip[{i}]", report)) for i, s in enumerate(items) if s is not None]
    pip = tuple(p for _, p in pins if p is not None)
    names = [pin_name(p) for p in pip]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        report.fail("pip", f"{dup} is listed more than once")
    for i, p in pins:
        if p is not None and pin_name(p) == "torch":
            report.fail(f"pip[{i}]", "pin torch with the top-level 'torch:' key, so imgbuild picks its CUDA "
                                     "wheel index")
    return pip


def _image_path(path: str) -> str:
    return os.path.normpath(path)  # the schema checked it: absolute, characters safe in a Dockerfile


def _copy(item: dict[str, Any], key: str, root: Path, report: _Issues) -> CopySpec | None:
    src = item["src"]
    resolved = (root / src).resolve()
    if os.path.isabs(src) or (resolved != root and root not in resolved.parents):
        report.fail(f"{key}.src", f"{src!r} is outside the recipe's folder {root}")
        return None
    if not resolved.exists():
        report.fail(f"{key}.src", f"{src!r} does not exist (looked for {resolved})")
        return None
    rel = os.path.relpath(resolved, root)
    if not SAFE_PATH_RE.match(rel):
        # COPY expands $VARS and wildcards (* ? [) in its sources even in the JSON form.
        report.fail(f"{key}.src", f"{src!r} has characters imgbuild does not place in a COPY source "
                                  "(allowed: letters, digits, space and ._/@+=,:-)")
        return None
    if resolved.is_dir():
        rel = rel.rstrip("/") + "/"
    return CopySpec(src=rel, dest=_image_path(item["dest"]))


def _copies(items: list[Any], recipe_path: Path, report: _Issues) -> tuple[CopySpec, ...]:
    root = recipe_path.parent.resolve()
    out = [_copy(item, f"copy[{i}]", root, report) for i, item in enumerate(items) if _has(item, "src", "dest")]
    return tuple(c for c in out if c is not None)


def _verify_key(value: str | None, recipe_path: Path, report: _Issues) -> Path | None:
    """base.verify's key file, relative to the recipe's folder; it must be there (a typo would
    otherwise pass a plan and fail only when building)."""
    if value is None:
        return None
    path = (recipe_path.parent / value).resolve()
    if not path.is_file():
        report.fail("base.verify", f"{value!r}: no such key file (looked for {path})")
        return None
    return path


def _has(item: Any, *keys: str) -> bool:
    """A list entry the schema let through whole (a refused one is None, a missing key absent)."""
    return isinstance(item, dict) and all(k in item for k in keys)


def _weights(items: list[Any], report: _Issues) -> tuple[WeightsSpec, ...]:
    weights = []
    mounts: dict[str, int] = {}  # mount path -> index of the first entry using it
    for i, item in enumerate(items):
        if not _has(item, "ref", "mount"):
            continue
        mount = _image_path(item["mount"])
        first = mounts.setdefault(mount, i)
        if first != i:
            # docker run refuses two volumes on one path ("Duplicate mount point"), after
            # every weight was downloaded: refuse it here.
            report.fail(f"weights[{i}].mount", f"{mount!r} is already the mount of weights[{first}]; "
                                               "each weights entry needs its own mount path")
            continue
        weights.append(WeightsSpec(item["ref"], mount))
    return tuple(weights)


def _services(services: dict[str, Any], report: _Issues) -> tuple[ServiceSpec, ...]:
    out = []
    for name, item in sorted(services.items()):
        if not _has(item, "image"):
            continue
        volumes = item.get("volumes", [])
        for i, spec in enumerate(volumes):
            if spec is None:
                continue
            try:
                split_service_volume(spec)
            except ValueError as exc:
                report.fail(f"services.{name}.volumes[{i}]", f"{spec!r}: {exc}")
        out.append(ServiceSpec(name, item["image"], _texts(item.get("ports", [])),
                               tuple(sorted(item.get("environment", {}).items())), _texts(volumes),
                               _texts(item.get("command", []))))
    return tuple(out)


def _tests(items: list[Any], recipe_path: Path, report: _Issues) -> tuple[TestSpec, ...]:
    """test: each a command, or a mapping with exactly one of run and script (the script a file
    inside the recipe's folder); names unique, as reports and --json key them by name."""
    root = recipe_path.parent.resolve()
    out: list[TestSpec] = []
    for i, item in enumerate(items):
        key = f"test[{i}]"
        if item is None:
            continue
        if isinstance(item, str):
            out.append(TestSpec(name=item, run=item, key=key))
            continue
        given = [k for k in ("run", "script") if k in item]
        if len(given) != 1:
            report.fail(key, "give one of run (a shell command) or script (a file in the recipe's folder)"
                        if not given else "give run or script, not both")
            continue
        script = item.get("script")
        if script is not None:
            resolved = (root / script).resolve()
            if resolved != root and root not in resolved.parents:
                report.fail(f"{key}.script", f"{script!r} is outside the recipe's folder {root}")
                continue
            if not resolved.is_file():
                report.fail(f"{key}.script", f"{script!r} is not a file (looked for {resolved})")
                continue
            script = os.path.relpath(resolved, root)
        name = str(item.get("name") or item.get("run") or script)
        out.append(TestSpec(name=name, run=item.get("run"), script=script, gpu=bool(item.get("gpu", False)),
                            key=key, timeout=int(item.get("timeout", TestSpec.timeout))))
    seen: dict[str, str] = {}
    for t in out:
        first = seen.setdefault(t.name, t.key)
        if first != t.key:
            report.fail(f"{t.key}.name" if t.run is None or t.name != t.run else t.key,
                        f"{t.name!r} is already the name of {first}; give each test its own name")
    return tuple(out)


def _cold_start(item: dict[str, Any] | None, report: _Issues) -> ColdStartBudget | None:
    """budget.cold_start: each value read by its one parser; a malformed one is reported at its key."""
    if not _has(item, "max", "bandwidth"):
        return None
    assert item is not None  # noqa: S101 - _has checked it
    key = "budget.cold_start"
    seconds = parse_duration(item["max"])
    if seconds is None or seconds <= 0:
        report.fail(f"{key}.max", f"{item['max']!r} is not a duration like 90s, 1.5min or 2m")
    rates = {}
    for name in ("bandwidth", "unpack_rate"):
        if name in item:
            rates[name] = parse_bandwidth(item[name])
            if not rates[name]:
                report.fail(f"{key}.{name}", f"{item[name]!r} is not a rate like 1Gbit, 100Mbit/s or 200MB/s")
    node = tuple(item.get("node") or ())
    for i, ref in enumerate(node):
        try:
            parse_reference(ref)
        except UsageError as exc:
            report.fail(f"{key}.node[{i}]", f"{exc.message}; name an image the node holds, as host/repo:tag")
    bandwidth = rates["bandwidth"]
    if seconds is None or seconds <= 0 or bandwidth is None or not all(rates.values()):
        return None
    return ColdStartBudget(seconds, bandwidth, rates.get("unpack_rate"), node)


def _texts(items: list[Any]) -> tuple[str, ...]:
    return tuple(s for s in items if s is not None)


def _build(build: dict[str, Any], pip: tuple[str, ...], report: _Issues) -> BuildSpec:
    pinned = {pin_name(p) for p in pip}
    from_source = build.get("from_source", [])
    for i, pkg in enumerate(from_source):
        if pkg is not None and pkg.lower() not in pinned:
            report.fail(f"build.from_source[{i}]", f"{pkg!r} must also be pinned in pip:")
    installer = build.get("installer")
    return BuildSpec(tuple(p.lower() for p in _texts(from_source)), _texts(build.get("cuda_arch", [])),
                     build.get("jobs"), None if installer is None else InstallerName(installer))


def _cross_checks(data: dict[str, Any], report: _Issues) -> None:
    if data.get("cuda", {}).get("source") == CudaSource.WHEELS and "image" not in data.get("base", {}):
        report.fail("base", "cuda.source: wheels needs base.image (the OS image the CUDA wheels go on)")
    for key in data.get("labels", {}):
        if key.lower().startswith(label_keys.PREFIX):
            report.fail(f"labels.{key}", f"{label_keys.PREFIX}* labels are set by imgbuild itself")


def split_service_volume(spec: str) -> tuple[str | None, str, tuple[str, ...]]:
    """'data:/var/lib/x:ro' -> ('data', '/var/lib/x', ('ro',)); '/cache' -> (None, '/cache', ()).
    ValueError (with the reason) for what Compose would refuse or read differently."""
    if "$" in spec:
        raise ValueError("Compose would substitute the '$' from the shell environment")
    parts = spec.split(":")
    if len(parts) > 3 or any(not p for p in parts):
        raise ValueError("is not [SOURCE:]TARGET[:OPTIONS], e.g. qdrant-data:/qdrant/storage")
    source, target = (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    if not target.startswith("/"):
        raise ValueError(f"the target {target!r} must be an absolute path in the container")
    options = tuple(parts[2].split(",")) if len(parts) == 3 else ()
    unknown = [o for o in options if o not in VOLUME_OPTIONS]
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r} (allowed: {', '.join(sorted(VOLUME_OPTIONS))})")
    if source is not None and source[0] not in "./~" and not VOLUME_NAME_RE.match(source):
        raise ValueError(f"{source!r} is neither a host path (./, /, ~) nor a volume name (letters, digits, ._-)")
    return source, target, options


def named_volume(spec: str) -> str | None:
    """The named volume a valid service volume uses, None for a host path or an anonymous one."""
    source = split_service_volume(spec)[0]
    return source if source is not None and source[0] not in "./~" else None


def with_platforms(recipe: Recipe, platforms: tuple[str, ...] | list[str]) -> Recipe:
    """The recipe with these platforms (build --platform) instead of its own ``platforms:``, so the
    compatibility check covers exactly the platforms the build makes; none given: the recipe as it is."""
    if not platforms:
        return recipe
    for p in platforms:
        if p not in PLATFORMS:
            raise UsageError(f"--platform {p}: imgbuild builds {', '.join(PLATFORMS)}",
                             hint="name one of them, once per --platform")
    return dataclasses.replace(recipe, platforms=tuple(dict.fromkeys(platforms)))


def load_recipe(path: str | os.PathLike[str]) -> Recipe:
    """Load a recipe without its matrix (see ``matrix`` for the variants)."""
    path = Path(path)
    return parse_recipe(read_recipe_text(path), path)


def read_recipe_text(path: str | os.PathLike[str]) -> str:
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError([RecipeIssue(str(path), None, "", "no such recipe file")]) from None
    except UnicodeDecodeError as exc:
        line = exc.object[:exc.start].count(b"\n") + 1
        raise RecipeError([RecipeIssue(str(path), line, "", f"cannot read recipe: not UTF-8 text "
                                                            f"(byte {exc.object[exc.start]:#04x})")]) from None
    except OSError as exc:
        raise RecipeError([RecipeIssue(str(path), None, "", f"cannot read recipe: {exc}")]) from None


def locate(text: str, file: str) -> _Located:
    """Parse YAML keeping the line of every key path; YAML errors become RecipeErrors."""
    try:
        return _Located(text, file)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise RecipeError([RecipeIssue(file, line, "", f"invalid YAML: {exc.problem or exc}")]) from None
    except yaml.reader.ReaderError as exc:  # a character YAML forbids: no mark, a position
        line = text[:exc.position].count("\n") + 1
        raise RecipeError([RecipeIssue(file, line, "", f"invalid YAML: character {exc.character!r} "
                                                       f"is not allowed ({exc.reason})")]) from None
    except yaml.YAMLError as exc:
        raise RecipeError([RecipeIssue(file, 1, "", f"invalid YAML: {exc}")]) from None


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for key in keys[:-1]:
        if not isinstance(data.get(key), dict):
            data[key] = {}
        data = data[key]
    data[keys[-1]] = value


def _apply_overrides(located: _Located, overrides: dict[str, Any], override_lines: dict[str, int]) -> None:
    located.data = copy.deepcopy(located.data)
    for key, value in overrides.items():
        if isinstance(located.data, dict):
            _set_path(located.data, key, value)
        line = override_lines.get(key)
        if line is not None:
            for known in [k for k in located.lines if k == key or k.startswith((key + ".", key + "["))]:
                del located.lines[known]
            located.lines[key] = line
        located.raw_scalars.pop(key, None)  # callers pass versions as the text written


def parse_recipe(text: str, path: Path, *, overrides: dict[str, Any] | None = None,
                 override_lines: dict[str, int] | None = None) -> Recipe:
    """Validate a recipe against its schema, then the rules a schema cannot state. ``overrides``
    (dotted key -> value, e.g. from a matrix variant) are applied first; errors in them point at
    ``override_lines`` (the matrix entry's line). Every issue of the file is raised at once."""
    file = str(path)
    located = locate(text, file)
    if overrides:
        _apply_overrides(located, overrides, override_lines or {})
    if not isinstance(located.data, dict):
        # line 1 for an empty file too, so every issue has a line
        located.issues.append(RecipeIssue(file, located.lines.get("", 1), "",
                                          f"a recipe must be a mapping of keys, got {type_name(located.data)}"))
        raise RecipeError(located.issues)
    report = _Issues(located)
    data = read_as_written(located.data, _SCHEMA, located.raw_scalars)
    refused = validate(data, _SCHEMA)
    for issue in refused:
        report.fail(issue.key, issue.message)
    prune(data, refused)
    recipe = _recipe(data, path, report, dict(located.lines))
    if report.issues or recipe is None:
        raise RecipeError(sorted(report.issues, key=lambda i: (i.line or 0, i.key)))
    return recipe


def _recipe(data: dict[str, Any], path: Path, report: _Issues, lines: dict[str, int]) -> Recipe | None:
    """The frozen Recipe of schema-checked ``data`` (refused values taken out), after the rules
    across keys; None where a required value is missing (its issue is already recorded)."""
    cuda, base = data.get("cuda", {}), data.get("base", {})
    pip = _pins(data.get("pip", []), report)
    _cross_checks(data, report)
    copies = _copies(data.get("copy", []), path, report)
    build = _build(data.get("build", {}), pip, report)
    weights = _weights(data.get("weights", []), report)
    services = _services(data.get("services", {}), report)
    tests = _tests(data.get("test", []), path, report)
    if not ({"name", "python"} <= data.keys() and "version" in cuda):
        return None
    workdir = data.get("workdir")
    budget = data.get("budget", {}).get("max_size")
    cold_start = _cold_start(data.get("budget", {}).get("cold_start"), report)
    return Recipe(
        path=path,
        name=data["name"],
        version=data.get("version"),
        cuda=CudaSpec(cuda["version"], CudaFlavor(cuda.get("flavor", CudaFlavor.RUNTIME)), cuda.get("cudnn"),
                      CudaSource(cuda.get("source", CudaSource.NVIDIA))),
        base=BaseSpec(base.get("image"), base.get("os", "ubuntu22.04"), base.get("mirror"),
                      _verify_key(base.get("verify"), path, report)),
        python=data["python"],
        torch=data.get("torch"),
        pip=pip,
        apt=tuple(sorted(set(_texts(data.get("apt", []))))),
        copy=copies,
        workdir=None if workdir is None else _image_path(workdir),
        env=tuple(sorted(data.get("env", {}).items())),
        volumes=tuple(sorted({_image_path(v) for v in _texts(data.get("volumes", []))})),
        entrypoint=_texts(data.get("entrypoint", [])),
        cmd=_texts(data.get("cmd", [])),
        labels=tuple(sorted(data.get("labels", {}).items())),
        build=build,
        runtime_compile=data.get("runtime_compile", False),
        max_size=None if budget is None else parse_size(budget),
        cold_start=cold_start,
        weights=weights,
        services=services,
        platforms=tuple(data.get("platforms", DEFAULT_PLATFORMS)),
        gpus=_texts(data.get("gpus", [])),
        tests=tests,
        lines=lines,
    )
