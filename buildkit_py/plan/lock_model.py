"""The lock file as typed values: what ``imgbuild lock`` writes and ``imgbuild build`` reads
(buildkit_py/schemas/lock.schema.json is its published shape).

Frozen dataclasses, made from a document the schema has accepted (``LockFile.from_json``, in
plan/lock.py's ``read_lock``) and turned back into one for YAML and ``--json`` (``to_json``): the
only places that know the document's keys. ``to_json`` gives the keys in the order imgbuild has
always written them (the YAML file sorts them; ``lock --json`` does not), so a lock reads and
writes back byte for byte. Everything between works on these values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LOCK_VERSION = 1

Json = dict[str, Any]


@dataclass(frozen=True)
class LockedStep:
    """A pip step as the lock's inputs record it: its id and requirements, in plan order."""

    id: str
    requirements: tuple[str, ...]
    no_deps: bool = False  # installs exactly its pins (a CUDA layer): its packages are its own

    @classmethod
    def from_json(cls, raw: Json) -> LockedStep:
        return cls(raw["id"], tuple(raw["requirements"]), bool(raw.get("no_deps", False)))

    def to_json(self) -> Json:
        return {"id": self.id, "requirements": list(self.requirements), **({"no_deps": True} if self.no_deps else {})}


@dataclass(frozen=True)
class StageInputs:
    indexes: tuple[str, ...]  # the torch index first where the plan chose one, then the Python registry
    steps: tuple[LockedStep, ...]

    @classmethod
    def from_json(cls, raw: Json) -> StageInputs:
        return cls(tuple(raw["indexes"]), tuple(LockedStep.from_json(s) for s in raw["steps"]))

    def to_json(self) -> Json:
        return {"indexes": list(self.indexes), "steps": [s.to_json() for s in self.steps]}


@dataclass(frozen=True)
class LockInputs:
    """Everything the locked content depends on: a lock whose inputs differ from the plan's is stale."""

    bases: Mapping[str, str]  # stage -> base as the recipe names it (no digest)
    glibc: str  # "2.36"
    platform: str
    python: str  # "3.11"
    stages: Mapping[str, StageInputs]  # stages with pip steps, in plan order
    unlocked: tuple[str, ...]  # pins built from source: not locked

    @classmethod
    def from_json(cls, raw: Json) -> LockInputs:
        return cls(dict(raw["bases"]), raw["glibc"], raw["platform"], raw["python"],
                   {name: StageInputs.from_json(s) for name, s in raw["stages"].items()}, tuple(raw["unlocked"]))

    def to_json(self) -> Json:
        return {"bases": dict(self.bases), "glibc": self.glibc, "platform": self.platform, "python": self.python,
                "stages": {name: s.to_json() for name, s in self.stages.items()}, "unlocked": list(self.unlocked)}


@dataclass(frozen=True)
class LockedPackage:
    """One wheel: the earliest pip step that needs it installs exactly this file."""

    name: str
    version: str
    sha256: str
    step: str
    url: str | None = None  # a direct URL (a prebuilt flash-attn wheel); None: from the index

    @classmethod
    def from_json(cls, raw: Json) -> LockedPackage:
        return cls(raw["name"], raw["version"], raw["sha256"], raw["step"], raw.get("url"))

    def to_json(self) -> Json:
        return {"name": self.name, "version": self.version, "sha256": self.sha256, "step": self.step,
                **({"url": self.url} if self.url is not None else {})}


@dataclass(frozen=True)
class LockedBase:
    """A stage's base: by registry digest; else by local image id (not reproducible elsewhere), or
    not pinned at all; ``note`` says why it is not pinned by digest."""

    ref: str
    digest: str | None = None
    image_id: str | None = None
    note: str | None = None

    @classmethod
    def from_json(cls, raw: Json) -> LockedBase:
        return cls(raw["ref"], raw.get("digest"), raw.get("image_id"), raw.get("note"))

    def to_json(self) -> Json:
        optional = {"image_id": self.image_id, "note": self.note}
        return {"ref": self.ref, "digest": self.digest, **{k: v for k, v in optional.items() if v is not None}}


@dataclass(frozen=True)
class VariantLock:
    """The lock of one variant (``default`` for a recipe without a matrix)."""

    bases: Mapping[str, LockedBase]
    inputs: LockInputs
    packages: Mapping[str, tuple[LockedPackage, ...]]  # stage -> its packages, sorted by name
    notes: tuple[str, ...] = ()  # what the lock does not pin

    @classmethod
    def from_json(cls, raw: Json) -> VariantLock:
        return cls({stage: LockedBase.from_json(b) for stage, b in raw["bases"].items()},
                   LockInputs.from_json(raw["inputs"]),
                   {stage: tuple(LockedPackage.from_json(p) for p in ps) for stage, ps in raw["packages"].items()},
                   tuple(raw.get("notes") or ()))

    def to_json(self) -> Json:
        return {"bases": self.bases_json(), "inputs": self.inputs.to_json(), "notes": list(self.notes),
                "packages": self.packages_json()}

    def bases_json(self) -> Json:
        return {stage: b.to_json() for stage, b in self.bases.items()}

    def packages_json(self) -> Json:
        return {stage: [p.to_json() for p in ps] for stage, ps in self.packages.items()}


@dataclass(frozen=True)
class LockFile:
    lock_version: int  # LOCK_VERSION: the schema admits no other
    recipe: str  # the recipe's file name
    inputs_digest: str  # of every variant's inputs
    variants: Mapping[str, VariantLock]  # sorted by id

    @classmethod
    def from_json(cls, raw: Json) -> LockFile:
        """A document the lock schema accepted (read_lock validates first)."""
        return cls(raw["lock_version"], raw["recipe"], raw["inputs_digest"],
                   {vid: VariantLock.from_json(v) for vid, v in raw["variants"].items()})

    def to_json(self) -> Json:
        return {"lock_version": self.lock_version, "recipe": self.recipe, "inputs_digest": self.inputs_digest,
                "variants": {vid: v.to_json() for vid, v in self.variants.items()}}
