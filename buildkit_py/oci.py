"""A small OCI distribution client on ``requests``.

What it does and why it looks the way it does:

- Auth follows the registry's ``WWW-Authenticate`` challenge: Basic (htpasswd registries)
  or the Bearer token flow (realm/service/scope: Docker Hub, ghcr, Harbor...). After the
  first challenge the header is sent up front, so streamed bodies are never sent twice.
- Plain http for loopback registries (127.0.0.0/8, ::1, localhost), like dockerd's
  insecure default; https with ``ca_cert`` (a CA bundle path) or the system bundle else.
- Retries with exponential backoff only on transient failures: connection errors,
  timeouts, 429, 502, 503, 504. A 401 after credentials is an AuthenticationError that
  says how to log in; it is never retried. A refused connection ends as
  RegistryUnreachable.
- Blobs move in 1 MiB pieces with sha256 computed as they stream: memory stays flat for
  multi-GB files.

Module functions take an optional ``client``; pass one ``Client`` to share connections and
tokens across calls. Nothing here prints; progress goes to ``progress(event, path, done,
total)`` callbacks.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import BinaryIO
from urllib.parse import urljoin

import requests

from . import auth
from .errors import (
    AuthenticationError,
    DigestMismatch,
    ManifestNotFound,
    RegistryError,
    RegistryUnreachable,
    UsageError,
)

CHUNK = 1 << 20  # read/write/hash unit: 1 MiB
MONOLITHIC_MAX = 64 << 20  # blobs up to this size go in one streamed PUT
UPLOAD_CHUNK = 64 << 20  # PATCH size for larger blobs
MAX_MANIFEST_BYTES = 4 << 20  # distribution-spec's suggested manifest size limit
MAX_CONFIG_BYTES = 16 << 20

MEDIA_OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MEDIA_DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MEDIA_OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
MEDIA_OCTET = "application/octet-stream"
INDEX_TYPES = (MEDIA_OCI_INDEX, MEDIA_DOCKER_LIST)
MANIFEST_TYPES = (MEDIA_OCI_MANIFEST, MEDIA_DOCKER_MANIFEST)
ACCEPT = ", ".join(MANIFEST_TYPES + INDEX_TYPES)

TRANSIENT_STATUS = frozenset({429, 502, 503, 504})
DEFAULT_PLATFORM = "linux/amd64"

Progress = Callable[[str, str, int, int], None]

# ---------------------------------------------------------------- references

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
# \Z, not $ ($ also matches before a trailing newline); ASCII: \w would take any Unicode letter.
_REPO_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*\Z")
_TAG_RE = re.compile(r"^[\w][\w.-]{0,127}\Z", re.ASCII)
_DIGEST_RE = re.compile(r"^sha256:[a-f0-9]{64}\Z")
_HOST_RE = re.compile(r"^(?:\[[0-9a-fA-F:]+\]|[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?)(?::[0-9]+)?\Z")


@dataclass(frozen=True)
class Reference:
    """``registry/repository[:tag][@digest]``; ``tag`` is None when it was not written."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def api_host(self) -> str:
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    @property
    def reference(self) -> str:
        """What goes after ``/manifests/``: the digest when pinned, else the tag."""
        return self.digest or self.tag or "latest"

    def with_digest(self, digest: str) -> Reference:
        return replace(self, digest=digest)

    def with_tag(self, tag: str | None) -> Reference:
        return replace(self, tag=tag, digest=None)

    def __str__(self) -> str:
        text = f"{self.registry}/{self.repository}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def parse_reference(text: str) -> Reference:
    """Parse an image reference with the docker CLI's rules.

    The first path component is a registry when it has a ``.`` or ``:`` or is
    ``localhost``; else the registry is docker.io, where one-component names get
    ``library/``. Raises UsageError on anything malformed.
    """
    original = text
    text = text.strip()
    if not text or "://" in text:
        raise UsageError(f"invalid image reference {original!r}", hint="write host/repo:tag or host/repo@sha256:...")
    digest = None
    if "@" in text:
        text, digest = text.split("@", 1)
        if not _DIGEST_RE.match(digest):
            raise UsageError(f"invalid digest in reference {original!r}", hint="digests look like sha256:<64 hex>")
    tag = None
    slash = text.rfind("/")
    colon = text.rfind(":")
    if colon > slash:
        text, tag = text[:colon], text[colon + 1:]
        if not _TAG_RE.match(tag):
            raise UsageError(f"invalid tag {tag!r} in reference {original!r}")
    first, _, rest = text.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, rest
        if not _HOST_RE.match(registry):
            raise UsageError(f"invalid registry host {registry!r} in reference {original!r}")
    else:
        registry, repository = DOCKER_HUB, text
    if registry in ("index.docker.io", "registry-1.docker.io"):
        registry = DOCKER_HUB
    if registry == DOCKER_HUB and "/" not in repository:
        repository = f"library/{repository}"
    if not _REPO_RE.match(repository):
        raise UsageError(
            f"invalid repository name {repository!r} in reference {original!r}",
            hint="repository names are lowercase letters, digits and . _ - separators",
        )
    return Reference(registry, repository, tag, digest)


