"""The image contract in labels: version and git facts as the image should claim them."""

import os
import subprocess

import pytest
from helpers import plan_of, write_recipe

from buildkit_py import label_keys as K
from buildkit_py.errors import UsageError
from buildkit_py.pipeline import sources as S
from buildkit_py.recipe.model import load_recipe

RECIPE = """\
name: team/x
cuda: {version: "12.4", source: wheels}
base: {image: debian:bookworm-slim}
python: "3.11"
"""


def test_the_label_names_are_the_published_contract():
    """The one place the tests spell the label names: users and other tools read them (README,
    "Labels"); a renamed constant must fail here, not pass everywhere that imports it."""
    keys = {k: v for k, v in vars(K).items() if k.isupper() and k != "PREFIX"}
    assert keys == {
        "CUDA_VERSION": "io.imgbuild.cuda.version", "CUDA_FLAVOR": "io.imgbuild.cuda.flavor",
        "CUDA_SOURCE": "io.imgbuild.cuda.source", "DRIVER_MIN": "io.imgbuild.cuda.driver.min",
        "DRIVER_MIN_COMPAT": "io.imgbuild.cuda.driver.min-compat", "CUDNN_VERSION": "io.imgbuild.cudnn.version",
        "TORCH_VERSION": "io.imgbuild.torch.version", "PYTHON_VERSION": "io.imgbuild.python.version",
        "INSTALLER": "io.imgbuild.installer", "OS": "io.imgbuild.os", "CUDA_ARCH": "io.imgbuild.cuda.arch",
        "GPUS": "io.imgbuild.gpus",
        "RECIPE_DIGEST": "io.imgbuild.recipe.digest", "WEIGHTS": "io.imgbuild.weights",
        "SBOM": "io.imgbuild.sbom", "SBOM_PLATFORM": "io.imgbuild.sbom.platform",
        "OCI_PREFIX": "org.opencontainers.image.",
        "OCI_TITLE": "org.opencontainers.image.title", "OCI_VERSION": "org.opencontainers.image.version",
        "OCI_BASE_NAME": "org.opencontainers.image.base.name",
        "OCI_BASE_DIGEST": "org.opencontainers.image.base.digest",
        "OCI_CREATED": "org.opencontainers.image.created", "OCI_REVISION": "org.opencontainers.image.revision",
        "OCI_SOURCE": "org.opencontainers.image.source",
    }


def test_no_module_but_label_keys_spells_a_label_name():
    """Issue 23: 3. The names lived in plan/labels.py and again as literals in 6 modules (the
    resolver, the recipe, lock, check, ...); now label_keys.py is their one home."""
    import ast
    import re

    from helpers import REPO

    name = re.compile(r"(io\.imgbuild\.|org\.opencontainers\.image\.)[a-z0-9.-]*")
    found = []
    for path in sorted((REPO / "buildkit_py").rglob("*.py")):
        if path.name == "label_keys.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and name.fullmatch(node.value):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value}")
    assert found == []


def test_no_version_labels_latest_like_the_tag(tmp_path):
    plan = plan_of(load_recipe(write_recipe(tmp_path, RECIPE)))
    assert list(plan.tags) == ["team/x:latest"]
    assert plan.labels[K.OCI_VERSION] == "latest"
    plan = plan_of(load_recipe(write_recipe(tmp_path, RECIPE + "version: '2.1'\n")))
    assert plan.labels[K.OCI_VERSION] == "2.1"


@pytest.mark.parametrize(("cuda", "driver_min"), [("12.4", "550.54.15"), ("13.2", "595.71.05"),
                                                 ("13.3", None), ("13.4", None)])
def test_driver_min_label_only_where_nvidia_publishes_a_floor(tmp_path, cuda, driver_min):
    """CUDA 13.3-13.5 have no Table 3 row: their native floor is unknown, so no driver.min label is
    stamped; the minor-version floor (a fact) is, and plan says the same (issue 21: 2)."""
    plan = plan_of(load_recipe(write_recipe(tmp_path, RECIPE.replace('"12.4"', f'"{cuda}"'))))
    assert plan.labels.get(K.DRIVER_MIN) == driver_min
    assert plan.labels[K.DRIVER_MIN_COMPAT] == ("525.60.13" if cuda.startswith("12") else "580")
    assert plan.resolution.min_driver == driver_min


def git(folder, *args, date: str | None = None):
    dates = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date} if date else {}
    subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@example.com", "HOME": str(folder), "PATH": "/usr/bin:/bin",
                        **dates})


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
    assert S.git_facts(recipe.parent) == (head, None)


def test_revision_of_a_dirty_tree_says_so(repo):
    recipe, head = repo
    recipe.write_text(RECIPE + "version: '9'\n")
    assert S.git_facts(recipe.parent) == (f"{head}-dirty", None)
    git(recipe.parent, "add", "-A")  # staged, not committed: still no commit holds it
    revision = S.volatile_labels(load_recipe(recipe), source_date_epoch=None)[K.OCI_REVISION]
    assert revision == f"{head}-dirty"


