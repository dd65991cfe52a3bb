"""Which program installs the image's Python packages: uv or pip (recipe key ``build.installer``).

uv installs the same wheels several times faster than pip (issue 15: 20 s against 129 s for a
torch stack, 52 s with bytecode compiled as pip does). It is not shipped: every uv step mounts a
cache directory (``UV_HOME``) holding the pinned uv, which the first step of a build fills from
the Python registry with the image's own pip (``--require-hashes``: the wheel's sha256 is pinned
here), so uv never lands in a layer and a build needs nothing besides the Python registry.

pip stays selectable (``build.installer: pip``), and builds from source (``pip wheel``) always use
pip: uv has no command that builds a wheel from a requirement.

uv reads no pip.conf. A ``--pip-config`` file is translated here into the ``UV_*`` variables a uv
step reads (``uv_env_from_pip_config``); the result reaches the build as a secret, like the
pip.conf itself, never as a file of the image. A key uv has no equivalent for is an error that
names it: ignoring it would install something other than what the pip.conf asks for.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from buildkit_py.compat.pip_config import SECTIONS as PIP_SECTIONS
from buildkit_py.compat.pip_config import PipConfig, parse_pip_config, read_pip_config
from buildkit_py.errors import UsageError
from buildkit_py.recipe.model import InstallerName

if TYPE_CHECKING:  # build_plan imports this module
    from buildkit_py.plan.build_plan import BuildPlan, Stage

PIP = InstallerName.PIP
UV = InstallerName.UV
DEFAULT_INSTALLER = UV  # pip by `build.installer: pip`

# uv from the Python registry: https://pypi.org/project/uv/0.13.9/ (the newest release on
# 2026-12-03), sha256 of its linux wheels as the index lists them (x86_64, aarch64 old and new glibc).
UV_VERSION = "0.13.9"
UV_WHEEL_SHA256 = (
    "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19",  # manylinux_2_17_x86_64
    "5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe",  # manylinux_2_17_aarch64
    "ecb6028d79dc96fbeafffe5c8af62a7099487ebc05a701e76714eebcffd06375",  # manylinux_2_28_aarch64
)
UV_HOME = "/run/imgbuild-uv"  # the cache mount that holds uv; beside /run/secrets, never in a layer
UV_CACHE = "/root/.cache/uv"  # uv's download cache, a cache mount like pip's
PIP_CACHE = "/root/.cache/pip"
UV_ENV_SECRET_ID = "uvenv"  # noqa: S105 - the id of the secret, not a secret


@dataclass(frozen=True)
class Installer:
    """What a pip step installs with, as the template places it."""

    name: InstallerName
    version: str | None = None  # uv's pinned release
    requirement: str | None = None  # uv's requirement line, hashes included

    @property
    def is_uv(self) -> bool:
        return self.name == UV

    @property
    def cache_dir(self) -> str:
        """Its download cache, a cache mount."""
        return UV_CACHE if self.is_uv else PIP_CACHE

    @property
    def root(self) -> str:
        """The cache mount that holds uv itself."""
        return UV_HOME

    @property
    def env_secret(self) -> str:
        """The secret holding the pip.conf translated for uv."""
        return UV_ENV_SECRET_ID

    @property
    def stub_dirs(self) -> tuple[str, ...]:
        """Mount points a step of this installer makes BuildKit create (see MountStubsStep)."""
        return (UV_CACHE, UV_HOME) if self.is_uv else (PIP_CACHE,)

    @property
    def stub_files(self) -> tuple[str, ...]:
        return (f"/run/secrets/{UV_ENV_SECRET_ID}",) if self.is_uv else ()

    @property
    def home(self) -> str:
        """The folder (inside the cache mount) this release of uv is installed into; the step adds
        ``-$(uname -m)``: the cache mount is shared by every platform a build makes, and an x86_64
        uv found there by an arm64 step does not run ("uv: not found", issue 24: 3)."""
        return f"{UV_HOME}/{self.version}"

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}" if self.version else self.name


PIP_INSTALLER = Installer(PIP)
UV_INSTALLER = Installer(UV, UV_VERSION, f"uv=={UV_VERSION} " + " ".join(f"--hash=sha256:{h}" for h in UV_WHEEL_SHA256))


def installer_for(name: InstallerName | None) -> Installer:
    """The installer a recipe's ``build.installer`` names (None: the default)."""
    return UV_INSTALLER if (name or DEFAULT_INSTALLER) == UV else PIP_INSTALLER


# --- pip.conf -> uv -------------------------------------------------------------------------

