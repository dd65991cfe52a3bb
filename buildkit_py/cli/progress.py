"""How the CLI shows the progress the library reports; the library never prints.

- transfers (``progress(event, label, done, total)``, possibly from several threads: weights
  push/pull, mirror, image push): a rich progress display with bytes, speed and ETA per file on
  a terminal, plain lines (one per file per 10%) otherwise;
- builds (BuildKit's plain progress lines, which every engine passes on): ``StepView``, a live
  table of the steps (cached, running, done, elapsed) on a terminal, plain lines otherwise, with
  a heartbeat line ("still running [final 5/10] cuda (1m30s)") after every ``heartbeat`` seconds
  of silence, so a long step in a CI log is not a silent one;
- waits with no bytes to count (resolving a lock, reading a package index): ``Activity``, a
  spinner with what is going on and its elapsed time on a terminal, a line per phase and the same
  heartbeat otherwise."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import IO, Any

from buildkit_py.sizes import human_size

Progress = Callable[[str, str, int, int], None]
_DONE_EVENTS = frozenset({"exists", "present", "mounted", "manifest"})
HEARTBEAT_SECONDS = 30.0  # plain output: a line after this long without one (IMGBUILD_HEARTBEAT)


def heartbeat_seconds() -> float:
    """The heartbeat interval of plain progress: $IMGBUILD_HEARTBEAT seconds, else 30."""
    try:
        value = float(os.environ.get("IMGBUILD_HEARTBEAT") or HEARTBEAT_SECONDS)
    except ValueError:
        return HEARTBEAT_SECONDS
    return value if value > 0 else HEARTBEAT_SECONDS


def human_duration(seconds: float) -> str:
    """``95`` -> ``"1m35s"``: how long a wait has lasted, for heartbeat lines and spinners."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


class _Ticker:
    """Calls ``beat`` every ``period`` seconds on a daemon thread until stopped."""

    def __init__(self, period: float, beat: Callable[[], None]):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period, beat), name="imgbuild-heartbeat", daemon=True)
        self._thread.start()

    def _run(self, period: float, beat: Callable[[], None]) -> None:
        while not self._stop.wait(period):
            beat()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _ticker(heartbeat: float, beat: Callable[[], None]) -> _Ticker:
    return _Ticker(min(1.0, heartbeat / 4), beat)


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
    import rich.console  # noqa: PLC0415 - see above
    import rich.progress as rp  # noqa: PLC0415 - see above

    size_column, speed_column = _size_columns()
    view = rp.Progress(rp.TextColumn("{task.description}"), rp.BarColumn(), size_column(), speed_column(),
                       rp.TimeRemainingColumn(), console=rich.console.Console(file=stream), transient=False)
    tasks: dict[str, Any] = {}  # label -> rich TaskID
    lock = threading.Lock()

    def progress(event: str, label: str, done: int, total: int) -> None:
        with lock:
            task = tasks.get(label)
            if task is None:
                task = tasks[label] = view.add_task(f"{event:>8} {label}", total=total or None)
        view.update(task, description=f"{event:>8} {label}", completed=done, total=total or None)

    with view:
        yield progress


def _size_columns() -> tuple[type, type]:
    """rich's bytes and speed columns in sizes.py's units: its DownloadColumn and
    TransferSpeedColumn count in their own code (the speed in decimal MB/s)."""
    from rich.progress import ProgressColumn  # noqa: PLC0415 - rich only for a terminal (start-up)
    from rich.text import Text  # noqa: PLC0415

    class SizeColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            done = human_size(task.completed)
            return Text(f"{done} of {human_size(task.total)}" if task.total else done, style="progress.download")

    class SpeedColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            speed = task.finished_speed or task.speed
            return Text("?" if speed is None else f"{human_size(speed)}/s", style="progress.data.speed")

    return SizeColumn, SpeedColumn


@contextmanager
def transfer_view(stream: IO[str], progress: str = "auto") -> Iterator[Progress]:
    """The transfer callback for --progress auto|plain|quiet: auto draws rich bars on a
    terminal and plain lines elsewhere, plain always plain lines, quiet nothing."""
    if progress == "quiet":
        yield lambda _event, _label, _done, _total: None
        return
    with transfer_progress(stream, live=None if progress == "auto" else False) as callback:
        yield callback


def transferred(done: int, total: int) -> str:
    """``4.0 MiB of 11.4 MiB`` (``total`` 0: unknown)."""
    return f"{human_size(done)} of {human_size(total)}" if total else human_size(done)


