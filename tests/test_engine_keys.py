"""No docker inspect, history or push-stream key is read outside ``engine/kinds/`` (issue 32: 2).

Each engine kind parses what its engine prints once (engine/kinds/docker_format.py for docker's
`image inspect` and history; podman.py converts podman's to it) into ``ImageInfo`` and
``HistoryEntry``; generic code reads their fields. Read with ast, so nothing is imported: a str
constant equal to one of the keys below, anywhere in buildkit_py outside engine/kinds/, is
reported (``Labels``, ``Env``, ``Entrypoint`` and ``Cmd`` are the OCI image config's own keys,
which the registry's config blob has too, so they are allowed)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "buildkit_py"
KINDS = PACKAGE / "engine" / "kinds"
# `docker image inspect`'s and the history API's own keys, and the docker push stream's (read in
# engine/kinds/docker_push.py; a table's title may say Layers, so that one is left out).
DOCKER_KEYS = frozenset({"Id", "Config", "ContainerConfig", "RepoDigests", "RepoTags", "RootFS", "GraphDriver",
                         "Os", "Architecture", "Variant", "Created", "CreatedBy", "Comment", "DockerVersion",
                         "aux", "Digest", "Size", "progressDetail", "errorDetail"})


def docker_keys_outside_kinds(package: Path, kinds: Path) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.is_relative_to(kinds):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in DOCKER_KEYS:
                found.append(f"{path.relative_to(package.parent)}:{node.lineno}: {node.value!r}")
    return found


def test_no_docker_key_outside_the_engine_kinds():
    found = docker_keys_outside_kinds(PACKAGE, KINDS)
    assert not found, "read ImageInfo / HistoryEntry fields instead (engine/base.py):\n" + "\n".join(found)


def test_the_check_can_fail(tmp_path):
    package = tmp_path / "buildkit_py"
    (package / "engine" / "kinds").mkdir(parents=True)
    (package / "engine" / "kinds" / "x.py").write_text('ID = attrs["Id"]\n')  # the kinds may
    (package / "analysis").mkdir()
    (package / "analysis" / "y.py").write_text('labels = attrs.get("Config") or {}\nok = config.get("Labels")\n')
    assert docker_keys_outside_kinds(package, package / "engine" / "kinds") == [
        "buildkit_py/analysis/y.py:1: 'Config'"]
