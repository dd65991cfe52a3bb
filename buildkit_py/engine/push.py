"""Pushing, whatever the engine: the result (``PushResult``), a failure's typed error
(``classify_push_error``), transient failures retried with backoff (``push_with_retries``), and
the check that the credentials may push before anything builds. Each engine kind's own push (the
docker SDK's stream: engine/kinds/docker_push.py; `podman push`) is one try of it."""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from buildkit_py import oci
from buildkit_py.errors import AuthenticationError, RegistryError, RegistryUnreachable

ProgressSink = Callable[[str], None]
# progress(event, label, done, total): the transfer callback weights and mirror report through;
# for a push, label is the layer and done/total its bytes (the stream's progressDetail).
TransferSink = Callable[[str, str, int, int], None]
# How the retries wait (time.sleep; tests pass a recorder).
Sleep = Callable[[float], None]

_AUTH_MARKERS = ("unauthorized", "authentication required", "no basic auth credentials", "denied",
                 "incorrect username or password")
# "use of closed network connection": Go's word for a connection the registry dropped while the
# engine was writing to it (a registry restarted mid-upload), like a reset or a broken pipe.
_TRANSIENT_MARKERS = ("connection refused", "connection reset", "i/o timeout", "timeout", "too many requests",
                      "broken pipe", "tls handshake", "use of closed network connection")
_UNREACHABLE_MARKERS = ("connection refused", "no such host", "dial tcp")


@dataclass(frozen=True)
class PushResult:
    ref: str  # repository@sha256:...
    tag: str
    digest: str
    size: int | None
    attempts: int


def split_tag(ref: str) -> tuple[str, str]:
    """'host:5000/team/img:1' -> ('host:5000/team/img', '1'); no tag -> 'latest'."""
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        repo, tag = ref.rsplit(":", 1)
        return repo, tag
    return ref, "latest"


def registry_host(ref: str) -> str:
    return oci.parse_reference(ref).registry


def classify_push_error(message: str, host: str) -> Exception:
    """The typed error for a push failure message (from the SDK stream or a BuildKit log)."""
    low = message.lower()
    if any(m in low for m in _AUTH_MARKERS):
        return AuthenticationError(f"the registry {host} refused the credentials: {message}",
                                   hint=f"log in with: imgbuild login {host} -u USER --password-stdin "
                                        "(or set IMGBUILD_REGISTRY_USER / IMGBUILD_REGISTRY_PASSWORD)")
    if any(m in low for m in _UNREACHABLE_MARKERS):
        from buildkit_py.oci.transport import unreachable_hint  # noqa: PLC0415 - requests: see engine/run.py

        return RegistryUnreachable(f"cannot reach the registry {host}: {message}",
                                   hint=unreachable_hint(host))
    if "no space left" in low or "status: 500" in low or "500 internal server error" in low:
        # distribution answers a full or read-only storage backend with a bare 500.
        return RegistryError(f"push to {host} failed: the registry could not store the upload ({message})",
                             hint="the registry's storage may be full or read-only: check its disk and its "
                                  "log, then push again (blobs already uploaded are not sent twice)")
    return RegistryError(f"push to {host} failed: {message}")


def check_can_push(tags: Iterable[str], *, client: oci.Client | None = None) -> None:
    """Before a build that will push: may the credentials found push to each tag's repository
    (``oci.login.check_push_access``)? Refused or missing credentials, or a registry out of
    reach, are raised here, before anything builds, instead of after the whole build."""
    from buildkit_py.oci.login import check_push_access  # noqa: PLC0415 - only builds that push

    client = client or oci.Client()
    seen: set[tuple[str, str]] = set()
    for tag in tags:
        ref = oci.parse_reference(tag)
        if (ref.registry, ref.repository) in seen:
            continue
        seen.add((ref.registry, ref.repository))
        try:
            check_push_access(ref, client=client)
        except (AuthenticationError, RegistryUnreachable, RegistryError) as exc:
            raise type(exc)(f"cannot push {tag}: {exc.message} (checked before building: nothing was built)",
                            hint=exc.hint) from None


def is_transient(message: str) -> bool:
    """Whether a push failure message says the registry or the link may do better on a later try."""
    low = message.lower()
    if any(m in low for m in _AUTH_MARKERS):
        return False
    return any(m in low for m in _TRANSIENT_MARKERS) or _transient_words().search(low) is not None


@functools.cache
def _transient_words() -> re.Pattern[str]:
    """A transient HTTP status (oci's TRANSIENT_STATUS: 429, 502, 503, 504) or EOF as a word of its own: as
    bare digits they are in digests (manifest-sha256:..503..) and ports (127.0.0.1:45029) of any message,
    and a registry's 500 (a full disk) naming such a digest was retried as if it were a 503."""
    from buildkit_py.oci.transport import TRANSIENT_STATUS  # noqa: PLC0415 - requests: only after a failed push

    # not after ':' or '.': a port (host:503) or an address; a status stands after a space or at the start
    return re.compile(r"(?<![\w:.])(?:eof|" + "|".join(str(code) for code in sorted(TRANSIENT_STATUS)) + r")\b")


PushAttempt = Callable[[], tuple[str | None, int | None, str | None]]


def push_with_retries(push_once: PushAttempt, ref: str, *, on_progress: ProgressSink | None = None,
                      attempts: int = 4, backoff_s: float = 1.0, sleep: Sleep = time.sleep) -> PushResult:
    """Push ``ref`` with ``push_once`` (one try of an engine's push: ``(digest, manifest size,
    None)``, or ``(None, None, the error message)``), again after a transient failure with
    backoff; the typed error of the last failure (``classify_push_error``) when none succeeds."""
    repo, tag = split_tag(ref)
    host = registry_host(ref)
    last_error: Exception | None = None
    for attempt in range(1, attempts + 1):
        digest, size, error = push_once()
        if error is None and digest:
            return PushResult(f"{repo}@{digest}", tag, digest, size, attempt)
        if error is None:
            error = "the engine finished the push without reporting a manifest digest"
        last_error = classify_push_error(error, host)
        if isinstance(last_error, AuthenticationError) or not is_transient(error) or attempt == attempts:
            break
        if on_progress:
            on_progress(f"push failed ({error}); retrying in {backoff_s * 2 ** (attempt - 1):.0f}s")
        sleep(backoff_s * 2 ** (attempt - 1))
    assert last_error is not None  # noqa: S101
    raise last_error
