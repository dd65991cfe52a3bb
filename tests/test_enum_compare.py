"""No enum-typed value is compared with a string literal (issue 32: 3).

A ``TextEnum`` member equals its word, so ``recipe.cuda.source != "nvidia"`` works today, and
``recipe.cuda.source != "nvidai"`` type-checks and is always true. Written with the member
(``CudaSource.NVIDIA``), a typo is an AttributeError that mypy reports.

Read from the source with ast, so nothing is imported: the enums are the classes derived (at any
depth) from ``TextEnum`` or ``enum.Enum``; an enum-typed value is an attribute whose name is
annotated with one in a class body (a dataclass field) or returned by a property, or a function's
parameter or local annotated with one. ``==``, ``!=``, ``in`` and ``not in`` between such a value
and a str literal (or a tuple, list or set of them) are reported. A parameter or local is typed
where it is read, so any literal counts; an attribute is matched by its name only (``.source`` is a
CudaSource on a recipe's cuda and a plain str on a credential), so there a literal counts when it is
one of its enums' words or close to one (``"nvidai"``): a word no member has, compared with a
str-typed attribute of the same name, is left alone."""

from __future__ import annotations

import ast
import difflib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "buildkit_py"
ENUM_ROOTS = {"TextEnum", "Enum", "IntEnum", "StrEnum"}
COMPARISONS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _trees(package: Path) -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(encoding="utf-8"))) for p in sorted(package.rglob("*.py"))]


def enum_classes(trees: list[tuple[Path, ast.Module]]) -> dict[str, set[str]]:
    """The package's enum classes, derived at any depth from an enum root, with their members' words."""
    classes = {node.name: node for _, tree in trees for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    enums = set(ENUM_ROOTS)
    while True:
        more = {name for name, c in classes.items() if {_base_name(b) for b in c.bases} & enums} - enums
        if not more:
            break
        enums |= more
    return {name: {s.value.value for s in classes[name].body if isinstance(s, ast.Assign)
                   and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)}
            for name in enums - ENUM_ROOTS}


def _names_in(annotation: ast.expr | None) -> set[str]:
    """Every name an annotation mentions: ``CudaFlavor | None``, ``"CudaFlavor"``, ``Optional[X]``."""
    if annotation is None:
        return set()
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return set()
    return {_base_name(n) for n in ast.walk(annotation) if isinstance(n, (ast.Name, ast.Attribute))}


def _is_property(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(_base_name(d) in {"property", "cached_property"} for d in fn.decorator_list)


def enum_attributes(trees: list[tuple[Path, ast.Module]], enums: dict[str, set[str]]) -> dict[str, set[str]]:
    """Attribute names typed with an enum (class-body annotations, properties returning one), with the
    words of the enums each name is typed with anywhere."""
    found: dict[str, set[str]] = {}
    for _, tree in trees:
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    name, typed_with = stmt.target.id, _names_in(stmt.annotation) & enums.keys()
                elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_property(stmt):
                    name, typed_with = stmt.name, _names_in(stmt.returns) & enums.keys()
                else:
                    continue
                for enum in typed_with:
                    found.setdefault(name, set()).update(enums[enum])
    return found


def _enum_locals(fn: ast.FunctionDef | ast.AsyncFunctionDef, enums: set[str]) -> set[str]:
    args = fn.args
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    names = {a.arg for a in params if _names_in(a.annotation) & enums}
    for node in ast.walk(fn):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and _names_in(node.annotation) & enums):
            names.add(node.target.id)
    return names


def _str_literals(node: ast.expr, *, collection: bool) -> list[str] | None:
    """The words of a str literal, or of a tuple, list or set of them; None for anything else."""
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) else None
    if collection and isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts:
        words = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        return words if len(words) == len(node.elts) else None
    return None


def _is_word_of(literal: str, words: set[str]) -> bool:
    return literal in words or bool(difflib.get_close_matches(literal, words, n=1, cutoff=0.75))


