"""`imgbuild matrix --format bake`: a docker-bake.json for `docker buildx bake`, its network overlay
and every target's build context, so that bake builds exactly what `imgbuild build --all` would.
The matrix (plan/matrix.py) decides the variants and the stages they share; writing contexts,
secrets and Dockerfiles for buildx is the engine's side of it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from buildkit_py.engine.base import cache_export_value
from buildkit_py.engine.build import build_args, build_secrets, write_context
from buildkit_py.errors import UsageError
from buildkit_py.files import write_atomic
from buildkit_py.plan.build_plan import BuildPlan
from buildkit_py.plan.installer import UV_ENV_SECRET_ID, read_pip_config_for_uv, uses_uv
from buildkit_py.plan.matrix import (
    Matrix,
    Variant,
    after_shared,
    build_order,
    cache_ref,
    shared_stage_plan,
    shared_stages,
    variant_plan,
)
from buildkit_py.render.dockerfile import render_dockerfile

BAKE_FILE = "docker-bake.json"
# buildx before 0.17 reads a target's `network` only from a compose file: this one sets it.
BAKE_NETWORK_FILE = "compose.yaml"
BAKE_CONTEXTS = "contexts"  # one build context per target, beside the bake file
# Each target's Dockerfile as a file beside the contexts (-o DIR): buildx 0.13 copies a
# dockerfile-inline to a dockerfileNNN folder in TMPDIR on every bake and never removes it.
BAKE_DOCKERFILES = "dockerfiles"
_BAKE_MARK = ".imgbuild-bake"  # a folder holding it may be rewritten by the next `--format bake -o`


@dataclass(frozen=True)
class BakeTarget:
    name: str
    spec: dict[str, Any]  # the target as docker-bake.json holds it
    plan: BuildPlan  # what its build context must hold (write_context)


def bake_targets(matrix: Matrix, *, registry: str | None = None, ca_cert: Path | None = None,
                 pip_config: Path | None = None, push: bool = False,
                 prepare: Callable[[Variant, BuildPlan], BuildPlan] | None = None,
                 uv_env: Path | None = None) -> list[BakeTarget]:
    """The targets of the bake file, shared stages first: one per variant with its own registry
    cache (when there is a ``registry``), and the stages the variants share as targets of their
    own, ahead of the targets that build FROM them (through ``contexts: {name: "target:shared-..."}``).
    Shared targets export only cache; variant targets load into the engine, or push their tags
    with ``push``. (Bake's own --push/--load would set every target's output, the tagless shared
    ones too.) Each target's build context is ``contexts/<target>`` beside the bake file.
    The CA bundle and pip.conf reach every target as the secrets `imgbuild build` passes, and
    for uv steps the pip.conf's translation (the file ``uv_env``, which write_bake writes);
    ``prepare`` (the variant's lock) runs on each variant's plan first."""
    secrets = build_secrets(ca_cert, pip_config)
    plans = {v.id: variant_plan(v, registry=registry) for v in matrix.variants}
    if prepare is not None:
        plans = {v.id: prepare(v, plans[v.id]) for v in matrix.variants}
    if pip_config is not None and any(uses_uv(p.stages) for p in plans.values()):
        read_pip_config_for_uv(pip_config, ca_cert=ca_cert is not None)  # a key uv cannot honour: refused here
        if uv_env is None:
            raise UsageError(f"--pip-config {pip_config}: uv steps read its translation from a file beside "
                             "the bake file", hint="write the bake folder (-o DIR)")
        secrets[UV_ENV_SECRET_ID] = uv_env
    stages, chains = shared_stages(plans)
    common: dict[str, Any] = {"network": "host"}  # like `imgbuild build` (its --network default)
    if secrets:
        common["secret"] = [f"id={sid},src={src}" for sid, src in sorted(secrets.items())]

    def cache(ref_name: str) -> dict[str, list[str]]:
        if not registry:  # no registry: no cache refs (a bare name would mean Docker Hub)
            return {}
        ref = cache_ref(matrix, ref_name, registry)
        return {"cache-from": [f"type=registry,ref={ref}"],
                "cache-to": [cache_export_value(f"type=registry,ref={ref},mode=max", None)]}

    targets: list[BakeTarget] = []
    for key in build_order(stages):
        st = stages[key]
        plan = shared_stage_plan(st, plans, st.base)
        body = "\n".join(line for line in render_dockerfile(plan).splitlines() if not line.startswith("#"))
        head = (f"# Shared stage of the imgbuild matrix {matrix.name}: {', '.join(s.id for s in st.steps)};\n"
                f"# used by {', '.join(st.users)}.\n")
        spec: dict[str, Any] = {"context": f"{BAKE_CONTEXTS}/{st.target}",
                                "dockerfile-inline": head + body.strip("\n") + "\n"}
        if st.parent:
            spec["contexts"] = {stages[st.parent].context: f"target:{stages[st.parent].target}"}
        targets.append(BakeTarget(st.target, {**spec, **cache(st.target), "output": ["type=cacheonly"], **common},
                                  plan))
    for v in matrix.variants:
        plan = plans[v.id]
        chain = chains[v.id]
        if chain:
            plan = after_shared(plan, chain, stages, stages[chain[-1]].context)
        spec = {"context": f"{BAKE_CONTEXTS}/{v.id}", "dockerfile-inline": render_dockerfile(plan),
                "tags": list(plan.tags),
                "args": build_args()}
        if chain:
            last = stages[chain[-1]]
            spec["contexts"] = {last.context: f"target:{last.target}"}
        output = ["type=registry"] if push else ["type=docker"]
        targets.append(BakeTarget(v.id, {**spec, **cache(v.id), "output": output, **common}, plan))
    return targets


def bake_file(matrix: Matrix, **kwargs: Any) -> dict[str, Any]:
    """The docker-bake.json of ``bake_targets(matrix, **kwargs)``."""
    return _bake_json(bake_targets(matrix, **kwargs))


def _bake_json(targets: list[BakeTarget]) -> dict[str, Any]:
    return {"group": {"default": {"targets": [t.name for t in targets]}},
            "target": {t.name: t.spec for t in targets}}


def bake_network_file(targets: list[BakeTarget]) -> str:
    """compose.yaml beside the bake file: ``network: host`` for every target, which buildx bake
    before 0.17 reads only from a compose file (it ignores the bake file's ``network``)."""
    services = "".join(f"  {t.name}:\n    build:\n      network: host\n" for t in targets)
    return (f"# Written by `imgbuild matrix --format bake` with {BAKE_FILE}: `docker buildx bake` run in this\n"
            "# folder reads both. buildx < 0.17 takes a target's network only from a compose file; the\n"
            "# builds reach the package registries through the host's network, as `imgbuild build` does.\n"
            f"services:\n{services}")


def _dockerfiles_as_files(targets: list[BakeTarget], folder: Path) -> list[BakeTarget]:
    """Each target's inline Dockerfile written to ``folder``/dockerfiles/NAME.Dockerfile (bake
    reads a target's ``dockerfile`` relative to its context) and named there instead."""
    staging = folder / f".{BAKE_DOCKERFILES}.new"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    out = []
    for t in targets:
        write_atomic(staging / f"{t.name}.Dockerfile", t.spec["dockerfile-inline"])
        path = f"../../{BAKE_DOCKERFILES}/{t.name}.Dockerfile"  # from contexts/NAME
        out.append(replace(t, spec={("dockerfile" if k == "dockerfile-inline" else k):
                                    (path if k == "dockerfile-inline" else v) for k, v in t.spec.items()}))
    shutil.rmtree(folder / BAKE_DOCKERFILES, ignore_errors=True)
    staging.rename(folder / BAKE_DOCKERFILES)
    return out


def write_bake(matrix: Matrix, folder: Path, **kwargs: Any) -> list[Path]:
    """Write the bake file, its network overlay and every target's build context into
    ``folder`` (created; an existing one must be empty or hold an earlier bake of ours), so
    that `docker buildx bake` run there builds exactly what `imgbuild build --all` would.
    Returns the paths written, the bake file first."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"-o {folder}: not a folder", hint="give a folder for the bake file and its contexts")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / _BAKE_MARK).exists():
        raise UsageError(f"-o {folder}: the folder is not empty and holds no earlier bake of imgbuild's",
                         hint="give a new or empty folder; imgbuild replaces only a folder it wrote")
    uv_env = folder.resolve() / UV_ENV_SECRET_ID  # the pip.conf translated for uv steps, 0600
    targets = bake_targets(matrix, uv_env=uv_env, **kwargs)
    folder.mkdir(parents=True, exist_ok=True)
    if any(t.spec.get("secret") and f"id={UV_ENV_SECRET_ID},src={uv_env}" in t.spec["secret"] for t in targets):
        write_atomic(uv_env, read_pip_config_for_uv(kwargs["pip_config"], ca_cert=kwargs.get("ca_cert") is not None),
                     private=True)
    else:
        uv_env.unlink(missing_ok=True)
    staging = folder / f".{BAKE_CONTEXTS}.new"
    shutil.rmtree(staging, ignore_errors=True)
    for t in targets:
        write_context(t.plan, staging / t.name)
    shutil.rmtree(folder / BAKE_CONTEXTS, ignore_errors=True)
    staging.rename(folder / BAKE_CONTEXTS)
    targets = _dockerfiles_as_files(targets, folder)
    write_atomic(folder / _BAKE_MARK, f"written by imgbuild matrix --format bake from {matrix.path}\n")
    # key order matters (shared stages first), so no sort_keys
    return [write_atomic(folder / BAKE_FILE, json.dumps(_bake_json(targets), indent=2) + "\n"),
            write_atomic(folder / BAKE_NETWORK_FILE, bake_network_file(targets)), folder / BAKE_CONTEXTS]
