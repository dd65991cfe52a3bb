"""``imgbuild login``: check a username and password against a registry, then store them
where the docker CLI would (credential helper, else the docker config). ``check_push_access``:
may the credentials found push to a repository (``build --push`` asks before it builds)?"""

from __future__ import annotations

import base64
from dataclasses import dataclass

from buildkit_py.errors import AuthenticationError, RegistryError
from buildkit_py.oci.auth import (
    Credentials,
    config_key,
    docker_config_path,
    helper_store,
    load_docker_config,
    normalize_host,
    write_docker_config,
)
from buildkit_py.oci.blobs import start_upload
from buildkit_py.oci.transport import Client, push_scope
from buildkit_py.reference import Reference, as_reference


@dataclass(frozen=True)
class LoginResult:
    registry: str
    username: str
    stored_in: str  # "credsStore:<name>", "credHelper:<name>" or the config file path


def login(registry: str, user: str, password_from_stdin: str, *, client: Client | None = None) -> LoginResult:
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


def check_push_access(ref: Reference | str, *, client: Client | None = None) -> None:
    """Ask ``ref``'s registry whether the credentials found for it (``auth.resolve``: the same
    ones a push uses) may push to its repository, without pushing anything: open a blob upload
    session, the first step of every push, which the registry grants only to credentials that
    may push there (basic or token flow, push scope), then cancel it.

    Raises AuthenticationError (credentials missing, refused, or without push permission) or
    RegistryUnreachable, both exit 3; another RegistryError when the registry answers oddly.
    """
    ref = as_reference(ref)
    client = client or Client()
    location, mounted = start_upload(ref, client=client)
    if mounted or not location:
        return
    try:  # the session holds nothing yet; a registry that cannot cancel one lets it expire
        client.request("DELETE", ref.api_host, location, scope=push_scope(ref.repository),
                       expect=(200, 202, 204, 404)).close()
    except RegistryError:
        pass
