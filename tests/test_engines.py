"""Engine selection and capability checks, with stand-in docker clients (scripts that answer
`version` and `buildx version` like the real ones). Real builds are in test_e2e_build.py."""

import textwrap

import pytest

from buildkit_py import engine as engine_pkg
from buildkit_py.engine import BuildRequest, kind_names, require, required_capabilities, select_engine
from buildkit_py.engine.base import cache_export_value
from buildkit_py.engine.kinds.buildx import BuilderEngine, BuildxEngine
from buildkit_py.engine.kinds.docker import ClassicEngine
from buildkit_py.errors import EngineCapabilityError, EnvironmentProblem


def fake_client(tmp_path, name, version, buildx):
    path = tmp_path / name
    path.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = version ]; then echo "{version}"; exit 0; fi
        if [ "$1" = buildx ] && [ "$2" = version ]; then {"echo 'github.com/docker/buildx v0.17.1'; exit 0" if buildx else "echo 'unknown command: docker buildx' >&2; exit 1"}; fi
        exit 1
    """))  # noqa: E501
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def clients(monkeypatch):
    found: list[str] = []
    monkeypatch.setattr("buildkit_py.engine.kinds.docker.candidate_clients", lambda: found)  # the docker kinds call it
    monkeypatch.delenv("IMGBUILD_BACKEND", raising=False)
    return found


def test_prefers_buildx(tmp_path, clients):
    clients += [fake_client(tmp_path, "new", "28.2.2", buildx=True), fake_client(tmp_path, "old", "20.10.24+dfsg1", False)]  # noqa: E501
    assert isinstance(select_engine(), BuildxEngine)


def test_new_client_without_buildx_is_skipped_for_classic(tmp_path, clients):
    clients += [fake_client(tmp_path, "new", "28.2.2", buildx=False), fake_client(tmp_path, "old", "20.10.24+dfsg1", False)]  # noqa: E501
    engine = select_engine()
    assert isinstance(engine, ClassicEngine) and engine.client.endswith("old")


def test_no_capable_client(tmp_path, clients):
    clients += [fake_client(tmp_path, "new", "28.2.2", buildx=False)]
    with pytest.raises(EnvironmentProblem) as info:
        select_engine()
    assert "needs buildx" in info.value.message and info.value.exit_status == 3


def test_override_to_classic(tmp_path, clients):
    clients += [fake_client(tmp_path, "new", "28.2.2", buildx=True), fake_client(tmp_path, "old", "20.10.24", False)]
    assert isinstance(select_engine("docker"), ClassicEngine)


def test_buildx_override_without_plugin(tmp_path, clients):
    clients += [fake_client(tmp_path, "old", "20.10.24", False)]
    with pytest.raises(EnvironmentProblem):
        select_engine("buildx")


def test_classic_refuses_cache_export_before_building(tmp_path):
    engine = ClassicEngine("/usr/bin/docker")
    request = BuildRequest(tmp_path, tmp_path / "Dockerfile", ("x:1",), cache_to=("type=registry,ref=r/c",))
    with pytest.raises(EngineCapabilityError) as info:
        require(engine, required_capabilities(frozenset({"secrets"}), request))
    assert "cache-export" in info.value.message and info.value.exit_status == 3


def test_classic_command_line(tmp_path):
    engine = ClassicEngine("/usr/bin/docker")
    request = BuildRequest(tmp_path / "ctx", tmp_path / "Dockerfile", ("a:1", "b:2"), labels={"k": "v"},
                           secrets={"cacert": tmp_path / "ca.pem"}, cache_from=("img:cache",))
    cmd = engine.command(request, tmp_path / "iid")
    assert cmd[:2] == ["/usr/bin/docker", "build"]
    assert ["--secret", f"id=cacert,src={tmp_path / 'ca.pem'}"] == cmd[cmd.index("--secret"):cmd.index("--secret") + 2]
    assert "--network" in cmd and cmd[cmd.index("--network") + 1] == "host"
    assert cmd.count("--tag") == 2 and cmd[-1] == str(tmp_path / "ctx")
    assert "BUILDKIT_INLINE_CACHE=1" in cmd
    # The CA bundle is a secret, never a build arg.
    assert not any("ca.pem" in a for a in cmd if a.startswith("BUILDKIT") or "=" in a and "src=" not in a)


def test_buildx_command_line(tmp_path):
    engine = BuildxEngine("/usr/bin/docker")
    request = BuildRequest(tmp_path, tmp_path / "Dockerfile", ("a:1", "a:2"), cache_to=("type=registry,ref=r/c",),
                           builder="k8s")
    cmd = engine.command(request, tmp_path / "iid", tmp_path / "md.json")
    assert cmd[:3] == ["/usr/bin/docker", "buildx", "build"]
    assert ["--builder", "k8s"] == cmd[cmd.index("--builder"):cmd.index("--builder") + 2]
    # one compression forced on the exported cache (cache_export_value)
    assert ["--cache-to", "type=registry,ref=r/c,compression=gzip,force-compression=true"] == \
        cmd[cmd.index("--cache-to"):cmd.index("--cache-to") + 2]
    # the names go in the output (one quoted CSV field), not as --tag; no push unless asked
    assert cmd[cmd.index("--output") + 1] == 'type=image,"name=a:1,a:2"'
    assert "--tag" not in cmd and ["--metadata-file", str(tmp_path / "md.json")] == \
        cmd[cmd.index("--metadata-file"):cmd.index("--metadata-file") + 2]


@pytest.mark.parametrize(("value", "compression", "expected"), [
    ("type=registry,ref=r/c,mode=max", None, "type=registry,ref=r/c,mode=max,compression=gzip,force-compression=true"),
    ("type=local,dest=/c", "zstd:3", "type=local,dest=/c,compression=zstd,force-compression=true,compression-level=3"),
    ("type=registry,ref=r/c", "estargz", "type=registry,ref=r/c,compression=estargz,force-compression=true"),
    # the user's own choice stands; inline cache rides in the image and takes no compression
    ("type=registry,ref=r/c,compression=zstd", "gzip", "type=registry,ref=r/c,compression=zstd"),
    ("type=registry,ref=r/c,force-compression=false", None, "type=registry,ref=r/c,force-compression=false"),
    ("type=inline", "zstd", "type=inline"),
])
def test_cache_export_forces_one_compression(value, compression, expected):
    """moby/buildkit#6088: unforced, the exporter walks every compression variant of every layer."""
    assert cache_export_value(value, compression) == expected


