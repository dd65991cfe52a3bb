"""BuildKit's plain progress, read as it streams: which recipe step each vertex is, what each
printed, and, when the build fails, the step that failed, its own last lines and the known
cause, with a hint (certificate, proxy, index unreachable, no compiler, compiler error, hash
mismatch, disk).

Both engines print the same shape with ``--progress plain`` (tests/fixtures/buildkit/failures
holds real logs of each cause from Docker 20.10 and buildx 0.13)::

    #10 [final 6/8] RUN ... : imgbuild-step=cuda; ...   a vertex starts (repeated when its output resumes)
    #10 0.340 WARNING: Retrying ...                     its output: vertex, seconds, text
    #10 CACHED  |  #10 DONE 8.0s                        how it ended, or
    #10 ERROR: executor failed running [/bin/sh -c ...]: exit code: 1                   (20.10)
    #10 ERROR: process "/bin/sh -c ..." did not complete successfully: exit code: 1    (buildx)

and after a failure a summary that repeats the step with its whole script (and, from buildx, its
last lines and a Dockerfile excerpt). That summary is what made a failed build 8-14 KB of text:
it is left out of what the user is shown; the failing step is named once, with its own output.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass, field

from buildkit_py.engine.base import BuildResult
from buildkit_py.errors import BuildFailed, FailedStep

OUTPUT_LINES = 20  # of the failing step's output, shown in the error

_HEADER_RE = re.compile(r"^#(\d+) (.+)$")
_STEP_RE = re.compile(r"^\[([^\]]*?)\s*(\d+/\d+)\] (\S+)(.*)$")  # "[final 6/8] RUN ..." (stage may be empty)
_OUTPUT_RE = re.compile(r"^#(\d+) (\d+\.\d+)(?: (.*))?$")
_END_RE = re.compile(r"^#(\d+) (CACHED|CANCELED|DONE \d+(?:\.\d+)?s|ERROR:? ?(.*))$")
_MARK_RE = re.compile(r"imgbuild-step=([\w.-]+)")
_EXIT_RE = re.compile(r"exit code: (\d+)\s*$")
_CANCELLED = ("context canceled", "canceled")
_LINE_WIDTH = 400  # an output line longer than this (a compiler's command line) is cut in the error


@dataclass(frozen=True)
class Cause:
    """What a failed step's output says went wrong: ``code`` (certificate, proxy, index-unreachable,
    compiler-missing, compiler, hash-mismatch, hash-missing, disk-space), a clause for the message, the line that
    showed it, and the hint."""
    code: str
    summary: str
    evidence: str
    hint: str


@dataclass(frozen=True)
class StepError:
    """The vertex whose error ended the build."""
    vertex: str
    stage: str  # "[final 6/8]"; "" for BuildKit's own vertices ("[internal] load ...")
    step: str | None  # the recipe step id (imgbuild-step=...), None for a step without one
    instruction: str  # "RUN", "COPY", ... or the vertex's name for BuildKit's own
    error: str  # BuildKit's error, shortened to what is not the script ("exit code: 1")
    exit_code: int | None
    output: tuple[str, ...]  # its last OUTPUT_LINES output lines, without vertex and timestamp

    @property
    def name(self) -> str:
        """How the message names it: the recipe step id, else the instruction, with its place."""
        what = self.step or self.instruction
        return f"{what} {self.stage}" if self.stage else what


def short_error(message: str) -> str:
    """BuildKit's error for a step without the step's script, which it quotes whole:
    'executor failed running [/bin/sh -c ...]: exit code: 1' (20.10) and
    'process "/bin/sh -c ..." did not complete successfully: exit code: 1' (buildx) both
    become 'exit code: 1'; another message is kept, cut at 200 characters."""
    message = " ".join(message.split())
    if (m := _EXIT_RE.search(message)) and (message.startswith(("executor failed running", "process "))):
        return f"exit code: {m.group(1)}"
    return message if len(message) <= 200 else message[:197] + "..."


# --- causes ---------------------------------------------------------------------------------------

# Checked in this order, each against every output line of the failing step: a TLS failure also
# reads "Max retries exceeded" and "Could not fetch URL", so certificate comes before unreachable;
# a hash check is exact, so it comes first. Within a cause the patterns go from the most telling
# line to the least: the message quotes the last line that matched the first pattern that did.
_CAUSES: tuple[tuple[str, str, tuple[re.Pattern[str], ...]], ...] = (
    ("hash-mismatch", "a downloaded file's sha256 is not the one the lock file pins",
     (re.compile(r"Hash mismatch for|DO NOT MATCH THE HASHES|hash mismatch", re.I),)),
    ("hash-missing", "a package the step installs has no hash in the lock file",
     (re.compile(r"Hashes are required in --require-hashes mode|all requirements must have a hash|"
                 r"--require-hashes mode, all requirements must have their versions pinned", re.I),)),
    ("certificate", "the package index's TLS certificate is not trusted inside the build",
     (re.compile(r"CERTIFICATE_VERIFY_FAILED|certificate verify failed|invalid peer certificate|UnknownIssuer|"
                 r"SSL certificate problem|certificate signed by unknown authority|"
                 r"server certificate verification failed", re.I),)),
    ("disk-space", "the engine ran out of disk space", (re.compile(r"no space left on device", re.I),)),
    # A compiler that is not there at all (distutils: "[Errno 2] No such file or directory:
    # 'x86_64-linux-gnu-gcc'", older setuptools: "unable to execute 'gcc': No such file or
    # directory", a shell: "gcc: not found", meson, CMake) before one that ran and failed.
    ("compiler-missing", "a package was compiled from source, and the image has no C compiler",
     (re.compile(r"No such file or directory: '[^']*(?:gcc|g\+\+|cc|c\+\+|clang)'|"
                 r"(?:unable to execute|command) '[^']*(?:gcc|g\+\+|cc|c\+\+|clang)'(?::| failed:) "
                 r"No such file or directory|\b(?:[\w.-]+-)?(?:gcc|g\+\+|cc|c\+\+|clang): "
                 r"(?:No such file or directory|(?:command )?not found)|"
                 r"Unknown compiler\(s\)|No CMAKE_C(?:XX)?_COMPILER could be found", re.I),)),
    ("compiler", "compiling a package from source failed",
     (re.compile(r"\.(?:c|cc|cpp|cxx|cu|cuh|h|hpp)(?::\d+)+: (?:fatal )?error: |\bnvcc fatal\b", re.I),
      re.compile(r"error: command '[^']*(?:gcc|g\+\+|cc|c\+\+|clang|nvcc)[^']*' failed|"
                 r"ninja: build stopped: subcommand failed|unable to execute '[^']*(?:gcc|cc|nvcc)", re.I))),
    # pip says ProxyError (urllib3's "Cannot connect to proxy."), uv "tunnel error: failed to create
    # underlying connection" (the proxy's CONNECT tunnel), curl and apt "407 Proxy Authentication
    # Required": the same output also reads "Connection refused", so before unreachable.
    ("proxy", "the build's proxy could not be reached or refused the request",
     (re.compile(r"ProxyError|Cannot connect to proxy|407 Proxy Authentication Required|"
                 r"Proxy Authentication Required|proxy authorization required|Tunnel connection failed|"
                 r"Received HTTP code 40\d from proxy|unsuccessful tunnel|\btunnel error\b", re.I),)),
    ("index-unreachable", "the package index could not be reached from the build",
     (re.compile(r"Connection refused|Name or service not known|Temporary failure in name resolution|"
                 r"\bdns error\b|Network is unreachable|No route to host|Could not resolve host|"
                 r"Temporary failure resolving|timed out", re.I),
      re.compile(r"Failed to establish a new connection|NewConnectionError", re.I))),
)
_ANY_CAUSE = re.compile("|".join(p.pattern for _, _, ps in _CAUSES for p in ps), re.I)


def _hint(code: str, evidence: str, *, ca_cert: bool) -> str:
    if code == "certificate":
        if ca_cert:
            return ("the bundle given with --ca-cert does not hold the CA that signed the certificate the build "
                    "met (a proxy's, or a company CA's): pass the bundle that has it, e.g. the system one "
                    "(/etc/ssl/certs/ca-certificates.crt on Debian)")
        return ("builds reach the index through a proxy or a company CA the image does not trust: pass the CA "
                "bundle with --ca-cert FILE (or IMGBUILD_CA_CERT=FILE), e.g. --ca-cert "
                "/etc/ssl/certs/ca-certificates.crt; it reaches the steps as a BuildKit secret, never a layer")
    if code == "hash-mismatch":
        return ("the lock pins other files than the index serves now (a re-uploaded wheel, another index, or "
                "an edited lock): re-resolve with `imgbuild lock RECIPE` (or build with --update-lock) and "
                "review the change before committing it")
    if code == "hash-missing":
        return ("the lock does not cover a package this step installs (a dependency of a wheel built from "
                "source, or a lock older than the recipe): `imgbuild lock RECIPE` or build with --update-lock")
    if code == "disk-space":
        return ("free space in the engine's data root (docker system prune, docker builder prune) and build "
                "again; no image was tagged")
    if code == "compiler-missing":
        return ("a package without a wheel for this Python and platform was compiled from source in a stage "
                "whose image has no C compiler (gcc): pin a version that ships a wheel, list the package under "
                "build.from_source (compiled in a builder stage that installs build-essential), or add gcc "
                "and python3-dev to apt:")
    if code == "proxy":
        if re.search(r"\b407\b|Proxy Authentication Required|proxy authorization required", evidence, re.I):
            return ("the proxy wants credentials: put them in its URL, http://USER:PASSWORD@HOST:PORT, in "
                    "--pip-config's proxy (or HTTPS_PROXY), and pass the file with --pip-config")
        return ("RUN steps reach the index through a proxy (--pip-config's proxy, or HTTPS_PROXY), and that proxy "
                "did not answer: check its host and port, that it runs, and that the build's network reaches it "
                "(--network host, the default, uses the host's); the index URL is not the problem")
    if code == "compiler":
        if "Python.h" in evidence:
            return ("the Python headers are missing: add python3-dev (python3.Y-dev) to apt:, or pin a version "
                    "of the package that ships a wheel for this Python and platform")
        return ("a package without a wheel for this Python and platform was compiled from source and the "
                "compiler failed: pin a version that ships a wheel, or compile it in the builder stage "
                "(build.from_source) where the devel image has the toolchain")
    return ("RUN steps could not reach the package index: check its URL (--pip-config, PIP_INDEX_URL), that "
            "this machine reaches it, and the build's network (--network host, the default, uses the host's)")


def classify(lines: list[str] | tuple[str, ...], *, ca_cert: bool = False) -> Cause | None:
    """The known cause of a failure, from a step's output lines (or a log tail); None when none
    is recognised. ``ca_cert``: the build was given a CA bundle (changes the certificate hint)."""
    for code, summary, patterns in _CAUSES:
        for pattern in patterns:
            # The last line that shows it: a compiler's first errors can be a configure probe's.
            found = [(ln, m) for ln in lines if (m := pattern.search(ln))]
            if found:
                evidence = _around(*found[-1])
                return Cause(code, summary, evidence, _hint(code, evidence, ca_cert=ca_cert))
    return None


def _around(line: str, match: re.Match[str], width: int = 160) -> str:
    """The part of ``line`` from a little before ``match`` (at a word's start), at most about
    ``width`` characters: pip's retry warnings put the cause 150 characters into a line."""
    line = line.strip()
    if len(line) <= width:
        return line
    at = line.find(match.group(0))
    start = 0 if at <= 40 else line.find(" ", at - 40, at) + 1 or at
    end = start + width
    return ("..." if start else "") + line[start:end] + ("..." if end < len(line) else "")


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


# --- the stream -----------------------------------------------------------------------------------


@dataclass
class _Vertex:
    header: str
    stage: str = ""
    step: str | None = None
    instruction: str = ""
    output: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=OUTPUT_LINES))
    causes: list[str] = field(default_factory=list)  # every output line a cause pattern matched
    state: str = "running"  # running | cached | done | canceled | error
    error: str = ""


