"""Weights as ModelPack OCI artifacts, against the real registry: round trip, skips,
a blob corrupted on the registry's own disk, resumed downloads, unsafe paths."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import unavailable
from helpers import as_unprivileged, run_cli

from buildkit_py import oci
from buildkit_py.artifacts import weights
from buildkit_py.errors import (
    DigestMismatch,
    ManifestNotFound,
    UnsafePath,
    UsageError,
    WeightsError,
    WouldReplaceFiles,
)
from buildkit_py.oci import download

REGISTRY_BLOBS = Path(os.environ.get("IMGBUILD_STATE_DIR", "/var/lib/imgbuild-services")) / \
    "registry/data/docker/registry/v2/blobs/sha256"


@pytest.fixture
def client(registry_client):
    return registry_client


@pytest.fixture
def ref(registry, unique_name, client):
    """A fresh artifact reference; its manifest is deleted afterwards."""
    text = registry.repo(unique_name) + ":v1"
    yield text
    with contextlib.suppress(ManifestNotFound):  # the test may not have pushed it
        oci.delete_manifest(text, client=client)


def make_model(root: Path, big: int = 3_000_000) -> dict[str, bytes]:
    files = {
        "model-00001-of-00002.safetensors": os.urandom(big),
        "model-00002-of-00002.safetensors": os.urandom(big // 3),
        "config.json": json.dumps({"hidden_size": 64, "nonce": os.urandom(4).hex()}).encode(),
        "README.md": b"# test model\n" + os.urandom(4).hex().encode(),
        "tokenizer/tokenizer.json": b'{"version": "1.0", "n": "%s"}' % os.urandom(4).hex().encode(),
        "tokenizer/nested/deeper/vocab.txt": os.urandom(1000).hex().encode(),
        "scripts/convert.py": b"print('hi')\n",
        "empty.bin": b"",
    }
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- unit


@pytest.mark.parametrize(("path", "media_type", "untested"), [
    ("model.safetensors", weights.MEDIA_WEIGHT, False),
    ("sub/model-00001-of-00004.safetensors", weights.MEDIA_WEIGHT, False),
    ("llama.Q4_K_M.gguf", weights.MEDIA_WEIGHT, False),
    ("pytorch_model.bin", weights.MEDIA_WEIGHT, False),
    ("config.json", weights.MEDIA_WEIGHT_CONFIG, False),
    ("tokenizer.model", weights.MEDIA_WEIGHT_CONFIG, False),
    ("merges.txt", weights.MEDIA_WEIGHT_CONFIG, False),
    ("README.md", weights.MEDIA_DOC, False),
    ("LICENSE", weights.MEDIA_DOC, False),
    ("modeling.py", weights.MEDIA_CODE, False),
    ("mystery.xyz", weights.MEDIA_WEIGHT, True),
])
def test_media_types_follow_modelpack(path, media_type, untested):
    assert weights.media_type_for(path) == (media_type, untested)


@pytest.mark.parametrize(("path", "weights_named"), [
    ("model.safetensors", True), ("model.safetensors.part1", True), ("llama.gguf.00001", True),
    ("/opt/app/ckpt/Final.PT", True), ("pytorch_model.bin", True), ("emb.npy", True),
    ("tokenizer.model", False),  # a tokenizer, though .model is a weights extension
    ("config.json", False), ("README.md", False), ("train.py", False), ("mystery.xyz", False),
])
def test_one_weight_file_fact_for_push_plan_lint_and_inspect(path, weights_named):
    """The plan, lint and inspect call a file weights exactly when `weights push` would give it
    the weights media type by name (not as a guess)."""
    from buildkit_py.file_kinds import is_weight_file

    assert is_weight_file(path) is weights_named
    media_type, guessed = weights.media_type_for(path)
    assert (media_type == weights.MEDIA_WEIGHT and not guessed) is weights_named


@pytest.mark.parametrize("path", ["../evil", "a/../../evil", "/etc/passwd", "a//b", "./a", "a/./b", "",
                                  "a\\..\\b", "C:/x", "a/b.partial", "a\x00b"])
def test_unsafe_paths_are_refused(path):
    with pytest.raises(UnsafePath):
        weights.safe_relpath(path)


def test_scan_dir_skips_git_and_partials_and_refuses_outside_links(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / "a.bin").write_bytes(b"x")
    (tmp_path / "b.bin.partial").write_bytes(b"half")
    (tmp_path / "link.bin").symlink_to(tmp_path / "a.bin")
    assert [rel for rel, _ in weights.scan_dir(tmp_path)] == ["a.bin", "link.bin"]
    outside = tmp_path.parent / f"{tmp_path.name}-outside.bin"
    outside.write_bytes(b"secret")
    (tmp_path / "escape.bin").symlink_to(outside)
    try:
        with pytest.raises(WeightsError, match="outside"):
            weights.scan_dir(tmp_path)
    finally:
        outside.unlink()


# ---------------------------------------------------------------- real registry


def test_push_pull_round_trip(client, ref, tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    files = make_model(src)
    events = []
    pushed = weights.push(src, ref, progress=lambda *e: events.append(e), client=client)
    assert pushed.ref == ref
    assert oci.get_manifest(f"{pushed.ref}@{pushed.digest}", client=client)[1] == pushed.digest
    assert sorted(f.path for f in pushed.files) == sorted(files)
    assert pushed.uploaded_bytes == sum(len(v) for v in files.values())
    assert {e[0] for e in events} >= {"hash", "upload", "manifest"}

    # The stored artifact is ModelPack v1.
    manifest, digest, media_type = oci.get_manifest(ref, client=client)
    assert digest == pushed.digest and media_type == oci.MEDIA_OCI_MANIFEST
    assert manifest["artifactType"] == "application/vnd.cncf.model.manifest.v1+json"
    assert manifest["config"]["mediaType"] == "application/vnd.cncf.model.config.v1+json"
    by_path = {layer["annotations"]["org.cncf.model.filepath"]: layer for layer in manifest["layers"]}
    assert set(by_path) == set(files)
    assert by_path["config.json"]["mediaType"] == "application/vnd.cncf.model.weight.config.v1.raw"
    assert by_path["README.md"]["mediaType"] == "application/vnd.cncf.model.doc.v1.raw"
    assert by_path["model-00001-of-00002.safetensors"]["mediaType"] == "application/vnd.cncf.model.weight.v1.raw"
    for rel, layer in by_path.items():
        assert layer["digest"] == "sha256:" + hashlib.sha256(files[rel]).hexdigest()
    config = json.loads(oci.read_blob(ref, manifest["config"]["digest"], client=client))
    assert config["modelfs"] == {"type": "layers", "diffIds": [layer["digest"] for layer in manifest["layers"]]}

    assert sorted(weights.ls(ref, client=client)) == sorted(
        (rel, len(data), "sha256:" + hashlib.sha256(data).hexdigest()) for rel, data in files.items())

    result = weights.pull(ref, dest, client=client)
    assert tree(dest) == files
    assert result.downloaded_bytes == sum(len(v) for v in files.values())
    assert result.skipped == ()
    assert not list(dest.rglob("*.partial"))


def test_second_pull_downloads_nothing_and_second_push_uploads_nothing(client, ref, tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    files = make_model(src)
    first = weights.push(src, ref, client=client)
    weights.pull(ref, dest, client=client)
    again = weights.pull(ref, dest, client=client)
    assert again.downloaded_bytes == 0
    assert sorted(again.skipped) == sorted(files)
    second = weights.push(src, ref, client=client)
    assert second.digest == first.digest  # deterministic manifest
    assert second.uploaded_bytes == 0

    # A file changed locally is not silently replaced (issue 31: 5: the user's file was lost): the
    # pull refuses, naming it, before any download; with force it fetches that one, only that one.
    (dest / "config.json").write_bytes(b"{}")
    with pytest.raises(WouldReplaceFiles) as refused:
        weights.pull(ref, dest, client=client)
    assert refused.value.paths == ["config.json"] and refused.value.exit_status == 2
    assert "config.json" in refused.value.message and "--force" in refused.value.hint
    assert (dest / "config.json").read_bytes() == b"{}"
    fixed = weights.pull(ref, dest, client=client, force=True)
    assert fixed.downloaded_bytes == len(files["config.json"]) and fixed.replaced == ("config.json",)
    assert tree(dest) == files


def test_a_pull_never_replaces_a_file_of_other_content_unless_forced(client, ref, tmp_path):
    """issue 31: 5: `weights pull` into a folder replaced the user's own file of the same name.
    Now the pull checks every path first: files of other content are named, nothing is downloaded
    or written (not even the files that were missing), and --force replaces them; a folder at a
    file's path is refused even then."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    files = make_model(src, big=100_000)
    weights.push(src, ref, client=client)
    dest.mkdir()
    (dest / "README.md").write_bytes(b"my own notes\n")  # the user's file
    (dest / "config.json").write_bytes(files["config.json"])  # the same content: nothing to do
    before = tree(dest)
    with pytest.raises(WouldReplaceFiles) as refused:
        weights.pull(ref, dest, client=client)
    assert refused.value.paths == ["README.md"]
    assert tree(dest) == before and not list(dest.rglob("*.partial"))  # nothing downloaded, nothing written

    code, out, err = run_cli("weights", "pull", ref, str(dest), "--json", "--progress", "quiet")
    assert code == 2, err
    assert json.loads(out)["paths"] == ["README.md"] and "README.md" in err and "--force" in err
    assert tree(dest) == before

    code, out, err = run_cli("weights", "pull", ref, str(dest), "--force", "--json", "--progress", "quiet")
    assert code == 0, err
    pulled = json.loads(out)
    assert pulled["replaced"] == ["README.md"] and pulled["skipped"] == ["config.json"]
    assert tree(dest) == files

    (dest / "README.md").unlink()
    (dest / "README.md").mkdir()
    with pytest.raises(UsageError, match="README.md is a folder"):
        weights.pull(ref, dest, client=client, force=True)


