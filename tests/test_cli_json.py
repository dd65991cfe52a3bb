"""The --json contract, over every command that prints data: one JSON document on stdout with
"schema": 1 first; on failure, when JSON was asked for (by the parsed arguments), an error
document with schema, error type, message, hint and exit code, and that exit code returned.

Success paths that need an engine or the registry (build, inspect, diff, mirror, weights, lock)
are checked by the E2E tests, which parse these documents; here each fails on purpose."""

import argparse
import json

import pytest
from helpers import REPO, run_cli, write_recipe

from buildkit_py.cli.main import _build_parser

DEMO = str(REPO / "recipes" / "demo.yaml")
MATRIX = str(REPO / "recipes" / "matrix.yaml")
NOWHERE = "127.0.0.1:1"  # nothing listens there: registry and index unreachable (exit 3)


def _document(out: str) -> dict:
    assert out.lstrip().startswith('{\n  "schema": 1,'), out[:200]  # "schema" first, at the top
    doc = json.loads(out)
    assert doc["schema"] == 1
    return doc


def _leaf_commands(parser: argparse.ArgumentParser, prefix=()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
        return
    for name, sub in subs[0].choices.items():
        yield from _leaf_commands(sub, (*prefix, name))


def test_every_command_that_prints_data_takes_json():
    import io

    from buildkit_py.cli.main import COMMANDS

    commands = dict(_leaf_commands(_build_parser(io.StringIO(), list(COMMANDS))))
    # schema prints the recipe's JSON Schema: already a JSON document of its own (not the contract)
    assert set(commands) - {("schema",)}
    for name, parser in commands.items():
        options = {o for a in parser._actions for o in a.option_strings}
        assert ("--json" in options) == (name != ("schema",)), name


@pytest.mark.parametrize("argv", [
    ["plan", DEMO, "--json"],
    ["render", DEMO, "--json"],
    ["compose", DEMO, "--json"],
    ["lint", DEMO, "--no-hadolint", "--json"],
    ["matrix", MATRIX, "--json"],
    ["matrix", MATRIX, "--format", "json"],
    ["check", "--cuda", "12.4", "--driver", "550.54.15", "--json"],
    ["check", DEMO, "--driver", "550.54.15", "--json"],
    ["data", "status", "--json"],
    ["run", DEMO, "--dry-run", "--json", "--gpus", "none"],
])
def test_success_documents_carry_the_schema(argv):
    code, out, _ = run_cli(*argv)
    assert code == 0
    doc = _document(out)
    assert "error" not in doc and len(doc) > 1


def test_matrix_format_json_is_the_json_document():
    assert run_cli("matrix", MATRIX, "--json")[1] == run_cli("matrix", MATRIX, "--format", "json")[1]


def test_render_json_holds_the_dockerfile_text(tmp_path):
    _, text, _ = run_cli("render", DEMO)
    code, out, _ = run_cli("render", DEMO, "--json", "-o", str(tmp_path / "Dockerfile"))
    doc = _document(out)
    assert code == 0 and doc["dockerfile"] == text == (tmp_path / "Dockerfile").read_text()
    assert doc["output"] == str(tmp_path / "Dockerfile") and doc["tags"]


def test_compose_json_is_the_compose_document():
    import yaml

    _, text, _ = run_cli("compose", DEMO)
    doc = _document(run_cli("compose", DEMO, "--json")[1])
    assert doc["compose"] == yaml.safe_load(text) and doc["image"] == doc["compose"]["services"]["app"]["image"]


def _bad_recipe(tmp_path):
    return str(write_recipe(tmp_path, "name: team/x\ncuda: {version: '12.4'}\npython: 3\n"))


@pytest.mark.parametrize(("argv", "error", "exit_code"), [
    (["plan", "{bad}", "--json"], "RecipeError", 2),
    (["render", "{bad}", "--json"], "RecipeError", 2),
    (["compose", "{bad}", "--json"], "RecipeError", 2),
    (["lint", "{missing}", "--json"], "RecipeError", 2),
    (["build", "{bad}", "--json"], "RecipeError", 2),
    (["lock", "{missing}", "--json"], "RecipeError", 2),
    (["matrix", "{bad}", "--format", "json"], "RecipeError", 2),  # JSON asked for without the --json token
    (["matrix", MATRIX, "--json", "--format", "bake"], "UsageError", 2),
    (["check", "--json"], "UsageError", 2),
    (["check", "--cuda", "12.4", "--driver", "x.y", "--json"], "UsageError", 2),
    (["run", DEMO, "--json"], "UsageError", 2),
    (["login", NOWHERE, "-u", "ci", "--json"], "UsageError", 2),
    (["plan", "--json", "--bogus"], "UsageError", 2),  # did not parse: the tokens decide
    (["inspect", "no-such-image:1", "--json"], "EnvironmentProblem", 3),
    (["diff", f"{NOWHERE}/a:1", f"{NOWHERE}/b:1", "--source", "registry", "--json"], "RegistryUnreachable", 3),
    (["mirror", f"{NOWHERE}/a:1", f"{NOWHERE}/b:1", "--json"], "RegistryUnreachable", 3),
    (["weights", "ls", f"{NOWHERE}/w:1", "--json"], "RegistryUnreachable", 3),
    (["weights", "pull", f"{NOWHERE}/w:1", "{dir}", "--json"], "RegistryUnreachable", 3),
    (["weights", "push", "{dir}", f"{NOWHERE}/w:1", "--json"], "RegistryUnreachable", 3),
    (["data", "refresh", "--index-url", f"http://{NOWHERE}/simple", "--json"], "PackageIndexError", 3),
])
def test_errors_are_json_when_json_was_asked_for(tmp_path, monkeypatch, argv, error, exit_code):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")  # inspect: no engine (exit 3)
    monkeypatch.setattr("buildkit_py.oci.transport.RetryPolicy.delay", lambda *_a, **_k: 0.0)  # refused at once
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "model.bin").write_bytes(b"weights")
    fill = {"{bad}": _bad_recipe(tmp_path), "{missing}": str(tmp_path / "missing.yaml"), "{dir}": str(tmp_path / "w")}
    code, out, err = run_cli(*[fill.get(a, a) for a in argv])
    doc = _document(out)
    assert code == exit_code == doc["exit_code"]
    assert doc["error"] == error and doc["message"] and "hint" in doc
    assert doc["message"].splitlines()[0] in err  # the human message still goes to stderr
    assert "Traceback" not in err


def test_json_decided_by_the_parsed_arguments_not_the_token(tmp_path):
    # "--json" here is the value of --tag: JSON was not asked for, so the error is text only.
    code, out, err = run_cli("plan", _bad_recipe(tmp_path), "--tag=--json")
    assert code == 2 and out == "" and "imgbuild: error:" in err


def test_internal_error_is_json_too(monkeypatch):
    def boom(*_args, **_kwargs):
        raise RuntimeError("a bug")

    monkeypatch.delenv("IMGBUILD_DEBUG", raising=False)
    monkeypatch.setattr("buildkit_py.cli.recipe.plan_recipe", boom)
    code, out, err = run_cli("plan", DEMO, "--json")
    doc = _document(out)
    assert code == 1 == doc["exit_code"] and doc["error"] == "InternalError" and "a bug" in doc["message"]
    assert "IMGBUILD_DEBUG" in doc["hint"] and "internal error" in err
