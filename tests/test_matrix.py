"""Matrix recipes: the schema and its errors, expansion (ids, order, drops, tags), the output
formats against their JSON schemas, and build_all's scheduling and failure isolation with a
fake builder. The real-engine 2x2 build is in test_e2e_matrix.py."""

import json
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import dockerfile
import fakes
import pytest
import yaml
from helpers import REPO, run_cli, write_recipe

from buildkit_py import pipeline
from buildkit_py.engine import BuildResult, bake, children
from buildkit_py.engine.base import ImageSizes
from buildkit_py.engine.build import BuildOptions, BuildOutcome, build_args, rejected_tag
from buildkit_py.errors import AuthenticationError, BuildFailed, ImageTestFailed, Interrupted, RecipeError, UsageError
from buildkit_py.pipeline import build as pipeline_build
from buildkit_py.pipeline.build import BuildReport
from buildkit_py.pipeline.matrix_build import BuildHooks, build_all, build_report, summary_lines
from buildkit_py.plan import matrix as mx
from buildkit_py.plan.build_plan import SOURCE_DATE_EPOCH, check_image_tag
from buildkit_py.render.dockerfile import render_dockerfile

EXAMPLE = REPO / "recipes" / "matrix.yaml"

WHEELS = """\
name: team/mx
version: "1.0"
cuda: {{version: "12.4", source: wheels, flavor: base}}
base: {{image: debian:bookworm-slim}}
python: "3.11"
pip: [numpy==1.26.4]
matrix:
{matrix}
"""


def recipe(tmp_path, matrix_text: str) -> Path:
    return write_recipe(tmp_path, WHEELS.format(matrix=matrix_text))


def issues(exc: RecipeError) -> list[tuple[int | None, str, str]]:
    return [(i.line, i.key, i.message) for i in exc.issues]


# --- a small JSON Schema validator (the subset these schemas use), so the format checks run
# without the jsonschema package; where jsonschema is installed it validates as well.


def validate(instance, schema, path="$"):  # noqa: C901
    t = schema.get("type")
    types = {"object": dict, "array": list, "string": str, "integer": int, "boolean": bool, "null": type(None)}
    if t is not None:
        allowed = t if isinstance(t, list) else [t]
        assert any(isinstance(instance, types[x]) and not (x == "integer" and isinstance(instance, bool))
                   for x in allowed), f"{path}: {instance!r} is not {t}"
    if "enum" in schema:
        assert instance in schema["enum"], f"{path}: {instance!r} not in {schema['enum']}"
    if "pattern" in schema and isinstance(instance, str):
        assert re.search(schema["pattern"], instance), f"{path}: {instance!r} !~ {schema['pattern']}"
    if isinstance(instance, dict):
        for key in schema.get("required", []):
            assert key in instance, f"{path}: missing {key}"
        props = schema.get("properties", {})
        for key, value in instance.items():
            if key in props:
                validate(value, props[key], f"{path}.{key}")
                continue
            matched = [s for p, s in schema.get("patternProperties", {}).items() if re.search(p, key)]
            for s in matched:
                validate(value, s, f"{path}.{key}")
            extra = schema.get("additionalProperties", True)
            if not matched:
                assert extra is not False, f"{path}: unexpected key {key!r}"
                if isinstance(extra, dict):
                    validate(value, extra, f"{path}.{key}")
    if isinstance(instance, list):
        assert len(instance) >= schema.get("minItems", 0), f"{path}: too few items"
        assert len(instance) <= schema.get("maxItems", len(instance)), f"{path}: more than {schema['maxItems']} items"
        for i, item in enumerate(instance):
            if "items" in schema:
                validate(item, schema["items"], f"{path}[{i}]")
    try:
        import jsonschema
    except ImportError:
        return
    if path == "$":
        jsonschema.Draft202012Validator.check_schema(schema)
        jsonschema.validate(instance, schema)


STR = {"type": "string"}
STR_LIST = {"type": "array", "items": STR}
TAG_REF = {"type": "string", "pattern": r"^[a-z0-9./:-]+:[\w][\w.-]{0,127}$"}
VARIANT_ID = {"type": "string", "pattern": r"^[a-z0-9][a-z0-9_-]*$"}

