"""A failed build names its step once, with that step's own last lines and a hint for the known
causes (issue 22 item 4), read from real logs: tests/fixtures/buildkit/failures/*.log are the
plain progress of real failing builds of small recipes on this machine, from Debian's 20.10
client (classic) and from buildx 0.13 on Docker 26 (see the folder's README for how each was
made). Before, the error repeated the step's whole RUN script up to five times and the log's
last 40 lines (on buildx: BuildKit's Dockerfile excerpt), with no hint."""

from __future__ import annotations

import io

import pytest
from helpers import REPO

from buildkit_py.cli.progress import StepView
from buildkit_py.engine.buildlog import OUTPUT_LINES, BuildLog, build_failure, classify, short_error
from buildkit_py.errors import BuildFailed

FAILURES = REPO / "tests" / "fixtures" / "buildkit" / "failures"
ENGINES = ["docker20-classic", "docker26-buildx"]

# fixture -> (the step that failed, its exit code, the cause, a piece of the line quoted as evidence)
CASES = {
    "certificate-pip": ("cuda [final 6/8]", 1, "certificate", "CERTIFICATE_VERIFY_FAILED"),
    "certificate-uv": ("pins [final 7/8]", 2, "certificate", "invalid peer certificate: UnknownIssuer"),
    "unreachable-pip-refused": ("cuda [final 6/8]", 1, "index-unreachable", "Connection refused"),
    "unreachable-uv-dns": ("pins [final 7/8]", 2, "index-unreachable", "Name or service not known"),
    "hash-mismatch-pip": ("pins [final 7/8]", 1, "hash-mismatch", "DO NOT MATCH THE HASHES"),
    "hash-mismatch-uv": ("pins [final 7/8]", 1, "hash-mismatch", "Hash mismatch for `six==1.16.0`"),
    "compiler-python-h": ("pins [final 7/8]", 1, "compiler", "fatal error: Python.h: No such file or directory"),
    # issue 31: 6: these two had cause null and a generic hint, and the index URL blamed for the proxy
    "compiler-missing": ("pins [final 7/8]", 1, "compiler-missing",
                         "[Errno 2] No such file or directory: 'x86_64-linux-gnu-gcc'"),
    "proxy-pip": ("cuda [final 6/8]", 1, "proxy", "ProxyError('Cannot connect to proxy.'"),
    "proxy-uv": ("pins [final 7/8]", 2, "proxy", "tunnel error: failed to create underlying connection"),
}


def read(engine: str, case: str) -> BuildLog:
    log = BuildLog()
    for line in (FAILURES / f"{engine}-{case}.log").read_text().splitlines():
        log.feed(line)
    return log


def failure(engine: str, case: str, *, ca_cert: bool = False) -> BuildFailed:
    return build_failure(read(engine, case), ["docker", "build"], 1, ca_cert=ca_cert)


def test_every_recorded_log_is_a_case():
    assert sorted(p.name for p in FAILURES.glob("*.log")) == sorted(
        f"{e}-{c}.log" for e in ENGINES for c in CASES)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_failed_step_its_exit_code_and_the_cause(engine, case):
    step, exit_code, cause, evidence = CASES[case]
    log = read(engine, case)
    failed = log.failure()
    assert failed is not None and failed.name == step
    assert (failed.error, failed.exit_code) == (f"exit code: {exit_code}", exit_code)
    found = log.cause()
    assert found is not None and found.code == cause
    assert evidence in found.evidence


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_message_shows_the_step_once_with_its_own_last_lines_and_a_hint(engine, case):
    step, _, cause, _ = CASES[case]
    exc = failure(engine, case)
    text = exc.render()
    assert text.startswith(f"build failed at step {step}: exit code: ")
    assert text.count(step) == 2  # the first line and the heading of its lines: the step once, its lines once
    assert "/bin/sh -c" not in text and "set -eu" not in text and "Dockerfile:" not in text  # no script, no excerpt
    assert exc.step is not None and 0 < len(exc.step.output) <= OUTPUT_LINES
    assert not any(line.startswith("#") for line in exc.step.output)  # its output, not BuildKit's vertex lines
    assert exc.cause == cause and exc.hint
    assert len(text) < 6000, len(text)  # was 8-14 KB
    doc = exc.to_json()
    assert doc["cause"] == cause and doc["step"]["name"] == step and doc["step"]["output"] == list(exc.step.output)


