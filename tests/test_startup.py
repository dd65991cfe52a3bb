"""Start-up stays cheap: the CLI module must not import the heavy libraries before a command
needs them (issue 12: `--version`/`--help` within 4x of a bare interpreter; the timing itself is
measured in `make bench`, this test pins the cause)."""

import subprocess
import sys

import pytest

HEAVY = ("docker", "jinja2", "rich", "yaml", "requests", "urllib3", "oras", "jsonschema", "packaging",
         "dataclasses")


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
