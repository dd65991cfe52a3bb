"""The contract stamped on every image: io.imgbuild.* and org.opencontainers.image.* labels
(their names are in buildkit_py/label_keys.py).

Static labels go into the Dockerfile; volatile ones (created time, git revision) are passed
at build time so they never break the layer cache.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from buildkit_py.compat.floors import floor_labels
from buildkit_py.compat.gpu_fit import gpu_spec
from buildkit_py.compat.resolve import Resolution
from buildkit_py.errors import UsageError
from buildkit_py.label_keys import (
    CUDA_ARCH,
    CUDA_FLAVOR,
    CUDA_SOURCE,
    CUDA_VERSION,
    CUDNN_VERSION,
    GPUS,
    INSTALLER,
    OCI_BASE_DIGEST,
    OCI_BASE_NAME,
    OCI_CREATED,
    OCI_REVISION,
    OCI_SOURCE,
    OCI_TITLE,
    OCI_VERSION,
    OS,
    PYTHON_VERSION,
    RECIPE_DIGEST,
    TORCH_VERSION,
    WEIGHTS,
)
from buildkit_py.plan.installer import installer_for
from buildkit_py.recipe.model import Recipe


def static_labels(recipe: Recipe, res: Resolution) -> dict[str, str]:
    labels: dict[str, str] = dict(recipe.labels)
    labels.update({
        CUDA_VERSION: res.cuda_version,
        CUDA_FLAVOR: res.cuda_flavor,
        CUDA_SOURCE: res.cuda_source,
        PYTHON_VERSION: res.python,
        INSTALLER: installer_for(recipe.build.installer).label,
        RECIPE_DIGEST: recipe.digest,
        OCI_TITLE: recipe.name,
        # Always set: otherwise the base's own value (Ubuntu stamps its release) shows through.
        # The tag's version: with no `version:` the image is tagged :latest (README).
        OCI_VERSION: recipe.version or "latest",
        OCI_BASE_NAME: res.base_image.split("@", 1)[0],
    })
    if res.os:
        labels[OS] = res.os
    if res.base_digest:
        labels[OCI_BASE_DIGEST] = res.base_digest
    # the mapping `imgbuild check` reads back (compat.floors): no native floor where NVIDIA publishes none
    labels.update(floor_labels(res.driver_floor))
    if res.cudnn:
        labels[CUDNN_VERSION] = res.cudnn
    if res.torch_label:
        labels[TORCH_VERSION] = res.torch_label
    if res.compiled_arch:  # what was compiled, not what was asked: flash-attn compiles its own list
        labels[CUDA_ARCH] = ";".join(res.compiled_arch)
    if recipe.gpus:  # resolve checked each name; as NVIDIA's list spells it, in the recipe's order
        labels[GPUS] = ";".join(gpu_spec(g).name for g in recipe.gpus)
    if recipe.weights:
        # JSON, so a reader needs no parsing rules of ours: [{"mount": ..., "ref": ...}]
        labels[WEIGHTS] = json.dumps([{"mount": w.mount, "ref": w.ref} for w in recipe.weights],
                                     separators=(",", ":"))
    return dict(sorted(labels.items()))


def volatile_labels(recipe: Recipe, *, now: _dt.datetime | None = None,
                    base_digest: str | None = None) -> dict[str, str]:
    """The labels passed at build time, not written into the Dockerfile. ``created`` is not the
    clock's: a rebuild with nothing changed must give the same image (and digest), so it is when
    the recipe's inputs last changed (``created_time``); ``now`` overrides it."""
    when = now or created_time(recipe)
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


def created_time(recipe: Recipe, environ: Mapping[str, str] | None = None) -> _dt.datetime:
    """When the image counts as created, as reproducible builds date their output
    (reproducible-builds.org/specs/source-date-epoch):

    1. ``SOURCE_DATE_EPOCH`` (seconds since 1970) when it is set;
    2. in a git repository where the build's inputs (the recipe, its lock file, the ``copy:``
       sources) are all committed, unchanged, the commit time of the last commit that touched
       them (a README edited beside the recipe does not move it);
    3. otherwise (changes not committed yet, or no repository) the newest modification time of
       those files: the same for a rebuild of the same files, later once one is edited. Not the
       clock: then every rebuild of an unchanged recipe would get a new digest. Not the recipe's
       digest: it is no time, and the label must be one.
    """
    environ = os.environ if environ is None else environ
    raw = environ.get("SOURCE_DATE_EPOCH")
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
    from buildkit_py.plan.lock import lock_path  # noqa: PLC0415 - lock imports the plan, which imports this

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


def weights_from_labels(labels: dict[str, str]) -> list[tuple[str, str]]:
    """(ref, mount) pairs an image expects on volumes, from its io.imgbuild.weights label."""
    raw = labels.get(WEIGHTS)
    if not raw:
        return []
    try:
        return [(w["ref"], w["mount"]) for w in json.loads(raw)]
    except (ValueError, KeyError, TypeError):
        return []