def test_no_repository_no_revision(tmp_path):
    recipe = write_recipe(tmp_path, RECIPE)
    assert S.git_facts(recipe.parent) == (None, None)
    assert K.OCI_REVISION not in S.volatile_labels(load_recipe(recipe), source_date_epoch=None)


# --- created: when the inputs last changed, never the clock (issue 22 item 6) --------------------
# Before, org.opencontainers.image.created was the time of the build: every rebuild of an unchanged
# recipe got a new image id and digest, moved the sha-<recipe> tag and broke digest pins.

COMMITTED = "2001-02-03T04:05:06Z"
COPY_RECIPE = RECIPE + "copy: [{src: app/, dest: /app}]\n"


def created(recipe_path, environ=None) -> str:
    epoch = (environ or {}).get("SOURCE_DATE_EPOCH")
    return S.created_time(load_recipe(recipe_path), epoch).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_mtime(path, stamp: int) -> None:
    os.utime(path, (stamp, stamp))


@pytest.fixture
def committed(tmp_path):
    """A recipe with a copy: folder, committed at COMMITTED; a README beside it."""
    git(tmp_path, "init", "-q")
    recipe = write_recipe(tmp_path / "recipes", COPY_RECIPE)
    (recipe.parent / "app").mkdir()
    (recipe.parent / "app" / "main.py").write_text("print(1)\n")
    (recipe.parent / "README.md").write_text("notes\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "recipe", date=COMMITTED)
    return recipe


def test_created_of_a_committed_recipe_is_its_commit_time_on_every_build(committed):
    labels = S.volatile_labels(load_recipe(committed), source_date_epoch=None)  # the labels a build gets
    assert labels[K.OCI_CREATED] == COMMITTED
    assert created(committed) == COMMITTED
    (committed.parent / "README.md").write_text("edited: not an input of the build\n")
    (committed.parent / "notes.txt").write_text("untracked, not an input either\n")
    assert created(committed) == COMMITTED
    git(committed.parent, "commit", "-q", "-am", "readme", date="2005-01-01T00:00:00Z")
    assert created(committed) == COMMITTED  # the last commit that touched the inputs


def test_created_of_an_uncommitted_change_is_the_newest_input_mtime(committed):
    main = committed.parent / "app" / "main.py"
    main.write_text("print(2)\n")
    for path, stamp in ((committed, 1_000_000_000), (main, 1_100_000_000), (committed.parent / "app", 1_000_000_000)):
        set_mtime(path, stamp)
    assert created(committed) == "2004-11-09T11:33:20Z"  # main.py's
    assert created(committed) == "2004-11-09T11:33:20Z"  # a rebuild of the same files: the same
    set_mtime(main, 1_200_000_000)
    assert created(committed) == "2008-01-10T21:20:00Z"  # edited (touched) again: later


def test_an_untracked_input_counts_as_uncommitted(committed):
    new = committed.parent / "app" / "new.py"
    new.write_text("x = 1\n")
    for path in (committed, committed.parent / "app", committed.parent / "app" / "main.py"):
        set_mtime(path, 1_000_000_000)
    set_mtime(new, 1_050_000_000)
    assert created(committed) == "2003-04-10T18:40:00Z"


def test_created_without_a_repository_is_the_newest_input_mtime(tmp_path):
    recipe = write_recipe(tmp_path, COPY_RECIPE)
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.py").write_text("print(1)\n")
    (tmp_path / "unrelated.bin").write_text("not read by the build")
    for path, stamp in ((recipe, 1_000_000_000), (tmp_path / "app", 900_000_000), (tmp_path / "app" / "main.py",
                                                                                    950_000_000)):
        set_mtime(path, stamp)
    set_mtime(tmp_path / "unrelated.bin", 1_300_000_000)
    assert created(recipe) == "2001-09-09T01:46:40Z"  # the recipe's: newest of what the build reads
    lock = recipe.with_suffix(".lock")
    lock.write_text("# a lock file beside the recipe is an input\n")
    set_mtime(lock, 1_010_000_000)
    assert created(recipe) == "2002-01-02T19:33:20Z"


def test_source_date_epoch_wins_and_must_be_seconds(committed):
    assert created(committed, {"SOURCE_DATE_EPOCH": "1700000000"}) == "2023-11-14T22:13:20Z"
    assert created(committed, {"SOURCE_DATE_EPOCH": ""}) == COMMITTED  # set but empty: as unset
    with pytest.raises(UsageError, match="SOURCE_DATE_EPOCH='yesterday'"):
        created(committed, {"SOURCE_DATE_EPOCH": "yesterday"})
