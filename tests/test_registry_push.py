"""The SDK push path: the manifest digest from whichever record the engine sends."""

import pytest

from buildkit_py.engine.kinds.docker_push import digest_of_chunk, push_image

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
    def __init__(self, *tries):
        self.tries = list(tries)  # the records of each push call, in turn; the last one repeats

    def push(self, repo, tag, **_kw):
        return iter(self.tries.pop(0) if len(self.tries) > 1 else self.tries[0])


class Client:
    def __init__(self, *tries):
        self.images = Images(*tries)


def test_push_reads_the_status_line_digest(monkeypatch):
    monkeypatch.setattr("buildkit_py.engine.kinds.docker_push.auth_config_for", lambda ref: None)
    chunks = [{"status": "Pushing", "id": "l1"}, {"status": "Pushed", "id": "l1"},
              {"status": f"0.1: digest: {DIGEST} size: 856"}]
    result = push_image(Client(chunks), "127.0.0.1:5000/team/a:0.1")
    assert (result.ref, result.tag, result.digest, result.size) == (f"127.0.0.1:5000/team/a@{DIGEST}", "0.1", DIGEST, 856)  # noqa: E501


@pytest.mark.parametrize("message", [
    # Docker 26 when the registry was killed under an upload (seen in CI, test_hardening_faults)
    'failed to copy: failed to do request: Put "http://127.0.0.1:5075/v2/fault/killed/blobs/uploads/x": '
    "readfrom tcp 127.0.0.1:46948->127.0.0.1:5075: write tcp 127.0.0.1:46948->127.0.0.1:5075: "
    "use of closed network connection",
    "Put http://127.0.0.1:5000/v2/a/blobs/uploads/: dial tcp 127.0.0.1:5000: connect: connection refused",
])
def test_a_connection_lost_mid_push_is_retried(monkeypatch, message):
    monkeypatch.setattr("buildkit_py.engine.kinds.docker_push.auth_config_for", lambda ref: None)
    failed = [{"status": "Pushing", "id": "l1"}, {"errorDetail": {"message": message}, "error": message}]
    ok = [{"status": "Pushed", "id": "l1"}, {"status": f"0.1: digest: {DIGEST} size: 856"}]
    slept: list[float] = []
    result = push_image(Client(failed, ok), "127.0.0.1:5000/team/a:0.1", sleep=slept.append)
    assert (result.digest, result.attempts, slept) == (DIGEST, 2, [1.0])


def test_an_unreachable_registry_is_told_to_start_services_only_when_it_is_local():
    """Issue 22: 12. A push to any unreachable registry suggested `scripts/services.sh up`, which
    starts only the local test registry; a remote one gets the network hint."""
    from buildkit_py.engine.push import classify_push_error
    from buildkit_py.errors import RegistryUnreachable

    local = classify_push_error("dial tcp 127.0.0.1:5000: connect: connection refused", "127.0.0.1:5000")
    remote = classify_push_error("dial tcp 10.1.2.3:443: connect: connection refused", "registry.example.com")
    assert isinstance(local, RegistryUnreachable) and isinstance(remote, RegistryUnreachable)
    assert "scripts/services.sh up" in local.hint
    assert "scripts/services.sh" not in remote.hint and "HTTPS_PROXY" in remote.hint
