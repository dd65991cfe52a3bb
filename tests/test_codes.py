"""Warnings carry a stable code and recipe key; lint, plan --json and the CLI read the code."""

import json
import re

import pytest
from helpers import REPO, TODAY, run_cli, write_recipe

from buildkit_py.analysis.lint import LINT_CODES
from buildkit_py.compat import codes
from buildkit_py.compat.codes import CODES, RecipeWarning
from buildkit_py.compat.resolve import resolve
from buildkit_py.pipeline import lint_recipe
from buildkit_py.recipe.model import load_recipe

NVIDIA_TORCH = """\
name: team/x
cuda: {version: "12.4", source: nvidia}
base: {os: ubuntu22.04}
python: "3.10"
torch: "2.4.1"
"""

JIT = """\
name: team/x
cuda: {version: "12.4", source: wheels}
base: {image: debian:bookworm-slim}
python: "3.11"
pip:
  - requests==2.32.3
  - deepspeed==0.15.1
"""


def test_readme_table_lists_every_code_and_no_other():
    text = (REPO / "README.md").read_text()
    section = text.split("### Warning and finding codes", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `([a-z0-9-]+)` \|", section, flags=re.MULTILINE)
    assert len(documented) == len(set(documented))
    assert set(documented) == set(CODES) | set(LINT_CODES)


def test_unknown_code_is_refused():
    with pytest.raises(ValueError, match="unknown warning code 'cuda-thrice'"):
        RecipeWarning("cuda-thrice", "torch", "message")
    assert set(CODES) == set(codes.WarningCode)  # every code is explained
    assert type(RecipeWarning("cuda-twice", "torch", "message").code) is codes.WarningCode  # typed at the boundary


def test_warning_renders_code_message_and_hint():
    w = RecipeWarning(codes.CUDA_TWICE, "torch", "twice", hint="use wheels")
    assert w.render() == "[cuda-twice] twice (use wheels)"
    assert w.to_json() == {"code": "cuda-twice", "key": "torch", "message": "twice", "hint": "use wheels"}


def test_jit_warning_points_at_the_jit_pin(tmp_path):
    path = write_recipe(tmp_path, JIT)
    res = resolve(load_recipe(path), today=TODAY)
    assert [(w.code, w.key) for w in res.warnings] == [(codes.JIT_WITHOUT_RUNTIME_COMPILE, "pip[1]")]
    report = lint_recipe(path, hadolint=None)
    found = [f for f in report.findings if f.code == codes.JIT_WITHOUT_RUNTIME_COMPILE]
    assert [(f.key, f.line) for f in found] == [("pip[1]", 7)]  # the deepspeed line, not the pip: key


def test_lint_takes_code_and_key_from_the_warning_not_its_text(tmp_path, monkeypatch):
    """A reworded warning keeps its finding code: lint never matches the text."""
    from buildkit_py.compat import resolve as resolve_mod

    path = write_recipe(tmp_path, NVIDIA_TORCH)
    original = resolve_mod.resolve

    def reworded(recipe, base=None, looked_up=None, *, today):
        res = original(recipe, base, looked_up, today=today)
        return resolve_mod.Resolution(**{**res.__dict__, "warnings": tuple(
            RecipeWarning(w.code, w.key, "reworded") for w in res.warnings)})

    monkeypatch.setattr("buildkit_py.pipeline.bases.resolve", reworded)  # the pipeline resolves, then plans
    report = lint_recipe(path, hadolint=None)
    found = {f.code: f for f in report.findings}
    assert found[codes.CUDA_TWICE].message == "reworded"
    assert (found[codes.CUDA_TWICE].key, found[codes.CUDA_TWICE].line) == ("torch", 5)


def test_plan_prints_codes_and_json_has_them(tmp_path):
    path = write_recipe(tmp_path, NVIDIA_TORCH)
    code, out, err = run_cli("plan", str(path))
    assert code == 0, err
    assert "  warning   [cuda-twice] torch 2.4.1+cu124 brings its own CUDA libraries" in out
    code, out, err = run_cli("plan", str(path), "--json")
    assert code == 0, err
    warnings = json.loads(out)["warnings"]
    assert [(w["code"], w["key"]) for w in warnings] == [("cuda-twice", "torch"), ("eol-image", "cuda.version")]
    assert warnings[0]["hint"] is None and "a second time" in warnings[0]["message"]
    code, out, err = run_cli("render", str(path))
    assert code == 0 and "warning: [cuda-twice] torch 2.4.1+cu124" in err


def test_build_json_reports_warning_codes(tmp_path, monkeypatch):
    """build (no engine here: the engine and build_image stand in) prints and reports the codes."""
    from fakes import FakeEngine as Engine

    from buildkit_py import engine as engines
    from buildkit_py.engine import BuildResult
    from buildkit_py.pipeline import build as build_mod

    def build_image(plan, engine, options, *, publishing=None, sinks=None):
        result = BuildResult(image_id="sha256:" + "ab" * 32, tags=plan.tags, log_tail="", cached_steps=0,
                             run_steps=1, seconds=0.0)
        return build_mod.BuildReport(build_mod.BuildOutcome(plan, engine.name, result, size=1))

    monkeypatch.setattr(engines, "select_engine", lambda preference=None, **_kw: Engine())
    monkeypatch.setattr(build_mod, "build_image", build_image)
    path = write_recipe(tmp_path, NVIDIA_TORCH)
    code, out, err = run_cli("build", str(path), "--json", "--progress", "quiet")
    assert code == 0, err
    assert [(w["code"], w["key"]) for w in json.loads(out)["warnings"]] == [("cuda-twice", "torch"),
                                                                           ("eol-image", "cuda.version")]
    assert "warning: [cuda-twice] torch 2.4.1+cu124" in err
