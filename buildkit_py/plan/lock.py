"""Lock files: every pip package of an image (transitive ones included) by version and
sha256, and every base image by digest, so a recipe builds the same image tomorrow.

    plan --lock_inputs--> inputs (what the plan asks of the lock: pins per step, Python,
         platform, indexes, bases)
         --resolve (pip --dry-run --report, for the image's Python and platform)-->
         packages, each assigned to the earliest pip step that needs it
         --dump--> <recipe stem>.lock (YAML, sorted, no timestamps: same inputs, same bytes)

    lock + plan --check_current--> LockStale (what changed) | --apply_lock--> locked plan:
         FROM ref@sha256:..., and each pip step as `pip install --no-deps --require-hashes
         -r FILE`, FILE bind-mounted from the build context so it never lands in a layer.

The resolver is pip's own (``pip install --dry-run --report``), run in a subprocess with the
machine's pip configuration switched off so the lock reflects the real index, not a local
wheel folder or constraints file. A lock holds several variants keyed by a variant id (a
matrix recipe locks each of its variants); a plain recipe is the one variant ``default``.

Only ``lock_variant``/``write_lock`` do I/O (a base's pin comes from the ``base_pinner`` and
pip's report from the ``resolver`` passed in: pipeline.locks reads the registry and the engine
and runs pip); everything else is pure and tested with a recorded pip report (tests/fixtures/lock/).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml
from packaging.markers import InvalidMarker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, canonicalize_version

from buildkit_py.compat.pip_config import PYPI_SIMPLE
from buildkit_py.errors import (
    ImgbuildError,
    LockDrift,
    LockError,
    LockFileError,
    LockStale,
    RecipeError,
    RecipeIssue,
    UsageError,
)
from buildkit_py.files import write_atomic
from buildkit_py.label_keys import OCI_BASE_DIGEST
from buildkit_py.plan.build_plan import BuildPlan, Stage, StageRole
from buildkit_py.plan.lock_model import (
    LOCK_VERSION,
    LockedBase,
    LockedPackage,
    LockedStep,
    LockFile,
    LockInputs,
    StageInputs,
    VariantLock,
)
from buildkit_py.plan.steps import (
    ContextFile,
    LockedPipStep,
    LockedPrefixPipStep,
    MetaStep,
    PipStep,
    PrefixPipStep,
    Step,
)
from buildkit_py.recipe.model import locate
from buildkit_py.schemas import line_of, load_schema, validate
from buildkit_py.text_enum import TextEnum

DEFAULT_VARIANT = "default"
LOCK_DIR = ".imgbuild-lock"  # in the build context; bind-mounted, never copied
MOUNT_DIR = "/run/imgbuild-lock"  # beside /run/secrets: empty mount points, no files
ARCH = "x86_64"  # recipes build linux/amd64 images
# glibc of each OS imgbuild knows (Debian and Ubuntu package archives: libc6), which decides
# the newest manylinux_2_N wheel the image can load. Unknown OS: manylinux2014 (glibc 2.17).
OS_GLIBC = {
    "debian11": 31, "debian12": 36, "debian13": 41,
    "ubuntu20.04": 31, "ubuntu22.04": 35, "ubuntu24.04": 39,
}
DEFAULT_GLIBC = 17
# pip freeze leaves these out; a lock may still hold them (e.g. setuptools for torch on 3.12).
FREEZE_EXCLUDED = frozenset({"pip", "setuptools", "wheel", "distribute"})

PipReport = dict[str, Any]  # pip's installation report (JSON), read by packages_from_report
Resolver = Callable[..., PipReport]
BasePinner = Callable[[str], LockedBase]  # a base ref -> its pin (pipeline.locks.pin_base: registry, then engine)


class LocalImage(Protocol):
    """What the lock reads of a local image (engine.ImageInfo is one): its id."""

    @property
    def id(self) -> str: ...


class ImageStore(Protocol):
    """What the lock asks of an engine: a local image (an engine object is one)."""

    def image(self, ref: str) -> LocalImage | None: ...


class LockMode(TextEnum):
    """What `imgbuild build` does with the recipe's lock (use_lock)."""

    AUTO = "auto"  # use it when present, refuse a stale one
    UPDATE = "update"  # re-lock, then use it (--update-lock)
    LOCKED = "locked"  # CI: it must exist and a fresh resolve must not change it (--locked)