def as_reference(ref: Reference | str) -> Reference:
    return ref if isinstance(ref, Reference) else parse_reference(ref)


# ---------------------------------------------------------------- auth challenges

_CHALLENGE_PARAM = re.compile(r'([a-zA-Z_]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]+))')


@dataclass(frozen=True)
class Challenge:
    scheme: str  # "basic" or "bearer"
    params: dict

    @classmethod
    def parse(cls, header: str | None) -> Challenge | None:
        if not header:
            return None
        scheme, _, rest = header.strip().partition(" ")
        params = {m.group(1).lower(): (m.group(2) if m.group(2) is not None else m.group(3))
                  for m in _CHALLENGE_PARAM.finditer(rest)}
        return cls(scheme.lower(), params)


def pull_scope(repository: str) -> str:
    return f"repository:{repository}:pull"


def push_scope(repository: str) -> str:
    return f"repository:{repository}:pull,push"


@dataclass
class _Token:
    value: str
    expires_at: float


def is_loopback(host: str) -> bool:
    name = host
    if name.startswith("["):
        name = name[1:].split("]", 1)[0]
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _login_hint(host: str) -> str:
    return (f"run `imgbuild login {host}` (password on stdin), `docker login {host}`, or set "
            f"{auth.ENV_USER} and {auth.ENV_PASSWORD}")


def _registry_errors(resp: requests.Response) -> str:
    try:
        errors = resp.json().get("errors") or []
        parts = [f"{e.get('code', '?')}: {e.get('message', '')}".strip() for e in errors if isinstance(e, dict)]
        if parts:
            return "; ".join(parts)
    except (ValueError, AttributeError):
        pass
    return (resp.text or "").strip()[:200]


# ---------------------------------------------------------------- the client


