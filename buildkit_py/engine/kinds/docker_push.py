"""The docker SDK's push (``DockerEngine.push``): credentials as the SDK's ``auth_config``, the
push stream's records read for the manifest digest, each layer's bytes and in-band errors (the
engine answers 200 and reports a failure inside the stream); retried by push_with_retries."""

from __future__ import annotations

import re
import time
from typing import Any

from buildkit_py.engine.push import (
    ProgressSink,
    PushResult,
    Sleep,
    TransferSink,
    push_with_retries,
    registry_host,
    split_tag,
)
from buildkit_py.oci import auth

# The push stream's per-layer states, as transfer events (a layer the registry has is done).
_LAYER_DONE = {"Pushed": "pushed", "Layer already exists": "exists", "Mounted from": "mounted"}
# Engines on the containerd store report the manifest only in a status line, no aux record:
# "0.1: digest: sha256:... size: 856".
_STATUS_DIGEST_RE = re.compile(r"(?:^|\s)digest: (sha256:[0-9a-f]{64}) size: (\d+)")


def auth_config_for(ref: str) -> dict[str, str] | None:
    creds = auth.resolve(registry_host(ref))
    if creds is None:
        return None
    if creds.identity_token:
        return {"identitytoken": creds.identity_token}
    return {"username": creds.username, "password": creds.password}


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
