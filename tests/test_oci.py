"""OCI distribution client: reference parsing (unit), transport rules (local stub
servers for what a real registry cannot be made to do: 503s, a Bearer token service), and
everything else against the real registry from scripts/services.sh."""

from __future__ import annotations

import base64
import email.utils
import gzip
import hashlib
import json
import os
import secrets
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
import requests
from conftest import unavailable
from helpers import free_port, run_cli, write_recipe

from buildkit_py import oci, reference
from buildkit_py.compat.rules import mirrored_ref
from buildkit_py.errors import (
    AuthenticationError,
    DigestMismatch,
    ManifestNotFound,
    NotARegistry,
    RegistryError,
    RegistryUnreachable,
    UsageError,
)
from buildkit_py.oci import auth, blobs, download
from buildkit_py.oci.login import check_push_access

DIGEST = "sha256:" + "a" * 64


# ---------------------------------------------------------------- references (unit)


@pytest.mark.parametrize(
    ("text", "registry", "repository", "tag", "digest"),
    [
        ("ubuntu", "docker.io", "library/ubuntu", None, None),
        ("ubuntu:22.04", "docker.io", "library/ubuntu", "22.04", None),
        ("nvidia/cuda:12.4.1-base-ubuntu22.04", "docker.io", "nvidia/cuda", "12.4.1-base-ubuntu22.04", None),
        ("docker.io/ubuntu", "docker.io", "library/ubuntu", None, None),
        ("index.docker.io/library/debian:12", "docker.io", "library/debian", "12", None),
        ("ghcr.io/org/team/img:tag", "ghcr.io", "org/team/img", "tag", None),
        ("localhost/foo", "localhost", "foo", None, None),
        ("localhost:5000/foo:1", "localhost:5000", "foo", "1", None),
        ("127.0.0.1:5000/team/img@" + DIGEST, "127.0.0.1:5000", "team/img", None, DIGEST),
        ("nvcr.io/nvidia/pytorch:24.01-py3@" + DIGEST, "nvcr.io", "nvidia/pytorch", "24.01-py3", DIGEST),
        ("[::1]:5000/a/b", "[::1]:5000", "a/b", None, None),
        ("my_org/my-repo.name__x", "docker.io", "my_org/my-repo.name__x", None, None),
    ],
)
def test_parse_reference(text, registry, repository, tag, digest):
    ref = oci.parse_reference(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (registry, repository, tag, digest)


@pytest.mark.parametrize(
    "text",
    ["", "UPPER/case", "repo:bad tag", "repo@sha256:short", "http://ghcr.io/x/y", "a//b", "-lead/x",
     "host:5000/Repo", "repo:" + "t" * 129, "repo@md5:" + "a" * 32],
)
def test_parse_reference_rejects(text):
    with pytest.raises(UsageError):
        oci.parse_reference(text)


def test_reference_round_trip_and_api_host():
    ref = oci.parse_reference("ubuntu")
    assert ref.api_host == "registry-1.docker.io"
    assert ref.reference == "latest"
    assert str(ref) == "docker.io/library/ubuntu"
    pinned = oci.parse_reference(f"127.0.0.1:5000/a/b:t@{DIGEST}")
    assert str(pinned) == f"127.0.0.1:5000/a/b:t@{DIGEST}"
    assert pinned.reference == DIGEST
    assert oci.parse_reference(str(pinned)) == pinned


@pytest.mark.parametrize(("ref", "named"), [
    ("127.0.0.1:5000/a/b:1", True), ("localhost/a", True), ("ghcr.io/a/b", True), ("docker.io/team/app", True),
    ("index.docker.io/library/debian", True), ("registry-1.docker.io/team/app", True),
    ("team/app:1", False), ("debian", False), ("localhost", False)])
def test_names_registry(ref, named):
    """Written registry hosts, Docker Hub's own names among them, by the rule parse_reference uses."""
    assert reference.names_registry(ref) is named


def test_names_registry_refuses_a_bad_reference():
    with pytest.raises(UsageError):
        reference.names_registry("ghcr.io/Team/App")


@pytest.mark.parametrize("host", sorted(reference.DOCKER_HUB_ALIASES))
def test_docker_hub_aliases_fold_into_docker_io(host):
    ref = oci.parse_reference(f"{host}/debian:12")
    assert (ref.registry, ref.repository, ref.api_host) == ("docker.io", "library/debian", "registry-1.docker.io")
    # the login side knows every name the reference side does
    assert auth.normalize_host(f"https://{host}/v2/") == "docker.io"
    assert auth.config_key(host) == auth.DOCKER_HUB_KEY


def test_mirrored_ref_drops_only_a_registry_host():
    assert mirrored_ref("nvcr.io/nvidia/cuda:12.4", "127.0.0.1:5000/mirror") == "127.0.0.1:5000/mirror/nvidia/cuda:12.4"
    assert mirrored_ref("nvidia/cuda:12.4", "127.0.0.1:5000/mirror/") == "127.0.0.1:5000/mirror/nvidia/cuda:12.4"
    assert mirrored_ref("localhost/team/app", "m.io") == "m.io/team/app"
    assert mirrored_ref("ubuntu", None) == "ubuntu"


def test_challenge_parsing():
    c = oci.Challenge.parse('Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
                            'scope="repository:library/ubuntu:pull"')
    assert c.scheme == "bearer"
    assert c.params == {"realm": "https://auth.docker.io/token", "service": "registry.docker.io",
                        "scope": "repository:library/ubuntu:pull"}
    basic = oci.Challenge.parse('Basic realm="imgbuild-registry"')
    assert basic == oci.Challenge("basic", {"realm": "imgbuild-registry"})
    assert oci.Challenge.parse(None) is None


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1:5000", True), ("127.8.9.10", True), ("localhost:5000", True), ("[::1]:5000", True),
    ("ghcr.io", False), ("10.0.0.1:5000", False), ("registry-1.docker.io", False),
])
def test_scheme_follows_dockerd_insecure_default(host, loopback):
    assert oci.is_loopback(host) is loopback
    assert oci.Client().base_url(host).startswith("http://" if loopback else "https://")


