"""The recipe's JSON Schema: valid, shipped, printed by `imgbuild schema`, the source of the
parser's key tables, and in agreement with the parser on every recipe we ship and on
structural mistakes."""

import io
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from buildkit_py.cli.main import main
from buildkit_py.errors import RecipeError
from buildkit_py.recipe import model as recipe_mod

REPO = Path(__file__).resolve().parent.parent
SCHEMA = recipe_mod.recipe_schema()
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def test_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_imgbuild_schema_prints_the_shipped_file():
    stdout = io.StringIO()
    assert main(["schema"], stdout=stdout, stderr=io.StringIO()) == 0
    assert json.loads(stdout.getvalue()) == SCHEMA


def test_parser_key_tables_come_from_the_schema():
    assert set(recipe_mod.TOP_KEYS) == set(SCHEMA["properties"])
    assert recipe_mod.CUDA_KEYS == {"version": str, "flavor": str, "cudnn": str, "source": str}
    assert recipe_mod.BUILD_KEYS == {"from_source": list, "cuda_arch": list, "jobs": int}


@pytest.mark.parametrize("path", sorted((REPO / "recipes").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_recipe_validates(path):
    errors = [e.message for e in VALIDATOR.iter_errors(yaml.safe_load(path.read_text()))]
    assert errors == []


@pytest.mark.parametrize(("patch", "schema_path"), [
    ({"colour": "red"}, []),                                   # unknown top-level key
    ({"cuda": {"version": "12.4", "flavour": "runtime"}}, ["cuda"]),
    ({"cuda": {"version": "12.4", "flavor": "full"}}, ["cuda", "flavor"]),
    ({"pip": "numpy==1.26.4"}, ["pip"]),                       # a string, not a list
    ({"runtime_compile": "yes"}, ["runtime_compile"]),
    ({"build": {"jobs": 0}}, ["build", "jobs"]),
    ({"name": "Team/Trainer"}, ["name"]),
])
def test_schema_and_parser_refuse_the_same_structural_mistakes(patch, schema_path, tmp_path):
    data = {"name": "team/app", "cuda": {"version": "12.4"}, "python": "3.11", **patch}
    errors = list(VALIDATOR.iter_errors(data))
    assert [list(e.absolute_path)[:len(schema_path)] for e in errors] == [schema_path]
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RecipeError):
        recipe_mod.load_recipe(path)


@pytest.mark.parametrize(("pointer", "regex"), [
    (("name",), recipe_mod.REPOSITORY_RE), (("version",), recipe_mod.TAG_RE),
    (("cuda", "version"), recipe_mod.CUDA_VERSION_RE), (("cuda", "cudnn"), recipe_mod.CUDNN_RE),
    (("base", "image"), recipe_mod.IMAGE_REF_RE), (("base", "os"), recipe_mod.OS_RE),
    (("base", "mirror"), recipe_mod.REGISTRY_PATH_RE), (("python",), recipe_mod.PYTHON_VERSION_RE),
    (("torch",), recipe_mod.EXACT_VERSION_RE),
])
def test_schema_patterns_are_the_parsers_patterns(pointer, regex):
    node = SCHEMA
    for key in pointer:
        node = node["properties"][key]
    assert node["pattern"].removesuffix("$") + r"\Z" == regex.pattern
