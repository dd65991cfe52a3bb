"""The facts of a build's sources that only the machine knows: git's commit and remote, the
files' modification times. They date and attribute the image (org.opencontainers.image.created,
.revision, .source, passed at build time: plan/labels.py has the static labels); read here, in the
pipeline, so the plan layer below stays a function of the recipe."""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import subprocess
from pathlib import Path

from buildkit_py.errors import UsageError
from buildkit_py.label_keys import OCI_BASE_DIGEST, OCI_CREATED, OCI_REVISION, OCI_SOURCE
from buildkit_py.plan.lock import lock_path
from buildkit_py.recipe.model import Recipe


def volatile_labels(recipe: Recipe, *, source_date_epoch: str | None, now: _dt.datetime | None = None,
                    base_digest: str | None = None) -> dict[str, str]:
    """The labels passed at build time, not written into the Dockerfile. ``created`` is not the
    clock's: a rebuild with nothing changed must give the same image (and digest), so it is when
    the recipe's inputs last changed (``created_time``); ``now`` overrides it."""
    when = now or created_time(recipe, source_date_epoch)
    labels = {OCI_CREATED: when.astimezone(_dt.timezone.utc).replace(microsecond=0).isoformat()
              .replace("+00:00", "Z")}
    revision, source = git_facts(recipe.context_dir)
    if revision:
        labels[OCI_REVISION] = revision
    if source:
        labels[OCI_SOURCE] = source
    if base_digest:
        labels[OCI_BASE_DIGEST] = base_digest
    return labels


def created_time(recipe: Recipe, source_date_epoch: str | None) -> _dt.datetime:
    """When the image counts as created, as reproducible builds date their output
    (reproducible-builds.org/specs/source-date-epoch):

    1. ``source_date_epoch`` (seconds since 1970; the CLI passes ``$SOURCE_DATE_EPOCH``) when set;
    2. in a git repository where the build's inputs (the recipe, its lock file, the ``copy:``
       sources) are all committed, unchanged, the commit time of the last commit that touched
       them (a README edited beside the recipe does not move it);
    3. otherwise (changes not committed yet, or no repository) the newest modification time of
       those files: the same for a rebuild of the same files, later once one is edited. Not the
       clock: then every rebuild of an unchanged recipe would get a new digest. Not the recipe's
       digest: it is no time, and the label must be one.
    """
    raw = source_date_epoch
    if raw is not None and raw.strip() != "":
        if not raw.strip().isdigit():
            raise UsageError(f"SOURCE_DATE_EPOCH={raw!r}: not a whole number of seconds since 1970-01-01 UTC",
                             hint="e.g. SOURCE_DATE_EPOCH=$(git log -1 --format=%ct), or unset it")
        return _dt.datetime.fromtimestamp(int(raw), _dt.timezone.utc)
    inputs = build_inputs(recipe)
    folder = recipe.context_dir
    paths = [str(p.relative_to(folder)) for p in inputs]
    # An untracked input counts as a change here: no commit holds it.
    if _git(folder, "status", "--porcelain", "--untracked-files=all", "--", *paths) == "":
        committed = _git(folder, "log", "-1", "--format=%ct", "--", *paths)
        if committed:
            return _dt.datetime.fromtimestamp(int(committed), _dt.timezone.utc)
    newest = max((_newest_mtime(p) for p in inputs), default=0.0)
    return _dt.datetime.fromtimestamp(int(newest), _dt.timezone.utc)


def build_inputs(recipe: Recipe) -> list[Path]:
    """The files in the recipe's folder a build reads: the recipe, its lock file where there is
    one, and each ``copy:`` source (a folder counts as every file under it)."""
    folder = recipe.context_dir
    found = [recipe.path, lock_path(recipe.path)] + [folder / c.src for c in recipe.copy]
    return [p for p in found if p.exists() or p.is_symlink()]


def _newest_mtime(path: Path) -> float:
    newest = path.lstat().st_mtime
    if path.is_dir() and not path.is_symlink():
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                with contextlib.suppress(OSError):
                    newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
    return newest


def _git(folder: Path, *args: str) -> str | None:
    """stdout of a git command in ``folder`` ("" when it printed nothing), None when it failed
    (no git, no repository)."""
    try:
        # --no-optional-locks: reading must not rewrite the user's index
        out = subprocess.run(["git", "--no-optional-locks", "-C", str(folder), *args], capture_output=True,  # noqa: PLW1510
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_facts(folder: Path) -> tuple[str | None, str | None]:
    """(HEAD commit, origin URL) of the repository holding the recipe, where there is one.

    The commit ends in "-dirty" when tracked files differ from it (as `git describe --dirty`
    says): the image was then built from something no commit holds."""
    revision = _git(folder, "rev-parse", "HEAD") or None
    if revision:
        # Untracked files are left out, as git describe --dirty leaves them out; a tree whose
        # state cannot be read is not claimed clean.
        if _git(folder, "status", "--porcelain", "--untracked-files=no") != "":
            revision += "-dirty"
    source = _git(folder, "remote", "get-url", "origin") or None
    if source and "@" in source.split("//")[-1].split("/")[0]:
        source = None  # never stamp credentials embedded in a remote URL
    return revision, source
