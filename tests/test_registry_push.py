"""The SDK push path: the manifest digest from whichever record the engine sends."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from buildkit_py.engine.kinds.docker_push import digest_of_chunk, push_image
from buildkit_py.engine.push import is_transient
from buildkit_py.errors import RegistryError

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


@pytest.mark.parametrize("message", [
    # Docker 26 on a registry whose disk is full: a 500, whose digest and port hold 503 and 502 as digits
    'failed commit on ref "manifest-sha256:9c2f503ab1": unexpected status from PUT request to '
    "http://127.0.0.1:45029/v2/fault/full/manifests/1: 500 Internal Server Error",
    "received unexpected HTTP status: 500 Internal Server Error (blob sha256:04291c0ffee)",
    "Put http://registry.local:503/v2/a/manifests/1: 500 Internal Server Error",  # a registry on port 503
])
def test_a_full_registry_is_not_retried_whatever_digits_its_message_holds(monkeypatch, message):
    """test_registry_disk_full_at_manifest_clear_error_no_tag failed now and then: the classifier took a
    transient status for any "503" in the message, and a random digest or port has one often enough."""
    monkeypatch.setattr("buildkit_py.engine.kinds.docker_push.auth_config_for", lambda ref: None)
    failed = [{"status": "Pushing", "id": "l1"}, {"errorDetail": {"message": message}, "error": message}]
    slept: list[float] = []
    with pytest.raises(RegistryError) as info:
        push_image(Client(failed), "127.0.0.1:5000/team/a:0.1", sleep=slept.append)
    assert slept == [] and "could not store the upload" in info.value.message


@given(st.text(alphabet="0123456789abcdef", min_size=12, max_size=64), st.integers(1, 65535),
       st.sampled_from(["500 Internal Server Error", "unexpected status: 500", "no space left on device"]))
def test_no_digest_or_port_makes_a_failure_transient(digest, port, failure):
    """The class behind that flake: whatever digits a digest or port holds, a failure stays what its
    status says."""
    message = (f'failed commit on ref "manifest-sha256:{digest}": unexpected status from PUT request to '
               f"http://127.0.0.1:{port}/v2/fault/full/manifests/sha256:{digest}: {failure}")
    assert not is_transient(message)
    assert is_transient(message.replace(failure, "503 Service Unavailable"))


@pytest.mark.parametrize("message", ["received unexpected HTTP status: 503 Service Unavailable",
                                     "toomanyrequests: 429 Too Many Requests", "Patch http://r/v2/a: unexpected EOF",
                                     "error parsing HTTP 502 response body"])
def test_a_transient_status_is_still_retried(monkeypatch, message):
    monkeypatch.setattr("buildkit_py.engine.kinds.docker_push.auth_config_for", lambda ref: None)
    failed = [{"errorDetail": {"message": message}, "error": message}]
    ok = [{"status": f"0.1: digest: {DIGEST} size: 856"}]
    slept: list[float] = []
    assert push_image(Client(failed, ok), "127.0.0.1:5000/team/a:0.1", sleep=slept.append).attempts == 2
    assert slept == [1.0]


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