def test_buildx_push_and_output_options(tmp_path):
    engine = BuildxEngine("/usr/bin/docker", buildx=["/opt/x/docker-buildx"])
    request = BuildRequest(tmp_path, tmp_path / "Dockerfile", ("r/a:1",), push=True, compression="zstd:19",
                           oci_mediatypes=True, provenance="min", platforms=("linux/amd64",))
    cmd = engine.command(request, tmp_path / "iid")
    assert cmd[:2] == ["/opt/x/docker-buildx", "build"]  # the plugin run standalone
    assert cmd[cmd.index("--output") + 1] == ("type=image,name=r/a:1,push=true,compression=zstd,"
                                              "force-compression=true,compression-level=19,oci-mediatypes=true")
    assert cmd[cmd.index("--provenance") + 1] == "mode=min" and cmd[cmd.index("--platform") + 1] == "linux/amd64"
    no_prov = engine.command(BuildRequest(tmp_path, tmp_path / "D", ("x:1",), provenance="false"), tmp_path / "i")
    assert no_prov[no_prov.index("--provenance") + 1] == "false"


def test_buildx_passes_source_date_epoch_without_rewriting_timestamps(tmp_path):
    """BuildKit dates the config and history by SOURCE_DATE_EPOCH (issue 33: 1). rewrite-timestamp
    is not asked for: Docker 26's docker driver fails the build with it ("conflicts with unpack")."""
    request = BuildRequest(tmp_path, tmp_path / "D", ("x:1",), build_args={"SOURCE_DATE_EPOCH": "1000000000"})
    cmd = BuildxEngine("/usr/bin/docker").command(request, tmp_path / "i")
    assert cmd[cmd.index("--build-arg"):cmd.index("--build-arg") + 2] == ["--build-arg", "SOURCE_DATE_EPOCH=1000000000"]
    assert not any("rewrite-timestamp" in a for a in cmd)
    unset = BuildxEngine("/usr/bin/docker").command(BuildRequest(tmp_path, tmp_path / "D", ("x:1",)), tmp_path / "i")
    assert not any("SOURCE_DATE_EPOCH" in a for a in unset)
    # 20.10's BuildKit (0.8) has no SOURCE_DATE_EPOCH: the classic client is not given it
    assert not any("SOURCE_DATE_EPOCH" in a for a in ClassicEngine("/usr/bin/docker").command(request, tmp_path / "i"))


