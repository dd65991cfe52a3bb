"""The buildah engine without building: buildah builds and pushes, podman (the same containers
storage) inspects and runs; choosing it, and refusing a missing or old buildah or podman. Real
builds, pushes and image tests on buildah are in test_e2e_engines.py and test_e2e_build.py (the
engine contract, IMGBUILD_TEST_ENGINES=buildah)."""

import textwrap

import pytest

from buildkit_py.engine import CACHE_FROM, BuildRequest, require, required_capabilities, select_engine
from buildkit_py.engine.kinds.buildah import BuildahEngine, buildah_version
from buildkit_py.engine.run import RunSpec
from buildkit_py.errors import EngineCapabilityError, EnvironmentProblem


def fake_tool(tmp_path, name: str, answer: str) -> str:
    """A stand-in binary that prints ``answer`` when asked its version (`podman version --format`,
    `buildah --version`) and fails at anything else."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$1" in version|--version) echo "{answer}"; exit 0;; esac
        exit 1
    """))
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def tools(tmp_path, monkeypatch):
    monkeypatch.setenv("IMGBUILD_PODMAN", fake_tool(tmp_path, "podman", "4.3.1"))
    monkeypatch.setenv("IMGBUILD_BUILDAH", fake_tool(tmp_path, "buildah", "buildah version 1.28.2 (image-spec 1.1.0)"))
    return tmp_path


def test_buildah_builds_and_pushes_podman_reads_and_runs(tools):
    engine = select_engine("buildah")
    assert isinstance(engine, BuildahEngine) and (engine.buildah_version, engine.version) == ((1, 28, 2), (4, 3, 1))
    assert engine.describe() == f"buildah engine ({tools / 'buildah'} 1.28.2, with {tools / 'podman'} for the store)"
    cmd = engine.command(BuildRequest(tools / "ctx", tools / "Dockerfile", ("a:1",)), tools / "iid")
    assert cmd[:6] == [str(tools / "buildah"), "build", "--layers", "--format", "docker", "--iidfile"]
    assert engine.client_argv() == [str(tools / "podman")]  # image tests and `imgbuild run` go through podman
    argv = engine.run_argv(RunSpec("team/x:1", gpu=True, network="none", command=("true",)))
    assert argv[:5] == (str(tools / "podman"), "run", "--rm", "--device", "nvidia.com/gpu=all")


def test_buildah_refuses_what_only_buildkit_does(tools):
    request = BuildRequest(tools, tools / "D", ("x:1",), cache_from=("r/c:1",))
    with pytest.raises(EngineCapabilityError) as info:
        require(select_engine("buildah"), required_capabilities(frozenset(), request))
    assert "buildah engine" in info.value.message and CACHE_FROM in info.value.message
    assert (info.value.hint or "").endswith("buildah reuses the layers in its own storage; "
                                            "a registry cache needs --engine buildx")
    with pytest.raises(EngineCapabilityError, match="--builder k8s needs buildx, not buildah"):
        select_engine("buildah", builder="k8s")


def test_buildah_missing_or_old(tools, monkeypatch):
    monkeypatch.setenv("IMGBUILD_BUILDAH", fake_tool(tools, "old-buildah", "buildah version 1.23.1 (x)"))
    with pytest.raises(EnvironmentProblem, match=r"buildah 1\.23\.1; imgbuild needs buildah 1\.24 or newer") as info:
        select_engine("buildah")
    assert info.value.exit_status == 3
    monkeypatch.setenv("IMGBUILD_BUILDAH", str(tools / "none"))
    with pytest.raises(EnvironmentProblem, match="IMGBUILD_BUILDAH=.*: no such executable"):
        select_engine("buildah")


def test_buildah_needs_podman_for_the_store(tools, monkeypatch):
    monkeypatch.setenv("IMGBUILD_PODMAN", str(tools / "none"))
    with pytest.raises(EnvironmentProblem, match="--engine buildah: IMGBUILD_PODMAN=.*: no such executable"):
        select_engine("buildah")


def test_buildah_version_text():
    assert buildah_version("buildah version 1.28.2 (image-spec 1.1.0-rc2, runtime-spec 1.0.2-dev)") == (1, 28, 2)
    assert buildah_version("buildah version 1.39 (x)") == (1, 39)
    assert buildah_version("command not found") is None
