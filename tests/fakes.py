"""The test fakes of the engine, one typed module: ``FakeEngine`` implements the ``Engine``
protocol (its Builder, ImageStore and Runner roles), and mypy checks it against them (the
assignments at the end; pyproject's mypy ``files`` lists this module). Tests give it the images it
holds and what a build returns, and read what it was asked (``requests``, ``calls``); a test that
needs another behaviour subclasses it and overrides one method, so a change to the protocol
fails type-checking here rather than at run time in a test's private fake."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import replace

from buildkit_py.engine.base import (
    Builder,
    BuildRequest,
    BuildResult,
    Engine,
    HistoryEntry,
    ImageInfo,
    ImageSizes,
    ImageStore,
    LineSink,
    ProgressSink,
    Runner,
)
from buildkit_py.engine.push import PushResult, TransferSink
from buildkit_py.engine.run import RunSpec


def image_info(image_id: str, labels: Mapping[str, str] | None = None, *, layers: Iterable[str] = (),
               repo_digests: Iterable[str] = (), size: int = 0, platform: str | None = None,
               entrypoint: Iterable[str] | None = None, cmd: Iterable[str] | None = None) -> ImageInfo:
    """An ``ImageInfo`` as an engine kind would parse it: ``platform`` is "os/arch"."""
    config: dict[str, object] = {"Labels": dict(labels or {})}
    if entrypoint is not None:
        config["Entrypoint"] = list(entrypoint)
    if cmd is not None:
        config["Cmd"] = list(cmd)
    os_name, _, arch = (platform or "").partition("/")
    return ImageInfo(id=image_id, config=config, layers=tuple(layers), repo_digests=tuple(repo_digests), size=size,
                     os=os_name or None, architecture=arch or None)


class FakeEngine:
    """An engine in memory. ``images`` maps a reference (or id) to its ``ImageInfo`` (``image``
    answers ``any_image`` for the rest, by default None); ``build`` records the request and
    returns ``built`` (the image id becomes an image with ``built_labels``), tagging it; ``push``
    records the ref and returns the registry digest ``push_digest`` (None: pushing is a test
    failure); ``tag``, ``untag`` and ``remove`` record themselves in ``calls``; ``run_argv``
    runs ``run_command`` (by default `true`) instead of a container."""

    name = "fake"

    def __init__(self, *, images: Mapping[str, ImageInfo] | None = None,
                 histories: Mapping[str, list[HistoryEntry]] | None = None,
                 capabilities: Iterable[str] = (), hints: Mapping[str, str] | None = None,
                 built: str = "sha256:built", built_labels: Mapping[str, str] | None = None, run_steps: int = 1,
                 sizes: ImageSizes | None = None, push_digest: str | None = None, gpu: bool = False,
                 files: bytes = b"", run_command: tuple[str, ...] = ("true",),
                 any_image: ImageInfo | None = None) -> None:
        self.images: dict[str, ImageInfo] = dict(images or {})
        self.histories: dict[str, list[HistoryEntry]] = dict(histories or {})
        self._capabilities = frozenset(capabilities)
        self._hints = dict(hints or {})
        self.built, self.built_labels, self.run_steps = built, dict(built_labels or {}), run_steps
        self.sizes = sizes or ImageSizes(0, None)
        self.push_digest = push_digest
        self.gpu = gpu
        self.files = files
        self.run_command = run_command
        self.any_image = any_image  # what ``image`` answers for a reference not in ``images``
        self.requests: list[BuildRequest] = []
        self.calls: list[tuple[str, ...]] = []

    # -- Builder
    @property
    def capabilities(self) -> frozenset[str]:
        return self._capabilities

    @property
    def hints(self) -> Mapping[str, str]:
        return self._hints

    def describe(self) -> str:
        return f"{self.name} engine"

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def ping(self) -> None:
        return None

    def build(self, request: BuildRequest, on_line: LineSink) -> BuildResult:
        self.requests.append(request)
        self.images.setdefault(self.built, image_info(self.built, self.built_labels))
        for tag in request.tags:
            self.images[tag] = self.images[self.built]
        return BuildResult(self.built, request.tags, "", 0, self.run_steps, 1.0)

    def push(self, ref: str, *, on_progress: ProgressSink | None = None,
             on_transfer: TransferSink | None = None) -> PushResult:
        self.calls.append(("push", ref))
        if self.push_digest is None:
            raise AssertionError(f"pushed {ref}")
        repo, _, tag = ref.rpartition(":")
        return PushResult(f"{repo}@{self.push_digest}", tag, self.push_digest, None, 1)

    # -- ImageStore
    def image(self, ref: str) -> ImageInfo | None:
        return self.images.get(ref, self.any_image)

    def history(self, ref: str) -> list[HistoryEntry]:
        return list(self.histories.get(ref, ()))

    def image_sizes(self, ref: str) -> ImageSizes:
        return self.sizes

    def save(self, ref: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        return iter([self.files])

    def filesystem(self, ref: str, chunk_size: int = 1 << 20) -> AbstractContextManager[Iterator[bytes]]:
        return contextlib.nullcontext(iter([self.files]))

    def tag(self, image: str, ref: str) -> None:
        self.calls.append(("tag", image, ref))
        if image in self.images:
            self.images[ref] = replace(self.images[image])

    def untag(self, ref: str) -> None:
        self.calls.append(("untag", ref))
        self.images.pop(ref, None)

    def remove(self, ref: str) -> None:
        self.calls.append(("remove", ref))
        self.images.pop(ref, None)

    # -- Runner
    def gpu_available(self) -> bool:
        return self.gpu

    def run_argv(self, spec: RunSpec) -> tuple[str, ...]:
        return self.run_command

    def remove_container_argv(self, name: str) -> tuple[str, ...]:
        return ("true",)


# Checked by mypy (pyproject's files): the fake is each role and the whole engine.
_as_builder: type[Builder] = FakeEngine
_as_store: type[ImageStore] = FakeEngine
_as_runner: type[Runner] = FakeEngine
_as_engine: type[Engine] = FakeEngine