@pytest.mark.parametrize("engine", ENGINES)
def test_hints_name_what_to_do(engine):
    assert "--ca-cert FILE" in failure(engine, "certificate-pip").hint
    assert "IMGBUILD_CA_CERT" in failure(engine, "certificate-uv").hint
    # given a bundle that does not hold the proxy's CA, the hint says so instead
    assert "does not hold the CA" in failure(engine, "certificate-pip", ca_cert=True).hint
    for case in ("hash-mismatch-pip", "hash-mismatch-uv"):
        assert "imgbuild lock" in failure(engine, case).hint and "--update-lock" in failure(engine, case).hint
    assert "python3-dev" in failure(engine, "compiler-python-h").hint
    assert "--pip-config" in failure(engine, "unreachable-uv-dns").hint
    missing = failure(engine, "compiler-missing").hint
    assert "no C compiler" in missing and "build.from_source" in missing and "apt:" in missing
    for case in ("proxy-pip", "proxy-uv"):
        proxy = failure(engine, case).hint
        assert "through a proxy" in proxy and "index URL is not the problem" in proxy
        assert "check its URL" not in proxy  # the unreachable index's hint, which blamed the index URL


@pytest.mark.parametrize(("lines", "code"), [
    (["ERROR: Hashes are required in --require-hashes mode, but they are missing from these packages:"],
     "hash-missing"),
    (["error: In `--require-hashes` mode, all requirements must have a hash, but none were provided for: idna"],
     "hash-missing"),
    (["x.cu(12): error: identifier \"foo\" is undefined", "nvcc fatal   : Unsupported gpu architecture 'compute_99'"],
     "compiler"),
    (["error: command 'gcc' failed: No such file or directory"], "compiler-missing"),
    (["error: command 'gcc' failed with exit status 1"], "compiler"),
    (["unable to execute 'x86_64-linux-gnu-gcc': No such file or directory"], "compiler-missing"),
    (["x86_64-linux-gnu-gcc: No such file or directory"], "compiler-missing"),  # the words
    (["/bin/sh: 1: cc: not found"], "compiler-missing"),
    (["../meson.build:1:0: ERROR: Unknown compiler(s): [['cc'], ['gcc'], ['clang']]"], "compiler-missing"),
    (["CMake Error: No CMAKE_CXX_COMPILER could be found."], "compiler-missing"),
    (["gcc: error: src/x.c: No such file or directory"], None),  # a missing source, not a missing compiler
    (["ERROR: Could not install packages due to an OSError: HTTPSConnectionPool(host='pypi.org', port=443): "
      "Max retries exceeded (Caused by ProxyError('Unable to connect to proxy', OSError('Tunnel connection "
      "failed: 407 Proxy Authentication Required')))"], "proxy"),
    (["curl: (56) Received HTTP code 407 from proxy after CONNECT"], "proxy"),
    (["failed to copy: write /var/lib/docker/tmp/x: no space left on device"], "disk-space"),
    (["curl: (60) SSL certificate problem: unable to get local issuer certificate"], "certificate"),
    (["Err:1 http://deb.debian.org/debian bookworm InRelease", "  Temporary failure resolving 'deb.debian.org'"],
     "index-unreachable"),
    (["ERROR: No matching distribution found for nosuchpackage==1.0"], None),
])
def test_classify_other_tools_messages(lines, code):
    found = classify(lines)
    assert (found.code if found else None) == code


def test_a_proxy_that_wants_credentials_gets_a_hint_of_its_own():
    """issue 31: 6: a proxy failure's hint blamed the index URL; a 407 says what the proxy wants."""
    refused = classify(["WARNING: Retrying (Retry(total=0)) after connection broken by 'ProxyError('Cannot "
                        "connect to proxy.', NewConnectionError('...: [Errno 111] Connection refused'))': "
                        "/simple/six/"])
    assert refused is not None and refused.code == "proxy" and "did not answer" in refused.hint
    wants = classify(["OSError('Tunnel connection failed: 407 Proxy Authentication Required')"])
    assert wants is not None and wants.code == "proxy" and "http://USER:PASSWORD@HOST:PORT" in wants.hint


