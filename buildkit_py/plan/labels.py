"""The contract stamped on every image: io.imgbuild.* and org.opencontainers.image.* labels.

Static labels go into the Dockerfile; volatile ones (created time, git revision) are passed
at build time so they never break the layer cache.
"""

from __future__ import annotations

import datetime as _dt
import json
import subprocess
from pathlib import Path

from buildkit_py.compat.resolve import Resolution
from buildkit_py.plan.installer import installer_for
from buildkit_py.recipe.model import Recipe

PREFIX = "io.imgbuild."
CUDA_VERSION = PREFIX + "cuda.version"
CUDA_FLAVOR = PREFIX + "cuda.flavor"
CUDA_SOURCE = PREFIX + "cuda.source"
DRIVER_MIN = PREFIX + "cuda.driver.min"
DRIVER_MIN_COMPAT = PREFIX + "cuda.driver.min-compat"
CUDNN_VERSION = PREFIX + "cudnn.version"
TORCH_VERSION = PREFIX + "torch.version"
PYTHON_VERSION = PREFIX + "python.version"
INSTALLER = PREFIX + "installer"  # what installed the Python packages: "uv 0.13.9" or "pip"
OS = PREFIX + "os"  # lets an image built on this one know its OS without pulling it
CUDA_ARCH = PREFIX + "cuda.arch"
RECIPE_DIGEST = PREFIX + "recipe.digest"
WEIGHTS = PREFIX + "weights"

OCI = "org.opencontainers.image."


def static_labels(recipe: Recipe, res: Resolution) -> dict[str, str]:
    labels: dict[str, str] = dict(recipe.labels)
    labels.update({
        CUDA_VERSION: res.cuda_version,
        CUDA_FLAVOR: res.cuda_flavor,
        CUDA_SOURCE: res.cuda_source,
        PYTHON_VERSION: res.python,
        INSTALLER: installer_for(recipe.build.installer).label,
        RECIPE_DIGEST: recipe.digest,
        OCI + "title": recipe.name,
        # Always set: otherwise the base's own value (Ubuntu stamps its release) shows through.
        # The tag's version: with no `version:` the image is tagged :latest (README).
        OCI + "version": recipe.version or "latest",
        OCI + "base.name": res.base_image.split("@", 1)[0],
    })
    if res.os:
        labels[OS] = res.os
    if res.base_digest:
        labels[OCI + "base.digest"] = res.base_digest
    if res.min_driver:  # never stamped where NVIDIA publishes no native floor (CUDA 13.3-13.5)
        labels[DRIVER_MIN] = res.min_driver
    if res.min_driver_compat:
        labels[DRIVER_MIN_COMPAT] = res.min_driver_compat
    if res.cudnn:
        labels[CUDNN_VERSION] = res.cudnn
    if res.torch_label:
        labels[TORCH_VERSION] = res.torch_label
    if res.cuda_arch:
        labels[CUDA_ARCH] = ";".join(res.cuda_arch)
    if recipe.weights:
        # JSON, so a reader needs no parsing rules of ours: [{"mount": ..., "ref": ...}]
        labels[WEIGHTS] = json.dumps([{"mount": w.mount, "ref": w.ref} for w in recipe.weights],
                                     separators=(",", ":"))
    return dict(sorted(labels.items()))


def volatile_labels(recipe: Recipe, *, now: _dt.datetime | None = None,
                    base_digest: str | None = None) -> dict[str, str]:
    now = now or _dt.datetime.now(_dt.timezone.utc)
    labels = {OCI + "created": now.replace(microsecond=0).isoformat().replace("+00:00", "Z")}
    revision, source = git_facts(recipe.context_dir)
    if revision:
        labels[OCI + "revision"] = revision
    if source:
        labels[OCI + "source"] = source
    if base_digest:
        labels[OCI + "base.digest"] = base_digest
    return labels


def git_facts(folder: Path) -> tuple[str | None, str | None]:
    """(HEAD commit, origin URL) of the repository holding the recipe, where there is one.

    The commit ends in "-dirty" when tracked files differ from it (as `git describe --dirty`
    says): the image was then built from something no commit holds."""

    def git(*args: str) -> str | None:
        """stdout of a git command ("" when it printed nothing), None when it failed."""
        try:
            # --no-optional-locks: reading must not rewrite the user's index
            out = subprocess.run(["git", "--no-optional-locks", "-C", str(folder), *args], capture_output=True,  # noqa: PLW1510
                                 text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    revision = git("rev-parse", "HEAD") or None
    if revision:
        # Untracked files are left out, as git describe --dirty leaves them out; a tree whose
        # state cannot be read is not claimed clean.
        if git("status", "--porcelain", "--untracked-files=no") != "":
            revision += "-dirty"
    source = git("remote", "get-url", "origin") or None
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
