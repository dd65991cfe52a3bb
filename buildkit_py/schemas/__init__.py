"""The file formats' schemas and the one validator that drives them.

Each format imgbuild reads has one declarative schema here, JSON Schema draft 2020-12:
``recipe.schema.json`` (published for editors by `imgbuild schema`; its ``$defs/matrix`` is the
``matrix:`` spec), ``lock.schema.json`` (lock files) and ``compat.schema.json`` (the
compatibility data files, one ``$defs`` entry per file). Rules a schema cannot state (one key
that needs another, paths inside the recipe's folder, versions that fit together) stay small
functions beside the parsers.

``validate`` implements the subset of JSON Schema these files use (``KEYWORDS``; a schema
using another keyword is refused, never silently passed), in ~250 lines, because the
alternatives cost start-up: ``import jsonschema`` takes 156-236 ms and ``import pydantic`` 117-157 ms
against under 1 ms for this module (README, "Design notes"). It returns every problem in one pass as
``(key path, message)``; the callers map key paths to ``file:line`` with the YAML loader's line
table. The test suite checks each schema with jsonschema and that both agree on every shipped
file.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

HERE = Path(__file__).parent

# Keywords ``validate`` understands. Annotations (title, description, default, examples,
# markdownDescription) are ignored. patternErrorMessage and errorMessage are the VS Code / YAML
# language server extensions that editors show for a failed pattern, or for a node of the wrong
# type or size; our messages say the same.
KEYWORDS = frozenset({
    "$schema", "$id", "$defs", "$ref", "$comment", "title", "description", "default", "examples",
    "markdownDescription", "patternErrorMessage", "errorMessage",
    "type", "enum", "const", "pattern", "minimum", "maximum", "minLength",
    "properties", "required", "additionalProperties", "propertyNames", "minProperties",
    "items", "minItems", "uniqueItems",
})
_TYPE_NAMES = {"string": "a string", "array": "a list", "object": "a mapping", "boolean": "true or false",
               "integer": "a whole number", "number": "a number", "null": "nothing"}


class SchemaIssue(NamedTuple):
    key: str  # key path in the document: "cuda.version", "pip[1]", "" for the document itself
    message: str
    at: tuple[str | int, ...] = ()  # the same path as keys and list indexes (a key may hold a '.')


@functools.cache
def load_schema(name: str) -> dict[str, Any]:
    """``recipe``, ``lock`` or ``compat``: the schema file's JSON."""
    schema: dict[str, Any] = json.loads((HERE / f"{name}.schema.json").read_text(encoding="utf-8"))
    return schema


def schema_path(name: str) -> Path:
    return HERE / f"{name}.schema.json"


def key_path(parent: str, key: object) -> str:
    """'cuda' + 'version' -> 'cuda.version'; 'pip' + 1 -> 'pip[1]'."""
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else str(key)


def join_path(parts: tuple[str | int, ...], prefix: str = "") -> str:
    """('services', 'db', 'ports', 0) -> 'services.db.ports[0]'."""
    out = prefix
    for part in parts:
        out = key_path(out, part)
    return out


def line_of(lines: dict[str, int], key: str) -> int | None:
    """The line of a key path in a loader's table (key path -> line); a key that is not in the file (a missing
    one) is at its closest parent that is; None where no parent is."""
    probe = key
    while probe and probe not in lines:
        probe = re.sub(r"(?:\.[^.\[]*|\[\d+\])$", "", probe) if re.search(r"[.\[]", probe) else ""
    return lines.get(probe)



_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\],:]|[^\s{}\[\],:"]+|\n')


def json_lines(text: str) -> dict[str, int]:
    """Key path -> line of every value in a JSON document (``validate``'s key paths), for the
    ``file:line`` of an error; the text is assumed valid JSON (``json.loads`` read it first)."""
    lines: dict[str, int] = {}
    stack: list[list[Any]] = []  # per open container: [path, next list index or None for an object]
    line, key, path = 1, None, ""
    for piece in _JSON_TOKEN.findall(text):
        if piece == "\n":
            line += 1
            continue
        if piece in ",:":
            continue
        if piece in "]}":
            stack.pop()
            continue
        if stack and stack[-1][1] is None and key is None:  # an object's key
            key = json.loads(piece)
            continue
        if stack:
            parent = stack[-1]
            path = key_path(parent[0], key) if parent[1] is None else key_path(parent[0], parent[1])
            if parent[1] is not None:
                parent[1] += 1
        key = None
        lines.setdefault(path, line)
        if piece in "[{":
            stack.append([path, 0 if piece == "[" else None])
    return lines


def type_name(value: Any) -> str:
    """How an error names what it found: 'a mapping', 'a list', 'nothing', ..."""
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "nothing"}.get(type(value), type(value).__name__)


