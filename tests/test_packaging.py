"""A plain (non-editable) install into a fresh venv ships the templates: `imgbuild render`
works from another folder."""

import subprocess
import sys
import venv

import pytest
from helpers import REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out),
                           str(REPO)], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and "hatchling" in proc.stderr:
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(REPO)],
                              capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    wheels = list(out.glob("imgbuild-*.whl"))
    assert len(wheels) == 1
    return wheels[0]


def test_wheel_contains_templates(wheel):
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "buildkit_py/templates/Dockerfile.j2" in names
    assert "buildkit_py/templates/steps.j2" in names
    assert any(n.startswith("buildkit_py/compat/data/") and n.endswith(".json") for n in names)


def test_fresh_venv_render_from_another_folder(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    proc = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    recipe = REPO / "recipes" / "demo.yaml"
    out = subprocess.run([str(env_dir / "bin" / "imgbuild"), "render", str(recipe)], cwd=elsewhere,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (REPO / "tests" / "golden" / "demo.Dockerfile").read_text()
    mod = subprocess.run([str(py), "-m", "buildkit_py", "--version"], cwd=elsewhere, capture_output=True, text=True)
    assert mod.returncode == 0 and mod.stdout.startswith("imgbuild ")
