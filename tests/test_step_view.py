"""The build's step view and the image push's bytes, from recorded engine output:
tests/fixtures/buildkit/*.log are the BuildKit plain progress two real builds of recipes/demo.yaml
passed to the line sink (Debian's 20.10 client, and buildx on Docker 26 with the containerd
store), with every base step cached and the pip, ldconfig and copy steps run;
tests/fixtures/push/*.jsonl the docker SDK push streams of a real push to the local registry."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pytest
from helpers import REPO

from buildkit_py.cli.progress import Activity, BuildSteps, StepView, human_duration
from buildkit_py.engine.kinds.docker_push import push_image

FIXTURES = REPO / "tests" / "fixtures"
DOCKER20 = FIXTURES / "buildkit" / "docker20-classic.log"
DOCKER26 = FIXTURES / "buildkit" / "docker26-buildx.log"


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        self.now += 0.5
        return self.now


def test_steps_parsed_from_the_classic_client():
    steps = BuildSteps(Clock())
    for line in lines(DOCKER20):
        steps.feed(line)
    by_name = {s.name: s for s in steps.ordered()}
    # the step id imgbuild marks each RUN with, else the instruction
    assert by_name["[final 2/10] os"].state == "cached"
    assert by_name["[final 7/10] pins"].state == "done" and by_name["[final 7/10] pins"].seconds == 12.8
    assert by_name["[final 9/10] COPY [demo-app/, /app]"].state == "done"
    # what the engine itself counted for this build: "4 run, 5 cached" (FROM aside)
    real = [s for s in steps.ordered() if "FROM" not in s.what]
    assert sum(s.state == "cached" for s in real) == 5 and sum(s.state == "done" for s in real) == 4
    assert all(s.state != "running" for s in steps.ordered())  # every step ended


def test_steps_parsed_from_buildx_on_the_containerd_store():
    steps = BuildSteps(Clock())
    events = [e for line in lines(DOCKER26) if (e := steps.feed(line))]
    names = [s.name for s in steps.ordered()]
    assert names[0].startswith("[final 1/7] FROM docker.io/library/debian:bookworm-slim@sha256:4cda618c9c95")
    assert names[0].endswith("...")  # a long instruction is shortened
    assert names[1:3] == ["[final 2/18] os", "[final 3/18] python"]
    pins = next(s for s in steps.ordered() if s.name == "[final 7/10] pins")
    assert (pins.state, pins.seconds) == ("done", 16.1)
    starts = [e[1].key for e in events if e[0] == "start"]
    assert len(starts) == len(set(starts)) == len(steps.ordered())  # a header BuildKit repeats is one step


@pytest.mark.parametrize("log", [DOCKER20, DOCKER26])
def test_plain_view_one_line_per_step_and_the_time_of_each_that_ran(log):
    stream = io.StringIO()
    with StepView(stream, "plain", clock=Clock()) as view:
        for line in lines(log):
            view.line(line)
    text = stream.getvalue()
    assert "[final 7/10] pins\n" in text
    assert "[final 7/10] pins: done in 1" in text  # 12.8s on 20.10, 16.1s on 26
    assert "[final 9/10] COPY [demo-app/, /app]: done in" in text
    assert "Collecting numpy" not in text and "sha256:bcf7" not in text  # step output stays out
    assert "[internal]" not in text  # BuildKit's own vertices are not steps
    assert text.count("\n") == len({ln for ln in text.splitlines()})  # no line twice


def test_plain_progress_passes_every_line_and_quiet_none():
    stream = io.StringIO()
    with StepView.for_option(stream, "plain") as view:
        for line in lines(DOCKER20):
            view.line(line)
    assert stream.getvalue().splitlines() == lines(DOCKER20)
    stream = io.StringIO()
    with StepView.for_option(stream, "quiet") as view:
        for line in lines(DOCKER20):
            view.line(line)
        view.note("lock used")
        view.transfer("push", "abc", 1, 2)
    assert stream.getvalue() == ""


def test_auto_is_plain_off_a_terminal_and_live_on_one():
    assert StepView.for_option(io.StringIO(), "auto").mode == "plain"

    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert StepView.for_option(Tty(), "auto").mode == "live"


def test_live_view_draws_a_table_of_steps_with_state_and_time():
    stream = io.StringIO()
    clock = Clock()
    with StepView(stream, "live", clock=clock) as view:
        for line in lines(DOCKER26):
            view.line(line)
        table = view.render()
        view.note("lock     recipe.lock (used)")
    text = stream.getvalue()  # rich draws the final frame when the view closes
    expected = (("[final 2/18] os", "cached"), ("[final 7/10] pins", "done"), ("[final 10/10] WORKDIR /app", "done"))
    for name, state in expected:
        row = next(ln for ln in text.splitlines() if name in ln)
        assert row.split()[0] == state, row
    assert "16.1s" in text and "lock     recipe.lock (used)" in text
    assert table.caption == "12 steps: 6 cached, 6 run"


def test_live_view_shows_a_running_step_with_its_elapsed_time():
    clock = Clock()
    view = StepView(io.StringIO(), "live", clock=clock)
    view.line("#11 [final  7/10] RUN set -eu; : imgbuild-step=pins;     pip install numpy==1.26.4")
    clock.now += 30
    stream = io.StringIO()
    import rich.console

    rich.console.Console(file=stream, width=120).print(view.render())
    row = next(ln for ln in stream.getvalue().splitlines() if "pins" in ln)
    assert row.split()[:2] == ["running", "30.5s"]


def test_matrix_variants_are_told_apart():
    stream = io.StringIO()
    with StepView(stream, "plain", clock=Clock()) as view:
        for line in lines(DOCKER20)[:40]:
            view.line(line, "cu121-py311")
            view.line(line, "cu124-py311")
    text = stream.getvalue()
    assert "[cu121-py311] [final 2/10] os\n" in text and "[cu124-py311] [final 2/10] os\n" in text


@pytest.mark.parametrize(("stream", "layer", "total"), [
    (FIXTURES / "push" / "docker20.jsonl", "be99c261ec96", 6_000_000),
    (FIXTURES / "push" / "docker26.jsonl", "ab3f4110c8da", 65_775_185),
])
def test_push_reports_each_layers_bytes(monkeypatch, stream, layer, total):
    chunks = [json.loads(line) for line in stream.read_text().splitlines()]

    class Client:
        class images:  # noqa: N801 - the SDK's attribute name
            @staticmethod
            def push(repo, tag, **_kw):
                return iter(chunks)

    monkeypatch.setattr("buildkit_py.engine.kinds.docker_push.auth_config_for", lambda ref: None)
    events, notes = [], []
    result = push_image(Client(), "127.0.0.1:5000/imgbuild-rec/push:1", on_progress=notes.append,
                        on_transfer=lambda *e: events.append(e))
    assert result.digest.startswith("sha256:")
    ours = [e for e in events if e[1] == layer]
    assert ours[0][0] == "push" and ours[-1] == ("pushed", layer, total, total)
    done = [e[2] for e in ours]
    assert done == sorted(done) and all(e[3] == total for e in ours)
    assert notes == []  # the bytes went to the bar, not a line per state


def test_push_bar_after_the_steps_in_plain_lines():
    stream = io.StringIO()
    with StepView(stream, "plain", clock=Clock()) as view:
        view.line("#5 [final 2/10] RUN : imgbuild-step=os; apt-get update")
        view.line("#5 DONE 1.0s")
        view.transfer("push", "be99c261ec96", 3_000_000, 6_000_000)
        view.transfer("pushed", "be99c261ec96", 6_000_000, 6_000_000)
    out = stream.getvalue().splitlines()
    assert out[:2] == ["[final 2/10] os", "[final 2/10] os: done in 1.0s"]
    assert out[-1] == "   pushed be99c261ec96 100% (5.7 MiB of 5.7 MiB)"


def test_matrix_summary_table_on_a_terminal():
    import rich.console

    from buildkit_py.cli.build import summary_table

    report = {"name": "team/mx", "seconds": 42.0, "ok": 1, "failed": 1, "dropped": [{"id": "cu118-py312"}],
              "variants": [
                  {"variant": "cu121-py311", "status": "ok", "tags": ["team/mx:cu121-py311"], "seconds": 30.5,
                   "digest": "sha256:" + "ab" * 32, "size": 6_000_000_000, "steps_run": 2, "steps_cached": 3},
                  {"variant": "cu124-py311", "status": "failed", "tags": ["team/mx:cu124-py311"], "seconds": 11.0,
                   "error": {"error": "BuildFailed", "message": "build failed (exit 1)"}}]}
    stream = io.StringIO()
    summary_table(report, rich.console.Console(file=stream, width=120))
    text = stream.getvalue()
    ok = next(ln for ln in text.splitlines() if "cu121-py311" in ln and "ok" in ln)
    assert ["5.6 GiB", "abababababab", "30.5s", "3/5"] == [c for c in (c.strip() for c in ok.split("│")) if c][2:6]
    assert any("cu124-py311" in ln and "FAILED" in ln for ln in text.splitlines())
    assert "1 built, 1 failed, 1 dropped, in 42.0s" in text and "cu124-py311: build failed (exit 1)" in text


class SetClock:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_plain_heartbeat_names_the_running_step_after_each_silent_interval():
    """issue 22: 10: a long step in plain (CI) mode printed nothing between its start and its end."""
    clock, stream = SetClock(), io.StringIO()
    view = StepView(stream, "plain", clock=clock, heartbeat=30)
    view.line("#7 [final 5/10] RUN set -eu; : imgbuild-step=cuda; uv pip install ...")
    view.line("#7 0.512 Resolved 12 packages")  # step output stays out of plain mode
    clock.now += 29
    view.beat()
    assert stream.getvalue() == "[final 5/10] cuda\n"  # not yet
    clock.now += 1
    view.beat()
    clock.now += 10
    view.beat()  # 10 s after the heartbeat: nothing
    clock.now += 50
    view.beat()
    view.line("#7 DONE 90.0s")
    clock.now += 31
    view.beat()  # no step runs: the build itself
    assert stream.getvalue().splitlines() == [
        "[final 5/10] cuda", "still running [final 5/10] cuda (30s)", "still running [final 5/10] cuda (1m30s)",
        "[final 5/10] cuda: done in 90.0s", "still building (2m01s)"]


def test_heartbeat_per_variant_and_none_when_live_or_quiet():
    clock = SetClock()
    stream = io.StringIO()
    view = StepView(stream, "plain", clock=clock, heartbeat=30)
    view.line("#3 [final 2/9] RUN : imgbuild-step=os; apt-get", "cu124")
    view.line("#3 [final 2/9] RUN : imgbuild-step=os; apt-get", "cu126")
    clock.now += 45
    view.beat()
    assert stream.getvalue().splitlines()[-2:] == ["[cu124] still running [final 2/9] os (45s)",
                                                   "[cu126] still running [final 2/9] os (45s)"]
    quiet = io.StringIO()
    with StepView(quiet, "quiet", clock=clock, heartbeat=0.01) as view:
        view.line("#3 [final 2/9] RUN : imgbuild-step=os; apt-get")
        time.sleep(0.1)
    assert quiet.getvalue() == ""


def test_heartbeat_thread_with_a_real_clock():
    stream = io.StringIO()
    with StepView(stream, "plain", heartbeat=0.05) as view:
        view.line("#4 [final 3/9] RUN : imgbuild-step=python; python3 -m venv /opt/venv")
        time.sleep(0.4)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "[final 3/9] python"
    assert len(lines) >= 3 and all(re.fullmatch(r"still running \[final 3/9\] python \(0s\)", x) for x in lines[1:])


def test_activity_plain_lines_and_heartbeat():
    """issue 22: 10: lock and data refresh were silent for 20-30 s off a terminal."""
    clock, stream = SetClock(), io.StringIO()
    activity = Activity(stream, "plain", clock=clock, heartbeat=30)
    activity("resolving 34 requirements of stage final with pip")  # the first phase: at once
    clock.now += 31
    activity.beat()
    activity("pinning base debian:bookworm-slim")  # a line was written just now: it waits
    clock.now += 1
    activity.beat()
    activity("reading torch 2.4.1")  # the phase before lasted 1 s: never printed
    clock.now += 1
    activity.beat()  # 2 s after the last line: the phase that runs now
    clock.now += 30
    activity.beat()
    assert stream.getvalue().splitlines() == [
        "resolving 34 requirements of stage final with pip",
        "still resolving 34 requirements of stage final with pip (31s)",
        "reading torch 2.4.1",
        "still reading torch 2.4.1 (31s)"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_activity_spinner_on_a_terminal_and_nothing_when_quiet():
    stream = Terminal()
    assert Activity.for_option(stream, "auto").mode == "live"
    assert Activity.for_option(io.StringIO(), "auto").mode == "plain"
    with Activity(stream, "live") as activity:
        activity("[cu121] resolving 3 requirements")  # brackets: text, not rich markup
        time.sleep(0.3)
    assert "[cu121] resolving 3 requirements (0s)" in stream.getvalue()
    quiet = io.StringIO()
    with Activity(quiet, "quiet", heartbeat=0.01) as activity:
        activity("resolving")
        time.sleep(0.05)
    assert quiet.getvalue() == ""


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (59.9, "59s"), (90, "1m30s"), (3600 + 125, "1h02m")])
def test_human_duration(seconds, text):
    assert human_duration(seconds) == text
