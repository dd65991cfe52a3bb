"""What every command module shares: the output object, the option groups (defined once here,
added by each command that takes them), and the steps several commands take (plan a recipe,
read an image's labels, create the engine).

Kept light: importing it must not import the library's heavy modules (start-up, issue 12)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rich.console import Console

    from buildkit_py.engine import Engine
    from buildkit_py.plan.build_plan import BuildPlan
    from buildkit_py.text_table import Block

JSON_SCHEMA = 1  # the version of the --json contract (README, CLI reference: "The --json contract")

# register(add) in each command module: add(name, description=None) -> its subparser (the one-line
# summary is cli/main.py's COMMANDS, so `imgbuild --help` needs no command module)
AddCommand = Callable[..., argparse.ArgumentParser]


class Document(Protocol):
    """A command's result as it prints it: the --json document and the text lines, both read from
    the one frozen dataclass, so the two cannot disagree."""

    def to_json(self) -> dict[str, Any]: ...

    def lines(self) -> list[str]: ...


class Out:
    """Where a command writes: data and result lines on stdout, progress and notes on stderr;
    ``stdin`` for the one command that reads a secret from it (login). ``quiet``
    (``--progress quiet``): no notes either, only warnings and errors on stderr."""

    def __init__(self, stdout: IO[str], stderr: IO[str], stdin: IO[str] | None = None, *, quiet: bool = False):
        self.stdout, self.stderr = stdout, stderr
        self.stdin = stdin if stdin is not None else sys.stdin
        self.quiet = quiet

    def data(self, obj: dict[str, Any]) -> None:
        """One JSON document on stdout: ``"schema"`` first, then the command's keys, sorted
        at every level (the contract every --json shares)."""
        doc = {"schema": JSON_SCHEMA, **_sorted(obj)}
        self.stdout.write(json.dumps(doc, indent=2) + "\n")

    def document(self, document: Document, *, as_json: bool) -> None:
        """``document`` as --json asked: its JSON document, else its text lines."""
        if as_json:
            self.data(document.to_json())
            return
        for line in document.lines():
            self.line(line)

    def console(self) -> Console:
        """A rich console on stdout for tables (inspect, diff, the matrix summary): colour on a
        terminal, plain text in a pipe; wide, so a table's rows are not wrapped."""
        from rich.console import Console  # heavy: only for a command that prints a table

        return Console(file=self.stdout, width=160, soft_wrap=False)

    def blocks(self, blocks: list[Block]) -> None:
        """A report's lines and tables (inspect, diff) on stdout: rich tables on a terminal, aligned
        text columns in a pipe or a CI log (no box characters, no width to fit)."""
        from buildkit_py.text_table import plain_lines

        if not self.stdout.isatty():
            for line in plain_lines(blocks):
                self.line(line)
            return
        from rich.table import Table
        from rich.text import Text

        console = self.console()
        for block in blocks:
            if isinstance(block, str):
                console.print(block, markup=False, highlight=False)
                continue
            table = Table(title=block.title, title_justify="left")
            for column in block.columns:
                table.add_column(column, justify="right" if column in block.right else "left")
            for row in block.rows:  # Text: paths and commands are never markup
                table.add_row(*(Text(cell, style=block.styles.get(cell, "")) for cell in row))
            console.print(table)

    def line(self, text: str = "") -> None:
        self.stdout.write(text + "\n")

    def info(self, text: str) -> None:
        """A note on stderr (what is being done, where a file went): none with --progress quiet."""
        if self.quiet:
            return
        self.stderr.write(text + "\n")
        self.stderr.flush()

    def warn(self, text: str) -> None:
        self.stderr.write(f"warning: {text}\n")


def file_lines(text: str, *, written: Path | None) -> list[str]:
    """A file's text (a Dockerfile, a compose.yaml; it ends in a newline) as the lines that print it
    byte for byte: split on "\\n" only, not splitlines(), which also splits at U+2028 and the like.
    No lines where it was ``written`` to a file (-o) instead of stdout."""
    return [] if written else text.split("\n")[:-1]


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_sorted(v) for v in value]
    return value