class LockStatus(TextEnum):
    NONE = "none"  # no lock file: the plan as it is
    USED = "used"
    UPDATED = "updated"
    UNCHANGED = "unchanged"  # re-locked to the same bytes
# `build --all --update-lock` re-locks variants on several threads: one read-modify-write at a time.
_UPDATE = threading.Lock()


# --- inputs: what the plan asks of the lock -------------------------------------------------


@dataclass(frozen=True)
class Target:
    """The interpreter and platform wheels are chosen for (those of the image, not this host)."""

    python: str  # "3.11"
    glibc: int  # 36 -> manylinux_2_36

    @property
    def abi(self) -> str:
        return "cp" + self.python.replace(".", "")

    @property
    def platforms(self) -> list[str]:
        tags = [f"manylinux_2_{m}_{ARCH}" for m in range(self.glibc, 4, -1)]
        return tags + [f"manylinux2014_{ARCH}", f"manylinux2010_{ARCH}", f"manylinux1_{ARCH}", f"linux_{ARCH}"]

    @property
    def markers(self) -> dict[str, str]:
        """PEP 508 marker environment of the image's Python (the patch release is unknown)."""
        return {
            "implementation_name": "cpython", "implementation_version": f"{self.python}.0",
            "os_name": "posix", "platform_machine": ARCH, "platform_python_implementation": "CPython",
            "platform_release": "", "platform_system": "Linux", "platform_version": "",
            "python_full_version": f"{self.python}.0", "python_version": self.python, "sys_platform": "linux",
        }


def target_of(plan: BuildPlan) -> Target:
    return Target(plan.resolution.python, OS_GLIBC.get(plan.resolution.os or "", DEFAULT_GLIBC))


def unpinned(ref: str) -> str:
    """The base as the recipe names it: the plan may already carry the digest its registry
    gave at plan time (bases.py), but a lock records and applies its own."""
    return ref.split("@", 1)[0]


def _plan_bases(plan: BuildPlan) -> dict[str, str]:
    """stage name -> base reference as planned (a digest included, where the plan has one)."""
    return {s.name: s.base for s in plan.stages if s.base not in {x.name for x in plan.stages}}


def _pip_steps(stage: Stage) -> list[PipStep]:
    return [s for s in stage.steps if isinstance(s, PipStep)]


def stage_indexes(stage: Stage) -> list[str]:
    """The indexes one resolve of this stage uses, and every locked step of it installs from:
    the torch step's index first (when the plan chose one), then the Python registry."""
    urls = sorted({s.index_url for s in _pip_steps(stage) if s.index_url})
    if len(urls) > 1:
        raise LockError(f"stage {stage.name} installs from several wheel indexes ({', '.join(urls)}); "
                        "imgbuild can lock one besides the Python registry")
    return urls + [PYPI_SIMPLE]


def lock_inputs(plan: BuildPlan) -> LockInputs:
    """Everything the locked content depends on. A lock whose inputs differ from these is stale."""
    target = target_of(plan)
    stages = {}
    for stage in plan.stages:
        steps = tuple(LockedStep(s.id, tuple(s.requirements), s.no_deps) for s in _pip_steps(stage))
        if steps:
            stages[stage.name] = StageInputs(tuple(stage_indexes(stage)), steps)
    return LockInputs(
        bases={name: unpinned(ref) for name, ref in _plan_bases(plan).items()},
        glibc=f"2.{target.glibc}",
        platform=f"linux/amd64 ({target.abi}, manylinux_2_{target.glibc}_{ARCH} and older)",
        python=target.python,
        stages=stages,
        unlocked=tuple(sorted(plan.resolution.compile)),
    )


# --- resolving ------------------------------------------------------------------------------


