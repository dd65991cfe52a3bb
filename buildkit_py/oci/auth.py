"""Registry credentials: find them (environment, docker config, credential helpers) and store
them the way the docker CLI does (``login`` checks them against a registry first).

Resolution order for a registry host, first hit wins:

1. ``IMGBUILD_REGISTRY_USER`` + ``IMGBUILD_REGISTRY_PASSWORD`` (CI). With
   ``IMGBUILD_REGISTRY_HOST`` set they apply to that host only, else to every host.
2. The docker config (``$DOCKER_CONFIG/config.json``, else ``~/.docker/config.json``):
   ``credHelpers[host]``, then ``credsStore``, then the inline ``auths`` entry (base64
   ``auth`` or an ``identitytoken``).

Secrets never reach argv, logs or reprs: helpers get the host (``get``) or the JSON record
(``store``) on stdin, ``Credentials`` hides its password, and nothing here prints.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from buildkit_py.errors import AuthenticationError, CredentialHelperError
from buildkit_py.files import write_atomic
from buildkit_py.reference import DOCKER_HUB, DOCKER_HUB_LOGIN_HOSTS

ENV_USER = "IMGBUILD_REGISTRY_USER"
ENV_PASSWORD = "IMGBUILD_REGISTRY_PASSWORD"  # noqa: S105 (the name of a variable, not a secret)
ENV_HOST = "IMGBUILD_REGISTRY_HOST"

# Docker Hub is filed under its legacy index URL in docker configs and helpers.
DOCKER_HUB_KEY = "https://index.docker.io/v1/"
# The helper protocol's answer for a host it has nothing for.
_HELPER_NOT_FOUND = "credentials not found"
_HELPER_TIMEOUT_S = 60


@dataclass(frozen=True)
class Credentials:
    """A username and secret for one registry. ``source`` says where they came from
    (``env``, ``config:/path``, ``credHelper:name``, ``credsStore:name``, ``login``).

    ``identity_token`` is set instead of ``password`` for OAuth2 refresh tokens (docker's
    ``identitytoken`` / helper username ``<token>``); the bearer flow exchanges it.
    """

    username: str
    password: str = field(repr=False)
    source: str = ""
    identity_token: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:  # explicit, so no future field leaks a secret by default
        return f"Credentials(username={self.username!r}, password='***', source={self.source!r})"

    __str__ = __repr__


def normalize_host(registry: str) -> str:
    """``https://host:port/v2/`` or ``host/`` -> ``host:port``; Docker Hub -> ``docker.io``."""
    host = registry.strip()
    for prefix in ("https://", "http://"):
        host = host.removeprefix(prefix)
    host = host.split("/", 1)[0].lower()
    if host in DOCKER_HUB_LOGIN_HOSTS:
        return DOCKER_HUB
    return host


def config_key(registry: str) -> str:
    """The key the docker CLI files a registry under in ``auths`` and helpers."""
    host = normalize_host(registry)
    return DOCKER_HUB_KEY if host == DOCKER_HUB else host


def docker_config_path() -> Path:
    base = os.environ.get("DOCKER_CONFIG")
    return (Path(base) if base else Path.home() / ".docker") / "config.json"


def load_docker_config(path: Path | None = None) -> dict[str, Any]:
    path = path or docker_config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise AuthenticationError(f"cannot read docker config {path}: {exc.strerror}") from exc
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AuthenticationError(
            f"docker config {path} is not valid JSON (line {exc.lineno})",
            hint="fix or remove the file, then log in again",
        ) from exc
    if not isinstance(data, dict):
        raise AuthenticationError(f"docker config {path} is not a JSON object")
    return data


# ---------------------------------------------------------------- resolution


def resolve(registry: str, *, env: Mapping[str, str] | None = None,
            config_path: Path | None = None) -> Credentials | None:
    """Credentials for ``registry`` (a host, ``host:port`` or URL), or None (anonymous)."""
    env = os.environ if env is None else env
    host = normalize_host(registry)
    creds = _from_env(host, env)
    if creds:
        return creds
    return _from_docker_config(host, config_path or docker_config_path())


def _from_env(host: str, env: Mapping[str, str]) -> Credentials | None:
    user, password = env.get(ENV_USER), env.get(ENV_PASSWORD)
    if not user or password is None:
        return None
    scope = env.get(ENV_HOST)
    if scope and normalize_host(scope) != host:
        return None
    return Credentials(user, password, "env")