class Client:
    """HTTP transport to registries: scheme choice, auth, retries. One per operation or
    shared; it caches challenges and tokens per host, nothing global."""

    def __init__(
        self,
        *,
        credentials: Callable[[str], auth.Credentials | None] | None = None,
        ca_cert: str | os.PathLike | None = None,
        timeout: tuple[float, float] = (10.0, 120.0),
        max_retries: int = 4,
        backoff_s: float = 0.5,
        plain_http: bool | None = None,
        session: requests.Session | None = None,
    ):
        self.session = session or requests.Session()
        self.session.headers.setdefault("User-Agent", "imgbuild")
        if ca_cert:
            self.session.verify = os.fspath(ca_cert)
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.plain_http = plain_http
        self._credentials = credentials or auth.resolve
        self._creds: dict[str, auth.Credentials | None] = {}
        self._challenge: dict[str, Challenge] = {}
        self._tokens: dict[tuple[str, tuple[str, ...]], _Token] = {}

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> Client:  # noqa: PYI034 (3.10 has no typing.Self)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- urls and credentials

    def base_url(self, host: str) -> str:
        plain = self.plain_http if self.plain_http is not None else is_loopback(host)
        return f"{'http' if plain else 'https'}://{host}"

    def credentials_for(self, host: str) -> auth.Credentials | None:
        if host not in self._creds:
            key = auth.DOCKER_HUB_KEY if host == DOCKER_HUB_API else host
            self._creds[host] = self._credentials(key)
        return self._creds[host]

    def use_credentials(self, host: str, creds: auth.Credentials | None) -> None:
        """Use ``creds`` for ``host`` from now on (login checks) and forget old tokens."""
        self._creds[host] = creds
        self._challenge.pop(host, None)
        for key in [k for k in self._tokens if k[0] == host]:
            del self._tokens[key]

    def check_login(self, host: str, creds: auth.Credentials) -> None:
        """GET /v2/ with ``creds``; AuthenticationError when the registry refuses them."""
        host = DOCKER_HUB_API if host == DOCKER_HUB else host
        self.use_credentials(host, creds)
        self.request("GET", host, "/v2/", expect=(200,))

    # -- transport

    def _sleep(self, attempt: int, resp: requests.Response | None = None) -> None:
        delay = self.backoff_s * (2 ** attempt)
        if resp is not None and resp.headers.get("Retry-After", "").isdigit():
            delay = max(delay, min(float(resp.headers["Retry-After"]), 60.0))
        time.sleep(delay)

    def send(self, method: str, url: str, *, retry: bool = True, **kwargs) -> requests.Response:
        """One HTTP exchange with backoff on transient failures. ``data`` must be
        replayable (bytes/None) when ``retry`` is true."""
        kwargs.setdefault("timeout", self.timeout)
        attempts = self.max_retries + 1 if retry else 1
        for attempt in range(attempts):
            try:
                resp = self.session.request(method, url, **kwargs)
            except (requests.ConnectionError, requests.Timeout) as exc:
                if attempt + 1 < attempts:
                    self._sleep(attempt)
                    continue
                raise RegistryUnreachable(
                    f"cannot reach registry at {url.split('/v2/')[0]}: {_short(exc)}",
                    hint="is the registry running and the address right? (scripts/services.sh up for the local one)",
                ) from exc
            if resp.status_code in TRANSIENT_STATUS and attempt + 1 < attempts:
                self._sleep(attempt, resp)
                resp.close()
                continue
            return resp
        raise AssertionError("unreachable")  # pragma: no cover

    def _auth_header(self, host: str, scope: tuple[str, ...]) -> dict:
        challenge = self._challenge.get(host)
        if challenge is None:
            return {}
        creds = self.credentials_for(host)
        if challenge.scheme == "basic":
            if creds is None or creds.identity_token:
                return {}
            return {"Authorization": _basic(creds.username, creds.password)}
        if challenge.scheme == "bearer":
            token = self._tokens.get((host, scope))
            if token is None or token.expires_at <= time.monotonic():
                token = self._fetch_token(host, challenge, scope)
            return {"Authorization": f"Bearer {token.value}"}
        return {}

    def _fetch_token(self, host: str, challenge: Challenge, scope: tuple[str, ...]) -> _Token:
        realm = challenge.params.get("realm")
        if not realm:
            raise RegistryError(f"registry {host} sent a Bearer challenge without a realm")
        service = challenge.params.get("service")
        creds = self.credentials_for(host)
        if creds and creds.identity_token:
            form = {"grant_type": "refresh_token", "refresh_token": creds.identity_token,
                    "client_id": "imgbuild", "access_type": "offline"}
            if service:
                form["service"] = service
            if scope:
                form["scope"] = " ".join(scope)
            resp = self.send("POST", realm, data=form)
        else:
            params = [("service", service)] if service else []
            params += [("scope", s) for s in scope]
            basic = {"Authorization": _basic(creds.username, creds.password)} if creds else {}
            resp = self.send("GET", realm, params=params, headers=basic)
        if resp.status_code in (401, 403):
            raise self._auth_error(host, scope, resp)
        if resp.status_code != 200:
            raise RegistryError(f"token service {realm} answered {resp.status_code}: {_registry_errors(resp)}")
        try:
            body = resp.json()
            value = body.get("token") or body.get("access_token")
            expires_in = float(body.get("expires_in") or 60)
        except (ValueError, AttributeError, TypeError) as exc:
            raise RegistryError(f"token service {realm} answered something that is not a token") from exc
        if not value:
            raise RegistryError(f"token service {realm} answered without a token")
        # Renew a little early so a token never expires in the middle of a request.
        token = _Token(value, time.monotonic() + max(expires_in - 15, expires_in / 2))
        self._tokens[(host, scope)] = token
        return token

    def _auth_error(self, host: str, scope: tuple[str, ...], resp: requests.Response) -> AuthenticationError:
        creds = self.credentials_for(host)
        what = f" for {', '.join(scope)}" if scope else ""
        detail = _registry_errors(resp)
        if creds is None:
            message = f"registry {host} requires authentication{what} and no credentials were found"
        elif resp.status_code == 403:
            message = f"registry {host} denied access{what} to {creds.username!r} ({creds.source})"
        else:
            message = f"registry {host} rejected the credentials of {creds.username!r} from {creds.source}{what}"
        if detail:
            message += f" [{detail}]"
        return AuthenticationError(message, hint=_login_hint(host))

    def request(
        self,
        method: str,
        host: str,
        path: str,
        *,
        scope: tuple[str, ...] | str = (),
        expect: tuple[int, ...] = (200,),
        headers: dict | None = None,
        body: bytes | Callable[[], Iterable[bytes]] | None = None,
        retry: bool = True,
        **kwargs,
    ) -> requests.Response:
        """A registry API call. ``path`` is ``/v2/...`` or an absolute URL (upload
        locations). ``body`` is bytes or a factory of a fresh iterable (a streamed body
        can then be sent again after an auth challenge). Raises on a status not in
        ``expect``."""
        if isinstance(scope, str):
            scope = (scope,)
        url = urljoin(self.base_url(host) + "/", path)
        challenged = False
        while True:
            hdrs = dict(headers or {})
            hdrs.update(self._auth_header(host, scope))
            data = body() if callable(body) else body
            streamed = callable(body)
            resp = self.send(method, url, headers=hdrs, data=data, retry=retry and not streamed, **kwargs)
            if resp.status_code == 401 and not challenged:
                challenge = Challenge.parse(resp.headers.get("WWW-Authenticate"))
                sent_auth = "Authorization" in hdrs
                # Retry once: after learning the scheme, or with a fresh token (expired,
                # or too narrow a scope). Basic credentials that were sent are just wrong.
                if challenge and challenge.scheme in ("basic", "bearer") and (
                    not sent_auth or challenge.scheme == "bearer"
                ):
                    resp.close()
                    self._challenge[host] = challenge
                    self._tokens.pop((host, scope), None)
                    if challenge.scheme == "basic" and self.credentials_for(host) is None:
                        raise self._auth_error(host, scope, resp)
                    challenged = True
                    continue
            if resp.status_code in (401, 403) and resp.status_code not in expect:
                raise self._auth_error(host, scope, resp)
            if resp.status_code not in expect:
                detail = _registry_errors(resp)
                resp.close()
                if resp.status_code == 404 and "/manifests/" in url:
                    raise ManifestNotFound(f"{method} {path}: not found on {host} [{detail}]")
                raise RegistryError(f"{method} {url} answered {resp.status_code}: {detail}")
            return resp


