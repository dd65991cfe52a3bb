"""HTTP transport to registries: scheme choice, the auth challenge flows, and the one retry
policy every registry exchange follows.

- Auth follows the registry's ``WWW-Authenticate`` challenge: Basic (htpasswd registries)
  or the Bearer token flow (realm/service/scope: Docker Hub, ghcr, Harbor...). After the
  first challenge the header is sent up front, so streamed bodies are rarely sent twice;
  when they are (a stale token), the body factory starts them again from the beginning.
- Plain http for loopback registries (127.0.0.0/8, ::1, localhost), like dockerd's
  insecure default; https with ``ca_cert`` (a CA bundle path) or the system bundle else.
- ``RetryPolicy``: retries only transient failures (connection errors, timeouts, broken
  streams, 429, 502, 503, 504) with exponential backoff, never less than the registry's
  ``Retry-After``. A 401 after credentials is an AuthenticationError that says how to log
  in; it is never retried. A refused connection ends as RegistryUnreachable.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

import requests
import urllib3.exceptions

from buildkit_py.errors import (
    AuthenticationError,
    ManifestNotFound,
    NotARegistry,
    RegistryError,
    RegistryUnreachable,
)
from buildkit_py.oci import auth
from buildkit_py.reference import DOCKER_HUB_API, api_host, is_loopback

# progress(event, label, done, total); may be called from worker threads.
Progress = Callable[[str, str, int, int], None]

TRANSIENT_STATUS = frozenset({429, 502, 503, 504})
# Errors of a connection or of a body in flight that a retry may cure.
# (``raw.readinto`` raises urllib3's own errors, not requests' wrappers.)
STREAM_ERRORS = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
                 urllib3.exceptions.ProtocolError, urllib3.exceptions.ReadTimeoutError, ConnectionError, TimeoutError)


@dataclass(frozen=True)
class RetryPolicy:
    """The one retry rule: up to ``retries`` more tries after a transient failure, waiting
    ``backoff_s * 2**attempt`` and at least what the registry's ``Retry-After`` asks (seconds
    or an HTTP date), never more than ``max_delay_s``."""

    retries: int = 4
    backoff_s: float = 0.5
    max_delay_s: float = 60.0

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        delay = self.backoff_s * (2 ** attempt)
        asked = _retry_after_seconds(retry_after)
        if asked is not None:
            delay = max(delay, asked)
        return float(min(delay, self.max_delay_s))

    def wait(self, attempt: int, resp: requests.Response | None = None) -> None:
        time.sleep(self.delay(attempt, resp.headers.get("Retry-After") if resp is not None else None))


def _retry_after_seconds(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def sha256_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def read_limited(resp: requests.Response, limit: int, what: str) -> bytes:
    parts, total = [], 0
    for piece in resp.iter_content(1 << 20):
        total += len(piece)
        if total > limit:
            raise RegistryError(f"{what} is larger than {limit} bytes")
        parts.append(piece)
    return b"".join(parts)


_CHALLENGE_PARAM = re.compile(r'([a-zA-Z_]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]+))')


@dataclass(frozen=True)
class Challenge:
    scheme: str  # "basic" or "bearer"
    params: dict[str, str]

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


def _login_hint(host: str) -> str:
    return (f"run `imgbuild login {host}` (password on stdin), `docker login {host}`, or set "
            f"{auth.ENV_USER} and {auth.ENV_PASSWORD}")


_TITLE = re.compile(rb"<title[^>]*>([^<]{1,200})</title>", re.I)


def web_page(resp: requests.Response) -> str | None:
    """How to name an answer that is a web page, not the registry API (``an HTML page ("Welcome to
    nginx!")``), else None. A registry answers its API in JSON, with the
    Docker-Distribution-API-Version header where it sends one; an HTML page without that header
    came from something else at the address (a web server, a login portal, a proxy)."""
    content_type = resp.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
    if content_type not in ("text/html", "application/xhtml+xml") or "Docker-Distribution-API-Version" in resp.headers:
        return None
    try:  # the page's first 8 KiB, for its title: a page, not a blob, so nothing else reads it
        head = next(resp.iter_content(8192), b"")
    except (requests.RequestException, OSError, TypeError):  # TypeError: a body already read as a stream
        head = b""
    title = _TITLE.search(head or b"")
    words = " ".join(title.group(1).decode("utf-8", "replace").split()) if title else ""
    return f'an HTML page ("{words[:80]}")' if words else "an HTML page"


def _registry_errors(resp: requests.Response) -> str:
    if (page := web_page(resp)) is not None:  # never the page's markup in a message
        return page
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
        ca_cert: str | os.PathLike[str] | None = None,
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
        self.retry = RetryPolicy(max_retries, backoff_s)
        self.plain_http = plain_http
        self._credentials = credentials or auth.resolve
        self._creds: dict[str, auth.Credentials | None] = {}
        self._challenge: dict[str, Challenge] = {}
        self._tokens: dict[tuple[str, tuple[str, ...]], _Token] = {}

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> Client:  # noqa: PYI034 (3.10 has no typing.Self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- urls and credentials

    def base_url(self, host: str) -> str:
        return f"{'http' if self.plain(host) else 'https'}://{host}"

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
        host = api_host(host)
        self.use_credentials(host, creds)
        self.request("GET", host, "/v2/", expect=(200,))

    # -- transport

    @property
    def max_retries(self) -> int:
        return self.retry.retries

    def plain(self, host: str) -> bool:
        return self.plain_http if self.plain_http is not None else is_loopback(host)

    def send(self, method: str, url: str, *, retry: bool = True, **kwargs: Any) -> requests.Response:
        """One HTTP exchange with backoff on transient failures. ``data`` must be
        replayable (bytes/None) when ``retry`` is true."""
        kwargs.setdefault("timeout", self.timeout)
        attempts = self.retry.retries + 1 if retry else 1
        for attempt in range(attempts):
            try:
                resp = self.session.request(method, url, **kwargs)
            except (requests.ConnectionError, requests.Timeout) as exc:
                # a name that does not resolve is most often a typo: one more try, not the whole backoff
                last = attempts if not _unresolved(exc) else min(attempts, 2)
                if attempt + 1 < last:
                    self.retry.wait(attempt)
                    continue
                base = url.split("/v2/", maxsplit=1)[0]
                raise RegistryUnreachable(f"cannot reach registry at {base}: {connection_failure(exc)}",
                                          hint=unreachable_hint(base.split("://", 1)[-1])) from exc
            if resp.status_code in TRANSIENT_STATUS and attempt + 1 < attempts:
                self.retry.wait(attempt, resp)
                resp.close()
                continue
            return resp
        raise AssertionError("unreachable")  # pragma: no cover

    def auth_header(self, host: str, scope: tuple[str, ...]) -> dict[str, str]:
        """The Authorization header for ``scope`` on ``host`` as far as the challenge is known."""
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
        headers: dict[str, str] | None = None,
        body: bytes | Callable[[], Iterable[bytes]] | None = None,
        retry: bool = True,
        **kwargs: Any,
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
            hdrs.update(self.auth_header(host, scope))
            data = body() if callable(body) else body
            streamed = callable(body)
            resp = self.send(method, url, headers=hdrs, data=data, retry=retry and not streamed, **kwargs)
            if (page := web_page(resp)) is not None:
                resp.close()
                raise NotARegistry(f"{host} is not a container registry: {method} {path} answered HTTP "
                                   f"{resp.status_code} with {page}, not the registry API",
                                   hint=f"check the address: a registry answers its API under "
                                        f"{self.base_url(host)}/v2/ (e.g. 127.0.0.1:5000, ghcr.io); a web page "
                                        "there comes from a web server, a login portal or a proxy in between")
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
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


_RESOLVE_FAILED = re.compile(r"Failed to resolve '([^']+)'")


def _innermost(exc: BaseException) -> BaseException:
    """The error that requests and urllib3 wrap (requests' error -> MaxRetryError -> its reason)."""
    inner = exc
    for _ in range(8):
        cause = getattr(inner, "reason", None)
        if not isinstance(cause, BaseException):
            cause = inner.args[0] if inner.args and isinstance(inner.args[0], BaseException) else None
        if cause is None:
            break
        inner = cause
    return inner


def _unresolved(exc: BaseException) -> bool:
    """The registry's name did not resolve (DNS), as opposed to a refused or lost connection."""
    return bool(_RESOLVE_FAILED.search(str(_innermost(exc))))


def connection_failure(exc: BaseException) -> str:
    """Why a connection failed, whole and in words: the innermost error that requests and
    urllib3 wrap (a name that does not resolve, a refused connection, a timeout, TLS), never cut
    mid-word (issue 22: 12), without the pool's repetition of the host."""
    inner = _innermost(exc)
    text = str(inner)
    if resolve := _RESOLVE_FAILED.search(text):
        return f"the name {resolve.group(1)} does not resolve from this machine (DNS)"
    if "Connection refused" in text or "Errno 111" in text:
        return "connection refused"
    if isinstance(exc, requests.Timeout) or isinstance(inner, (urllib3.exceptions.TimeoutError, TimeoutError)):
        return "no answer in time (timed out)"
    text = re.sub(r"^\w*Connection(Pool)?\(host='[^']*', port=\d+\): ", "", text)
    if isinstance(exc, requests.exceptions.SSLError):
        return f"TLS failed: {text}"
    return text


def unreachable_hint(host: str) -> str:
    if is_loopback(host):
        return (f"is a registry listening at {host}? (in a clone of imgbuild, `scripts/services.sh up` starts "
                "the local one)")
    hint = "check the address, and this machine's network and proxy settings (HTTPS_PROXY)"
    if host == DOCKER_HUB_API:
        hint += ("; where Docker Hub is out of reach, run `imgbuild mirror` on a machine that reaches it and a "
                 "registry this one reaches, and use base.mirror")
    return hint