def plain_lines(stream: IO[str]) -> Progress:
    """One line per file at every 10% and at each state change (``exists``, ``present``...)."""
    last: dict[str, int] = {}
    lock = threading.Lock()

    def progress(event: str, label: str, done: int, total: int) -> None:
        pct = int(done * 100 / total) if total else 100
        with lock:
            if event in _DONE_EVENTS or pct >= last.get(label, -10) + 10 or done == total:
                last[label] = pct
                stream.write(f"{event:>9} {label} {pct:3d}% ({transferred(done, total)})\n")
                stream.flush()

    return progress


# --- the build's steps ---------------------------------------------------------------------------

# BuildKit's plain progress (`--progress plain`, what every engine passes to the line sink):
#   #7 [app 2/4] RUN --mount=... : imgbuild-step=pip-app; pip install ...   a step starts (repeated
#                                                                           when its output resumes)
#   #7 CACHED | #7 DONE 12.3s | #7 ERROR: process ... did not complete      how it ended
#   #7 0.512 Collecting numpy                                               its output
_START_RE = re.compile(r"^#(\d+) \[([^\]]*?)\s*(\d+/\d+)\] (.*)$")
_CACHED_RE = re.compile(r"^#(\d+) CACHED$")
_DONE_RE = re.compile(r"^#(\d+) DONE (\d+(?:\.\d+)?)s$")
_ERROR_RE = re.compile(r"^#(\d+) ERROR:? ?(.*)$")
_MARK_RE = re.compile(r"imgbuild-step=([\w.-]+)")
_NAME_WIDTH = 90


class Step:
    """One Dockerfile step as BuildKit reports it. (A plain class: this module is imported at
    start-up, dataclasses is not.)"""

    __slots__ = ("key", "message", "seconds", "stage", "started", "state", "what")

    def __init__(self, key: tuple[str, str], stage: str, what: str, started: float):
        self.key = key  # (variant, vertex)
        self.stage = stage  # "[app 2/4]"
        self.what = what  # the step's id (imgbuild-step=...) or its instruction, shortened
        self.started = started
        self.state = "running"  # running | cached | done | error
        self.seconds: float | None = None  # BuildKit's own figure once done
        self.message = ""

    @property
    def name(self) -> str:
        return f"{self.stage} {self.what}"

    def elapsed(self, now: float) -> float:
        return self.seconds if self.seconds is not None else now - self.started


def _what(instruction: str) -> str:
    mark = _MARK_RE.search(instruction)
    if mark:
        return mark.group(1)
    text = " ".join(instruction.split())
    return text if len(text) <= _NAME_WIDTH else text[:_NAME_WIDTH - 3] + "..."


