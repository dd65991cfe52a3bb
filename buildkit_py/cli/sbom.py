"""imgbuild sbom: the SBOM attached to an image in its registry, or one made from an image's layers."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildkit_py.cli.common import AddCommand, Out, engine_option, json_option, reading_engine
from buildkit_py.errors import UsageError

if TYPE_CHECKING:
    from buildkit_py.analysis.sbom import ComponentRow


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
    report = {"image": args.image, "subject": found.subject, "sbom": found.referrer.digest,
              "artifact_type": found.referrer.artifact_type, "via": found.via, "platform": found.platform,
              "others": [r.digest for r in found.others]}
    return _show(args, out, found.document, document, report)


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
    report: dict[str, Any] = {"image": args.image, "source": contents.source, "platform": contents.platform,
                              "subject": contents.image_id, "sbom": None, "via": None}
    if args.attach:
        attached = sbom.attach_sbom(raw, args.image, platform=contents.platform)
        report.update(subject=attached.subject, sbom=attached.digest, via=attached.via)
        out.info(f"attached {attached.ref} to {args.image} ({attached.via})")
    return _show(args, out, raw, _parse(raw), report)


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


def _show(args: argparse.Namespace, out: Out, raw: bytes, document: dict[str, Any], report: dict[str, Any]) -> int:
    from buildkit_py.analysis import sbom
    from buildkit_py.files import write_atomic

    rows = sbom.components_of(document)
    if args.output:
        write_atomic(args.output, raw)
    if args.json:
        out.data({**report, "format": f"CycloneDX {document.get('specVersion')}", "output": _str(args.output),
                  "components": [r.to_json() for r in rows], "document": document})
        return 0
    out.line(f"image      {report['image']}" + (f" ({report['subject']})" if report.get("subject") else ""))
    if report.get("sbom"):
        out.line(f"sbom       {report['sbom']} ({report['via']}"
                 + (f", {report['platform']})" if report.get("platform") else ")"))
    counts = {kind: sum(1 for r in rows if r.type == kind) for kind in ("os", "deb", "python", "other")}
    out.line(f"format     CycloneDX {document.get('specVersion')}, {len(rows)} components: "
             + ", ".join(f"{n} {kind}" for kind, n in counts.items() if n))
    if args.output:
        out.line(f"written    {args.output}")
    for row in rows:
        out.line(_row(row))
    return 0


def _row(row: ComponentRow) -> str:
    version = f"{row.version} ({row.arch})" if row.arch else row.version
    return f"{row.type:<7}{row.name:<40} {version:<36} {('sha256:' + row.sha256) if row.sha256 else ''}".rstrip()


def _str(path: Path | None) -> str | None:
    return str(path) if path else None
