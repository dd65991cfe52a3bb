"""The SBOM (issue 24 item 2): what an image carries, read from its layer tars as an overlay
stacks them (unit, on tars made here), as a CycloneDX 1.6 document checked against the format's
own JSON schema, and attached to an image as an OCI 1.1 referrer: against the real registry
(which has no referrers API: the tag schema's sha256-<hex> index), and against a stub for a
registry that has the API (none that has it can run here)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from buildkit_py import oci
from buildkit_py.analysis import sbom
from buildkit_py.analysis.saved_image import scan_layer
from buildkit_py.errors import SbomError
from buildkit_py.plan.lock import wheel_hashes, wheel_key
from buildkit_py.plan.lock_model import LockedPackage, LockInputs, VariantLock

SITE = "opt/venv/lib/python3.11/site-packages"
TORCH_SHA = hashlib.sha256(b"the torch wheel").hexdigest()
CUDART_SHA = hashlib.sha256(b"the cudart wheel").hexdigest()

STATUS = """\
Package: libc6
Status: install ok installed
Architecture: amd64
Version: 2.36-9+deb12u9
Source: glibc
Description: GNU C Library: Shared libraries
 Contains the standard libraries that are used by nearly all programs on
 the system.

Package: python3.11
Status: install ok installed
Architecture: amd64
Source: python3.11 (3.11.2-6)
Version: 3.11.2-6+deb12u6

Package: vim-tiny
Status: deinstall ok config-files
Architecture: amd64
Version: 2:9.0.1378-2
"""


def metadata(name: str, version: str) -> bytes:
    return f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: x\n\nA long description.\n".encode()


def layer(*entries) -> bytes:
    """A layer tar: (path, bytes) for a file, (path, "->", target) for a symlink."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry[0])
            if len(entry) == 3:
                info.type, info.linkname = tarfile.SYMTYPE, entry[2]
                tar.addfile(info)
            else:
                info.size = len(entry[1])
                tar.addfile(info, io.BytesIO(entry[1]))
    return buf.getvalue()


def scans(*tars: bytes):
    return [scan_layer(io.BytesIO(t), counter=None, keep=sbom.wanted) for t in tars]


def stacked_image():
    """Three layers: the OS (dpkg status, os-release through its symlink), a venv with two
    distributions, then one removed (a whiteout), the status rewritten with one more package."""
    base = layer(("usr/lib/os-release", b'ID=debian\nVERSION_ID="12"\nPRETTY_NAME="Debian GNU/Linux 12"\n'),
                 ("etc/os-release", "->", "../usr/lib/os-release"),
                 ("var/lib/dpkg/status", STATUS.encode()),
                 ("usr/bin/true", b"\x7fELF"))
    venv = layer((f"{SITE}/torch-2.14.1.dist-info/METADATA", metadata("torch", "2.14.1")),
                 (f"{SITE}/torch-2.14.1.dist-info/RECORD", b"torch/__init__.py,sha256=x,1\n"),
                 (f"{SITE}/nvidia_cuda_runtime_cu12-12.4.127.dist-info/METADATA",
                  metadata("nvidia-cuda-runtime-cu12", "12.4.127")),
                 (f"{SITE}/requests-2.32.3.dist-info/METADATA", metadata("requests", "2.32.3")),
                 (f"{SITE}/local_tool-0.1.dist-info/METADATA", metadata("local-tool", "0.1")),
                 (f"{SITE}/local_tool-0.1.dist-info/direct_url.json",
                  json.dumps({"url": "file:///w/local_tool-0.1-py3-none-any.whl",
                              "archive_info": {"hashes": {"sha256": "ab" * 32}}}).encode()),
                 ("usr/lib/python3/dist-packages/six-1.16.0.egg-info", metadata("six", "1.16.0")))
    upper = layer((f"{SITE}/.wh.requests-2.32.3.dist-info", b""),
                  ("var/lib/dpkg/status", (STATUS + "\nPackage: git\nStatus: install ok installed\n"
                                           "Architecture: amd64\nVersion: 1:2.39.5-0+deb12u2\n").encode()))
    return scans(base, venv, upper)


def contents(**over):
    config = {"os": "linux", "architecture": "amd64", "created": "2026-12-01T10:00:00.123456789Z"}
    return sbom.contents_from_layers(stacked_image(), image="127.0.0.1:5000/team/app:1", source="registry",
                                     image_id="sha256:" + "c" * 64, config=config,
                                     labels={"io.imgbuild.torch.version": "2.14.1+cu130", "team": "x", **over})


# ---------------------------------------------------------------- reading layers (unit)