def _basic(username: str, password: str) -> str:
    import base64

    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def _short(exc: BaseException) -> str:
    text = str(exc)
    if "Connection refused" in text or "Errno 111" in text:
        return "connection refused"
    return text[:200]


# ---------------------------------------------------------------- manifests


def _media_type(resp: requests.Response, body: dict) -> str:
    header = (resp.headers.get("Content-Type") or "").split(";", 1)[0].strip()
    return body.get("mediaType") or header


def sha256_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def fetch_manifest(ref: Reference | str, *, client: Client | None = None) -> tuple[bytes, str, str]:
    """The manifest bytes as stored (index or manifest), their digest and media type."""
    ref = as_reference(ref)
    client = client or Client()
    resp = client.request("GET", ref.api_host, f"/v2/{ref.repository}/manifests/{ref.reference}",
                          scope=pull_scope(ref.repository), headers={"Accept": ACCEPT}, stream=True)
    with resp:
        raw = _read_limited(resp, MAX_MANIFEST_BYTES, f"manifest of {ref}")
    digest = sha256_bytes(raw)
    if ref.digest and digest != ref.digest:
        raise DigestMismatch(f"manifest of {ref} has digest {digest}, not the pinned {ref.digest}")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise RegistryError(f"manifest of {ref} is not JSON") from exc
    media_type = _media_type(resp, body)
    if media_type not in MANIFEST_TYPES + INDEX_TYPES:
        raise RegistryError(f"{ref} has unsupported manifest type {media_type!r}",
                            hint="only OCI and Docker schema 2 manifests are supported")
    return raw, digest, media_type


def get_manifest(ref: Reference | str, *, platform: str = DEFAULT_PLATFORM,
                 client: Client | None = None) -> tuple[dict, str, str]:
    """``(manifest, digest, media_type)``. For an index (multi-platform image) the entry
    for ``platform`` is fetched and returned."""
    ref = as_reference(ref)
    client = client or Client()
    raw, digest, media_type = fetch_manifest(ref, client=client)
    body = json.loads(raw)
    if media_type in INDEX_TYPES:
        child = select_platform(body, platform, str(ref))
        raw, digest, media_type = fetch_manifest(ref.with_digest(child["digest"]), client=client)
        body = json.loads(raw)
        if media_type in INDEX_TYPES:
            raise RegistryError(f"{ref}: nested index for {platform} is not supported")
    return body, digest, media_type


def select_platform(index: dict, platform: str, what: str = "image") -> dict:
    os_name, _, rest = platform.partition("/")
    arch, _, variant = rest.partition("/")
    seen = []
    for entry in index.get("manifests") or []:
        p = entry.get("platform") or {}
        seen.append("/".join(x for x in (p.get("os"), p.get("architecture"), p.get("variant")) if x))
        if p.get("os") == os_name and p.get("architecture") == arch and (not variant or p.get("variant") == variant):
            return entry
    raise RegistryError(f"{what} has no {platform} manifest (has: {', '.join(seen) or 'none'})")


def put_manifest(ref: Reference | str, manifest: dict | bytes, media_type: str | None = None, *,
                 client: Client | None = None) -> str:
    """PUT a manifest under ``ref``'s tag (or its digest). Returns the digest."""
    ref = as_reference(ref)
    client = client or Client()
    raw = manifest if isinstance(manifest, bytes) else canonical_json(manifest)
    if media_type is None:
        media_type = json.loads(raw).get("mediaType") or MEDIA_OCI_MANIFEST
    digest = sha256_bytes(raw)
    target = ref.tag or ref.digest or digest
    if ref.digest and not ref.tag and ref.digest != digest:
        raise DigestMismatch(f"manifest digest {digest} does not match the reference {ref}")
    resp = client.request("PUT", ref.api_host, f"/v2/{ref.repository}/manifests/{target}",
                          scope=push_scope(ref.repository), expect=(201, 200),
                          headers={"Content-Type": media_type}, body=raw)
    resp.close()
    echoed = resp.headers.get("Docker-Content-Digest")
    if echoed and echoed.startswith("sha256:") and echoed != digest:
        raise RegistryError(f"registry stored manifest {ref} as {echoed}, expected {digest}")
    return digest


