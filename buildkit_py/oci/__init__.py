"""A small OCI distribution client on ``requests``, in modules that follow the pipeline:

- image references with the docker CLI's rules (``buildkit_py.reference``, re-exported here);
- ``transport``: ``Client`` (scheme, auth challenges, tokens) and the one ``RetryPolicy``;
- ``manifests``: fetch, put, delete, platform selection, image config;
- ``blobs``: presence, small reads, streamed and resumable uploads (hashed once, while
  uploading);
- ``download``: verified streaming download into a file (hashed from the buffer each piece
  arrives in), resumable, in parallel ranges;
- ``copy``: image copy between registries (``imgbuild mirror``);
- ``referrers``: OCI 1.1 referrers (artifacts whose ``subject`` is an image: its SBOM), pushed
  and found through the referrers API or the tag schema's ``sha256-<hex>`` index.

Module functions take an optional ``client``; pass one ``Client`` to share connections and
tokens across calls. Nothing here prints; progress goes to ``progress(event, label, done,
total)`` callbacks, possibly from worker threads.

Importing this package is cheap: each name is loaded from its module on first use (PEP 562),
so code that needs only ``reference`` (the plan, the CLI's argument checks) does not pay for
``requests`` and the transfer machinery.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the eager view, for type checkers and readers
    from buildkit_py.oci.blobs import (
        CHUNK,
        MAX_CONFIG_BYTES,
        MEDIA_OCTET,
        UploadResult,
        blob_exists,
        delete_blob,
        head_blob,
        read_blob,
        read_blob_range,
        sha256_file,
        start_upload,
        upload_blob,
        upload_bytes,
    )
    from buildkit_py.oci.copy import CopyResult, copy_image
    from buildkit_py.oci.download import default_streams, get_blob
    from buildkit_py.oci.manifests import (
        ACCEPT,
        DEFAULT_PLATFORM,
        INDEX_TYPES,
        MANIFEST_TYPES,
        MAX_MANIFEST_BYTES,
        MEDIA_DOCKER_CONFIG,
        MEDIA_DOCKER_LIST,
        MEDIA_DOCKER_MANIFEST,
        MEDIA_OCI_CONFIG,
        MEDIA_OCI_INDEX,
        MEDIA_OCI_MANIFEST,
        Descriptor,
        ImageConfig,
        Index,
        Manifest,
        canonical_json,
        delete_manifest,
        fetch_manifest,
        get_image_config,
        get_manifest,
        parse_image_config,
        parse_manifest,
        platform_matches,
        platform_of,
        put_manifest,
        read_any_manifest,
        read_image_config,
        read_manifest,
        select_platform,
    )
    from buildkit_py.oci.referrers import (
        Blob,
        PushedReferrer,
        Referrer,
        Referrers,
        descriptor_of,
        fallback_tag,
        list_referrers,
        push_referrer,
    )
    from buildkit_py.oci.transport import (
        TRANSIENT_STATUS,
        Challenge,
        Client,
        Progress,
        RetryPolicy,
        pull_scope,
        push_scope,
        sha256_bytes,
    )
    from buildkit_py.reference import (
        DOCKER_HUB,
        DOCKER_HUB_API,
        Reference,
        as_reference,
        is_loopback,
        parse_reference,
    )

# Where each public name lives.
_HOME = {name: module for module, names in {
    "blobs": ("CHUNK", "MAX_CONFIG_BYTES", "MEDIA_OCTET", "UploadResult", "blob_exists", "delete_blob", "head_blob",
              "read_blob", "read_blob_range", "sha256_file", "start_upload", "upload_blob", "upload_bytes"),
    "copy": ("CopyResult", "copy_image"),
    "download": ("default_streams", "get_blob"),
    "manifests": ("ACCEPT", "DEFAULT_PLATFORM", "INDEX_TYPES", "MANIFEST_TYPES", "MAX_MANIFEST_BYTES",
                  "MEDIA_DOCKER_CONFIG", "MEDIA_DOCKER_LIST", "MEDIA_DOCKER_MANIFEST", "MEDIA_OCI_CONFIG",
                  "MEDIA_OCI_INDEX", "MEDIA_OCI_MANIFEST", "Descriptor", "ImageConfig", "Index", "Manifest",
                  "canonical_json", "delete_manifest", "fetch_manifest", "get_image_config", "get_manifest",
                  "parse_image_config", "parse_manifest", "platform_matches", "platform_of", "put_manifest",
                  "read_any_manifest", "read_image_config", "read_manifest", "select_platform"),
    # image references are a fact below every layer (buildkit_py/reference.py); re-exported for oci's callers
    "buildkit_py.reference": ("DOCKER_HUB", "DOCKER_HUB_API", "Reference", "as_reference", "is_loopback",
                              "parse_reference"),
    "referrers": ("Blob", "PushedReferrer", "Referrer", "Referrers", "descriptor_of", "fallback_tag", "list_referrers",
                  "push_referrer"),
    "transport": ("TRANSIENT_STATUS", "Challenge", "Client", "Progress", "RetryPolicy", "pull_scope", "push_scope",
                  "sha256_bytes"),
}.items() for name in names}


def module_of(name: str) -> str:
    """The module a name of this package comes from (its own submodules, or buildkit_py.reference)."""
    module = _HOME[name]
    return module if "." in module else f"{__name__}.{module}"


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module_of(name)), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])


__all__ = [
    "ACCEPT", "CHUNK", "DEFAULT_PLATFORM", "DOCKER_HUB", "DOCKER_HUB_API", "INDEX_TYPES", "MANIFEST_TYPES",
    "MAX_CONFIG_BYTES", "MAX_MANIFEST_BYTES", "MEDIA_DOCKER_CONFIG", "MEDIA_DOCKER_LIST", "MEDIA_DOCKER_MANIFEST",
    "MEDIA_OCI_CONFIG", "MEDIA_OCI_INDEX", "MEDIA_OCI_MANIFEST", "MEDIA_OCTET", "TRANSIENT_STATUS", "Blob",
    "Challenge", "Client", "CopyResult", "Descriptor", "ImageConfig", "Index", "Manifest", "Progress",
    "PushedReferrer", "Reference", "Referrer", "Referrers", "RetryPolicy", "UploadResult", "as_reference",
    "blob_exists", "canonical_json", "copy_image", "default_streams", "delete_blob", "delete_manifest",
    "descriptor_of", "fallback_tag", "fetch_manifest", "get_blob", "get_image_config", "get_manifest", "head_blob",
    "is_loopback", "list_referrers", "parse_image_config", "parse_manifest", "parse_reference", "platform_matches",
    "platform_of", "pull_scope", "push_referrer", "push_scope", "put_manifest", "read_any_manifest", "read_blob",
    "read_blob_range", "read_image_config", "read_manifest", "select_platform", "sha256_bytes", "sha256_file",
    "start_upload", "upload_blob", "upload_bytes",
]
