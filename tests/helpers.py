"""Small helpers shared by test modules (fixtures live in conftest.py)."""

from __future__ import annotations

import io
from pathlib import Path

from buildkit_py.cli.main import main

REPO = Path(__file__).resolve().parent.parent
SYSTEM_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# Builds here reach PyPI through a proxy whose CA only the system bundle has (environment.md).
CA_ARGS = ["--ca-cert", str(SYSTEM_CA)] if SYSTEM_CA.exists() else []


def write_recipe(folder: Path, text: str, name: str = "recipe.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def run_cli(*argv: str, stdin: str = "") -> tuple[int, str, str]:
    """Run the CLI in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err, stdin=io.StringIO(stdin))
    return code, out.getvalue(), err.getvalue()