def test_named_builder_loads_only_when_asked(tmp_path):
    engine = BuilderEngine("/usr/bin/docker", builder="k8s")
    push_only = engine.command(BuildRequest(tmp_path, tmp_path / "D", ("r/a:1",), push=True, load=False), tmp_path / "i")  # noqa: E501
    outputs = [push_only[i + 1] for i, a in enumerate(push_only) if a == "--output"]
    assert outputs == ["type=image,name=r/a:1,push=true"] and "--builder" in push_only
    both = engine.command(BuildRequest(tmp_path, tmp_path / "D", ("r/a:1",), push=True, load=True), tmp_path / "i")
    assert [both[i + 1] for i, a in enumerate(both) if a == "--output"] == [
        "type=image,name=r/a:1,push=true", "type=docker,name=r/a:1"]


@pytest.mark.parametrize(("value", "parsed"), [("gzip", ("gzip", None)), ("zstd:3", ("zstd", 3)), (None, None)])
def test_compression_values(value, parsed):
    assert engine_pkg.parse_compression(value) == parsed


@pytest.mark.parametrize("value", ["zstd:23", "gzip:x", "brotli", "uncompressed:1"])
def test_compression_values_refused(value):
    from buildkit_py.errors import UsageError

    with pytest.raises(UsageError, match="--compression"):
        engine_pkg.parse_compression(value)


def test_classic_refuses_output_options_naming_who_can(tmp_path):
    request = BuildRequest(tmp_path, tmp_path / "D", ("x:1",), compression="zstd", provenance="min")
    with pytest.raises(EngineCapabilityError) as info:
        require(ClassicEngine("/usr/bin/docker"), required_capabilities(frozenset(), request))
    assert "compression, provenance" in info.value.message
    assert "containerd image store" in info.value.hint and "containerd-snapshotter" not in info.value.message


def test_buildx_on_classic_store_refuses_cache_export(tmp_path, monkeypatch):
    engine = BuildxEngine("/usr/bin/docker")
    monkeypatch.setattr(engine, "containerd_store", lambda: False)
    request = BuildRequest(tmp_path, tmp_path / "D", ("x:1",), cache_to=("type=registry,ref=r/c",))
    with pytest.raises(EngineCapabilityError) as info:
        require(engine, required_capabilities(frozenset(), request))
    assert "containerd-snapshotter" in info.value.hint
    monkeypatch.setattr(engine, "containerd_store", lambda: True)
    require(engine, required_capabilities(frozenset(), request))


def test_imgbuild_docker_missing_is_an_error(monkeypatch):
    monkeypatch.setenv("IMGBUILD_DOCKER", "/nonexistent/docker")
    with pytest.raises(EnvironmentProblem, match="IMGBUILD_DOCKER=/nonexistent/docker: no such executable"):
        engine_pkg.select_engine()


def test_imgbuild_docker_without_buildkit_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("IMGBUILD_DOCKER", fake_client(tmp_path, "new", "28.2.2", buildx=False))
    monkeypatch.delenv("IMGBUILD_BACKEND", raising=False)
    monkeypatch.delenv("IMGBUILD_ENGINE", raising=False)
    with pytest.raises(EnvironmentProblem) as info:
        engine_pkg.select_engine()
    assert "IMGBUILD_DOCKER" in info.value.message and "needs buildx" in info.value.message


def test_builder_selects_the_builder_engine(tmp_path, clients):
    clients += [fake_client(tmp_path, "new", "28.2.2", buildx=True)]
    engine = engine_pkg.select_engine(builder="k8s", host="unix:///run/x.sock")
    assert isinstance(engine, BuilderEngine) and engine.builder == "k8s"
    assert engine.client_argv() == [clients[0], "--host", "unix:///run/x.sock"]
    with pytest.raises(EngineCapabilityError, match="needs buildx"):
        engine_pkg.select_engine("docker", builder="k8s")


TOY_ENGINE = '''\
from buildkit_py.engine.registry import register


@register
class ToyEngine:
    kind = "toy"
    aliases = ("toy-alias",)
    auto_order = None
    named_builders = False
    title = "the toy engine"
    summary = "a stand-in"
    who_can = {}
    name = "toy"

    @classmethod
    def find(cls, choice):
        return cls()

    @classmethod
    def for_reading(cls, choice):
        return cls()
'''