def _from_docker_config(host: str, path: Path) -> Credentials | None:
    config = load_docker_config(path)
    key = config_key(host)
    helpers = config.get("credHelpers") or {}
    helper = helpers.get(key) or helpers.get(host)
    if helper:
        creds = helper_get(helper, key, source=f"credHelper:{helper}")
        if creds:
            return creds
    store = config.get("credsStore")
    if store:
        creds = helper_get(store, key, source=f"credsStore:{store}")
        if creds:
            return creds
    entry = _find_auths_entry(config.get("auths") or {}, host)
    if entry:
        return _decode_auths_entry(entry, f"config:{path}")
    return None


def _find_auths_entry(auths: Mapping[str, Any], host: str) -> dict[str, Any] | None:
    # Keys are written as "host", "https://host", "http://host/v1/" and so on.
    for key, entry in auths.items():
        if isinstance(entry, dict) and normalize_host(key) == host:
            return entry
    return None


def _decode_auths_entry(entry: Mapping[str, Any], source: str) -> Credentials | None:
    token = entry.get("identitytoken")
    username, password = entry.get("username") or "", entry.get("password") or ""
    if entry.get("auth"):
        try:
            decoded = base64.b64decode(entry["auth"], validate=False).decode()
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise AuthenticationError(
                f"the 'auth' value in {source.removeprefix('config:')} is not valid base64") from exc
        username, sep, password = decoded.partition(":")
        if not sep:
            raise AuthenticationError(
                f"the 'auth' value in {source.removeprefix('config:')} has no 'user:password' form")
    if token:
        return Credentials(username or "<token>", "", source, identity_token=token)
    if username:
        return Credentials(username, password, source)
    return None


# ---------------------------------------------------------------- credential helpers


def _helper_command(name: str, action: str) -> list[str]:
    return [f"docker-credential-{name}", action]


def helper_get(name: str, server: str, *, source: str | None = None) -> Credentials | None:
    """Run ``docker-credential-<name> get`` with ``server`` on stdin."""
    out = _run_helper(name, "get", server)
    if out is None:
        return None
    try:
        record = json.loads(out)
        username, secret = record.get("Username", ""), record.get("Secret", "")
    except (json.JSONDecodeError, AttributeError) as exc:
        raise CredentialHelperError(f"docker-credential-{name} get returned something that is not JSON") from exc
    if not secret:
        return None
    source = source or f"credsStore:{name}"
    if username == "<token>":
        return Credentials(username, "", source, identity_token=secret)
    return Credentials(username, secret, source)


def helper_store(name: str, server: str, username: str, secret: str) -> None:
    payload = json.dumps({"ServerURL": server, "Username": username, "Secret": secret})
    _run_helper(name, "store", payload)


def _run_helper(name: str, action: str, stdin: str) -> str | None:
    cmd = _helper_command(name, action)
    try:
        proc = subprocess.run(cmd, check=False, input=stdin, capture_output=True, text=True, timeout=_HELPER_TIMEOUT_S)
    except FileNotFoundError as exc:
        raise CredentialHelperError(
            f"credential helper {cmd[0]} is configured in {docker_config_path()} but not on PATH",
            hint=f"install {cmd[0]} or remove it from the docker config",
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise CredentialHelperError(f"{cmd[0]} {action} did not answer within {_HELPER_TIMEOUT_S}s") from exc
    if proc.returncode != 0:
        # The helper protocol answers "credentials not found in native keychain" on stdout.
        message = (proc.stdout.strip() or proc.stderr.strip())
        if action == "get" and _HELPER_NOT_FOUND in message.lower():
            return None
        # A helper's error text is its own; it does not echo the secret we sent on stdin.
        raise CredentialHelperError(f"{cmd[0]} {action} failed (exit {proc.returncode}): {message[:300]}")
    return proc.stdout


def write_docker_config(config: Mapping[str, Any], path: Path | None = None) -> Path:
    """Write atomically (temp file in the same dir, fsync, rename), mode 0600 from the start."""
    path = path or docker_config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    return write_atomic(path, json.dumps(config, indent="\t") + "\n", private=True)