def test_ca_cert_is_used_for_verification(tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    assert oci.Client(ca_cert=bundle).session.verify == str(bundle)


# ---------------------------------------------------------------- transport rules (stub servers)


class _Stub(BaseHTTPRequestHandler):
    """Answers from a script: a list of (status, headers) per request; counts requests."""

    script: ClassVar[list] = []
    seen: ClassVar[list] = []

    def log_message(self, *args):
        pass

    def _answer(self):
        type(self).seen.append((self.command, self.path, self.headers.get("Authorization")))
        status, headers = self.script.pop(0) if self.script else (200, {})
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = do_POST = _answer


@pytest.fixture
def stub():
    handler = type("Handler", (_Stub,), {"script": [], "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler, f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_transient_errors_are_retried_with_backoff(stub):
    handler, host = stub
    handler.script[:] = [(503, {}), (429, {"Retry-After": "0"}), (502, {}), (200, {})]
    client = oci.Client(credentials=lambda h: None, backoff_s=0.001)
    assert client.request("GET", host, "/v2/").status_code == 200
    assert len(handler.seen) == 4


def test_auth_errors_are_not_retried(stub):
    handler, host = stub
    challenge = {"WWW-Authenticate": 'Basic realm="r"'}
    handler.script[:] = [(401, challenge)] * 10
    creds = auth.Credentials("ci", "wrong-secret", "test")
    client = oci.Client(credentials=lambda h: creds, backoff_s=0.001)
    with pytest.raises(AuthenticationError) as exc:
        client.request("GET", host, "/v2/")
    # One anonymous try that learns the scheme, one with the credentials: no retry loop.
    assert len(handler.seen) == 2
    assert handler.seen[1][2].startswith("Basic ")
    assert "imgbuild login" in exc.value.hint
    assert "wrong-secret" not in exc.value.render()


def test_connection_refused_is_registry_unreachable():
    port = free_port()  # a port nobody listens on
    client = oci.Client(credentials=lambda h: None, backoff_s=0.001, max_retries=2)
    with pytest.raises(RegistryUnreachable, match="connection refused"):
        oci.get_manifest(f"127.0.0.1:{port}/a/b:1", client=client)


def test_an_unreachable_registry_is_named_whole_with_a_hint_that_fits():
    """issue 22: 12: mirror from Docker Hub on a machine that cannot resolve it printed urllib3's
    text cut at 200 characters mid-word, and a hint to run scripts/services.sh (the local test
    registry). A name under .invalid never resolves (RFC 6761): a real DNS failure, offline too."""
    from buildkit_py.oci.transport import unreachable_hint

    host = "a-long-registry-name." * 6 + "invalid"
    client = oci.Client(credentials=lambda h: None, max_retries=0)
    with pytest.raises(RegistryUnreachable) as exc:
        oci.get_manifest(f"{host}/nvidia/cuda:12.4.1-runtime-ubuntu22.04", client=client)
    assert exc.value.message == f"cannot reach registry at https://{host}: the name {host} does not resolve " \
                                "from this machine (DNS)"
    assert "services.sh" not in exc.value.hint and "HTTPS_PROXY" in exc.value.hint
    hub = unreachable_hint(oci.DOCKER_HUB_API)
    assert "services.sh" not in hub and "imgbuild mirror" in hub and "base.mirror" in hub
    assert "scripts/services.sh up" in unreachable_hint("127.0.0.1:5000")
    assert "scripts/services.sh" not in unreachable_hint("registry.example.com")



class _WebSite(SimpleHTTPRequestHandler):
    """A web server where a registry was expected: Python's http.server, which answers a path it
    has not with its own HTML error page (404), or, with ``every_path``, a single-page app or a
    login portal, which answers every path with the same page (200)."""

    every_path: ClassVar[bool] = False
    PAGE = (b"<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title></head>\n"
            b"<body><h1>Welcome to nginx!</h1><script>var token = 'secret';</script></body></html>\n")

    def log_message(self, *args):
        pass

    def do_GET(self):
        if not self.every_path:
            return super().do_GET()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(self.PAGE)))
        self.end_headers()
        self.wfile.write(self.PAGE)
        return None

    do_HEAD = do_GET


@pytest.fixture(params=["404-page", "200-every-path"])
def web_site(request, tmp_path):
    handler = type("Handler", (_WebSite,), {"every_path": request.param == "200-every-path"})
    server = ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: handler(*a, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield request.param, f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _no_markup(text: str) -> None:
    assert "<html" not in text.lower() and "<!doctype" not in text.lower() and "<body" not in text.lower(), text


def test_an_address_that_answers_a_web_page_is_not_a_registry(web_site):
    """issue 31: 6: a registry address that answers with an HTML page showed the page in the error
    (and a 200 page was read as a manifest). The answer is now told apart by what a registry never
    sends: an HTML page without the Docker-Distribution-API-Version header. Exit 3, the address
    named, the page's title at most, never its markup."""
    kind, host = web_site
    client = oci.Client(credentials=lambda h: None, backoff_s=0.001)
    with pytest.raises(NotARegistry) as info:
        oci.get_manifest(f"{host}/team/base:1", client=client)
    status, title = ("404", "Error response") if kind == "404-page" else ("200", "Welcome to nginx!")
    assert info.value.message == (f"{host} is not a container registry: GET /v2/team/base/manifests/1 answered "
                                  f'HTTP {status} with an HTML page ("{title}"), not the registry API')
    assert info.value.exit_status == 3 and f"http://{host}/v2/" in info.value.hint
    assert isinstance(info.value, RegistryUnreachable)  # every caller that handles an unreachable one handles it
    _no_markup(info.value.render())
    with pytest.raises(NotARegistry):
        client.check_login(host, auth.Credentials("ci", "pw", "test"))


def test_plan_says_the_base_address_is_not_a_registry_not_a_missing_tag(web_site, tmp_path, docker_config):
    """`plan` of a recipe whose base names such an address called it a missing tag (exit 2) and
    printed the page; `weights pull` and `login` printed it too."""
    _, host = web_site
    recipe = write_recipe(tmp_path / "r", f'name: team/app\nversion: "1"\ncuda: {{version: "12.4", source: wheels, '
                                          f'flavor: base}}\nbase: {{image: "{host}/team/base:1"}}\npython: "3.11"\n')
    code, out, err = run_cli("plan", str(recipe), "--json")
    assert code == 3, err
    doc = json.loads(out)
    assert doc["error"] == "NotARegistry" and "is not in its registry" not in doc["message"]
    assert doc["message"].startswith(f"cannot read the base image {host}/team/base:1 ({recipe}:4: base.image): "
                                     f"{host} is not a container registry: GET /v2/team/base/manifests/1 answered")
    _no_markup(out + err)
    for argv in (("weights", "pull", f"{host}/team/w:1", str(tmp_path / "w")), ("weights", "ls", f"{host}/team/w:1")):
        code, out, err = run_cli(*argv)
        assert code == 3 and f"{host} is not a container registry" in err, err
        _no_markup(out + err)
    code, out, err = run_cli("login", host, "-u", "ci", "--password-stdin", stdin="pw\n")
    assert code == 3 and f"{host} is not a container registry" in err, err
    _no_markup(out + err)


def test_a_name_that_does_not_resolve_is_tried_twice_not_through_the_whole_backoff(monkeypatch):
    """A misspelled registry waited 7.8 s of backoff (4 retries) before its DNS error; one more
    try covers a resolver's hiccup. A refused connection keeps every retry (a registry restarting)."""
    client = oci.Client(credentials=lambda h: None, backoff_s=0.001, max_retries=4)
    sent: list[str] = []
    real = client.session.request
    monkeypatch.setattr(client.session, "request", lambda *a, **k: sent.append(a[1]) or real(*a, **k))
    with pytest.raises(RegistryUnreachable, match="does not resolve"):
        oci.get_manifest("no-such-registry.invalid/a/b:1", client=client)
    assert len(sent) == 2, sent


# ---------------------------------------------------------------- against the real registry


@pytest.fixture
def creds_env(registry, docker_config, monkeypatch):
    monkeypatch.setenv(auth.ENV_USER, registry.user)
    monkeypatch.setenv(auth.ENV_PASSWORD, registry.password)
    monkeypatch.delenv(auth.ENV_HOST, raising=False)
    return registry


@pytest.fixture
def client(creds_env):
    with oci.Client() as c:
        yield c


def _blob_file(tmp_path, size: int, name="blob") -> tuple[str, str]:
    path = tmp_path / name
    path.write_bytes(os.urandom(size))
    return str(path), "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def _image(client, ref, labels: dict, arch="amd64") -> tuple[bytes, str]:
    """A tiny real Docker-schema-2 image: one layer, a config with labels."""
    layer = os.urandom(512)
    layer_d = oci.upload_bytes(ref, layer, client=client).digest
    config = oci.canonical_json({"architecture": arch, "os": "linux", "config": {"Labels": labels},
                                 "rootfs": {"type": "layers", "diff_ids": [layer_d]}})
    config_d = oci.upload_bytes(ref, config, client=client).digest
    manifest = oci.canonical_json({
        "schemaVersion": 2, "mediaType": oci.MEDIA_DOCKER_MANIFEST,
        "config": {"mediaType": oci.MEDIA_DOCKER_CONFIG, "digest": config_d, "size": len(config)},
        "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar", "digest": layer_d,
                    "size": len(layer)}],
    })
    return manifest, oci.sha256_bytes(manifest)