GITHUB_SCHEMA = {
    "type": "object", "required": ["include"], "additionalProperties": False,
    "properties": {"include": {"type": "array", "minItems": 1, "maxItems": 256, "items": {
        "type": "object", "additionalProperties": False,
        "required": ["variant", "recipe", "cuda", "cuda_short", "python", "torch", "tags", "cache"],
        "properties": {"variant": VARIANT_ID, "recipe": STR, "cuda": {"type": "string", "pattern": r"^\d+\.\d+\.\d+$"},
                       "cuda_short": {"type": "string", "pattern": r"^\d{3,}$"},
                       "python": {"type": "string", "pattern": r"^3\.\d+$"}, "torch": STR,
                       "tags": {"type": "array", "minItems": 1, "items": TAG_REF}, "cache": TAG_REF}}}},
}
GITLAB_SCHEMA = {
    "type": "object", "required": ["parallel"], "additionalProperties": False,
    "properties": {"parallel": {"type": "object", "required": ["matrix"], "additionalProperties": False,
                                "properties": {"matrix": {"type": "array", "minItems": 1, "maxItems": 200, "items": {
                                    # GitLab: each entry maps variable names to a string (or a list of them)
                                    "type": "object", "minProperties": 1,
                                    "required": ["IMGBUILD_VARIANT", "IMGBUILD_RECIPE", "IMGBUILD_TAGS"],
                                    "patternProperties": {r"^[A-Z_][A-Z0-9_]*$": STR},
                                    "additionalProperties": False}}}}},
}
BAKE_TARGET = {
    "type": "object", "required": ["context", "dockerfile", "output", "network"],
    "additionalProperties": False,
    "properties": {
        "context": {"type": "string", "pattern": r"^contexts/[a-zA-Z0-9_-]+$"},
        # a file beside the contexts, never dockerfile-inline (buildx 0.13 leaks a TMPDIR folder per inline target)
        "dockerfile": {"type": "string", "pattern": r"^\.\./\.\./dockerfiles/[a-zA-Z0-9_-]+\.Dockerfile$"},
        "tags": {"type": "array", "items": TAG_REF},
        "contexts": {"type": "object",
                     "patternProperties": {r"^[a-z0-9-]+$": {"type": "string", "pattern": r"^target:"}},
                     "additionalProperties": False},
        "cache-from": {"type": "array", "minItems": 1,
                       "items": {"type": "string", "pattern": r"^type=registry,ref=\S+$"}},
        "cache-to": {"type": "array", "minItems": 1,
                     "items": {"type": "string",
                               "pattern": r"^type=registry,ref=\S+,mode=max,compression=gzip,force-compression=true$"}},
        "output": STR_LIST, "secret": STR_LIST,
        "network": {"enum": ["host"]},  # bake's target key for RUN steps' network (buildx docs)
        # bake's build args (buildx docs: "args", a map of strings); only SOURCE_DATE_EPOCH
        "args": {"type": "object", "required": ["SOURCE_DATE_EPOCH"], "additionalProperties": False,
                 "properties": {"SOURCE_DATE_EPOCH": {"type": "string", "pattern": r"^[0-9]+$"}}},
    },
}
BAKE_SCHEMA = {
    "type": "object", "required": ["group", "target"], "additionalProperties": False,
    "properties": {
        "group": {"type": "object", "required": ["default"], "properties": {"default": {
            "type": "object", "required": ["targets"], "properties": {"targets": STR_LIST}}}},
        # bake target names: letters, digits, '_' and '-'
        "target": {"type": "object", "patternProperties": {r"^[a-zA-Z0-9_-]+$": BAKE_TARGET},
                   "additionalProperties": False},
    },
}
JSON_SCHEMA = {
    "type": "object", "required": ["recipe", "name", "keys", "variants", "dropped", "excluded"],
    "properties": {
        "variants": {"type": "array", "items": {"type": "object", "required": [
            "variant", "values", "tags", "content_tag", "recipe_digest", "cuda", "python"],
            "properties": {"variant": VARIANT_ID, "tags": {"type": "array", "items": TAG_REF},
                           "content_tag": {"type": "string", "pattern": r"^sha-[0-9a-f]{12}$"}}}},
        "dropped": {"type": "array", "items": {"type": "object", "required": [
            "variant", "values", "reason", "hint", "component", "version", "other", "other_version"],
            "properties": {"reason": {"type": "string", "pattern": " conflicts with "}}}},
        "excluded": {"type": "array", "items": {"type": "object", "required": ["variant", "values", "by"]}},
    },
}


# --- expansion ------------------------------------------------------------------------


def test_example_recipe_expands_in_order_with_drops_and_reasons():
    m = pipeline.load_matrix(EXAMPLE)
    assert [v.id for v in m.variants] == ["cu121-py310", "cu121-py311", "cu124-py310", "cu124-py311",
                                           "cu124-py312", "cu126-py312-pt260"]
    assert [d.id for d in m.dropped] == ["cu126-py310", "cu126-py311", "cu126-py312"]
    d = m.dropped[0]
    assert (d.error.component, d.error.version, d.error.other, d.error.other_version) == ("torch", "2.5.1", "cuda",
                                                                                          "12.6.3")
    assert "cu124" in d.error.reason and "torch 2.6.0 (the nearest release with cu126" in d.error.hint
    assert [(e.id, e.by) for e in m.excluded] == [("cu121-py312", "matrix.exclude[0]")]
    inc = m.variants[-1]
    assert inc.source == "include[0]" and inc.values == {"cuda.version": "12.6", "python": "3.12", "torch": "2.6.0"}
    assert inc.resolution.torch_label == "2.6.0+cu126"
    v = m.variants[3]
    assert v.tags == ("team/serve:2.0-cu124-py3.11", f"team/serve:sha-{v.recipe.digest[7:19]}")
    assert v.recipe.cuda.version == "12.4" and v.recipe.python == "3.11"


def test_expansion_is_deterministic():
    a, b = pipeline.load_matrix(EXAMPLE), pipeline.load_matrix(EXAMPLE)
    assert mx.matrix_json(a) == mx.matrix_json(b)
    assert json.dumps(bake.bake_file(a)) == json.dumps(bake.bake_file(b))


def test_unquoted_versions_keep_their_text(tmp_path):
    path = recipe(tmp_path, "  cuda.version: [12.1, 12.4]\n  pip: [[idna==3.7], [idna==3.8]]\n"
                            "  tags: ['{cuda}-{cuda_short}-{cuda_major}-py{python_short}-{variant}']")
    m = pipeline.load_matrix(path)
    assert [v.id for v in m.variants] == ["cu121-idna3_7", "cu121-idna3_8", "cu124-idna3_7", "cu124-idna3_8"]
    assert m.variants[0].values == {"cuda.version": "12.1", "pip": ["idna==3.7"]}
    assert m.variants[0].tags[0] == "team/mx:12.1.1-121-12-py311-cu121-idna3_7"
    assert m.variants[0].resolution.cuda_wheels == ("nvidia-cuda-runtime-cu12==12.1.105",)


def test_python_three_ten_unquoted_is_not_three_one(tmp_path):
    path = write_recipe(tmp_path, "name: team/x\ncuda: {version: '12.4'}\npython: '3.11'\n"
                                  "matrix:\n  python: [3.10, 3.11]\n")
    m = pipeline.load_matrix(path)
    assert [v.recipe.python for v in m.variants] == ["3.10", "3.11"]


