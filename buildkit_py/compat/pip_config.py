"""pip's configuration files (pip.conf), read the way pip reads them: the one reader for the torch
look-up's index (compat/index.py) and the uv translation of ``--pip-config`` (plan/installer.py).

As pip (``pip._internal.configuration``): INI read by ``RawConfigParser`` (no interpolation), key
names normalised (``index_url``, ``--index-url`` and ``Index-URL`` are ``index-url``), and a file
that names a section twice, or a key twice in one section, refused: pip stops with
"Configuration file could not be loaded", so imgbuild stops first, at the file's line.
``pip install`` reads ``[global]``, then ``[install]`` over it.
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from buildkit_py.errors import PipConfigError

# pip's default index-url, spelled as pip spells it: what a lock records and pip steps are given.
PYPI_SIMPLE = "https://pypi.org/simple"
SECTIONS = ("global", "install")  # what `pip install` reads, later over earlier
_INI_HINT = "pip.conf is INI: a [global] section with key = value lines"


def normalize_key(name: str) -> str:
    """A key as pip compares it: lower case, ``_`` as ``-``, no leading ``--``."""
    return name.lower().replace("_", "-").removeprefix("--")


class _Parser(configparser.RawConfigParser):
    def optionxform(self, optionstr: str) -> str:
        return normalize_key(optionstr)


@dataclass(frozen=True)
class PipConfig:
    """One pip configuration file: ``sections`` maps a section to its normalised keys and
    values (a multi-line value keeps its lines)."""

    path: str
    sections: Mapping[str, Mapping[str, str]]

    def items(self, section: str) -> list[tuple[str, str]]:
        return list(self.sections.get(section, {}).items())

    def value(self, key: str) -> str | None:
        """What ``pip install`` takes for ``key`` from this file: [install] over [global]."""
        found = None
        for section in SECTIONS:
            found = self.sections.get(section, {}).get(normalize_key(key), found)
        return found


def parse_pip_config(text: str, path: str, *, what: str = "pip configuration") -> PipConfig:
    """``text`` read as pip reads a configuration file; PipConfigError (exit 2) at the line pip
    would refuse. ``what`` names the file's role in messages (``--pip-config``). Values never
    appear in an error: an index URL may carry a token."""
    parser = _Parser()  # strict, as pip's: a duplicate section or key is an error
    try:
        parser.read_string(text, source=path)
    except configparser.DuplicateOptionError as exc:
        raise PipConfigError(f"{what} {path}:{exc.lineno}: [{exc.section}] {exc.option}: set twice "
                             "(pip refuses such a file)",
                             hint=f"keep one {exc.option} line in [{exc.section}]") from None
    except configparser.DuplicateSectionError as exc:
        raise PipConfigError(f"{what} {path}:{exc.lineno}: [{exc.section}]: the section comes twice "
                             "(pip refuses such a file)", hint=f"merge the two [{exc.section}] sections") from None
    except configparser.MissingSectionHeaderError as exc:
        raise PipConfigError(f"{what} {path}:{exc.lineno}: not a pip.conf (a line before any [section])",
                             hint=_INI_HINT) from None
    except configparser.ParsingError as exc:
        line = exc.errors[0][0] if exc.errors else "?"
        raise PipConfigError(f"{what} {path}:{line}: not a pip.conf (a line that is no key = value)",
                             hint=_INI_HINT) from None
    except configparser.Error as exc:
        raise PipConfigError(f"{what} {path}: not a pip.conf ({exc.__class__.__name__})", hint=_INI_HINT) from None
    return PipConfig(path, {s: dict(parser.items(s)) for s in parser.sections()})


def read_pip_config(path: str | Path, *, what: str = "pip configuration") -> PipConfig:
    """The file at ``path``; one that cannot be read is PipConfigError too."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PipConfigError(f"{what} {path}: cannot read it ({exc.__class__.__name__})") from None
    return parse_pip_config(text, str(path), what=what)


def pip_configs(env: Mapping[str, str], home: str) -> list[PipConfig]:
    """pip's own configuration files that exist here, in the order pip loads them (later ones win)."""
    return [read_pip_config(path) for path in pip_config_files(env, home) if os.path.exists(path)]


def pip_config_files(env: Mapping[str, str], home: str) -> list[str]:
    """pip's configuration files, in the order pip loads them (later ones win)."""
    cfg = env.get("PIP_CONFIG_FILE")
    if cfg == os.devnull:
        return []    # pip: PIP_CONFIG_FILE=os.devnull switches every config file off
    xdg_dirs = (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep)
    files = [os.path.join(d, "pip", "pip.conf") for d in reversed(xdg_dirs)] + ["/etc/pip.conf"]
    xdg_home = env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    files += [os.path.join(home, ".pip", "pip.conf"), os.path.join(xdg_home, "pip", "pip.conf")]
    venv = env.get("VIRTUAL_ENV")
    if venv:
        files.append(os.path.join(venv, "pip.conf"))
    if cfg:
        files.append(cfg)
    return files
