"""Command line: the parser assembled from one module per command group, and the one place
where typed errors become messages, JSON error documents and exit codes.

Each command module (``cli/build.py``, ``cli/inspect.py``...) has ``register(add)``, which adds
its subcommands with their handler; the shared option groups live in ``cli/common.py``. Command
modules import the library lazily, inside their handlers, so ``--help`` stays cheap."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any, NoReturn

from buildkit_py import __version__
from buildkit_py.cli import build, check, data, inspect, lock, matrix, recipe, registry, run, weights
from buildkit_py.cli.common import Out, wants_json
from buildkit_py.errors import ExitStatus, ImgbuildError, UsageError

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

EPILOG = """exit codes: 0 ok; 1 build, push or check failed; 2 bad recipe or usage;
3 environment (no engine, no BuildKit-capable client, registry unreachable or refusing credentials)"""


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, and writes help to our stdout."""

    stdout: IO[str] = sys.stdout

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("allow_abbrev", False)  # --password must not pass for --password-stdin
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        # main() prefixes "imgbuild: error:"; name only the subcommand here.
        where = self.prog.removeprefix("imgbuild").strip()
        raise UsageError(f"{where}: {message}" if where else message, hint=f"see `{self.prog} --help`")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            self.stdout.write(message)
        raise _Exit(status)

    def print_help(self, file: SupportsWrite[str] | None = None) -> None:
        super().print_help(self.stdout)

    def print_usage(self, file: SupportsWrite[str] | None = None) -> None:
        super().print_usage(self.stdout)


class _Exit(Exception):
    def __init__(self, status: int):
        self.status = status


def _build_parser(stdout: IO[str]) -> _Parser:
    _Parser.stdout = stdout
    fmt = argparse.RawDescriptionHelpFormatter
    p = _Parser(prog="imgbuild", description="Build slim, labelled CUDA container images from YAML recipes.",
                epilog=EPILOG, formatter_class=fmt)
    p.add_argument("--version", action="version", version=f"imgbuild {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def add(name: str, help_text: str, description: str | None = None) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=description or help_text,
                                                         epilog=EPILOG, formatter_class=fmt)
        return parser

    # The order of `imgbuild --help`.
    recipe.register_render(add)
    recipe.register_plan(add)
    build.register(add)
    lock.register(add)
    check.register(add)
    recipe.register_lint(add)
    registry.register_login(add)
    weights.register(add, EPILOG)
    inspect.register(add)
    run.register(add)
    matrix.register(add)
    registry.register_mirror(add)
    data.register(add, EPILOG)
    recipe.register_schema(add)
    return p


def main(argv: Sequence[str] | None = None, stdout: IO[str] | None = None, stderr: IO[str] | None = None,
         stdin: IO[str] | None = None) -> int:
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    out = Out(stdout, stderr, stdin or sys.stdin)
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after "--" is the container's command line (imgbuild run ... -- CMD).
    after_dashes: list[str] = []
    if "--" in argv:
        after_dashes = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    args: argparse.Namespace | None = None
    try:
        parser = _build_parser(stdout)
        args = parser.parse_args(argv)
        args.container_command = after_dashes
        if not args.command:
            parser.print_help()
            return ExitStatus.BAD_INPUT
        return int(args.handler(args, out))
    except _Exit as exc:
        return exc.status
    except ImgbuildError as exc:
        stderr.write(f"imgbuild: error: {exc.render()}\n")
        code = int(exc.exit_status)
        if _json_requested(args, argv):
            out.data({**exc.to_json(), "hint": exc.hint, "exit_code": code})
    except KeyboardInterrupt:
        stderr.write("imgbuild: interrupted\n")
        code = 130
        if _json_requested(args, argv):
            out.data({"error": "Interrupted", "message": "interrupted", "hint": None, "exit_code": code})
    except Exception as exc:  # a bug: say so briefly; the traceback only on request
        if os.environ.get("IMGBUILD_DEBUG"):
            raise
        hint = "set IMGBUILD_DEBUG=1 to see the traceback, and please report it"
        stderr.write(f"imgbuild: internal error: {exc.__class__.__name__}: {exc}\n  {hint}\n")
        code = int(ExitStatus.FAILED)
        if _json_requested(args, argv):
            out.data({"error": "InternalError", "message": f"{exc.__class__.__name__}: {exc}", "hint": hint,
                      "exit_code": code})
    return code


def _json_requested(args: argparse.Namespace | None, argv: list[str]) -> bool:
    """Errors come out as JSON whenever JSON was asked for: decided by the parsed arguments;
    only when the command line did not parse, by its tokens (--json, --format json)."""
    if args is not None:
        return wants_json(args)
    return "--json" in argv or "--format=json" in argv or any(
        a == "--format" and b == "json" for a, b in zip(argv, argv[1:], strict=False))


def entrypoint() -> None:
    sys.exit(main())
