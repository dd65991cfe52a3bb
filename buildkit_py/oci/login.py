"""``imgbuild login``: check a username and password against a registry, then store them
where the docker CLI would (credential helper, else the docker config)."""

from __future__ import annotations

import base64
from dataclasses import dataclass

from buildkit_py.errors import AuthenticationError
from buildkit_py.oci.auth import (
    Credentials,
    config_key,
    docker_config_path,
    helper_store,
    load_docker_config,
    normalize_host,
    write_docker_config,
)
from buildkit_py.oci.transport import Client


@dataclass(frozen=True)
class LoginResult:
    registry: str
    username: str
    stored_in: str  # "credsStore:<name>", "credHelper:<name>" or the config file path


def login(registry: str, user: str, password_from_stdin: str, *, client=None) -> LoginResult:
    """Check ``user``/password against ``registry``'s ``/v2/`` (basic or bearer flow), then
    store them: through the configured credential helper, else inline in ``auths`` of the
    docker config (file mode 0600, written atomically).

    The CLI reads the password from stdin and passes it here; it never comes from argv.
    Raises AuthenticationError when the registry refuses them (nothing is stored then).
    """
    password = password_from_stdin.rstrip("\r\n")
    if not user or not password:
        raise AuthenticationError("login needs a username and a non-empty password")
    host = normalize_host(registry)
    creds = Credentials(user, password, "login")
    try:
        (client or Client()).check_login(host, creds)
    except AuthenticationError as exc:  # its hint says "run `imgbuild login`": that is what failed
        raise AuthenticationError(exc.message,
                                  hint="check the username and password; nothing was stored") from None

    path = docker_config_path()
    config = load_docker_config(path)
    key = config_key(host)
    helper = (config.get("credHelpers") or {}).get(key)
    store = config.get("credsStore")
    if helper or store:
        name = str(helper or store)
        helper_store(name, key, user, password)
        if not helper:
            # What the docker CLI writes with a credsStore: an empty placeholder entry.
            config.setdefault("auths", {})[key] = {}
            write_docker_config(config, path)
        return LoginResult(host, user, f"{'credHelper' if helper else 'credsStore'}:{name}")
    auths = config.setdefault("auths", {})
    for old in [k for k in auths if normalize_host(k) == host and k != key]:
        del auths[old]  # one entry per registry
    auths[key] = {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}
    write_docker_config(config, path)
    return LoginResult(host, user, str(path))
