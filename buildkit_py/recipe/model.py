"""Load and validate a recipe file into a frozen ``Recipe``.

Every problem is reported with the file, line and key path where it sits, and all of them
are collected before raising, so a user fixes a recipe in one pass.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import InvalidRequirement, Requirement

from buildkit_py.errors import RecipeError, RecipeIssue

RECIPE_SCHEMA_VERSION = 1


def _exact(pattern: str, flags: int = 0) -> re.Pattern:
    """A whole-string, ASCII-only pattern. Python's '$' also matches before a trailing newline
    (so "git\\n" passed r"^[a-z]+$" and broke the rendered Dockerfile), and \\w or \\d match
    any Unicode letter or digit: recipe values that reach a Dockerfile must be plain ASCII."""
    return re.compile(pattern.removesuffix("$") + r"\Z", flags | re.ASCII)


# Docker's reference grammar (distribution/reference): path components of the repository.
_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
REPOSITORY_RE = _exact(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
TAG_RE = _exact(r"^[\w][\w.-]{0,127}$")
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?)"
IMAGE_REF_RE = _exact(
    rf"^(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?$"
)
REGISTRY_PATH_RE = _exact(rf"^{_HOST}(?:/{_COMPONENT})*$")
CUDA_VERSION_RE = _exact(r"^\d+\.\d+(?:\.\d+)?$")
PYTHON_VERSION_RE = _exact(r"^3\.\d+$")
EXACT_VERSION_RE = _exact(r"^\d+(?:\.\d+)*(?:(?:a|b|rc|\.post|\.dev)\d+)?(?:\+[a-z0-9.]+)?$")
CUDNN_RE = _exact(r"^\d+(?:\.\d+)*$")
OS_RE = _exact(r"^(?:ubuntu\d+\.\d+|ubi\d+|rockylinux\d+|oraclelinux\d+|amzn\d+|debian\d+)$")
APT_RE = _exact(r"^[a-z0-9][a-z0-9+.-]+(?:=[A-Za-z0-9.+:~-]+)?$")
ENV_NAME_RE = _exact(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Docker takes any key; lowercase reverse-DNS is its advice, not a rule ("Team" is a real key).
LABEL_KEY_RE = _exact(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?$")
ARCH_RE = _exact(r"^\d+\.\d+[af]?(?:\+PTX)?$")
SERVICE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
PORT_RE = re.compile(r"^(?:\d{1,3}(?:\.\d{1,3}){3}:)?\d{1,5}(?::\d{1,5})?(?:/(?:tcp|udp))?$")
# Compose's short volume syntax, [SOURCE:]TARGET[:OPTIONS] (compose-go format.ParseVolume): a
# SOURCE starting with '.', '/' or '~' is a host path, anything else a named volume, which the
# file must also declare under the top-level `volumes:`.
VOLUME_NAME_RE = _exact(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
VOLUME_OPTIONS = frozenset({"ro", "rw", "nocopy", "z", "Z", "shared", "rshared", "slave", "rslave", "private",
                            "rprivate"})
# No '$' (Dockerfile variable expansion), quotes, backslashes or control characters.
SAFE_PATH_RE = _exact(r"^[A-Za-z0-9._/@+=,: -]+$")
SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)

FLAVORS = ("base", "runtime", "devel")
SOURCES = ("nvidia", "wheels")


@dataclass(frozen=True)
class CudaSpec:
    version: str
    flavor: str = "runtime"
    cudnn: str | None = None
    source: str = "nvidia"


@dataclass(frozen=True)
class BaseSpec:
    image: str | None = None
    os: str = "ubuntu22.04"
    mirror: str | None = None


@dataclass(frozen=True)
class CopySpec:
    src: str  # relative to the recipe's folder, checked to stay inside it
    dest: str


@dataclass(frozen=True)
class BuildSpec:
    from_source: tuple[str, ...] = ()
    cuda_arch: tuple[str, ...] = ()
    jobs: int | None = None


@dataclass(frozen=True)
class WeightsSpec:
    ref: str
    mount: str


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
    weights: tuple[WeightsSpec, ...] = ()
    services: tuple[ServiceSpec, ...] = ()
    # key path ("cuda.version", "pip[1]") -> line, for errors raised after loading
    lines: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    @property
    def context_dir(self) -> Path:
        return self.path.parent

    def line_of(self, key: str) -> int | None:
        while key:
            if key in self.lines:
                return self.lines[key]
            key = key.rpartition(".")[0]
        return None

    def normalized(self) -> dict[str, Any]:
        """The recipe as plain sorted data: the input of ``digest``."""

        def spec(obj):
            return {k: v for k, v in obj.__dict__.items()}

        return {
            "schema": RECIPE_SCHEMA_VERSION,
            "name": self.name,
            "version": self.version,
            "cuda": spec(self.cuda),
            "base": spec(self.base),
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
            "build": {k: list(v) if isinstance(v, tuple) else v for k, v in spec(self.build).items()},
            "runtime_compile": self.runtime_compile,
            "max_size": self.max_size,
            "weights": [spec(w) for w in self.weights],
            "services": [{**spec(x), "ports": list(x.ports), "environment": dict(x.environment),
                          "volumes": list(x.volumes), "command": list(x.command)} for x in self.services],
        }

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

    def _walk(self, node, path: str, depth: int = 0) -> None:
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


class _Validator:
    def __init__(self, located: _Located):
        self.loc = located
        self.issues = located.issues

    def fail(self, key: str, message: str) -> None:
        # A key that is not in the file (a missing one) is reported at its closest parent
        # that is, else at line 1: every issue has a line.
        probe = key
        while probe and probe not in self.loc.lines:
            probe = re.sub(r"(?:\.[^.\[]*|\[\d+\])$", "", probe) if re.search(r"[.\[]", probe) else ""
        line = self.loc.lines.get(probe) or self.loc.lines.get("") or 1
        self.issues.append(RecipeIssue(self.loc.file, line, key, message))

    def mapping(self, value, key: str, allowed: dict[str, Any]) -> dict:
        if not isinstance(value, dict):
            self.fail(key, f"must be a mapping, got {_type_name(value)}")
            return {}
        for k in value:
            if k not in allowed:
                sub = f"{key}.{k}" if key else str(k)
                close = _closest(str(k), allowed)
                hint = f" (did you mean '{close}'?)" if close else ""
                self.fail(sub, f"unknown key{hint}; allowed: {', '.join(sorted(allowed))}")
        return value

    def string(self, value, key: str, pattern: re.Pattern | None = None, what: str = "") -> str | None:
        if value is None:
            # Absent is fine (optional keys); written with no value ("name:") is an error, not
            # a silent drop (an empty pip/env/copy entry) or a None that crashes later.
            if key in self.loc.lines:
                self.fail(key, "has no value (write a string, or remove the key)")
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            self.fail(key, f"must be a string, got {_type_name(value)}")
            return None
        if not isinstance(value, str):
            # Unquoted numbers: take the text the user wrote, so python: 3.10 stays "3.10".
            value = self.loc.raw_scalars.get(key, str(value))
        if pattern is not None and not pattern.match(value):
            self.fail(key, f"{value!r} is not {what or 'valid'}")
            return None
        return value

    def version(self, value, key: str, pattern: re.Pattern, what: str) -> str | None:
        return self.string(value, key, pattern, what)

    def string_list(self, value, key: str, check: Callable[[str, str], str | None] | None = None) -> tuple[str, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            self.fail(key, f"must be a list, got {_type_name(value)}")
            return ()
        out = []
        for i, item in enumerate(value):
            sub = f"{key}[{i}]"
            s = self.string(item, sub)
            if s is None:
                continue
            if check is not None:
                s = check(s, sub)
                if s is None:
                    continue
            out.append(s)
        return tuple(out)

    def string_map(self, value, key: str, key_re: re.Pattern, what: str) -> tuple[tuple[str, str], ...]:
        if value is None:
            return ()
        if not isinstance(value, dict):
            self.fail(key, f"must be a mapping, got {_type_name(value)}")
            return ()
        out = {}
        for k, v in value.items():
            sub = f"{key}.{k}"
            if not isinstance(k, str) or not key_re.match(k):
                self.fail(sub, f"{k!r} is not {what}")
                continue
            s = self.string(v, sub)
            if s is not None:
                if any(c in s for c in "\x00\n\r"):
                    self.fail(sub, "must be one line (no newlines or NUL characters)")
                    continue
                out[k] = s
        return tuple(sorted(out.items()))


def _type_name(value) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "nothing"}.get(type(value), type(value).__name__)


def _closest(word: str, options) -> str | None:
    import difflib  # noqa: PLC0415

    match = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return match[0] if match else None


SCHEMA_PATH = Path(__file__).parent.parent / "schemas" / "recipe.schema.json"
_JSON_TYPES = {"string": str, "object": dict, "array": list, "boolean": bool, "integer": int}


def recipe_schema() -> dict[str, Any]:
    """The recipe's JSON Schema (published by `imgbuild schema` for editors). It is the source
    of the recipe's structure: the key tables below are read from it."""
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def _key_types(node: dict[str, Any]) -> dict[str, type]:
    # Versions may be written unquoted (["string", "number"]); the parser reads them as text.
    return {key: _JSON_TYPES[spec["type"] if isinstance(spec["type"], str) else spec["type"][0]]
            for key, spec in node["properties"].items()}