def test_recipe_without_matrix_is_one_default_variant():
    m = pipeline.load_matrix(REPO / "recipes" / "demo.yaml")
    assert [v.id for v in m.variants] == ["default"]
    assert m.variants[0].tags == ("demo/cuda-hello:0.1.0", f"demo/cuda-hello:sha-{m.variants[0].recipe.digest[7:19]}")


def test_include_duplicate_of_a_combination_is_merged(tmp_path):
    path = recipe(tmp_path, "  cuda.version: ['12.1', '12.4']\n"
                            "  include: [{cuda.version: '12.4'}, {cuda.version: '12.6'}]")
    assert [v.id for v in pipeline.load_matrix(path).variants] == ["cu121", "cu124", "cu126"]


def test_incompatible_python_is_dropped_not_an_error(tmp_path):
    # debian:bookworm ships only Python 3.11
    path = recipe(tmp_path, "  python: ['3.10', '3.11']")
    m = pipeline.load_matrix(path)
    assert [v.id for v in m.variants] == ["py311"]
    assert m.dropped[0].id == "py310" and "debian12 ships Python 3.11" in m.dropped[0].error.reason
    assert m.dropped[0].error.hint


def test_a_matrix_that_keeps_nothing_is_refused_with_every_reason(tmp_path):
    """issue 22: 12: it gave `{"include":[]}` and exit 0, and CI failed later in GitHub's own words."""
    dropped = pipeline.load_matrix(recipe(tmp_path / "d", "  python: ['3.10', '3.12']"))  # debian12 has only 3.11
    with pytest.raises(UsageError) as err:
        mx.require_variants(dropped, "build")
    assert "every variant was dropped, nothing to build" in err.value.message
    assert [line.split(":")[0] for line in err.value.message.splitlines()[1:]] == [
        "  variant py310 dropped", "  variant py312 dropped"]
    assert "debian12 ships Python 3.11" in err.value.message and err.value.hint
    excluded = pipeline.load_matrix(recipe(tmp_path / "e", "  python: ['3.11']\n  exclude: [{python: '3.11'}]"))
    with pytest.raises(UsageError, match=r"variant py311 excluded by matrix.exclude\[0\]"):
        mx.require_variants(excluded, "lock")
    mx.require_variants(pipeline.load_matrix(recipe(tmp_path / "k", "  python: ['3.11']")), "build")  # kept: no error


@pytest.mark.parametrize("args", [["--format", "github"], ["--format", "gitlab"], ["--json"], [],
                                  ["--format", "bake", "-o", "{tmp}/bake"]])
def test_matrix_command_exits_2_when_nothing_is_kept(tmp_path, args):
    path = recipe(tmp_path, "  python: ['3.10', '3.12']")
    code, out, err = run_cli("matrix", str(path), *[a.format(tmp=tmp_path) for a in args])
    assert code == 2, (out, err)
    assert "variant py310 dropped: python 3.10 conflicts" in err and "variant py312 dropped" in err
    assert "internal error" not in err and err.count("imgbuild: error:") == 1
    assert out == "" or json.loads(out)["error"] == "UsageError"  # --json: the error document
    assert not (tmp_path / "bake").exists()


# --- schema errors: file, line, key -----------------------------------------------------------


@pytest.mark.parametrize(("matrix_text", "expected"), [
    ("  cuda.verison: ['12.1']", (8, "matrix.cuda.verison", "did you mean 'cuda.version'?")),
    ("  python: '3.11'", (8, "matrix.python", "non-empty list")),
    ("  python: []", (8, "matrix.python", "non-empty list")),
    ("  name: [a, b]", (8, "matrix.name", "cannot be an axis")),
    ("  python: ['3.11', '3.11']", (8, "matrix.python[1]", "listed twice")),
    ("  python: ['3.11']\n  exclude: [{torch: '2.4.1'}]", (9, "matrix.exclude[0].torch", "not a matrix axis")),
    ("  python: ['3.11']\n  exclude: [{python: '3.12'}]", (9, "matrix.exclude[0].python", "never matches")),
    ("  python: ['3.11']\n  tags: ['{cuda_shrot}']", (9, "matrix.tags[0]", "did you mean {cuda_short}?")),
    ("  python: ['3.11']\n  tags: ['x-{python']", (9, "matrix.tags[0]", "unmatched brace")),
    ("  cuda: [{version: '12.1'}]\n  cuda.version: ['12.4']", (9, "matrix.cuda.version", "overlaps cuda")),
    ("  tags: ['{variant}']", (7, "matrix", "at least one axis")),
    ("  python: ['3.11']\n  include: {python: '3.11'}", (9, "matrix.include", "list of mappings")),
])
def test_schema_errors_name_file_line_and_key(tmp_path, matrix_text, expected):
    path = recipe(tmp_path, matrix_text)
    with pytest.raises(RecipeError) as exc:
        pipeline.load_matrix(path)
    line, key, words = expected
    found = [(i.file, i.line, i.key) for i in exc.value.issues if words in i.message]
    assert (str(path), line, key) in found, issues(exc.value)


def test_bad_value_points_at_the_matrix_entry(tmp_path):
    path = recipe(tmp_path, "  python: ['3.11', 'three']\n  pip: [[numpy==1.26.4], [numpy]]")
    with pytest.raises(RecipeError) as exc:
        pipeline.load_matrix(path)
    keys = {(i.line, i.key) for i in exc.value.issues}
    assert (8, "matrix.python[1]") in keys
    assert (9, "matrix.pip[1][0]") in keys
    assert all("matrix." in i.key for i in exc.value.issues)


def test_tags_that_collide_are_refused(tmp_path):
    path = recipe(tmp_path, "  pip: [[idna==3.7], [idna==3.8]]\n  tags: ['{version}-cu{cuda_short}']")
    with pytest.raises(RecipeError) as exc:
        pipeline.load_matrix(path)
    assert "would both be tagged team/mx:1.0-cu124" in str(exc.value)
    assert exc.value.issues[0].key == "matrix.tags" and exc.value.issues[0].line == 9


