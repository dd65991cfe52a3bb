"""Signals at the lowest layers (issue 22 item 7), with real processes and real signals: the CLI
turns SIGTERM into the same unwinding as Ctrl-C (one line, exit 128+N), and a supervised child is
stopped with its whole process group. The build itself, on both engines: test_e2e_signals.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from helpers import REPO

from buildkit_py.engine import children
from buildkit_py.errors import Interrupted


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_ends_a_command_with_one_line_and_128_plus_n(signum, code):
    """`imgbuild login ... --password-stdin` waits on its stdin: signal it there. Before, SIGTERM
    killed it on the spot (returncode -15: no message, no clean-up)."""
    proc = subprocess.Popen([sys.executable, "-m", "buildkit_py", "login", "127.0.0.1:9", "-u", "x",
                             "--password-stdin"], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)  # started and reading its stdin
    proc.send_signal(signum)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == code
    assert err.splitlines() == [f"imgbuild: interrupted by {signal.Signals(signum).name}"]


def _group(command: str) -> tuple[subprocess.Popen, int]:
    """A shell in a session of its own with a `sleep` under it: (the shell, the sleep's pid)."""
    proc = subprocess.Popen(["sh", "-c", f"{command} & echo $!; wait"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    return proc, int(proc.stdout.readline())


def _gone(pid: int, within: float = 5.0) -> bool:
    """``pid`` has ended (or is a zombie) within ``within`` seconds: a signal lands asynchronously."""
    deadline = time.monotonic() + within
    while True:
        try:
            if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_an_interrupt_inside_supervised_stops_the_child_and_its_group_and_names_it():
    proc, grandchild = _group("sleep 300")
    exc = Interrupted(signal.SIGTERM)
    with pytest.raises(Interrupted) as raised, children.supervised(proc, "docker build of team/x:1"):
        raise exc
    assert proc.poll() is not None and _gone(grandchild)
    assert raised.value.stopped == [f"docker build of team/x:1 (pid {proc.pid})"]
    assert children._running == {}


def test_a_child_that_ignores_sigint_is_killed_after_the_grace_time():
    proc, grandchild = _group("trap '' INT; sleep 300")
    start = time.monotonic()
    children.stop(proc, grace=1.0)
    assert 0.9 < time.monotonic() - start < 10
    assert proc.returncode == -signal.SIGKILL and _gone(grandchild)


def test_stop_all_stops_the_children_other_threads_wait_on():
    """A matrix build: workers wait on their builds; the interrupt reaches the main thread only."""
    procs, ended = [], []

    def worker():
        proc, _ = _group("sleep 300")
        procs.append(proc)
        with children.supervised(proc, f"build {len(procs)}"):
            proc.wait()
        ended.append(proc.returncode)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    while len(children._running) < 2:
        time.sleep(0.05)
    exc = Interrupted(signal.SIGINT)
    stopped = children.stop_all(exc)
    for t in threads:
        t.join(10)
    assert len(stopped) == 2 and sorted(exc.stopped) == sorted(stopped)
    assert len(ended) == 2 and all(p.poll() is not None for p in procs)
    assert os.getpgid(os.getpid()) != procs[0].pid  # they were groups of their own


def test_stop_all_runs_each_childs_own_stop_first():
    """A test container in a matrix worker: stop_all removes the container (its on_interrupt)
    before it stops the `docker run` client, as the worker's own interrupt would."""
    calls: list[str] = []
    proc, _ = _group("sleep 300")

    def worker():
        with children.supervised(proc, "test container", on_interrupt=lambda: calls.append("removed")):
            proc.wait()

    thread = threading.Thread(target=worker)
    thread.start()
    while not children._running:
        time.sleep(0.05)
    assert children.stop_all() == [f"test container (pid {proc.pid})"]
    thread.join(10)
    assert calls == ["removed"] and proc.poll() is not None