def _root(spec: str, by_url: dict[str, str]) -> tuple[str, frozenset[str]]:
    try:
        req = Requirement(spec)
        return canonicalize_name(req.name), frozenset(req.extras)
    except InvalidRequirement:
        if spec in by_url:  # a bare wheel URL (prebuilt flash-attn)
            return by_url[spec], frozenset()
        raise LockError(f"cannot tell which package requirement {spec!r} names") from None


def _deps(item: dict[str, Any], extras: frozenset[str], markers: dict[str, str]) -> list[tuple[str, frozenset[str]]]:
    out: list[tuple[str, frozenset[str]]] = []
    for text in item["metadata"].get("requires_dist") or []:
        try:
            req = Requirement(text)
            wanted = req.marker is None or any(req.marker.evaluate({**markers, "extra": e})
                                               for e in ("", *sorted(extras)))
        except (InvalidRequirement, InvalidMarker):
            raise LockError(f"{item['metadata']['name']} declares an unreadable dependency {text!r}") from None
        if wanted:
            out.append((canonicalize_name(req.name), frozenset(req.extras)))
    return out


def packages_from_report(report: PipReport, target: Target, steps: Sequence[LockedStep]) -> list[LockedPackage]:
    """Locked packages of one stage: name, version, sha256 and the EARLIEST pip step whose
    requirements need it (so torch's closure lands in the torch layer, and a change to a small
    pin re-runs only the last layers). ``steps`` in plan order; a ``no_deps`` step installs
    exactly its pins (then its packages are its own)."""
    items: dict[str, dict[str, Any]] = {canonicalize_name(i["metadata"]["name"]): i for i in report["install"]}
    by_url = {i["download_info"]["url"]: n for n, i in items.items()}
    markers = target.markers
    step_of: dict[str, str] = {}
    missing: set[str] = set()
    for step in steps:  # a --no-deps step (a CUDA layer) holds exactly what it names, whatever needs it
        if step.no_deps:
            for name, _ in (_root(r, by_url) for r in step.requirements):
                step_of.setdefault(name, step.id)
    for step in steps:
        queue = [_root(r, by_url) for r in step.requirements]
        seen: set[tuple[str, frozenset[str]]] = set()
        while queue:
            name, extras = queue.pop()
            if (name, extras) in seen:
                continue
            seen.add((name, extras))
            if name not in items:
                missing.add(name)
                continue
            step_of.setdefault(name, step.id)
            queue.extend(_deps(items[name], extras, markers))
    extra = sorted(set(items) - set(step_of))
    if missing or extra:
        raise LockError(
            f"pip's resolution does not match Python {target.python}'s markers"
            + (f"; missing {', '.join(sorted(missing))}" if missing else "")
            + (f"; not needed by any pin: {', '.join(extra)}" if extra else ""),
            hint="pip evaluates markers for the Python it runs on: set IMGBUILD_LOCK_PYTHON to a "
                 f"Python {target.python} interpreter with pip")
    packages = []
    for name in sorted(items):
        item = items[name]
        info = item["download_info"]
        archive = info.get("archive_info")
        if archive is None:
            raise LockError(f"{item['metadata']['name']} resolves to {info.get('url')}, which is not a wheel "
                            "archive; only index and URL wheels can be locked")
        hashes = archive.get("hashes") or {}
        if "sha256" not in hashes and (archive.get("hash") or "").startswith("sha256="):
            hashes = {"sha256": archive["hash"].split("=", 1)[1]}
        if "sha256" not in hashes:
            raise LockError(f"the index gives no sha256 for {item['metadata']['name']} ({info['url']})")
        packages.append(LockedPackage(item["metadata"]["name"], item["metadata"]["version"], hashes["sha256"],
                                      step_of[name], info["url"] if item.get("is_direct") else None))
    return packages


# --- base images ----------------------------------------------------------------------------


def local_image(engine: ImageStore | None, ref: str) -> LocalImage | None:
    """The engine's image ``ref``; None when there is no engine (the CLI passes
    the one it created, or None), the engine is unreachable or does not have it."""
    if engine is None:
        return None
    try:
        return engine.image(ref)
    except ImgbuildError:
        return None


