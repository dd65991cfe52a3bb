"""Model weights as OCI artifacts, kept out of images (CNCF ModelPack format, v1).

Layout (github.com/modelpack/model-spec, docs/spec.md, docs/config.md, specs-go/v1):

- manifest: ``application/vnd.oci.image.manifest.v1+json`` with
  ``artifactType: application/vnd.cncf.model.manifest.v1+json``;
- config: ``application/vnd.cncf.model.config.v1+json`` (``descriptor``, ``config``,
  ``modelfs`` with ``type: layers`` and the layer ``diffIds``);
- one layer per file, unarchived (``.raw`` media types, so a layer digest is the file's
  sha256): ``weight.v1.raw`` for weights, ``weight.config.v1.raw`` for tokenizer/config
  files, ``doc.v1.raw`` for README/LICENSE, ``code.v1.raw`` for scripts;
- layer annotations: ``org.cncf.model.filepath`` (the relative path, ``/``-separated),
  ``org.opencontainers.image.title``, ``org.cncf.model.file.metadata+json`` and
  ``org.cncf.model.file.mediatype.untested`` (``true`` when the type is a guess).

The manifest is deterministic (files sorted, constant mtime/uid/gid), so pushing an
unchanged directory again gives the same digest and uploads nothing.

Progress events passed to ``progress(event, path, done, total)``: ``hash``, ``upload``,
``exists`` (skipped on push), ``download``, ``present`` (skipped on pull), ``manifest``.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

from buildkit_py import oci
from buildkit_py.errors import (
    DigestMismatch,
    FolderNotWritable,
    UnsafePath,
    UsageError,
    WeightsError,
    WouldReplaceFiles,
)
from buildkit_py.file_kinds import FileKind, file_kind
from buildkit_py.files import exclusive_folder
from buildkit_py.label_keys import OCI_TITLE

ARTIFACT_TYPE = "application/vnd.cncf.model.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.cncf.model.config.v1+json"
MEDIA_WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
MEDIA_WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"
MEDIA_DOC = "application/vnd.cncf.model.doc.v1.raw"
MEDIA_CODE = "application/vnd.cncf.model.code.v1.raw"
MEDIA_DATASET = "application/vnd.cncf.model.dataset.v1.raw"
_MEDIA_OF_KIND: dict[FileKind, str] = {
    "weights": MEDIA_WEIGHT, "config": MEDIA_WEIGHT_CONFIG, "doc": MEDIA_DOC, "code": MEDIA_CODE}
RAW_MEDIA_TYPES = frozenset({MEDIA_WEIGHT, MEDIA_WEIGHT_CONFIG, MEDIA_DOC, MEDIA_CODE, MEDIA_DATASET})

ANNOTATION_FILEPATH = "org.cncf.model.filepath"
ANNOTATION_FILE_METADATA = "org.cncf.model.file.metadata+json"
ANNOTATION_UNTESTED = "org.cncf.model.file.mediatype.untested"
ANNOTATION_TITLE = OCI_TITLE  # the OCI pre-defined key, here an annotation of a file's layer
# Older ModelPack drafts (CNAI) used this key; read it, never write it.
_LEGACY_FILEPATH = "org.cnai.model.filepath"

PARTIAL_SUFFIX = ".partial"
# Where pull locks a folder whose file system cannot lock the folder itself: its name ends in
# PARTIAL_SUFFIX, so push never takes it for content and no artifact may name it.
PULL_LOCK = ".imgbuild-pull" + PARTIAL_SUFFIX
_SKIP_DIRS = {".git"}
_EPOCH = "1970-01-01T00:00:00Z"  # constant mtime: reproducible manifests (spec: Reproducibility)
_TYPEFLAG_REGULAR = ord("0")
# Files moved at once by push and pull: one per core, at most 4. Measured on 2 cores
# (README design notes): 2 concurrent 96 MiB shards beat 1 (a file's hash tail then
# overlaps the next file's transfer) and 4 or 8 (they only contend for the CPU).
DEFAULT_JOBS = max(1, min(4, os.cpu_count() or 2))



class ArtifactFile(NamedTuple):
    path: str  # relative, "/"-separated
    size: int
    digest: str


@dataclass(frozen=True)
class PushedFile:
    path: str
    size: int
    digest: str
    media_type: str
    uploaded_bytes: int  # 0 when the registry already had the blob


@dataclass(frozen=True)
class PushedArtifact:
    ref: str  # the reference pushed (host/repo:tag); pin it with ``f"{ref}@{digest}"``
    digest: str
    files: tuple[PushedFile, ...]

    @property
    def uploaded_bytes(self) -> int:
        return sum(f.uploaded_bytes for f in self.files)


@dataclass(frozen=True)
class PullResult:
    files: tuple[ArtifactFile, ...]
    downloaded_bytes: int
    skipped: tuple[str, ...]  # paths already present with the right digest
    replaced: tuple[str, ...] = ()  # paths whose other content a forced pull replaced


def media_type_for(relpath: str) -> tuple[str, bool]:
    """``(media type, untested)`` for a file by name; unknown files count as weights
    (``untested``: the type is a guess)."""
    kind, guessed = file_kind(relpath)
    return _MEDIA_OF_KIND[kind], guessed


def safe_relpath(path: str) -> str:
    """Check an artifact path: relative, no ``..``, no empty or dot parts, no backslash
    or NUL. Returns it unchanged or raises UnsafePath."""
    if not path or not isinstance(path, str):
        raise UnsafePath(f"artifact file path {path!r} is empty")
    if "\\" in path or "\x00" in path:
        raise UnsafePath(f"artifact file path {path!r} has a backslash or NUL")
    if path.startswith("/") or PurePosixPath(path).is_absolute() or (len(path) > 1 and path[1] == ":"):
        raise UnsafePath(f"artifact file path {path!r} is absolute")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafePath(f"artifact file path {path!r} escapes or is not normalized (.., ., //)",
                         hint="the artifact was not made by imgbuild or was tampered with; nothing was written")
    if parts[-1].endswith(PARTIAL_SUFFIX):
        raise UnsafePath(f"artifact file path {path!r} ends in {PARTIAL_SUFFIX}, which pull uses for itself")
    return path


def _target(root: Path, relpath: str) -> Path:
    """The final path for ``relpath`` under ``root``; refuses one that a symlink in
    ``root`` would lead outside."""
    target = root.joinpath(*relpath.split("/"))
    real_root = os.path.realpath(root)
    real_parent = os.path.realpath(target.parent)
    if os.path.commonpath([real_root, real_parent]) != real_root:
        raise UnsafePath(f"artifact file path {relpath!r} leads outside {root} through a symlink")
    if target.is_symlink():
        raise UnsafePath(f"{target} is a symlink; pull does not write through symlinks")
    return target


# ---------------------------------------------------------------- push


def scan_dir(directory: str | os.PathLike[str]) -> list[tuple[str, Path]]:
    """``(relpath, path)`` of the regular files under ``directory``, sorted. Symlinks are
    followed only when they point at a file inside the directory; ``.git`` directories
    (a Hugging Face clone's history) and ``*.partial`` files are left out."""
    root = Path(directory)
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a directory"
        raise UsageError(f"{root} {what}", hint="weights push DIRECTORY REF: the folder of files to push")
    real_root = os.path.realpath(root)
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if name.endswith(PARTIAL_SUFFIX):
                continue  # an unfinished pull, never content
            if path.is_symlink():
                real = os.path.realpath(path)
                if os.path.commonpath([real_root, real]) != real_root:
                    raise WeightsError(f"{rel} is a symlink to {real}, outside {root}")
            if not path.is_file():
                continue
            safe_relpath(rel)
            found.append((rel, path))
    if not found:
        raise WeightsError(f"{root} has no files to push")
    return sorted(found)


def _layer(relpath: str, path: Path, digest: str, size: int) -> dict[str, Any]:
    media_type, untested = media_type_for(relpath)
    mode = stat.S_IMODE(path.stat().st_mode)
    metadata = {"name": PurePosixPath(relpath).name, "mode": mode, "uid": 0, "gid": 0, "size": size,
                "mtime": _EPOCH, "typeflag": _TYPEFLAG_REGULAR}
    return {
        "mediaType": media_type,
        "digest": digest,
        "size": size,
        "annotations": {
            ANNOTATION_FILEPATH: relpath,
            ANNOTATION_FILE_METADATA: json.dumps(metadata, sort_keys=True, separators=(",", ":")),
            ANNOTATION_UNTESTED: "true" if untested else "false",
            ANNOTATION_TITLE: relpath,
        },
    }


def model_config(layers: list[dict[str, Any]], descriptor: dict[str, Any] | None = None,
                 config: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "descriptor": dict(descriptor or {}),
        "config": dict(config or {}),
        "modelfs": {"type": "layers", "diffIds": [layer["digest"] for layer in layers]},
    }


class _Stopped(BaseException):
    """Another file failed, or Ctrl-C: this one stops at its next progress report (a
    download keeps its partial, and its hash state, for the next pull). A BaseException, so
    that no retry loop takes it for a network error."""


def _in_parallel(fn: Callable[[Any, oci.Progress | None], Any], items: Iterable[Any], jobs: int,
                 progress: oci.Progress | None) -> list[Any]:
    """``[fn(item, progress) ...]`` on up to ``jobs`` threads, in order. The first failure,
    or Ctrl-C, stops the running calls at their next progress report (within a MiB or
    so) and drops those not started; then it is raised."""
    items = list(items)
    if jobs <= 1 or len(items) <= 1:  # one thread: Ctrl-C lands in the call itself
        return [fn(item, progress) for item in items]
    stop = threading.Event()

    def reporting(event: str, label: str, done: int, total: int) -> None:
        if stop.is_set():
            raise _Stopped
        if progress:
            progress(event, label, done, total)

    pool = ThreadPoolExecutor(max_workers=min(jobs, len(items)), thread_name_prefix="weights")
    futures = [pool.submit(fn, item, reporting) for item in items]
    try:
        wait(futures, return_when=FIRST_EXCEPTION)
    finally:  # all done, one failed, or Ctrl-C in this thread: whatever still runs stops
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
    errors = [e for f in futures if not f.cancelled() and (e := f.exception()) is not None]
    if errors:
        raise next((e for e in errors if not isinstance(e, _Stopped)), errors[0])
    return [f.result() for f in futures]


def push(directory: str | os.PathLike[str], ref: str | oci.Reference, progress: oci.Progress | None = None, *,
         client: oci.Client | None = None, descriptor: dict[str, Any] | None = None,
         annotations: dict[str, str] | None = None, jobs: int = DEFAULT_JOBS) -> PushedArtifact:
    """Push every file under ``directory`` as one ModelPack artifact at ``ref``.

    Up to ``jobs`` files at once; each is hashed once, then uploaded unless the registry
    has its blob already (oci.upload_blob). The manifest goes up only
    after every blob is in the registry, so the tag never points at a partial push.
    ``descriptor`` fills the config's ModelPack descriptor (name, version, licenses...).
    ``progress`` may be called from several threads.
    """
    reference = oci.as_reference(ref)
    client = client or oci.Client()
    files = scan_dir(directory)
    results = _in_parallel(lambda item, report: oci.upload_blob(reference, item[1], client=client, progress=report,
                                                                label=item[0]), files, jobs, progress)
    layers, pushed = [], []
    for (relpath, path), result in zip(files, results, strict=True):
        layer = _layer(relpath, path, result.digest, result.size)
        layers.append(layer)
        pushed.append(PushedFile(relpath, result.size, result.digest, layer["mediaType"], result.uploaded_bytes))
    config_raw = oci.canonical_json(model_config(layers, descriptor))
    config = oci.upload_bytes(reference, config_raw, client=client)
    manifest = {
        "schemaVersion": 2,
        "mediaType": oci.MEDIA_OCI_MANIFEST,
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": config.digest, "size": config.size},
        "layers": layers,
    }
    if annotations:
        manifest["annotations"] = dict(annotations)
    raw = oci.canonical_json(manifest)
    # Every blob was checked or uploaded above; make sure before the tag moves.
    for layer in layers:
        if not oci.blob_exists(reference, layer["digest"], client=client):
            raise WeightsError(f"blob {layer['digest']} is missing from {reference.registry} after upload")
    target = reference if reference.tag or reference.digest else reference.with_tag("latest")
    digest = oci.put_manifest(target, raw, oci.MEDIA_OCI_MANIFEST, client=client)
    if progress:
        progress("manifest", str(target), len(raw), len(raw))
    return PushedArtifact(str(target), digest, tuple(pushed))


# ---------------------------------------------------------------- read


def _artifact_manifest(reference: oci.Reference, client: oci.Client) -> oci.Manifest:
    manifest = oci.read_manifest(reference, client=client)
    config_type = manifest.config.media_type or None
    if manifest.artifact_type != ARTIFACT_TYPE and config_type != CONFIG_MEDIA_TYPE:
        raise WeightsError(
            f"{reference} is not a model artifact (artifactType {manifest.artifact_type!r}, "
            f"config {config_type!r})",
            hint="it may be a container image; weights are pushed with `imgbuild weights push`",
        )
    return manifest


def _files(manifest: oci.Manifest, where: str) -> list[tuple[ArtifactFile, oci.Descriptor]]:
    out: list[tuple[ArtifactFile, oci.Descriptor]] = []
    seen: set[str] = set()
    for layer in manifest.layers:
        notes = layer.annotations
        path = notes.get(ANNOTATION_FILEPATH) or notes.get(_LEGACY_FILEPATH) or notes.get(ANNOTATION_TITLE)
        if path is None:
            raise WeightsError(f"a layer of {where} ({layer.digest}) names no file path")
        if layer.media_type.endswith(("tar", "tar+gzip", "tar+zstd")):
            raise WeightsError(f"{where} has archived layers ({layer.media_type}); only .raw layers are supported")
        path = safe_relpath(path)
        if path in seen:
            raise UnsafePath(f"{where} names {path!r} twice")
        seen.add(path)
        digest = layer.digest
        if not digest.startswith("sha256:") or len(digest) != 71:
            raise WeightsError(f"{where}: layer for {path} has unsupported digest {digest!r}")
        out.append((ArtifactFile(path, layer.size, digest), layer))
    # A file may not also be a directory of another (a/b and a/b/c).
    for f, _ in out:
        parts = f.path.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in seen:
                raise UnsafePath(f"{where} names {'/'.join(parts[:i])!r} both as a file and a directory")
    return out


def ls(ref: str | oci.Reference, *, client: oci.Client | None = None) -> list[ArtifactFile]:
    """The files of an artifact: ``(path, size, digest)`` each, in manifest order."""
    reference = oci.as_reference(ref)
    client = client or oci.Client()
    return [f for f, _ in _files(_artifact_manifest(reference, client), str(reference))]


# ---------------------------------------------------------------- pull


def _file_matches(path: Path, size: int, digest: str) -> bool:
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size != size:
            return False
    except OSError:
        return False
    return oci.sha256_file(path)[0] == digest


# What a pull finds at a file's final path: nothing, the artifact's file, or another file.
_ABSENT, _SAME, _OTHER = "absent", "same", "other"


def _found_at(target: Path, f: ArtifactFile, where: str) -> str:
    if not os.path.lexists(target):
        return _ABSENT
    if target.is_dir():  # never replaced, --force or not: a folder may hold anything
        raise UsageError(f"{target} is a folder, where {where} has the file {f.path}",
                         hint="move the folder away, or pull into another folder")
    return _SAME if _file_matches(target, f.size, f.digest) else _OTHER


# The errors that say a folder cannot be written, whatever the cause: permissions, a read-only
# file system, a full disk or quota. Anything else (a network error is an OSError too) goes up as is.
_NOT_WRITABLE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT})


