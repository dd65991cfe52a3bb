"""versions.major_minor: the one reading of major.minor (issue 32: 5)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from buildkit_py.versions import major_minor

PACKAGE = Path(__file__).resolve().parent.parent / "buildkit_py"


@pytest.mark.parametrize(("version", "mm"), [
    ("12.4.1", "12.4"), ("12.4", "12.4"), ("12", "12"), ("3.11", "3.11"), ("2.5.1+cu124", "2.5"),
    ("12.04.1", "12.04"), ("", "")])
def test_major_minor_keeps_what_was_written(version, mm):
    assert major_minor(version) == mm


def split_first_two(tree: ast.AST) -> list[int]:
    """Lines that spell major.minor by hand: ``".".join(x.split(".")[:2])``."""
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "join"
            and isinstance(n.func.value, ast.Constant) and n.func.value.value == "." and len(n.args) == 1
            and "split('.')[:2]" in ast.unparse(n.args[0])]


def test_no_module_spells_major_minor_again():
    found = [f"{p.relative_to(PACKAGE.parent)}:{line}" for p in sorted(PACKAGE.rglob("*.py")) if p.name != "versions.py"
             for line in split_first_two(ast.parse(p.read_text(encoding="utf-8")))]
    assert found == [], "use buildkit_py.versions.major_minor"


def test_the_check_finds_a_copy():
    tree = ast.parse('mm = ".".join(cuda.split(".")[:2])\nfs = frozenset(".".join(v.split(".")[:2]) for v in x)\n'
                     'ok = ".".join(parts)\n')
    assert split_first_two(tree) == [1, 2]