class BuildLog:
    """Fed every line of a build's plain progress (``feed``); afterwards says which steps ran or
    were cached and, for a failed build, which step failed (``failure``) and why (``cause``).
    Keeps only the last OUTPUT_LINES lines of each vertex, the lines that matched a cause, and
    the last ``tail`` lines of the whole log."""

    def __init__(self, tail: int = 40):
        self.vertices: dict[str, _Vertex] = {}
        self.tail: collections.deque[str] = collections.deque(maxlen=tail)
        self._failed: str | None = None

    def feed(self, line: str) -> None:
        self.tail.append(line)
        if m := _OUTPUT_RE.match(line):
            vertex = self.vertices.get(m.group(1))
            if vertex is not None:
                text = m.group(3) or ""
                vertex.output.append(text)
                if _ANY_CAUSE.search(text):
                    vertex.causes.append(text)
            return
        if m := _END_RE.match(line):
            vertex = self.vertices.get(m.group(1))
            if vertex is None:
                return
            word = m.group(2).split()[0].rstrip(":")
            if vertex.state == "cached":
                return  # BuildKit may report a step found in an imported cache again as DONE
            vertex.state = {"CACHED": "cached", "CANCELED": "canceled", "DONE": "done"}.get(word, "error")
            if vertex.state == "error":
                vertex.error = (m.group(3) or "").strip()
                if self._failed is None and vertex.error not in _CANCELLED:
                    self._failed = m.group(1)
            return
        if (m := _HEADER_RE.match(line)) and m.group(1) not in self.vertices:
            self.vertices[m.group(1)] = self._vertex(m.group(2))

    @staticmethod
    def _vertex(header: str) -> _Vertex:
        if m := _STEP_RE.match(header):
            stage = f"[{m.group(1)} {m.group(2)}]".replace("[ ", "[")
            mark = _MARK_RE.search(m.group(4))
            return _Vertex(header, stage=stage, step=mark.group(1) if mark else None, instruction=m.group(3))
        return _Vertex(header, instruction=_cut(header, 120))

    def steps(self) -> list[tuple[str, str, str]]:
        """(vertex, name, state) of each Dockerfile step but FROM, in vertex order; the name is
        the recipe step id where the step has one, else its instruction."""
        return [(number, v.step or v.instruction, v.state)
                for number, v in sorted(self.vertices.items(), key=lambda kv: int(kv[0]))
                if v.stage and v.instruction != "FROM"]

    def failure(self) -> StepError | None:
        """The step whose error ended the build (not the ones BuildKit cancelled because of it)."""
        if self._failed is None:
            return None
        v = self.vertices[self._failed]
        exit_code = _EXIT_RE.search(v.error)
        return StepError(self._failed, v.stage, v.step, v.instruction, short_error(v.error),
                          int(exit_code.group(1)) if exit_code else None,
                          tuple(_cut(line, _LINE_WIDTH) for line in v.output))

    def cause(self, *, ca_cert: bool = False) -> Cause | None:
        """The known cause: from the failing step's output (every line that matched a pattern,
        so a cause printed long before its last 20 lines counts), else from the log's tail."""
        if self._failed is not None:
            v = self.vertices[self._failed]
            found = classify(v.causes + [v.error], ca_cert=ca_cert)
            if found is not None:
                return found
        return classify(list(self.tail), ca_cert=ca_cert)