def closest(word: str, options: Iterable[object]) -> str | None:
    """The option nearest to a misspelt word (the "did you mean" of an error), if any is near."""
    import difflib  # only on an unknown key: 8 ms of start-up otherwise  # noqa: PLC0415

    match = difflib.get_close_matches(word, [str(o) for o in options], n=1, cutoff=0.6)
    return match[0] if match else None


@functools.cache
def _regex(pattern: str) -> re.Pattern[str]:
    # ECMA-262 patterns, read the way the recipe's values must be: ASCII classes (\d, \w), and
    # a final '$' that does not also match before a trailing newline ("git\n").
    return re.compile(pattern.removesuffix("$") + r"\Z" if pattern.endswith("$") else pattern, re.ASCII)


def _is_type(value: Any, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, {"string": str, "array": list, "object": dict, "boolean": bool,
                              "null": type(None)}[name])


def _same(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def validate(instance: Any, schema: dict[str, Any], *, root: dict[str, Any] | None = None,
             at: tuple[str | int, ...] = ()) -> list[SchemaIssue]:
    """Every way ``instance`` breaks ``schema``, in document order. ``root`` resolves
    ``$ref: "#/$defs/..."`` (default: ``schema`` itself); ``at`` is where ``instance`` sits in
    its document, so key paths name the whole path."""
    issues: list[SchemaIssue] = []
    _Walk(root or schema, issues).node(instance, schema, at)
    return issues


def resolve_ref(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """The schema with its local ``$ref`` (``#/$defs/name``) merged in."""
    while "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/"):
            raise ValueError(f"only local $ref is supported, got {ref!r}")
        node: Any = root
        for part in ref[2:].split("/"):
            node = node[part]
        schema = {**{k: v for k, v in schema.items() if k != "$ref"}, **node}
    return schema


def subschema(schema: dict[str, Any], root: dict[str, Any], key: str | int) -> dict[str, Any] | None:
    """The schema of ``key`` (a property name or a list index) inside a value of ``schema``."""
    schema = resolve_ref(schema, root)
    if isinstance(key, int):
        items = schema.get("items")
        return resolve_ref(items, root) if isinstance(items, dict) else None
    node = schema.get("properties", {}).get(key, schema.get("additionalProperties"))
    return resolve_ref(node, root) if isinstance(node, dict) else None


def read_as_written(value: Any, schema: dict[str, Any], raw: dict[str, str], *, root: dict[str, Any] | None = None,
                    at: str = "") -> Any:
    """``value`` with every number the schema also takes as text (``"type": ["string", "number"]``)
    replaced by the text written in the file (``raw``: key path -> plain scalar text), so
    ``python: 3.10`` reads "3.10", not 3.1. A copy; ``value`` is left alone."""
    root = root or schema
    schema = resolve_ref(schema, root)
    kinds = schema.get("type")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(kinds, list) \
            and "string" in kinds and "number" in kinds:
        return raw.get(at, str(value))
    if isinstance(value, dict):
        return {k: _as_written_in(v, schema, root, raw, str(k), key_path(at, str(k))) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_written_in(v, schema, root, raw, i, key_path(at, i)) for i, v in enumerate(value)]
    return value


def _as_written_in(value: Any, parent: dict[str, Any], root: dict[str, Any], raw: dict[str, str], key: str | int,
                   at: str) -> Any:
    sub = subschema(parent, root, key)
    return value if sub is None else read_as_written(value, sub, raw, root=root, at=at)


def prune(data: Any, issues: list[SchemaIssue]) -> None:
    """Take out, in place, every value ``validate`` refused (a list entry becomes None, so
    indexes and key paths stay): the rules that run after the schema see only values of the
    shapes it promises, and report nothing twice."""
    for issue in issues:
        node = data
        for part in issue.at[:-1]:
            node = _child(node, part)
        last = issue.at[-1] if issue.at else None
        if isinstance(node, list) and isinstance(last, int) and last < len(node):
            node[last] = None
        elif isinstance(node, dict):
            for key in [k for k in node if str(k) == last]:
                del node[key]


def _child(node: Any, part: str | int) -> Any:
    if isinstance(node, list) and isinstance(part, int) and part < len(node):
        return node[part]
    if isinstance(node, dict):
        return next((v for k, v in node.items() if str(k) == part), None)
    return None


class _Walk:
    def __init__(self, root: dict[str, Any], issues: list[SchemaIssue]):
        self.root = root
        self.issues = issues
        self.resolved: dict[int, dict[str, Any]] = {}  # id of a schema node -> it, $ref merged and checked

    def fail(self, path: tuple[str | int, ...], message: str) -> None:
        self.issues.append(SchemaIssue(join_path(path), message, path))

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        done = self.resolved.get(id(schema))
        if done is not None:
            return done
        done = resolve_ref(schema, self.root)
        unknown = set(done) - KEYWORDS
        if unknown:
            raise ValueError(f"schema keyword(s) {', '.join(sorted(unknown))} not supported by buildkit_py.schemas")
        self.resolved[id(schema)] = done  # the nodes outlive this walk, so their ids stay unique
        return done

    def node(self, value: Any, schema: dict[str, Any], path: tuple[str | int, ...]) -> None:
        schema = self.resolve(schema)
        if not self.type_ok(value, schema, path):
            return
        if "const" in schema and not _same(value, schema["const"]):
            self.fail(path, schema.get("errorMessage") or
                      f"must be {json.dumps(schema['const'])}, got {json.dumps(value, default=str)}")
        elif "enum" in schema and not any(_same(value, e) for e in schema["enum"]):
            self.fail(path, f"{value!r} is not one of {', '.join(str(e) for e in schema['enum'])}")
        if isinstance(value, str):
            self.string(value, schema, path)
        elif isinstance(value, dict):
            self.mapping(value, schema, path)
        elif isinstance(value, list):
            self.array(value, schema, path)
        elif "minimum" in schema and _is_type(value, "number") and value < schema["minimum"]:
            self.fail(path, f"must be at least {schema['minimum']}, got {value}")
        elif "maximum" in schema and _is_type(value, "number") and value > schema["maximum"]:
            self.fail(path, f"must be at most {schema['maximum']}, got {value}")

    def type_ok(self, value: Any, schema: dict[str, Any], path: tuple[str | int, ...]) -> bool:
        wanted = schema.get("type")
        if wanted is None:
            return True
        names = [wanted] if isinstance(wanted, str) else list(wanted)
        if any(_is_type(value, n) for n in names):
            return True
        # ["string", "number"]: a version written unquoted; the loaders read it as text.
        what = " or ".join(_TYPE_NAMES[n] for n in names if not (n == "number" and "string" in names))
        if "errorMessage" in schema:
            self.fail(path, schema["errorMessage"])
        elif value is None:
            self.fail(path, f"has no value (write {what}, or remove the key)")
        else:
            self.fail(path, f"must be {what}, got {type_name(value)}")
        return False

    def string(self, value: str, schema: dict[str, Any], path: tuple[str | int, ...]) -> None:
        if len(value) < schema.get("minLength", 0):
            self.fail(path, "must not be empty" if schema["minLength"] == 1 else
                      f"must be at least {schema['minLength']} characters long")
        elif "pattern" in schema and not _regex(schema["pattern"]).search(value):
            what = schema.get("patternErrorMessage") or f"not of the form {schema['pattern']}"
            self.fail(path, f"{value!r} is {what}")

    def mapping(self, value: dict[Any, Any], schema: dict[str, Any], path: tuple[str | int, ...]) -> None:
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        names = schema.get("propertyNames")
        for key, item in value.items():
            sub = (*path, str(key))
            if names is not None and not self.name_ok(key, names, sub):
                continue
            if key in props:
                self.node(item, props[key], sub)
            elif extra is False:
                close = closest(str(key), props)
                hint = f" (did you mean '{close}'?)" if close else ""
                self.fail(sub, f"unknown key{hint}; allowed: {', '.join(sorted(props))}")
            elif isinstance(extra, dict):
                self.node(item, extra, sub)
        for key in schema.get("required", ()):
            if key not in value:
                self.fail((*path, key), "required key is missing")
        if len(value) < schema.get("minProperties", 0):
            self.fail(path, schema.get("errorMessage", "must not be empty"))

    def name_ok(self, key: Any, schema: dict[str, Any], path: tuple[str | int, ...]) -> bool:
        schema = self.resolve(schema)
        pattern = schema.get("pattern")
        if isinstance(key, str) and (pattern is None or _regex(pattern).search(key)):
            return True
        self.fail(path, f"{key!r} is {schema.get('patternErrorMessage') or 'not a valid key'}")
        return False

    def array(self, value: list[Any], schema: dict[str, Any], path: tuple[str | int, ...]) -> None:
        if len(value) < schema.get("minItems", 0):
            self.fail(path, schema.get("errorMessage") or ("must not be empty" if schema["minItems"] == 1 else
                                                           f"must have at least {schema['minItems']} entries"))
        items = schema.get("items")
        if items is not None:
            for i, item in enumerate(value):
                self.node(item, items, (*path, i))
        if schema.get("uniqueItems"):
            seen: dict[str, int] = {}
            for i, item in enumerate(value):
                canon = json.dumps(item, sort_keys=True, default=str)
                if canon in seen:
                    self.fail((*path, i), f"{item!r} is listed twice (also {join_path((*path, seen[canon]))})")
                seen.setdefault(canon, i)
