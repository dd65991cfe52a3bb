"""Recipe loading: valid recipes load; every bad one names file, line and key."""

from pathlib import Path

import pytest
from helpers import REPO, write_recipe

from buildkit_py.errors import RecipeError
from buildkit_py.recipe.model import load_recipe, parse_size

GOOD = """\
name: team/trainer
version: "1.0"
cuda:
  version: "12.4.1"
  flavor: runtime
  source: wheels
base:
  image: debian:bookworm-slim
python: "3.11"
pip: ["numpy==1.26.4"]
"""


def issues(tmp_path: Path, text: str):
    path = write_recipe(tmp_path, text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    return path, info.value.issues


def test_example_recipes_load():
    for path in sorted((REPO / "recipes").glob("*.yaml")):
        recipe = load_recipe(path)
        assert recipe.name and recipe.cuda.version and recipe.python


def test_good_recipe_fields(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path, GOOD))
    assert recipe.name == "team/trainer"
    assert recipe.cuda.version == "12.4.1" and recipe.cuda.source == "wheels"
    assert recipe.pip == ("numpy==1.26.4",)
    assert recipe.lines["cuda.version"] == 4


def test_unquoted_versions_keep_their_text(tmp_path):
    # YAML reads 3.10 as the float 3.1: the loader uses the text the user wrote.
    text = GOOD.replace('python: "3.11"', "python: 3.10").replace('version: "12.4.1"', "version: 12.4")
    recipe = load_recipe(write_recipe(tmp_path, text))
    assert recipe.python == "3.10"
    assert recipe.cuda.version == "12.4"


@pytest.mark.parametrize(("edit", "line", "key", "words"), [
    (("python: \"3.11\"", "python: \"3.11\"\ntorchh: \"2.4.1\""), 10, "torchh", "did you mean 'torch'"),
    (("flavor: runtime", "flavor: slim"), 5, "cuda.flavor", "not one of base, runtime, devel"),
    (('version: "12.4.1"', 'version: "twelve"'), 4, "cuda.version", "not a CUDA version"),
    (('pip: ["numpy==1.26.4"]', 'pip: ["numpy>=1.26"]'), 10, "pip[0]", "not pinned"),
    (('pip: ["numpy==1.26.4"]', 'pip: ["numpy"]'), 10, "pip[0]", "not pinned"),
    (('pip: ["numpy==1.26.4"]', 'pip: "numpy==1.26.4"'), 10, "pip", "must be a list"),
    (("name: team/trainer", "name: Team/Trainer"), 1, "name", "valid image repository"),
    (("name: team/trainer", "name: 127.0.0.1:5000/team/trainer:1"), 1, "name", "no registry"),
    (("image: debian:bookworm-slim", "image: 'debian:bookworm slim'"), 8, "base.image", "valid image reference"),
    (('python: "3.11"', 'python: "3"'), 9, "python", "Python version"),
    (('python: "3.11"', 'python: ["3.11"]'), 9, "python", "must be a string"),
])
def test_bad_recipe_names_line_and_key(tmp_path, edit, line, key, words):
    path, found = issues(tmp_path, GOOD.replace(*edit))
    match = [i for i in found if i.key == key]
    assert match, f"no issue for {key}: {found}"
    assert match[0].line == line
    assert words in match[0].message
    assert match[0].file == str(path)
    assert match[0].render().startswith(f"{path}:{line}: {key}:")


def test_all_issues_reported_together(tmp_path):
    text = GOOD.replace("flavor: runtime", "flavor: slim").replace('"numpy==1.26.4"', '"numpy"')
    _, found = issues(tmp_path, text)
    assert {i.key for i in found} == {"cuda.flavor", "pip[0]"}


def test_missing_required_keys(tmp_path):
    _, found = issues(tmp_path, "name: team/x\n")
    assert {i.key for i in found} >= {"cuda", "python"}


def test_invalid_yaml_has_line(tmp_path):
    _, found = issues(tmp_path, "name: team/x\ncuda: [unclosed\npython: '3.11'\n")
    assert found[0].line is not None and "invalid YAML" in found[0].message