_SCHEMA = recipe_schema()
TOP_KEYS = _key_types(_SCHEMA)
CUDA_KEYS = _key_types(_SCHEMA["properties"]["cuda"])
BASE_KEYS = _key_types(_SCHEMA["properties"]["base"])
BUILD_KEYS = _key_types(_SCHEMA["properties"]["build"])


def parse_size(text: str) -> int | None:
    """'6GB' -> 6_000_000_000, '512MiB' -> 536_870_912; None when malformed."""
    m = SIZE_RE.match(str(text))
    if not m:
        return None
    number, unit = float(m.group(1)), (m.group(2) or "B").upper()
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}[unit]
    return int(number * scale)


def pin_name(spec: str) -> str:
    """The project name of a normalized pin: 'flash-attn[x]==2.6.3' -> 'flash-attn'."""
    return spec.split("==", 1)[0].split("[", 1)[0]


def _check_pip(spec: str, key: str, v: _Validator) -> str | None:
    try:
        req = Requirement(spec)
    except InvalidRequirement as exc:
        v.fail(key, f"{spec!r} is not a valid requirement ({exc})")
        return None
    if req.url:
        v.fail(key, f"{spec!r}: direct URLs are not supported; pin a version with ==")
        return None
    pins = [s for s in req.specifier if s.operator in ("==", "===")]
    if len(list(req.specifier)) != 1 or not pins or "*" in pins[0].version:
        v.fail(key, f"{spec!r} is not pinned; write it as {req.name}==<version>")
        return None
    if req.marker:
        v.fail(key, f"{spec!r}: environment markers are not supported in recipes")
        return None
    # Normalized form: stable across spellings, safe to place in a shell word.
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return f"{req.name.lower()}{extras}=={pins[0].version}"