def test_blob_upload_hashed_once_and_skipped_when_present(client, registry, unique_name, tmp_path, monkeypatch):
    ref = oci.parse_reference(registry.repo(unique_name))
    small, small_d = _blob_file(tmp_path, 100_000, "small")
    assert oci.head_blob(ref, small_d, client=client) is None
    result = oci.upload_blob(ref, small, client=client)
    assert (result.digest, result.uploaded_bytes) == (small_d, 100_000)
    assert oci.head_blob(ref, small_d, client=client) == 100_000

    monkeypatch.setattr(blobs, "UPLOAD_PIECE", 1 << 20)
    size = (3 << 20) + 123
    big, big_d = _blob_file(tmp_path, size, "big")
    events = []
    result = oci.upload_blob(ref, big, client=client, progress=lambda *e: events.append(e))
    assert (result.digest, result.uploaded_bytes) == (big_d, size)
    assert oci.head_blob(ref, big_d, client=client) == size
    assert [e for e in events if e[0] == "hash"][-1] == ("hash", big, size, size)
    assert [e[2] for e in events if e[0] == "upload"] == [1 << 20, 2 << 20, 3 << 20, size]
    again = oci.upload_blob(ref, big, client=client, progress=lambda *e: events.append(e))
    assert (again.digest, again.uploaded_bytes) == (big_d, 0)
    assert events[-1] == ("exists", big, size, size)


def test_broken_upload_resumes_where_the_registry_got_to(client, registry, unique_name, tmp_path):
    ref = oci.parse_reference(registry.repo(unique_name))
    path, digest = _blob_file(tmp_path, 3 << 20)
    location, _ = oci.start_upload(ref, client=client)
    first = Path(path).read_bytes()[: 1 << 20]
    resp = client.request("PATCH", ref.api_host, location, scope=oci.push_scope(ref.repository), expect=(202,),
                          body=first, headers={"Content-Type": oci.MEDIA_OCTET, "Content-Range": f"0-{len(first) - 1}"})
    location = resp.headers["Location"]
    assert blobs._resume_point(ref, location, client)[0] == 1 << 20
    src = blobs._Source(path, 3 << 20, "x", None)
    location = blobs._patch(ref, client, location, src, 1 << 20)
    assert src.sent == 2 << 20  # only the rest crossed
    client.request("PUT", ref.api_host, location, scope=oci.push_scope(ref.repository), expect=(201,),
                   params={"digest": digest}).close()
    assert oci.head_blob(ref, digest, client=client) == 3 << 20


def test_get_blob_streams_verifies_and_resumes(client, registry, unique_name, tmp_path):
    ref = oci.parse_reference(registry.repo(unique_name))
    path, digest = _blob_file(tmp_path, 3_000_000)
    oci.upload_blob(ref, path, client=client)
    out = tmp_path / "out"
    with open(out, "w+b") as fh:
        assert oci.get_blob(ref, digest, fh, size=3_000_000, client=client) == 3_000_000
    assert out.read_bytes() == Path(path).read_bytes()
    with open(out, "r+b") as fh:
        fh.truncate(1_000_000)
        # Only the missing 2 MB cross the network (Range request, 206).
        assert oci.get_blob(ref, digest, fh, size=3_000_000, client=client) == 2_000_000
    assert out.read_bytes() == Path(path).read_bytes()
    with open(out, "w+b") as fh, pytest.raises(DigestMismatch, match="got 3000000 bytes"):
        oci.get_blob(ref, digest, fh, size=3_000_001, client=client)  # a size the manifest would not match
    with open(out, "w+b") as fh, pytest.raises(RegistryError, match="BLOB_UNKNOWN"):
        oci.get_blob(ref, "sha256:" + "0" * 64, fh, client=client)


def test_manifest_round_trip_and_image_config_without_pull(client, registry, unique_name):
    ref = oci.parse_reference(registry.repo(unique_name) + ":v1")
    raw, digest = _image(client, ref, {"org.imgbuild.cuda": "12.4.1"})
    assert oci.put_manifest(ref, raw, oci.MEDIA_DOCKER_MANIFEST, client=client) == digest
    manifest, got, media_type = oci.get_manifest(ref, client=client)
    assert (got, media_type) == (digest, oci.MEDIA_DOCKER_MANIFEST)
    assert manifest["config"]["mediaType"] == oci.MEDIA_DOCKER_CONFIG
    assert oci.get_image_config(ref, client=client)["config"]["Labels"] == {"org.imgbuild.cuda": "12.4.1"}
    assert oci.get_manifest(ref.with_digest(digest), client=client)[1] == digest
    with pytest.raises(ManifestNotFound):
        oci.get_manifest(ref.with_tag("nope"), client=client)


