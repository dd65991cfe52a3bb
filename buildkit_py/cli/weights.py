"""imgbuild weights push|pull|ls: model weights as OCI artifacts."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildkit_py.cli.common import AddCommand, Out, json_option, progress_option
from buildkit_py.cli.progress import transfer_view
from buildkit_py.errors import UsageError
from buildkit_py.sizes import human_size

if TYPE_CHECKING:
    from buildkit_py.artifacts.weights import ArtifactFile, PullResult, PushedArtifact


# What each action prints: its --json document (to_json) and its text (lines) read the same fields.
@dataclass(frozen=True)
class WeightsPushed:
    pushed: PushedArtifact

    def to_json(self) -> dict[str, Any]:
        res = self.pushed
        return {"ref": res.ref, "digest": res.digest, "pinned": f"{res.ref}@{res.digest}",
                "uploaded_bytes": res.uploaded_bytes,
                "files": [{"path": f.path, "size": f.size, "digest": f.digest, "media_type": f.media_type,
                           "uploaded_bytes": f.uploaded_bytes} for f in res.files]}

    def lines(self) -> list[str]:
        res = self.pushed
        return [f"pushed {len(res.files)} files ({human_size(res.uploaded_bytes)} uploaded): {res.ref}@{res.digest}"]


@dataclass(frozen=True)
class WeightsPulled:
    ref: str
    directory: Path
    pulled: PullResult

    def to_json(self) -> dict[str, Any]:
        p = self.pulled
        return {"ref": self.ref, "directory": str(self.directory), "downloaded_bytes": p.downloaded_bytes,
                "files": [f._asdict() for f in p.files], "skipped": list(p.skipped), "replaced": list(p.replaced)}

    def lines(self) -> list[str]:
        p = self.pulled
        return [f"{len(p.files)} files in {self.directory}: {human_size(p.downloaded_bytes)} downloaded, "
                f"{len(p.skipped)} already present"
                + (f", {len(p.replaced)} replaced ({', '.join(p.replaced)})" if p.replaced else "")]


@dataclass(frozen=True)
class WeightsListed:
    ref: str
    files: tuple[ArtifactFile, ...]

    def to_json(self) -> dict[str, Any]:
        return {"ref": self.ref, "files": [{"path": f.path, "size": f.size, "digest": f.digest} for f in self.files]}

    def lines(self) -> list[str]:
        return [f"{human_size(f.size):>10}  {f.digest[:19]}  {f.path}" for f in self.files]


def register(add: AddCommand) -> None:
    w = add("weights")
    wsub = w.add_subparsers(dest="weights_command", metavar="ACTION", parser_class=type(w))
    wp = wsub.add_parser("push", help="push every file of DIR as one layer of REF", epilog=w.epilog)
    wp.add_argument("directory", type=Path)
    wp.add_argument("ref")
    json_option(wp)
    progress_option(wp, "upload progress")
    wl = wsub.add_parser("pull", help="pull REF into DIR: verified, resumable, skips files already there",
                         epilog=w.epilog)
    wl.add_argument("ref")
    wl.add_argument("directory", type=Path)
    wl.add_argument("--force", action="store_true",
                    help="replace files of other content at the artifact's paths (without it the pull refuses, "
                         "naming them, exit 2)")
    json_option(wl)
    progress_option(wl, "download progress")
    ws = wsub.add_parser("ls", help="list the files of REF", epilog=w.epilog)
    ws.add_argument("ref")
    json_option(ws)
    w.set_defaults(handler=cmd_weights)


def cmd_weights(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py.artifacts import weights

    document: WeightsPushed | WeightsPulled | WeightsListed
    if args.weights_command == "push":
        with transfer_view(out.stderr, args.progress) as progress:
            document = WeightsPushed(weights.push(args.directory, args.ref, progress=progress))
    elif args.weights_command == "pull":
        with transfer_view(out.stderr, args.progress) as progress:
            document = WeightsPulled(args.ref, args.directory, weights.pull(
                args.ref, args.directory, progress=progress, force=args.force,
                on_wait=lambda: out.info(f"waiting for another pull into {args.directory} to end")))
    elif args.weights_command == "ls":
        document = WeightsListed(args.ref, tuple(weights.ls(args.ref)))
    else:
        raise UsageError("weights needs an action: push, pull or ls", hint="see `imgbuild weights --help`")
    out.document(document, as_json=args.json)
    return 0
