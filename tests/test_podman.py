"""The podman engine without an engine: buildah's output read as BuildKit's plain progress (real
logs of podman 4.3.1 in fixtures/podman: a multi-stage build, the same build from the cache, a
failing step), the build command line, images and history described as docker describes them,
choosing podman (and refusing what it cannot do) and its GPU flags. Real builds, pushes and runs
on podman are in test_e2e_engines.py (the engine contract)."""

import argparse
import io
import json
import textwrap

import pytest
from helpers import REPO

from buildkit_py.cli.progress import StepView
from buildkit_py.cli.settings import settings_of
from buildkit_py.engine import (
    CACHE_EXPORT,
    COMPRESSION,
    BuildRequest,
    require,
    required_capabilities,
    select_engine,
)
from buildkit_py.engine.buildlog import BuildLog, build_failure
from buildkit_py.engine.kinds.docker_format import history_entries, image_info
from buildkit_py.engine.kinds.podman import BuildahLines, PodmanEngine, docker_history, docker_image_attrs
from buildkit_py.engine.run import RunSpec, WeightsMount
from buildkit_py.errors import EngineCapabilityError, EnvironmentProblem

FIXTURES = REPO / "tests" / "fixtures" / "podman"


class Clock:
    """A clock that moves a second per reading: step times in the translated lines are exact."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def translated(name: str) -> list[str]:
    lines = BuildahLines(clock=Clock())
    out = [t for raw in (FIXTURES / name).read_text().splitlines() for t in lines.feed(raw)]
    return out + lines.finish()


def read(name: str) -> BuildLog:
    log = BuildLog()
    for line in translated(name):
        log.feed(line)
    return log


def test_buildah_steps_read_as_buildkits():
    lines = translated("build-fresh.log")
    assert lines[:6] == [
        "#1 [builder 1/2] FROM debian:bookworm-slim AS builder",
        "#1 DONE 1.0s",
        "#2 [builder 2/2] RUN set -eu; : imgbuild-step=compile; echo built > /b.txt; echo from-builder",
        "#2 1.000 from-builder",
        "#2 DONE 2.0s",
        "#3 [final 1/7] FROM debian:bookworm-slim AS final",
    ]
    # ENV and LABEL (the recipe's and buildah's own for --label) are no steps, as in BuildKit
    assert not any("ENV" in ln or "LABEL" in ln for ln in lines)
    assert [(name, state) for _, name, state in read("build-fresh.log").steps()] == [
        ("compile", "done"), ("COPY", "done"), ("check", "done"), ("WORKDIR", "done")]
    assert "#5 1.000 built" in lines  # the step's output, with its time since the step began


def test_a_cached_rebuild_is_every_step_cached():
    assert [(name, state) for _, name, state in read("build-cached.log").steps()] == [
        ("compile", "cached"), ("COPY", "cached"), ("check", "cached"), ("WORKDIR", "cached")]


def test_a_failed_step_is_named_with_its_output_and_cause():
    log = read("build-failed.log")
    failed = log.failure()
    assert failed is not None
    assert (failed.name, failed.exit_code, failed.error) == ("cuda [final 3/4]", 1, "exit code: 1")
    assert failed.output[0] == "Looking in indexes: https://pypi.org/simple"
    err = build_failure(log, ["podman", "build"], 1, ca_cert=False)
    assert err.message.startswith("build failed at step cuda [final 3/4]: exit code: 1; the package index's TLS "
                                  "certificate is not trusted inside the build")
    assert "--ca-cert" in (err.hint or "") and err.step is not None and err.step.exit_code == 1
    assert [(name, state) for _, name, state in log.steps()] == [("os", "done"), ("cuda", "error")]


def test_the_step_view_draws_podman_builds():
    out = io.StringIO()
    with StepView(out, "plain", clock=Clock()) as view:
        for line in translated("build-fresh.log"):
            view.line(line)
    assert out.getvalue().splitlines() == [
        "[builder 1/2] FROM debian:bookworm-slim AS builder",
        "[builder 1/2] FROM debian:bookworm-slim AS builder: done in 1.0s",
        "[builder 2/2] compile", "[builder 2/2] compile: done in 2.0s",
        "[final 1/7] FROM debian:bookworm-slim AS final",
        "[final 1/7] FROM debian:bookworm-slim AS final: done in 1.0s",
        "[final 2/7] COPY --from=builder /b.txt /b.txt", "[final 2/7] COPY --from=builder /b.txt /b.txt: done in 1.0s",
        "[final 4/7] check", "[final 4/7] check: done in 2.0s",
        "[final 5/7] WORKDIR /app", "[final 5/7] WORKDIR /app: done in 1.0s"]


def test_single_stage_and_unnamed_stages():
    lines = BuildahLines(clock=Clock())
    assert lines.feed("STEP 1/2: FROM debian:bookworm-slim") == ["#1 [1/2] FROM debian:bookworm-slim"]
    assert lines.feed("STEP 2/2: RUN true") == ["#1 DONE 1.0s", "#2 [2/2] RUN true"]
    assert lines.feed("COMMIT x:1") == ["#2 DONE 1.0s", "COMMIT x:1"]
    assert lines.feed("--> 0123456789a") == []
    assert lines.feed("Successfully tagged localhost/x:1") == ["Successfully tagged localhost/x:1"]
    staged = BuildahLines(clock=Clock())
    assert staged.feed("[2/3] STEP 1/4: FROM base") == ["#1 [stage-1 1/4] FROM base"]
    # an error outside any step (the base cannot be found) passes as it is, for the log's tail
    assert BuildahLines().feed("Error: creating build container: x: image not known") == [
        "Error: creating build container: x: image not known"]


def test_build_command_line(tmp_path):
    engine = PodmanEngine("/usr/bin/podman", (4, 3, 1))
    request = BuildRequest(tmp_path / "ctx", tmp_path / "Dockerfile", ("a:1", "r/b:2"), labels={"k": "v"},
                           secrets={"cacert": tmp_path / "ca.pem"}, no_cache=True, target="final")
    cmd = engine.command(request, tmp_path / "iid")
    assert cmd[:6] == ["/usr/bin/podman", "build", "--layers", "--format", "docker", "--iidfile"]
    assert ["--secret", f"id=cacert,src={tmp_path / 'ca.pem'}"] == cmd[cmd.index("--secret"):cmd.index("--secret") + 2]
    assert cmd[cmd.index("--network") + 1] == "host" and "--no-cache" in cmd
    assert cmd[cmd.index("--target") + 1] == "final"
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--tag"] == ["a:1", "r/b:2"]
    assert cmd[cmd.index("--label") + 1] == "k=v" and cmd[-1] == str(tmp_path / "ctx")
    assert engine.describe() == "podman engine (/usr/bin/podman 4.3.1)"


def test_images_and_history_as_docker_describes_them():
    attrs = docker_image_attrs(json.loads((FIXTURES / "image-inspect.json").read_text())[0])
    assert attrs["Id"].startswith("sha256:") and len(attrs["Id"]) == 71
    # podman's RepoDigests name its local manifest, which no registry has: not reported
    assert attrs["RepoDigests"] == [] and attrs["Config"]["Labels"]["a"] == "b"
    raw = json.loads((FIXTURES / "history.json").read_text())
    history = docker_history(raw)
    assert len(history) == len(raw) and history[0]["CreatedBy"] == "/bin/sh -c #(nop) LABEL a=b"
    assert {tuple(sorted(h)) for h in history} == {("Comment", "Created", "CreatedBy", "Id", "Size", "Tags")}
    assert all(h["Id"] == "<missing>" or h["Id"].startswith("sha256:") for h in history)
    assert history[0]["Created"] > 1_700_000_000 and sum(h["Size"] for h in history) == sum(e["size"] for e in raw)
    assert len(attrs["RootFS"]["Layers"]) == sum(1 for h in history if h["Size"] or "#(nop)" not in h["CreatedBy"])
    # parsed once, as every engine's (engine/kinds/docker_format.py)
    info, entries = image_info(attrs), history_entries(history)
    assert (info.id, info.labels["a"], info.repo_digests, info.layers) == (
        attrs["Id"], "b", (), tuple(attrs["RootFS"]["Layers"]))
    assert [(e.created_by, e.size) for e in entries] == [(h["CreatedBy"], h["Size"]) for h in history]


def test_podman_cannot_do_what_only_buildkit_does(tmp_path):
    engine = PodmanEngine("/usr/bin/podman")
    request = BuildRequest(tmp_path, tmp_path / "D", ("x:1",), cache_to=("type=registry,ref=r/c",), compression="zstd")
    with pytest.raises(EngineCapabilityError) as info:
        require(engine, required_capabilities(frozenset({"secrets", "cache-mounts"}), request))
    assert f"{CACHE_EXPORT}, {COMPRESSION}" in info.value.message and "podman engine" in info.value.message
    assert (info.value.hint or "").endswith("its own storage; a registry cache needs --engine buildx")
    require(engine, required_capabilities(frozenset({"secrets", "cache-mounts", "multi-stage"}),
                                          BuildRequest(tmp_path, tmp_path / "D", ("x:1",))))


def test_gpu_flags_are_cdi(tmp_path):
    spec = RunSpec("team/x:1", (WeightsMount("r/m:1", tmp_path / "m", "/models"),), gpu=True, network="none",
                   command=("nvidia-smi",))
    assert PodmanEngine("/usr/bin/podman").run_argv(spec) == (
        "/usr/bin/podman", "run", "--rm", "--device", "nvidia.com/gpu=all", "--network", "none", "--mount",
        f"type=bind,source={tmp_path / 'm'},target=/models,readonly", "team/x:1", "nvidia-smi")


def fake_podman(tmp_path, version: str):
    path = tmp_path / "podman"
    path.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = version ]; then echo "{version}"; exit 0; fi
        exit 1
    """))
    path.chmod(0o755)
    return str(path)