def test_index_picks_linux_amd64(client, registry, unique_name):
    ref = oci.parse_reference(registry.repo(unique_name) + ":multi")
    children = {}
    for arch in ("arm64", "amd64"):
        raw, digest = _image(client, ref, {"arch": arch}, arch)
        oci.put_manifest(ref.with_tag(None).with_digest(digest), raw, oci.MEDIA_DOCKER_MANIFEST, client=client)
        children[arch] = (digest, len(raw))
    index = {"schemaVersion": 2, "mediaType": oci.MEDIA_OCI_INDEX, "manifests": [
        {"mediaType": oci.MEDIA_DOCKER_MANIFEST, "digest": d, "size": n,
         "platform": {"os": "linux", "architecture": arch}} for arch, (d, n) in children.items()]}
    oci.put_manifest(ref, index, client=client)
    _, digest, media_type = oci.get_manifest(ref, client=client)
    assert digest == children["amd64"][0] and media_type == oci.MEDIA_DOCKER_MANIFEST
    assert oci.get_image_config(ref, client=client)["config"]["Labels"] == {"arch": "amd64"}
    index_raw, index_digest, _ = oci.fetch_manifest(ref, client=client)
    found = oci.read_any_manifest(ref, client=client)
    assert isinstance(found, oci.Index) and (found.raw, found.digest) == (index_raw, index_digest)
    assert [e.platform_name for e in found.manifests] == ["linux/arm64", "linux/amd64"]
    assert found.select("linux/arm64").digest == children["arm64"][0]
    with pytest.raises(RegistryError, match=r"no linux/s390x manifest \(has: linux/arm64, linux/amd64\)"):
        found.select("linux/s390x")


def test_typed_manifest_keeps_the_bytes_its_digest_is_of(client, registry, unique_name):
    """read_manifest / read_image_config: parsed once, the exact bytes kept beside the parsed form."""
    ref = oci.parse_reference(registry.repo(unique_name) + ":typed")
    raw, digest = _image(client, ref, {"org.imgbuild.cuda": "12.4.1"})
    oci.put_manifest(ref, raw, oci.MEDIA_DOCKER_MANIFEST, client=client)
    manifest = oci.read_manifest(ref, client=client)
    assert (manifest.raw, manifest.digest, manifest.media_type) == (raw, digest, oci.MEDIA_DOCKER_MANIFEST)
    assert oci.sha256_bytes(manifest.raw) == manifest.digest
    assert manifest.config.media_type == oci.MEDIA_DOCKER_CONFIG
    assert manifest.compressed_size == manifest.config.size + sum(x.size for x in manifest.layers)
    assert manifest.document() == json.loads(raw)
    config = oci.read_image_config(ref, client=client)
    assert config.digest == manifest.config.digest == oci.sha256_bytes(config.raw)
    assert config.labels == {"org.imgbuild.cuda": "12.4.1"}
    assert len(config.diff_ids) == len(manifest.layers)
    assert config.document() == oci.get_image_config(ref, client=client)


def test_a_manifest_that_is_not_an_object_is_a_registry_error():
    with pytest.raises(RegistryError, match="manifest of x is not a JSON object"):
        oci.parse_manifest(b"[]", "sha256:0", oci.MEDIA_OCI_MANIFEST, "x")
    with pytest.raises(RegistryError, match="layer of x is not a descriptor with a digest"):
        oci.parse_manifest(b'{"layers": [{"size": 1}]}', "sha256:0", oci.MEDIA_OCI_MANIFEST, "x")


def _attestation(client, ref, subject: str) -> tuple[bytes, dict]:
    """An attestation manifest as BuildKit writes one (an in-toto statement layer, an empty
    config), and its index entry pointing at ``subject``."""
    statement = oci.canonical_json({"_type": "https://in-toto.io/Statement/v0.1", "subject": [{"digest": subject}]})
    config = b"{}"
    layer_d = oci.upload_bytes(ref, statement, client=client).digest
    config_d = oci.upload_bytes(ref, config, client=client).digest
    raw = oci.canonical_json({
        "schemaVersion": 2, "mediaType": oci.MEDIA_OCI_MANIFEST,
        "config": {"mediaType": oci.MEDIA_OCI_CONFIG, "digest": config_d, "size": len(config)},
        "layers": [{"mediaType": "application/vnd.in-toto+json", "digest": layer_d, "size": len(statement),
                    "annotations": {"in-toto.io/predicate-type": "https://slsa.dev/provenance/v0.2"}}]})
    entry = {"mediaType": oci.MEDIA_OCI_MANIFEST, "digest": oci.sha256_bytes(raw), "size": len(raw),
             "annotations": {"vnd.docker.reference.digest": subject,
                             "vnd.docker.reference.type": "attestation-manifest"},
             "platform": {"architecture": "unknown", "os": "unknown"}}
    return raw, entry


@pytest.fixture
def image_index(client, registry, unique_name):
    """A multi-platform index like buildx pushes with provenance: linux/amd64 and linux/arm64
    images, and an attestation manifest for the amd64 one. ``(ref, index digest, children)``,
    children by name: ``(digest, raw manifest)``."""
    ref = oci.parse_reference(registry.repo(unique_name + "-src") + ":1")
    children, entries = {}, []
    for arch in ("amd64", "arm64"):
        raw, digest = _image(client, ref, {"arch": arch}, arch)
        oci.put_manifest(ref.with_tag(None).with_digest(digest), raw, oci.MEDIA_DOCKER_MANIFEST, client=client)
        children[arch] = (digest, raw)
        entries.append({"mediaType": oci.MEDIA_DOCKER_MANIFEST, "digest": digest, "size": len(raw),
                        "platform": {"os": "linux", "architecture": arch}})
    raw, entry = _attestation(client, ref, children["amd64"][0])
    oci.put_manifest(ref.with_tag(None).with_digest(entry["digest"]), raw, oci.MEDIA_OCI_MANIFEST, client=client)
    children["attestation"] = (entry["digest"], raw)
    entries.append(entry)
    digest = oci.put_manifest(ref, {"schemaVersion": 2, "mediaType": oci.MEDIA_OCI_INDEX, "manifests": entries},
                              client=client)
    return ref, digest, children


def _holds_everything(client, dest, children: dict) -> None:
    """Every child manifest is at ``dest`` by digest, with the same bytes, and every blob it names."""
    for digest, raw in children.values():
        got, got_digest, _ = oci.fetch_manifest(dest.with_tag(None).with_digest(digest), client=client)
        assert (got, got_digest) == (raw, digest)
        body = json.loads(raw)
        for desc in [body["config"], *body["layers"]]:
            assert oci.head_blob(dest, desc["digest"], client=client) == desc["size"]


