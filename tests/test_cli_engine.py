"""--engine is one option (issue 32: 4): every command that uses an engine takes it, with the
engine registry's kinds as its choices, and it means the same on each: the engine the command
uses (else $IMGBUILD_ENGINE, else auto). `build --engine podman` worked while `run --engine
podman` was refused: only $IMGBUILD_ENGINE reached run, inspect, diff, check, lock and sbom."""

import ast
import inspect
import io
import textwrap

import pytest
from helpers import REPO, run_cli

from buildkit_py import engine as engine_pkg
from buildkit_py.cli.main import COMMANDS, _build_parser
from buildkit_py.engine.registry import kind_names
from buildkit_py.errors import EnvironmentProblem

DEMO = str(REPO / "recipes" / "demo.yaml")
IMAGE = "127.0.0.1:1/team/app:1"  # nothing listens there: no command gets past choosing its engine
# Each command that uses an engine, with arguments that take it to where it chooses one.
ENGINE_COMMANDS = {
    "build": [DEMO],
    "test": [IMAGE],
    "run": [IMAGE, "--dry-run"],
    "inspect": [IMAGE],
    "diff": [IMAGE, IMAGE],
    "check": [IMAGE, "--driver", "550.54.15"],
    "lock": [DEMO],
    "sbom": [IMAGE, "--generate"],
}
# What a handler calls to get its engine (cli/common.py, engine/select.py).
CHOOSES_ENGINE = {"reading_engine", "select_engine", "engine_for_reading"}


def _calls(function, seen: set[str]) -> set[str]:
    """The names ``function`` calls, and those its module's own functions that it calls do, in turn."""
    module = inspect.getmodule(function)
    names: set[str] = set()
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(function)))):
        if isinstance(node, ast.Call):
            callee = node.func
            names.add(callee.id if isinstance(callee, ast.Name) else getattr(callee, "attr", ""))
    for name in names - seen:
        seen.add(name)
        local = getattr(module, name, None)
        if inspect.isfunction(local) and local.__module__ == module.__name__:
            names |= _calls(local, seen)
    return names


def _command_parser(name: str):
    parser = _build_parser(io.StringIO(), [name])
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[name]


def test_the_commands_that_choose_an_engine_are_those_listed():
    """A command whose handler reaches an engine (reading_engine, select_engine) is in
    ENGINE_COMMANDS, so the tests below hold it to --engine; one that reaches none is not."""
    using = {name for name in COMMANDS
             if _calls(_command_parser(name).get_default("handler"), set()) & CHOOSES_ENGINE}
    assert using == set(ENGINE_COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_engine_option_is_on_the_commands_that_use_an_engine(name):
    options = {o for a in _command_parser(name)._actions for o in a.option_strings}
    assert ("--engine" in options) == (name in ENGINE_COMMANDS), name


@pytest.mark.parametrize("kind", kind_names())
@pytest.mark.parametrize("name", ENGINE_COMMANDS)
def test_every_engine_command_takes_every_registered_kind(name, kind):
    args = _build_parser(io.StringIO(), [name]).parse_args([name, *ENGINE_COMMANDS[name], "--engine", kind])
    assert args.engine == kind


@pytest.mark.parametrize("name", ENGINE_COMMANDS)
def test_engine_option_has_one_set_of_choices_and_one_help(name):
    from buildkit_py.engine.registry import kinds_help

    engine = next(a for a in _command_parser(name)._actions if "--engine" in a.option_strings)
    assert list(engine.choices) == kind_names()
    parser = _command_parser(name)
    parser.formatter_class = lambda prog: __import__("argparse").HelpFormatter(prog, width=10_000)
    text = parser.format_help()
    assert f"--engine {{{','.join(kind_names())}}}" in text
    assert f"{kinds_help()}; also $IMGBUILD_ENGINE" in text
    code, _, err = run_cli(name, *ENGINE_COMMANDS[name], "--engine", "nosuch")
    assert code == 2
    assert f"{name}: argument --engine: invalid choice: 'nosuch' (choose from " in err


@pytest.mark.parametrize("name", ENGINE_COMMANDS)
def test_engine_option_chooses_the_engine_of_every_command(name, monkeypatch):
    """--engine reaches the engine's choice as build's does, over $IMGBUILD_ENGINE: the choice is
    stopped there, before any engine is reached."""
    chosen = []

    def choose(preference=None, **_):
        chosen.append(preference)
        raise EnvironmentProblem("chosen")

    monkeypatch.setattr(engine_pkg, "engine_for_reading", choose)
    monkeypatch.setattr(engine_pkg, "select_engine", choose)
    monkeypatch.setenv("IMGBUILD_ENGINE", "docker")
    monkeypatch.setenv("IMGBUILD_OFFLINE", "1")
    code, _, err = run_cli(name, *ENGINE_COMMANDS[name], "--engine", "podman")
    assert (code, chosen[:1]) == (3, ["podman"]), err


def test_sbom_takes_engine_only_where_it_reads_an_image():
    code, _, err = run_cli("sbom", IMAGE, "--engine", "podman")
    assert code == 2
    assert "--engine goes with --generate" in err


def test_engine_kinds_are_read_only_when_needed():
    """The registry (every engine module) is not read to build a parser: a command that needs no
    engine this time (check --cuda, sbom IMAGE) does not import them."""
    import subprocess
    import sys

    code = ("import sys\nfrom buildkit_py.cli.main import main\n"
            "main(['check', '--cuda', '12.4', '--driver', '550.54.15'])\n"
            "print(sorted(m for m in sys.modules if m.startswith('buildkit_py.engine')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert proc.stdout.splitlines()[-1] == "[]"