def canonical_json(obj) -> bytes:
    """Deterministic bytes for a document we create: same content, same digest."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def delete_manifest(ref: Reference | str, *, client: Client | None = None) -> str:
    """Delete a manifest (resolving a tag to its digest first). Returns the digest."""
    ref = as_reference(ref)
    client = client or Client()
    digest = ref.digest or fetch_manifest(ref, client=client)[1]
    client.request("DELETE", ref.api_host, f"/v2/{ref.repository}/manifests/{digest}",
                   scope=f"repository:{ref.repository}:delete,pull,push", expect=(202, 200, 404)).close()
    return digest


def get_image_config(ref: Reference | str, *, platform: str = DEFAULT_PLATFORM,
                     client: Client | None = None) -> dict:
    """The image config (labels, env, entrypoint) read from the registry without pulling
    any layer."""
    ref = as_reference(ref)
    client = client or Client()
    manifest, _, _ = get_manifest(ref, platform=platform, client=client)
    desc = manifest.get("config") or {}
    digest, size = desc.get("digest"), int(desc.get("size") or 0)
    if not digest:
        raise RegistryError(f"manifest of {ref} has no config descriptor")
    if size > MAX_CONFIG_BYTES:
        raise RegistryError(f"config of {ref} is {size} bytes, more than an image config should be")
    raw = read_blob(ref, digest, client=client, limit=MAX_CONFIG_BYTES)
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise RegistryError(f"config blob {digest} of {ref} is not JSON") from exc


# ---------------------------------------------------------------- blobs: read


def head_blob(ref: Reference | str, digest: str, *, client: Client | None = None) -> int | None:
    """The blob's size when the repository has it, else None."""
    ref = as_reference(ref)
    client = client or Client()
    resp = client.request("HEAD", ref.api_host, f"/v2/{ref.repository}/blobs/{digest}",
                          scope=pull_scope(ref.repository), expect=(200, 404))
    resp.close()
    if resp.status_code == 404:
        return None
    return int(resp.headers.get("Content-Length") or 0)


def blob_exists(ref: Reference | str, digest: str, *, client: Client | None = None) -> bool:
    return head_blob(ref, digest, client=client) is not None


def read_blob(ref: Reference | str, digest: str, *, client: Client | None = None, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """A small blob into memory (configs), digest verified."""
    ref = as_reference(ref)
    client = client or Client()
    resp = client.request("GET", ref.api_host, f"/v2/{ref.repository}/blobs/{digest}",
                          scope=pull_scope(ref.repository), stream=True)
    with resp:
        raw = _read_limited(resp, limit, f"blob {digest}")
    if sha256_bytes(raw) != digest:
        raise DigestMismatch(f"blob {digest} of {ref} does not match its digest (got {sha256_bytes(raw)})")
    return raw


def _read_limited(resp: requests.Response, limit: int, what: str) -> bytes:
    parts, total = [], 0
    for piece in resp.iter_content(CHUNK):
        total += len(piece)
        if total > limit:
            raise RegistryError(f"{what} is larger than {limit} bytes")
        parts.append(piece)
    return b"".join(parts)


_STREAM_ERRORS = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)


