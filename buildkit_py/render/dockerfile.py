"""BuildPlan -> Dockerfile text, through the Jinja template. Deterministic: same plan, same bytes."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable
from functools import lru_cache
from importlib import resources
from pathlib import Path

import jinja2

from buildkit_py.plan.build_plan import SOURCE_DATE_EPOCH, STEP_MARK, BuildPlan
from buildkit_py.plan.steps import Step

TEMPLATE = "Dockerfile.j2"


def template_dir() -> Path:
    """Templates ship inside the wheel (buildkit_py/templates); in a source checkout they
    are the top-level templates/ folder."""
    packaged = resources.files("buildkit_py") / "templates"
    if packaged.is_dir():
        return Path(str(packaged))
    source = Path(__file__).resolve().parents[2] / "templates"
    if source.is_dir():
        return source
    raise FileNotFoundError("imgbuild's templates are missing from this installation")


def shell_word(value: str) -> str:
    """A single POSIX shell word. Dockerfile RUN passes the text to /bin/sh unchanged, but a
    trailing backslash would continue the instruction, so shlex's quoting is also safe there.
    A line break would end the RUN instruction inside the quotes: refused (the recipe loader
    refuses such values first; this is the backstop)."""
    text = str(value)
    if any(c in text for c in "\n\r\x00"):
        raise ValueError(f"value {text!r} spans lines; it cannot be placed in a RUN instruction")
    return shlex.quote(text)


def dockerfile_string(value: str) -> str:
    """A double-quoted Dockerfile word for ENV and LABEL: backslash, quote and $ escaped."""
    text = str(value)
    if any(c in text for c in "\n\r\x00"):
        raise ValueError(f"value {text!r} spans lines; it cannot be placed in a Dockerfile")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def dockerfile_path_value(value: str) -> str:
    """ENV value that deliberately expands $PATH; only imgbuild's own constants use it."""
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def exec_form(values: Iterable[object]) -> str:
    texts = [str(v) for v in values]
    if any("\x00" in v for v in texts):  # BuildKit cuts an exec-form argument at a NUL
        raise ValueError("exec-form values must not contain NUL characters")
    text = json.dumps(texts, ensure_ascii=False)
    if any(c in text for c in "\n\r"):
        raise ValueError("exec-form values must not contain newlines")
    return text


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # noqa: S701
        keep_trailing_newline=True,
    )
    env.filters["sh"] = shell_word
    env.filters["dq"] = dockerfile_string
    env.filters["dq_raw_path"] = dockerfile_path_value
    env.filters["json"] = exec_form
    return env


def render_dockerfile(plan: BuildPlan) -> str:
    env = _environment()
    text = env.get_template(TEMPLATE).render(
        stages=plan.stages,
        mark=STEP_MARK,
        source_date_epoch=SOURCE_DATE_EPOCH,
        recipe_name=plan.recipe.name,
        recipe_digest=plan.recipe.digest,
    )
    return text.rstrip("\n") + "\n"


_ONE_STEP = '{%- import "steps.j2" as steps with context -%}{{ steps[step.macro](step) | trim }}'


def render_step(step: Step) -> str:
    """The exact text one step places in a Dockerfile (its macro alone)."""
    return _environment().from_string(_ONE_STEP).render(step=step, mark=STEP_MARK, source_date_epoch=SOURCE_DATE_EPOCH)
