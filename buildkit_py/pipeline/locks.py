"""Locking with the outside world: a base image's pin read from its registry, else from the
local engine, and pip run to resolve the pins. plan/lock.py does the rest with the pinner and the
resolver passed in, so the plan layer never talks to a registry, an engine or pip itself."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buildkit_py import oci
from buildkit_py.errors import ImgbuildError, LockError
from buildkit_py.plan.build_plan import BuildPlan
from buildkit_py.plan.lock import (
    DEFAULT_VARIANT,
    ImageStore,
    LockMode,
    LockUse,
    PipReport,
    Target,
    local_image,
    variant_notes,
)
from buildkit_py.plan.lock import lock_recipe as _lock_recipe
from buildkit_py.plan.lock import use_lock as _use_lock
from buildkit_py.plan.lock_model import LockedBase, LockFile, VariantLock


def pin_base(ref: str, *, engine: ImageStore | None = None) -> LockedBase:
    """``{ref, digest}`` from the registry (the manifest or index digest a FROM can name); where
    the registry does not answer, the local engine's image, pinned by its image id, which the
    lock records and checks, saying that other machines cannot reproduce it.

    The engine's RepoDigests are not taken for a registry digest: on the containerd image store
    an imported image carries a digest of its own manifest that no registry holds, and a
    ``FROM ref@sha256:...`` with it fails at build time (BuildKit asks the registry for it). Only
    the registry can confirm a digest."""
    try:
        _, digest, _ = oci.fetch_manifest(ref, client=oci.Client(max_retries=1, timeout=(5.0, 30.0)))
        return LockedBase(ref, digest)
    except ImgbuildError:  # unreachable, refusing or unknown to its registry: ask the engine
        pass
    local = local_image(engine, ref)
    if local is not None:
        return LockedBase(ref, None, local.id,
                          "its registry did not confirm a digest; the local engine's image is pinned by "
                          "image id, which other machines cannot reproduce: push it to a registry to pin it")
    return LockedBase(ref, None, note="neither its registry nor the local engine knows it: not pinned")


def lock_recipe(plans: dict[str, BuildPlan], *, engine: ImageStore | None = None,
                on_status: Callable[[str], None] | None = None, **kwargs: Any) -> LockFile:
    """plan.lock.lock_recipe with each base pinned by its registry, else by ``engine``."""
    kwargs.setdefault("base_pinner", functools.partial(pin_base, engine=engine))
    return _lock_recipe(plans, on_status=on_status, **kwargs)


def use_lock(plan: BuildPlan, *, mode: LockMode = LockMode.AUTO, variant: str = DEFAULT_VARIANT,
             ca_cert: Path | None = None, engine: ImageStore | None = None, **kwargs: Any) -> LockUse:
    """plan.lock.use_lock with each base pinned by its registry, else by ``engine``, which also
    answers whether a base locked by image id is still that image."""
    kwargs.setdefault("base_pinner", functools.partial(pin_base, engine=engine))
    return _use_lock(plan, mode=mode, variant=variant, ca_cert=ca_cert, engine=engine, **kwargs)


def pip_report_args(target: Target, indexes: list[str], requirements_file: str, report_file: str,
                    constraints_file: str | None = None, ca_cert: Path | None = None) -> list[str]:
    args = ["install", "--isolated", "--disable-pip-version-check", "--no-input", "--quiet",
            "--dry-run", "--ignore-installed", "--report", report_file, "--only-binary=:all:",
            "--python-version", target.python, "--implementation", "cp", "--abi", target.abi]
    for p in target.platforms:
        args += ["--platform", p]
    args += ["--index-url", indexes[0]]
    for extra in indexes[1:]:
        args += ["--extra-index-url", extra]
    if ca_cert is not None:
        args += ["--cert", str(ca_cert)]
    if constraints_file:
        args += ["-c", constraints_file]
    return args + ["-r", requirements_file]


@dataclass(frozen=True)
class PipResolver:
    """plan.lock's resolver: pip's installation report for requirements resolved for a target,
    run by ``python`` (the CLI: $IMGBUILD_LOCK_PYTHON, else its own) in ``environ`` with the
    machine's pip configuration (config files, PIP_* variables: local find-links, constraints) off."""

    python: str
    environ: Mapping[str, str]

    def __call__(self, target: Target, indexes: list[str], requirements: list[str], *,
                 constraints: Sequence[str] = (), ca_cert: Path | None = None) -> PipReport:
        return run_pip_report(target, indexes, requirements, constraints=constraints, ca_cert=ca_cert,
                              python=self.python, environ=self.environ)


def run_pip_report(target: Target, indexes: list[str], requirements: list[str], *,
                   constraints: Sequence[str] = (), ca_cert: Path | None = None, python: str,
                   environ: Mapping[str, str]) -> PipReport:
    """pip's installation report for ``requirements`` resolved for ``target`` (PipResolver)."""
    env = {k: v for k, v in environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    with tempfile.TemporaryDirectory(prefix="imgbuild-lock-") as tmp:
        req = Path(tmp, "requirements.txt")
        req.write_text("".join(r + "\n" for r in requirements))
        con = None
        if constraints:
            con = Path(tmp, "constraints.txt")
            con.write_text("".join(c + "\n" for c in constraints))
        report = Path(tmp, "report.json")
        # --target: pip takes --platform/--abi only with it; --dry-run installs nothing there.
        cmd = [python, "-m", "pip", *pip_report_args(target, indexes, str(req), str(report),
                                                      str(con) if con else None, ca_cert),
               "--target", str(Path(tmp, "target"))]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LockError(f"could not run pip to resolve the lock ({exc})") from None
        if proc.returncode != 0 or not report.exists():
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            raise LockError(f"pip could not resolve {', '.join(requirements)} for Python {target.python} "
                            f"on manylinux_2_{target.glibc}:\n{tail}",
                            hint="check the pins; with a corporate proxy pass --ca-cert")
        found: PipReport = json.loads(report.read_text())
        return found


@dataclass(frozen=True)
class LockWritten:
    """What `lock` prints: the lock file, whether it changed, and each variant's pins; its --json
    document and its text read these fields."""

    path: Path
    changed: bool
    seconds: float  # as measured: the JSON rounds it, the text shows one decimal
    variants: Mapping[str, VariantLock]

    def to_json(self) -> dict[str, Any]:
        return {"lock": str(self.path), "changed": self.changed, "seconds": round(self.seconds, 2), "variants": {
            vid: {"packages": v.packages_json(), "bases": v.bases_json(), "notes": variant_notes(v)}
            for vid, v in self.variants.items()}}

    def lines(self) -> list[str]:
        one = len(self.variants) == 1
        out = []
        for vid, variant in self.variants.items():
            count = sum(len(p) for p in variant.packages.values())
            pinned = sum(1 for b in variant.bases.values() if b.digest)
            what = f"{count} packages, {pinned}/{len(variant.bases)} bases by digest"
            out.append(what if one else f"  {vid}: {what}")
        out.append(f"{'wrote' if self.changed else 'unchanged'} {self.path} ({len(self.variants)} "
                   f"variant{'' if one else 's'}, {self.seconds:.1f}s)")
        return out