@pytest.mark.parametrize("host", ["same", "other"])
def test_mirror_of_an_index_keeps_its_digest(client, registry, unique_name, image_index, host):
    """Issue 22 item 1: mirror copied only the amd64 manifest, so the copy's digest was not the
    index's. Now the index, every manifest it names (the attestation too) and their blobs go.
    ``other``: the same registry under another name (localhost), so the blobs are streamed
    from one to the other instead of mounted."""
    ref, index_digest, children = image_index
    address = registry.address if host == "same" else registry.address.replace("127.0.0.1", "localhost")
    dest = oci.parse_reference(f"{address}/{unique_name}-copy:mirrored")
    events = []
    copied = oci.copy_image(ref, dest, client=client, progress=lambda *e: events.append(e[0]))
    assert oci.fetch_manifest(dest, client=client)[:2] == oci.fetch_manifest(ref, client=client)[:2]
    _holds_everything(client, dest, children)
    assert copied.digest == copied.source_digest == index_digest and copied.same_digest
    assert (copied.platforms, copied.left_out, copied.attestations, copied.manifests) == (
        ("linux/amd64", "linux/arm64"), (), 1, 4)
    assert ("mounted" if host == "same" else "copy") in events
    # again: everything is there, nothing crosses
    events.clear()
    assert oci.copy_image(ref, dest, client=client, progress=lambda *e: events.append(e[0])).same_digest
    assert "copy" not in events and "mounted" not in events


def test_mirror_of_chosen_platforms_says_the_digest_changes(client, registry, unique_name, image_index):
    ref, index_digest, children = image_index
    dest = oci.parse_reference(registry.repo(unique_name + "-amd64") + ":1")
    copied = oci.copy_image(ref, dest, platforms=("linux/amd64",), client=client)
    assert (copied.platforms, copied.left_out, copied.attestations) == (("linux/amd64",), ("linux/arm64",), 1)
    assert not copied.same_digest and copied.source_digest == index_digest
    raw, digest, media_type = oci.fetch_manifest(dest, client=client)
    assert (digest, media_type) == (copied.digest, oci.MEDIA_OCI_INDEX)
    assert [e["digest"] for e in json.loads(raw)["manifests"]] == [children["amd64"][0], children["attestation"][0]]
    _holds_everything(client, dest, {k: children[k] for k in ("amd64", "attestation")})
    with pytest.raises(ManifestNotFound):
        oci.fetch_manifest(dest.with_tag(None).with_digest(children["arm64"][0]), client=client)
    # arm64 has no attestation here; every platform chosen is the whole index, digest kept
    arm = oci.copy_image(ref, dest.with_tag("arm"), platforms=("linux/arm64",), client=client)
    assert (arm.platforms, arm.attestations) == (("linux/arm64",), 0)
    both = oci.copy_image(ref, dest.with_tag("both"), platforms=("linux/arm64", "linux/amd64"), client=client)
    assert both.same_digest and both.digest == index_digest
    with pytest.raises(UsageError, match=r"no linux/s390x manifest \(has: linux/amd64, linux/arm64\)"):
        oci.copy_image(ref, dest.with_tag("s390x"), platforms=("linux/s390x",), client=client)
    single = oci.copy_image(ref.with_tag(None).with_digest(children["arm64"][0]), dest.with_tag("single"),
                            client=client)
    assert (single.same_digest, single.platforms) == (True, ("linux/arm64",))
    with pytest.raises(UsageError, match=r"single-platform image \(linux/arm64\)"):
        oci.copy_image(ref.with_tag(None).with_digest(children["arm64"][0]), dest.with_tag("x"),
                       platforms=("linux/amd64",), client=client)


def test_bad_credentials_raise_authentication_error(registry, docker_config, unique_name):
    creds = auth.Credentials(registry.user, "not-the-password", "test")
    client = oci.Client(credentials=lambda h: creds)
    with pytest.raises(AuthenticationError) as exc:
        oci.get_manifest(registry.repo(unique_name) + ":v1", client=client)
    assert "imgbuild login" in exc.value.hint
    assert "not-the-password" not in exc.value.render()
    assert exc.value.exit_status == 3


def test_no_credentials_raise_authentication_error(registry, docker_config, unique_name, monkeypatch):
    monkeypatch.delenv(auth.ENV_USER, raising=False)
    monkeypatch.delenv(auth.ENV_PASSWORD, raising=False)
    with pytest.raises(AuthenticationError, match="no credentials"):
        oci.head_blob(registry.repo(unique_name), DIGEST)


# ---------------------------------------------------------------- Bearer token flow


class _TokenProxy(BaseHTTPRequestHandler):
    """A token service plus a read-only front for the real registry that demands Bearer
    tokens, the way Docker Hub, ghcr and Harbor do. Tokens come from /token for the
    right basic credentials; valid requests are forwarded to the real registry."""

    upstream = ""
    basic = ""
    user_basic = ""
    tokens: ClassVar[set] = set()
    token_requests: ClassVar[list] = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._handle()

    def do_HEAD(self):
        self._handle()

    def do_POST(self):
        """A read-only front: an upload is refused to every token, as to a user who may only pull."""
        auth_header = self.headers.get("Authorization", "")
        if auth_header.startswith("Bearer ") and auth_header[7:] in self.tokens:
            return self._reply(403, b'{"errors":[{"code":"DENIED","message":"requested access to the resource '
                                    b'is denied"}]}')
        repo = self.path.split("/v2/", 1)[-1].split("/blobs/", 1)[0]
        port = self.server.server_address[1]
        return self._reply(401, b"", {"WWW-Authenticate": f'Bearer realm="http://127.0.0.1:{port}/token",'
                                                          f'service="stub-registry",scope="repository:{repo}:pull,push"'})

    def _handle(self):
        port = self.server.server_address[1]
        if self.path.startswith("/token"):
            from urllib.parse import parse_qs, urlparse
            query = parse_qs(urlparse(self.path).query)
            type(self).token_requests.append(query)
            if self.headers.get("Authorization") != self.user_basic:
                return self._reply(401, b'{"errors":[{"code":"UNAUTHORIZED","message":"bad login"}]}')
            token = secrets.token_hex(8)
            type(self).tokens.add(token)
            return self._reply(200, json.dumps({"token": token, "expires_in": 300}).encode())
        auth_header = self.headers.get("Authorization", "")
        if not (auth_header.startswith("Bearer ") and auth_header[7:] in self.tokens):
            repo = self.path.split("/v2/", 1)[-1].rsplit("/", 2)[0]
            scope = f',scope="repository:{repo}:pull"' if "/" in self.path[4:] else ""
            return self._reply(401, b"", {"WWW-Authenticate":
                                           f'Bearer realm="http://127.0.0.1:{port}/token",service="stub-registry"{scope}'})
        headers = {k: v for k, v in self.headers.items() if k in ("Accept", "Range")}
        headers["Authorization"] = self.basic
        up = requests.request(self.command, self.upstream + self.path, headers=headers, stream=True, timeout=30)
        self.send_response(up.status_code)
        for k in ("Content-Type", "Content-Length", "Docker-Content-Digest", "Content-Range"):
            if k in up.headers:
                self.send_header(k, up.headers[k])
        self.end_headers()
        if self.command == "GET":
            for piece in up.iter_content(1 << 16):
                self.wfile.write(piece)

    def _reply(self, status, body, headers=None):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


