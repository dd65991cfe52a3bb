"""The installer of the pip steps (plan/installer.py): the recipe key, the plan's steps, the
lock's steps, and the translation of a pip.conf into what uv reads."""

import subprocess

import pytest
from helpers import REPO, plan_of, write_recipe

from buildkit_py.errors import PipConfigError, RecipeError, UsageError
from buildkit_py.plan import lock
from buildkit_py.plan.installer import (
    PIP_INSTALLER,
    UV_INSTALLER,
    UV_VERSION,
    UV_WHEEL_SHA256,
    installer_for,
    uv_env_file,
    uv_env_for,
    uv_env_from_pip_config,
)
from buildkit_py.plan.lock_model import LockedPackage, VariantLock
from buildkit_py.plan.steps import LocalWheelsStep, LockedPipStep, MountStubsStep, PipStep, WheelBuildStep
from buildkit_py.recipe.model import load_recipe
from buildkit_py.render.dockerfile import render_dockerfile

RECIPE = """\
name: team/app
cuda: {{version: "12.4", source: wheels}}
base: {{image: debian:bookworm-slim}}
python: "3.11"
pip: ["six==1.16.0"]
{build}
"""
KERNELS = """\
name: team/kernels
cuda: {version: "12.4", flavor: devel}
python: "3.11"
torch: "2.4.1"
pip: ["flash-attn==2.6.3", "six==1.16.0"]
build: {from_source: [flash-attn], cuda_arch: ["9.0"], installer: uv}
"""


def recipe(tmp_path, build=""):
    return load_recipe(write_recipe(tmp_path, RECIPE.format(build=build)))


def install_steps(plan):
    return [s for stage in plan.stages for s in stage.steps if isinstance(s, (PipStep, LockedPipStep, LocalWheelsStep))]


# --- the recipe key -------------------------------------------------------------------------


def test_the_key_is_read_and_an_unknown_installer_names_its_line(tmp_path):
    assert recipe(tmp_path / "a", "build: {installer: uv}").build.installer == "uv"
    assert recipe(tmp_path / "b", "build: {installer: pip}").build.installer == "pip"
    assert recipe(tmp_path / "c").build.installer is None
    with pytest.raises(RecipeError) as info:
        recipe(tmp_path / "d", "build:\n  installer: conda")
    [issue] = [i for i in info.value.issues if i.key == "build.installer"]
    assert issue.line == 7 and "'conda' is not one of uv, pip" in issue.message


def test_an_unset_installer_leaves_the_recipe_digest_as_it_was(tmp_path):
    plain = recipe(tmp_path / "a")
    assert "installer" not in plain.normalized()["build"]
    assert recipe(tmp_path / "b", "build: {installer: uv}").digest != plain.digest


# --- the plan -------------------------------------------------------------------------------


def test_uv_installs_every_install_step_and_pip_builds_from_source(tmp_path):
    plan = plan_of(load_recipe(write_recipe(tmp_path, KERNELS)))
    steps = install_steps(plan)
    assert {type(s) for s in steps} == {PipStep, LocalWheelsStep}
    assert all(s.installer == UV_INSTALLER for s in steps)
    [wheels] = [s for s in plan.stages[0].steps if isinstance(s, WheelBuildStep)]
    assert "pip wheel" in render_dockerfile(plan) and wheels.macro == "step_pip_wheel"  # uv has no `pip wheel`


def test_uv_by_default_and_pip_by_name_each_in_a_label(tmp_path):
    assert installer_for(None) == UV_INSTALLER and installer_for("uv") == UV_INSTALLER
    assert installer_for("pip") == PIP_INSTALLER
    default = plan_of(recipe(tmp_path / "a"))
    assert all(s.installer == UV_INSTALLER for s in install_steps(default))
    assert default.labels["io.imgbuild.installer"] == f"uv {UV_VERSION}"
    plan = plan_of(recipe(tmp_path / "b", "build: {installer: pip}"))
    assert all(s.installer == PIP_INSTALLER for s in install_steps(plan))
    assert plan.labels["io.imgbuild.installer"] == "pip"
    assert "uv" not in render_dockerfile(plan).replace("io.imgbuild.installer", "")