class BuildSteps:
    """The steps of one or more builds (matrix variants), read from BuildKit's plain lines.
    ``feed`` returns the step a line started or ended, None for any other line."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.steps: dict[tuple[str, str], Step] = {}
        self.lock = threading.Lock()

    def feed(self, line: str, variant: str = "") -> tuple[str, Step] | None:
        with self.lock:
            if m := _START_RE.match(line):
                key = (variant, m.group(1))
                stage = f"[{m.group(2)} {m.group(3)}]".replace("[ ", "[")
                what = _what(m.group(4))
                known = self.steps.get(key)
                if known is not None and (known.stage, known.what) == (stage, what):
                    return None  # BuildKit repeats a step's header when its output resumes
                started = self.steps[key] = Step(key, stage, what, self.clock())
                return "start", started
            for regex, state in ((_CACHED_RE, "cached"), (_DONE_RE, "done"), (_ERROR_RE, "error")):
                if (m := regex.match(line)) and (step := self.steps.get((variant, m.group(1)))) is not None:
                    return self._end(step, state, m.group(2) if regex.groups > 1 else "")
            return None

    def _end(self, step: Step, state: str, detail: str) -> tuple[str, Step] | None:
        if step.state != "running":
            return None
        step.state = state
        if state == "done":
            step.seconds = float(detail)
        elif state == "error":
            step.message = detail
            step.seconds = self.clock() - step.started
        else:
            step.seconds = 0.0
        return state, step

    def ordered(self) -> list[Step]:
        with self.lock:
            return sorted(self.steps.values(), key=lambda s: (s.key[0], s.started, int(s.key[1])))


def plain_step_line(event: str, step: Step, variant: str = "") -> str | None:
    """The plain-text line for a step event (CI logs, --progress auto off a terminal)."""
    prefix = f"[{variant}] " if variant else ""
    if event == "start":
        return f"{prefix}{step.name}"
    if event == "done":
        return f"{prefix}{step.name}: done in {step.seconds:.1f}s"
    if event == "error":
        from buildkit_py.engine.buildlog import short_error  # noqa: PLC0415 - only when a step fails

        return f"{prefix}{step.name}: ERROR {short_error(step.message)}"
    return None  # cached: its start line is enough; the summary counts them


class StepView:
    """How the CLI shows a build's progress on stderr:

    - ``live``: a rich Live table on a terminal: each step with cached / running / done /
      error and its elapsed time, redrawn four times a second;
    - ``plain``: one line per step as it starts, one when a step that ran finishes (with its
      time), every error line; nothing else (CI logs, pipes);
    - ``all``: every BuildKit line (``--progress plain``);
    - ``quiet``: nothing.

    ``line(text, variant)`` takes the engine's lines (from several threads for a matrix);
    ``note(text)`` a line of imgbuild's own (lock, push); ``transfer`` a push's byte
    progress (a rich bar with bytes, speed and ETA on a terminal)."""

    def __init__(self, stream: IO[str], mode: str, *, clock: Callable[[], float] = time.monotonic,
                 heartbeat: float | None = None):
        if mode not in ("live", "plain", "all", "quiet"):
            raise ValueError(f"unknown step view mode {mode!r}")
        self.stream, self.mode = stream, mode
        self.steps = BuildSteps(clock)
        self.clock = clock
        self.heartbeat = heartbeat or heartbeat_seconds()
        self._write_lock = threading.Lock()
        self._live: Any = None  # a rich.live.Live while the step table is drawn
        self._transfer: Progress | None = None
        self._stack = ExitStack()
        self._started = self._last_write = clock()
        self._ticker: _Ticker | None = None

    @classmethod
    def for_option(cls, stream: IO[str], progress: str) -> StepView:
        """From --progress auto|plain|quiet: auto is live on a terminal, plain lines elsewhere."""
        if progress == "quiet":
            return cls(stream, "quiet")
        if progress == "plain":
            return cls(stream, "all")
        return cls(stream, "live" if stream.isatty() else "plain")

    def __enter__(self) -> StepView:
        if self.mode == "live":
            import rich.console  # noqa: PLC0415 - rich only for a terminal (start-up)
            import rich.live  # noqa: PLC0415 - as above

            self._live = rich.live.Live(console=rich.console.Console(file=self.stream), refresh_per_second=4,
                                        get_renderable=self.render, transient=False)
            self._live.start()
        elif self.mode in ("plain", "all"):
            self._ticker = _ticker(self.heartbeat, self.beat)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ticker is not None:
            self._ticker.stop()
        self._stop_live()
        self._stack.close()

    def _stop_live(self) -> None:
        live, self._live = self._live, None
        if live is not None:
            live.refresh()
            live.stop()

    def _write(self, text: str) -> None:
        with self._write_lock:
            self.stream.write(text + "\n")
            self.stream.flush()
            self._last_write = self.clock()

    def beat(self) -> None:
        """Plain output (CI logs): after ``heartbeat`` seconds without a line, a line for each
        step still running ("still running [final 5/10] cuda (1m30s)"), or for the build when no
        step is (exporting, pushing). The ticker thread calls it; tests call it with a fake clock."""
        now = self.clock()
        if now - self._last_write < self.heartbeat:
            return
        running = [s for s in self.steps.ordered() if s.state == "running"]
        for s in running:
            variant = f"[{s.key[0]}] " if s.key[0] else ""
            self._write(f"{variant}still running {s.name} ({human_duration(s.elapsed(now))})")
        if not running:
            self._write(f"still building ({human_duration(now - self._started)})")

    def line(self, text: str, variant: str = "") -> None:
        event = self.steps.feed(text, variant)
        if self.mode == "all":
            self._write(f"[{variant}] {text}" if variant else text)
        elif self.mode == "plain":
            out = plain_step_line(*event, variant) if event else None
            # Error lines of the steps' output; not BuildKit's summary after a failure (lines
            # without "#N"), which repeats the step's script: the error message names the step.
            if out is None and "ERROR" in text and text.startswith("#") and not (event and event[0] == "error"):
                out = (f"[{variant}] " if variant else "") + " ".join(text.split())[:160]
            if out is not None:
                self._write(out)

    def note(self, text: str) -> None:
        if self.mode == "quiet":
            return
        if self._live is not None:
            self._live.console.print(text, markup=False, highlight=False)
        else:
            self._write(text)

    def transfer(self, event: str, label: str, done: int, total: int) -> None:
        """A push's bytes: the step table is finished first (one live display at a time)."""
        if self.mode == "quiet":
            return
        if self._transfer is None:
            self._stop_live()
            self._transfer = self._stack.enter_context(transfer_progress(self.stream, live=self.mode == "live"))
        self._transfer(event, label, done, total)
        self._last_write = self.clock()  # the push's own lines (or bar) show it is alive

    def render(self) -> Any:
        """The rich table of the steps so far (what the live view redraws)."""
        from rich.table import Table  # noqa: PLC0415 - rich only when a live view draws (start-up)
        from rich.text import Text  # noqa: PLC0415 - as above

        now = self.clock()
        steps = self.steps.ordered()
        variants = any(s.key[0] for s in steps)
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        table.add_column("", min_width=7, no_wrap=True)
        table.add_column("time", justify="right", min_width=7, no_wrap=True)
        if variants:
            table.add_column("variant", no_wrap=True)
        table.add_column("step", overflow="ellipsis", no_wrap=True)
        styles = {"running": "yellow", "cached": "dim", "done": "green", "error": "bold red"}
        for s in steps:  # Text: a step's name is BuildKit's text ("[final 2/10] ..."), never markup
            row = [Text(s.state, style=styles[s.state]), Text("" if s.state == "cached" else f"{s.elapsed(now):.1f}s")]
            if variants:
                row.append(Text(s.key[0]))
            row.append(Text(s.name))
            table.add_row(*row)
        cached = sum(1 for s in steps if s.state == "cached")
        ran = sum(1 for s in steps if s.state in ("done", "running", "error"))
        if steps:
            table.caption = f"{len(steps)} steps: {cached} cached, {ran} run"
        return table