def wants_json(args: argparse.Namespace) -> bool:
    """Did the parsed command line ask for JSON (--json, or matrix --format json)?"""
    return bool(getattr(args, "json", False)) or getattr(args, "format", None) == "json"


# --- option groups ----------------------------------------------------------------------------


def json_option(sp: argparse.ArgumentParser,
                help_text: str = 'one JSON document on stdout ("schema": 1; errors as JSON too)') -> None:
    sp.add_argument("--json", action="store_true", help=help_text)


def ca_option(sp: argparse.ArgumentParser, help_text: str) -> None:
    sp.add_argument("--ca-cert", type=Path, default=os.environ.get("IMGBUILD_CA_CERT") or None,
                    help=f"{help_text}; also $IMGBUILD_CA_CERT")


def pip_config_option(sp: argparse.ArgumentParser, help_text: str) -> None:
    sp.add_argument("--pip-config", type=Path, default=os.environ.get("IMGBUILD_PIP_CONFIG") or None,
                    metavar="FILE", help=f"{help_text}; also $IMGBUILD_PIP_CONFIG")


def index_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--index-url", default=None, metavar="URL",
                    help="package index to read (default: the one pip would use)")
    if not any(a.dest == "pip_config" for a in sp._actions):
        pip_config_option(sp, "pip.conf whose index-url to read")


def offline_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--offline", action="store_true", default=os.environ.get("IMGBUILD_OFFLINE") == "1",
                    help="use only the shipped compatibility data and the look-up cache; never ask the package "
                         "index about a pin newer than the data (also IMGBUILD_OFFLINE=1)")
    index_options(sp)


def network_option(sp: argparse.ArgumentParser, default: str | None, help_text: str) -> None:
    sp.add_argument("--network", default=default, help=help_text)


class _EngineKinds:
    """--engine's choices: the engine registry's kinds (``kind_names``), read when argparse checks
    a value or --help lists them. Reading the registry imports every engine module (~0.2 s): not
    when the parser is built, for commands that may need no engine (``check --cuda``, ``sbom
    IMAGE``) and for every other parse of a command that has --engine."""

    def __iter__(self) -> Iterator[str]:
        from buildkit_py.engine.registry import kind_names

        return iter(kind_names())

    def __contains__(self, kind: object) -> bool:
        return kind in list(self)


class _EngineHelp(str):
    """--engine's help, written from the registry when --help shows it: argparse expands an
    option's help as ``help % params``. (Its own text is that expansion's fallback.)"""

    def __mod__(self, params: object) -> str:
        from buildkit_py.engine.registry import kinds_help

        return f"{kinds_help()}; also $IMGBUILD_ENGINE"


def engine_option(sp: argparse.ArgumentParser) -> None:
    """--engine KIND on every command that uses an engine (build, test, run, inspect, diff, check,
    lock, sbom), with the same choices and meaning: the kind of engine to use, else
    $IMGBUILD_ENGINE, else auto (``reading_engine``, ``select_engine``)."""
    for flag, help_text in (("--engine", _EngineHelp("engine kind (%(choices)s); also $IMGBUILD_ENGINE")),
                            # its older name, still taken so scripts keep working; one word in --help
                            ("--backend", argparse.SUPPRESS)):
        option = sp.add_argument(flag, dest="engine", default=None, help=help_text)
        option.choices = _EngineKinds()  # set here: add_argument would read them at once (it formats the option)


def engine_options(sp: argparse.ArgumentParser) -> None:
    """--engine, and --builder for the commands that build."""
    engine_option(sp)
    sp.add_argument("--builder", help="buildx builder to use (remote or Kubernetes BuildKit)")