@pytest.fixture
def token_registry(creds_env):
    basic = "Basic " + base64.b64encode(f"{creds_env.user}:{creds_env.password}".encode()).decode()
    handler = type("Proxy", (_TokenProxy,), {
        "upstream": f"http://{creds_env.address}", "basic": basic,
        "user_basic": "Basic " + base64.b64encode(b"alice:wonderland").decode(),
        "tokens": set(), "token_requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler, f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_bearer_token_flow(client, registry, unique_name, token_registry):
    handler, front = token_registry
    ref = oci.parse_reference(registry.repo(unique_name) + ":v1")
    raw, digest = _image(client, ref, {"via": "bearer"})
    oci.put_manifest(ref, raw, oci.MEDIA_DOCKER_MANIFEST, client=client)

    alice = auth.Credentials("alice", "wonderland", "test")
    bearer = oci.Client(credentials=lambda h: alice)
    front_ref = f"{front}/{unique_name}:v1"
    assert oci.get_manifest(front_ref, client=bearer)[1] == digest
    assert oci.get_image_config(front_ref, client=bearer)["config"]["Labels"] == {"via": "bearer"}
    query = handler.token_requests[0]
    assert query["service"] == ["stub-registry"]
    assert query["scope"] == [f"repository:{unique_name}:pull"]
    assert len(handler.token_requests) == 1  # the token is reused for the same scope

    wrong = oci.Client(credentials=lambda h: auth.Credentials("alice", "queen-of-hearts", "test"))
    with pytest.raises(AuthenticationError, match="rejected the credentials"):
        oci.get_manifest(front_ref, client=wrong)
    bearer.check_login(front, alice)  # /v2/ with an unscoped token, as `docker login` does


# ---------------------------------------------------------------- may these credentials push? (build --push asks first)


def test_check_push_access_asks_the_registry_without_pushing(client, registry, unique_name, monkeypatch,
                                                             token_registry):
    ref = oci.parse_reference(registry.repo(unique_name) + ":1")
    check_push_access(ref, client=client)  # the right credentials: nothing raised
    # nothing was pushed: the repository is still unknown to the registry (the session was cancelled)
    client.request("GET", ref.api_host, f"/v2/{ref.repository}/tags/list", scope=oci.pull_scope(ref.repository),
                   expect=(404,)).close()
    wrong = oci.Client(credentials=lambda h: auth.Credentials(registry.user, "wrong-" + registry.password, "test"))
    with pytest.raises(AuthenticationError, match=r"rejected the credentials of 'ci' from test for "
                                                  rf"repository:{unique_name}:pull,push") as exc:
        check_push_access(ref, client=wrong)
    assert exc.value.exit_status == 3 and "wrong-" not in exc.value.render()
    with pytest.raises(AuthenticationError, match="no credentials were found"):
        check_push_access(ref, client=oci.Client(credentials=lambda h: None))
    with pytest.raises(RegistryUnreachable):
        check_push_access(f"127.0.0.1:{free_port()}/team/app:1",
                          client=oci.Client(credentials=lambda h: None, backoff_s=0.001, max_retries=1))
    # a token registry that lets the user pull but not push (Docker Hub, ghcr, Harbor answer DENIED)
    _, front = token_registry
    alice = oci.Client(credentials=lambda h: auth.Credentials("alice", "wonderland", "test"))
    with pytest.raises(AuthenticationError, match=r"denied access for repository:team/app:pull,push to 'alice'"):
        check_push_access(f"{front}/team/app:1", client=alice)


# ---------------------------------------------------------------- a streamed upload re-challenged


class _RechallengingRegistry(BaseHTTPRequestHandler):
    """A registry that issues Bearer tokens and takes blob uploads, and that refuses the
    first token on the streamed PATCH (expired, as a real token service's may be): the client
    must fetch a fresh token and send the body again. It reads every body it answers, keeps
    what it stores, and checks the digest itself, as distribution does."""

    protocol_version = "HTTP/1.1"
    tokens: ClassVar[list] = []
    patches: ClassVar[list] = []
    session: ClassVar[bytearray] = bytearray()
    blobs: ClassVar[dict] = {}

    def log_message(self, *args):
        pass

    def _reply(self, status, headers=None, body=b""):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _authorized(self) -> bool:
        got = self.headers.get("Authorization", "")
        if got.startswith("Bearer ") and got[7:] in self.tokens[-1:]:
            return True
        port = self.server.server_address[1]
        self._reply(401, {"WWW-Authenticate": f'Bearer realm="http://127.0.0.1:{port}/token",service="stub"'})
        return False

    def do_GET(self):
        if self.path.startswith("/token"):
            type(self).tokens.append(secrets.token_hex(8))
            return self._reply(200, {"Content-Type": "application/json"},
                               json.dumps({"token": self.tokens[-1], "expires_in": 300}).encode())
        self._reply(404)

    def do_HEAD(self):
        if self._authorized():
            self._reply(404)

    def do_POST(self):
        self._body()
        if self._authorized():
            self._reply(202, {"Location": "/v2/team/model/blobs/uploads/u1"})

    def do_PATCH(self):
        body = self._body()
        if not type(self).patches:
            type(self).tokens.append(secrets.token_hex(8))  # the token the client holds is now stale
        type(self).patches.append(len(body))
        if not self._authorized():
            return
        type(self).session.extend(body)
        self._reply(202, {"Location": "/v2/team/model/blobs/uploads/u1", "Range": f"0-{len(self.session) - 1}"})

    def do_PUT(self):
        body = self._body()
        if not self._authorized():
            return
        type(self).session.extend(body)
        digest = self.path.split("digest=", 1)[1].replace("%3A", ":")
        if oci.sha256_bytes(bytes(self.session)) != digest:
            return self._reply(400, {"Content-Type": "application/json"},
                               b'{"errors":[{"code":"DIGEST_INVALID","message":"digest did not match"}]}')
        type(self).blobs[digest] = bytes(self.session)
        self._reply(201, {"Location": f"/v2/team/model/blobs/{digest}"})


@pytest.fixture
def rechallenging_registry():
    handler = type("Rechallenging", (_RechallengingRegistry,), {"tokens": [], "patches": [], "session": bytearray(),
                                                           "blobs": {}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler, f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_streamed_upload_resent_after_a_re_challenge_is_not_a_false_mismatch(rechallenging_registry, tmp_path):
    handler, host = rechallenging_registry
    path, digest = _blob_file(tmp_path, 3 * oci.CHUNK + 17)
    client = oci.Client(credentials=lambda h: auth.Credentials("alice", "pw", "test"))
    result = oci.upload_blob(f"{host}/team/model", path, digest=digest, client=client)
    size = os.path.getsize(path)
    assert handler.patches == [size, size]  # refused once with a stale token, then sent again in full
    assert handler.blobs[digest] == Path(path).read_bytes()
    assert result == oci.UploadResult(digest, size, size)


def test_a_file_changed_after_hashing_is_refused_by_the_digest_check(rechallenging_registry, tmp_path):
    handler, host = rechallenging_registry
    path, digest = _blob_file(tmp_path, oci.CHUNK)
    Path(path).write_bytes(os.urandom(oci.CHUNK))  # same size, other bytes
    client = oci.Client(credentials=lambda h: auth.Credentials("alice", "pw", "test"))
    with pytest.raises(DigestMismatch, match="changed while it was uploaded"):
        oci.upload_blob(f"{host}/team/model", path, digest=digest, client=client)
    assert handler.blobs == {}


# ---------------------------------------------------------------- downloads: ranges, broken streams


class _BlobServer(BaseHTTPRequestHandler):
    """Serves one blob (anonymous): honours Range unless ``ranges`` is False, and cuts the
    first ``breaks`` answers off after ``cut`` bytes, as a dropped connection does."""

    protocol_version = "HTTP/1.1"
    blob = b""
    ranges = True
    breaks = 0
    cut = 0
    gzip = False  # send the whole blob gzip-compressed, whatever the client accepts
    hold_first = 0.0  # seconds to hold back the answer for the blob's first bytes: the parts finish out of order
    seen: ClassVar[list] = []
    done: ClassVar[list] = []  # the first byte of each answer, in the order they were sent in full
    encodings: ClassVar[list] = []

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.blob)))
        self.end_headers()

    def do_GET(self):
        type(self).seen.append(self.headers.get("Range"))
        type(self).encodings.append(self.headers.get("Accept-Encoding"))
        if self.gzip:
            body = gzip.compress(self.blob, compresslevel=1)
            self.send_response(200)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        start, end = 0, len(self.blob) - 1
        rng = self.headers.get("Range")
        if rng and self.ranges:
            a, _, b = rng.removeprefix("bytes=").partition("-")
            start, end = int(a), min(int(b) if b else end, end)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(self.blob)}")
        else:
            self.send_response(200)
        body = self.blob[start:end + 1]
        if start == 0 and self.hold_first:
            time.sleep(self.hold_first)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if type(self).breaks:
            type(self).breaks -= 1
            self.wfile.write(body[:self.cut])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)
        self.wfile.flush()
        type(self).done.append(start)


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made by the openssl CLI."""
    key, cert = folder / "key.pem", folder / "cert.pem"
    out = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                          "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=imgbuild-test",
                          "-addext", "subjectAltName=IP:127.0.0.1"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        unavailable(f"openssl cannot make a certificate: {out.stderr}")
    return cert, key


@pytest.fixture(params=["http", "https"])
def blob_server(request, tmp_path_factory, monkeypatch):
    """``(handler, ref, client)``: one blob served over plain http or over TLS (a self-signed
    certificate the client is given), the path every real registry takes."""
    handler = type("Blobs", (_BlobServer,), {"blob": os.urandom(5 * 1_000_000 + 7), "seen": [], "encodings": [],
                                             "done": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    client = oci.Client(credentials=lambda h: None, backoff_s=0.001)
    if request.param == "https":
        cert, key = _self_signed(tmp_path_factory.mktemp("tls"))
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        # requests lets these override a session's own CA bundle (they are set behind a proxy with its own CA)
        monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
        monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
        client = oci.Client(credentials=lambda h: None, backoff_s=0.001, ca_cert=cert, plain_http=False)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler, oci.parse_reference(f"127.0.0.1:{server.server_address[1]}/team/model"), client
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("ranges", [True, False])
def test_parallel_ranges_resume_and_broken_streams(blob_server, tmp_path, monkeypatch, ranges):
    handler, ref, client = blob_server
    handler.ranges = ranges
    monkeypatch.setattr(download, "RANGED_MIN_PART", 1_000_000)
    blob, digest = handler.blob, oci.sha256_bytes(handler.blob)
    out = tmp_path / "out"
    events = []
    with open(out, "w+b") as fh:
        got = oci.get_blob(ref, digest, fh, size=len(blob), client=client, streams=3,
                           progress=lambda *e: events.append(e))
    assert out.read_bytes() == blob
    if ranges:
        assert got == len(blob)
        assert sorted(handler.seen) == sorted(["bytes=0-1666668", "bytes=1666669-3333337", "bytes=3333338-5000006"])
    else:  # the registry ignored Range: read again in one stream from the start
        assert handler.seen[-1] is None
    assert events[-1] == ("download", digest, len(blob), len(blob))

    # A partial file is kept and only the rest asked for; a stream that breaks resumes.
    out.write_bytes(blob[:1_234_567])
    handler.seen.clear()
    handler.breaks, handler.cut = 1, 100_000
    with open(out, "r+b") as fh:
        got = oci.get_blob(ref, digest, fh, size=len(blob), client=client, streams=1)
    assert out.read_bytes() == blob
    if ranges:
        assert handler.seen == ["bytes=1234567-5000006", "bytes=1334567-5000006"]
        assert got == len(blob) - 1_234_567
    else:
        assert handler.seen[-1] is None


def test_the_range_split():
    """Ranges of at least RANGED_MIN_PART, at most ``streams``, covering the blob once; the
    first begins at 0 (its bytes below the offset a partial holds are not asked for)."""
    mib = download.RANGED_MIN_PART
    step = 10 * mib // 4
    assert download._split(0, 10 * mib, 4) == [(0, step), (step, 2 * step), (2 * step, 3 * step), (3 * step, 10 * mib)]
    assert download._split(0, 4 * mib, 4) == [(0, mib), (mib, 2 * mib), (2 * mib, 3 * mib), (3 * mib, 4 * mib)]
    assert download._split(0, 4 * mib + 1, 2) == [(0, 2 * mib + 1), (2 * mib + 1, 4 * mib + 1)]
    assert download._split(0, 2 * mib - 1, 4) == [(0, 2 * mib - 1)]  # two parts would be under the minimum
    assert download._split(mib, 3 * mib, 4) == [(0, 2 * mib), (2 * mib, 3 * mib)]  # a partial holds the first MiB
    assert download._split(5, 5, 4) == [(0, 5)]  # all there: one empty part
    for offset, size, streams in ((0, 7 * mib + 3, 3), (mib + 17, 9 * mib, 4), (0, 1, 4)):
        parts = download._split(offset, size, streams)
        assert parts[0][0] == 0 and parts[-1][1] == size and len(parts) <= streams
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:], strict=False))
        assert all(end - max(start, offset) >= mib for start, end in parts) or len(parts) == 1


@pytest.mark.parametrize("streams", [1, 3])
def test_a_corrupt_download_is_refused_and_counted(blob_server, tmp_path, monkeypatch, streams):
    handler, ref, client = blob_server
    monkeypatch.setattr(download, "RANGED_MIN_PART", 1_000_000)
    wrong = "sha256:" + "1" * 64
    with open(tmp_path / "out", "w+b") as fh, pytest.raises(DigestMismatch, match="corrupt") as exc:
        oci.get_blob(ref, wrong, fh, size=len(handler.blob), client=client, streams=streams)
    assert exc.value.received_bytes == len(handler.blob)
    assert len(handler.seen) == streams


def reads_back(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every (offset, bytes) the download reads back from the file it writes (os.preadv)."""
    read_back: list[tuple[int, int]] = []
    real_preadv = os.preadv

    def preadv(fd, buffers, offset):
        n = real_preadv(fd, buffers, offset)
        read_back.append((offset, n))
        return n
    monkeypatch.setattr(os, "preadv", preadv)
    return read_back


