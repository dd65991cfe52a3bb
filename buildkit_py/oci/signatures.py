"""Image signatures in cosign's format, so that ``cosign verify --key`` accepts what imgbuild
signs and imgbuild verifies what cosign signs (with a key; no transparency log, no keyless).

What cosign 2.x stores for a manifest ``sha256:<hex>`` (read from sigstore/cosign: pkg/oci/static,
pkg/oci/mutate, pkg/oci/internal/signature, pkg/cosign/verifiers.go):

- under the tag ``sha256-<hex>.sig`` of the image's repository, an OCI image manifest whose
  config is an image config listing each layer as a diff id, and one layer per signature;
- each layer is the *simple signing* payload (media type
  ``application/vnd.dev.cosign.simplesigning.v1+json``): ``{"critical": {"identity":
  {"docker-reference": REPO}, "image": {"docker-manifest-digest": DIGEST}, "type": "cosign
  container image signature"}, "optional": null}``;
- the signature of that payload, ECDSA P-256 over its SHA-256, ASN.1 DER, base64, is the layer's
  annotation ``dev.cosignproject.cosign/signature``;
- a new signature is appended as one more layer; a verifier accepts the image when any layer's
  signature verifies under the key and its payload names the digest (cosign's
  SimpleClaimVerifier checks the digest, not the docker-reference).

Keys: a PEM EC P-256 private key (PKCS#8 ``PRIVATE KEY`` or SEC1 ``EC PRIVATE KEY``, optionally
encrypted with a password) and a PEM ``PUBLIC KEY``; and cosign's own ``cosign.key``
(``ENCRYPTED SIGSTORE PRIVATE KEY``: JSON of an scrypt KDF's parameters, a NaCl secretbox
nonce and the box, which holds the PKCS#8 DER key; go-securesystemslib's ``encrypted``
package), read when PyNaCl is installed (``imgbuild[cosign]``: ``cryptography`` has no XSalsa20,
the secretbox cipher). The crypto is ``cryptography``'s (OpenSSL) and libsodium's, never our own."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from buildkit_py.errors import ManifestNotFound, RegistryError, SignatureError, UsageError
from buildkit_py.oci.blobs import read_blob, upload_bytes
from buildkit_py.oci.manifests import (
    MEDIA_OCI_CONFIG,
    MEDIA_OCI_MANIFEST,
    Index,
    Manifest,
    canonical_json,
    put_manifest,
    read_any_manifest,
)
from buildkit_py.oci.transport import Client
from buildkit_py.reference import Reference, as_reference

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey, EllipticCurvePublicKey

MEDIA_SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
ANNOTATION_SIGNATURE = "dev.cosignproject.cosign/signature"
PAYLOAD_TYPE = "cosign container image signature"
SIG_SUFFIX = ".sig"
# cosign refuses a payload over 128 MiB (internal/pkg/cosign/payload/size); ours are ~250 bytes
MAX_PAYLOAD_BYTES = 1 << 20
# cosign.key's PEM block (cosign 1.x wrote the second)
COSIGN_KEY_BLOCKS = ("ENCRYPTED SIGSTORE PRIVATE KEY", "ENCRYPTED COSIGN PRIVATE KEY")
# BuildKit's attestation manifests in an index (oci/copy.py has the same marks): not images to sign
_REFERENCE_TYPE, _ATTESTATION = "vnd.docker.reference.type", "attestation-manifest"


@dataclass(frozen=True)
class SigningKey:
    path: Path
    key: EllipticCurvePrivateKey

    def public_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

        return self.key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo)


@dataclass(frozen=True)
class VerifyingKey:
    path: Path
    key: EllipticCurvePublicKey


@dataclass(frozen=True)
class SignedManifest:
    """One manifest signed: where its signatures now are."""

    digest: str
    platform: str | None  # None: the index (or a single-platform image's only manifest)
    tag: str  # sha256-<hex>.sig
    signatures: int  # layers under the tag now, ours included

    def to_json(self) -> dict[str, Any]:
        return {"digest": self.digest, "platform": self.platform, "tag": self.tag, "signatures": self.signatures}


@dataclass(frozen=True)
class VerifiedManifest:
    digest: str
    platform: str | None
    verified: bool  # a signature under the key names this digest
    signatures: int  # layers under its .sig tag (0: unsigned)
    reason: str  # why not, or which layer verified

    def to_json(self) -> dict[str, Any]:
        return {"digest": self.digest, "platform": self.platform, "verified": self.verified,
                "signatures": self.signatures, "reason": self.reason}


# ---------------------------------------------------------------- keys


def _crypto() -> tuple[ModuleType, ModuleType]:
    try:
        from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
        from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
    except ImportError as exc:  # a declared dependency: only a broken install lacks it
        raise SignatureError("signing needs the 'cryptography' package",
                             hint="pip install cryptography (imgbuild declares it)") from exc
    return serialization, ec


def _read_key_file(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{what} {path}: no such file") from None
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot be read ({exc.strerror})") from None


def load_signing_key(path: Path, password: bytes | None = None) -> SigningKey:
    """An EC P-256 private key: PEM (PKCS#8 or SEC1, encrypted when ``password`` is given) or
    cosign's cosign.key (``password`` may be empty, as cosign's own default)."""
    serialization, ec = _crypto()
    data = _read_key_file(path, "--key")
    try:
        if any(f"-----BEGIN {block}-----".encode() in data for block in COSIGN_KEY_BLOCKS):
            key = _cosign_private_key(data, path, password)
        else:
            # an empty password means none (COSIGN_PASSWORD="" is usual; OpenSSL refuses b"" for a plain key)
            key = serialization.load_pem_private_key(data, password=password or None)
    except TypeError as exc:  # encrypted without a password, or a password for a plain key
        raise UsageError(f"--key {path}: {exc}", hint="IMGBUILD_KEY_PASSWORD gives an encrypted key's password") \
            from None
    except ValueError as exc:
        raise UsageError(f"--key {path} is not a PEM private key ({exc})",
                         hint="an EC P-256 key in PEM: `imgbuild sign --generate-key KEY`, or "
                              "`openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out KEY`") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise UsageError(f"--key {path} is not an EC P-256 key (cosign signs with ECDSA P-256)",
                         hint="`imgbuild sign --generate-key KEY` makes one")
    return SigningKey(path, key)


def _cosign_private_key(data: bytes, path: Path, password: bytes | None) -> Any:
    """cosign.key: scrypt(password) opens a NaCl secretbox holding the PKCS#8 DER key (cosign's
    pkg/cosign/keys.go, go-securesystemslib/encrypted). An empty password is cosign's default."""
    serialization, _ = _crypto()
    try:
        from nacl.exceptions import CryptoError  # noqa: PLC0415
        from nacl.secret import SecretBox  # noqa: PLC0415
    except ImportError:
        raise UsageError(f"--key {path} is cosign's encrypted key, which needs PyNaCl to open (NaCl secretbox)",
                         hint="pip install 'imgbuild[cosign]'; or sign with a PEM key: "
                              "`imgbuild sign --generate-key KEY`") from None
    from cryptography.hazmat.primitives.kdf.scrypt import Scrypt  # noqa: PLC0415

    lines = data.decode("ascii", "replace").strip().splitlines()
    try:
        doc = json.loads(base64.b64decode("".join(x for x in lines if not x.startswith("-----"))))
        kdf, cipher = doc["kdf"], doc["cipher"]
        if kdf["name"] != "scrypt" or cipher["name"] != "nacl/secretbox":
            raise ValueError(f"kdf {kdf['name']!r}, cipher {cipher['name']!r}")
        params = kdf["params"]
        secret = Scrypt(salt=base64.b64decode(kdf["salt"]), length=SecretBox.KEY_SIZE, n=int(params["N"]),
                        r=int(params["r"]), p=int(params["p"])).derive(password or b"")
        box, nonce = base64.b64decode(doc["ciphertext"]), base64.b64decode(cipher["nonce"])
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--key {path} is not a cosign key this reads ({exc})",
                         hint="one `cosign generate-key-pair` wrote (scrypt, nacl/secretbox)") from None
    try:
        der = SecretBox(secret).decrypt(box, nonce)
    except CryptoError:
        raise UsageError(f"--key {path}: the password does not open this cosign key",
                         hint="its password in $IMGBUILD_KEY_PASSWORD or $COSIGN_PASSWORD (empty: none)") from None
    return serialization.load_der_private_key(der, password=None)


