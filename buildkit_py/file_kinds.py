"""What kind of file a model artifact holds, by name: weights, config, docs, code. One fact
for every reader: ``weights push`` picks media types from it, and the plan, ``lint`` and
``inspect`` use it to spot weights baked into an image, with one size limit
(``WEIGHT_FILE_LIMIT``, ``over_weight_limit``)."""

from __future__ import annotations

import posixpath
from typing import Literal

FileKind = Literal["weights", "config", "doc", "code"]

# A weight-like file above this size baked into an image is a problem every pull pays for: the
# plan warns about it under a copy: source, lint makes it an error there, inspect flags it in a
# layer (its --weight-threshold default).
WEIGHT_FILE_LIMIT = 10 * 2**20

WEIGHT_EXTENSIONS = frozenset({
    ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".ggml", ".onnx", ".h5", ".msgpack", ".pb",
    ".tflite", ".mlmodel", ".npz", ".npy", ".engine", ".plan", ".nemo", ".pkl", ".model",
})
# Shards carry their format mid-name: model.safetensors.part1, llama.gguf.00001
_WEIGHT_MARKERS = (".safetensors", ".gguf")
_CONFIG_EXTENSIONS = frozenset({".json", ".yaml", ".yml", ".toml", ".jinja", ".tiktoken"})
_CONFIG_NAMES = frozenset({"vocab.txt", "merges.txt", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model"})
_DOC_EXTENSIONS = frozenset({".md", ".rst", ".txt", ".pdf", ".html"})
_DOC_STEMS = frozenset({"readme", "license", "licence", "notice", "copying", "authors", "citation", "model_card"})
_CODE_EXTENSIONS = frozenset({".py", ".sh", ".ipynb", ".js", ".ts", ".go", ".rs", ".c", ".cc", ".cpp", ".cu", ".h"})


def file_kind(path: str) -> tuple[FileKind, bool]:
    """``(kind, guessed)`` for a file by its name; an unknown file counts as weights
    (``guessed``: nothing in the name said so)."""
    name = posixpath.basename(path).lower()
    stem, ext = posixpath.splitext(name)
    if name in _CONFIG_NAMES or ext in _CONFIG_EXTENSIONS:
        return "config", False
    if stem in _DOC_STEMS or ext in _DOC_EXTENSIONS:
        return "doc", False
    if ext in _CODE_EXTENSIONS:
        return "code", False
    if ext in WEIGHT_EXTENSIONS or any(m in name for m in _WEIGHT_MARKERS):
        return "weights", False
    return "weights", True


def is_weight_file(path: str) -> bool:
    """Named like model weights (not merely unknown)."""
    kind, guessed = file_kind(path)
    return kind == "weights" and not guessed


def over_weight_limit(size: int, limit: int = WEIGHT_FILE_LIMIT) -> bool:
    """Whether a weight-like file of ``size`` bytes is above the limit (a file of exactly the
    limit is not)."""
    return size > limit
