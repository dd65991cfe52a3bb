"""The file formats' schemas (buildkit_py/schemas/): each a valid draft 2020-12 schema that uses
only what our validator implements, agreeing with jsonschema on what we ship and on the
mistakes it refuses; the recipe's one published by `imgbuild schema` and named in the README's
modeline; every refusal located as file:line: key: message, all in one pass, exit 2."""

import copy
import io
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from helpers import run_cli, write_recipe

from buildkit_py import schemas
from buildkit_py.cli.main import main
from buildkit_py.errors import RecipeError
from buildkit_py.recipe import model as recipe_mod

REPO = Path(__file__).resolve().parent.parent
NAMES = ("recipe", "lock", "compat")
SCHEMA = recipe_mod.recipe_schema()
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))


def _schema_nodes(node, where="#"):
    """Every sub-schema of a schema (properties, items, $defs, ...), with where it sits."""
    yield where, node
    for key in ("properties", "$defs"):
        for name, sub in node.get(key, {}).items():
            yield from _schema_nodes(sub, f"{where}/{key}/{name}")
    for key in ("items", "additionalProperties", "propertyNames"):
        if isinstance(node.get(key), dict):
            yield from _schema_nodes(node[key], f"{where}/{key}")


@pytest.mark.parametrize("name", NAMES)
def test_each_schema_is_valid_draft_2020_12_using_only_what_the_validator_implements(name):
    schema = schemas.load_schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    for where, node in _schema_nodes(schema):
        assert set(node) <= schemas.KEYWORDS, (where, set(node) - schemas.KEYWORDS)


def test_validator_refuses_a_keyword_it_does_not_implement():
    with pytest.raises(ValueError, match="maxLength"):
        schemas.validate("abc", {"type": "string", "maxLength": 2})


def test_imgbuild_schema_prints_the_shipped_file_byte_for_byte():
    stdout = io.StringIO()
    assert main(["schema"], stdout=stdout, stderr=io.StringIO()) == 0
    assert stdout.getvalue() == schemas.schema_path("recipe").read_text(encoding="utf-8")
    assert json.loads(stdout.getvalue()) == SCHEMA


def test_readme_modeline_names_the_file_imgbuild_schema_writes():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    written = re.findall(r"^imgbuild schema > (\S+)$", readme, re.MULTILINE)
    modelines = re.findall(r"^# yaml-language-server: \$schema=(\S+)$", readme, re.MULTILINE)
    assert written and modelines, "README shows `imgbuild schema > FILE` and the modeline"
    # the YAML language server reads the modeline from a comment; a relative path is the recipe's folder
    assert {Path(m).name for m in modelines} == {Path(w).name for w in written} == {"recipe.schema.json"}
    assert all(m.startswith("./") for m in modelines)


def test_parser_key_tables_come_from_the_schema():
    assert set(recipe_mod.TOP_KEYS) == set(SCHEMA["properties"])
    assert recipe_mod.CUDA_KEYS == {"version": str, "flavor": str, "cudnn": str, "source": str}
    assert recipe_mod.BUILD_KEYS == {"from_source": list, "cuda_arch": list, "jobs": int, "installer": str}



def test_the_recipe_enumerations_are_the_schemas():
    """Issue 23: 4. cuda.flavor, cuda.source and build.installer are enums in recipe/model.py,
    the words the schema allows, in its order."""
    cuda = SCHEMA["properties"]["cuda"]["properties"]
    assert recipe_mod.CudaFlavor.words() == tuple(cuda["flavor"]["enum"])
    assert recipe_mod.CudaSource.words() == tuple(cuda["source"]["enum"])
    assert recipe_mod.InstallerName.words() == tuple(SCHEMA["properties"]["build"]["properties"]["installer"]["enum"])
    recipe = recipe_mod.load_recipe(REPO / "recipes" / "pytorch-train.yaml")
    assert type(recipe.cuda.flavor) is recipe_mod.CudaFlavor and type(recipe.cuda.source) is recipe_mod.CudaSource


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_shipped_recipe_validates_with_both_validators(path):
    data = yaml.safe_load(path.read_text())
    assert [e.message for e in VALIDATOR.iter_errors(data)] == []
    assert schemas.validate(data, SCHEMA) == []
    assert recipe_mod.load_recipe(path).name == data["name"]


def test_good_test_fixture_recipes_validate():
    for path in sorted((REPO / "tests" / "fixtures").rglob("*.yaml")):
        if "hostile" in path.parts or "compose-spec" in path.parts:
            continue  # the hostile corpus is refused on purpose; compose files are not recipes
        data = yaml.safe_load(path.read_text())
        if isinstance(data, dict) and "cuda" in data:
            assert schemas.validate(data, SCHEMA) == [], path