def test_parts_that_finish_out_of_order_are_hashed_in_order(blob_server, tmp_path, monkeypatch):
    """The answer for the first range is held back until the other two are in the file: the
    hash waits for the first part (sha256 is sequential), takes its pieces from the buffers
    they arrived in, then reads the other parts back from the file, in order."""
    handler, ref, client = blob_server
    handler.hold_first = 0.5
    monkeypatch.setattr(download, "RANGED_MIN_PART", 1_000_000)
    monkeypatch.setattr(download, "_hash_on_own_thread", lambda _others: True)
    read_back = reads_back(monkeypatch)
    out = tmp_path / "out"
    with open(out, "w+b") as fh:
        got = oci.get_blob(ref, oci.sha256_bytes(handler.blob), fh, size=len(handler.blob), client=client, streams=3)
    assert got == len(handler.blob) and out.read_bytes() == handler.blob
    first_end = 1_666_669
    assert handler.done[-1] == 0 and sorted(handler.done) == [0, first_end, 3_333_338]  # the first part finished last
    assert read_back and read_back[0][0] == first_end  # nothing of the first part read back; the rest in order
    assert [o for o, _ in read_back] == sorted(o for o, _ in read_back)
    assert sum(n for _, n in read_back) == len(handler.blob) - first_end