def test_placeholder_without_a_value_is_refused(tmp_path):
    path = recipe(tmp_path, "  cuda.version: ['12.1']\n  tags: ['pt{torch}']")
    with pytest.raises(RecipeError, match=r"variant cu121 has no torch for \{torch\}"):
        pipeline.load_matrix(path)


def test_cli_matrix_error_exit_2(tmp_path):
    path = recipe(tmp_path, "  cuda.verison: ['12.1']")
    code, out, err = run_cli("matrix", str(path), "--json")
    assert code == 2 and f"{path}:8: matrix.cuda.verison:" in err
    assert json.loads(out)["issues"][0]["key"] == "matrix.cuda.verison"


# --- output formats ---------------------------------------------------------------------


def test_json_format_schema():
    code, out, err = run_cli("matrix", str(EXAMPLE), "--format", "json", "--registry", "127.0.0.1:5000")
    assert code == 0, err
    data = json.loads(out)
    validate(data, JSON_SCHEMA)
    assert data["variants"][0]["tags"][0] == "127.0.0.1:5000/team/serve:2.0-cu121-py3.10"
    assert len(data["dropped"]) == 3 and data["dropped"][0]["hint"]
    assert "dropped: torch 2.5.1 conflicts with cuda 12.6.3" in err  # never silently


def test_text_format_lists_kept_dropped_excluded():
    code, out, _ = run_cli("matrix", str(EXAMPLE))
    assert code == 0
    assert "6 variants kept, 3 dropped, 1 excluded" in out
    assert re.search(r"dropped\s+cu126-py310\s+torch 2.5.1 conflicts with cuda 12.6.3", out)
    assert "hint: use cuda 12.4 (the nearest CUDA torch 2.5.1 has a build for) or torch 2.6.0 (the nearest " \
           "release with cu126 for Python 3.10; the newest: 2.14.1)" in out
    assert re.search(r"excluded\s+cu121-py312\s+by matrix.exclude\[0\]", out)


def test_github_format_schema_and_one_line():
    code, out, _ = run_cli("matrix", str(EXAMPLE), "--format", "github")
    assert code == 0 and out.count("\n") == 1  # one line for $GITHUB_OUTPUT
    data = json.loads(out)
    validate(data, GITHUB_SCHEMA)
    assert [e["variant"] for e in data["include"]][:2] == ["cu121-py310", "cu121-py311"]
    assert data["include"][0]["cache"] == "team/serve:cache-cu121-py310"


def big_matrix(tmp_path, n_versions: int, n_workdirs: int) -> Path:
    versions = ", ".join(f"'v{i}'" for i in range(n_versions))
    workdirs = ", ".join(f"/w{i}" for i in range(n_workdirs))
    return recipe(tmp_path, f"  version: [{versions}]\n  workdir: [{workdirs}]")


def test_github_format_refuses_more_than_256_jobs(tmp_path):
    path = big_matrix(tmp_path, 17, 16)  # 272
    code, _, err = run_cli("matrix", str(path), "--format", "github")
    assert code == 2 and "272 variants" in err and "at most 256" in err and "hint:" in err
    ok = big_matrix(tmp_path / "ok", 16, 16)  # 256 exactly
    code, out, _ = run_cli("matrix", str(ok), "--format", "github")
    assert code == 0 and len(json.loads(out)["include"]) == 256


def test_gitlab_format_schema_and_200_cap(tmp_path):
    code, out, err = run_cli("matrix", str(EXAMPLE), "--format", "gitlab", "--registry", "r.example.com")
    assert code == 0, err
    data = yaml.safe_load(out)
    validate(data, GITLAB_SCHEMA)
    first = data["parallel"]["matrix"][0]
    assert first["IMGBUILD_VARIANT"] == "cu121-py310" and first["PYTHON"] == "3.10"
    content = pipeline.load_matrix(EXAMPLE).variants[0].content_tag
    assert first["IMGBUILD_TAGS"].split() == ["r.example.com/team/serve:2.0-cu121-py3.10",
                                              f"r.example.com/team/serve:{content}"]
    code, _, err = run_cli("matrix", str(big_matrix(tmp_path, 15, 14)), "--format", "gitlab")  # 210
    assert code == 2 and "at most 200" in err


