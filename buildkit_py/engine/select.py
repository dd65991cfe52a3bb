"""Choosing the engine once, from the kind asked for (--engine/$IMGBUILD_ENGINE), --builder and the engine's address:
the registry (registry.py) names the kinds; each kind finds itself on the machine."""

from __future__ import annotations

from buildkit_py.engine.base import BUILDER_SELECT, Engine
from buildkit_py.engine.registry import AUTO, EngineChoice, EngineClass, auto_kinds, engines, kind_names, who_can
from buildkit_py.errors import EngineCapabilityError, EnvironmentProblem, ImgbuildError


def _preference(preference: str | None) -> str:
    # the CLI folds $IMGBUILD_ENGINE into the preference (cli/settings.py): no variable read here
    return preference or AUTO


def _candidates(kind: str, builder: str | None) -> list[type[EngineClass]]:
    """The engine classes to try for ``kind``, in order; refuses an unknown kind, and --builder
    with a kind that takes none."""
    classes = engines()
    if kind != AUTO and kind not in classes:
        names = kind_names()
        raise EnvironmentProblem(f"unknown engine {kind!r}", hint=f"use {', '.join(names[:-1])} or {names[-1]}")
    candidates = auto_kinds() if kind == AUTO else [classes[kind]]
    if builder:
        able = [c for c in candidates if c.named_builders]
        if not able:
            raise EngineCapabilityError(f"--builder {builder} needs buildx, not {candidates[0].title}",
                                         hint=f"builder: {who_can(BUILDER_SELECT)}")
        candidates = able
    return candidates


def select_engine(preference: str | None = None, *, builder: str | None = None,
                  host: str | None = None) -> Engine:
    """Pick the engine once: ``preference`` (a registered kind or auto; None: auto; the CLI
    passes --engine, else $IMGBUILD_ENGINE or the older $IMGBUILD_BACKEND), a named
    builder from --builder, the engine at
    ``host`` (None: the client's default, e.g. $DOCKER_HOST). Auto tries the kinds that take part
    in it in their order (buildx, then the classic client) and says why none would do."""
    kind = _preference(preference)
    choice = EngineChoice(kind, builder, host)
    problems: list[EnvironmentProblem] = []
    for cls in _candidates(kind, builder):
        try:
            return cls.find(choice)
        except EnvironmentProblem as exc:
            if all(p.message != exc.message for p in problems):
                problems.append(exc)
    if len(problems) == 1:
        raise problems[0]
    raise EnvironmentProblem("; ".join(p.message for p in problems), hint=problems[-1].hint)


def engine_for_reading(preference: str | None = None) -> Engine:
    """An engine for commands that only read images (inspect, run, check): no BuildKit needed,
    so where the chosen kind cannot build here, it still gives one to read with (for auto or an
    unknown kind, the last kind auto tries); it is only reached when first used."""
    try:
        return select_engine(preference)
    except ImgbuildError:
        kind = _preference(preference)
        classes = engines()
        cls = classes[kind] if kind in classes else auto_kinds()[-1]
        return cls.for_reading(EngineChoice(kind))