def test_a_folder_that_cannot_be_written_is_an_environment_error_naming_it(client, ref, tmp_path):
    """issue 31: 5: a pull into a folder the user cannot write ended in an internal error
    (PermissionError: ...config.json.partial). Now: exit 3, FolderNotWritable naming the folder,
    before any download; and a folder that cannot be created the same."""
    src, dest = tmp_path / "src", tmp_path / "readonly"
    make_model(src, big=10_000)
    weights.push(src, ref, client=client)
    dest.mkdir()
    dest.chmod(0o555)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    try:
        for target, named in ((dest, dest), (dest / "sub", dest)):
            argv = [sys.executable, "-m", "buildkit_py", "weights", "pull", ref, str(target), "--json",
                    "--progress", "quiet"]
            unprivileged = as_unprivileged(argv)
            if unprivileged is None:
                unavailable("unshare (util-linux) is needed to test an unwritable folder as root")
            done = subprocess.run(unprivileged, capture_output=True, text=True, env=env, timeout=120)
            assert done.returncode == 3, done.stderr
            doc = json.loads(done.stdout)
            assert (doc["error"], doc["path"]) == ("FolderNotWritable", str(named)), doc
            assert doc["message"].startswith(f"cannot write into {named}: Permission denied")
            assert "internal error" not in done.stderr and "Traceback" not in done.stderr
        assert list(dest.iterdir()) == []
    finally:
        dest.chmod(0o755)