@pytest.fixture
def toy_engine_module(tmp_path, monkeypatch):
    """A module dropped into engine/kinds (here: a folder added to its search path), as a new
    engine would be; the registry is put back as it was afterwards."""
    import sys

    from buildkit_py.engine import kinds, registry

    registry.engines()  # the shipped kinds, loaded before the registry is copied
    (tmp_path / "toy.py").write_text(TOY_ENGINE)
    monkeypatch.setattr(kinds, "__path__", [*kinds.__path__, str(tmp_path)])
    monkeypatch.setattr(registry, "_REGISTERED", dict(registry._REGISTERED))
    monkeypatch.setattr(registry, "_LOADED", False)
    yield
    sys.modules.pop("buildkit_py.engine.kinds.toy", None)


def test_an_engine_is_one_module_in_kinds(toy_engine_module, tmp_path):
    """Adding an engine touches one file: the registry finds the module, select_engine and the
    CLI's --engine take its kind and alias, and --builder is refused for it by what it declares."""
    from helpers import run_cli

    from buildkit_py.engine import kind_names
    from buildkit_py.engine.registry import kinds_help

    assert kind_names() == ["auto", "buildah", "buildx", "docker", "podman", "toy", "classic", "toy-alias"]
    assert "toy (a stand-in)" in kinds_help() and "toy-alias is toy" in kinds_help()
    assert type(engine_pkg.select_engine("toy")).__name__ == "ToyEngine"
    assert type(engine_pkg.select_engine("toy-alias")).__name__ == "ToyEngine"
    with pytest.raises(EngineCapabilityError, match="--builder k8s needs buildx, not the toy engine"):
        engine_pkg.select_engine("toy", builder="k8s")
    code, _, err = run_cli("build", str(tmp_path / "none.yaml"), "--engine", "nosuch")
    assert code == 2 and "'toy'" in err and "'podman'" in err


def test_unknown_engine_names_every_kind():
    with pytest.raises(EnvironmentProblem) as info:
        engine_pkg.select_engine("nosuch")
    assert info.value.message == "unknown engine 'nosuch'"
    assert info.value.hint == "use auto, buildah, buildx, docker, podman or classic"


def test_auto_says_why_no_kind_would_do(tmp_path, clients):
    clients += [fake_client(tmp_path, "new", "28.2.2", buildx=False)]
    with pytest.raises(EnvironmentProblem) as info:
        engine_pkg.select_engine()
    assert info.value.message == (f"no docker client with the buildx plugin: {clients[0]}: no buildx plugin; "
                                  f"no BuildKit-capable docker client (found): {clients[0]}: client 28.2.2 needs "
                                  "buildx for BuildKit")


def test_reading_falls_back_to_any_client(tmp_path, clients):
    clients += [fake_client(tmp_path, "new", "28.2.2", buildx=False)]
    engine = engine_pkg.engine_for_reading()  # cannot build here, can read
    assert isinstance(engine, ClassicEngine)


@pytest.mark.parametrize("word", kind_names())
def test_every_engine_kind_select_takes_the_command_line_takes(word):
    """Issue 23: 3. The kinds were listed twice and differed: $IMGBUILD_ENGINE=classic was taken,
    --engine classic refused. Both now read the engine registry."""
    import io

    from buildkit_py.cli.main import _build_parser

    args = _build_parser(io.StringIO(), ["build"]).parse_args(["build", "r.yaml", "--engine", word])
    assert args.engine == word


def test_refusal_hints_come_from_the_registered_kinds(monkeypatch):
    """Which kind can honour a capability is each kind's own word (``who_can``), joined over the
    registered kinds; a kind registered later adds its own."""
    from buildkit_py.engine import registry

    assert registry.who_can(engine_pkg.PLATFORM) == \
        "buildx (docker buildx plugin), or Docker's classic builder with DOCKER_BUILDKIT=1"
    assert registry.who_can(engine_pkg.SECRETS) is None  # every kind can: no kind names it
    buildah = registry.engines()["buildah"]
    monkeypatch.setattr(buildah, "who_can", {engine_pkg.SECRETS: "buildah, if it could not"})
    assert registry.who_can(engine_pkg.SECRETS) == "buildah, if it could not"