def test_bake_folder_schema_order_contexts_and_network(tmp_path):
    from buildkit_py.engine.bake import bake_file as inline_bake_file
    folder = tmp_path / "bake"
    code, _, err = run_cli("matrix", str(EXAMPLE), "--format", "bake", "--registry", "127.0.0.1:5000",
                           "--ca-cert", "/etc/ssl/certs/ca-certificates.crt", "-o", str(folder))
    assert code == 0, err
    assert f"cd {folder} && docker buildx bake" in err
    bake = json.loads((folder / "docker-bake.json").read_text())
    validate(bake, BAKE_SCHEMA)
    targets = bake["target"]
    order = bake["group"]["default"]["targets"]
    assert order == list(targets)
    m = pipeline.load_matrix(EXAMPLE)
    assert [t for t in order if not t.startswith("shared-")] == [v.id for v in m.variants]
    for name, target in targets.items():
        for ctx in target.get("contexts", {}).values():
            dep = ctx.removeprefix("target:")
            assert order.index(dep) < order.index(name), f"{dep} must come before {name}"
        assert target["secret"] == ["id=cacert,src=/etc/ssl/certs/ca-certificates.crt"]
        assert target["network"] == "host"
        if name.startswith("shared-"):
            assert target["output"] == ["type=cacheonly"] and "tags" not in target
        else:
            assert target["output"] == ["type=docker"]
            # SOURCE_DATE_EPOCH as `imgbuild build` passes it: fixed, the layers' file time (issue 33: 1)
            assert target["args"] == build_args() == {"SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)}
        # each target's own context: what its Dockerfile reads, nothing else
        assert target["context"] == f"contexts/{name}"
        context = folder / target["context"]
        text = (context / target["dockerfile"]).read_text()
        assert text == inline_bake_file(pipeline.load_matrix(EXAMPLE), registry="127.0.0.1:5000",
                                 ca_cert=Path("/etc/ssl/certs/ca-certificates.crt"))["target"][name]["dockerfile-inline"]
        copies = [c.value[0] for c in dockerfile.parse_string(text) if c.cmd == "COPY"]
        assert sorted(str(p.relative_to(context)) for p in context.rglob("*") if p.is_file()) == sorted(
            ({".imgbuild/root/etc/hosts"} if ".imgbuild/root/" in copies else set())
            | ({"app/serve.py", "app/train.py"} if "app/" in copies else set()))
    v = targets["cu124-py311"]
    assert v["cache-from"] == ["type=registry,ref=127.0.0.1:5000/team/serve:cache-cu124-py311"]
    assert v["cache-to"] == ["type=registry,ref=127.0.0.1:5000/team/serve:cache-cu124-py311,mode=max,"
                             "compression=gzip,force-compression=true"]
    assert v["tags"][0] == "127.0.0.1:5000/team/serve:2.0-cu124-py3.11"
    # buildx < 0.17 takes the network only from a compose file, which bake reads beside it
    compose = yaml.safe_load((folder / "compose.yaml").read_text())
    assert compose == {"services": {t: {"build": {"network": "host"}} for t in order}}

    # the folder is ours now: written again in place, with --push and a pip.conf secret
    pip_conf = tmp_path / "pip.conf"
    pip_conf.write_text("[global]\nindex-url = https://pypi.example/simple\n")
    code, _, err = run_cli("matrix", str(EXAMPLE), "--format", "bake", "--push", "--pip-config", str(pip_conf),
                           "-o", str(folder))
    assert code == 0, err
    again = json.loads((folder / "docker-bake.json").read_text())["target"]["cu124-py311"]
    assert again["output"] == ["type=registry"]
    # uv steps read the pip.conf translated, from a private file beside the bake file
    assert again["secret"] == [f"id=pipconf,src={pip_conf}", f"id=uvenv,src={folder.resolve() / 'uvenv'}"]
    assert (folder / "uvenv").read_text() == "export UV_INDEX_URL=https://pypi.example/simple\n"
    assert (folder / "uvenv").stat().st_mode & 0o777 == 0o600
    assert "cache-from" not in again and "cache-to" not in again  # no registry: no cache refs (not Docker Hub)


def test_bake_usage_errors(tmp_path):
    code, out, err = run_cli("matrix", str(EXAMPLE), "--format", "bake")
    assert code == 2 and "-o DIR" in err and out == ""
    (tmp_path / "mine.txt").write_text("keep me")
    code, _, err = run_cli("matrix", str(EXAMPLE), "--format", "bake", "-o", str(tmp_path))
    assert code == 2 and "not empty" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]
    code, _, err = run_cli("matrix", str(EXAMPLE), "--format", "json", "-o", str(tmp_path / "x"))
    assert code == 2 and "only --format bake" in err
    code, _, err = run_cli("matrix", str(EXAMPLE), "--format", "bake", "--ca-cert", str(tmp_path / "nope"),
                           "-o", str(tmp_path / "b"))
    assert code == 2 and "--ca-cert" in err and not (tmp_path / "b").exists()


def _instructions(text: str) -> list[str]:
    return [c.original for c in dockerfile.parse_string(text) if c.cmd != "FROM"]


def test_bake_chain_rebuilds_exactly_each_variants_dockerfile(tmp_path):
    """Shared stages + the variant's rest are the variant's own Dockerfile, instruction for
    instruction, and every FROM names the context of the target before it."""
    path = recipe(tmp_path, "  cuda.version: ['12.1', '12.4']\n  pip: [[idna==3.7], [idna==3.8]]")
    m = pipeline.load_matrix(path)
    bake_json = bake.bake_file(m)
    targets = bake_json["target"]
    shared = [t for t in targets if t.startswith("shared-")]
    assert len(shared) == 3  # os+python for all four, then the cuda wheels per CUDA
    for v in m.variants:
        chain, name = [], v.id
        while "contexts" in targets[name]:
            (ctx_name, ctx), = targets[name]["contexts"].items()
            froms = [c.value[0] for c in dockerfile.parse_string(targets[name]["dockerfile-inline"]) if c.cmd == "FROM"]
            assert froms[-1] == ctx_name
            name = ctx.removeprefix("target:")
            chain.insert(0, name)
        assert len(chain) == 2
        joined = [i for t in chain for i in _instructions(targets[t]["dockerfile-inline"])]
        joined += _instructions(targets[v.id]["dockerfile-inline"])
        assert joined == _instructions(render_dockerfile(mx.variant_plan(v)))


# --- build_all with a fake builder ------------------------------------------------------


class FakeEngine(fakes.FakeEngine):
    """The typed fake (tests/fakes.py), able to do what a buildx engine does."""

    capabilities = frozenset({"multi-stage", "cache-mounts", "secrets", "cache-from", "cache-export", "builder",
                              "push", "metadata-file", "engine-store"})


