"""Usage errors a new user hits: exit 2, one clear message, no traceback, nothing half-written."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, run_cli, write_recipe

from buildkit_py.errors import UsageError

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


def test_check_missing_driver_value_is_usage_error():
    code, out, err = run_cli("check", "--cuda", "12.4", "--driver", "")
    _usage(code, out, err)
    assert "--driver ''" in err and out == ""


@pytest.mark.parametrize("command", [["inspect", "no-such-image:1"], ["diff", "no-such-a:1", "no-such-b:1"]])
@pytest.mark.parametrize("option", ["--bandwidth", "--unpack-rate"])
@pytest.mark.parametrize("value", ["0", "-5", "nan", "fast"])
def test_rates_must_be_positive_numbers(command, option, value):
    code, out, err = run_cli(*command, option, value)
    _usage(code, out, err)
    assert f"argument {option}:" in err and "reading" not in err  # refused before any work


def test_jobs_zero_without_all():
    code, out, err = run_cli("build", DEMO, "-j", "0")
    _usage(code, out, err)
    assert "at least 1" in err


def test_jobs_without_all_is_refused():
    code, out, err = run_cli("build", DEMO, "-j", "2")
    _usage(code, out, err)
    assert "--all" in err


@pytest.mark.parametrize("args", [["--variant", "nope"], ["--all", "-j", "0"]])
def test_matrix_build_options_checked_before_any_output(args):
    code, out, err = run_cli("build", DEMO, *args)
    _usage(code, out, err)
    assert err.startswith("imgbuild: error:")  # no "building ..." line before it
    assert out == ""


def test_check_image_missing_from_registry_has_hint(registry, docker_config, monkeypatch):
    monkeypatch.setenv("IMGBUILD_REGISTRY_USER", registry.user)
    monkeypatch.setenv("IMGBUILD_REGISTRY_PASSWORD", registry.password)
    code, out, err = run_cli("check", f"{registry.address}/imgbuild-test/missing:1", "--driver", "550.54.15")
    _usage(code, out, err)
    assert "no image" in err and "hint:" in err


def test_run_of_unbuilt_recipe_refuses_before_pulling_weights(tmp_path, docker_client, unique_name):
    # The weights live on a registry that does not exist: pulling them first would exit 3.
    recipe = write_recipe(tmp_path, f"name: {unique_name}\nversion: '1'\ncuda: {{version: '12.4'}}\n"
                                    "python: '3.11'\nweights:\n  - {ref: '127.0.0.1:9/none/w:1', mount: /models}\n")
    code, out, err = run_cli("run", str(recipe), "--weights-dir", str(tmp_path / "w"), "--", "true")
    _usage(code, out, err)
    assert "is not built" in err and f"imgbuild build {recipe}" in err
    assert not (tmp_path / "w").exists()


def test_lock_of_a_matrix_with_every_variant_dropped(tmp_path):
    # debian:bookworm ships only Python 3.11: both variants are dropped
    path = write_recipe(tmp_path, "name: team/mx\nversion: '1'\ncuda: {version: '12.4', source: wheels}\n"
                                  "base: {image: debian:bookworm-slim}\npython: '3.11'\n"
                                  "matrix:\n  python: ['3.10', '3.12']\n")
    code, out, err = run_cli("lock", str(path))
    _usage(code, out, err)
    assert "every variant was dropped" in err
    assert "variant py310 dropped:" in err and "variant py312 dropped:" in err
    assert not path.with_suffix(".lock").exists()


BAD_TAG = (["--tag", "Bad Tag"], "--tag: 'Bad Tag' is not a valid image reference")
SCHEME = (["--registry", "http://127.0.0.1:5055/"],
          "--registry 'http://127.0.0.1:5055/': write the host without a scheme")
NO_HOST = (["--registry", "myreg"], "--registry 'myreg' is not a registry host")
# issue 22: 12: it silently became the repository 1.2
VERSION_TAG = (["--tag", "1.2"], "--tag 1.2: a tag names the whole image (REPOSITORY:TAG, as in docker build -t), "
                                 "so this would be the repository '1.2'")
# issue 31: 5: any bare word did the same (--tag latest became the repository latest), unlike 1.2
BARE_TAG = (["--tag", "latest"], "--tag latest: a tag names the whole image (REPOSITORY:TAG, as in docker build -t), "
                                 "so this would be the repository 'latest' (tagged latest), not the tag latest of ")


@pytest.mark.parametrize(("command", "case"),
                         [(c, t) for c in ("plan", "compose", "build")
                          for t in (BAD_TAG, SCHEME, NO_HOST, VERSION_TAG, BARE_TAG)]
                         + [("matrix", SCHEME), ("matrix", NO_HOST)])
def test_tags_and_registry_checked_for_every_command(command, case):
    args, blamed = case
    code, out, err = run_cli(command, DEMO, *args)
    _usage(code, out, err)
    assert blamed in err and out == ""


@pytest.mark.parametrize(("tag", "refused"), [
    ("1.2", True), ("v2.0.1", True), ("1.2-rc1", True), ("2", True), ("1.2.3+cu124", True),
    # issue 31: 5: every bare word, as a version was: docker would make each a repository
    ("latest", True), ("dev", True), ("trainer", True), ("cuda-hello", True),
    ("team/x:1.2", False), ("127.0.0.1:5000/team/x:1.2", False), ("v2-trainer:1", False), ("trainer:latest", False),
    ("team/trainer", False), ("localhost:5000/x", False),
])
def test_a_bare_word_is_refused_as_a_tag(tag, refused):
    from buildkit_py.plan.build_plan import default_tags
    from buildkit_py.recipe.model import load_recipe

    recipe = load_recipe(Path(DEMO))
    if refused:
        with pytest.raises(UsageError, match=f"--tag {re.escape(tag)}: a tag names the whole image") as err:
            default_tags(recipe, extra=(tag,))
        assert err.value.hint.startswith(f"give the name too: --tag demo/cuda-hello:{tag}")
        # a word that is no version may also have meant an image of that name: the hint spells both
        assert (f"--tag {tag}:latest for an image named {tag}" in err.value.hint) != bool(re.match(r"v?\d", tag))
        with pytest.raises(UsageError):  # the same under --registry: the word is still bare
            default_tags(recipe, "127.0.0.1:5000", extra=(tag,))
    else:
        assert default_tags(recipe, extra=(tag,)) == (tag,)


def test_registry_with_trailing_slash_and_path_is_fine():
    from buildkit_py.plan.build_plan import check_registry

    assert check_registry("127.0.0.1:5055/") == "127.0.0.1:5055"
    assert check_registry("ghcr.io/team") == "ghcr.io/team"
    assert check_registry("localhost:5000") == "localhost:5000"


def test_build_does_not_blame_a_tag_never_given():
    code, out, err = run_cli("build", DEMO, "--registry", "http://x:5/")
    _usage(code, out, err)
    assert "--tag" not in err


def test_a_reader_that_goes_away_is_no_internal_error():
    """`imgbuild plan ... | head -3`: the pipe closes under a write; imgbuild stops quietly with
    SIGPIPE's status instead of reporting an internal error."""
    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # the reader is gone before the first write
    proc = subprocess.run([sys.executable, "-m", "buildkit_py", "render", str(REPO / "recipes" / "demo.yaml")],
                          stdout=write_fd, stderr=subprocess.PIPE, text=True, timeout=60)
    os.close(write_fd)
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr == ""