def load_verifying_key(path: Path, what: str = "--key") -> VerifyingKey:
    """A PEM public key (``PUBLIC KEY``, as cosign.pub); a private key is refused (a verifier
    should never hold one)."""
    serialization, ec = _crypto()
    data = _read_key_file(path, what)
    if b"PRIVATE KEY" in data:
        raise UsageError(f"{what} {path} is a private key: verify with its public key",
                         hint="the public half: the KEY.pub `imgbuild sign --generate-key KEY` wrote, or "
                              "`openssl pkey -in KEY -pubout -out KEY.pub`")
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError as exc:
        raise UsageError(f"{what} {path} is not a PEM public key ({exc})",
                         hint="a PEM 'PUBLIC KEY' block, as cosign.pub or `openssl pkey -pubout` write") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise UsageError(f"{what} {path} is not an EC public key (cosign's signatures are ECDSA)")
    return VerifyingKey(path, key)


def generate_key(path: Path) -> tuple[Path, Path]:
    """A new EC P-256 key: ``path`` (PKCS#8 PEM, mode 0600) and ``path.pub``; refuses to replace
    either."""
    from buildkit_py.files import write_atomic  # noqa: PLC0415

    serialization, ec = _crypto()
    public = path.with_name(path.name + ".pub")
    for target in (path, public):
        if target.exists():
            raise UsageError(f"--generate-key: {target} exists", hint="choose another name; a key is never replaced")
    key = ec.generate_private_key(ec.SECP256R1())
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    write_atomic(path, private_pem, private=True)
    write_atomic(public, SigningKey(path, key).public_pem())
    return path, public