@pytest.mark.parametrize(("patch", "key"), [
    ({"colour": "red"}, "colour"),                                   # unknown top-level key
    ({"cuda": {"version": "12.4", "flavour": "runtime"}}, "cuda.flavour"),
    ({"cuda": {"version": "12.4", "flavor": "full"}}, "cuda.flavor"),
    ({"cuda": {"flavor": "runtime"}}, "cuda.version"),               # required key missing
    ({"pip": "numpy==1.26.4"}, "pip"),                               # a string, not a list
    ({"pip": ["numpy"]}, "pip[0]"),
    ({"runtime_compile": "yes"}, "runtime_compile"),
    ({"build": {"jobs": 0}}, "build.jobs"),
    ({"name": "Team/Trainer"}, "name"),
    ({"env": {"A B": "x"}}, "env.A B"),
    ({"workdir": "app"}, "workdir"),
    ({"services": {"app": {"image": "redis:7"}}}, "services.app"),   # the image's own service name
    ({"weights": [{"ref": "r.example.com/w:1"}]}, "weights[0].mount"),
    ({"matrix": {"python": []}}, "matrix.python"),
    ({"matrix": {"include": {"python": "3.11"}}}, "matrix.include"),
])
def test_both_validators_and_the_parser_refuse_the_same_mistakes_at_the_same_key(patch, key, tmp_path):
    data = {"name": "team/app", "cuda": {"version": "12.4"}, "python": "3.11", **patch}
    theirs = [schemas.join_path(tuple(e.absolute_path)) for e in VALIDATOR.iter_errors(data)]
    ours = [i.key for i in schemas.validate(data, SCHEMA)]
    # jsonschema reports a missing key at its parent, ours at the key itself
    assert ours == [key] and [k or "" for k in theirs] in ([key], [key.rpartition(".")[0]])
    path = write_recipe(tmp_path, yaml.safe_dump(data))
    with pytest.raises(RecipeError) as exc:
        recipe_mod.load_recipe(path)
    assert key in {i.key for i in exc.value.issues}


def test_a_recipe_with_many_mistakes_names_every_one_at_its_line_exit_2(tmp_path):
    text = ("name: Team/App\n"            # 1
            "cuda:\n"                     # 2
            "  version: twelve\n"         # 3
            "  flavour: runtime\n"        # 4
            "python: 3.10\n"              # 5  (read as written: valid)
            "pip: [numpy, 'six==1.16.0', 'six==1.16.0']\n"  # 6
            "env: {'A B': x, OK: 1}\n"    # 7
            "build: {jobs: 0}\n")         # 8
    path = write_recipe(tmp_path, text)
    code, out, err = run_cli("plan", str(path), "--json")
    assert code == 2 and "Traceback" not in err
    found = [(i["line"], i["key"]) for i in json.loads(out)["issues"]]
    assert found == [(1, "name"), (3, "cuda.version"), (4, "cuda.flavour"), (6, "pip"), (6, "pip[0]"),
                     (7, "env.A B"), (8, "build.jobs")], found
    assert f"{path}:4: cuda.flavour: unknown key (did you mean 'flavor'?)" in err
    assert f"{path}:3: cuda.version: 'twelve' is not a CUDA version like 12.4 or 12.4.1" in err


def test_numbers_are_read_as_written_where_the_schema_takes_text(tmp_path):
    path = write_recipe(tmp_path, "name: team/app\nversion: 1.10\ncuda: {version: 12.4}\npython: 3.10\n"
                                  "env: {PORT: 8080}\ncmd: [serve, 2.50]\n")
    recipe = recipe_mod.load_recipe(path)
    assert (recipe.version, recipe.cuda.version, recipe.python) == ("1.10", "12.4", "3.10")
    assert recipe.env == (("PORT", "8080"),) and recipe.cmd == ("serve", "2.50")


def test_validation_collects_everything_and_leaves_the_input_alone():
    data = {"name": 7, "cuda": {"version": None}, "python": "3.11", "pip": ["a==1", 3]}
    before = copy.deepcopy(data)
    issues = schemas.validate(data, SCHEMA)
    assert [(i.key, i.message) for i in issues] == [
        ("name", "must be a string, got a number"),
        ("cuda.version", "has no value (write a string, or remove the key)"),
        ("pip[1]", "must be a string, got a number"),
    ]
    assert data == before
