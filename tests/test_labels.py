"""The image contract in labels: version and git facts as the image should claim them."""

import subprocess

import pytest
from helpers import write_recipe

from buildkit_py.plan import labels as L
from buildkit_py.plan.build_plan import make_plan
from buildkit_py.recipe.model import load_recipe

RECIPE = """\
name: team/x
cuda: {version: "12.4", source: wheels}
base: {image: debian:bookworm-slim}
python: "3.11"
"""


def test_no_version_labels_latest_like_the_tag(tmp_path):
    plan = make_plan(load_recipe(write_recipe(tmp_path, RECIPE)))
    assert list(plan.tags) == ["team/x:latest"]
    assert plan.labels[L.OCI + "version"] == "latest"
    plan = make_plan(load_recipe(write_recipe(tmp_path, RECIPE + "version: '2.1'\n")))
    assert plan.labels[L.OCI + "version"] == "2.1"


@pytest.mark.parametrize(("cuda", "driver_min"), [("12.4", "550.54.15"), ("13.2", "595.71.05"),
                                                 ("13.3", None), ("13.4", None)])
def test_driver_min_label_only_where_nvidia_publishes_a_floor(tmp_path, cuda, driver_min):
    """CUDA 13.3-13.5 have no Table 3 row: their native floor is unknown, so no driver.min label is
    stamped; the minor-version floor (a fact) is, and plan says the same (issue 21: 2)."""
    plan = make_plan(load_recipe(write_recipe(tmp_path, RECIPE.replace('"12.4"', f'"{cuda}"'))))
    assert plan.labels.get(L.DRIVER_MIN) == driver_min
    assert plan.labels[L.DRIVER_MIN_COMPAT] == ("525.60.13" if cuda.startswith("12") else "580")
    assert plan.resolution.min_driver == driver_min


def git(folder, *args):
    subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@example.com", "HOME": str(folder), "PATH": "/usr/bin:/bin"})


@pytest.fixture
def repo(tmp_path):
    git(tmp_path, "init", "-q")
    recipe = write_recipe(tmp_path / "recipes", RECIPE)
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "recipe")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    return recipe, head


def test_revision_of_a_clean_tree_is_head(repo):
    recipe, head = repo
    (recipe.parent / "notes.txt").write_text("untracked files do not make a tree dirty (git describe --dirty)")
    assert L.git_facts(recipe.parent) == (head, None)


def test_revision_of_a_dirty_tree_says_so(repo):
    recipe, head = repo
    recipe.write_text(RECIPE + "version: '9'\n")
    assert L.git_facts(recipe.parent) == (f"{head}-dirty", None)
    git(recipe.parent, "add", "-A")  # staged, not committed: still no commit holds it
    revision = L.volatile_labels(load_recipe(recipe))[L.OCI + "revision"]
    assert revision == f"{head}-dirty"


def test_no_repository_no_revision(tmp_path):
    recipe = write_recipe(tmp_path, RECIPE)
    assert L.git_facts(recipe.parent) == (None, None)
    assert L.OCI + "revision" not in L.volatile_labels(load_recipe(recipe))