def test_duplicate_key(tmp_path):
    _, found = issues(tmp_path, GOOD + "python: \"3.10\"\n")
    assert any(i.key == "python" and "duplicate" in i.message for i in found)


def test_copy_outside_folder_refused(tmp_path):
    (tmp_path / "outside.txt").write_text("x")
    text = GOOD + "copy: [{src: ../outside.txt, dest: /app}]\n"
    _, found = issues(tmp_path / "r", text)
    assert any(i.key == "copy[0].src" and "outside the recipe's folder" in i.message for i in found)


def test_copy_missing_source(tmp_path):
    _, found = issues(tmp_path, GOOD + "copy: [{src: app/, dest: /app}]\n")
    assert any(i.key == "copy[0].src" and "does not exist" in i.message for i in found)


def test_env_value_with_newline_refused(tmp_path):
    _, found = issues(tmp_path, GOOD + 'env: {A: "x\\nRUN rm -rf /"}\n')
    assert any(i.key == "env.A" and "one line" in i.message for i in found)


def test_wheels_source_needs_base_image(tmp_path):
    _, found = issues(tmp_path, GOOD.replace("base:\n  image: debian:bookworm-slim\n", ""))
    assert any(i.key == "base" for i in found)


def test_digest_ignores_formatting(tmp_path):
    a = load_recipe(write_recipe(tmp_path / "a", GOOD))
    b = load_recipe(write_recipe(tmp_path / "b", "# comment\n" + GOOD.replace('pip: ["numpy==1.26.4"]', "pip:\n  - NumPy==1.26.4")))  # noqa: E501
    assert a.digest == b.digest
    c = load_recipe(write_recipe(tmp_path / "c", GOOD.replace("1.26.4", "1.26.3")))
    assert c.digest != a.digest


@pytest.mark.parametrize(("text", "expected"), [
    ("6GB", 6_000_000_000), ("512MiB", 512 * 2**20), ("1.5 GB", 1_500_000_000), ("100", 100), ("big", None),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_service_volumes_leave_the_image_volumes_alone(tmp_path):
    # Issue 11 item 1: parse_recipe reused one variable for both lists.
    text = GOOD + ("volumes: [/models]\nservices:\n  qdrant:\n    image: qdrant/qdrant:v1.9.0\n"
                   "    volumes: [\"qdrant-data:/qdrant/storage\"]\n  cache:\n    image: redis:7\n")
    recipe = load_recipe(write_recipe(tmp_path, text))
    assert recipe.volumes == ("/models",)
    assert {s.name: s.volumes for s in recipe.services} == {"cache": (), "qdrant": ("qdrant-data:/qdrant/storage",)}


def test_two_weights_on_one_mount_refused(tmp_path):
    text = GOOD + ("weights:\n  - {ref: 127.0.0.1:5000/w/a:1, mount: /models}\n"
                   "  - {ref: 127.0.0.1:5000/w/b:1, mount: /models/}\n")
    path, found = issues(tmp_path, text)
    assert [(i.line, i.key) for i in found] == [(13, "weights[1].mount")]
    assert "already the mount of weights[0]" in found[0].message
    assert found[0].render().startswith(f"{path}:13: weights[1].mount:")


@pytest.mark.parametrize("key", ["Team", "com.Example.Owner", "A1"])
def test_uppercase_label_keys_accepted(tmp_path, key):
    recipe = load_recipe(write_recipe(tmp_path, GOOD + f"labels: {{{key}: ml}}\n"))
    assert recipe.labels == ((key, "ml"),)


@pytest.mark.parametrize(("key", "words"), [
    ("team owner", "not a valid label key"), ("-team", "not a valid label key"), ("team.", "not a valid label key"),
    ("IO.imgbuild.cuda.version", "set by imgbuild itself"),
])
def test_bad_label_keys_still_refused(tmp_path, key, words):
    _, found = issues(tmp_path, GOOD + f"labels: {{'{key}': ml}}\n")
    assert [i.key for i in found] == [f"labels.{key}"] and words in found[0].message