def _check_abs_path(path: str, key: str, v: _Validator) -> str | None:
    if not path.startswith("/"):
        v.fail(key, f"{path!r} must be an absolute path inside the image")
        return None
    if not SAFE_PATH_RE.match(path):
        v.fail(key, f"{path!r} has characters imgbuild does not place in a Dockerfile path "
                    "(allowed: letters, digits, space and ._/@+=,:-)")
        return None
    return os.path.normpath(path)


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


def _check_service_volume(v: _Validator) -> Callable[[str, str], str | None]:
    def check(spec: str, key: str) -> str | None:
        try:
            split_service_volume(spec)
        except ValueError as exc:
            v.fail(key, f"{spec!r}: {exc}")
            return None
        return spec

    return check


def load_recipe(path: str | os.PathLike) -> Recipe:
    """Load a recipe without its matrix (see ``matrix`` for the variants)."""
    path = Path(path)
    return parse_recipe(read_recipe_text(path), path)


def read_recipe_text(path: str | os.PathLike) -> str:
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


def _set_path(data: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for key in keys[:-1]:
        if not isinstance(data.get(key), dict):
            data[key] = {}
        data = data[key]
    data[keys[-1]] = value


def parse_recipe(text: str, path: Path, *, overrides: dict[str, Any] | None = None,  # noqa: C901
                 override_lines: dict[str, int] | None = None) -> Recipe:
    """Validate a recipe. ``overrides`` (dotted key -> value, e.g. from a matrix variant) are
    applied first; errors in them point at ``override_lines`` (the matrix entry's line)."""
    file = str(path)
    located = locate(text, file)
    if overrides:
        import copy  # noqa: PLC0415

        located.data = copy.deepcopy(located.data)
        for key, value in overrides.items():
            if isinstance(located.data, dict):
                _set_path(located.data, key, value)
            line = (override_lines or {}).get(key)
            if line is not None:
                for known in [k for k in located.lines if k == key or k.startswith(key + ".") or k.startswith(key + "[")]:  # noqa: E501
                    del located.lines[known]
                located.lines[key] = line
            located.raw_scalars.pop(key, None)  # callers pass versions as the text written
    data = located.data
    v = _Validator(located)
    if not isinstance(data, dict):
        # line 1 for an empty file too, so every issue has a line
        v.issues.append(RecipeIssue(file, located.lines.get("", 1), "",
                                    f"a recipe must be a mapping of keys, got {_type_name(data)}"))
        raise RecipeError(v.issues)
    v.mapping(data, "", TOP_KEYS)

    for required in ("name", "cuda", "python"):
        if required not in data:
            v.issues.append(RecipeIssue(file, 1, required, "required key is missing"))

    name = v.string(data.get("name"), "name", REPOSITORY_RE,
                    "a valid image repository (lowercase, e.g. team/trainer; no registry, no tag)")
    version = v.string(data.get("version"), "version", TAG_RE, "a valid tag (letters, digits, '.', '_', '-')")

    cuda_raw = v.mapping(data.get("cuda", {}), "cuda", CUDA_KEYS) if "cuda" in data else {}
    if "cuda" in data and "version" not in cuda_raw and isinstance(data.get("cuda"), dict):
        v.fail("cuda", "cuda.version is required")
    cuda_version = v.version(cuda_raw.get("version"), "cuda.version", CUDA_VERSION_RE,
                             "a CUDA version like 12.4 or 12.4.1")
    flavor = v.string(cuda_raw.get("flavor", "runtime"), "cuda.flavor")
    if flavor is not None and flavor not in FLAVORS:
        v.fail("cuda.flavor", f"{flavor!r} is not one of {', '.join(FLAVORS)}")
    source = v.string(cuda_raw.get("source", "nvidia"), "cuda.source")
    if source is not None and source not in SOURCES:
        v.fail("cuda.source", f"{source!r} is not one of {', '.join(SOURCES)}")
    cudnn = v.version(cuda_raw.get("cudnn"), "cuda.cudnn", CUDNN_RE, "a cuDNN version like 9 or 8.9")

    base_raw = v.mapping(data.get("base", {}), "base", BASE_KEYS)
    base_image = v.string(base_raw.get("image"), "base.image", IMAGE_REF_RE,
                          "a valid image reference (e.g. debian:bookworm-slim)")
    base_os = v.string(base_raw.get("os", "ubuntu22.04"), "base.os", OS_RE, "an OS of nvidia/cuda tags (e.g. ubuntu22.04)")  # noqa: E501
    mirror = v.string(base_raw.get("mirror"), "base.mirror", REGISTRY_PATH_RE,
                      "a registry path (e.g. 127.0.0.1:5000/mirror)")
    if source == "wheels" and "image" not in base_raw:
        v.fail("base", "cuda.source: wheels needs base.image (the OS image the CUDA wheels go on)")

    python = v.version(data.get("python"), "python", PYTHON_VERSION_RE, "a Python version like 3.11")
    torch = v.version(data.get("torch"), "torch", EXACT_VERSION_RE, "an exact torch version like 2.4.1")

    pip = v.string_list(data.get("pip"), "pip", lambda s, k: _check_pip(s, k, v))
    names = [pin_name(p) for p in pip]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        v.fail("pip", f"{dup} is listed more than once")
    if "torch" in names:
        v.fail(f"pip[{names.index('torch')}]", "pin torch with the top-level 'torch:' key, so imgbuild picks its CUDA wheel index")  # noqa: E501

    def check_apt(s, k):
        if not APT_RE.match(s):
            v.fail(k, f"{s!r} is not a Debian package name (optionally name=version)")
            return None
        return s

    apt = v.string_list(data.get("apt"), "apt", check_apt)

    copies = []
    copy_raw = data.get("copy")
    if copy_raw is not None and not isinstance(copy_raw, list):
        v.fail("copy", f"must be a list, got {_type_name(copy_raw)}")
        copy_raw = []
    for i, item in enumerate(copy_raw or []):
        key = f"copy[{i}]"
        item = v.mapping(item, key, {"src": str, "dest": str})  # noqa: PLW2901
        if not item:
            continue
        src = v.string(item.get("src"), f"{key}.src")
        dest = v.string(item.get("dest"), f"{key}.dest")
        if src is None or dest is None:
            if "src" not in item or "dest" not in item:
                v.fail(key, "needs both src and dest")
            continue
        resolved = (path.parent / src).resolve()
        root = path.parent.resolve()
        if os.path.isabs(src) or (resolved != root and root not in resolved.parents):
            v.fail(f"{key}.src", f"{src!r} is outside the recipe's folder {root}")
            continue
        if not resolved.exists():
            v.fail(f"{key}.src", f"{src!r} does not exist (looked for {resolved})")
            continue
        dest = _check_abs_path(dest, f"{key}.dest", v)
        if dest is None:
            continue
        rel = os.path.relpath(resolved, root)
        if not SAFE_PATH_RE.match(rel):
            # COPY expands $VARS and wildcards (* ? [) in its sources even in the JSON form.
            v.fail(f"{key}.src", f"{src!r} has characters imgbuild does not place in a COPY source "
                                 "(allowed: letters, digits, space and ._/@+=,:-)")
            continue
        if resolved.is_dir():
            rel = rel.rstrip("/") + "/"
        copies.append(CopySpec(src=rel, dest=dest))

    workdir = v.string(data.get("workdir"), "workdir")
    if workdir is not None:
        workdir = _check_abs_path(workdir, "workdir", v)
    env = v.string_map(data.get("env"), "env", ENV_NAME_RE, "a valid environment variable name")
    labels = v.string_map(data.get("labels"), "labels", LABEL_KEY_RE,
                          "a valid label key (letters, digits, '.', '-')")
    for k, _ in labels:
        if k.lower().startswith("io.imgbuild."):
            v.fail(f"labels.{k}", "io.imgbuild.* labels are set by imgbuild itself")
    volumes = v.string_list(data.get("volumes"), "volumes", lambda s, k: _check_abs_path(s, k, v))
    def check_arg(s, k):  # exec-form arguments: a NUL would cut the argument short
        return v.fail(k, "must not contain NUL characters") if "\x00" in s else s

    entrypoint = v.string_list(data.get("entrypoint"), "entrypoint", check_arg)
    cmd = v.string_list(data.get("cmd"), "cmd", check_arg)

    build = BuildSpec()
    if data.get("build") is not None:
        b = v.mapping(data["build"], "build", BUILD_KEYS)
        from_source = v.string_list(b.get("from_source"), "build.from_source")
        archs = v.string_list(b.get("cuda_arch"), "build.cuda_arch",
                              lambda s, k: s if ARCH_RE.match(s) else v.fail(k, f"{s!r} is not a compute capability like 8.0 or 9.0"))  # noqa: E501
        jobs = b.get("jobs")
        if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
            v.fail("build.jobs", "must be a positive whole number")
            jobs = None
        pinned = {n for n in names}
        for i, pkg in enumerate(from_source):
            if pkg.lower() not in pinned:
                v.fail(f"build.from_source[{i}]", f"{pkg!r} must also be pinned in pip:")
        build = BuildSpec(tuple(p.lower() for p in from_source), tuple(archs), jobs)

    runtime_compile = data.get("runtime_compile", False)
    if not isinstance(runtime_compile, bool):
        v.fail("runtime_compile", f"must be true or false, got {_type_name(runtime_compile)}")
        runtime_compile = False

    max_size = None
    if data.get("budget") is not None:
        bud = v.mapping(data["budget"], "budget", {"max_size": str})
        if "max_size" in bud:
            raw = v.string(bud["max_size"], "budget.max_size")
            max_size = parse_size(raw) if raw is not None else None
            if raw is not None and max_size is None:
                v.fail("budget.max_size", f"{raw!r} is not a size like 6GB or 800MiB")

    weights = []
    mounts: dict[str, int] = {}  # mount path -> index of the first entry using it
    w_raw = data.get("weights")
    if w_raw is not None and not isinstance(w_raw, list):
        v.fail("weights", f"must be a list, got {_type_name(w_raw)}")
        w_raw = []
    for i, item in enumerate(w_raw or []):
        key = f"weights[{i}]"
        item = v.mapping(item, key, {"ref": str, "mount": str})  # noqa: PLW2901
        ref = v.string(item.get("ref"), f"{key}.ref", IMAGE_REF_RE, "a registry reference")
        mount = v.string(item.get("mount"), f"{key}.mount")
        if mount is not None:
            mount = _check_abs_path(mount, f"{key}.mount", v)
        if ref and mount:
            first = mounts.setdefault(mount, i)
            if first != i:
                # docker run refuses two volumes on one path ("Duplicate mount point"), after
                # every weight was downloaded: refuse it here.
                v.fail(f"{key}.mount", f"{mount!r} is already the mount of weights[{first}]; "
                                       "each weights entry needs its own mount path")
                continue
            weights.append(WeightsSpec(ref, mount))
        elif item and ("ref" not in item or "mount" not in item):
            v.fail(key, "needs both ref and mount")

    services = []
    s_raw = data.get("services")
    if s_raw is not None and not isinstance(s_raw, dict):
        v.fail("services", f"must be a mapping of service names, got {_type_name(s_raw)}")
        s_raw = {}
    for sname, item in sorted((s_raw or {}).items(), key=lambda kv: str(kv[0])):
        key = f"services.{sname}"
        if not isinstance(sname, str) or not SERVICE_NAME_RE.match(sname) or sname == "app":
            v.fail(key, f"{sname!r} is not a service name (lowercase letters, digits, '-', '_'; not 'app')")
            continue
        item = v.mapping(item, key, {"image": str, "ports": list, "environment": dict, "volumes": list,  # noqa: PLW2901
                                     "command": list})
        if not item:
            continue
        image = v.string(item.get("image"), f"{key}.image", IMAGE_REF_RE, "a valid image reference")
        if "image" not in item:
            v.fail(key, "needs an image")
        ports = v.string_list(item.get("ports"), f"{key}.ports",
                              lambda p, k: p if PORT_RE.match(p) else v.fail(k, f"{p!r} is not a port mapping like 6333:6333"))  # noqa: E501
        environment = v.string_map(item.get("environment"), f"{key}.environment", ENV_NAME_RE,
                                   "a valid environment variable name")
        # Not `volumes`: that name holds the image's own VOLUME list, returned below.
        service_volumes = v.string_list(item.get("volumes"), f"{key}.volumes", _check_service_volume(v))
        command = v.string_list(item.get("command"), f"{key}.command")
        if image:
            services.append(ServiceSpec(sname, image, ports, environment, service_volumes, command))

    if v.issues or name is None or cuda_version is None or flavor is None or source is None \
            or base_os is None or python is None:
        # A required value that is None has an issue recorded above: say that, never a half recipe.
        raise RecipeError(sorted(v.issues, key=lambda i: (i.line or 0, i.key)))

    return Recipe(
        path=path,
        name=name,
        version=version,
        cuda=CudaSpec(cuda_version, flavor, cudnn, source),
        base=BaseSpec(base_image, base_os, mirror),
        python=python,
        torch=torch,
        pip=pip,
        apt=tuple(sorted(set(apt))),
        copy=tuple(copies),
        workdir=workdir,
        env=env,
        volumes=tuple(sorted(set(volumes))),
        entrypoint=entrypoint,
        cmd=cmd,
        labels=labels,
        build=build,
        runtime_compile=runtime_compile,
        max_size=max_size,
        weights=tuple(weights),
        services=tuple(services),
        lines=dict(located.lines),
    )
