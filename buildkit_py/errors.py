"""Typed errors raised by the library. Only ``cli`` turns them into messages and exit codes."""

from __future__ import annotations

import enum
from typing import Any, NamedTuple


class ExitStatus(enum.IntEnum):
    OK = 0
    FAILED = 1  # build, push or check failed
    BAD_INPUT = 2  # bad recipe or usage
    ENVIRONMENT = 3  # no engine, no BuildKit-capable client, registry unreachable


class ImgbuildError(Exception):
    """Base class. ``exit_status`` decides the process exit code."""

    exit_status = ExitStatus.FAILED

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def render(self) -> str:
        text = self.message
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text

    def to_json(self) -> dict[str, Any]:
        out = {"error": type(self).__name__, "message": self.message}
        if self.hint:
            out["hint"] = self.hint
        return out


class UsageError(ImgbuildError):
    exit_status = ExitStatus.BAD_INPUT


class PipConfigError(UsageError):
    """A pip configuration file pip itself would refuse (compat/pip_config.py), at its line, or
    one that cannot be read: bad input whether --pip-config named it or pip's own places hold it."""


class RecipeIssue(NamedTuple):
    """One problem in a recipe file, located by line and key path. (A NamedTuple, not a frozen
    dataclass: every command imports this module, and dataclasses costs ~7 ms of start-up.)"""

    file: str
    line: int | None
    key: str
    message: str

    def render(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        key = f" {self.key}:" if self.key else ""
        return f"{where}:{key} {self.message}"


class _FileIssues(ImgbuildError):
    """An input file that breaks its schema or rules: every issue, each as `file:line: key: message`."""

    exit_status = ExitStatus.BAD_INPUT

    def __init__(self, issues: list[RecipeIssue], *, hint: str | None = None):
        self.issues = list(issues)
        super().__init__("\n".join(i.render() for i in self.issues), hint=hint)

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out["issues"] = [
            {"file": i.file, "line": i.line, "key": i.key, "message": i.message} for i in self.issues
        ]
        return out


class RecipeError(_FileIssues):
    """A recipe that cannot be loaded. Carries every issue found, not just the first."""


class BaseImageNotFound(RecipeError):
    """The recipe's base (``base.image``, or the nvidia/cuda tag under ``base.mirror``) is not in its
    registry: no such repository or tag. Located at that key (exit 2: the recipe names it)."""


class RecipeLocation(NamedTuple):
    """Where in a recipe file an error points: the file, the line, the key path."""

    file: str | None
    line: int | None = None
    key: str | None = None


class CompatibilityError(ImgbuildError):
    """Two pinned components that cannot work together; ``at`` says where the recipe pins them."""

    exit_status = ExitStatus.BAD_INPUT

    def __init__(
        self,
        component: str,
        version: str,
        other: str,
        other_version: str,
        reason: str,
        *,
        hint: str | None = None,
        at: RecipeLocation | None = None,
        partial: bool = False,
    ):
        self.partial = partial  # the refusal rests on data that is known to be incomplete: "unknown", not "no"
        self.component, self.version = component, version
        self.other, self.other_version = other, other_version
        self.reason = reason
        file, line, key = at or RecipeLocation(None)
        self.file, self.line, self.key = file, line, key
        where = ""
        if file:
            where = f"{file}:{line}: {key}: " if line else f"{file}: "
        super().__init__(f"{where}{component} {version} conflicts with {other} {other_version}: {reason}", hint=hint)

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out.update(
            component=self.component,
            version=self.version,
            other=self.other,
            other_version=self.other_version,
            file=self.file,
            line=self.line,
            key=self.key,
            partial=self.partial,
        )
        return out


class CompatibilityErrors(CompatibilityError):
    """Several compatibility problems found in one pass (the README promises every problem at once):
    the fields of the first, so callers that read one error keep working; ``errors`` holds them all."""

    def __init__(self, errors: list[CompatibilityError]):
        first = errors[0]
        super().__init__(first.component, first.version, first.other, first.other_version, first.reason,
                         hint=first.hint, at=RecipeLocation(first.file, first.line, first.key), partial=first.partial)
        self.errors = list(errors)
        self.message = "\n".join(e.message for e in self.errors)
        self.args = (self.message,)

    def render(self) -> str:
        return "\n".join(e.render() for e in self.errors)

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out["errors"] = [e.to_json() for e in self.errors]
        return out


class CompatDataError(ImgbuildError):
    """A compatibility data file broke one of its invariants (a bug in the shipped data)."""

    exit_status = ExitStatus.FAILED


class EnvironmentProblem(ImgbuildError):
    """Something outside imgbuild is missing: engine, BuildKit client, registry."""

    exit_status = ExitStatus.ENVIRONMENT


class PackageIndexError(EnvironmentProblem):
    """The Python package index could not answer: unreachable, an HTTP error, a malformed page or
    METADATA (compat data refresh and plan-time look-ups of releases newer than the shipped data)."""


class EngineCapabilityError(ImgbuildError):
    """The plan needs something the chosen engine cannot do."""

    exit_status = ExitStatus.ENVIRONMENT


class FailedStep(NamedTuple):
    """The step a build failed at, as its error shows it: ``name`` (the recipe step id and its
    place, "pins [final 7/8]"), the exit code of its command, its last lines of output."""

    name: str
    exit_code: int | None
    output: tuple[str, ...]


class BuildFailed(ImgbuildError):
    """A build that failed. Where the log names the step that failed (``step``), the message shows
    that step once with its own last lines, and ``cause`` names a known cause (certificate, proxy,
    index-unreachable, compiler-missing, compiler, hash-mismatch, hash-missing, disk-space) whose hint says what
    to do; otherwise the message ends with the last lines of the log."""

    exit_status = ExitStatus.FAILED

    def __init__(self, message: str, *, command: list[str] | None = None, returncode: int | None = None,
                 log_tail: str = "", hint: str | None = None, step: FailedStep | None = None,
                 cause: str | None = None):
        self.command = command or []
        self.returncode = returncode
        self.log_tail = log_tail
        self.step, self.cause = step, cause
        text = message
        if step is not None and step.output:
            text += f"\n--- last {len(step.output)} lines of {step.name} ---\n" + "\n".join(step.output)
        elif log_tail:
            text += "\n--- last lines of the build log ---\n" + log_tail.rstrip()
        super().__init__(text, hint=hint)

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out["cause"] = self.cause
        out["step"] = None if self.step is None else {
            "name": self.step.name, "exit_code": self.step.exit_code, "output": list(self.step.output)}
        return out


class BudgetExceeded(ImgbuildError):
    exit_status = ExitStatus.FAILED


class ImageTestFailed(ImgbuildError):
    """Tests run in a built image failed (the recipe's ``test:`` commands, its labels checked
    against its content, the imports of its pins). ``failures`` holds one record per failed test
    (name, command, exit code, output: each output once, in the message); ``kept_as`` names the
    REPO:rejected tag a build keeps the image under (None for `imgbuild test`, which tags nothing);
    ``reports`` the test reports of a build's platforms up to the one that failed (its summary shows
    them), both set when it is raised."""

    exit_status = ExitStatus.FAILED

    def __init__(self, message: str, *, failures: list[dict[str, Any]], kept_as: str | None = None,
                 hint: str | None = None, reports: tuple[Any, ...] = ()):
        self.failures, self.kept_as, self.reports = list(failures), kept_as, tuple(reports)
        super().__init__(message, hint=hint)

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out.update(failures=self.failures, kept_as=self.kept_as)
        return out


class RegistryError(ImgbuildError):
    exit_status = ExitStatus.FAILED


class RegistryUnreachable(EnvironmentProblem):
    pass


class NotARegistry(RegistryUnreachable):
    """The address answered HTTP, but not as a registry: a web page (HTML, no
    Docker-Distribution-API-Version header) from a web server, a login portal or a proxy in
    front of it. Exit 3, as no registry is reachable there; the page itself is never shown."""


class AuthenticationError(EnvironmentProblem):
    """Bad or missing registry credentials (exit 3: fix the environment, not the recipe)."""


class WeightsError(ImgbuildError):
    exit_status = ExitStatus.FAILED


class DigestMismatch(WeightsError):
    received_bytes: int = 0  # set by downloads: what crossed the network before the check failed


class DriverCheckError(ImgbuildError):
    """The host driver could not be read (nvidia-smi missing or failing)."""

    exit_status = ExitStatus.ENVIRONMENT


class CredentialHelperError(AuthenticationError):
    """A docker credential helper (credsStore / credHelpers) is missing or failed."""


class UnsafePath(WeightsError):
    """An artifact names a file path that would land outside the target directory."""

    exit_status = ExitStatus.BAD_INPUT


class WouldReplaceFiles(WeightsError):
    """A pull would replace files of other content in its folder (a user's file of the same name,
    another version of the weights): nothing is downloaded; ``paths`` names them (exit 2: run it
    again with --force, or into another folder)."""

    exit_status = ExitStatus.BAD_INPUT

    def __init__(self, message: str, *, paths: list[str], hint: str | None = None):
        self.paths = list(paths)
        super().__init__(message, hint=hint)

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out["paths"] = self.paths
        return out


class FolderNotWritable(EnvironmentProblem):
    """A folder imgbuild must write into refuses it (permissions, a read-only file system, no space
    left): ``path`` names the folder, the message the system's reason and the file (exit 3)."""

    def __init__(self, message: str, *, path: str, hint: str | None = None):
        self.path = path
        super().__init__(message, hint=hint)

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out["path"] = self.path
        return out


class ManifestNotFound(RegistryError):
    """The registry has no manifest (tag or digest) for the reference."""


class InspectError(ImgbuildError):
    """An image could not be read back from the engine, or its stream did not match its config."""

    exit_status = ExitStatus.FAILED


class ImageFactsUnreadable(InspectError):
    """The image's own python could not report what the image holds (none on its PATH: exit 127,
    or one that fails): ``exit_code`` and ``output`` are the container's. Where the image is
    under test, a failed test of the image, not an error of imgbuild's (analysis/image_checks.py)."""

    def __init__(self, message: str, *, exit_code: int, output: str, hint: str | None = None):
        self.exit_code, self.output = exit_code, output
        super().__init__(message, hint=hint)


class ImageMissing(InspectError):
    """The engine has no image under the reference asked for."""

    exit_status = ExitStatus.BAD_INPUT


class SbomError(ImgbuildError):
    """An SBOM could not be made, attached or found (none attached, an unreadable layer)."""

    exit_status = ExitStatus.FAILED


class SignatureError(ImgbuildError):
    """An image's signature is missing or does not verify under the key given (``imgbuild verify``,
    a recipe's ``base.verify``), or a signature could not be written."""

    exit_status = ExitStatus.FAILED


class SizeBudgetExceeded(BudgetExceeded):
    """The image is over ``budget.max_size``; ``groups`` is the breakdown by layer group (bytes)."""

    def __init__(self, message: str, *, size: int, max_size: int, groups: dict[str, int], hint: str | None = None):
        self.size, self.max_size, self.groups = size, max_size, dict(groups)
        super().__init__(message, hint=hint)

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out.update(size=self.size, max_size=self.max_size, groups=self.groups)
        return out


class LockError(ImgbuildError):
    """A lock file that cannot be read, or pins that cannot be resolved into one."""

    exit_status = ExitStatus.FAILED


class LockFileError(_FileIssues, LockError):
    """A lock file that breaks its schema (lock.schema.json): every issue located (exit 2)."""


class _LockChanges(LockError):
    def __init__(self, message: str, *, changes: list[str], path: str | None = None, hint: str | None = None):
        self.changes, self.path = list(changes), path
        super().__init__(message, hint=hint)

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out.update(changes=self.changes, lock=self.path)
        return out


class LockStale(_LockChanges):
    """The recipe changed since its lock was written; ``changes`` names what (exit 2)."""

    exit_status = ExitStatus.BAD_INPUT


class LockDrift(_LockChanges):
    """``--locked``: the lock is missing, stale, or a fresh resolve would change it (exit 1)."""

    exit_status = ExitStatus.FAILED


class Interrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C) or SIGTERM (`kill`, a CI job cancelled), raised in the main thread by the
    CLI's handlers (cli/main.py) so that the same unwinding runs for both: children stopped
    (engine/children.py), temporary files removed by their ``with`` blocks. A KeyboardInterrupt,
    so every ``except KeyboardInterrupt`` already in the library handles SIGTERM too. ``stopped``
    names what was stopped on the way out, for the one line the CLI prints."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.stopped: list[str] = []