# --- the lock file --------------------------------------------------------------------------


def single_platform(plan: BuildPlan) -> None:
    """A lock pins the wheels (and hashes) of one platform, linux/amd64 (``ARCH``): a recipe built for
    more is refused before any lock is written or used, since the arm64 half would install the
    x86_64 pins under --require-hashes and fail in the build."""
    if plan.recipe.multi_platform:
        raise UsageError(f"{plan.recipe.path}: a lock pins linux/amd64 ({ARCH}) wheels only; this recipe builds "
                         f"{', '.join(plan.recipe.platforms)}",
                         hint=f"build it without a lock (move {lock_path(plan.recipe.path).name} away), or leave "
                              "platforms: at linux/amd64 to lock it")


def lock_variant(plan: BuildPlan, *, base_pinner: BasePinner, ca_cert: Path | None = None,
                 resolver: Resolver, prefer: VariantLock | None = None,
                 on_status: Callable[[str], None] | None = None) -> VariantLock:
    """The lock of one variant. ``prefer``: an existing variant lock whose versions are
    passed as constraints (so re-checking a current lock does not pick up new releases).
    ``resolver``: pip's report for requirements (pipeline.locks.PipResolver runs pip);
    ``base_pinner`` pins each base (pipeline.locks.pin_base asks the registry, then the engine;
    tests pass fakes of both).
    ``on_status`` hears what is being done before each wait (a pip resolution takes tens of
    seconds): the CLI shows it."""
    single_platform(plan)
    status = on_status or (lambda _text: None)
    inputs = lock_inputs(plan)
    target = target_of(plan)
    packages: dict[str, tuple[LockedPackage, ...]] = {}
    for stage_name, stage in inputs.stages.items():
        requirements = [r for step in stage.steps for r in step.requirements]
        constraints = [f"{p.name}=={p.version}" for p in (prefer.packages.get(stage_name, ()) if prefer else ())
                       if p.url is None]
        status(f"resolving {len(requirements)} requirements of stage {stage_name} with pip (Python {target.python})")
        report = resolver(target, list(stage.indexes), requirements, constraints=constraints, ca_cert=ca_cert)
        packages[stage_name] = tuple(packages_from_report(report, target, stage.steps))
    bases: dict[str, LockedBase] = {}
    for name, ref in _plan_bases(plan).items():
        if "@" in ref:
            bases[name] = LockedBase(unpinned(ref), ref.split("@", 1)[1])
        else:
            status(f"pinning base {ref} of stage {name} by digest")
            bases[name] = base_pinner(ref)
    notes = [f"{name} is built from source in the builder stage: not locked (its sdist is not hashed, "
             "and dependencies it pulls beyond the locked packages are not pinned)"
             for name in inputs.unlocked]
    return VariantLock(bases, inputs, packages, tuple(notes))


def variant_notes(entry: VariantLock) -> list[str]:
    """What a variant's lock does not pin, for the user to see on every lock and build."""
    return list(entry.notes) + [f"base {b.ref} of stage {stage}: {b.note}"
                                for stage, b in sorted(entry.bases.items()) if b.note]


def _digest(obj: object) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def make_lock(recipe_path: Path, variants: dict[str, VariantLock]) -> LockFile:
    return LockFile(LOCK_VERSION, recipe_path.name, _digest({k: v.inputs.to_json() for k, v in variants.items()}),
                    dict(sorted(variants.items())))


def lock_recipe(plans: dict[str, BuildPlan], *, on_status: Callable[[str], None] | None = None,
                **kwargs: Any) -> LockFile:
    """Lock every variant (``{variant_id: plan}``; a plain recipe is ``{"default": plan}``);
    ``on_status`` as for lock_variant, each text after its variant's id when there are several."""
    if not plans:
        raise UsageError("nothing to lock: no variant to resolve")
    first = next(iter(plans.values()))

    def variant_status(vid: str) -> Callable[[str], None] | None:
        if on_status is None or len(plans) == 1:
            return on_status
        return lambda text: on_status(f"[{vid}] {text}")

    return make_lock(first.recipe.path, {vid: lock_variant(p, on_status=variant_status(vid), **kwargs)
                                         for vid, p in plans.items()})