def test_layers_stack_as_a_container_sees_them():
    got = contents()
    assert got.os == sbom.OsRelease("debian", "12", "Debian GNU/Linux 12")  # through the symlink
    assert [(d.name, d.version) for d in got.python] == [
        ("local-tool", "0.1"), ("nvidia-cuda-runtime-cu12", "12.4.127"), ("six", "1.16.0"), ("torch", "2.14.1")]
    assert [(p.name, p.version, p.arch, p.source) for p in got.deb] == [
        ("git", "1:2.39.5-0+deb12u2", "amd64", None), ("libc6", "2.36-9+deb12u9", "amd64", "glibc"),
        ("python3.11", "3.11.2-6+deb12u6", "amd64", None)]  # vim-tiny: config files only, not installed
    assert got.platform == "linux/amd64"
    torch = next(d for d in got.python if d.name == "torch")
    assert torch.location == f"/{SITE}/torch-2.14.1.dist-info" and torch.sha256 is None
    local = next(d for d in got.python if d.name == "local-tool")
    assert (local.sha256, local.hash_source) == ("ab" * 32, sbom.HASH_FROM_DIRECT_URL)


def test_the_cuda_wheels_in_the_shared_prefix_are_listed_as_the_venv_s_are():
    prefix = "opt/imgbuild/cuda-wheels"  # plan.PrefixPipStep: outside every venv
    stacked = scans(layer((f"{prefix}/nvidia_cublas_cu12-12.4.5.8.dist-info/METADATA",
                           metadata("nvidia-cublas-cu12", "12.4.5.8")),
                          (f"{prefix}/nvidia/cublas/lib/libcublas.so.12", b"\x7fELF"),
                          ("srv/x/y-1.dist-info/METADATA", metadata("y", "1"))))  # no environment: not listed
    files, _ = sbom.merge_layers(stacked)
    assert sorted(files) == [f"/{prefix}/nvidia_cublas_cu12-12.4.5.8.dist-info/METADATA"]


def test_an_opaque_folder_hides_what_lower_layers_had_there():
    stacked = scans(layer((f"{SITE}/a-1.dist-info/METADATA", metadata("a", "1")),
                          (f"{SITE}/b-1.dist-info/METADATA", metadata("b", "1"))),
                    layer((f"{SITE}/.wh..wh..opq", b""), (f"{SITE}/c-2.dist-info/METADATA", metadata("c", "2"))))
    files, _ = sbom.merge_layers(stacked)
    assert sorted(files) == [f"/{SITE}/c-2.dist-info/METADATA"]


def test_a_metadata_the_scan_could_not_read_falls_back_to_the_folder_name():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:  # a hard link to a file the scan did not keep
        data = metadata("Foo_Bar", "1.0")
        info = tarfile.TarInfo("cache/blob")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo(f"{SITE}/foo_bar-1.0.dist-info/METADATA")
        link.type, link.linkname = tarfile.LNKTYPE, "cache/blob"
        tar.addfile(link)
    got = sbom.python_dists(sbom.merge_layers(scans(buf.getvalue()))[0])
    assert [(d.name, d.version) for d in got] == [("foo_bar", "1.0")]


def test_dpkg_status_lists_only_installed_packages():
    got = sbom.parse_dpkg_status(STATUS)
    assert [p.name for p in got] == ["libc6", "python3.11"]
    assert got[1].source is None  # "Source: python3.11 (3.11.2-6)": the same name
    # distroless status.d files carry no Status line: every paragraph there is installed
    assert [p.name for p in sbom.parse_dpkg_status("Package: tzdata\nVersion: 2024a-0\nArchitecture: all\n")] == [
        "tzdata"]


def test_wheel_hashes_match_by_canonical_name_and_normalized_version():
    entry = VariantLock({}, LockInputs({}, "2.36", "linux/amd64", "3.11", {}, ()), {
        "builder": (LockedPackage("torch", "2.14.1", "0" * 64, "x"),),
        "final": (LockedPackage("Torch", "2.14.1", TORCH_SHA, "torch"),
                  LockedPackage("Foo_Bar", "1.0.0", "1" * 64, "pins"))})
    hashes = wheel_hashes(entry)
    assert hashes[wheel_key("torch", "2.14.1")] == TORCH_SHA  # the final image's stage wins
    assert hashes[wheel_key("foo-bar", "1.0")] == "1" * 64
    assert wheel_hashes(None) == {}


# ---------------------------------------------------------------- the document (unit)