class FakeRunner:
    """Stands in for pipeline.build.build_checked: records when each variant ran (and which were
    tested), fails some builds and some tests on purpose."""

    def __init__(self, fail: set[str] = frozenset(), delay: float = 0.05, fail_tests: set[str] = frozenset()):
        self.fail, self.delay, self.fail_tests = fail, delay, fail_tests
        self.events: list[tuple[str, str]] = []
        self.tested: list[str] = []
        self.options: dict[str, BuildOptions] = {}
        self.lock = threading.Lock()

    def __call__(self, plan, engine, options, on_line, on_event=None):
        variant = next(t for t in plan.tags if ":" in t).rsplit(":", 1)[1]
        with self.lock:
            self.events.append(("start", variant))
            self.options[variant] = options
        on_line("#5 [2/6] RUN set -eu; : imgbuild-step=os;")
        time.sleep(self.delay)
        with self.lock:
            self.events.append(("end", variant))
        if any(f in variant for f in self.fail):
            raise BuildFailed("build failed (exit 1)", returncode=1, log_tail="pip: no such version")
        if options.test:  # as build_checked: the image is tested before it keeps its tags
            with self.lock:
                self.tested.append(plan.tags[0])
            if variant in self.fail_tests:
                raise ImageTestFailed("1 of 9 tests failed: import idna", failures=[])
        result = BuildResult(image_id="sha256:" + "ab" * 32, tags=plan.tags, log_tail="", cached_steps=3,
                             run_steps=2, seconds=self.delay)
        return BuildReport(BuildOutcome(plan, engine.name, result, size=123_000_000))


def two_by_two(tmp_path) -> mx.Matrix:
    return pipeline.load_matrix(recipe(tmp_path, "  cuda.version: ['12.1', '12.4']\n  pip: [[idna==3.7], [idna==3.8]]\n"
                                           "  tags: ['{variant}']"))


def test_build_all_builds_shared_prefixes_once_before_their_sharers(tmp_path):
    m = two_by_two(tmp_path)
    runner = FakeRunner()
    result = build_all(m, FakeEngine(), BuildOptions(cache_to=("type=registry,ref=r/x:cache-{variant},mode=max",)),
                       jobs=4, hooks=BuildHooks(runner=runner))
    assert [b.variant.id for b in result.builds] == [v.id for v in m.variants] and not result.failed
    ev = runner.events
    # the first variant builds os+python and the 12.1 wheels alone; then one of each CUDA
    # pair runs, and the 12.4 sharer waits for the 12.4 leader
    assert ev[:2] == [("start", "cu121-idna3_7"), ("end", "cu121-idna3_7")]
    assert set(ev[2:4]) == {("start", "cu121-idna3_8"), ("start", "cu124-idna3_7")}
    assert ev.index(("start", "cu124-idna3_8")) > ev.index(("end", "cu124-idna3_7"))
    assert runner.options["cu124-idna3_8"].cache_to == ("type=registry,ref=r/x:cache-cu124-idna3_8,mode=max",)


def test_build_all_gates_each_variant_with_its_own_tests(tmp_path):
    """build --all --push ran no tests: every variant's image is now gated like a single build's,
    and a variant whose tests fail fails alone (nothing of it pushed) while the others go on."""
    m = two_by_two(tmp_path)
    runner = FakeRunner(fail_tests={"cu124-idna3_8"})
    result = build_all(m, FakeEngine(), BuildOptions(test=True), jobs=2, hooks=BuildHooks(runner=runner))
    assert sorted(runner.tested) == sorted(f"team/mx:{v.id}" for v in m.variants)  # each with its own plan
    assert [b.variant.id for b in result.failed] == ["cu124-idna3_8"]
    assert result.failed[0].error.message == "1 of 9 tests failed: import idna"


class TaggingEngine(FakeEngine):
    """FakeEngine that build_checked can drive: each build a new image, tags kept as an engine keeps them."""

    def __init__(self):
        super().__init__(sizes=ImageSizes(1000, None))
        self.tags: dict[str, str] = {}
        self.lock = threading.Lock()

    def build(self, request, on_line):
        with self.lock:
            image_id = f"sha256:{len(set(self.tags.values())) + 1:064x}"
            self.tags.update(dict.fromkeys(request.tags, image_id))
        return BuildResult(image_id, request.tags, "", 0, 5, 0.1)

    def image(self, ref):
        return fakes.image_info(self.tags.get(ref, ref))

    def tag(self, image, ref):
        self.tags[ref] = image

    def untag(self, ref):
        self.tags.pop(ref, None)


def test_each_refused_variant_keeps_its_own_rejected_tag(tmp_path, monkeypatch):
    """Every refused variant was kept as REPO:rejected, each one overwriting the last (one image
    left of four). Through build_checked itself, on an engine that keeps tags, its tests failing."""
    from buildkit_py.analysis.image_checks import FAILED, TestReport, TestResult

    m = two_by_two(tmp_path)

    def run_tests(engine, image_id, recipe, shown_as, platforms, on_event):
        return (TestReport(shown_as, False, (TestResult("import idna", "import", FAILED, "no module"),),
                           "linux/amd64"),)

    monkeypatch.setattr(pipeline_build, "run_tests", run_tests)
    engine = TaggingEngine()
    result = build_all(m, engine, BuildOptions(network=None, test=True), jobs=2)
    assert len(result.failed) == 4
    rejected = {t: i for t, i in engine.tags.items() if "rejected" in t}
    assert sorted(rejected) == sorted(f"team/mx:rejected-{v.id}" for v in m.variants)
    assert len(set(rejected.values())) == 4  # four images, each under its own tag
    assert set(engine.tags) == set(rejected)  # the tags they were given are gone
    for b in result.failed:
        assert b.error.kept_as == f"team/mx:rejected-{b.variant.id}"
        assert b.error.message.startswith(f"1 of 1 tests of team/mx:{b.variant.id} failed:\n- import idna")
        assert b.error.message.endswith(f"nothing was pushed; the image is kept as team/mx:rejected-{b.variant.id}")
        assert [t.image for t in b.tests] == [f"team/mx:{b.variant.id}"]  # the summary shows the failed report
    assert [v["tests"]["failed"] for v in build_report(result)["variants"]] == [1, 1, 1, 1]


def test_a_rejected_tag_is_a_valid_tag_however_long_the_variant_id():
    assert rejected_tag("127.0.0.1:5000/team/app:1") == "127.0.0.1:5000/team/app:rejected"
    assert rejected_tag("team/app:1-cu124", "cu124-py311") == "team/app:rejected-cu124-py311"
    long = rejected_tag("team/app:1", "x" * 200)
    check_image_tag(long)
    assert len(long.split(":", 1)[1]) == 128


