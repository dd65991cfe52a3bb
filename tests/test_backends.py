"""Backend detection and capability checks, with stand-in docker clients (scripts that answer
`version` and `buildx version` like the real ones). Real builds are in test_e2e_build.py."""

import textwrap

import pytest

from buildkit_py import backends
from buildkit_py.backends import BuildRequest, detect_backend, require, required_capabilities
from buildkit_py.backends.buildx import BuildxBackend
from buildkit_py.backends.docker_cli import ClassicBuildKitBackend
from buildkit_py.errors import BackendCapabilityError, EnvironmentProblem


def fake_client(tmp_path, name, version, buildx):
    path = tmp_path / name
    path.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = version ]; then echo "{version}"; exit 0; fi
        if [ "$1" = buildx ] && [ "$2" = version ]; then {"echo 'github.com/docker/buildx v0.17.1'; exit 0" if buildx else "echo 'unknown command: docker buildx' >&2; exit 1"}; fi
        exit 1
    """))
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def clients(monkeypatch):
    found: list[str] = []
    monkeypatch.setattr(backends, "candidate_clients", lambda: found)
    monkeypatch.delenv("IMGBUILD_BACKEND", raising=False)
    return found


def test_prefers_buildx(tmp_path, clients):
    clients += [fake_client(tmp_path, "new", "28.2.2", buildx=True), fake_client(tmp_path, "old", "20.10.24+dfsg1", False)]
    assert isinstance(detect_backend(), BuildxBackend)


def test_new_client_without_buildx_is_skipped_for_classic(tmp_path, clients):
    clients += [fake_client(tmp_path, "new", "28.2.2", buildx=False), fake_client(tmp_path, "old", "20.10.24+dfsg1", False)]
    backend = detect_backend()
    assert isinstance(backend, ClassicBuildKitBackend) and backend.client.endswith("old")


def test_no_capable_client(tmp_path, clients):
    clients += [fake_client(tmp_path, "new", "28.2.2", buildx=False)]
    with pytest.raises(EnvironmentProblem) as info:
        detect_backend()
    assert "needs buildx" in info.value.message and info.value.exit_status == 3


def test_override_to_classic(tmp_path, clients):
    clients += [fake_client(tmp_path, "new", "28.2.2", buildx=True), fake_client(tmp_path, "old", "20.10.24", False)]
    assert isinstance(detect_backend("docker"), ClassicBuildKitBackend)


def test_buildx_override_without_plugin(tmp_path, clients):
    clients += [fake_client(tmp_path, "old", "20.10.24", False)]
    with pytest.raises(EnvironmentProblem):
        detect_backend("buildx")


def test_classic_refuses_cache_export_before_building(tmp_path):
    backend = ClassicBuildKitBackend("/usr/bin/docker")
    request = BuildRequest(tmp_path, tmp_path / "Dockerfile", ("x:1",), cache_to=("type=registry,ref=r/c",))
    with pytest.raises(BackendCapabilityError) as info:
        require(backend, required_capabilities(frozenset({"secrets"}), request))
    assert "cache-export" in info.value.message and info.value.exit_status == 3


def test_classic_command_line(tmp_path):
    backend = ClassicBuildKitBackend("/usr/bin/docker")
    request = BuildRequest(tmp_path / "ctx", tmp_path / "Dockerfile", ("a:1", "b:2"), labels={"k": "v"},
                           secrets={"cacert": tmp_path / "ca.pem"}, cache_from=("img:cache",))
    cmd = backend.command(request, tmp_path / "iid")
    assert cmd[:2] == ["/usr/bin/docker", "build"]
    assert ["--secret", f"id=cacert,src={tmp_path / 'ca.pem'}"] == cmd[cmd.index("--secret"):cmd.index("--secret") + 2]
    assert "--network" in cmd and cmd[cmd.index("--network") + 1] == "host"
    assert cmd.count("--tag") == 2 and cmd[-1] == str(tmp_path / "ctx")
    assert "BUILDKIT_INLINE_CACHE=1" in cmd
    # The CA bundle is a secret, never a build arg.
    assert not any("ca.pem" in a for a in cmd if a.startswith("BUILDKIT") or "=" in a and "src=" not in a)


def test_buildx_command_line(tmp_path):
    backend = BuildxBackend("/usr/bin/docker")
    request = BuildRequest(tmp_path, tmp_path / "Dockerfile", ("a:1",), cache_to=("type=registry,ref=r/c",),
                           builder="k8s")
    cmd = backend.command(request, tmp_path / "iid")
    assert cmd[:3] == ["/usr/bin/docker", "buildx", "build"]
    assert "--load" in cmd and ["--builder", "k8s"] == cmd[cmd.index("--builder"):cmd.index("--builder") + 2]
    assert ["--cache-to", "type=registry,ref=r/c"] == cmd[cmd.index("--cache-to"):cmd.index("--cache-to") + 2]