def test_short_error_drops_the_script_both_engines_quote():
    script = "/bin/sh -c set -eu; : imgbuild-step=pins; " + "x; " * 500
    assert short_error(f"executor failed running [{script}]: exit code: 1") == "exit code: 1"
    assert short_error(f'process "{script}" did not complete successfully: exit code: 137') == "exit code: 137"
    other = 'failed to compute cache key: "/app" not found'
    assert short_error(other) == other
    assert len(short_error("x" * 1000)) == 200


def test_a_failure_outside_any_step_shows_the_log_tail():
    """A base that cannot be pulled fails in BuildKit's own vertex: no recipe step, its error shown."""
    log = BuildLog()
    for line in ["#3 [internal] load metadata for docker.io/library/nosuch:1",
                 "#3 ERROR: pull access denied, repository does not exist or may require authorization",
                 "------", " > [internal] load metadata for docker.io/library/nosuch:1:", "------",
                 "failed to solve with frontend dockerfile.v0: failed to create LLB definition: pull access denied"]:
        log.feed(line)
    exc = build_failure(log, ["docker", "build"], 1, ca_cert=False)
    assert exc.message.startswith("build failed at step [internal] load metadata for docker.io/library/nosuch:1: "
                                  "pull access denied")
    assert exc.cause is None
    assert log.steps() == []


def test_cancelled_steps_are_not_the_failure():
    """BuildKit cancels the steps running beside the one that failed: the failure is the first real error."""
    log = BuildLog()
    for line in ["#5 [builder 2/3] RUN : imgbuild-step=wheels; make", "#6 [final 4/8] RUN : imgbuild-step=pins; pip",
                 "#6 0.5 boom", "#6 ERROR: process \"/bin/sh -c x\" did not complete successfully: exit code: 3",
                 "#5 ERROR: context canceled"]:
        log.feed(line)
    assert log.failure().name == "pins [final 4/8]"
    log = BuildLog()
    for line in ["#5 [builder 2/3] RUN : imgbuild-step=wheels; make", "#5 ERROR: context canceled",
                 "#6 [final 4/8] RUN : imgbuild-step=pins; pip", "#6 ERROR: executor failed running [x]: exit code: 3"]:
        log.feed(line)
    assert log.failure().name == "pins [final 4/8]"


@pytest.mark.parametrize("engine", ENGINES)
def test_plain_progress_names_the_failing_step_once_without_its_script(engine):
    """Off a terminal the step view printed the failing step's error with its whole script, then
    (buildx) BuildKit's summary of the failure: now the step and its exit code, and its error lines."""
    err = io.StringIO()
    view = StepView(err, "plain")
    for line in (FAILURES / f"{engine}-certificate-pip.log").read_text().splitlines():
        view.line(line)
    text = err.getvalue()
    assert "[final 6/8] cuda: ERROR exit code: 1" in text.splitlines()
    assert "/bin/sh -c" not in text and "failed to solve" not in text
    assert text.count("No matching distribution found for nvidia-cuda-runtime-cu12") == 1


def test_a_step_found_in_an_imported_cache_stays_cached():
    """buildx 0.13 with --cache-from type=registry: a step is CACHED, then its layers are fetched
    and extracted under the same vertex, which ends DONE (lines as printed in
    test_e2e_engines.py::test_registry_cache_survives_prune, layer digests shortened)."""
    log = BuildLog()
    for line in ["#12 [final 4/9] COPY [.imgbuild/empty, /etc/hosts]", "#12 CACHED",
                 "#13 [final 7/9] RUN set -eu; : imgbuild-step=ldconfig;     for d in /opt/venv/lib/python*/site-pa",
                 "#13 CACHED",
                 "#13 [final 7/9] RUN set -eu; : imgbuild-step=ldconfig;     for d in /opt/venv/lib/python*/site-pa",
                 "#13 sha256:09a28077aa4e 3.13kB / 3.13kB 0.1s done", "#13 DONE 0.7s",
                 "#13 [final 7/9] RUN set -eu; : imgbuild-step=ldconfig;     for d in /opt/venv/lib/python*/site-pa",
                 "#13 extracting sha256:93196c4b96be 1.3s done", "#13 DONE 2.0s",
                 "#14 [final 8/9] COPY [app/, /app]", "#14 DONE 0.2s"]:
        log.feed(line)
    assert log.steps() == [("12", "COPY", "cached"), ("13", "ldconfig", "cached"), ("14", "COPY", "done")]