def dump_lock(lock: LockFile) -> str:
    header = (f"# imgbuild lock file for {lock.recipe}: generated by `imgbuild lock`, do not edit.\n"
              "# `imgbuild build` installs exactly these wheels (pip --require-hashes) on these bases.\n"
              f"# Update it with `imgbuild lock {lock.recipe}` or `imgbuild build --update-lock`.\n")
    return header + yaml.safe_dump(lock.to_json(), sort_keys=True, default_flow_style=False, width=4096,
                                   allow_unicode=True)


def lock_path(recipe_path: Path) -> Path:
    return Path(recipe_path).with_suffix(".lock")


def write_lock(path: Path, text: str) -> bool:
    """Atomic (temporary file + rename). False when the file already holds these bytes."""
    if path.exists() and path.read_text() == text:
        return False
    write_atomic(path, text)  # a lock holds no secret: its mode follows the umask
    return True


def read_lock(path: Path) -> LockFile:
    """The lock file, checked against its schema (lock.schema.json): LockFileError (exit 2)
    with every issue at its `file:line: key`; then the typed lock."""
    hint = "regenerate it with `imgbuild lock`"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LockError(f"{path}: cannot read the lock file ({exc.__class__.__name__})", hint=hint) from None
    try:
        located = locate(text, str(path))
    except RecipeError as exc:  # not YAML: located by the loader
        raise LockFileError(exc.issues, hint=hint) from None
    if not isinstance(located.data, dict):
        raise LockFileError([RecipeIssue(str(path), 1, "", f"not an imgbuild lock file of version {LOCK_VERSION}")],
                            hint=hint)
    issues = located.issues + [RecipeIssue(str(path), line_of(located.lines, i.key) or 1, i.key, i.message)
                                for i in validate(located.data, load_schema("lock"))]
    if issues:
        raise LockFileError(issues, hint=hint)
    return LockFile.from_json(located.data)


def lock_entry(recipe_path: Path, variant: str = DEFAULT_VARIANT) -> VariantLock | None:
    """The lock file's entry for ``variant``, None when the recipe has no lock (or not that variant)."""
    path = lock_path(recipe_path)
    if not path.exists():
        return None
    return read_lock(path).variants.get(variant)


def wheel_key(name: str, version: str) -> tuple[str, str]:
    """How a wheel is matched between a lock and an installed distribution: the canonical name
    and the canonical version (``Foo_Bar 1.0.0`` is ``foo-bar 1.0``, as pip's ``==`` compares)."""
    return canonicalize_name(name), canonicalize_version(version)


def wheel_hashes(entry: VariantLock | None) -> dict[tuple[str, str], str]:
    """``wheel_key -> sha256`` of every package a lock entry pins (its wheel's hash, as
    ``--require-hashes`` checked it), over all stages; the final image's stage wins a clash."""
    stages = entry.packages if entry else {}
    out: dict[tuple[str, str], str] = {}
    for stage in sorted(stages, key=lambda name: name == "final"):
        for p in stages[stage]:
            out[wheel_key(p.name, p.version)] = p.sha256
    return out


# --- staleness and drift --------------------------------------------------------------------


def _pins(inputs: LockInputs) -> dict[tuple[str, str], tuple[str, str]]:
    """(stage, package) -> (step, requirement) over every pip step."""
    out: dict[tuple[str, str], tuple[str, str]] = {}
    for stage, s in inputs.stages.items():
        for step in s.steps:
            for r in step.requirements:
                key: str
                try:
                    key = canonicalize_name(Requirement(r).name)
                except InvalidRequirement:
                    key = r
                out[(stage, key)] = (step.id, r)
    return out


def _version(req: str) -> str:
    return req.split("==", 1)[1] if "==" in req else req