def _not_writable(exc: OSError, path: Path) -> FolderNotWritable | None:
    """FolderNotWritable naming the folder that refused (the one holding the file ``exc`` names,
    ``path``'s where it names none), when ``exc`` says it cannot be written; else None."""
    if exc.errno not in _NOT_WRITABLE:
        return None
    named = Path(os.fsdecode(exc.filename)) if exc.filename else path
    folder = named.parent
    return FolderNotWritable(f"cannot write into {folder}: {exc.strerror or exc} ({named.name})", path=str(folder),
                             hint="use a folder this user can write (weights pull REF DIR, run --weights-dir DIR), "
                                  "or make it writable (ls -ld shows its owner and mode)"
                             if exc.errno not in (errno.ENOSPC, errno.EDQUOT) else
                             "free space there, or use a folder on another disk")


def pull(ref: str | oci.Reference, directory: str | os.PathLike[str], progress: oci.Progress | None = None, *,
         client: oci.Client | None = None, jobs: int = DEFAULT_JOBS, streams: int | None = None,
         on_wait: Callable[[], None] | None = None, force: bool = False) -> PullResult:
    """Download an artifact's files into ``directory``.

    Every path is checked before anything is written (no ``..``, no absolute paths, no
    writing through symlinks). A file already there with the right sha256 is skipped. A file
    of other content at one of the artifact's paths (the user's own, another version of the
    weights) is never replaced silently: WouldReplaceFiles names each such file before anything
    is downloaded, unless ``force``, which replaces them (``PullResult.replaced``). A folder that
    cannot be written is FolderNotWritable, naming the path.
    Each download goes to ``<name>.partial`` next to its final path, is hashed while it
    streams, and is renamed into place only when the digest matches. An existing
    ``.partial`` is resumed with a Range request (hashing only the new bytes when the
    interrupted pull saved its hash state on the partial). A corrupt blob raises DigestMismatch;
    its partial is deleted and nothing appears at the final path. Up to ``jobs`` files at
    once, each in ``streams`` ranges (oci.get_blob); ``progress`` may be called from
    several threads.

    One pull at a time per folder (a lock on the folder, ``files.exclusive_folder``): a second
    pull into it, from another process or thread, waits (``on_wait`` is called first), then
    finds the files the first one finished and skips them. Without the lock two pulls wrote
    into one ``.partial`` at once and each took the other's bytes for a corrupt blob.
    """
    reference = oci.as_reference(ref)
    root = Path(directory)
    if root.exists() and not root.is_dir():  # before any download
        raise UsageError(f"{root} exists and is not a directory",
                         hint="weights pull REF DIRECTORY: a folder to download into (created if missing)")
    client = client or oci.Client()
    entries = _files(_artifact_manifest(reference, client), str(reference))
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise (_not_writable(exc, root) or UsageError(f"cannot create {root}: {exc.strerror}")) from None
    targets = [(f, _target(root, f.path), layer) for f, layer in entries]  # all checked first

    for _, target, _ in targets:
        partial = target.with_name(target.name + PARTIAL_SUFFIX)
        if partial.is_symlink():
            raise UnsafePath(f"{partial} is a symlink; pull does not write through symlinks")

    def one(item: tuple[tuple[ArtifactFile, Path, oci.Descriptor], str], report: oci.Progress | None) -> int | None:
        (f, target, layer), found = item
        if found == _SAME:
            if report:
                report("present", f.path, f.size, f.size)
            return None
        partial = target.with_name(target.name + PARTIAL_SUFFIX)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            received = _download(reference, f, partial, client, report, streams)
            _apply_mode(partial, layer)
            os.replace(partial, target)
        except OSError as exc:
            if (refused := _not_writable(exc, partial)) is None:
                raise
            raise refused from None
        return received

    try:
        with exclusive_folder(root, fallback=root / PULL_LOCK, on_wait=on_wait):
            # What is there already, under the lock (another pull may have just finished a file):
            # each file of the artifact's size is hashed once, here, and skipped below if it matches.
            found = _in_parallel(lambda item, _report: _found_at(item[1], item[0], str(reference)), targets,
                                 jobs, None)
            others = [f.path for (f, _, _), state in zip(targets, found, strict=True) if state == _OTHER]
            if others and not force:
                raise _would_replace(others, root, reference)
            received = _in_parallel(one, list(zip(targets, found, strict=True)), jobs, progress)
    except OSError as exc:  # the lock's fallback file, where the folder cannot be locked itself
        if (refused := _not_writable(exc, root / PULL_LOCK)) is None:
            raise
        raise refused from None
    skipped = tuple(f.path for (f, _, _), got in zip(targets, received, strict=True) if got is None)
    return PullResult(tuple(f for f, _ in entries), sum(got or 0 for got in received), skipped,
                      tuple(others))


