"""Command line: the parser assembled from one module per command group, and the one place
where typed errors become messages, JSON error documents and exit codes.

Each command module (``cli/build.py``, ``cli/inspect.py``...) has a ``register(add)`` per
command, which adds its arguments and handler; the shared option groups live in
``cli/common.py``. Only the invoked command's module is imported, and only its parser is built
(``COMMANDS`` holds every command's one-line summary for ``imgbuild --help``); command modules
import the library inside their handlers. ``--version`` and ``--help`` load no more than this
module and argparse (issue 32: within 3x of a bare interpreter; tests/test_startup.py pins it):
errors, typing, signal and threading are imported when a command runs or fails."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from buildkit_py import __version__

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (~2 ms of start-up)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import IO, Any, NoReturn

    from _typeshed import SupportsWrite

    from buildkit_py.cli.common import Out

EPILOG = """exit codes: 0 ok; 1 build, push or check failed; 2 bad recipe or usage;
3 environment (no engine, no BuildKit-capable client, registry unreachable or refusing credentials);
130 interrupted (Ctrl-C), 143 terminated (SIGTERM): the running build stopped, temporary files removed"""

# name -> (one-line summary, "module:register function" in buildkit_py.cli), in `--help` order.
COMMANDS: dict[str, tuple[str, str]] = {
    "render": ("print the Dockerfile a recipe renders to (byte-identical for the same recipe)",
               "recipe:register_render"),
    "plan": ("show the resolved plan: CUDA, driver contract, stages, labels, tags, warnings", "recipe:register_plan"),
    "build": ("build a recipe with BuildKit, optionally push it", "build:register"),
    "test": ("run a built image's tests: its labels against its content, the import of each pin, the recipe's "
             "test: commands", "test:register"),
    "lock": ("pin every base image by digest and every pip package (transitive ones too) by hash", "lock:register"),
    "check": ("check a host driver against an image, a recipe or a CUDA version", "check:register"),
    "lint": ("recipe findings (unpinned apt, weights in copy, devel unused, CUDA twice) plus hadolint",
             "recipe:register_lint"),
    "login": ("store registry credentials (password from stdin, never argv)", "registry:register_login"),
    "weights": ("model weights as OCI artifacts (CNCF ModelPack), kept out of images", "weights:register"),
    "inspect": ("layers, sizes, pull time and findings (weights, caches, compilers, CUDA twice) of an image",
                "inspect:register_inspect"),
    "diff": ("what a node holding IMAGE_A must download for IMAGE_B: per layer step, bytes, shared or new",
             "inspect:register_diff"),
    "run": ("pull an image's weights onto host volumes, then run it with GPUs and the weights read-only "
            "(imgbuild run TARGET [options] -- COMMAND)", "run:register_run"),
    "compose": ("write a compose.yaml: GPU reservation, weights volumes, the recipe's extra services",
                "run:register_compose"),
    "matrix": ("expand a recipe's matrix: variants kept and dropped (with reasons), a CI matrix or a bake file",
               "matrix:register"),
    "sbom": ("the SBOM (CycloneDX) attached to a pushed image, or one made from an image's layers",
             "sbom:register"),
    "sign": ("sign a pushed image (its index and each platform) in cosign's format, or make a key pair",
             "sign:register_sign"),
    "verify": ("verify an image's cosign signature with a public key (exit 1: unsigned or another key)",
               "sign:register_verify"),
    "mirror": ("copy an image (e.g. an nvidia/cuda tag) into a private registry and print its digest",
               "registry:register_mirror"),
    "data": ("the compatibility data: its date and what the look-up cache adds; refresh it from the index",
             "data:register"),
    "schema": ("print the recipe's JSON Schema, for editors that complete and check YAML", "recipe:register_schema"),
}


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, and writes help to our stdout."""

    stdout: IO[str] = sys.stdout

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("allow_abbrev", False)  # --password must not pass for --password-stdin
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        from buildkit_py.errors import UsageError

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


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter, given the terminal's width as shutil.get_terminal_size() finds it,
    less 2 (what argparse does), without importing shutil: it loads zlib, bz2 and lzma, ~1.5 ms
    of `imgbuild --help`."""

    def __init__(self, prog: str, **kwargs: Any):
        kwargs.setdefault("width", _terminal_columns() - 2)
        super().__init__(prog, **kwargs)


def _terminal_columns() -> int:
    """shutil.get_terminal_size().columns: $COLUMNS, else stdout's terminal, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):  # no stdout, closed, or not a terminal
            columns = 0
    return columns or 80


def _build_parser(stdout: IO[str], commands: Sequence[str] = ()) -> _Parser:
    """The parser, with the arguments of ``commands`` (the invoked one; a test asks for all);
    every other command is only listed, by its summary: an argparse parser costs ~0.3 ms, and
    building all 18 was a fifth of `imgbuild --help`. Its entry in ``choices`` is None, so an
    unknown command's error still names every command."""
    _Parser.stdout = stdout
    fmt = _Formatter
    p = _Parser(prog="imgbuild", description="Build slim, labelled CUDA container images from YAML recipes.",
                epilog=EPILOG, formatter_class=fmt)
    p.add_argument("--version", action="version", version=f"imgbuild {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def add(name: str, description: str | None = None) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = sub.add_parser(name, help=COMMANDS[name][0],
                                                         description=description or COMMANDS[name][0],
                                                         epilog=EPILOG, formatter_class=fmt)
        return parser

    for name, (summary, where) in COMMANDS.items():
        if name not in commands:
            # what add_parser(name, help=summary) lists in --help, without the parser
            sub._choices_actions.append(sub._ChoicesPseudoAction(name, (), summary))
            sub.choices[name] = None  # type: ignore[assignment]
            continue
        module, function = where.split(":")
        register = getattr(importlib.import_module(f"buildkit_py.cli.{module}"), function)
        register(add)
    return p


