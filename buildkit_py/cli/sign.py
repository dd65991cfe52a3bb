"""imgbuild sign | verify: image signatures in cosign's format (``cosign verify --key`` accepts
what ``imgbuild sign`` writes, and the reverse)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildkit_py.cli.common import AddCommand, Out, json_option
from buildkit_py.errors import ExitStatus, SignatureError, UsageError

if TYPE_CHECKING:
    from buildkit_py.oci.signatures import SignedManifest, SigningKey, VerifiedManifest

# an encrypted key's password: ours, else cosign's (a cosign.key is read with the password cosign uses)
PASSWORD_VARIABLES = ("IMGBUILD_KEY_PASSWORD", "COSIGN_PASSWORD")
KEY_HELP = ("an EC P-256 private key: PEM (PKCS#8 or SEC1) or cosign's cosign.key (with PyNaCl); an encrypted "
            "one's password from $IMGBUILD_KEY_PASSWORD or $COSIGN_PASSWORD")


def register_sign(add: AddCommand) -> None:
    s = add("sign", "Sign a pushed image as cosign does: the index and each platform's manifest get a signature\n"
            "under the tag sha256-<hex>.sig beside them (appended to any already there), which\n"
            "`cosign verify --key KEY.pub` and `imgbuild verify --key KEY.pub` accept.\n\n"
            "  imgbuild sign --generate-key team.key          # team.key (keep it secret) and team.key.pub\n"
            "  imgbuild sign 127.0.0.1:5000/team/base:1 --key team.key")
    s.add_argument("image", nargs="?", help="a pushed image: REGISTRY/NAME:TAG or @DIGEST")
    s.add_argument("--key", type=Path, metavar="KEY", help=KEY_HELP)
    s.add_argument("--generate-key", type=Path, metavar="KEY",
                   help="write a new key pair, KEY (0600) and KEY.pub, and exit (never replaces a file)")
    json_option(s)
    s.set_defaults(handler=cmd_sign)


def register_verify(add: AddCommand) -> None:
    v = add("verify", "Verify an image's cosign signature with a public key: exit 0 when a signature under the key\n"
            "names what IMAGE points at (an index vouches for the platforms it pins; their own signatures\n"
            "are listed), exit 1 when it is unsigned or signed only by other keys.\n\n"
            "  imgbuild verify 127.0.0.1:5000/team/base:1 --key team.key.pub")
    v.add_argument("image", help="an image: REGISTRY/NAME:TAG or @DIGEST (a platform's manifest digest too)")
    v.add_argument("--key", type=Path, metavar="KEY.pub", required=True, help="the signer's PEM public key")
    json_option(v)
    v.set_defaults(handler=cmd_verify)


def signing_key(path: Path) -> SigningKey:
    """The key of --key/--sign, read before anything is built or pushed."""
    from buildkit_py.oci.signatures import load_signing_key

    password = next((os.environ[v] for v in PASSWORD_VARIABLES if v in os.environ), None)
    return load_signing_key(path, password.encode() if password is not None else None)


@dataclass(frozen=True)
class SignDocument:
    """What `sign` prints: its --json document and its text both read these fields."""

    image: str
    key: Path
    signed: tuple[SignedManifest, ...]

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image, "key": str(self.key), "signed": [s.to_json() for s in self.signed]}

    def lines(self) -> list[str]:
        many = len(self.signed) > 1
        return [f"signed   {self.image} {(s.platform or 'index') if many else 'manifest'} {s.digest} "
                f"({s.tag}, {s.signatures} signature(s))" for s in self.signed]


@dataclass(frozen=True)
class VerifyDocument:
    """What `verify` prints: the image's own verdict (the first manifest: the index, or the one
    manifest) and each manifest's; the --json document and the text read these fields."""

    image: str
    key: Path
    manifests: tuple[VerifiedManifest, ...]

    @property
    def verified(self) -> bool:
        return self.manifests[0].verified

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image, "key": str(self.key), "verified": self.verified,
                "manifests": [r.to_json() for r in self.manifests]}

    def lines(self) -> list[str]:
        many = len(self.manifests) > 1
        return [f"{'verified' if r.verified else 'unsigned' if not r.signatures else 'refused '} "
                f"{r.platform or ('index' if many else 'manifest')} {r.digest}: {r.reason}" for r in self.manifests]


def cmd_sign(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py.oci.signatures import generate_key, sign_image
    from buildkit_py.reference import names_registry

    if args.generate_key:
        if args.image or args.key:
            raise UsageError("--generate-key makes a key pair and signs nothing",
                             hint="then: imgbuild sign IMAGE --key KEY")
        private, public = generate_key(args.generate_key)
        if args.json:
            out.data({"key": str(private), "public_key": str(public)})
        else:
            out.line(f"key      {private} (private: keep it secret; mode 0600)")
            out.line(f"public   {public} (give it to those who verify: imgbuild verify / cosign verify --key)")
        return 0
    if not args.image or not args.key:
        raise UsageError("sign needs IMAGE and --key KEY", hint="imgbuild sign REGISTRY/NAME:TAG --key KEY")
    if not names_registry(args.image):
        raise UsageError(f"{args.image} names no registry: signatures are stored beside a pushed image",
                         hint="name the pushed image: REGISTRY/NAME:TAG")
    document = SignDocument(args.image, args.key, tuple(sign_image(args.image, signing_key(args.key))))
    out.document(document, as_json=args.json)
    return 0


def cmd_verify(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py.oci.signatures import load_verifying_key, verify_image

    document = VerifyDocument(args.image, args.key, tuple(verify_image(args.image, load_verifying_key(args.key))))
    top = document.manifests[0]
    out.document(document, as_json=args.json)
    if args.json:  # the verdict is the document's "verified" and the exit status
        return 0 if document.verified else ExitStatus.FAILED
    if not top.verified:
        raise SignatureError(f"{args.image} ({top.digest}) is not signed by {args.key}: {top.reason}",
                             hint="ask its publisher which key signs it, or sign it: "
                                  f"imgbuild sign {args.image} --key KEY")
    return 0