def test_a_hashing_thread_only_where_a_cpu_is_free_for_it(monkeypatch):
    """One CPU, a blob per CPU already moving (a pull's files at once), or a load average that
    fills the CPUs: the receiver hashes inline. The count of moving blobs goes back down when a
    blob ends, also by an error."""
    cases = ((1, 0, 0.0, False), (2, 0, 0.3, True), (2, 1, 0.0, False), (4, 2, 0.5, True), (4, 3, 0.0, False),
             (2, 0, 1.2, False), (16, 1, 10.0, True), (16, 1, 14.5, False))
    for cpus, others, load, threaded in cases:
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid, n=cpus: set(range(n)))
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        assert download._hash_on_own_thread(others) is threaded, (cpus, others, load)
    with download._MOVING.one() as first, download._MOVING.one() as second:
        assert (first, second) == (0, 1)
    with pytest.raises(KeyError), download._MOVING.one():
        raise KeyError
    with download._MOVING.one() as again:
        assert again == 0


def test_the_receiver_never_waits_for_the_hash(blob_server, tmp_path, monkeypatch):
    """With the hashing thread held until every byte is in the file (a machine whose cores are
    busy elsewhere), the download still completes: once the hand-over buffers are all queued,
    the receiver reads on into its own and the hash reads those pieces back from the file."""
    handler, ref, client = blob_server
    monkeypatch.setattr(download, "PIECES", 2)
    monkeypatch.setattr(download, "_hash_on_own_thread", lambda _others: True)
    all_in = threading.Event()
    hashed_by: set[str] = set()
    in_time: list[bool] = []
    real_update = download.ResumableSha256.update

    def held_update(self, data):
        in_time.append(all_in.wait(10))  # False: the last byte waited for the hash
        hashed_by.add(threading.current_thread().name)
        real_update(self, data)
    monkeypatch.setattr(download.ResumableSha256, "update", held_update)

    def progress(_event, _label, done, total):
        if done == total:
            all_in.set()
    out = tmp_path / "out"
    with open(out, "w+b") as fh:
        got = oci.get_blob(ref, oci.sha256_bytes(handler.blob), fh, size=len(handler.blob), client=client, streams=1,
                           progress=progress)
    assert got == len(handler.blob) and out.read_bytes() == handler.blob
    assert all(in_time) and hashed_by == {"blob-hash"}  # the receiver hashed nothing itself


def test_a_download_hashes_what_it_receives_and_reads_nothing_back(blob_server, tmp_path, monkeypatch):
    """Each piece is hashed from the buffer it arrived in, over http and https alike; the
    file is only written. (Before, plain http spliced the socket into the file and the hash
    read all of it back; https copied every piece through urllib3 and read it back too.)"""
    handler, ref, client = blob_server
    read_back = reads_back(monkeypatch)
    out = tmp_path / "out"
    with open(out, "w+b") as fh:
        got = oci.get_blob(ref, oci.sha256_bytes(handler.blob), fh, size=len(handler.blob), client=client, streams=1)
    assert got == len(handler.blob) and out.read_bytes() == handler.blob
    assert read_back == []

    # A partial with no saved hash: its own bytes are read to hash them, the rest is fetched and verified.
    out.write_bytes(handler.blob[:3_000_000])
    with open(out, "r+b") as fh:
        got = oci.get_blob(ref, oci.sha256_bytes(handler.blob), fh, size=len(handler.blob), client=client, streams=1)
    assert got == len(handler.blob) - 3_000_000 and out.read_bytes() == handler.blob
    assert sum(n for _, n in read_back) >= 3_000_000  # the partial was hashed, not trusted


def test_a_blob_sent_compressed_anyway_is_decoded(blob_server, tmp_path):
    """The request asks for the bytes as stored (Accept-Encoding: identity); a server or
    proxy that gzips them anyway is decoded, not taken for a corrupt blob."""
    handler, ref, client = blob_server
    handler.gzip = True
    out = tmp_path / "out"
    with open(out, "w+b") as fh:
        oci.get_blob(ref, oci.sha256_bytes(handler.blob), fh, size=len(handler.blob), client=client, streams=1)
    assert out.read_bytes() == handler.blob
    assert handler.encodings == ["identity"]


def test_retry_policy_honours_retry_after():
    policy = oci.RetryPolicy(retries=3, backoff_s=0.5, max_delay_s=60)
    assert [policy.delay(a) for a in range(3)] == [0.5, 1.0, 2.0]
    assert policy.delay(0, "7") == 7.0
    assert policy.delay(3, "1") == 4.0  # never less than the backoff
    assert policy.delay(0, "3600") == 60  # capped
    soon = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= policy.delay(0, soon) <= 31
    assert policy.delay(0, "not a date") == 0.5