def _invoked_command(argv: Sequence[str]) -> list[str]:
    """The command named on the command line: the first word that is not an option (the
    top-level parser has no option that takes a value)."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return [first] if first in COMMANDS else []


def main(argv: Sequence[str] | None = None, stdout: IO[str] | None = None, stderr: IO[str] | None = None,
         stdin: IO[str] | None = None) -> int:
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after "--" is the container's command line (imgbuild run ... -- CMD).
    after_dashes: list[str] = []
    if "--" in argv:
        after_dashes = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    args: argparse.Namespace | None = None
    previous: dict[int, Any] = {}
    try:
        parser = _build_parser(stdout, _invoked_command(argv))
        args = parser.parse_args(argv)
        args.container_command = after_dashes
        from buildkit_py.cli.settings import Settings

        args.settings = Settings.from_args(args, os.environ)  # read once; the layers below get values
        if not args.command:
            from buildkit_py.errors import ExitStatus

            parser.print_help()
            return ExitStatus.BAD_INPUT
        previous = _raise_on_signals()
        return int(args.handler(args, _out(stdout, stderr, stdin, quiet=getattr(args, "progress", None) == "quiet")))
    except _Exit as exc:
        return exc.status
    except BrokenPipeError:
        # The reader went away (`imgbuild plan ... | head`): stop quietly, as cat does, and keep
        # Python from failing again when it flushes stdout at exit.
        _silence_stdout(stdout)
        return 128 + 13  # SIGPIPE's status, what a shell reports for a writer whose pipe closed
    except KeyboardInterrupt as exc:  # errors.Interrupted from the handlers below, or a bare Ctrl-C
        import signal

        name = signal.Signals(getattr(exc, "signum", signal.SIGINT)).name
        stopped = list(getattr(exc, "stopped", []))
        message = f"interrupted by {name}" + (f": stopped {'; '.join(stopped)}; its temporary files removed"
                                               if stopped else "")
        stderr.write(f"imgbuild: {message}\n")
        code = 128 + signal.Signals[name]
        document = {"error": "Interrupted", "message": message, "hint": None, "exit_code": code, "signal": name,
                    "stopped": stopped}
    except Exception as exc:
        from buildkit_py.errors import ExitStatus, ImgbuildError  # here, not at start-up (see above)

        if isinstance(exc, ImgbuildError):
            stderr.write(f"imgbuild: error: {exc.render()}\n")
            code = int(exc.exit_status)
            document = {**exc.to_json(), "hint": exc.hint, "exit_code": code}
        else:  # a bug: say so briefly; the traceback only on request
            if os.environ.get("IMGBUILD_DEBUG"):
                raise
            hint = "set IMGBUILD_DEBUG=1 to see the traceback, and please report it"
            stderr.write(f"imgbuild: internal error: {exc.__class__.__name__}: {exc}\n  {hint}\n")
            code = int(ExitStatus.FAILED)
            document = {"error": "InternalError", "message": f"{exc.__class__.__name__}: {exc}", "hint": hint,
                        "exit_code": code}
    finally:
        _restore_signals(previous)
    if _json_requested(args, argv):
        _out(stdout, stderr, stdin).data(document)
    return code


def _silence_stdout(stdout: IO[str]) -> None:
    if stdout is sys.stdout:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _raise_on_signals() -> dict[int, Any]:
    """SIGINT and SIGTERM raise errors.Interrupted in the main thread while a command runs, so a CI
    cancel (SIGTERM) unwinds like Ctrl-C: the build's child stopped, temporary files removed, one
    line, exit 128+N. (Python's default for SIGTERM is to die on the spot: exit 143, no message,
    the `docker build` still running and its temporary Dockerfile, context and iid files left.)
    Returns the handlers to put back; none are set outside the main thread (in-process tests)."""
    import signal
    import threading

    from buildkit_py.errors import Interrupted

    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    return {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}


def _restore_signals(previous: dict[int, Any]) -> None:
    if not previous:  # none were set: --help, --version, a usage error
        return
    import signal

    for signum, handler in previous.items():
        signal.signal(signum, handler)


def _out(stdout: IO[str], stderr: IO[str], stdin: IO[str] | None, *, quiet: bool = False) -> Out:
    from buildkit_py.cli.common import Out  # with a command only: --help and --version skip it

    return Out(stdout, stderr, stdin or sys.stdin, quiet=quiet)


def _json_requested(args: argparse.Namespace | None, argv: list[str]) -> bool:
    """Errors come out as JSON whenever JSON was asked for: decided by the parsed arguments;
    only when the command line did not parse, by its tokens (--json, --format json)."""
    if args is not None:
        from buildkit_py.cli.common import wants_json  # as in _out

        return wants_json(args)
    return "--json" in argv or "--format=json" in argv or any(
        a == "--format" and b == "json" for a, b in zip(argv, argv[1:], strict=False))


def entrypoint() -> None:
    sys.exit(main())
