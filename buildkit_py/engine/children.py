"""The long-running child processes imgbuild starts (a `docker build`), stopped when imgbuild is
interrupted (Ctrl-C, or SIGTERM from a CI cancel: the CLI raises ``errors.Interrupted`` for
both, see cli/main.py).

A child runs in a session of its own, so that a terminal's Ctrl-C reaches imgbuild alone and
imgbuild stops the child's whole group itself: SIGINT first (the docker client then cancels the
build in the engine, and the buildx plugin under `docker buildx` hears it too), SIGKILL after
``STOP_GRACE`` seconds. Without this a SIGINT or SIGTERM sent to imgbuild's pid left the build
running in the engine after imgbuild had gone.

Each child is registered while it runs (``supervised``): the thread that waits on it stops it
when the interrupt reaches that thread (a single build: the main thread); a matrix build's
worker threads never see the interrupt, so the main thread stops theirs (``stop_all``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from buildkit_py.errors import EnvironmentProblem, Interrupted

STOP_GRACE = 10.0  # seconds a stopped docker client gets to cancel its build before SIGKILL

# pid -> (the child, what it is, what stops the work behind it before the child is stopped)
_running: dict[int, tuple[subprocess.Popen[Any], str, Callable[[], None] | None]] = {}
_lock = threading.Lock()


def stop(proc: subprocess.Popen[Any], grace: float = STOP_GRACE) -> None:
    """Stop ``proc`` and the processes of its group (it leads one: ``start_new_session``):
    SIGINT, then SIGKILL if it has not ended within ``grace`` seconds or another interrupt
    comes while it is waited for; what is left of its group then gets SIGKILL too (a process
    that ignores SIGINT, as a shell's background job does). Returns once it has ended."""
    if proc.poll() is not None:
        return
    try:
        _signal_group(proc, signal.SIGINT)
        proc.wait(timeout=grace)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
    _signal_group(proc, signal.SIGKILL, leader=False)


def _signal_group(proc: subprocess.Popen[Any], signum: int, *, leader: bool = True) -> None:
    """``signum`` to the group ``proc`` leads; to ``proc`` alone where the group cannot be reached
    (``leader``: the leader itself is still to be signalled)."""
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        if leader:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)


@contextmanager
def supervised(proc: subprocess.Popen[Any], what: str,
               on_interrupt: Callable[[], None] | None = None) -> Iterator[None]:
    """While the block runs, ``proc`` is known to ``stop_all``; an interrupt raised in the block
    stops it (``on_interrupt`` first: what stops the work behind the client, as removing the
    container a `docker run` waits on), and the interrupt names it (``what``: "docker build of
    team/x:1") for the CLI's one line."""
    with _lock:
        _running[proc.pid] = (proc, what, on_interrupt)
    try:
        yield
    except KeyboardInterrupt as exc:
        if on_interrupt is not None:
            on_interrupt()
        stop(proc)
        noted(exc, f"{what} (pid {proc.pid})")
        raise
    finally:
        with _lock:
            _running.pop(proc.pid, None)


def stop_all(exc: BaseException | None = None) -> list[str]:
    """Stop every supervised child (from the main thread when an interrupt reaches it while other
    threads wait on theirs); each is named in ``exc`` when that is an Interrupted."""
    with _lock:
        children = list(_running.values())
    stopped = []
    for proc, what, on_interrupt in children:
        if proc.poll() is None:
            if on_interrupt is not None:
                on_interrupt()
            stop(proc)
            stopped.append(f"{what} (pid {proc.pid})")
    if exc is not None:
        for what in stopped:
            noted(exc, what)
    return stopped


def noted(exc: BaseException, what: str) -> None:
    """Record on an Interrupted that ``what`` was stopped (a plain KeyboardInterrupt, from code
    that runs without the CLI's signal handlers, carries no list)."""
    if isinstance(exc, Interrupted) and what not in exc.stopped:
        exc.stopped.append(what)


def wait(cmd: list[str], *, env: dict[str, str], what: str, on_interrupt: Callable[[], None] | None = None) -> int:
    """Run ``cmd`` in a session of its own, its output going where imgbuild's goes, supervised
    while it runs; its exit code. EnvironmentProblem when it cannot be started."""
    try:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot run {cmd[0]}: {exc}") from None
    with supervised(proc, what, on_interrupt):
        return proc.wait()


def follow(cmd: list[str], *, env: dict[str, str], what: str, on_line: Callable[[str], None],
           on_interrupt: Callable[[], None] | None = None) -> int:
    """Run ``cmd`` (a build) in a session of its own, passing each line of its output (stdout
    and stderr together) to ``on_line`` as it comes, supervised while it runs; its exit code.
    EnvironmentProblem when it cannot be started."""
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                errors="replace", stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot run {cmd[0]}: {exc}") from None
    assert proc.stdout is not None  # noqa: S101
    with proc.stdout, supervised(proc, what, on_interrupt):
        for raw in proc.stdout:
            on_line(raw.rstrip("\n"))
        return proc.wait()