def test_build_all_runs_unrelated_variants_in_parallel(tmp_path):
    # different base images: nothing shared, so -j 2 starts two at once
    path = recipe(tmp_path, "  base.image: ['debian:bookworm-slim', 'debian:12']\n  tags: ['{variant}']")
    runner = FakeRunner()
    build_all(pipeline.load_matrix(path), FakeEngine(), BuildOptions(), jobs=2, hooks=BuildHooks(runner=runner))
    assert [e[0] for e in runner.events] == ["start", "start", "end", "end"]


class StalledRunner:
    """Stands in for pipeline.build.build_checked with a real child per variant (a `sleep` in a session of its
    own, supervised as engine builds are), which only an interrupt ends."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []
        self.tags: list[str] = []

    def __call__(self, plan, engine, options, on_line, on_event=None):
        proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
        self.tags.append(plan.tags[0].rsplit(":", 1)[1])
        self.procs.append(proc)
        with children.supervised(proc, f"build of {plan.tags[0]}"):
            proc.wait()
        raise BuildFailed(f"build failed (exit {proc.returncode})", returncode=proc.returncode)


def test_an_interrupt_stops_every_variant_build_at_once(tmp_path):
    """Issue 22 item 7: the signal reaches the main thread, which waits for the workers; before,
    leaving the thread pool waited for every running build to end (here 60 s)."""
    path = recipe(tmp_path, "  base.image: ['debian:bookworm-slim', 'debian:12']\n  tags: ['{variant}']")
    runner = StalledRunner()

    def interrupt_when_both_run():
        while len(runner.procs) < 2:
            time.sleep(0.05)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)

    def raise_interrupted(signum, _frame):
        raise Interrupted(signum)

    previous = signal.signal(signal.SIGTERM, raise_interrupted)
    threading.Thread(target=interrupt_when_both_run, daemon=True).start()
    start = time.monotonic()
    try:
        with pytest.raises(Interrupted) as raised:
            build_all(pipeline.load_matrix(path), FakeEngine(), BuildOptions(), jobs=2,
                      hooks=BuildHooks(runner=runner))
    finally:
        signal.signal(signal.SIGTERM, previous)
        for proc in runner.procs:
            if proc.poll() is None:
                proc.kill()
    assert time.monotonic() - start < 20
    assert all(proc.poll() is not None for proc in runner.procs)
    assert sorted(raised.value.stopped) == sorted(f"build of team/mx:{tag} (pid {proc.pid})" for proc, tag in zip(
        runner.procs, runner.tags, strict=True))


def test_one_failure_does_not_stop_the_others(tmp_path):
    m = two_by_two(tmp_path)
    runner = FakeRunner(fail={"cu121-idna3_7"})
    result = build_all(m, FakeEngine(), BuildOptions(), jobs=2, hooks=BuildHooks(runner=runner))
    assert [b.variant.id for b in result.failed] == ["cu121-idna3_7"]
    assert sum(1 for b in result.builds if b.ok) == 3
    report = build_report(result)
    assert report["failed"] == 1 and report["ok"] == 3
    assert report["variants"][0]["error"]["error"] == "BuildFailed"
    lines = summary_lines(result)
    assert lines[0].split()[:7] == ["VARIANT", "STATUS", "SIZE", "DIGEST", "TIME", "CACHED", "TAGS"]
    row = r"cu121-idna3_8\s+ok\s+117\.3 MiB\s+abababababab\s+\S+s\s+3/5\s+team/mx:cu121-idna3_8"
    assert re.search(row, "\n".join(lines))
    assert "3 built, 1 failed, 0 dropped" in "\n".join(lines)


def test_build_all_refuses_capabilities_before_building(tmp_path):
    class Classic(FakeEngine):
        name = "docker"
        capabilities = frozenset({"multi-stage", "cache-mounts", "secrets", "cache-from"})

    runner = FakeRunner()
    with pytest.raises(Exception, match="cache-export"):
        build_all(two_by_two(tmp_path), Classic(), BuildOptions(cache_to=("type=registry,ref=r/x",)),
                  hooks=BuildHooks(runner=runner))
    assert runner.events == []


def test_build_all_checks_push_credentials_before_any_variant_builds(tmp_path, registry, docker_config, monkeypatch):
    """Issue 22 item 5, for a matrix: a wrong password fails once, before the first variant."""
    monkeypatch.setenv("IMGBUILD_REGISTRY_USER", registry.user)
    monkeypatch.setenv("IMGBUILD_REGISTRY_PASSWORD", "wrong-" + registry.password)
    runner = FakeRunner()
    with pytest.raises(AuthenticationError, match=r"cannot push .*nothing was built") as exc:
        build_all(two_by_two(tmp_path), FakeEngine(), BuildOptions(push=True), registry=registry.address,
                  hooks=BuildHooks(runner=runner))
    assert exc.value.exit_status == 3
    assert runner.events == []


def test_build_all_usage_errors(tmp_path):
    m = two_by_two(tmp_path)
    with pytest.raises(UsageError, match="at least 1"):
        build_all(m, FakeEngine(), BuildOptions(), jobs=0, hooks=BuildHooks(runner=FakeRunner()))
    with pytest.raises(UsageError, match="single --variant"):
        build_all(m, FakeEngine(), BuildOptions(), tags=("x:1",), hooks=BuildHooks(runner=FakeRunner()))
    with pytest.raises(UsageError, match="no variant 'cu999'"):
        build_all(m, FakeEngine(), BuildOptions(), variant_ids=("cu999",), hooks=BuildHooks(runner=FakeRunner()))


def test_dropped_variant_cannot_be_selected():
    with pytest.raises(UsageError, match="variant cu126-py310 was dropped: torch 2.5.1 conflicts"):
        pipeline.load_matrix(EXAMPLE).variant("cu126-py310")


@pytest.fixture
def fake_engine(monkeypatch):
    from buildkit_py import engine as engine_pkg
    from buildkit_py.pipeline import matrix_build

    runner = FakeRunner(fail={"cu124-idna3_8"})
    monkeypatch.setattr(engine_pkg, "select_engine", lambda preference=None, **_kw: FakeEngine())
    monkeypatch.setattr(matrix_build, "build_preflighted", runner)  # build_all preflights every variant first
    return runner


def test_cli_build_all_summary_json_and_exit_code(tmp_path, fake_engine):
    path = recipe(tmp_path, "  cuda.version: ['12.1', '12.4']\n  pip: [[idna==3.7], [idna==3.8]]\n"
                            "  tags: ['{variant}']")
    code, out, err = run_cli("build", str(path), "--all", "-j", "2", "--json", "--progress", "quiet")
    assert code == 1, err  # one variant failed
    report = json.loads(out)
    assert [v["status"] for v in report["variants"]] == ["ok", "ok", "ok", "failed"]
    assert report["variants"][0]["steps_cached"] == 3 and report["variants"][0]["size"] == 123_000_000
    code, out, err = run_cli("build", str(path), "--variant", "cu121-idna3_7", "--tag", "team/mx:ci",
                             "--builder", "remote-k8s", "--progress", "quiet")
    assert code == 0, err
    assert "team/mx:ci" in out and "1 built, 0 failed" in out
    assert fake_engine.options["ci"].builder == "remote-k8s"


def test_cli_build_help_mentions_matrix_flags():
    code, out, _ = run_cli("build", "--help")
    assert code == 0 and "--all" in out and "--jobs" in out and "--variant" in out and "--builder" in out
    code, out, _ = run_cli("matrix", "--help")
    assert code == 0 and "github" in out and "bake" in out


def test_no_cache_builds_each_shared_prefix_once_then_variants_from_it(tmp_path):
    """Issue 11 item 22: with --no-cache every variant used to rebuild the shared os/python
    prefix. Now each shared stage is built once (no cache) as a local image, and each variant
    is built (no cache) FROM the last stage it shares, with only its own steps."""
    m = two_by_two(tmp_path)
    plans = {v.id: mx.variant_plan(v) for v in m.variants}
    stages, chains = mx.shared_stages(plans)
    built: list = []
    removed: list[str] = []

    class Engine(FakeEngine):  # builds FROM the engine's own images (ENGINE_STORE), as the docker kinds do
        def remove(self, ref):
            removed.append(ref)

    tested: list[bool] = []

    def runner(plan, engine, options, on_line, on_event=None):
        assert options.no_cache
        built.append(plan)
        tested.append(options.test)
        result = BuildResult(image_id="sha256:" + "cd" * 32, tags=plan.tags, log_tail="", cached_steps=0,
                             run_steps=len(plan.final.steps), seconds=0.0)
        return BuildReport(BuildOutcome(plan, engine.name, result, size=1))

    result = build_all(m, Engine(), BuildOptions(no_cache=True, test=True), jobs=2, hooks=BuildHooks(runner=runner))
    assert not result.failed
    shared, variants = built[:len(stages)], built[len(stages):]
    assert tested == [False] * len(stages) + [True] * 4  # the variants' images are tested, not a shared stage
    assert [p.tags[0].split(":")[1] for p in shared] == mx.build_order(stages)
    assert all(p.tags[0].startswith("imgbuild-shared/team_mx:") for p in shared)
    assert len(variants) == 4 and sorted(removed) == sorted(p.tags[0] for p in shared)
    by_tag = {p.tags[0]: p for p in shared}
    for plan in variants:
        vid = plan.tags[0].rsplit(":", 1)[1]
        last = stages[chains[vid][-1]]
        assert plan.final.base == f"imgbuild-shared/team_mx:{last.key}"
        own = plans[vid].final.steps[sum(len(stages[k].steps) for k in chains[vid]):]
        assert plan.final.steps == own  # the shared steps are not run again
        assert by_tag[plan.final.base].final.steps == last.steps
    # every shared step ran exactly once across all builds: in its stage's build, never in a variant's
    # (one equal step may stand in two stages, cuda-path after each CUDA's layer: once in each)
    ran = [s for p in built for s in p.final.steps]
    assert all(ran.count(step) == sum(step in other.steps for other in stages.values())
               for st in stages.values() for step in st.steps)


def test_no_cache_on_a_named_builder_keeps_the_shared_prefix_in_each_variant(tmp_path):
    m = two_by_two(tmp_path)
    built: list = []

    class Builder(FakeEngine):  # a named builder cannot see the engine's images
        capabilities = FakeEngine.capabilities - {"engine-store"}

    def runner(plan, engine, options, on_line, on_event=None):
        built.append(plan)
        result = BuildResult(image_id="sha256:" + "cd" * 32, tags=plan.tags, log_tail="", cached_steps=0,
                             run_steps=1, seconds=0.0)
        return BuildReport(BuildOutcome(plan, engine.name, result, size=1))

    build_all(m, Builder(), BuildOptions(no_cache=True), jobs=1, hooks=BuildHooks(runner=runner))
    assert len(built) == 4 and not any(p.final.base.startswith("imgbuild-shared/") for p in built)


def test_matrix_key_and_value_errors_come_in_one_pass(tmp_path):
    """A value error used to show only after every key error was fixed (issue 21: 11)."""
    path = recipe(tmp_path, '  cuda.version: ["12.1", 12]\n  pythn: ["3.10"]\n  python: ["3.x"]')
    with pytest.raises(RecipeError) as info:
        pipeline.load_matrix(path)
    assert [i.key for i in info.value.issues] == ["matrix.cuda.version[1]", "matrix.pythn", "matrix.python[0]"]
