"""Which plan step made which layer: a build's history entries (the image config's ``history``,
or the engine's history API) read back against the plan that rendered them. The renderer marks
every RUN with ``: imgbuild-step=<id>``; COPY entries count in order. The size budget (after a
build), ``inspect`` and ``diff`` all read a history this way, so it lives here, below them."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from buildkit_py.plan.build_plan import (
    GROUPS,
    MOUNT_STUB_FILE,
    MOUNT_STUBS_GROUP,
    MOUNT_STUBS_STEP,
    STEP_MARK,
    group_of,
)

BASE_GROUP, OTHER_GROUP, APP_GROUP, META_GROUP = "base", "other", "app", "meta"
# Report order: the base image's layers, then plan's groups in build order, then unknowns.
GROUP_ORDER = (BASE_GROUP,) + tuple(GROUPS) + (OTHER_GROUP,)

def _group_of(step: str) -> str:
    """A step's group by its id, as make_plan gives it (build_plan.group_of); an id it does not
    write counts as "other"."""
    return group_of(step) or OTHER_GROUP


MARKER_RE = re.compile(r":\s*" + re.escape(STEP_MARK) + r"=([^;\s]+)")


def instruction_of(created_by: str) -> str:
    """The Dockerfile instruction of a history entry, legacy builder or BuildKit."""
    s = created_by.strip()
    if s.startswith("/bin/sh -c #(nop)"):
        s = s[len("/bin/sh -c #(nop)"):].strip()
    elif s.startswith(("/bin/sh -c", "|")):
        return "RUN"
    word = s.split(None, 1)[0] if s else ""
    return word.upper() if word.isalpha() else ""


@dataclass(frozen=True)
class Attribution:
    step: str | None
    group: str
    created_by: str
    instruction: str


def attribute_entries(history: Sequence[Mapping[str, Any]],
                      step_groups: Mapping[str, str] | None = None) -> list[Attribution]:
    """The step and group of every history entry, empty ones included, oldest first.

    Entries use the image config's keys (``created_by``); the build's size budget passes the
    engine's history (engine.HistoryEntry) in those terms, without streaming the image."""
    step_groups = dict(step_groups or {})
    seen_marker = False
    copies = 0
    out: list[Attribution] = []
    texts = [str(entry.get("created_by") or "") for entry in history]
    marks = [m.group(1) if (m := MARKER_RE.search(text)) else None for text in texts]
    for i, created in enumerate(texts):
        instr = instruction_of(created)
        step: str | None
        if (mark := marks[i]) is not None:
            seen_marker = True
            step = mark
            group = step_groups.get(mark) or _group_of(mark)
        elif not seen_marker:
            step, group = None, BASE_GROUP
        elif instr == "COPY" and (MOUNT_STUB_FILE in created.split() or marks[i + 1:i + 2] == [MOUNT_STUBS_STEP]):
            # BuildKit names the stub file; buildah writes `COPY file:<hash> in /etc/hosts`, and the
            # stubs' RUN comes right after it either way.
            step = MOUNT_STUBS_STEP
            group = step_groups.get(step, MOUNT_STUBS_GROUP)
        elif instr in ("COPY", "ADD"):
            step = f"copy-{copies}"
            copies += 1
            group = step_groups.get(step, APP_GROUP)
        elif instr == "RUN":
            step, group = None, OTHER_GROUP
        else:  # WORKDIR and friends from the meta step
            step, group = "meta", step_groups.get("meta", META_GROUP)
        out.append(Attribution(step, group, created, instr))
    return out


def attribute_layers(history: Sequence[Mapping[str, Any]], n_layers: int,
                     step_groups: Mapping[str, str] | None = None) -> list[Attribution]:
    """Map each of ``n_layers`` layers to the history entry, step and group that made it.

    ``history`` is the image config's ``history`` (entries with ``created_by`` and
    ``empty_layer``). When the history does not account for every layer (a squashed or
    hand-made image), the layers it cannot place are attributed to nothing (group ``base``)."""
    entries = zip(attribute_entries(history, step_groups), history, strict=False)
    out = [a for a, entry in entries if not entry.get("empty_layer")]
    if len(out) != n_layers:
        # Untrustworthy history: keep only what lines up from the top (the newest entries).
        pad = [Attribution(None, BASE_GROUP, "", "")] * max(0, n_layers - len(out))
        out = (pad + out)[-n_layers:] if n_layers else []
    return out


# ---------------------------------------------------------------- findings