def test_uv_mount_points_are_stubbed_before_the_reproducible_layers(tmp_path):
    plan = plan_of(recipe(tmp_path, "build: {installer: uv}"))
    [stubs] = [s for s in plan.final.steps if isinstance(s, MountStubsStep)]
    assert stubs.dirs == ("/root/.cache/uv", "/run/imgbuild-uv", "/run/secrets")
    assert stubs.files == ("/run/secrets/cacert", "/run/secrets/pipconf", "/run/secrets/uvenv")


def test_uv_is_pinned_by_version_and_the_sha256_of_its_linux_wheels():
    assert UV_INSTALLER.requirement == f"uv=={UV_VERSION} " + " ".join(f"--hash=sha256:{h}" for h in UV_WHEEL_SHA256)
    assert all(len(h) == 64 and int(h, 16) >= 0 for h in UV_WHEEL_SHA256)
    assert UV_INSTALLER.home == f"/run/imgbuild-uv/{UV_VERSION}"


def test_a_locked_step_keeps_the_installer_and_its_hashes(tmp_path):
    plan = plan_of(recipe(tmp_path, "build: {installer: uv}"))
    packages = (LockedPackage("six", "1.16.0", "ab" * 32, "pins"),
                LockedPackage("nvidia-cuda-runtime-cu12", "12.4.127", "cd" * 32, "cuda"))
    locked = lock.apply_lock(plan, VariantLock({}, lock.lock_inputs(plan), {"final": packages}))
    steps = [s for s in locked.final.steps if isinstance(s, LockedPipStep)]
    assert [s.id for s in steps] == ["cuda", "pins"] and all(s.installer == UV_INSTALLER for s in steps)
    text = render_dockerfile(locked)
    assert text.count('"$uv" pip install --python "$(command -v python)" --no-deps --require-hashes') == 2


# --- pip.conf -> uv -------------------------------------------------------------------------

PIP_CONF = """\
[global]
index-url = https://user:p%40ss@mirror.example/simple
extra-index-url =
    http://127.0.0.1:8080/simple
    https://other.example/simple
trusted-host = 127.0.0.1
timeout = 60
disable-pip-version-check = true

[install]
timeout = 90
retries = 7
no_cache_dir = yes
"""


def test_a_pip_conf_becomes_uv_variables_with_install_over_global():
    assert uv_env_from_pip_config(PIP_CONF) == {
        "UV_EXTRA_INDEX_URL": "http://127.0.0.1:8080/simple https://other.example/simple",
        "UV_HTTP_RETRIES": "7",
        "UV_HTTP_TIMEOUT": "90",
        "UV_INDEX_STRATEGY": "unsafe-best-match",  # pip's choice over several indexes
        "UV_INDEX_URL": "https://user:p%40ss@mirror.example/simple",
        "UV_INSECURE_HOST": "127.0.0.1",
        "UV_NO_CACHE": "1",
    }


@pytest.mark.parametrize(("conf", "env"), [
    ("[global]\nproxy = http://proxy:3128\n", {"HTTPS_PROXY": "http://proxy:3128", "HTTP_PROXY": "http://proxy:3128"}),
    ("[global]\npre = true\n", {"UV_PRERELEASE": "allow"}),
    ("[global]\npre = false\n", {}),
    ("[global]\nonly-binary = :all:\n", {"UV_NO_BUILD": "1"}),
    ("[global]\nno-binary = b,a\n", {"UV_NO_BINARY_PACKAGE": "a b"}),
    ("[global]\nfind-links = https://wheels.example/\n", {"UV_FIND_LINKS": "https://wheels.example/"}),
    ("[freeze]\nall = true\n", {}),  # another command's section: pip install does not read it
])
def test_each_translated_key(conf, env):
    assert uv_env_from_pip_config(conf) == env


