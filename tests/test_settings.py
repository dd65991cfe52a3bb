"""Settings read once (issue 32, 4): the CLI reads the environment into ``cli.settings.Settings``
and passes each value down; no module below cli/ reads ``os.environ`` or ``os.getenv``, so a
library caller gets what it asks for, and the same option means the same thing on every command.
Read from the source with ast, so nothing is imported."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from buildkit_py.cli.settings import Settings

PACKAGE = Path(__file__).resolve().parent.parent / "buildkit_py"
# Below cli/, the modules still allowed to read the environment, each with why. Only shrinks.
ALLOWED = {
    # the engine kinds build their clients' child environment and find their clients
    # ($IMGBUILD_DOCKER, $DOCKER_HOST, $IMGBUILD_PODMAN): being rewritten by issue 32 item 2
    "engine/kinds/docker.py": "the engine kind's child environment",
    "engine/kinds/podman.py": "the engine kind's child environment",
    # docker's own config and credential variables, read as the docker CLI reads them: oci/ is
    # being retyped (issue 32, 3); its callers to pass them in after that
    "oci/auth.py": "docker's config and the registry credential variables",
}


def environment_reads(path: Path) -> list[int]:
    """Lines of ``path`` that read the process environment: os.environ, os.environb, os.getenv,
    and those names imported from os."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os" \
                and node.attr in {"environ", "environb", "getenv", "getenvb"}:
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" \
                and any(a.name in {"environ", "environb", "getenv", "getenvb"} for a in node.names):
            lines.append(node.lineno)
    return sorted(lines)


def test_no_environment_read_below_the_cli():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("cli/") or rel in ALLOWED:
            continue
        found += [f"buildkit_py/{rel}:{line}" for line in environment_reads(path)]
    assert not found, "read the environment in cli/settings.py and pass the value down:\n" + "\n".join(found)


def test_the_allow_list_holds_only_modules_that_read_it():
    """An entry whose module no longer reads the environment goes, so the list only shrinks."""
    stale = [rel for rel in ALLOWED if not (PACKAGE / rel).exists() or not environment_reads(PACKAGE / rel)]
    assert not stale


def test_the_check_finds_each_spelling(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import os\nfrom os import getenv\na = os.environ.get('X')\nb = os.getenv('Y')\nc = 1\n")
    assert environment_reads(src) == [2, 3, 4]


@pytest.mark.parametrize(("option", "environ", "kind"), [
    ("podman", {"IMGBUILD_ENGINE": "docker"}, "podman"),  # the option wins, on every command
    (None, {"IMGBUILD_ENGINE": "docker", "IMGBUILD_BACKEND": "podman"}, "docker"),
    (None, {"IMGBUILD_BACKEND": "podman"}, "podman"),  # the older name, still read
    (None, {}, None),  # auto
])
def test_engine_from_the_option_else_the_environment(option, environ, kind):
    assert Settings.from_args(argparse.Namespace(engine=option), environ).engine == kind


def test_weights_root_from_the_environment(tmp_path):
    weights = Settings.from_args(argparse.Namespace(), {"IMGBUILD_WEIGHTS_DIR": str(tmp_path)}).weights_root
    assert weights == tmp_path
    cache = Settings.from_args(argparse.Namespace(), {"XDG_CACHE_HOME": str(tmp_path)}).weights_root
    assert cache in (tmp_path / "imgbuild" / "weights", Path("/var/lib/imgbuild/weights"))  # root: the system's


def test_source_date_epoch_is_read_once_here():
    assert Settings.from_args(argparse.Namespace(), {"SOURCE_DATE_EPOCH": "5"}).source_date_epoch == "5"
    assert Settings.from_args(argparse.Namespace(), {}).source_date_epoch is None
