"""How the CLI shows the transfer progress the library reports (``progress(event, label,
done, total)``, possibly from several threads): a rich progress display with bytes, speed
and ETA per file on a terminal, plain lines (one per file per 10%) otherwise. The library
never prints; only the CLI creates one of these."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO

Progress = Callable[[str, str, int, int], None]
_DONE_EVENTS = frozenset({"exists", "present", "mounted", "manifest"})


@contextmanager
def transfer_progress(stream: IO[str], *, live: bool | None = None) -> Iterator[Progress]:
    """A progress callback for the duration of a transfer. ``live`` defaults to whether
    ``stream`` is a terminal."""
    if live is None:
        live = stream.isatty()
    if not live:
        yield plain_lines(stream)
        return
    # rich only for a terminal: it is the heavy part of this module (lazy, for start-up).
    import rich.console  # noqa: PLC0415
    import rich.progress as rp  # noqa: PLC0415

    view = rp.Progress(rp.TextColumn("{task.description}"), rp.BarColumn(), rp.DownloadColumn(binary_units=True),
                       rp.TransferSpeedColumn(), rp.TimeRemainingColumn(),
                       console=rich.console.Console(file=stream), transient=False)
    tasks: dict = {}  # label -> rich TaskID
    lock = threading.Lock()

    def progress(event: str, label: str, done: int, total: int) -> None:
        with lock:
            task = tasks.get(label)
            if task is None:
                task = tasks[label] = view.add_task(f"{event:>8} {label}", total=total or None)
        view.update(task, description=f"{event:>8} {label}", completed=done, total=total or None)

    with view:
        yield progress


def plain_lines(stream: IO[str]) -> Progress:
    """One line per file at every 10% and at each state change (``exists``, ``present``...)."""
    last: dict[str, int] = {}
    lock = threading.Lock()

    def progress(event: str, label: str, done: int, total: int) -> None:
        pct = int(done * 100 / total) if total else 100
        with lock:
            if event in _DONE_EVENTS or pct >= last.get(label, -10) + 10 or done == total:
                last[label] = pct
                stream.write(f"{event:>9} {label} {pct:3d}% ({done}/{total} bytes)\n")
                stream.flush()

    return progress
