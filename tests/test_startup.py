"""Start-up stays cheap: the CLI module must not import the heavy libraries before a command
needs them (issue 12: `--version`/`--help` within 4x of a bare interpreter; the timing itself is
measured in `make bench`, this test pins the cause)."""

import importlib
import subprocess
import sys

import pytest

HEAVY = ("docker", "jinja2", "rich", "yaml", "requests", "urllib3", "oras", "jsonschema", "packaging",
         "dataclasses", "secrets", "hashlib")  # secrets: hmac + hashlib + random, ~10 ms of a 40 ms start


@pytest.mark.parametrize("argv", [["--version"], ["--help"]])
def test_cli_start_imports_no_heavy_module(argv):
    code = (
        "import sys, runpy\n"
        f"sys.argv = ['imgbuild', *{argv!r}]\n"
        "try:\n    runpy.run_module('buildkit_py', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print('\\n'.join(sorted(sys.modules)), file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = {name.split(".")[0] for name in proc.stderr.split()}
    assert "buildkit_py" in loaded
    assert sorted(loaded & set(HEAVY)) == []


def _modules_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {name.split(".")[0] for name in proc.stdout.split()}


@pytest.mark.parametrize("statement", [
    "import buildkit_py.plan.build_plan",  # image references are checked while planning
    "from buildkit_py.oci import parse_reference",
    "import buildkit_py.oci.auth",
])
def test_reference_grammar_and_credentials_do_not_load_the_http_stack(statement):
    """buildkit_py.oci loads each name from its module on first use: the plan and the CLI's
    argument checks need the reference grammar, not requests."""
    assert sorted(_modules_after(statement) & {"requests", "urllib3", "docker"}) == []


def test_oci_package_exports_resolve_to_their_modules():
    from buildkit_py import oci
    from buildkit_py.oci import transport

    assert sorted(oci.__all__) == sorted(oci._HOME)
    for name in oci.__all__:
        assert getattr(oci, name) is getattr(importlib.import_module(f"buildkit_py.oci.{oci._HOME[name]}"), name)
    assert oci.Client is transport.Client
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = oci.no_such_name