def progress_option(sp: argparse.ArgumentParser, what: str) -> None:
    sp.add_argument("--progress", choices=["auto", "plain", "quiet"], default="auto",
                    help=f"{what} on stderr: auto (live on a terminal, plain lines otherwise), plain, quiet")


def tag_options(sp: argparse.ArgumentParser, tag_help: str, registry_help: str) -> None:
    sp.add_argument("--tag", action="append", default=[], help=tag_help)
    sp.add_argument("--registry", help=registry_help)


def positive(text: str) -> float:
    """argparse type for rates (Mbit/s, MB/s): a number above 0, checked before any work."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:  # also NaN
        raise argparse.ArgumentTypeError(f"{text} must be above 0")
    return value


def rate_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--bandwidth", type=positive, default=1000, metavar="MBIT",
                    help="link speed for the pull-time estimate, Mbit/s (default 1000)")
    sp.add_argument("--unpack-rate", type=positive, default=None, metavar="MB/s",
                    help="add unpacking at this rate (MB/s of layer tar) to the pull time, each layer as its download "
                         "ends (the cold-start model); default: network only")


# --- steps several commands take --------------------------------------------------------------


def is_recipe(target: str) -> bool:
    path = Path(target)
    return path.suffix in {".yaml", ".yml"} or path.is_file()


def plan_recipe(args: argparse.Namespace, recipe_path: Path, out: Out | None = None) -> BuildPlan:
    """The pipeline's plan of a recipe, with this command's options: its tags and registry, and the
    look-up of a pin newer than the shipped data (--offline, --index-url, --pip-config)."""
    from buildkit_py import pipeline
    from buildkit_py.cli.settings import settings_of
    from buildkit_py.recipe.model import load_recipe, with_platforms

    out = Out(sys.stdout, sys.stderr) if out is None else out
    recipe = with_platforms(load_recipe(recipe_path), getattr(args, "platform", None) or ())
    lookup = settings_of(args).lookup(args, offline=getattr(args, "offline", True))
    return pipeline.plan_recipe(recipe, lookup=lookup, tags=tuple(getattr(args, "tag", []) or ()),
                                registry=getattr(args, "registry", None), warn=out.warn, note=out.info)


def reading_engine(args: argparse.Namespace) -> Engine:
    """The engine for a command that reads images (inspect, diff, run, check, lock): created
    once per command from its settings (--engine where it has one, else $IMGBUILD_ENGINE:
    cli/settings.py) and the engine kind's own variables ($IMGBUILD_DOCKER, $DOCKER_HOST),
    then passed down. Any client will do for reading, so this never fails; the engine is only
    reached when first used. Commands call it once and pass the engine down."""
    from buildkit_py.cli.settings import settings_of
    from buildkit_py.engine import engine_for_reading

    return engine_for_reading(settings_of(args).engine)


def image_labels(engine: Engine | None, ref: str) -> tuple[dict[str, str], dict[str, str]]:
    """Labels and env of an image: from the local engine if it has it, else from its registry
    (manifest and config blob only, no layers pulled)."""
    config = image_config(engine, ref)
    return config.get("Labels") or {}, dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)


def image_config(engine: Engine | None, ref: str) -> dict[str, Any]:
    """The ``config`` of an image (Labels, Env, Entrypoint, Cmd...): from the local engine if it
    has it, else from its registry (manifest and config blob only, no layers pulled)."""
    from buildkit_py.errors import ImgbuildError

    try:
        info = engine.image(ref) if engine is not None else None
    except ImgbuildError:
        info = None  # no engine here: ask the registry
    if info is not None:
        return dict(info.config)
    from buildkit_py import oci
    from buildkit_py.errors import ImageMissing, ManifestNotFound

    try:
        return dict(oci.read_image_config(ref).runtime)
    except ManifestNotFound as exc:
        raise ImageMissing(f"no image {ref}: not in the local engine, and {exc.message}",
                           hint="check the name and tag (`docker images`), or build and push it first "
                                "(`imgbuild build RECIPE --push`)") from None