def build_failure(log: BuildLog, command: list[str], code: int, *, ca_cert: bool) -> BuildFailed:
    """The error for a failed build: the step that failed, named once, with its own last lines
    and the known cause's hint; the log's last lines when no step failed (a Dockerfile the
    frontend refused, a base that cannot be pulled)."""
    failed, cause = log.failure(), log.cause(ca_cert=ca_cert)
    tail = "\n".join(log.tail)
    if failed is None:
        message = "build failed" + (f": {cause.summary}" if cause else f" (exit {code})")
        return BuildFailed(message, command=command, returncode=code, log_tail=tail,
                           hint=cause.hint if cause else None, cause=cause.code if cause else None)
    message = f"build failed at step {failed.name}: {failed.error}"
    if cause is not None:
        message += f"; {cause.summary} ({cause.evidence})"
    return BuildFailed(message, command=command, returncode=code, log_tail=tail,
                       hint=cause.hint if cause else "--progress plain prints every line of the build",
                       step=FailedStep(failed.name, failed.exit_code, failed.output),
                       cause=cause.code if cause else None)


def build_result(log: BuildLog, *, image_id: str, tags: tuple[str, ...], seconds: float,
                 digest: str | None = None) -> BuildResult:
    """What a build that passed did, from its log: the steps that ran and those from the cache."""
    steps = log.steps()
    rerun = tuple(name for _, name, state in steps if state != "cached")
    return BuildResult(image_id=image_id, tags=tags, log_tail="\n".join(log.tail), cached_steps=len(steps) - len(rerun),
                       run_steps=len(rerun), rerun=rerun, seconds=seconds, digest=digest)