def test_interrupted_pull_resumes_from_partial(client, ref, tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    files = make_model(src, big=4_000_000)
    weights.push(src, ref, client=client)
    name = "model-00001-of-00002.safetensors"
    dest.mkdir()
    for rel, data in files.items():  # everything else is already there
        if rel != name:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(data)
    (dest / (name + ".partial")).write_bytes(files[name][:1_500_000])  # as a killed pull leaves it
    events = []
    result = weights.pull(ref, dest, progress=lambda *e: events.append(e), client=client)
    assert result.downloaded_bytes == 4_000_000 - 1_500_000  # only the rest crossed the network
    downloads = [e for e in events if e[0] == "download"]
    assert downloads[0][2] > 1_500_000 and downloads[-1][2:] == (4_000_000, 4_000_000)
    assert tree(dest) == files

    # A partial whose bytes are wrong is detected and fetched again from zero.
    (dest / name).unlink()
    (dest / (name + ".partial")).write_bytes(os.urandom(2_000_000))
    result = weights.pull(ref, dest, client=client)
    assert result.downloaded_bytes == 2_000_000 + 4_000_000
    assert tree(dest) == files


def _interrupt_at(name: str, at: int):
    """A progress callback that stops a pull once ``name`` has ``at`` bytes, as Ctrl-C
    would; it first gives the hashing thread time to catch up with what is on disk."""
    def progress(event, label, done, _total):
        if event == "download" and label == name and done >= at:
            time.sleep(0.3)
            raise KeyboardInterrupt
    return progress


def _count_hashed(monkeypatch) -> list[int]:
    """Bytes each ResumableSha256.update call takes in, in call order (the real hash runs)."""
    seen: list[int] = []
    real = download.ResumableSha256.update

    def update(self, data):
        seen.append(memoryview(data).nbytes)
        real(self, data)
    monkeypatch.setattr(download.ResumableSha256, "update", update)
    return seen


BIG = "model-00001-of-00002.safetensors"


def _pull_stopped_half_way(client, ref, tmp_path) -> tuple[dict[str, bytes], Path, int, int]:
    """Push a model, pull it with Ctrl-C once the big file has 2 of its 4 MB: ``(files,
    dest, bytes in the big file's partial, bytes of the other files not yet pulled)``."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    files = make_model(src, big=4_000_000)
    weights.push(src, ref, client=client)
    with pytest.raises(KeyboardInterrupt):
        weights.pull(ref, dest, progress=_interrupt_at(BIG, 2_000_000), client=client, jobs=1, streams=1)
    have = (dest / (BIG + weights.PARTIAL_SUFFIX)).stat().st_size
    assert 2_000_000 <= have < 4_000_000
    missing = sum(len(data) for rel, data in files.items() if rel != BIG and not (dest / rel).exists())
    return files, dest, have, missing


def test_interrupted_pull_keeps_its_hash_so_resume_hashes_only_the_rest(client, ref, tmp_path, monkeypatch):
    if download.ResumableSha256().saved() is None:
        unavailable("libcrypto's SHA256_* calls are not loadable here: a resume re-hashes")
    files, dest, have, missing = _pull_stopped_half_way(client, ref, tmp_path)
    record = json.loads(os.getxattr(dest / (BIG + weights.PARTIAL_SUFFIX), download.HASH_STATE_XATTR))
    assert record["hashed"] == have and record["digest"].startswith("sha256:")

    hashed = _count_hashed(monkeypatch)
    result = weights.pull(ref, dest, client=client, jobs=1)
    assert tree(dest) == files
    assert result.downloaded_bytes == 4_000_000 - have + missing
    # The interrupted file's first ``have`` bytes were not read again: only what came over the network was hashed.
    assert sum(hashed) == 4_000_000 - have + missing
    assert download.HASH_STATE_XATTR not in os.listxattr(dest / BIG)


def test_a_partial_changed_after_the_interruption_is_hashed_again(client, ref, tmp_path, monkeypatch):
    files, dest, have, missing = _pull_stopped_half_way(client, ref, tmp_path)
    partial = dest / (BIG + weights.PARTIAL_SUFFIX)
    data = bytearray(partial.read_bytes())
    data[100] ^= 0xFF  # damaged after the interruption: the saved hash no longer describes it
    partial.write_bytes(bytes(data))
    hashed = _count_hashed(monkeypatch)
    result = weights.pull(ref, dest, client=client, jobs=1)
    assert tree(dest) == files  # the damage was found and the file fetched again from zero
    assert result.downloaded_bytes == (4_000_000 - have) + 4_000_000 + missing
    assert sum(hashed) == have + (4_000_000 - have) + 4_000_000 + missing  # the damaged partial was read whole


def _ctrl_c_once(at_event: str, at: int):
    """A progress callback that, from whichever thread reports, sends SIGINT to the main
    thread once a file has ``at`` bytes: Ctrl-C while files move in parallel."""
    sent = threading.Event()

    def progress(event, _label, done, _total):
        if event == at_event and done >= at and not sent.is_set():
            sent.set()
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    return progress


def _shards(root: Path, count: int = 3, size: int = 24 << 20) -> dict[str, bytes]:
    files = {f"shard-{i}.safetensors": os.urandom(size) for i in range(count)}
    root.mkdir(parents=True)
    for rel, data in files.items():
        (root / rel).write_bytes(data)
    return files


@pytest.fixture
def ctrl_c():
    """Python's own SIGINT handler (KeyboardInterrupt in the main thread) for the test."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_stops_a_parallel_pull_at_once_and_the_next_pull_resumes(client, ref, tmp_path, ctrl_c):
    src, dest = tmp_path / "src", tmp_path / "dest"
    files = _shards(src)
    weights.push(src, ref, client=client)
    with pytest.raises(KeyboardInterrupt):
        weights.pull(ref, dest, progress=_ctrl_c_once("download", 4 << 20), client=client, jobs=2, streams=1)
    present = {p.name: p.stat().st_size for p in dest.iterdir()}
    # The two running downloads stopped part-way; the third never started.
    assert "shard-2.safetensors" not in present and "shard-2.safetensors.partial" not in present
    assert any(name.endswith(weights.PARTIAL_SUFFIX) for name in present)
    assert sum(present.values()) < 2 * (24 << 20)
    result = weights.pull(ref, dest, client=client, jobs=2)
    assert tree(dest) == files
    assert result.downloaded_bytes == 3 * (24 << 20) - sum(present.values())


def test_ctrl_c_stops_a_parallel_push_before_its_manifest(client, ref, tmp_path, ctrl_c):
    src = tmp_path / "src"
    files = _shards(src)
    with pytest.raises(KeyboardInterrupt):
        weights.push(src, ref, progress=_ctrl_c_once("upload", 4 << 20), client=client, jobs=2)
    with pytest.raises(ManifestNotFound):
        oci.get_manifest(ref, client=client)
    third = "sha256:" + hashlib.sha256(files["shard-2.safetensors"]).hexdigest()
    assert not oci.blob_exists(ref, third, client=client)  # never started
    pushed = weights.push(src, ref, client=client)  # and a second push completes it
    assert [f.path for f in pushed.files] == sorted(files)


def _pull_process(ref: str, dest: Path, log: Path) -> subprocess.Popen:
    """`imgbuild weights pull REF DEST --json` in a process of its own (credentials from the env).
    --progress plain, not quiet: the test reads the wait notice, which quiet leaves out."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    with open(log, "w") as err:
        return subprocess.Popen([sys.executable, "-m", "buildkit_py", "weights", "pull", ref, str(dest), "--json",
                                 "--progress", "plain"], stdout=subprocess.PIPE, stderr=err, text=True, env=env)


def _until(what: str, condition, proc: subprocess.Popen | None = None, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc is None or proc.poll() is None or condition(), \
            f"the process ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        time.sleep(0.001)


def test_two_pulls_into_one_folder_take_turns(client, ref, tmp_path):
    """Issue 22 item 3: two pulls into one folder wrote into the same .partial; one died with an
    internal error (its partial renamed away), the other called the registry's blob tampered
    with. Now the second waits for the first (a lock on the folder), then skips what it
    finished. Real processes: the first is stopped (SIGSTOP) with its download under way,
    so the second surely starts while it runs."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    files = _shards(src, count=1, size=96 << 20)
    files["config.json"] = b'{"hidden_size": 64}'
    (src / "config.json").write_bytes(files["config.json"])
    weights.push(src, ref, client=client)
    first = _pull_process(ref, dest, tmp_path / "first.log")
    second = None
    try:
        _until("a partial", (dest / "shard-0.safetensors.partial").exists, first)
        os.kill(first.pid, signal.SIGSTOP)
        second = _pull_process(ref, dest, tmp_path / "second.log")
        _until("the second's wait notice or its end",
               lambda: "waiting for another pull" in (tmp_path / "second.log").read_text() or second.poll() is not None)
        waited = second.poll() is None  # it waits while the first one cannot move
        os.kill(first.pid, signal.SIGCONT)
        outs = [p.communicate(timeout=300)[0] for p in (first, second)]
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait()
    logs = [(tmp_path / f"{n}.log").read_text() for n in ("first", "second")]
    assert (first.returncode, second.returncode) == (0, 0), logs
    assert waited and "waiting for another pull into" in logs[1]
    a, b = (json.loads(out) for out in outs)
    assert a["downloaded_bytes"] == sum(len(d) for d in files.values()) and a["skipped"] == []
    assert b["downloaded_bytes"] == 0 and sorted(b["skipped"]) == sorted(files)
    assert tree(dest) == files  # nothing else: no partial, no lock file
    assert "tampered" not in "".join(logs)


def test_corrupt_blob_on_registry_disk_is_caught(client, ref, tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    make_model(src)
    pushed = weights.push(src, ref, client=client)
    victim = next(f for f in pushed.files if f.path == "model-00002-of-00002.safetensors")
    hexdigest = victim.digest.split(":", 1)[1]
    blob = REGISTRY_BLOBS / hexdigest[:2] / hexdigest / "data"
    if not os.access(blob, os.W_OK):
        unavailable(f"registry storage {blob} is not writable here")
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size
    blob.write_bytes(bytes(data))
    try:
        with pytest.raises(DigestMismatch, match="corrupt"):
            weights.pull(ref, dest, client=client)
        assert not (dest / victim.path).exists()
        assert not (dest / (victim.path + ".partial")).exists()
    finally:
        data[len(data) // 2] ^= 0xFF
        blob.write_bytes(bytes(data))  # the blob is unique to this test, but leave it sound


def test_paths_escaping_the_target_are_refused(client, registry, unique_name, tmp_path):
    ref = oci.parse_reference(registry.repo(unique_name) + ":evil")
    payload = b"owned\n"
    layer = oci.upload_bytes(ref, payload, client=client)
    config = oci.upload_bytes(ref, b'{"descriptor":{},"config":{},"modelfs":{"type":"layers","diffIds":[]}}',
                              client=client)
    for path in ("../escaped.txt", "/tmp/escaped-abs.txt", "ok/../../escaped.txt"):
        manifest = {"schemaVersion": 2, "mediaType": oci.MEDIA_OCI_MANIFEST, "artifactType": weights.ARTIFACT_TYPE,
                    "config": {"mediaType": weights.CONFIG_MEDIA_TYPE, "digest": config.digest, "size": config.size},
                    "layers": [
                        {"mediaType": weights.MEDIA_DOC, "digest": layer.digest, "size": len(payload),
                         "annotations": {weights.ANNOTATION_FILEPATH: "fine.txt"}},
                        {"mediaType": weights.MEDIA_WEIGHT, "digest": layer.digest, "size": len(payload),
                         "annotations": {weights.ANNOTATION_FILEPATH: path}}]}
        oci.put_manifest(ref, manifest, client=client)
        dest = tmp_path / "dest"
        with pytest.raises(UnsafePath):
            weights.pull(str(ref), dest, client=client)
        assert not (tmp_path / "escaped.txt").exists()
        assert not dest.exists() or not any(dest.iterdir())  # refused before writing anything
    oci.delete_manifest(ref, client=client)


def test_pull_does_not_write_through_a_symlink(client, ref, tmp_path):
    src, dest, outside = tmp_path / "src", tmp_path / "dest", tmp_path / "outside"
    make_model(src)
    weights.push(src, ref, client=client)
    outside.mkdir()
    dest.mkdir()
    (dest / "tokenizer").symlink_to(outside)
    with pytest.raises(UnsafePath, match="symlink"):
        weights.pull(ref, dest, client=client)
    assert not any(outside.iterdir())


def test_no_tag_points_at_a_partial_push(client, ref, tmp_path, monkeypatch):
    src = tmp_path / "src"
    make_model(src)
    real_upload = oci.upload_blob
    calls = []

    def failing_upload(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise ConnectionError("network went away")
        return real_upload(*args, **kwargs)

    monkeypatch.setattr(oci, "upload_blob", failing_upload)
    with pytest.raises(ConnectionError):
        weights.push(src, ref, client=client)
    with pytest.raises(ManifestNotFound):
        oci.get_manifest(ref, client=client)
    monkeypatch.setattr(oci, "upload_blob", real_upload)
    assert weights.push(src, ref, client=client).uploaded_bytes > 0  # finishes the rest


def test_pull_of_a_container_image_is_refused(client, registry, unique_name, tmp_path):
    ref = oci.parse_reference(registry.repo(unique_name) + ":img")
    layer = oci.upload_bytes(ref, os.urandom(100), client=client)
    config = oci.upload_bytes(ref, b'{"os":"linux","architecture":"amd64"}', client=client)
    oci.put_manifest(ref, {"schemaVersion": 2, "mediaType": oci.MEDIA_OCI_MANIFEST,
                           "config": {"mediaType": oci.MEDIA_OCI_CONFIG, "digest": config.digest, "size": config.size},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer.digest,
                                       "size": 100}]}, client=client)
    with pytest.raises(WeightsError, match="not a model artifact"):
        weights.pull(str(ref), tmp_path / "dest", client=client)
    oci.delete_manifest(ref, client=client)


def test_pull_memory_stays_flat(client, registry, ref, tmp_path):
    """A 192 MiB file is pulled by a child process whose peak RSS must stay far below the
    file size (1 MiB pieces, nothing held in memory)."""
    src = tmp_path / "src"
    src.mkdir()
    size = 192 << 20
    with open(src / "big.safetensors", "wb") as fh:
        fh.writelines(os.urandom(1 << 20) for _ in range(size >> 20))
    weights.push(src, ref, client=client)
    code = ("import resource, sys; from buildkit_py.artifacts import weights; "
            "r = weights.pull(sys.argv[1], sys.argv[2]) if len(sys.argv) > 2 else None; "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    baseline = int(subprocess.run([sys.executable, "-c", code, ref], capture_output=True, text=True, env=env,
                                  check=True).stdout)
    peak = int(subprocess.run([sys.executable, "-c", code, ref, str(tmp_path / "dest")], capture_output=True,
                              text=True, env=env, check=True).stdout)
    assert (tmp_path / "dest" / "big.safetensors").stat().st_size == size
    assert peak - baseline < 48 * 1024, f"pull grew RSS by {(peak - baseline) // 1024} MiB for a 192 MiB file"