def diff_inputs(old: LockInputs, new: LockInputs) -> list[str]:
    """What changed between the inputs a lock was made from and the plan's, in words."""
    changes = [f"python {old.python} -> {new.python}"] if old.python != new.python else []
    if old.glibc != new.glibc:
        changes.append(f"glibc {old.glibc} -> {new.glibc}")
    if old.platform != new.platform and old.glibc == new.glibc:
        changes.append(f"platform {old.platform} -> {new.platform}")
    changes += _base_changes(old.bases, new.bases)
    changes += _index_changes(old.stages, new.stages)
    changes += _pin_changes(_pins(old), _pins(new))
    if old.unlocked != new.unlocked:
        changes.append(f"built from source: {', '.join(old.unlocked) or 'none'} -> {', '.join(new.unlocked) or 'none'}")
    if not changes and old != new:
        changes.append("the plan's pip steps changed (order or grouping)")
    return changes


def _base_changes(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    return [f"base of stage {stage}: {old.get(stage) or 'none'} -> {new.get(stage) or 'none'}"
            for stage in sorted(set(old) | set(new)) if old.get(stage) != new.get(stage)]


def _index_changes(old: Mapping[str, StageInputs], new: Mapping[str, StageInputs]) -> list[str]:
    changes = []
    for stage in sorted(set(old) & set(new)):
        a, b = old[stage].indexes, new[stage].indexes
        if a and b and a != b:
            changes.append(f"wheel index of stage {stage}: {a[0]} -> {b[0]}")
    return changes


def _pin_changes(pa: dict[tuple[str, str], tuple[str, str]], pb: dict[tuple[str, str], tuple[str, str]]) -> list[str]:
    """pip pins added, removed, re-pinned or moved to another step, per (stage, package)."""
    changes = []
    for key in sorted(set(pa) | set(pb)):
        stage, name = key
        where = "" if stage == "final" else f" (stage {stage})"
        if key not in pb:
            changes.append(f"pip: removed {pa[key][1]}{where}")
        elif key not in pa:
            changes.append(f"pip: added {pb[key][1]}{where}")
        elif pa[key][1] != pb[key][1]:
            a, b = _version(pa[key][1]), _version(pb[key][1])
            if a == b:  # extras or markers changed, not the version
                a, b = pa[key][1], pb[key][1]
            changes.append(f"pip: {name} {a} -> {b}{where}")
        elif pa[key][0] != pb[key][0]:
            changes.append(f"pip: {name} moved from step {pa[key][0]} to {pb[key][0]}{where}")
    return changes


def diff_locked(old: VariantLock, new: VariantLock) -> list[str]:
    """What a fresh resolve of the same inputs would change in a variant's packages and bases."""
    changes = []
    for stage in sorted(set(old.packages) | set(new.packages)):
        a = {canonicalize_name(p.name): p for p in old.packages.get(stage, ())}
        b = {canonicalize_name(p.name): p for p in new.packages.get(stage, ())}
        where = "" if stage == "final" else f" (stage {stage})"
        for name in sorted(set(a) | set(b)):
            if name not in b:
                changes.append(f"{a[name].name} {a[name].version} would be removed{where}")
            elif name not in a:
                changes.append(f"{b[name].name} {b[name].version} would be added{where}")
            elif a[name].version != b[name].version:
                changes.append(f"{b[name].name} {a[name].version} -> {b[name].version}{where}")
            elif a[name].sha256 != b[name].sha256:
                changes.append(f"{b[name].name} {b[name].version}: locked sha256 {a[name].sha256[:12]}... "
                               f"but the index has {b[name].sha256[:12]}...{where}")
            elif a[name].step != b[name].step:
                changes.append(f"{b[name].name} would move from step {a[name].step} to {b[name].step}{where}")
    for stage in sorted(set(old.bases) | set(new.bases)):
        was_base, now_base = old.bases.get(stage), new.bases.get(stage)
        if was_base and was_base.digest and now_base and was_base.ref == now_base.ref:
            continue  # a pinned digest stays pinned; a moved tag is an update, not drift
        if was_base != now_base:
            was = (was_base and (was_base.digest or was_base.image_id)) or "unpinned"
            now = (now_base and (now_base.digest or now_base.image_id)) or "unpinned"
            ref = (now_base and now_base.ref) or (was_base and was_base.ref)
            changes.append(f"base of stage {stage} ({ref}): {was} -> {now}")
    return changes


def check_current(lock: LockFile, plan: BuildPlan, path: Path, variant: str = DEFAULT_VARIANT, *,
                  locked: bool = False) -> VariantLock:
    """The variant's lock, or LockStale (LockDrift under ``--locked``) naming what changed."""
    err = LockDrift if locked else LockStale
    hint = (f"run `imgbuild lock {plan.recipe.path}` (or `imgbuild build --update-lock`) and commit {path.name}")
    entry = lock.variants.get(variant)
    if entry is None:
        raise err(f"{path} has no variant {variant!r} (it has {', '.join(sorted(lock.variants)) or 'none'})",
                  changes=[f"variant {variant} added"], path=str(path), hint=hint)
    changes = diff_inputs(entry.inputs, lock_inputs(plan))
    if changes:
        what = "does not match" if locked else "is stale for"
        raise err(f"{path.name} {what} {plan.recipe.path.name} (variant {variant}): " + "; ".join(changes),
                  changes=changes, path=str(path), hint=hint)
    return entry


# --- using a lock in a build ----------------------------------------------------------------


def requirements_text(packages: Sequence[LockedPackage]) -> str:
    lines = []
    for p in sorted(packages, key=lambda p: canonicalize_name(p.name)):
        spec = f"{p.name} @ {p.url}" if p.url else f"{p.name}=={p.version}"
        lines.append(f"{spec} --hash=sha256:{p.sha256}\n")
    return "".join(lines)


def _locked_step(stage: Stage, step: PipStep, packages: Sequence[LockedPackage]) -> LockedPipStep:
    rel = f"{LOCK_DIR}/{stage.name}-{step.id}.txt"
    indexes = stage_indexes(stage)
    # a prefix step stays one: its locked wheels go into the same shared prefix
    extra = {"prefix": step.prefix} if isinstance(step, PrefixPipStep) else {}
    kind = LockedPrefixPipStep if isinstance(step, PrefixPipStep) else LockedPipStep
    return kind(
        step.id, step.group,
        requirements_file=ContextFile(rel, requirements_text(packages)),
        mount_target=f"{MOUNT_DIR}/{stage.name}-{step.id}.txt",
        index_url=indexes[0] if len(indexes) > 1 else None,
        extra_index_urls=tuple(indexes[1:]),
        reproducible=step.reproducible,
        installer=step.installer,  # hashes hold with either: uv and pip both take --require-hashes
        **extra,
    )


def apply_lock(plan: BuildPlan, entry: VariantLock) -> BuildPlan:
    """A new plan: bases by digest, and each pip step replaced by a ``LockedPipStep`` that
    installs its locked packages with ``--no-deps --require-hashes`` from a requirements file
    bind-mounted from the context (a pip step whose packages an earlier step installs is dropped)."""
    stages = []
    labels = dict(plan.labels)
    for stage in plan.stages:
        base = stage.base
        pinned = entry.bases.get(stage.name)
        if pinned and pinned.digest and pinned.ref == unpinned(base):
            base = f"{unpinned(base)}@{pinned.digest}"
            if stage.role == StageRole.FINAL and OCI_BASE_DIGEST in labels:
                labels[OCI_BASE_DIGEST] = pinned.digest  # the base built on is the locked one
        packages = entry.packages.get(stage.name)
        steps: list[Step] = []
        for step in stage.steps:
            if isinstance(step, MetaStep) and OCI_BASE_DIGEST in dict(step.labels):
                steps.append(dataclasses.replace(step, labels=tuple(labels.items())))
            elif isinstance(step, PipStep) and packages is not None:
                mine = [p for p in packages if p.step == step.id]
                if mine:  # else everything it names is already installed by an earlier step
                    steps.append(_locked_step(stage, step, mine))
            else:
                steps.append(step)
        stages.append(dataclasses.replace(stage, base=base, steps=tuple(steps)))
    return dataclasses.replace(plan, stages=tuple(stages), labels=labels)


@dataclass(frozen=True)
class LocalBaseDrift:
    """A base locked by local image id (no registry digest) whose image has changed since, or
    is gone: the build would not reproduce the lock. A warning, and a refusal under --locked."""

    ref: str
    locked_id: str
    now_id: str | None  # None: not in the engine, or no engine to ask

    def render(self) -> str:
        return f"base {self.ref} is not the image locked (locked {self.locked_id[:19]}, now {str(self.now_id)[:19]})"


def local_base_drift(bases: Mapping[str, LockedBase], engine: ImageStore | None = None) -> list[LocalBaseDrift]:
    """The bases (a variant's) locked by local image id whose image is no longer that one."""
    out = []
    for _stage, b in sorted(bases.items()):
        if b.digest or not b.image_id:
            continue
        local = local_image(engine, b.ref)
        now = local.id if local is not None else None
        if now != b.image_id:
            out.append(LocalBaseDrift(b.ref, b.image_id, now))
    return out


@dataclass(frozen=True)
class LockUse:
    plan: BuildPlan  # the plan to build (locked, or the original when there is no lock)
    path: Path
    status: LockStatus
    warnings: tuple[str, ...] = ()


def use_lock(plan: BuildPlan, *, mode: LockMode = LockMode.AUTO, variant: str = DEFAULT_VARIANT,
             base_pinner: BasePinner, ca_cert: Path | None = None, resolver: Resolver | None = None,
             engine: ImageStore | None = None) -> LockUse:
    """What `imgbuild build` does with the recipe's lock. ``mode``: ``auto`` (use it when
    present, refuse a stale one), ``update`` (re-lock, then use it) or ``locked`` (CI: it must
    exist and a fresh resolve must not change it; never written)."""
    path = lock_path(plan.recipe.path)
    kwargs: dict[str, Any] = {"ca_cert": ca_cert, "resolver": resolver, "base_pinner": base_pinner}
    if mode in (LockMode.UPDATE, LockMode.LOCKED) and resolver is None:
        raise ValueError(f"use_lock(mode={mode}) resolves the pins: pass a resolver")  # a caller's bug
    if mode == LockMode.UPDATE:
        entry = lock_variant(plan, **kwargs)
        with _UPDATE:  # other variants of the file are kept
            lock = read_lock(path) if path.exists() else None
            variants = {**(lock.variants if lock else {}), variant: entry}
            changed = write_lock(path, dump_lock(make_lock(plan.recipe.path, variants)))
        status = LockStatus.UPDATED if changed else LockStatus.UNCHANGED
    elif not path.exists():
        if mode == LockMode.LOCKED:
            raise LockDrift(f"--locked: {plan.recipe.path.name} has no lock file ({path.name})",
                            changes=["lock file missing"], path=str(path),
                            hint=f"run `imgbuild lock {plan.recipe.path}` and commit {path.name}")
        return LockUse(plan, path, LockStatus.NONE)
    else:
        single_platform(plan)
        lock = read_lock(path)
        entry = check_current(lock, plan, path, variant, locked=mode == LockMode.LOCKED)
        status = LockStatus.USED
        if mode == LockMode.LOCKED:
            fresh = lock_variant(plan, prefer=entry, **kwargs)
            changes = diff_locked(entry, fresh)
            if changes:
                raise LockDrift(f"--locked: {path.name} would change (variant {variant}): " + "; ".join(changes),
                                changes=changes, path=str(path),
                                hint=f"run `imgbuild lock {plan.recipe.path}` and review the diff")
    drift = [d.render() for d in local_base_drift(entry.bases, engine)]
    if mode == LockMode.LOCKED and drift:
        raise LockDrift(f"--locked: {path.name}: " + "; ".join(drift), changes=drift, path=str(path))
    warnings = tuple(variant_notes(entry)) + tuple(drift)
    return LockUse(apply_lock(plan, entry), path, status, warnings)
