"""imgbuild weights push|pull|ls: model weights as OCI artifacts."""

from __future__ import annotations

import argparse
from pathlib import Path

from buildkit_py.cli.common import AddCommand, Out, json_option, progress_option
from buildkit_py.cli.progress import transfer_view
from buildkit_py.errors import UsageError
from buildkit_py.sizes import human_size


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

    if args.weights_command == "push":
        with transfer_view(out.stderr, args.progress) as progress:
            res = weights.push(args.directory, args.ref, progress=progress)
        if args.json:
            out.data({"ref": res.ref, "digest": res.digest, "pinned": f"{res.ref}@{res.digest}",
                      "uploaded_bytes": sum(f.uploaded_bytes for f in res.files),
                      "files": [{"path": f.path, "size": f.size, "digest": f.digest, "media_type": f.media_type,
                                 "uploaded_bytes": f.uploaded_bytes} for f in res.files]})
        else:
            uploaded = sum(f.uploaded_bytes for f in res.files)
            out.line(f"pushed {len(res.files)} files ({human_size(uploaded)} uploaded): {res.ref}@{res.digest}")
        return 0
    if args.weights_command == "pull":
        with transfer_view(out.stderr, args.progress) as progress:
            pulled = weights.pull(args.ref, args.directory, progress=progress, force=args.force,
                                  on_wait=lambda: out.info(f"waiting for another pull into {args.directory} to end"))
        if args.json:
            out.data({"ref": args.ref, "directory": str(args.directory), "downloaded_bytes": pulled.downloaded_bytes,
                      "files": [f._asdict() for f in pulled.files], "skipped": list(pulled.skipped),
                      "replaced": list(pulled.replaced)})
        else:
            downloaded = human_size(pulled.downloaded_bytes)
            out.line(f"{len(pulled.files)} files in {args.directory}: {downloaded} downloaded, "
                     f"{len(pulled.skipped)} already present"
                     + (f", {len(pulled.replaced)} replaced ({', '.join(pulled.replaced)})" if pulled.replaced else ""))
        return 0
    if args.weights_command == "ls":
        files = weights.ls(args.ref)
        if args.json:
            out.data({"ref": args.ref, "files": [{"path": f.path, "size": f.size, "digest": f.digest} for f in files]})
        else:
            for f in files:
                out.line(f"{human_size(f.size):>10}  {f.digest[:19]}  {f.path}")
        return 0
    raise UsageError("weights needs an action: push, pull or ls", hint="see `imgbuild weights --help`")
