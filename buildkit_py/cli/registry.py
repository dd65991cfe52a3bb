"""Commands that talk to a registry: login, mirror."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from buildkit_py.cli.common import AddCommand, Out, json_option, progress_option
from buildkit_py.cli.progress import transfer_view
from buildkit_py.errors import UsageError

if TYPE_CHECKING:
    from buildkit_py.oci.copy import CopiedReferrer, CopyResult
    from buildkit_py.oci.login import LoginResult


# What login and mirror print: the --json document (to_json) and the text (lines) read the same fields.
@dataclass(frozen=True)
class LoggedIn:
    result: LoginResult

    def to_json(self) -> dict[str, Any]:
        r = self.result
        return {"registry": r.registry, "username": r.username, "stored_in": str(r.stored_in)}

    def lines(self) -> list[str]:
        r = self.result
        return [f"logged in to {r.registry} as {r.username} (stored in {r.stored_in})"]


@dataclass(frozen=True)
class Mirrored:
    source: str
    dest: str
    copied: CopyResult

    @property
    def pinned(self) -> str:
        """``dest``'s repository at the digest now there: what a recipe pins."""
        dest = self.dest
        return f"{dest.rsplit(':', 1)[0] if ':' in dest.rsplit('/', 1)[-1] else dest}@{self.copied.digest}"

    def to_json(self) -> dict[str, Any]:
        copied = self.copied
        return {"source": self.source, "dest": self.dest, "digest": copied.digest, "pinned": self.pinned,
                "source_digest": copied.source_digest, "same_digest": copied.same_digest,
                "media_type": copied.media_type, "platforms": list(copied.platforms),
                "left_out": list(copied.left_out), "attestations": copied.attestations,
                "manifests": copied.manifests,
                "referrers": [{"subject": r.subject, "digest": r.digest, "kind": r.kind, "tag": r.tag}
                              for r in copied.referrers]}

    def lines(self) -> list[str]:
        copied = self.copied
        what = ", ".join(copied.platforms) or "an artifact (no platform)"
        if copied.attestations:
            what += f", {copied.attestations} attestation manifest{'s' if copied.attestations > 1 else ''}"
        if copied.left_out:
            what += f" (left out: {', '.join(copied.left_out)})"
        digest = (f"digest   {copied.digest} (the source's)" if copied.same_digest else
                  f"digest   {copied.digest}: a new index of the chosen platforms; the source's is "
                  f"{copied.source_digest}")
        return [f"mirrored {self.source} -> {self.dest}", f"copied   {what}", digest,
                f"referrers {_referrer_counts(copied.referrers)}", f"pin with {self.pinned}"]


def register_login(add: AddCommand) -> None:
    lg = add("login")
    lg.add_argument("registry")
    lg.add_argument("-u", "--username", required=True)
    lg.add_argument("--password-stdin", action="store_true",
                    help="read the password from stdin (required: passwords never go on the command line)")
    lg.add_argument("--password", "-p", help=argparse.SUPPRESS)  # only to refuse it with the right hint
    json_option(lg)
    lg.set_defaults(handler=cmd_login)


def register_mirror(add: AddCommand) -> None:
    m = add("mirror", "Copy an image into your registry, byte for byte (same digest), so a deleted upstream tag\n"
            "cannot break builds. An index is copied whole: every platform's manifest, BuildKit's attestation\n"
            "manifests and their blobs, and the artifacts that refer to them (SBOMs, attestations, cosign's\n"
            "signatures), so the copy verifies and lists its SBOM as the source did. Recipes use it with\n"
            "base.mirror: the copy lands where they look.\n\n"
            "  imgbuild mirror nvidia/cuda:12.4.1-runtime-ubuntu22.04 --to-mirror registry.example.com/mirror\n"
            "  imgbuild mirror SRC DEST [--platform linux/amd64]")
    m.add_argument("source")
    m.add_argument("dest", nargs="?", help="full destination reference")
    m.add_argument("--to-mirror", metavar="PREFIX", help="destination as base.mirror PREFIX would look it up")
    m.add_argument("--platform", action="append", default=[], metavar="OS/ARCH[/VARIANT]", type=_platform,
                   help="copy only this platform of an index, with its attestations (repeatable); the copy is "
                        "then a new index with another digest, said in the output")
    # Copying every platform is the default now; the old flag still parses, so scripts keep working.
    m.add_argument("--all-platforms", action="store_true", help=argparse.SUPPRESS)
    json_option(m)
    progress_option(m, "copy progress")
    m.set_defaults(handler=cmd_mirror)


def _platform(text: str) -> str:
    parts = text.split("/")
    if not 2 <= len(parts) <= 3 or not all(parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not OS/ARCH or OS/ARCH/VARIANT (e.g. linux/amd64)")
    return text


def cmd_login(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py.oci.login import login

    hint = "echo \"$PASSWORD\" | imgbuild login REGISTRY -u USER --password-stdin"
    if args.password is not None:
        raise UsageError("login: --password is not accepted: passwords never go on the command line", hint=hint)
    if not args.password_stdin:
        raise UsageError("login: --password-stdin is required", hint=hint)
    password = out.stdin.readline().rstrip("\r\n")
    if not password:
        raise UsageError("no password on stdin", hint=hint)
    out.document(LoggedIn(login(args.registry, args.username, password)), as_json=args.json)
    return 0


def cmd_mirror(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py import oci
    from buildkit_py.compat.rules import mirrored_ref

    if bool(args.dest) == bool(args.to_mirror):
        raise UsageError("mirror needs DEST or --to-mirror PREFIX (one of them)")
    if args.all_platforms and args.platform:
        raise UsageError("--all-platforms and --platform contradict each other",
                         hint="every platform is copied by default; --platform picks some")
    dest = args.dest or mirrored_ref(args.source, args.to_mirror)
    with transfer_view(out.stderr, args.progress) as progress:
        copied = oci.copy_image(args.source, dest, platforms=tuple(args.platform), progress=progress)
    out.document(Mirrored(args.source, dest, copied), as_json=args.json)
    return 0


def _referrer_counts(referrers: Sequence[CopiedReferrer]) -> str:
    """``3 copied (2 application/vnd.cyclonedx+json, 1 cosign signature)``, or ``none``."""
    if not referrers:
        return "none (no SBOM, signature or attestation refers to it)"
    counts: dict[str, int] = {}
    for r in referrers:
        counts[r.kind] = counts.get(r.kind, 0) + 1
    return f"{len(referrers)} copied (" + ", ".join(f"{n} {kind}" for kind, n in counts.items()) + ")"