def get_blob(ref: Reference | str, digest: str, dest_file: BinaryIO, offset: int = 0, *,
             size: int | None = None, client: Client | None = None,
             progress: Progress | None = None, label: str = "") -> int:
    """Stream a blob into ``dest_file`` (binary, opened ``r+b``/``w+b``), verifying its
    sha256; returns the bytes received over the network.

    With ``offset`` > 0 the first ``offset`` bytes already in ``dest_file`` are hashed
    locally and only the rest is requested (``Range``). A registry that ignores the range
    gets the file rewritten from the start. A broken stream resumes from where it broke
    (transient errors, with backoff). Raises DigestMismatch when the bytes do not match;
    what was written stays in ``dest_file`` for the caller to discard.
    """
    ref = as_reference(ref)
    client = client or Client()
    expected = digest.split(":", 1)[1]
    hasher = hashlib.sha256()
    if size is not None and offset > size:
        offset = 0
    if offset:
        dest_file.seek(0)
        remaining = offset
        while remaining:
            piece = dest_file.read(min(CHUNK, remaining))
            if not piece:
                break
            hasher.update(piece)
            remaining -= len(piece)
        offset -= remaining  # the file was shorter than the caller said
    dest_file.seek(0, os.SEEK_END)
    if dest_file.tell() != offset:
        # Only when needed: on ext4 a truncate makes close() wait for writeback
        # (auto_da_alloc), which costs a second per GiB.
        dest_file.truncate(offset)
    dest_file.seek(offset)
    pos, received, failures = offset, 0, 0
    total = size or 0
    path = f"/v2/{ref.repository}/blobs/{digest}"
    while size is None or pos < size:
        headers = {"Range": f"bytes={pos}-"} if pos else {}
        resp = client.request("GET", ref.api_host, path, scope=pull_scope(ref.repository),
                              expect=(200, 206, 416), headers=headers, stream=True)
        with resp:
            if resp.status_code == 416:  # asked past the end: the local part is all of it
                break
            if resp.status_code == 206:
                start = _content_range_start(resp.headers.get("Content-Range"))
                if start != pos:
                    raise RegistryError(f"registry answered range {resp.headers.get('Content-Range')} for bytes={pos}-")
                if size is None:
                    total = _content_range_total(resp.headers.get("Content-Range")) or 0
            else:
                if pos:  # the registry ignored Range: start over
                    hasher = hashlib.sha256()
                    dest_file.seek(0)
                    dest_file.truncate(0)
                    pos = 0
                if size is None:
                    total = int(resp.headers.get("Content-Length") or 0)
            try:
                for piece in resp.iter_content(CHUNK):
                    dest_file.write(piece)
                    hasher.update(piece)
                    pos += len(piece)
                    received += len(piece)
                    if progress:
                        progress("download", label or digest, pos, total)
            except _STREAM_ERRORS:
                failures += 1
                if failures > client.max_retries:
                    raise RegistryUnreachable(f"download of {digest} from {ref.registry} kept failing at byte {pos}")
                client._sleep(failures - 1)
                continue
        if size is None:
            break
        if pos < size:  # a clean end before the promised size: ask for the rest
            failures += 1
            if failures > client.max_retries:
                break
    dest_file.flush()
    error = None
    if size is not None and pos != size:
        error = DigestMismatch(f"blob {digest} of {ref}: got {pos} bytes, the manifest says {size}")
    elif (got := hasher.hexdigest()) != expected:
        error = DigestMismatch(f"blob {digest} of {ref} is corrupt: its content hashes to sha256:{got}",
                               hint="the registry's copy is damaged or was tampered with; push it again")
    if error:
        error.received_bytes = received  # what crossed the network before the check failed
        raise error
    return received


def _content_range_start(header: str | None) -> int | None:
    m = re.match(r"bytes (\d+)-\d+/(\d+|\*)", header or "")
    return int(m.group(1)) if m else None


def _content_range_total(header: str | None) -> int | None:
    m = re.match(r"bytes \d+-\d+/(\d+)", header or "")
    return int(m.group(1)) if m else None


# ---------------------------------------------------------------- blobs: write


def sha256_file(path: str | os.PathLike, progress: Progress | None = None, label: str = "") -> tuple[str, int]:
    """``(digest, size)`` of a file, read in 1 MiB pieces."""
    hasher, size = hashlib.sha256(), 0
    total = os.path.getsize(path)
    with open(path, "rb") as fh:
        while piece := fh.read(CHUNK):
            hasher.update(piece)
            size += len(piece)
            if progress:
                progress("hash", label or os.fspath(path), size, total)
    return "sha256:" + hasher.hexdigest(), size


@dataclass(frozen=True)
class UploadResult:
    digest: str
    size: int
    uploaded_bytes: int  # 0 when the registry had it already (or mounted it)


def start_upload(ref: Reference, *, client: Client, mount: tuple[str, str] | None = None) -> tuple[str, bool]:
    """POST an upload session. With ``mount=(digest, from_repo)`` the registry may link
    the blob from another repository: returns ``(location, mounted)``."""
    params = {"mount": mount[0], "from": mount[1]} if mount else None
    scope = (push_scope(ref.repository),) + ((pull_scope(mount[1]),) if mount else ())
    resp = client.request("POST", ref.api_host, f"/v2/{ref.repository}/blobs/uploads/", scope=scope,
                          expect=(201, 202), params=params, headers={"Content-Length": "0"})
    resp.close()
    location = resp.headers.get("Location")
    if resp.status_code == 201:
        return location or "", True
    if not location:
        raise RegistryError(f"registry {ref.registry} started an upload without a Location")
    return urljoin(client.base_url(ref.api_host) + "/", location), False


class _SizedBody:
    """An iterable body of known length: requests then sends Content-Length and streams
    the pieces instead of switching to chunked transfer encoding."""

    def __init__(self, pieces: Iterable[bytes], length: int):
        self._pieces, self._length = pieces, length

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._pieces)


