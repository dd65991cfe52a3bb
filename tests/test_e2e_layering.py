"""Layering on the real engine: an extension compiled in the builder stage ships as a wheel
only (no compiler in the final image), and the size budget fails a build that exceeds it."""

import json
import subprocess

from conftest import on_engine
from helpers import CA_ARGS, run_cli, write_recipe

# Every source build gets the CUDA devel toolchain (issue 21: 6): on a Debian base that is CUDA 13's
# nvcc wheels (CUDA 12's hold ptxas only), in the builder stage only.
COMPILED = """\
name: {name}
version: "1.0"
cuda: {{version: "13.0", source: wheels, flavor: base}}
base: {{image: {base}}}
python: "3.11"
pip: [markupsafe==2.1.5]
build: {{from_source: [markupsafe], jobs: 2}}
{extra}
"""


def docker(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["/usr/bin/docker", *args], capture_output=True, text=True, timeout=300)


@on_engine("docker26")  # ~1 GB of devel wheels in the builder; multi-stage builds run on both engines elsewhere
def test_extension_compiled_in_builder_ships_without_compiler(tmp_path, base_image, unique_name, docker_client,
                                                                cleanup_images):
    path = write_recipe(tmp_path, COMPILED.format(name=unique_name, base=base_image, extra=""))
    code, out, err = run_cli("plan", str(path), "--json")
    plan = json.loads(out)
    assert [s["name"] for s in plan["stages"]] == ["builder", "final"]
    code, out, err = run_cli("build", str(path), "--json", "--progress", "quiet", *CA_ARGS)
    assert code == 0, err
    report = json.loads(out)
    cleanup_images.extend(report["tags"])
    image = report["image_id"]
    # The C speedups module exists only if the extension was compiled.
    run = docker("run", "--rm", "--network", "none", "--entrypoint", "python", image, "-c",
                 "import markupsafe._speedups as s, markupsafe; print(markupsafe.__version__, s.__file__)")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("2.1.5 ") and run.stdout.strip().endswith(".so")
    probe = docker("run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c",
                   "for t in gcc cc g++ make nvcc; do command -v $t && exit 1; done; "
                   "ls /usr/include/python3.11/Python.h 2>/dev/null && exit 1; "
                   "ls /root/.cache/pip 2>/dev/null | grep -q . && exit 1; "
                   "ls /var/lib/apt/lists | grep -qv -e lock -e partial -e auxfiles && exit 1; echo clean")
    assert probe.stdout.strip() == "clean", probe.stdout + probe.stderr


def test_budget_exceeded_fails_with_breakdown_and_untags(tmp_path, base_image, unique_name, docker_client):
    recipe = f"""\
name: {unique_name}
cuda: {{version: "12.4", source: wheels, flavor: base}}
base: {{image: {base_image}}}
python: "3.11"
budget: {{max_size: "50MB"}}
"""
    path = write_recipe(tmp_path, recipe)
    code, out, err = run_cli("build", str(path), "--progress", "quiet", *CA_ARGS)
    assert code == 1, err
    assert "over the recipe's budget of 47.7 MiB" in err
    assert "base " in err and "os " in err  # breakdown by layer group
    assert docker("image", "inspect", f"{unique_name}:latest").returncode != 0
    # kept under :rejected, which the hint names (and `imgbuild inspect` reads)
    assert f"kept as {unique_name}:rejected" in err and f"imgbuild inspect {unique_name}:rejected" in err
    assert "flavor" not in err  # a runtime recipe: no "use a runtime flavor" (issue 22: 12)
    try:
        assert docker("image", "inspect", f"{unique_name}:rejected").returncode == 0
        code, _, err = run_cli("inspect", f"{unique_name}:rejected", "--no-compressed")
        assert code == 0, err
    finally:
        docker("image", "rm", f"{unique_name}:rejected")


def test_budget_advice_fits_the_recipe(tmp_path):
    """issue 22: 12: the hint said "use a runtime flavor" to a runtime recipe."""
    from buildkit_py.pipeline.build import budget_advice
    from buildkit_py.recipe.model import load_recipe

    def advice(cuda: str, extra: str = "") -> str:
        text = f"name: t/x\ncuda: {{version: '12.4', {cuda}}}\npython: '3.11'\n{extra}"
        return budget_advice(load_recipe(write_recipe(tmp_path, text)))

    assert "flavor" not in advice("flavor: runtime") and "flavor" not in advice("flavor: base")
    assert "heavy pins" in advice("flavor: runtime") and "budget.max_size" in advice("flavor: runtime")
    assert "cuda.flavor: runtime" in advice("flavor: devel")
    assert "flavor" not in advice("flavor: devel", "runtime_compile: true\n")  # it needs nvcc at run time