# ---------------------------------------------------------------- the format


def signature_tag(digest: str) -> str:
    """cosign's tag for the signatures of ``digest``: ``sha256:ab..`` -> ``sha256-ab...sig``."""
    algorithm, _, hexpart = digest.partition(":")
    if not algorithm or not hexpart:
        raise RegistryError(f"{digest!r} is not a digest")
    return f"{algorithm}-{hexpart}{SIG_SUFFIX}"


def simple_signing_payload(repository: str, digest: str) -> bytes:
    """The payload cosign signs (payload.SimpleContainerImage), in Go's encoding/json field order."""
    return json.dumps({"critical": {"identity": {"docker-reference": repository},
                                    "image": {"docker-manifest-digest": digest}, "type": PAYLOAD_TYPE},
                       "optional": None}, separators=(",", ":")).encode()


def sign_payload(key: SigningKey, payload: bytes) -> str:
    from cryptography.hazmat.primitives import hashes  # noqa: PLC0415

    _, ec = _crypto()
    return base64.b64encode(key.key.sign(payload, ec.ECDSA(hashes.SHA256()))).decode()


def payload_verifies(key: VerifyingKey, payload: bytes, b64sig: str) -> bool:
    from cryptography.exceptions import InvalidSignature  # noqa: PLC0415
    from cryptography.hazmat.primitives import hashes  # noqa: PLC0415

    _, ec = _crypto()
    try:
        key.key.verify(base64.b64decode(b64sig, validate=True), payload, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        return False
    return True


def _config(layers: list[dict[str, Any]]) -> bytes:
    """The image config of a signature manifest: go-containerregistry's empty image with one
    diff id and history entry per appended layer (the layers are stored uncompressed)."""
    zero = "0001-01-01T00:00:00Z"
    return canonical_json({"architecture": "", "created": zero, "history": [{"created": zero} for _ in layers],
                           "os": "", "rootfs": {"type": "layers", "diff_ids": [x["digest"] for x in layers]},
                           "config": {}})


def signature_manifest(ref: Reference, layers: list[dict[str, Any]], *, client: Client) -> bytes:
    """The ``.sig`` manifest of ``layers`` (their blobs already pushed), its config pushed."""
    config = _config(layers)
    uploaded = upload_bytes(ref, config, client=client)
    return canonical_json({"schemaVersion": 2, "mediaType": MEDIA_OCI_MANIFEST,
                           "config": {"mediaType": MEDIA_OCI_CONFIG, "size": uploaded.size, "digest": uploaded.digest},
                           "layers": layers})


def _existing_layers(ref: Reference, digest: str, client: Client) -> list[dict[str, Any]]:
    """The layers under ``digest``'s ``.sig`` tag, as written there (they are pushed back as they are)."""
    try:
        found = read_any_manifest(ref.with_tag(signature_tag(digest)), client=client)
    except ManifestNotFound:
        return []
    return [dict(x.document) for x in found.layers] if isinstance(found, Manifest) else []


def append_signature_layers(ref: Reference, digest: str, layers: list[dict[str, Any]], *, client: Client) -> int:
    """Add ``layers`` (blobs pushed) to the ``.sig`` manifest of ``digest`` in ``ref``'s repository,
    keeping the layers already there and never listing one twice; returns how many it lists."""
    existing = _existing_layers(ref, digest, client)
    have = {(x.get("digest"), (x.get("annotations") or {}).get(ANNOTATION_SIGNATURE)) for x in existing}
    added = [x for x in layers if (x["digest"], (x.get("annotations") or {}).get(ANNOTATION_SIGNATURE)) not in have]
    if not added and existing:
        return len(existing)
    merged = existing + added
    put_manifest(ref.with_tag(signature_tag(digest)), signature_manifest(ref, merged, client=client),
                 MEDIA_OCI_MANIFEST, client=client)
    return len(merged)


def sign_manifest(ref: Reference, digest: str, key: SigningKey, *, client: Client) -> int:
    """Sign ``digest`` of ``ref``'s repository as cosign does; returns the signatures under its tag."""
    payload = simple_signing_payload(f"{ref.registry}/{ref.repository}", digest)
    uploaded = upload_bytes(ref, payload, client=client)
    layer = {"mediaType": MEDIA_SIMPLE_SIGNING, "size": uploaded.size, "digest": uploaded.digest,
             "annotations": {ANNOTATION_SIGNATURE: sign_payload(key, payload)}}
    return append_signature_layers(ref, digest, [layer], client=client)


def _manifests_of(ref: Reference, client: Client) -> list[tuple[str | None, str]]:
    """(platform, digest) of what ``ref`` names: the index first (platform None), then each of its
    platforms' manifests; or the one manifest."""
    manifest = read_any_manifest(ref, client=client)
    found: list[tuple[str | None, str]] = [(None, manifest.digest)]
    if isinstance(manifest, Index):
        found += [(e.platform_name, e.digest) for e in manifest.manifests
                  if e.annotations.get(_REFERENCE_TYPE) != _ATTESTATION]
    return found


def sign_image(image: Reference | str, key: SigningKey, *, client: Client | None = None) -> list[SignedManifest]:
    """Sign what ``image`` names: an index and each platform's manifest in it, or the one manifest."""
    ref = as_reference(image)
    client = client or Client()
    signed = []
    for platform, digest in _manifests_of(ref, client):
        count = sign_manifest(ref, digest, key, client=client)
        signed.append(SignedManifest(digest, platform, signature_tag(digest), count))
    return signed


def verify_manifest(ref: Reference, digest: str, key: VerifyingKey, *, client: Client,
                    platform: str | None = None) -> VerifiedManifest:
    """Whether a signature under ``key`` in ``digest``'s ``.sig`` manifest names ``digest``."""
    layers = [x for x in _existing_layers(ref, digest, client) if x.get("mediaType") == MEDIA_SIMPLE_SIGNING]
    if not layers:
        return VerifiedManifest(digest, platform, False, 0, f"no signature (no tag {signature_tag(digest)})")
    reasons = []
    for layer in layers:
        b64sig = (layer.get("annotations") or {}).get(ANNOTATION_SIGNATURE)
        if not b64sig or int(layer.get("size") or 0) > MAX_PAYLOAD_BYTES:
            continue
        payload = read_blob(ref, layer["digest"], client=client, limit=MAX_PAYLOAD_BYTES)  # digest checked
        if not payload_verifies(key, payload, b64sig):
            reasons.append("signed by another key")
            continue
        try:
            named = json.loads(payload)["critical"]["image"]["docker-manifest-digest"]
        except (ValueError, KeyError, TypeError):
            reasons.append("a payload that is not simple signing JSON")
            continue
        if named != digest:
            reasons.append(f"a signature of another digest ({named})")
            continue
        return VerifiedManifest(digest, platform, True, len(layers),
                                f"signed with this key (payload {layer['digest']})")
    why = ", ".join(dict.fromkeys(reasons)) or "no layer carries a signature annotation"
    return VerifiedManifest(digest, platform, False, len(layers), f"{len(layers)} signature(s), none valid: {why}")


def verify_image(image: Reference | str, key: VerifyingKey, *, client: Client | None = None) -> list[VerifiedManifest]:
    """The verdict for what ``image`` names, first, then (an index) for each platform's manifest.
    The first decides: an index pins its platforms' manifests by digest, so a verified index
    vouches for them (``cosign sign`` without --recursive signs only the index); the platforms'
    own signatures are reported beside it."""
    ref = as_reference(image)
    client = client or Client()
    return [verify_manifest(ref, digest, key, client=client, platform=platform)
            for platform, digest in _manifests_of(ref, client)]