def _file_pieces(path, start: int, length: int, hasher, counter: list, progress, label, total) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        fh.seek(start)
        left = length
        while left:
            piece = fh.read(min(CHUNK, left))
            if not piece:
                raise RegistryError(f"{path} shrank while it was being uploaded")
            left -= len(piece)
            if hasher is not None:
                hasher.update(piece)
            counter[0] += len(piece)
            if progress:
                progress("upload", label, start + length - left, total)
            yield piece


def upload_blob(ref: Reference | str, path: str | os.PathLike, *, digest: str | None = None,
                client: Client | None = None, progress: Progress | None = None, label: str = "",
                skip_existing: bool = True) -> UploadResult:
    """Upload a file as a blob, streamed. Up to MONOLITHIC_MAX: POST then one PUT with a
    generator body; larger: PATCH chunks of UPLOAD_CHUNK then the closing PUT. sha256 is
    computed while streaming and must equal ``digest`` when given (a file that changed
    mid-upload is refused). Skips the upload when the registry has the blob."""
    ref = as_reference(ref)
    client = client or Client()
    path = os.fspath(path)
    label = label or path
    size = os.path.getsize(path)
    if digest is None and size <= MONOLITHIC_MAX:
        digest, size = sha256_file(path)
    if digest and skip_existing and blob_exists(ref, digest, client=client):
        if progress:
            progress("exists", label, size, size)
        return UploadResult(digest, size, 0)
    failures = 0
    while True:
        try:
            if size <= MONOLITHIC_MAX and digest:
                return _upload_monolithic(ref, path, digest, size, client, progress, label)
            return _upload_chunked(ref, path, digest, size, client, progress, label)
        except RegistryUnreachable:
            # A broken stream: start a fresh upload session, with backoff.
            failures += 1
            if failures > client.max_retries:
                raise
            client._sleep(failures - 1)


def _upload_monolithic(ref, path, digest, size, client, progress, label) -> UploadResult:
    """One streamed PUT ?digest=. The digest is known (hashed once, before); the registry
    hashes what it receives and refuses a mismatch, which is how a file that changed
    since it was hashed shows up."""
    location, _ = start_upload(ref, client=client)
    counter = [0]

    def body():
        counter[0] = 0  # a resend (after an auth re-challenge) counts from the start
        return _SizedBody(_file_pieces(path, 0, size, None, counter, progress, label, size), size)

    try:
        resp = client.request("PUT", ref.api_host, location, scope=push_scope(ref.repository), expect=(201,),
                              params={"digest": digest}, body=body,
                              headers={"Content-Type": MEDIA_OCTET, "Content-Length": str(size)})
    except RegistryError as exc:
        if "DIGEST_INVALID" in str(exc):
            raise DigestMismatch(f"{path} changed while it was uploaded (expected {digest})") from exc
        raise
    resp.close()
    return UploadResult(digest, size, counter[0])


def _chunk_body(path, start: int, length: int, base, counter: list, progress, label, total):
    """A replayable body for one PATCH: each call restarts from ``base``'s hash state and
    byte count, so a resend after an auth challenge is hashed once."""
    state = {"hasher": base.copy()}
    sent_before = counter[0]

    def body():
        state["hasher"] = base.copy()
        counter[0] = sent_before
        return _SizedBody(_file_pieces(path, start, length, state["hasher"], counter, progress, label, total), length)

    return body, state


def _upload_chunked(ref, path, digest, size, client, progress, label) -> UploadResult:
    location, _ = start_upload(ref, client=client)
    hasher, counter = hashlib.sha256(), [0]
    scope = push_scope(ref.repository)
    offset = 0
    while offset < size:
        length = min(UPLOAD_CHUNK, size - offset)
        body, state = _chunk_body(path, offset, length, hasher, counter, progress, label, size)
        resp = client.request("PATCH", ref.api_host, location, scope=scope, expect=(202,), body=body,
                              retry=False,
                              headers={"Content-Type": MEDIA_OCTET, "Content-Length": str(length),
                                       "Content-Range": f"{offset}-{offset + length - 1}"})
        resp.close()
        hasher = state["hasher"]
        location = urljoin(client.base_url(ref.api_host) + "/", resp.headers.get("Location") or location)
        offset += length
    computed = "sha256:" + hasher.hexdigest()
    if digest and computed != digest:
        client.request("DELETE", ref.api_host, location, scope=scope, expect=(204, 404, 202)).close()
        raise DigestMismatch(f"{path} changed while it was uploaded (expected {digest}, sent {computed})")
    client.request("PUT", ref.api_host, location, scope=scope, expect=(201,), params={"digest": computed},
                   headers={"Content-Length": "0", "Content-Type": MEDIA_OCTET}).close()
    return UploadResult(computed, size, counter[0])


