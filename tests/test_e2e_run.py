"""End to end: `imgbuild run` on a real engine starts what docker's rule says and what it
prints (issue 22: 8): the command after -- goes to the image's ENTRYPOINT as arguments;
--entrypoint replaces the ENTRYPOINT, and '' removes it."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest
from conftest import _client, on_every_engine, unavailable, uses_containers_storage
from helpers import REPO, as_unprivileged, run_cli


@pytest.fixture
def entrypoint_image(engine, base_image, unique_name):
    """The base image with ENTRYPOINT ["echo", "ep"] and CMD ["default"] (docker commit: no build)."""
    docker = engine.client_argv()
    image = f"{unique_name}:ep"
    cid = subprocess.run([*docker, "create", base_image, "true"], capture_output=True, text=True,
                         check=True).stdout.strip()
    try:
        subprocess.run([*docker, "commit", "--change", 'ENTRYPOINT ["echo", "ep"]', "--change", 'CMD ["default"]',
                        cid, image], capture_output=True, check=True)
    finally:
        subprocess.run([*docker, "rm", cid], capture_output=True, check=False)
    yield image
    subprocess.run([*docker, "image", "rm", "-f", image], capture_output=True, check=False)


@pytest.mark.parametrize(("args", "printed"), [
    ((), "ep default"),
    (("--", "hello", "world"), "ep hello world"),  # the run --help example's case: arguments of the ENTRYPOINT
    (("--entrypoint", "echo", "--", "hi"), "hi"),
    (("--entrypoint", "", "--", "echo", "plain"), "plain"),
])
def test_run_starts_what_it_says(entrypoint_image, tmp_path, capfd, args, printed):
    code, out, err = run_cli("run", entrypoint_image, "--gpus", "none", "--network", "none",
                             "--weights-dir", str(tmp_path / "w"), *args)
    container = capfd.readouterr().out  # the container writes to this process's stdout
    assert code == 0, err
    assert container.strip() == printed
    said = next(line for line in err.splitlines() if line.startswith("  container runs "))
    process = shlex.split(said.removeprefix("  container runs ").split(": ", 1)[0])
    assert process[0] == "echo" and " ".join(process[1:]) == printed
    running = next(line for line in err.splitlines() if line.startswith("running "))
    running = shlex.split(running.removeprefix("running "))
    after = list(args[args.index("--") + 1:]) if "--" in args else []
    assert running[len(running) - len(after):] == after and running[len(running) - len(after) - 1] == entrypoint_image

@on_every_engine
def test_run_uses_the_engine_its_command_line_names(engine, entrypoint_image, tmp_path, capfd, monkeypatch):
    """Issue 32 (4): `run --engine KIND` runs on that engine, over $IMGBUILD_ENGINE naming another
    (`run --engine podman` was refused: only the variable reached run). The image is in this
    engine's store alone, so a run on the other engine would not find it."""
    monkeypatch.setenv("IMGBUILD_ENGINE", "docker" if engine.kind == "podman" else "podman")
    code, _, err = run_cli("run", entrypoint_image, "--engine", engine.kind, "--gpus", "none", "--network", "none",
                           "--weights-dir", str(tmp_path / "w"), "--", "from", "the", "option")
    assert code == 0, err
    assert capfd.readouterr().out.strip() == "ep from the option"
    running = next(line for line in err.splitlines() if line.startswith("running "))
    client = engine.client_argv()
    assert shlex.split(running.removeprefix("running "))[:len(client) + 1] == [*client, "run"]


def test_run_refuses_an_image_with_nothing_to_start(entrypoint_image, tmp_path, capfd):
    code, out, err = run_cli("run", entrypoint_image, "--gpus", "none", "--network", "none",
                             "--weights-dir", str(tmp_path / "w"), "--entrypoint", "")
    assert code == 2 and "nothing would run" in err, err
    assert capfd.readouterr().out == ""


def _containers_of(engine, image: str) -> str:
    listed = _client(engine, "ps", "-aq", "--filter", f"ancestor={image}")
    assert listed.returncode == 0, listed.stderr
    return listed.stdout.strip()


