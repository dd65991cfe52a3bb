"""Locking with the outside world: a base image's pin read from its registry, else from the
local engine. plan/lock.py does the rest with the pinner passed in, so the plan layer never
talks to a registry or an engine itself."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from buildkit_py import oci
from buildkit_py.errors import ImgbuildError
from buildkit_py.plan.build_plan import BuildPlan
from buildkit_py.plan.lock import (
    DEFAULT_VARIANT,
    ImageStore,
    LockMode,
    LockUse,
    local_image,
)
from buildkit_py.plan.lock import lock_recipe as _lock_recipe
from buildkit_py.plan.lock import use_lock as _use_lock
from buildkit_py.plan.lock_model import LockedBase, LockFile


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
