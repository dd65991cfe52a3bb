"""imgbuild sbom: the SBOM attached to an image in its registry, or one made from an image's layers."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildkit_py.cli.common import AddCommand, Out, engine_option, json_option, reading_engine
from buildkit_py.errors import UsageError
from buildkit_py.files import write_atomic

if TYPE_CHECKING:
    from buildkit_py.analysis.sbom import AttachedSbom, ComponentRow, FoundSbom, ImageContents


def register(add: AddCommand) -> None:
    s = add("sbom", "The SBOM (CycloneDX 1.6 JSON) attached to IMAGE in its registry as an OCI 1.1 referrer, which\n"
            "`imgbuild build --push` attaches: found by the registry's referrers API, or by the sha256-<hex>\n"
            "tag that lists an image's referrers where the registry has no such API. With --generate, one\n"
            "made now from the image's layers (the local engine's image, else the registry's):\n"
            "OS packages from the dpkg status, every Python distribution with the sha256 of its wheel\n"
            "where --lock (or a direct_url.json) gives it.\n\n"
            "  imgbuild sbom 127.0.0.1:5000/team/app:1\n"
            "  imgbuild sbom team/app:1 --generate --lock recipe.lock -o app.cdx.json")
    s.add_argument("image", help="an image reference (registry/name:tag or @digest); with --generate also a "
                   "local image")
    s.add_argument("-o", "--output", type=Path, metavar="FILE",
                   help="write the SBOM document itself (CycloneDX JSON, as attached) to FILE")
    s.add_argument("--platform", metavar="OS/ARCH", help="the platform's SBOM of a multi-platform image")
    s.add_argument("--generate", action="store_true", help="make the SBOM from the image's layers instead of "
                   "reading the attached one")
    s.add_argument("--source", choices=("auto", "registry", "engine"), default="auto",
                   help="with --generate: where to read the image (auto: the local engine when it has it)")
    s.add_argument("--lock", type=Path, metavar="FILE",
                   help="with --generate: the recipe's lock file, for the sha256 of each wheel installed")
    s.add_argument("--variant", default="default", metavar="ID", help="with --lock: the matrix variant")
    s.add_argument("--attach", action="store_true",
                   help="with --generate: attach the SBOM to IMAGE in its registry (replacing an earlier one of ours)")
    engine_option(s)
    json_option(s)
    s.set_defaults(handler=cmd_sbom)


def cmd_sbom(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py.analysis import sbom

    for flag in ("lock", "attach", "engine"):
        if getattr(args, flag) and not args.generate:
            raise UsageError(f"--{flag} goes with --generate", hint="without it the attached SBOM is read")
    if args.source != "auto" and not args.generate:
        raise UsageError("--source goes with --generate", hint="the attached SBOM is always read from the registry")
    if args.generate:
        return _generate(args, out)
    found = sbom.find_sbom(args.image, platform=args.platform)
    document = _parse(found.document)
    if args.output:
        write_atomic(args.output, found.document)
    out.document(SbomShown.read(args.image, found, document, args.output), as_json=args.json)
    return 0


def _generate(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py import oci
    from buildkit_py.analysis import sbom
    from buildkit_py.plan.lock import read_lock, wheel_hashes
    from buildkit_py.reference import names_registry

    if args.attach and not names_registry(args.image):
        raise UsageError(f"--attach: {args.image} names no registry", hint="name the pushed image: REGISTRY/NAME:TAG")
    hashes = {}
    if args.lock:
        if not args.lock.is_file():
            raise UsageError(f"--lock {args.lock}: no such file")
        entry = read_lock(args.lock).variants.get(args.variant)
        if entry is None:
            raise UsageError(f"--lock {args.lock} has no variant {args.variant!r}", hint="see --variant")
        hashes = wheel_hashes(entry)
    out.info(f"reading {args.image} (one pass over its layers)")
    contents = sbom.read_image_contents(args.image, source=args.source, engine=reading_engine(args),
                                        platform=args.platform or oci.DEFAULT_PLATFORM)
    raw = sbom.cyclonedx_document(contents, hashes=hashes)
    attached = None
    if args.attach:
        attached = sbom.attach_sbom(raw, args.image, platform=contents.platform)
        out.info(f"attached {attached.ref} to {args.image} ({attached.via})")
    document = _parse(raw)
    if args.output:
        write_atomic(args.output, raw)
    out.document(SbomShown.generated(args.image, contents, attached, document, args.output), as_json=args.json)
    return 0


def _parse(raw: bytes) -> dict[str, Any]:
    import json

    from buildkit_py.errors import SbomError

    try:
        document = json.loads(raw)
    except ValueError as exc:
        raise SbomError("the SBOM found is not JSON") from exc
    if not isinstance(document, dict) or document.get("bomFormat") != "CycloneDX":
        raise SbomError("the SBOM found is not a CycloneDX document")
    return document


@dataclass(frozen=True)
class SbomShown:
    """`sbom`'s result: the SBOM (the attached one read, or one generated now), its components and
    where it came from, as --json documents it and the text lists it."""

    image: str  # the reference as given
    subject: str | None  # the digest the SBOM refers to (a generated one not attached: the image's id)
    sbom: str | None  # the SBOM artifact's digest in the registry; None: generated, not attached
    via: str | None  # referrers-api | tag-schema
    platform: str | None
    document: dict[str, Any]  # the CycloneDX document, parsed
    output: Path | None  # where -o wrote the document
    source: str | None = None  # generated: where the image was read (engine | registry); None: read attached
    artifact_type: str | None = None  # read attached: the referrer's artifact type
    others: tuple[str, ...] = ()  # read attached: the digests of further SBOMs beside it

    @classmethod
    def read(cls, image: str, found: FoundSbom, document: dict[str, Any], output: Path | None) -> SbomShown:
        return cls(image, found.subject, found.referrer.digest, found.via, found.platform, document, output,
                   artifact_type=found.referrer.artifact_type, others=tuple(r.digest for r in found.others))

    @classmethod
    def generated(cls, image: str, contents: ImageContents, attached: AttachedSbom | None,
                  document: dict[str, Any], output: Path | None) -> SbomShown:
        if attached is None:
            return cls(image, contents.image_id, None, None, contents.platform, document, output,
                       source=contents.source)
        return cls(image, attached.subject, attached.digest, attached.via, contents.platform, document, output,
                   source=contents.source)

    @property
    def format(self) -> str:
        return f"CycloneDX {self.document.get('specVersion')}"

    def components(self) -> list[ComponentRow]:
        from buildkit_py.analysis import sbom

        return sbom.components_of(self.document)

    def to_json(self) -> dict[str, Any]:
        origin = ({"artifact_type": self.artifact_type, "others": list(self.others)} if self.source is None
                  else {"source": self.source})
        return {"image": self.image, "subject": self.subject, "sbom": self.sbom, "via": self.via,
                "platform": self.platform, **origin, "format": self.format, "output": _str(self.output),
                "components": [r.to_json() for r in self.components()], "document": self.document}

    def lines(self) -> list[str]:
        rows = self.components()
        lines = [f"image      {self.image}" + (f" ({self.subject})" if self.subject else "")]
        if self.sbom:
            lines.append(f"sbom       {self.sbom} ({self.via}" + (f", {self.platform})" if self.platform else ")"))
        counts = {kind: sum(1 for r in rows if r.type == kind) for kind in ("os", "deb", "python", "other")}
        lines.append(f"format     {self.format}, {len(rows)} components: "
                     + ", ".join(f"{n} {kind}" for kind, n in counts.items() if n))
        if self.output:
            lines.append(f"written    {self.output}")
        return lines + [_row(row) for row in rows]


def _row(row: ComponentRow) -> str:
    version = f"{row.version} ({row.arch})" if row.arch else row.version
    return f"{row.type:<7}{row.name:<40} {version:<36} {('sha256:' + row.sha256) if row.sha256 else ''}".rstrip()


def _str(path: Path | None) -> str | None:
    return str(path) if path else None