def test_keys_uv_cannot_honour_are_an_error_naming_every_one():
    conf = "[global]\nconstraint = /etc/c.txt\nindex-url = https://x/simple\n[install]\nupgrade-strategy = eager\n"
    with pytest.raises(UsageError) as info:
        uv_env_from_pip_config(conf, "/etc/team/pip.conf")
    assert info.value.message == ("--pip-config /etc/team/pip.conf: uv has no equivalent for [global] constraint, "
                                  "[install] upgrade-strategy")
    assert "build.installer: pip" in info.value.hint


def test_a_cert_path_is_the_ca_cert_bundles_job():
    conf = "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n"
    assert uv_env_from_pip_config(conf, ca_cert=True) == {}
    with pytest.raises(UsageError) as info:
        uv_env_from_pip_config(conf)
    assert "[global] cert" in info.value.message and "--ca-cert" in info.value.hint


def test_a_file_that_is_not_ini_is_a_usage_error():
    with pytest.raises(UsageError, match="not a pip.conf"):
        uv_env_from_pip_config("index-url = https://x/simple\n")


def test_the_env_file_is_sourced_by_sh_with_every_value_intact(tmp_path):
    env = {"UV_INDEX_URL": "https://u:it's$HOME`x`@h/simple", "UV_INSECURE_HOST": "a b"}
    path = tmp_path / "uvenv"
    path.write_text(uv_env_file(env))
    out = subprocess.run(["sh", "-c", '. "$1"; printf "%s|%s" "$UV_INDEX_URL" "$UV_INSECURE_HOST"', "sh", str(path)],
                         capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"})
    assert out.stdout == "https://u:it's$HOME`x`@h/simple|a b"
    with pytest.raises(UsageError):
        uv_env_file({"UV_INDEX_URL": "a\nb"})


def test_the_secret_is_made_only_for_a_uv_build_with_a_pip_conf(tmp_path):
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = https://mirror.example/simple\n")
    uv_plan = plan_of(recipe(tmp_path / "a", "build: {installer: uv}"))
    pip_plan = plan_of(recipe(tmp_path / "b", "build: {installer: pip}"))
    assert uv_env_for(uv_plan, conf, ca_cert=False) == "export UV_INDEX_URL=https://mirror.example/simple\n"
    assert uv_env_for(uv_plan, None, ca_cert=False) is None
    assert uv_env_for(pip_plan, conf, ca_cert=False) is None  # pip reads the pip.conf itself
    # ... but a file pip would refuse stops the build before it starts, whichever installer reads it
    conf.write_text("[global]\nindex-url = https://a.example/simple\nindex-url = https://b.example/simple\n")
    for plan in (uv_plan, pip_plan):
        with pytest.raises(PipConfigError, match=r":3: \[global\] index-url: set twice"):
            uv_env_for(plan, conf, ca_cert=False)


def test_a_bake_file_checks_the_pip_conf_for_uv_and_needs_a_folder_for_it(tmp_path):

    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nconstraint = /etc/c.txt\n")
    from buildkit_py import pipeline
    from buildkit_py.engine import bake

    matrix = pipeline.load_matrix(REPO / "recipes" / "matrix.yaml")
    with pytest.raises(UsageError, match=r"uv has no equivalent for \[global\] constraint"):
        bake.write_bake(matrix, tmp_path / "bake", pip_config=conf)
    assert not (tmp_path / "bake").exists()  # refused before anything is written
    conf.write_text("[global]\nindex-url = https://mirror.example/simple\n")
    with pytest.raises(UsageError, match="beside the bake file"):
        bake.bake_file(matrix, pip_config=conf)  # the JSON alone has nowhere to put the translation
    assert bake.bake_file(matrix)  # without one it bakes
