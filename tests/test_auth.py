"""Credential resolution and login: environment, docker config, credential helpers (a real
``docker-credential-test`` script on PATH) and login against the real registry."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import stat
import sys
import textwrap

import pytest

from buildkit_py import oci
from buildkit_py.errors import AuthenticationError, CredentialHelperError
from buildkit_py.oci import auth, login

HOST = "127.0.0.1:5000"


@pytest.fixture
def no_env(monkeypatch):
    for name in (auth.ENV_USER, auth.ENV_PASSWORD, auth.ENV_HOST):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def helper(tmp_path, monkeypatch):
    """A ``docker-credential-test`` on PATH with a JSON file as its keychain. It logs each
    call's argv and stdin so tests can see that secrets only ever go through stdin."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    store = tmp_path / "helper-store.json"
    calls = tmp_path / "helper-calls.jsonl"
    script = bindir / "docker-credential-test"
    script.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, sys
        store, calls = {str(store)!r}, {str(calls)!r}
        data = sys.stdin.read()
        with open(calls, "a") as fh:
            fh.write(json.dumps({{"argv": sys.argv[1:], "stdin": data}}) + "\\n")
        try:
            keys = json.load(open(store))
        except FileNotFoundError:
            keys = {{}}
        action = sys.argv[1]
        if action == "get":
            host = data.strip()
            if host not in keys:
                print("credentials not found in native keychain")
                sys.exit(1)
            print(json.dumps({{"ServerURL": host, **keys[host]}}))
        elif action == "store":
            record = json.loads(data)
            keys[record["ServerURL"]] = {{"Username": record["Username"], "Secret": record["Secret"]}}
            json.dump(keys, open(store, "w"))
        else:
            sys.exit(2)
        """))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")

    class Helper:
        def put(self, host, user, secret):
            keys = json.loads(store.read_text()) if store.exists() else {}
            keys[host] = {"Username": user, "Secret": secret}
            store.write_text(json.dumps(keys))

        def keys(self):
            return json.loads(store.read_text()) if store.exists() else {}

        def calls(self):
            return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []

    return Helper()


def write_config(docker_config, data):
    (docker_config / "config.json").write_text(json.dumps(data))


def b64(text):
    return base64.b64encode(text.encode()).decode()


# ---------------------------------------------------------------- Credentials


def test_credentials_hide_the_password():
    creds = auth.Credentials("ci", "hunter2-secret", "env")
    assert "hunter2-secret" not in repr(creds)
    assert "hunter2-secret" not in str(creds)
    assert "hunter2-secret" not in repr([creds])
    tokened = auth.Credentials("<token>", "", "config", identity_token="refresh-xyz")
    assert "refresh-xyz" not in repr(tokened)
    with pytest.raises(dataclasses.FrozenInstanceError):
        creds.password = "x"


@pytest.mark.parametrize(("text", "host"), [
    ("127.0.0.1:5000", "127.0.0.1:5000"), ("http://127.0.0.1:5000/v2/", "127.0.0.1:5000"),
    ("https://index.docker.io/v1/", "docker.io"), ("registry-1.docker.io", "docker.io"),
    ("GHCR.io", "ghcr.io"),
])
def test_normalize_host(text, host):
    assert auth.normalize_host(text) == host


# ---------------------------------------------------------------- resolution


def test_env_credentials_for_ci(docker_config, monkeypatch):
    monkeypatch.setenv(auth.ENV_USER, "ci")
    monkeypatch.setenv(auth.ENV_PASSWORD, "pw")
    monkeypatch.delenv(auth.ENV_HOST, raising=False)
    assert auth.resolve("ghcr.io") == auth.Credentials("ci", "pw", "env")
    monkeypatch.setenv(auth.ENV_HOST, "https://127.0.0.1:5000")
    assert auth.resolve(HOST).source == "env"
    assert auth.resolve("ghcr.io") is None  # scoped to the other host


def test_env_beats_docker_config(docker_config, monkeypatch):
    write_config(docker_config, {"auths": {HOST: {"auth": b64("fromfile:pw")}}})
    monkeypatch.setenv(auth.ENV_USER, "fromenv")
    monkeypatch.setenv(auth.ENV_PASSWORD, "pw")
    assert auth.resolve(HOST).username == "fromenv"


def test_docker_config_auths(docker_config, no_env):
    write_config(docker_config, {"auths": {
        "http://127.0.0.1:5000": {"auth": b64("ci:p:with:colons")},
        "https://index.docker.io/v1/": {"auth": b64("hubuser:hubpw")},
        "ghcr.io": {"identitytoken": "refresh-token"},
    }})
    creds = auth.resolve(HOST)
    assert (creds.username, creds.password) == ("ci", "p:with:colons")
    assert creds.source == f"config:{docker_config / 'config.json'}"
    assert auth.resolve("docker.io").username == "hubuser"
    assert auth.resolve("registry-1.docker.io").username == "hubuser"
    assert auth.resolve("ghcr.io").identity_token == "refresh-token"
    assert auth.resolve("quay.io") is None


def test_docker_config_location(tmp_path, monkeypatch, no_env):
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert auth.docker_config_path() == tmp_path / ".docker" / "config.json"
    assert auth.resolve(HOST) is None  # no file: anonymous


def test_broken_docker_config_is_a_clear_error(docker_config, no_env):
    (docker_config / "config.json").write_text("{not json")
    with pytest.raises(AuthenticationError, match="not valid JSON"):
        auth.resolve(HOST)


def test_creds_store_helper_gets_host_on_stdin(docker_config, no_env, helper):
    helper.put(HOST, "ci", "helper-secret")
    write_config(docker_config, {"credsStore": "test", "auths": {HOST: {}}})
    creds = auth.resolve(HOST)
    assert (creds.username, creds.password, creds.source) == ("ci", "helper-secret", "credsStore:test")
    (call,) = helper.calls()
    assert call == {"argv": ["get"], "stdin": HOST}  # never the host or a secret on argv
    assert auth.resolve("ghcr.io") is None  # "credentials not found" is not an error


def test_cred_helpers_per_host_win_over_creds_store(docker_config, no_env, helper):
    helper.put(HOST, "per-host", "s1")
    helper.put("https://index.docker.io/v1/", "hub", "s2")
    write_config(docker_config, {"credsStore": "missing-store", "credHelpers": {HOST: "test",
                                                                                "https://index.docker.io/v1/": "test"}})
    assert auth.resolve(HOST).source == "credHelper:test"
    assert auth.resolve("docker.io").username == "hub"
    with pytest.raises(CredentialHelperError, match="not on PATH"):
        auth.resolve("ghcr.io")  # falls to credsStore, whose binary does not exist


def test_helper_identity_token(docker_config, no_env, helper):
    helper.put(HOST, "<token>", "refresh")
    write_config(docker_config, {"credsStore": "test"})
    creds = auth.resolve(HOST)
    assert creds.identity_token == "refresh" and creds.password == ""


# ---------------------------------------------------------------- login (real registry)


def test_login_writes_config_0600(registry, docker_config, no_env, unique_name):
    path = docker_config / "config.json"
    write_config(docker_config, {"auths": {"ghcr.io": {"auth": b64("x:y")}}, "psFormat": "table"})
    result = login.login(registry.address, registry.user, registry.password + "\n")
    assert result == login.LoginResult(registry.address, registry.user, str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    config = json.loads(path.read_text())
    assert config["psFormat"] == "table" and "ghcr.io" in config["auths"]  # the rest is kept
    stored = base64.b64decode(config["auths"][registry.address]["auth"]).decode()
    assert stored == f"{registry.user}:{registry.password}"
    assert [p.name for p in docker_config.iterdir()] == ["config.json"]  # no temp file left
    # What login stored now authenticates real calls, with no env vars.
    assert auth.resolve(registry.address).source.startswith("config:")
    assert oci.head_blob(registry.repo(unique_name), "sha256:" + "0" * 64) is None


def test_login_with_wrong_password_stores_nothing(registry, docker_config, no_env):
    with pytest.raises(AuthenticationError) as exc:
        login.login(registry.address, registry.user, "definitely-wrong")
    assert "definitely-wrong" not in exc.value.render()
    assert "imgbuild login" not in exc.value.render()  # it is what failed: no hint to run it again
    assert not (docker_config / "config.json").exists()


def test_login_through_creds_store(registry, docker_config, no_env, helper):
    write_config(docker_config, {"credsStore": "test"})
    result = login.login(registry.address, registry.user, registry.password)
    assert result.stored_in == "credsStore:test"
    assert helper.keys()[registry.address] == {"Username": registry.user, "Secret": registry.password}
    text = (docker_config / "config.json").read_text()
    assert registry.password not in text
    assert json.loads(text)["auths"] == {registry.address: {}}
    store_call = next(c for c in helper.calls() if c["argv"] == ["store"])
    assert json.loads(store_call["stdin"])["Secret"] == registry.password
    assert all(registry.password not in " ".join(c["argv"]) for c in helper.calls())
    assert auth.resolve(registry.address).password == registry.password


def test_login_to_unreachable_registry(docker_config, no_env):
    from buildkit_py.errors import RegistryUnreachable

    client = oci.Client(max_retries=0)
    with pytest.raises(RegistryUnreachable):
        login.login("127.0.0.1:1", "ci", "pw", client=client)