def test_document_is_valid_cyclonedx_1_6_with_the_lock_hashes():
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    hashes = {wheel_key("torch", "2.14.1"): TORCH_SHA, wheel_key("nvidia-cuda-runtime-cu12", "12.4.127"): CUDART_SHA,
              wheel_key("six", "1.17.0"): "2" * 64}  # not the version the image has: no hash
    raw = sbom.cyclonedx_document(contents(), hashes=hashes)
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(raw.decode()) is None
    doc = json.loads(raw)
    assert (doc["bomFormat"], doc["specVersion"]) == ("CycloneDX", "1.6")
    rows = {r.name: r for r in sbom.components_of(doc)}
    assert (rows["torch"].sha256, rows["torch"].purl) == (TORCH_SHA, "pkg:pypi/torch@2.14.1")
    assert rows["nvidia-cuda-runtime-cu12"].sha256 == CUDART_SHA
    assert rows["six"].sha256 is None and rows["six"].location == "/usr/lib/python3/dist-packages/six-1.16.0.egg-info"
    assert rows["libc6"].purl == "pkg:deb/debian/libc6@2.36-9%2Bdeb12u9?arch=amd64&distro=debian-12"
    assert (rows["debian"].type, rows["debian"].version) == ("os", "12")
    torch = next(c for c in doc["components"] if c["name"] == "torch")
    assert {"name": sbom.PROPERTY_HASH_SOURCE, "value": "lock"} in torch["properties"]
    image = doc["metadata"]["component"]
    assert (image["type"], image["name"], image["version"]) == ("container", "127.0.0.1:5000/team/app", "sha256:"
                                                                + "c" * 64)
    assert {"name": "io.imgbuild.torch.version", "value": "2.14.1+cu130"} in image["properties"]
    assert "team" not in json.dumps(image["properties"])  # only the image's contract labels
    assert doc["metadata"]["timestamp"].startswith("2026-12-01T10:00:00.123456")  # the image's, not the clock's


def test_document_is_reproducible_and_its_serial_follows_its_content():
    one = sbom.cyclonedx_document(contents())
    assert sbom.cyclonedx_document(contents()) == one
    other = sbom.cyclonedx_document(contents(team="y"), hashes={wheel_key("torch", "2.14.1"): TORCH_SHA})
    assert json.loads(other)["serialNumber"] != json.loads(one)["serialNumber"]


# ---------------------------------------------------------------- referrers: the real registry


@pytest.fixture
def client(registry_client):
    return registry_client


def _push_image(client, ref: oci.Reference, arch: str, *tars: bytes) -> tuple[str, int]:
    """A real image of ``tars`` (gzip layers) by digest in ``ref``'s repository: (digest, size)."""
    import gzip

    layers, diff_ids = [], []
    for t in tars:
        blob = gzip.compress(t, mtime=0)
        layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                       "digest": oci.upload_bytes(ref, blob, client=client).digest, "size": len(blob)})
        diff_ids.append(oci.sha256_bytes(t))
    config = oci.canonical_json({"architecture": arch, "os": "linux", "created": "2026-12-01T10:00:00Z",
                                 "config": {"Labels": {"io.imgbuild.python.version": "3.11"}},
                                 "rootfs": {"type": "layers", "diff_ids": diff_ids}})
    manifest = oci.canonical_json({"schemaVersion": 2, "mediaType": oci.MEDIA_OCI_MANIFEST, "layers": layers,
                                   "config": {"mediaType": oci.MEDIA_OCI_CONFIG, "size": len(config),
                                              "digest": oci.upload_bytes(ref, config, client=client).digest}})
    digest = oci.put_manifest(oci.Reference(ref.registry, ref.repository, None, oci.sha256_bytes(manifest)),
                              manifest, client=client)
    return digest, len(manifest)


def _image_tars(arch: str) -> list[bytes]:
    status = STATUS.replace("amd64", arch)
    return [layer(("var/lib/dpkg/status", status.encode()), ("etc/os-release", b"ID=debian\nVERSION_ID=12\n")),
            layer((f"{SITE}/torch-2.14.1.dist-info/METADATA", metadata("torch", "2.14.1")))]