def upload_bytes(ref: Reference | str, data: bytes, *, client: Client | None = None) -> UploadResult:
    """A small in-memory blob (configs): skipped when present, else one PUT."""
    ref = as_reference(ref)
    client = client or Client()
    digest = sha256_bytes(data)
    if blob_exists(ref, digest, client=client):
        return UploadResult(digest, len(data), 0)
    location, _ = start_upload(ref, client=client)
    client.request("PUT", ref.api_host, location, scope=push_scope(ref.repository), expect=(201,),
                   params={"digest": digest}, body=data,
                   headers={"Content-Type": MEDIA_OCTET, "Content-Length": str(len(data))}).close()
    return UploadResult(digest, len(data), len(data))


def delete_blob(ref: Reference | str, digest: str, *, client: Client | None = None) -> None:
    ref = as_reference(ref)
    client = client or Client()
    client.request("DELETE", ref.api_host, f"/v2/{ref.repository}/blobs/{digest}",
                   scope=f"repository:{ref.repository}:delete,pull,push", expect=(202, 200, 404)).close()


# ---------------------------------------------------------------- copy (mirror)


def _copy_blob(src: Reference, dest: Reference, desc: dict, client: Client, progress: Progress | None) -> int:
    digest, size = desc["digest"], int(desc.get("size") or 0)
    if blob_exists(dest, digest, client=client):
        if progress:
            progress("exists", digest, size, size)
        return 0
    mount = (digest, src.repository) if src.registry == dest.registry and src.repository != dest.repository else None
    location, mounted = start_upload(dest, client=client, mount=mount)
    if mounted:
        if progress:
            progress("mounted", digest, size, size)
        return 0
    failures = 0
    while True:
        try:
            return _stream_blob(src, dest, digest, size, location, client, progress)
        except RegistryUnreachable:
            failures += 1
            if failures > client.max_retries:
                raise
            client._sleep(failures - 1)
            location, _ = start_upload(dest, client=client)


def _stream_blob(src, dest, digest, size, location, client, progress) -> int:
    counter = [0]

    def body():
        counter[0] = 0
        resp = client.request("GET", src.api_host, f"/v2/{src.repository}/blobs/{digest}",
                              scope=pull_scope(src.repository), stream=True)

        def pieces():
            with resp:
                for piece in resp.iter_content(CHUNK):
                    counter[0] += len(piece)
                    if progress:
                        progress("copy", digest, counter[0], size)
                    yield piece
        return _SizedBody(pieces(), size)

    # The destination checks the digest of what it receives (PUT ?digest=), so a corrupt
    # source blob is refused there, not stored.
    client.request("PUT", dest.api_host, location, scope=push_scope(dest.repository), expect=(201,),
                   params={"digest": digest}, body=body,
                   headers={"Content-Type": MEDIA_OCTET, "Content-Length": str(size)}).close()
    return counter[0]


def _copy_manifest(src: Reference, dest: Reference, raw: bytes, media_type: str, client: Client,
                   progress: Progress | None) -> None:
    body = json.loads(raw)
    for desc in [body.get("config")] + list(body.get("layers") or []):
        if desc and not desc.get("urls"):  # foreign layers stay where they are
            _copy_blob(src, dest, desc, client, progress)


def copy_image(src_ref: Reference | str, dest_ref: Reference | str, *, all_platforms: bool = False,
               platform: str = DEFAULT_PLATFORM, client: Client | None = None,
               progress: Progress | None = None) -> str:
    """Copy an image between repositories or registries (``imgbuild mirror``): blobs the
    destination lacks, then the manifest bytes unchanged, so the digest is the same.

    For a multi-platform source, copies the ``platform`` manifest only, or with
    ``all_platforms`` every child and the index. The destination tag defaults to the
    source's. Returns the digest now tagged at the destination.
    """
    src, dest = as_reference(src_ref), as_reference(dest_ref)
    client = client or Client()
    raw, digest, media_type = fetch_manifest(src, client=client)
    if media_type in INDEX_TYPES:
        index = json.loads(raw)
        if all_platforms:
            for entry in index.get("manifests") or []:
                child_raw, child_digest, child_type = fetch_manifest(src.with_digest(entry["digest"]), client=client)
                if child_type in INDEX_TYPES:
                    raise RegistryError(f"{src}: nested indexes are not supported")
                _copy_manifest(src, dest, child_raw, child_type, client, progress)
                put_manifest(Reference(dest.registry, dest.repository, None, child_digest), child_raw,
                             child_type, client=client)
        else:
            entry = select_platform(index, platform, str(src))
            raw, digest, media_type = fetch_manifest(src.with_digest(entry["digest"]), client=client)
    if media_type not in INDEX_TYPES:
        _copy_manifest(src, dest, raw, media_type, client, progress)
    tag = dest.tag or src.tag
    target = Reference(dest.registry, dest.repository, tag, None if tag else digest)
    put_manifest(target, raw, media_type, client=client)
    if progress:
        progress("manifest", str(target), len(raw), len(raw))
    return digest