def test_an_interrupted_run_removes_its_container(engine, entrypoint_image, tmp_path):
    """Ctrl-C on `imgbuild run` stopped the docker client and left the container running in the
    engine: sleep as PID 1 ignores the SIGINT the client passes on. The container is named and
    removed now, at once, not after the client's grace period."""
    argv = [sys.executable, "-m", "buildkit_py", "run", entrypoint_image, "--gpus", "none", "--network", "none",
            "--weights-dir", str(tmp_path / "w"), "--entrypoint", "sleep", "--", "300"]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not _containers_of(engine, entrypoint_image):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.3)
        interrupted = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - interrupted
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "imgbuild: interrupted by SIGINT: stopped container of" in err and "Traceback" not in err, err
    assert took < 8, took  # not the client's 10 s grace
    assert _containers_of(engine, entrypoint_image) == ""


@on_every_engine
def test_a_relative_weights_dir_is_mounted_from_where_the_user_is(engine, base_image, unique_name, logged_in,
                                                                 registry_refs, tmp_path, monkeypatch, capfd):
    """issue 31: 5: `run --weights-dir wdir` downloaded the weights, then the engine refused the
    relative bind mount source (exit 125), and --dry-run printed that same relative mount. The
    folder is now taken from the working directory, as the user meant: an absolute mount in the
    plan and in the run, and the container sees the weights."""
    from buildkit_py.artifacts import weights
    from buildkit_py.engine.run import weights_dir_name

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"hidden_size": 8}')
    ref = logged_in.repo(f"{unique_name}-weights") + ":1"
    weights.push(tmp_path / "model", ref)
    registry_refs.append(ref)
    docker = engine.client_argv()
    image = f"{unique_name}:weights"
    label = json.dumps([{"ref": ref, "mount": "/models/w"}], separators=(",", ":"))
    # docker's commit --change parses the value as a Dockerfile word (quotes removed); podman's keeps it as is
    quoted = label if uses_containers_storage(engine) else json.dumps(label)
    cid = subprocess.run([*docker, "create", base_image, "true"], capture_output=True, text=True,
                         check=True).stdout.strip()
    try:
        subprocess.run([*docker, "commit", "--change", f"LABEL io.imgbuild.weights={quoted}", "--change",
                        'ENTRYPOINT ["sh", "-c", "cat /models/w/config.json"]', cid, image],
                       capture_output=True, check=True)
    finally:
        subprocess.run([*docker, "rm", cid], capture_output=True, check=False)
    try:
        monkeypatch.chdir(tmp_path)
        host = tmp_path / "wdir" / weights_dir_name(ref)
        code, out, err = run_cli("run", image, "--weights-dir", "wdir", "--dry-run", "--json", "--gpus", "none")
        assert code == 0, err
        assert f"type=bind,source={host},target=/models/w,readonly" in json.loads(out)["argv"]
        code, out, err = run_cli("run", image, "--weights-dir", "wdir", "--gpus", "none", "--network", "none",
                                 "--progress", "quiet")
        assert code == 0, err
        assert capfd.readouterr().out.strip() == '{"hidden_size": 8}'  # the container read the mounted file
        assert (host / "config.json").is_file()

        if uses_containers_storage(engine):  # podman in a user namespace has a store of its own, without the image
            return
        # a weights folder that cannot be written: an environment error naming it, not an internal error
        (tmp_path / "ro").mkdir(mode=0o555)
        argv = as_unprivileged([sys.executable, "-m", "buildkit_py", "run", image, "--weights-dir", "ro/w",
                                "--gpus", "none", "--progress", "quiet"])
        if argv is None:
            unavailable("unshare (util-linux) is needed to test an unwritable folder as root")
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        assert done.returncode == 3, done.stderr
        assert done.stderr.startswith(f"imgbuild: error: cannot write into {tmp_path}/ro: Permission denied (w)")
    finally:
        subprocess.run([*docker, "image", "rm", "-f", image], capture_output=True, check=False)