def test_attached_to_each_platform_of_an_index_and_found_again(client, registry, unique_name):
    """An index like buildx pushes: amd64 and arm64 images and an attestation manifest. Each image
    platform gets its SBOM, read from the registry's layers, attached to that platform's manifest
    (issue 31 item 3: a node that pulled arm64 holds the arm64 digest and finds its SBOM from it);
    none to the index, whose tag schema index keeps what other tools listed there; ours are never
    listed twice."""
    ref = oci.parse_reference(registry.repo(unique_name) + ":1")
    entries = []
    for arch in ("amd64", "arm64"):
        digest, size = _push_image(client, ref, arch, *_image_tars(arch))
        entries.append({"mediaType": oci.MEDIA_OCI_MANIFEST, "digest": digest, "size": size,
                        "platform": {"os": "linux", "architecture": arch}})
    att = oci.canonical_json({"schemaVersion": 2, "mediaType": oci.MEDIA_OCI_MANIFEST, "layers": [],
                              "config": {"mediaType": oci.MEDIA_OCI_CONFIG, "size": 2,
                                         "digest": oci.upload_bytes(ref, b"{}", client=client).digest}})
    att_digest = oci.put_manifest(oci.Reference(ref.registry, ref.repository, None, oci.sha256_bytes(att)), att,
                                  client=client)
    entries.append({"mediaType": oci.MEDIA_OCI_MANIFEST, "digest": att_digest, "size": len(att),
                    "platform": {"os": "unknown", "architecture": "unknown"},
                    "annotations": {"vnd.docker.reference.type": "attestation-manifest",
                                    "vnd.docker.reference.digest": entries[0]["digest"]}})
    index = oci.put_manifest(ref, {"schemaVersion": 2, "mediaType": oci.MEDIA_OCI_INDEX, "manifests": entries},
                             client=client)
    pushed = f"{registry.address}/{unique_name}@{index}"
    # another tool's referrer (a signature) is listed already and must stay
    other = oci.push_referrer(ref.with_digest(index), oci.descriptor_of(ref, client=client),
                              "application/vnd.example.signature", [oci.Blob("application/octet-stream", b"sig")],
                              client=client)
    assert other.via == "tag-schema"

    hashes = {wheel_key("torch", "2.14.1"): TORCH_SHA}
    attached = sbom.attach_after_push([pushed, pushed], hashes=hashes, client=client)
    platforms = {e["platform"]["architecture"]: e["digest"] for e in entries[:2]}
    assert [(a.platform, a.subject, a.via) for a in attached] == [
        ("linux/amd64", platforms["amd64"], "tag-schema"), ("linux/arm64", platforms["arm64"], "tag-schema")]
    assert [r.digest for r in oci.list_referrers(ref, index, client=client).items] == [other.digest]
    for a in attached:
        listed = oci.list_referrers(ref, a.subject, client=client)
        assert listed.via == "tag-schema" and [r.digest for r in listed.items] == [a.digest]

    for arch in ("amd64", "arm64"):
        found = sbom.find_sbom(f"{registry.address}/{unique_name}:1", platform=f"linux/{arch}", client=client)
        rows = {r.name: r for r in sbom.components_of(json.loads(found.document))}
        assert rows["torch"].sha256 == TORCH_SHA and rows["libc6"].arch == arch
        assert found.subject == platforms[arch] and found.via == "tag-schema"
        assert json.loads(found.document)["metadata"]["component"]["version"] == platforms[arch]
        # what a node that pulled this platform holds: the platform manifest's digest
        by_digest = sbom.find_sbom(f"{registry.address}/{unique_name}@{platforms[arch]}", client=client)
        assert by_digest.platform == f"linux/{arch}" and by_digest.document == found.document
    assert sbom.find_sbom(f"{registry.address}/{unique_name}:1", client=client).platform == "linux/amd64"

    again = sbom.attach_after_push([pushed], hashes=hashes, client=client)  # the same document: nothing new
    assert [a.digest for a in again] == [a.digest for a in attached]
    changed = sbom.attach_after_push([pushed], client=client)  # no lock this time: a new document replaces ours
    for a in changed:
        assert [r.digest for r in oci.list_referrers(ref, a.subject, client=client).items] == [a.digest]
    assert {a.digest for a in changed}.isdisjoint({a.digest for a in attached})


def test_no_sbom_attached_is_an_error_naming_the_way_to_attach_one(client, registry, unique_name):
    ref = oci.parse_reference(registry.repo(unique_name) + ":1")
    digest, _ = _push_image(client, ref, "amd64", *_image_tars("amd64"))
    oci.put_manifest(ref, oci.fetch_manifest(ref.with_digest(digest), client=client)[0], client=client)
    with pytest.raises(SbomError, match=f"no SBOM is attached to .*{digest}") as err:
        sbom.find_sbom(str(ref), client=client)
    assert "--generate --attach" in (err.value.hint or "")


# ---------------------------------------------------------------- a registry with the referrers API (stub)


