"""The engine registry: every kind of engine imgbuild can build with, by the name ``--engine``
(and $IMGBUILD_ENGINE) takes. Each kind is a plug-in: one module in ``buildkit_py/engine/kinds/``
whose class registers itself with ``@register``; the modules there are imported the first time
the registry is read, so adding an engine is adding that module (and its tests), nothing else.

A registered class says, as class attributes, how it is chosen (``kind``, ``aliases``, its place
under ``--engine auto``, whether it takes ``--builder``) and finds itself on the machine
(``find``), or explains why not by raising EnvironmentProblem. ``select.py`` asks the registry;
no other module names a kind."""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol, TypeVar

if TYPE_CHECKING:
    from buildkit_py.engine.base import Engine

AUTO = "auto"


@dataclass(frozen=True)
class EngineChoice:
    """What the user chose: the kind (--engine, $IMGBUILD_ENGINE; ``auto``), a named builder
    (--builder) and the engine's address (None: the client's default, e.g. $DOCKER_HOST)."""

    kind: str = AUTO
    builder: str | None = None
    host: str | None = None


class EngineClass(Protocol):
    """The class side of an engine plug-in."""

    kind: ClassVar[str]  # the --engine name
    aliases: ClassVar[tuple[str, ...]]  # other names for it ("classic" for "docker")
    # Its place when --engine is auto (lowest first); None: only when asked for by name.
    auto_order: ClassVar[int | None]
    named_builders: ClassVar[bool]  # takes --builder NAME
    title: ClassVar[str]  # for messages: "the classic client", "podman"
    summary: ClassVar[str]  # for --engine's help: "a 20.10 client with DOCKER_BUILDKIT=1"
    # For a refusal's hint: each capability this kind can offer, and how ("buildx with the containerd store")
    who_can: ClassVar[Mapping[str, str]]

    @classmethod
    def find(cls, choice: EngineChoice) -> Engine:
        """The engine on this machine, or EnvironmentProblem saying why there is none."""
        ...

    @classmethod
    def for_reading(cls, choice: EngineChoice) -> Engine:
        """An engine good enough to read images with where ``find`` refused (no BuildKit is
        needed to inspect); never raises: it fails when first used instead."""
        ...


_REGISTERED: dict[str, type[EngineClass]] = {}
_LOADED = False
_LOCK = threading.Lock()
E = TypeVar("E", bound="type[EngineClass]")


def register(cls: E) -> E:
    """Class decorator: ``cls`` (an EngineClass) is the engine for its ``kind`` and ``aliases``."""
    for name in (cls.kind, *cls.aliases):
        known = _REGISTERED.get(name)
        if known is not None and known is not cls:
            raise ValueError(f"engine kind {name!r} is registered twice: {known.__qualname__} and {cls.__qualname__}")
        _REGISTERED[name] = cls
    return cls


def _load() -> None:
    """Import every module of ``engine/kinds``: each registers its engine as it is imported."""
    global _LOADED  # noqa: PLW0603 - the one-time import of the plug-ins
    with _LOCK:
        if _LOADED:
            return
        from buildkit_py.engine import kinds  # noqa: PLC0415 - the plug-ins load on first use

        for module in sorted(pkgutil.iter_modules(kinds.__path__), key=lambda m: m.name):
            importlib.import_module(f"{kinds.__name__}.{module.name}")
        _LOADED = True


def engines() -> dict[str, type[EngineClass]]:
    """Every registered engine class by name, aliases included."""
    _load()
    return dict(_REGISTERED)


def kind_names() -> list[str]:
    """What --engine takes: ``auto``, then each kind by its name, then the aliases."""
    classes = engines()
    primary = sorted({c.kind for c in classes.values()})
    return [AUTO, *primary, *sorted(n for n in classes if n not in primary)]


def kinds_help() -> str:
    """--engine's help: each kind with its summary, and what auto tries."""
    classes = sorted({c.kind: c for c in engines().values()}.items())
    aliases = {name: c.kind for name, c in engines().items() if name != c.kind}
    kinds = ", ".join(f"{k} ({c.summary})" for k, c in classes)
    also = "".join(f"; {a} is {k}" for a, k in sorted(aliases.items()))
    return f"engine kind: {kinds}{also}; default: auto ({', then '.join(c.kind for c in auto_kinds())})"


def who_can(capability: str) -> str | None:
    """Which registered kinds can honour ``capability``, in their own words, for the refusal's
    hint (``require``); None when none says it can."""
    kinds = sorted({c.kind: c for c in engines().values()}.items())
    offers = dict.fromkeys(c.who_can[capability] for _, c in kinds if capability in c.who_can)
    return ", or ".join(offers) or None


def auto_kinds() -> list[type[EngineClass]]:
    """The kinds --engine auto tries, in order."""
    classes = {c.kind: c for c in engines().values()}
    return sorted((c for c in classes.values() if c.auto_order is not None), key=lambda c: (c.auto_order, c.kind))