def test_choosing_podman(tmp_path, monkeypatch):
    monkeypatch.setenv("IMGBUILD_PODMAN", fake_podman(tmp_path, "4.3.1"))
    engine = select_engine("podman")
    assert isinstance(engine, PodmanEngine) and engine.version == (4, 3, 1)
    # $IMGBUILD_ENGINE reaches the choice through the CLI's settings (cli/settings.py), not below it
    monkeypatch.setenv("IMGBUILD_ENGINE", "podman")
    assert isinstance(select_engine(settings_of(argparse.Namespace()).engine), PodmanEngine)
    with pytest.raises(EngineCapabilityError, match="--builder k8s needs buildx, not podman"):
        select_engine("podman", builder="k8s")


def test_podman_too_old_or_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("IMGBUILD_PODMAN", fake_podman(tmp_path, "3.4.4"))
    with pytest.raises(EnvironmentProblem, match=r"podman 3\.4\.4; imgbuild needs podman 4 or newer") as info:
        select_engine("podman")
    assert info.value.exit_status == 3
    monkeypatch.setenv("IMGBUILD_PODMAN", str(tmp_path / "none"))
    with pytest.raises(EnvironmentProblem, match="IMGBUILD_PODMAN=.*: no such executable"):
        select_engine("podman")


def test_inspect_names_the_steps_of_a_podman_build():
    """buildah writes a COPY as `COPY file:<hash> in /etc/hosts`, without the source's name, so
    the mount stubs' COPY was read as the recipe's first copy (copy-0, and the app copy-1)."""
    from buildkit_py.plan.history import attribute_entries

    raw = json.loads((FIXTURES / "history-imgbuild.json").read_text())  # an imgbuild build on podman 4.3.1
    history = history_entries(reversed(docker_history(raw)))  # oldest first, as the engine object gives it
    assert [a.step for a in attribute_entries([{"created_by": e.created_by} for e in history])] == [
        None, "os", "python", "meta", "mount-stubs", "mount-stubs", "cuda", "ldconfig", "copy-0", "meta", "meta",
        "meta", "meta"]


def test_bind_mounts_are_typed_and_come_after_the_weights(tmp_path):
    from buildkit_py.engine.run import BindMount

    spec = RunSpec("team/x:1", (WeightsMount("r/m:1", tmp_path / "m", "/models"),), network="none",
                   mounts=(BindMount(tmp_path / "t.py", "/t.py"), BindMount(tmp_path / "w", "/w", read_only=False)),
                   extra=("--env", "A=1"), command=("python", "/t.py"))
    assert PodmanEngine("/usr/bin/podman").run_argv(spec) == (
        "/usr/bin/podman", "run", "--rm", "--network", "none",
        "--mount", f"type=bind,source={tmp_path / 'm'},target=/models,readonly",
        "--mount", f"type=bind,source={tmp_path / 't.py'},target=/t.py,readonly",
        "--mount", f"type=bind,source={tmp_path / 'w'},target=/w", "--env", "A=1", "team/x:1", "python", "/t.py")
