"""Start-up stays cheap: the CLI module must not import the heavy libraries before a command
needs them (issue 12; issue 32: `--version`/`--help` within 3x of a bare interpreter; the timing
itself is measured in `make bench` (bench/bench_startup.py), these tests pin the cause)."""

import importlib
import subprocess
import sys

import pytest

HEAVY = ("docker", "jinja2", "rich", "yaml", "requests", "urllib3", "oras", "jsonschema", "packaging",
         "dataclasses", "secrets", "hashlib",  # secrets: hmac + hashlib + random, ~10 ms of a 40 ms start
         "cyclonedx", "packageurl")  # the SBOM's library: `imgbuild sbom` and `build --push` only


def _modules_at_start(argv: list[str]) -> list[str]:
    """The modules `imgbuild ARGV` has loaded when it exits, in a fresh interpreter."""
    code = (
        "import sys, runpy\n"
        f"sys.argv = ['imgbuild', *{argv!r}]\n"
        "try:\n    runpy.run_module('buildkit_py', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print('\\n'.join(sorted(sys.modules)), file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return proc.stderr.split()


@pytest.mark.parametrize("argv", [["--version"], ["--help"]])
def test_cli_start_imports_no_heavy_module(argv):
    loaded = {name.split(".")[0] for name in _modules_at_start(argv)}
    assert "buildkit_py" in loaded
    assert sorted(loaded & set(HEAVY)) == []


# What a start needs before imgbuild runs: the interpreter, `-m` (runpy) and argparse, with what
# argparse loads to format help (textwrap; locale, through gettext). The width is given, as cli/main.py
# gives it: argparse would import shutil for it (and shutil bz2, lzma and zlib).
_ARGPARSE_HELP = (
    "import runpy, argparse\n"
    "fmt = lambda prog: argparse.HelpFormatter(prog, width=78)\n"
    "p = argparse.ArgumentParser(prog='x', formatter_class=fmt)\n"
    "p.add_argument('--flag', help='some help text')\n"
    "p.add_subparsers(metavar='C').add_parser('c', help='h', formatter_class=fmt)\n"
    "p.format_help()\n"
)


@pytest.mark.parametrize("argv", [["--version"], ["--help"]])
def test_cli_start_loads_nothing_beyond_argparse(argv):
    """Issue 32: `--version` and `--help` load cli/main.py and what argparse needs, nothing more: not
    the errors module (nor typing, which it needs), signal or threading (they load when a command
    runs), nor shutil. Each was 1 to 2 ms of a start that must stay within 3x of `python -c pass`."""
    base = {name for name in _modules_after(_ARGPARSE_HELP, whole=True)}
    extra = set(_modules_at_start(argv)) - base
    assert extra == {"buildkit_py", "buildkit_py.cli", "buildkit_py.cli.main", "__future__"}


def _modules_after(statement: str, *, whole: bool = False) -> set[str]:
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {name if whole else name.split(".")[0] for name in proc.stdout.split()}


@pytest.mark.parametrize("statement", [
    "import buildkit_py.plan.build_plan",  # image references are checked while planning
    "from buildkit_py.oci import parse_reference",
    "import buildkit_py.oci.auth",
])
def test_reference_grammar_and_credentials_do_not_load_the_http_stack(statement):
    """buildkit_py.oci loads each name from its module on first use: the plan and the CLI's
    argument checks need the reference grammar, not requests."""
    assert sorted(_modules_after(statement) & {"requests", "urllib3", "docker"}) == []


def test_reading_the_engine_registry_loads_no_heavy_module():
    """--engine's choices and help (any command's --help that lists them, any --engine VALUE) read
    the registry, which imports every engine kind: those import requests, yaml and the recipe
    model where they use them, not at import (issue 32: `build --help` was 22x a bare interpreter)."""
    read = "from buildkit_py.engine import registry\nregistry.kinds_help(); registry.kind_names()"
    assert "buildkit_py.engine.kinds.podman" in _modules_after(read, whole=True)  # every kind was imported
    loaded = _modules_after(read)
    assert sorted(loaded & (set(HEAVY) - {"dataclasses"})) == []  # the engines' requests and results are dataclasses


def test_oci_package_exports_resolve_to_their_modules():
    from buildkit_py import oci
    from buildkit_py.oci import transport

    assert sorted(oci.__all__) == sorted(oci._HOME)
    for name in oci.__all__:
        assert getattr(oci, name) is getattr(importlib.import_module(oci.module_of(name)), name)
    assert oci.Client is transport.Client
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = oci.no_such_name


@pytest.mark.parametrize("argv", [["--version"], ["--help"]])
def test_cli_start_imports_no_command_module(argv):
    """`--help` lists the commands from cli/main.py's COMMANDS; their modules (and what those
    import: pathlib, json, the shared option groups) load only for the invoked command."""
    loaded = {name for name in _modules_at_start(argv) if name.startswith("buildkit_py.cli.")}
    assert loaded == {"buildkit_py.cli.main"}


def test_command_table_names_every_register_function_once():
    """COMMANDS is the one list of commands: each register function of a command module is in it
    exactly once, and registers the command it is listed under (with its handler)."""
    import inspect as pyinspect
    import io
    import pkgutil

    import buildkit_py.cli
    from buildkit_py.cli.main import COMMANDS, _build_parser

    listed = [where for _, where in COMMANDS.values()]
    found = []
    for info in pkgutil.iter_modules(buildkit_py.cli.__path__):
        module = importlib.import_module(f"buildkit_py.cli.{info.name}")
        found += [f"{info.name}:{name}" for name, fn in pyinspect.getmembers(module, pyinspect.isfunction)
                  if name.startswith("register") and fn.__module__ == module.__name__]
    assert sorted(listed) == sorted(found)
    for name in COMMANDS:
        parser = _build_parser(io.StringIO(), [name])
        sub = next(a for a in parser._actions if a.dest == "command")
        assert callable(sub.choices[name].get_default("handler")), name
        others = [n for n, p in sub.choices.items() if n != name and p is not None]  # listed, never built
        assert others == [], f"registering {name} also registered {others}"


def test_help_lists_every_command_with_its_summary():
    from helpers import run_cli

    from buildkit_py.cli.main import COMMANDS

    code, out, _ = run_cli("--help")
    assert code == 0
    flat = " ".join(out.split())
    for name, (summary, _) in COMMANDS.items():
        assert f"{name} {' '.join(summary.split())}" in flat, name