class _ReferrersRegistry(BaseHTTPRequestHandler):
    """The parts of a distribution-spec 1.1 registry with the referrers API that matter here:
    blobs and manifests by digest; a manifest with a subject is indexed and answered with
    OCI-Subject; GET /referrers/<digest> lists them. (No registry with the API runs here:
    Debian's is distribution 2.8.)"""

    blobs: ClassVar[dict[str, bytes]] = {}
    manifests: ClassVar[dict[str, bytes]] = {}
    tags_put: ClassVar[list[str]] = []

    def log_message(self, *args):
        pass

    def _send(self, code: int, body: bytes = b"", headers: dict | None = None):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self):
        digest = self.path.rsplit("/", 1)[-1]
        self._send(200 if digest in self.blobs else 404)

    def do_POST(self):
        self._send(202, headers={"Location": "/upload/1"})

    def do_PUT(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.startswith("/upload/"):
            self.blobs[self.path.split("digest=")[1].replace("%3A", ":")] = body
            self._send(201)
            return
        target = self.path.rsplit("/", 1)[-1]
        digest = oci.sha256_bytes(body)
        self.manifests[digest] = body
        if not target.startswith("sha256:"):
            self.tags_put.append(target)
        subject = (json.loads(body).get("subject") or {}).get("digest")
        self._send(201, headers={"Docker-Content-Digest": digest, **({"OCI-Subject": subject} if subject else {})})

    def do_GET(self):
        if "/referrers/" in self.path:
            subject = self.path.split("/referrers/")[1].split("?")[0]
            found = []
            for digest, raw in self.manifests.items():
                m = json.loads(raw)
                if (m.get("subject") or {}).get("digest") == subject:
                    found.append({"mediaType": m["mediaType"], "digest": digest, "size": len(raw),
                                  "artifactType": m.get("artifactType"), "annotations": m.get("annotations", {})})
            self._send(200, json.dumps({"schemaVersion": 2, "mediaType": oci.MEDIA_OCI_INDEX,
                                        "manifests": found}).encode(), {"Content-Type": oci.MEDIA_OCI_INDEX})
            return
        digest = self.path.rsplit("/", 1)[-1]
        store = self.manifests if "/manifests/" in self.path else self.blobs
        if digest not in store:
            self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
            return
        body = store[digest]
        media = json.loads(body).get("mediaType", "") if store is self.manifests else "application/octet-stream"
        self._send(200, body, {"Content-Type": media, "Docker-Content-Digest": digest})


@pytest.fixture
def api_registry():
    _ReferrersRegistry.blobs, _ReferrersRegistry.manifests, _ReferrersRegistry.tags_put = {}, {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ReferrersRegistry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_registry_with_the_referrers_api_indexes_it_and_no_tag_is_written(api_registry):
    image = oci.canonical_json({"schemaVersion": 2, "mediaType": oci.MEDIA_OCI_MANIFEST, "layers": [],
                                "config": {"mediaType": oci.MEDIA_OCI_CONFIG, "digest": "sha256:" + "0" * 64,
                                           "size": 2}})
    digest = oci.sha256_bytes(image)
    _ReferrersRegistry.manifests[digest] = image
    document = sbom.cyclonedx_document(contents())
    with oci.Client(credentials=lambda _host: None) as c:
        attached = sbom.attach_sbom(document, f"{api_registry}/team/app@{digest}", platform="linux/amd64", client=c)
        assert (attached.via, attached.fallback_tag, attached.subject) == ("referrers-api", None, digest)
        assert _ReferrersRegistry.tags_put == []  # the registry indexed it: no sha256-<hex> tag
        found = sbom.find_sbom(f"{api_registry}/team/app@{digest}", client=c)
    assert (found.via, found.referrer.digest, found.document) == ("referrers-api", attached.digest, document)


# ---------------------------------------------------------------- the command's usage (unit)


@pytest.mark.parametrize(("argv", "message"), [
    (["sbom", "127.0.0.1:5000/team/app:1", "--lock", "x.lock"], "--lock goes with --generate"),
    (["sbom", "127.0.0.1:5000/team/app:1", "--attach"], "--attach goes with --generate"),
    (["sbom", "127.0.0.1:5000/team/app:1", "--source", "engine"], "--source goes with --generate"),
    (["sbom", "team/app:1", "--generate", "--attach"], "team/app:1 names no registry"),
    (["sbom", "team/app:1", "--generate", "--lock", "/nonexistent/x.lock"], "no such file"),
])
def test_usage_errors_exit_2_before_anything_is_read(argv, message):
    from helpers import run_cli

    code, out, err = run_cli(*argv, "--json")
    assert code == 2 and message in err, err
    assert json.loads(out)["error"] == "UsageError"
