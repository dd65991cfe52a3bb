"""The SDK push path: the manifest digest from whichever record the engine sends."""

import pytest

from buildkit_py.engine.push import digest_of_chunk, push_image

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("chunk", "found"), [
    ({"aux": {"Tag": "1", "Digest": DIGEST, "Size": 856}}, (DIGEST, 856)),  # 20.10
    ({"status": f"0.1: digest: {DIGEST} size: 856"}, (DIGEST, 856)),  # the containerd store
    ({"status": "Pushed", "id": "abc"}, None),
    ({"aux": {"Digest": "md5:x"}}, None),
])
def test_digest_of_chunk(chunk, found):
    assert digest_of_chunk(chunk) == found


class Images:
    def __init__(self, chunks):
        self.chunks = chunks

    def push(self, repo, tag, **_kw):
        return iter(self.chunks)


class Client:
    def __init__(self, chunks):
        self.images = Images(chunks)


def test_push_reads_the_status_line_digest(monkeypatch):
    monkeypatch.setattr("buildkit_py.engine.push.auth_config_for", lambda ref: None)
    chunks = [{"status": "Pushing", "id": "l1"}, {"status": "Pushed", "id": "l1"},
              {"status": f"0.1: digest: {DIGEST} size: 856"}]
    result = push_image(Client(chunks), "127.0.0.1:5000/team/a:0.1")
    assert (result.ref, result.tag, result.digest, result.size) == (f"127.0.0.1:5000/team/a@{DIGEST}", "0.1", DIGEST, 856)  # noqa: E501