def _findings_in(rel: Path, tree: ast.Module, attributes: dict[str, set[str]], enums: set[str]) -> list[str]:
    # the enum-typed parameters and locals of the functions each node sits in
    scope: dict[int, set[str]] = {}
    for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        local = _enum_locals(fn, enums)
        for node in ast.walk(fn):
            scope[id(node)] = scope.get(id(node), set()) | local

    def against_words(value: ast.expr, literal: ast.expr, compare: ast.Compare, *, collection: bool) -> bool:
        words = _str_literals(literal, collection=collection)
        if words is None:
            return False
        if isinstance(value, ast.Attribute) and value.attr in attributes:
            return any(_is_word_of(w, attributes[value.attr]) for w in words)
        return isinstance(value, ast.Name) and value.id in scope.get(id(compare), set())

    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]  # a < b < c: the pairs (a, b), (b, c)
        for op, left, right in zip(node.ops, operands[:-1], operands[1:], strict=True):
            if not isinstance(op, COMPARISONS):
                continue
            membership = isinstance(op, (ast.In, ast.NotIn))
            if (against_words(left, right, node, collection=membership)
                    or (not membership and against_words(right, left, node, collection=False))):
                out.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return out


def enum_string_comparisons(package: Path = PACKAGE) -> list[str]:
    trees = _trees(package)
    enums = enum_classes(trees)
    attributes = enum_attributes(trees, enums)
    return [f for path, tree in trees
            for f in _findings_in(path.relative_to(package.parent), tree, attributes, set(enums))]


def test_no_enum_value_is_compared_with_a_string_literal():
    assert enum_string_comparisons() == [], "compare with the enum's member (CudaSource.NVIDIA), not its word"


def test_the_enums_and_their_fields_are_found():
    trees = _trees(PACKAGE)
    enums = enum_classes(trees)
    assert {"CudaFlavor", "CudaSource", "InstallerName", "Severity", "Verdict", "ExitStatus"} <= enums.keys()
    assert enums["CudaSource"] == {"nvidia", "wheels"}
    attributes = enum_attributes(trees, enums)
    assert {"flavor", "installer", "severity"} <= attributes.keys()
    assert {"nvidia", "wheels"} <= attributes["source"]


def test_the_check_finds_each_spelling(tmp_path):
    """The rule can fail: a planted field, property, parameter and local compared with words are each
    reported, a typo of a word too; a str attribute that shares the field's name is not."""
    pkg = tmp_path / "buildkit_py"
    pkg.mkdir()
    (pkg / "model.py").write_text(
        "from buildkit_py.text_enum import TextEnum\n"
        "class Base(TextEnum):\n    pass\n"
        "class Flavor(Base):\n    RUNTIME = 'runtime'\n    DEVEL = 'devel'\n"
        "class Spec:\n    flavor: 'Flavor | None' = None\n    name: str = ''\n"
        "    @property\n    def kind(self) -> Flavor:\n        return Flavor.DEVEL\n")
    (pkg / "use.py").write_text(
        "def f(spec, wanted: Flavor, other: str):\n"
        "    picked: Flavor = wanted\n"
        "    a = spec.flavor != 'runtime'\n"
        "    b = 'devel' == spec.kind\n"
        "    c = wanted in ('runtime', 'devel')\n"
        "    d = picked not in ['runtime']\n"
        "    e = spec.flavor == Flavor.RUNTIME and spec.name == 'x' and other == 'y'\n"
        "    g = spec.flavor is None or 'r' in str(spec.flavor)\n"
        "    k = spec.flavor == 'runtmie' or spec.flavor == 'sqlite'\n"
        "def h(wanted):\n    return wanted == 'runtime'\n")
    assert [f.split(": ", 1)[1] for f in enum_string_comparisons(pkg)] == [
        "spec.flavor != 'runtime'", "'devel' == spec.kind", "wanted in ('runtime', 'devel')",
        "picked not in ['runtime']", "spec.flavor == 'runtmie'"]