def _would_replace(paths: list[str], root: Path, reference: oci.Reference) -> WouldReplaceFiles:
    shown = ", ".join(paths[:10]) + (f" and {len(paths) - 10} more" if len(paths) > 10 else "")
    return WouldReplaceFiles(
        f"{root} already holds {len(paths)} file(s) of other content at paths of {reference}: {shown}; "
        "nothing was downloaded, nothing replaced", paths=paths,
        hint="move them away, or pull into another folder; --force replaces them with the artifact's")


def _download(reference: oci.Reference, f: ArtifactFile, partial: Path, client: oci.Client,
              progress: oci.Progress | None, streams: int | None) -> int:
    resumed = partial.exists() and partial.stat().st_size > 0
    received = 0
    for attempt in (0, 1):
        mode = "r+b" if resumed else "w+b"
        # Only a digest failure discards the partial; anything else (network gone, Ctrl-C)
        # keeps it, and the next pull resumes from it.
        try:
            with open(partial, mode) as fh:
                received += oci.get_blob(reference, f.digest, fh, size=f.size, client=client,
                                         progress=progress, label=f.path, streams=streams)
            return received
        except DigestMismatch as exc:
            received += exc.received_bytes
            partial.unlink(missing_ok=True)
            if resumed and attempt == 0:
                resumed = False  # the old partial may have been the bad part: once more from zero
                continue
            raise
    raise AssertionError("unreachable")  # pragma: no cover


def _apply_mode(path: Path, layer: oci.Descriptor) -> None:
    """Keep the executable bit a file was pushed with; never setuid/setgid/sticky."""
    try:
        meta = json.loads(layer.annotations.get(ANNOTATION_FILE_METADATA) or "{}")
        mode = int(meta.get("mode", 0o644)) & 0o777
    except (ValueError, TypeError, AttributeError):
        return
    os.chmod(path, (mode | 0o600) & 0o755 if mode & 0o111 else 0o644)