# pip.conf key -> uv variable, for keys whose value carries over as it is (lists joined by spaces).
_UV_VARS = {
    "index-url": "UV_INDEX_URL",
    "extra-index-url": "UV_EXTRA_INDEX_URL",
    "trusted-host": "UV_INSECURE_HOST",
    "timeout": "UV_HTTP_TIMEOUT",
    "default-timeout": "UV_HTTP_TIMEOUT",
    "retries": "UV_HTTP_RETRIES",
    "find-links": "UV_FIND_LINKS",
}
_PROXY_VARS = ("HTTPS_PROXY", "HTTP_PROXY")
# Keys that change only pip's own output or prompts: nothing uv installs depends on them.
_NO_EFFECT = frozenset({
    "disable-pip-version-check", "no-warn-script-location", "progress-bar", "quiet", "verbose",
    "no-input", "no-color", "root-user-action", "yes", "log", "log-file", "exists-action",
    "no-python-version-warning", "cache-dir",
})
_TRUE = frozenset({"1", "true", "yes", "on"})


def _words(value: str) -> list[str]:
    return value.split()


def _translate_key(key: str, value: str, *, ca_cert: bool) -> dict[str, str] | None:
    """The uv variables for one pip.conf key; {} when the key changes nothing uv does; None
    when uv has no equivalent."""
    if key in _UV_VARS:
        out = {_UV_VARS[key]: " ".join(_words(value))}
        if key == "extra-index-url":  # pip takes the best match over all indexes; uv's default is the first
            out["UV_INDEX_STRATEGY"] = "unsafe-best-match"
        return out
    if key == "proxy":
        return {v: value.strip() for v in _PROXY_VARS}
    if key == "pre":
        return {"UV_PRERELEASE": "allow"} if value.strip().lower() in _TRUE else {}
    if key == "no-cache-dir":
        return {"UV_NO_CACHE": "1"} if value.strip().lower() in _TRUE else {}
    if key in {"only-binary", "no-binary"}:
        names = sorted(set(_words(value.replace(",", " "))))
        var = "UV_NO_BUILD" if key == "only-binary" else "UV_NO_BINARY"
        return {var: "1"} if ":all:" in names else {f"{var}_PACKAGE": " ".join(n for n in names if n != ":none:")}
    if key == "cert" and ca_cert:  # a path on this machine; the build has the --ca-cert bundle instead
        return {}
    if key in _NO_EFFECT:
        return {}
    return None


def uv_env_from_pip_config(text: str, path: str = "pip.conf", *, ca_cert: bool = False) -> dict[str, str]:
    """The ``UV_*`` (and proxy) variables that make uv do what pip does with this pip.conf:
    [global], then [install] over it, as pip reads them (compat/pip_config.py: PipConfigError for
    a file pip would refuse). Raises UsageError naming every key uv cannot honour (file, section, key)."""
    return uv_env_of(parse_pip_config(text, path, what="--pip-config"), ca_cert=ca_cert)


def uv_env_of(config: PipConfig, *, ca_cert: bool = False) -> dict[str, str]:
    """``uv_env_from_pip_config`` of a file already read."""
    path = config.path
    env: dict[str, str] = {}
    unsupported: list[str] = []
    for section in PIP_SECTIONS:
        for key, value in config.items(section):
            out = _translate_key(key, value, ca_cert=ca_cert)
            if out is None:
                unsupported.append(f"[{section}] {key}")
            else:
                env.update(out)
    if unsupported:
        hint = ("build with `build.installer: pip` to have pip read it, or remove the key"
                + ("; pass a CA bundle with --ca-cert" if any(k.endswith(" cert") for k in unsupported) else ""))
        raise UsageError(f"--pip-config {path}: uv has no equivalent for {', '.join(unsupported)}", hint=hint)
    return dict(sorted(env.items()))


def uv_env_file(env: dict[str, str]) -> str:
    """The translated variables as a file a uv step sources (``. /run/secrets/uvenv``)."""
    for name, value in env.items():
        if any(c in value for c in "\n\r\x00"):
            raise UsageError(f"--pip-config: the value for {name} spans lines")
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())


def read_pip_config_for_uv(path: Path, *, ca_cert: bool) -> str:
    """The secret file text a uv build gets for ``--pip-config PATH``."""
    return uv_env_file(uv_env_of(read_pip_config(path, what="--pip-config"), ca_cert=ca_cert))


def uses_uv(stages: tuple[Stage, ...]) -> bool:
    """Whether any step of these stages (a BuildPlan's) installs with uv."""
    return any(getattr(step, "installer", PIP_INSTALLER).is_uv for stage in stages for step in stage.steps)


def uv_env_for(plan: BuildPlan, pip_config: Path | None, *, ca_cert: bool) -> str | None:
    """The uvenv secret's text for a build of ``plan`` with ``--pip-config``; None when the
    build has no pip.conf or no uv step. Raises UsageError before the build for a key uv cannot
    honour, and PipConfigError for a file pip would refuse, whichever installer reads it."""
    if pip_config is None:
        return None
    config = read_pip_config(pip_config, what="--pip-config")
    return uv_env_file(uv_env_of(config, ca_cert=ca_cert)) if uses_uv(plan.stages) else None
