"""SIGINT or SIGTERM sent to imgbuild's pid alone, mid-build, on both engines (issue 22 item 7):
the `docker build` child and the RUN step it was running stop, the temporary Dockerfile, context
and iid files are removed, imgbuild exits 130 / 143 with one line naming what it stopped.

Before: SIGINT left the `docker build` child running after imgbuild had gone; SIGTERM killed
imgbuild on the spot (143, no message), leaving the child and every temporary file behind.

The slow RUN step is real: the recipe's pip step reads an index (--pip-config) served by this
test on 127.0.0.1 that never answers, so pip waits in its RUN step until the build is stopped;
the index also sees pip's connection close when BuildKit kills the step."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from helpers import REPO, tiny_recipe, write_recipe

pytestmark = pytest.mark.e2e

class StallingIndex:
    """A package index on 127.0.0.1 that reads each request and never answers. ``asked`` is set
    when a request came in; ``open`` counts the connections whose client has not gone away."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.asked = threading.Event()
        self.open = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket):
        with self.lock:
            self.open += 1
        self.asked.set()
        try:
            while conn.recv(65536):  # the request, then nothing until the client goes away
                pass
        except OSError:
            pass
        finally:
            conn.close()
            with self.lock:
                self.open -= 1

    def close(self):
        self.sock.close()


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (children of its threads, recursively)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            for kid in kids:
                if kid not in found:
                    found.add(kid)
                    todo.append(kid)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


@pytest.fixture
def stalling_index():
    index = StallingIndex()
    yield index
    index.close()


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_to_imgbuild_alone_stops_the_build_and_removes_its_files(
        tmp_path, base_image, unique_name, engine, cleanup_images, stalling_index, signum, code):
    pin = f"imgbuild-stall-{uuid.uuid4().hex[:8]}"  # a step no cache holds: it must run
    recipe = write_recipe(tmp_path / "recipe", tiny_recipe(unique_name, base_image, installer="pip",
                                                           pip=(f"{pin}==1.0",)))
    pip_conf = tmp_path / "pip.conf"
    pip_conf.write_text(f"[global]\nindex-url = http://127.0.0.1:{stalling_index.port}/simple\ntimeout = 600\n"
                        "retries = 0\n")
    temp = tmp_path / "tmp"  # imgbuild's temporary files land here, and must not stay
    temp.mkdir()
    cleanup_images.append(f"{unique_name}:1")
    proc = subprocess.Popen([sys.executable, "-m", "buildkit_py", "build", str(recipe), "--pip-config", str(pip_conf),
                             "--progress", "plain"], cwd=REPO, env={**os.environ, "TMPDIR": str(temp)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert stalling_index.asked.wait(180), "the pip step never reached the index"
        children = descendants(proc.pid)
        assert children, "no docker build child"
        assert any(temp.iterdir())  # the build's Dockerfile, context and iid file
        os.kill(proc.pid, signum)  # imgbuild's pid only, not its group
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = err.splitlines()
    assert proc.returncode == code, err[-3000:]
    # the docker client (and the buildx plugin under it) is gone...
    assert wait_for(lambda: not any(alive(p) for p in children), 15), [p for p in children if alive(p)]
    # ...and so is the RUN step: BuildKit killed pip, whose connection to the index closed
    assert wait_for(lambda: stalling_index.open == 0, 30), f"{stalling_index.open} connection(s) still open"
    assert sorted(p.name for p in temp.iterdir()) == []
    # one line, naming the signal and the build it stopped
    assert "Traceback" not in err
    said = [line for line in lines if "interrupted" in line]
    assert len(said) == 1 and said[0] == lines[-1], err[-3000:]
    name = signal.Signals(signum).name
    assert re.match(rf"imgbuild: interrupted by {name}: stopped (docker build|docker buildx build|docker-buildx build) "
                    rf"of {unique_name}:1 \(pid \d+\); its temporary files removed$", said[0]), said[0]
