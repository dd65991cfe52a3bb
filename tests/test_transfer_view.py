"""The CLI's view of transfer progress: plain lines off a terminal, rich with bytes, speed
and ETA on one. Events come from worker threads."""

from __future__ import annotations

import io
import re
import threading

from buildkit_py.cli.progress import transfer_progress


def test_plain_lines_every_ten_percent_and_each_state():
    stream = io.StringIO()
    with transfer_progress(stream) as progress:  # StringIO is not a terminal
        for done in range(0, 101, 5):
            progress("download", "model.safetensors", done, 100)
        progress("present", "config.json", 7, 7)
    lines = stream.getvalue().splitlines()
    assert lines[0] == " download model.safetensors   0% (0 B of 100 B)"  # sizes.py's units (issue 22: 9)
    assert len([line for line in lines if "model.safetensors" in line]) == 11
    assert lines[-1] == "  present config.json 100% (7 B of 7 B)"


def test_live_view_draws_bytes_speed_and_eta_from_threads():
    stream = io.StringIO()
    with transfer_progress(stream, live=True) as progress:
        threads = [threading.Thread(target=lambda i=i: [progress("upload", f"shard-{i}", d << 20, 8 << 20)
                                                        for d in range(9)]) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    text = stream.getvalue()
    assert all(f"shard-{i}" in text for i in range(3))
    assert "8.0 MiB of 8.0 MiB" in text  # bytes done of total, sizes.py's binary units
    # the speed in the same units: rich's own column printed decimal MB/s beside MiB (issue 22: 9)
    assert re.search(r"\d\.\d (KiB|MiB|GiB|TiB)/s", text) and not re.search(r"\d (kB|MB|GB|TB)/s", text)


def test_plain_lines_in_binary_units():
    stream = io.StringIO()
    with transfer_progress(stream) as progress:
        progress("download", "model.safetensors", 4_194_304, 12_000_000)
        progress("hash", "stream", 5, 0)  # total unknown
    assert stream.getvalue().splitlines() == [" download model.safetensors  34% (4.0 MiB of 11.4 MiB)",
                                              "     hash stream 100% (5 B)"]
