"""Push built images with the docker SDK: credentials from ``auth``, errors caught in-band,
transient failures retried with backoff, the manifest digest returned."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from buildkit_py import oci
from buildkit_py.errors import AuthenticationError, RegistryError, RegistryUnreachable
from buildkit_py.oci import auth

ProgressSink = Callable[[str], None]
# progress(event, label, done, total): the transfer callback weights and mirror report through;
# for a push, label is the layer and done/total its bytes (the stream's progressDetail).
TransferSink = Callable[[str, str, int, int], None]
# How the retries wait (time.sleep; tests pass a recorder).
Sleep = Callable[[float], None]
# The push stream's per-layer states, as transfer events (a layer the registry has is done).
_LAYER_DONE = {"Pushed": "pushed", "Layer already exists": "exists", "Mounted from": "mounted"}

_AUTH_MARKERS = ("unauthorized", "authentication required", "no basic auth credentials", "denied",
                 "incorrect username or password")
# "use of closed network connection": Go's word for a connection the registry dropped while the
# engine was writing to it (a registry restarted mid-upload), like a reset or a broken pipe.
_TRANSIENT_MARKERS = ("connection refused", "connection reset", "i/o timeout", "timeout", "eof",
                      "503", "502", "504", "429", "too many requests", "broken pipe", "tls handshake",
                      "use of closed network connection")
_UNREACHABLE_MARKERS = ("connection refused", "no such host", "dial tcp")
# Engines on the containerd store report the manifest only in a status line, no aux record:
# "0.1: digest: sha256:... size: 856".
_STATUS_DIGEST_RE = re.compile(r"(?:^|\s)digest: (sha256:[0-9a-f]{64}) size: (\d+)")


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


def auth_config_for(ref: str) -> dict[str, str] | None:
    creds = auth.resolve(registry_host(ref))
    if creds is None:
        return None
    if creds.identity_token:
        return {"identitytoken": creds.identity_token}
    return {"username": creds.username, "password": creds.password}


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


def _transient(message: str) -> bool:
    low = message.lower()
    return any(m in low for m in _TRANSIENT_MARKERS) and not any(m in low for m in _AUTH_MARKERS)


def digest_of_chunk(chunk: dict[str, Any]) -> tuple[str, int | None] | None:
    """The manifest digest and size one push-stream record carries, if any: the ``aux``
    record (20.10) or the status line (the containerd store)."""
    aux = chunk.get("aux")
    if isinstance(aux, dict) and isinstance(aux.get("Digest"), str) and aux["Digest"].startswith("sha256:"):
        size = aux.get("Size")
        return aux["Digest"], int(size) if isinstance(size, int) else None
    status = chunk.get("status")
    if isinstance(status, str) and (m := _STATUS_DIGEST_RE.search(status)):
        return m.group(1), int(m.group(2))
    return None


def layer_transfer(chunk: dict[str, Any], sizes: dict[str, int]) -> tuple[str, str, int, int] | None:
    """The transfer event one push-stream record carries: ``("push", layer, current, total)``
    while a layer uploads (its progressDetail), ``("pushed"|"exists"|"mounted", layer, n, n)``
    when it is in the registry; None for other records. ``sizes`` remembers each layer's total."""
    layer, status = chunk.get("id") or "", chunk.get("status") or ""
    if not layer or not isinstance(status, str):
        return None
    detail = chunk.get("progressDetail") or {}
    if status == "Pushing" and isinstance(detail.get("total"), int) and isinstance(detail.get("current"), int):
        sizes[layer] = detail["total"]
        return "push", layer, min(detail["current"], detail["total"]), detail["total"]
    for prefix, event in _LAYER_DONE.items():
        if status.startswith(prefix):
            total = sizes.get(layer, 0)
            return event, layer, total, total
    return None


class _Reporter:
    """What the caller hears of one push's stream: each layer's bytes (``on_transfer``), else a
    line per layer and state ("Pushing", "Pushed", "Layer already exists")."""

    def __init__(self, on_progress: ProgressSink | None, on_transfer: TransferSink | None):
        self.on_progress, self.on_transfer = on_progress, on_transfer
        self.last_status: dict[str, str] = {}
        self.sizes: dict[str, int] = {}

    def __call__(self, chunk: dict[str, Any]) -> None:
        if self.on_transfer is not None:
            if event := layer_transfer(chunk, self.sizes):
                self.on_transfer(*event)
            return
        status, layer = chunk.get("status"), chunk.get("id", "")
        if self.on_progress and status and self.last_status.get(layer) != status:
            self.last_status[layer] = status
            self.on_progress(f"{layer + ': ' if layer else ''}{status}")


# client: a docker.DockerClient (the SDK has no type information).
def _push_once(client: Any, repo: str, tag: str, auth_config: dict[str, str] | None,
               report: _Reporter) -> tuple[str | None, int | None, str | None]:
    """One try: (digest, size, None), or (None, None, the error message)."""
    digest = size = None
    try:
        for chunk in client.images.push(repo, tag=tag, stream=True, decode=True, auth_config=auth_config):
            # The engine reports failures inside a 200 stream: look at every chunk.
            if "error" in chunk or "errorDetail" in chunk:
                return None, None, chunk.get("error") or chunk.get("errorDetail", {}).get("message", "unknown error")
            if found := digest_of_chunk(chunk):
                digest, size = found
            report(chunk)
    except Exception as exc:  # the SDK raises APIError / requests errors for transport failures
        return None, None, str(exc)
    return digest, size, None


def push_image(client: Any, ref: str, *, on_progress: ProgressSink | None = None,
               on_transfer: TransferSink | None = None, attempts: int = 4, backoff_s: float = 1.0,
               sleep: Sleep = time.sleep) -> PushResult:
    """Push one tag through the docker SDK. The registry moves the tag only once the manifest is
    put, which happens after every blob is in, so a failed push never leaves the tag pointing at
    a partial image. ``on_transfer`` gets each layer's bytes (a progress bar); without it
    ``on_progress`` gets a line per layer and state. ``on_progress`` also hears about retries."""
    repo, tag = split_tag(ref)
    auth_config = auth_config_for(ref)
    report = _Reporter(on_progress, on_transfer)
    return push_with_retries(lambda: _push_once(client, repo, tag, auth_config, report), ref,
                             on_progress=on_progress, attempts=attempts, backoff_s=backoff_s, sleep=sleep)


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
        if isinstance(last_error, AuthenticationError) or not _transient(error) or attempt == attempts:
            break
        if on_progress:
            on_progress(f"push failed ({error}); retrying in {backoff_s * 2 ** (attempt - 1):.0f}s")
        sleep(backoff_s * 2 ** (attempt - 1))
    assert last_error is not None  # noqa: S101
    raise last_error
