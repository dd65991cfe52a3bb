"""Usage errors a new user hits: exit 2, one clear message, no traceback, nothing half-written."""

import pytest

from helpers import REPO, run_cli, write_recipe

DEMO = str(REPO / "recipes" / "demo.yaml")


def _usage(code, out, err):
    assert code == 2, err
    assert "internal error" not in err and "Traceback" not in err
    assert err.count("imgbuild: error:") == 1


@pytest.mark.parametrize("command", ["render", "compose"])
def test_output_into_missing_folder(tmp_path, command):
    code, out, err = run_cli(command, DEMO, "-o", str(tmp_path / "missing" / "out"))
    _usage(code, out, err)
    assert "does not exist" in err and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["render", "compose"])
def test_output_onto_a_directory(tmp_path, command):
    (tmp_path / "d").mkdir()
    code, out, err = run_cli(command, DEMO, "-o", str(tmp_path / "d"))
    _usage(code, out, err)
    assert "is a directory" in err
    assert [p.name for p in tmp_path.iterdir()] == ["d"]


def test_weights_pull_onto_a_file(tmp_path):
    target = tmp_path / "file"
    target.write_text("keep")
    code, out, err = run_cli("weights", "pull", "127.0.0.1:9/none/x:1", str(target))
    _usage(code, out, err)
    assert "not a directory" in err and target.read_text() == "keep"


def test_weights_push_missing_dir(tmp_path):
    code, out, err = run_cli("weights", "push", str(tmp_path / "nope"), "127.0.0.1:9/none/x:1")
    _usage(code, out, err)
    assert "does not exist" in err


def test_password_on_argv_is_refused_with_one_prefix(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    code, out, err = run_cli("login", "127.0.0.1:5999", "-u", "ci", "--password", "x")
    _usage(code, out, err)
    assert "imgbuild: error: imgbuild:" not in err
    assert "--password is not accepted" in err and "--password-stdin" in err
    assert list(tmp_path.iterdir()) == []


def test_no_abbreviations_on_any_parser():
    # --password-std would have matched --password-stdin; --no-cach would have matched --no-cache
    code, out, err = run_cli("login", "127.0.0.1:5999", "-u", "ci", "--password-std")
    _usage(code, out, err)
    assert err.startswith("imgbuild: error: unrecognized arguments: --password-std\n")
    code, out, err = run_cli("build", DEMO, "--no-cach")
    _usage(code, out, err)


def test_subcommand_error_names_the_subcommand_once():
    code, out, err = run_cli("render")
    _usage(code, out, err)
    assert err.startswith("imgbuild: error: render: the following arguments are required: recipe\n")
