"""Rendering: golden Dockerfiles per example recipe, determinism, quoting, lint and parse."""

import json
import os
import subprocess
import sys

import dockerfile
import pytest
from helpers import REPO, plan_of, write_recipe

from buildkit_py.recipe.model import load_recipe
from buildkit_py.render.dockerfile import (
    dockerfile_string,
    exec_form,
    render_dockerfile,
    shell_word,
)

GOLDEN = REPO / "tests" / "golden"
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


def rendered(path) -> str:
    return render_dockerfile(plan_of(load_recipe(path)))


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_golden(recipe):
    golden = GOLDEN / f"{recipe.stem}.Dockerfile"
    text = rendered(recipe)
    if UPDATE:
        golden.write_text(text)
    assert golden.exists(), f"no golden file: run `make golden` to create {golden.name}"
    assert text == golden.read_text(), f"{recipe.name} renders differently from {golden.name} (`make golden` if intended)"  # noqa: E501


# Renders every recipe (Dockerfile and plan JSON, keys in the order written) in a fresh interpreter.
_RENDER_ALL = """
import datetime, json, sys
from buildkit_py.pipeline import plan_from_data
from buildkit_py.plan.build_plan import plan_json
from buildkit_py.recipe.model import load_recipe
from buildkit_py.render.dockerfile import render_dockerfile
out = {}
for path in sys.argv[1:]:
    plan = plan_from_data(load_recipe(path), today=datetime.date(2026, 12, 5))
    out[path] = json.dumps(plan_json(plan, render_dockerfile(plan)))
print(json.dumps(out))
"""


def test_render_is_deterministic_across_processes():
    """Same recipe, same bytes: in separate interpreters whose str hashes (set and dict-of-set
    order) differ. Two renders in one process would share one hash seed and prove nothing."""
    runs = {}
    for seed in ("0", "1", "4242"):
        proc = subprocess.run([sys.executable, "-c", _RENDER_ALL, *map(str, RECIPES)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)})
        assert proc.returncode == 0, proc.stderr
        runs[seed] = json.loads(proc.stdout)
    assert set(runs["0"]) == set(map(str, RECIPES))
    assert runs["0"] == runs["1"] == runs["4242"]
    # and the same as this process renders
    assert {p: json.loads(v)["dockerfile"] for p, v in runs["0"].items()} == {str(p): rendered(p) for p in RECIPES}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_hadolint_no_errors(recipe, tmp_path, hadolint):
    path = tmp_path / "Dockerfile"
    path.write_text(rendered(recipe))
    out = subprocess.run([hadolint, "--no-color", "--format", "json", "--failure-threshold", "error", str(path)],
                         capture_output=True, text=True)
    findings = json.loads(out.stdout)
    errors = [f for f in findings if f["level"] == "error"]
    assert not errors, errors
    assert out.returncode == 0


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_buildkit_parser_reads_the_plan(recipe):
    """BuildKit's own parser sees exactly the instructions the plan intends."""
    plan = plan_of(load_recipe(recipe))
    commands = dockerfile.parse_string(render_dockerfile(plan))
    froms = [c for c in commands if c.cmd == "FROM"]
    assert [c.value[-1] for c in froms] == [s.name for s in plan.stages]
    runs = [c for c in commands if c.cmd == "RUN"]
    marks = [c.original.split("imgbuild-step=")[1].split(";")[0] for c in runs]
    expected = [st.id for s in plan.stages for st in s.steps if st.is_run]
    assert marks == expected
    label = [c for c in commands if c.cmd == "LABEL"][0]
    pairs = dict(zip(label.value[0::2], label.value[1::2], strict=False))
    assert {unquote(k): unquote(v) for k, v in pairs.items()} == plan.labels


def unquote(word: str) -> str:
    """What BuildKit makes of a double-quoted Dockerfile word."""
    assert word.startswith('"') and word.endswith('"'), word
    out, chars = [], iter(word[1:-1])
    for c in chars:
        out.append(next(chars) if c == "\\" else c)
    return "".join(out)


def test_step_order_follows_change_frequency(tmp_path):
    (tmp_path / "app").mkdir()
    path = write_recipe(tmp_path, """\
name: team/x
cuda: {version: "12.4", source: wheels}
base: {image: debian:bookworm-slim}
python: "3.11"
torch: "2.5.1"
pip: [requests==2.32.3, bitsandbytes==0.44.1]
apt: [git]
copy: [{src: app/, dest: /app}]
""")
    plan = plan_of(load_recipe(path))
    ids = [s.id for s in plan.final.steps]
    assert ids == ["os", "python", "mount-stubs", "cuda", "cuda-libs", "cuda-cublas", "cuda-cudnn", "cuda-cufft",
                   "cuda-cusolver", "cuda-cusparse", "cuda-nccl", "cuda-path", "torch-triton", "torch",
                   "heavy-bitsandbytes", "pins", "ldconfig", "copy-0", "meta"]


@pytest.mark.parametrize(("value", "expected"), [
    ("plain", "plain"), ("a b", "'a b'"), ("$(id)", "'$(id)'"), ("it's", "'it'\"'\"'s'"), ("x\\", "'x\\'"),
])
def test_shell_word(value, expected):
    assert shell_word(value) == expected


@pytest.mark.parametrize(("value", "expected"), [
    ("v", '"v"'), ('a"b', '"a\\"b"'), ("$HOME", '"\\$HOME"'), ("c:\\x", '"c:\\\\x"'),
])
def test_dockerfile_string(value, expected):
    assert dockerfile_string(value) == expected


def test_dockerfile_string_refuses_newlines():
    with pytest.raises(ValueError):  # noqa: PT011
        dockerfile_string("a\nRUN evil")


def test_exec_form_is_json():
    assert exec_form(["python", "-c", 'print("hi")']) == '["python", "-c", "print(\\"hi\\")"]'


def test_hostile_env_and_labels_stay_values(tmp_path):
    path = write_recipe(tmp_path, """\
name: team/x
cuda: {version: "12.4", source: wheels}
base: {image: debian:bookworm-slim}
python: "3.11"
env: {A: '$(touch /pwned) && echo "x" \\', B: "${PATH}"}
labels: {evil: '" RUN touch /pwned'}
entrypoint: ["sh", "-c", "echo \\"$HOME\\"; ]"]
""")
    plan = plan_of(load_recipe(path))
    commands = dockerfile.parse_string(render_dockerfile(plan))
    assert [c.cmd for c in commands].count("RUN") == len([s for s in plan.final.steps if s.is_run])
    env = [c for c in commands if c.cmd == "ENV" and "A" in c.value][0]
    assert dict(zip(env.value[0::2], env.value[1::2], strict=False))["A"] == '"\\$(touch /pwned) && echo \\"x\\" \\\\"'
    entry = [c for c in commands if c.cmd == "ENTRYPOINT"][0]
    assert entry.json and list(entry.value) == ["sh", "-c", 'echo "$HOME"; ]']


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_a_layer_read_back_without_the_plan_gets_the_plans_group(recipe):
    """Issue 32 (5): step id -> layer group has one home (build_plan.STEP_GROUPS): inspect, with no
    plan at hand, puts each step's layer in the group make_plan gave the step."""
    from buildkit_py.plan import history

    plan = plan_of(load_recipe(recipe))
    steps = [s for stage in plan.stages for s in stage.steps]
    assert [(s.id, history._group_of(s.id)) for s in steps] == [(s.id, s.group) for s in steps]