# --- waits with nothing to count -------------------------------------------------------------


class Activity:
    """How the CLI shows a wait that has phases but no bytes to count (``lock`` resolving with
    pip, ``data refresh`` reading the index): call it with what is going on now.

    - ``live``: a spinner on a terminal with that text and how long it has lasted;
    - ``plain``: the phase as a line, at most one every ``spacing`` seconds (a phase that ends
      sooner is not printed; one that lasts is, within ``spacing``), and after every ``heartbeat``
      seconds without a line, "still <text> (1m30s)" (CI logs, pipes);
    - ``quiet``: nothing."""

    def __init__(self, stream: IO[str], mode: str, *, clock: Callable[[], float] = time.monotonic,
                 heartbeat: float | None = None, spacing: float = 2.0):
        if mode not in ("live", "plain", "quiet"):
            raise ValueError(f"unknown activity mode {mode!r}")
        self.stream, self.mode, self.clock = stream, mode, clock
        self.heartbeat, self.spacing = heartbeat or heartbeat_seconds(), spacing
        self.text = ""
        self._since = clock()
        self._last_write = float("-inf")
        self._printed = True  # the current text is on the stream (nothing to print yet)
        self._lock = threading.Lock()
        self._live: Any = None
        self._spinner: Any = None
        self._text: Any = None
        self._ticker: _Ticker | None = None

    @classmethod
    def for_option(cls, stream: IO[str], progress: str) -> Activity:
        """From --progress auto|plain|quiet: auto is a spinner on a terminal, lines elsewhere."""
        if progress in ("quiet", "plain"):
            return cls(stream, progress)
        return cls(stream, "live" if stream.isatty() else "plain")

    def __enter__(self) -> Activity:
        if self.mode == "live":
            import rich.console  # noqa: PLC0415 - rich only for a terminal (start-up)
            import rich.live  # noqa: PLC0415 - as above
            import rich.spinner  # noqa: PLC0415 - as above
            import rich.text  # noqa: PLC0415 - as above

            self._text = rich.text.Text  # the activity's text is never markup ("[cu121] ...")
            self._spinner = rich.spinner.Spinner("dots", text="")
            self._live = rich.live.Live(console=rich.console.Console(file=self.stream), refresh_per_second=8,
                                        get_renderable=self.render, transient=True)
            self._live.start()
        elif self.mode == "plain":
            self._ticker = _ticker(self.heartbeat, self.beat)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ticker is not None:
            self._ticker.stop()
        if self._live is not None:
            self._live.stop()

    def __call__(self, text: str) -> None:
        with self._lock:
            self.text, self._since, self._printed = text, self.clock(), False
        if self.mode == "plain":
            self.beat()

    def beat(self) -> None:
        """Plain output: the current phase once ``spacing`` seconds passed since the last line;
        "still <text> (elapsed)" after ``heartbeat`` seconds without one. The ticker thread
        calls it; tests call it with a fake clock."""
        with self._lock:
            now = self.clock()
            quiet_for = now - self._last_write
            if not self._printed and quiet_for >= self.spacing:
                line, self._printed = self.text, True
            elif self._printed and self.text and quiet_for >= self.heartbeat:
                line = f"still {self.text} ({human_duration(now - self._since)})"
            else:
                return
            self.stream.write(line + "\n")
            self.stream.flush()
            self._last_write = now

    def render(self) -> Any:
        """The spinner with the text and its elapsed time (what the live view redraws)."""
        elapsed = human_duration(self.clock() - self._since)
        self._spinner.update(text=self._text(f"{self.text} ({elapsed})" if self.text else ""))
        return self._spinner
