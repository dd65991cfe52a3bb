"""Commands that read built images: inspect (one image), diff (what B adds to A)."""

from __future__ import annotations

import argparse

from buildkit_py.cli.common import (
    AddCommand,
    Out,
    engine_option,
    json_option,
    progress_option,
    rate_options,
    reading_engine,
)
from buildkit_py.cli.progress import transfer_view
from buildkit_py.errors import UsageError
from buildkit_py.file_kinds import WEIGHT_FILE_LIMIT


def register_inspect(add: AddCommand) -> None:
    i = add("inspect")
    i.add_argument("image", help="a local image (name:tag or id)")
    rate_options(i)
    i.add_argument("--weight-threshold", default=f"{WEIGHT_FILE_LIMIT >> 20}MiB",
                   help="flag weight-like files above this size (default %(default)s)")
    i.add_argument("--no-compressed", action="store_true", help="skip the gzip estimate (faster on big images)")
    engine_option(i)
    i.add_argument("--kernels", action="store_true",
                   help="also list the CUDA kernels: architectures x libraries, bytes of SASS per architecture "
                        "(read in the same pass over the image's layers)")
    json_option(i)
    progress_option(i, "bytes of the image read")
    i.set_defaults(handler=cmd_inspect)


def register_diff(add: AddCommand) -> None:
    df = add("diff", "Reads both images from their registry (manifest and config; B's layer blobs are streamed\n"
             "once to count unpacked bytes) or from the local engine store. A layer is shared when A\n"
             "has the same blob (the same diff id when one side is the local store).\n\n"
             "  imgbuild diff 127.0.0.1:5000/team/app:1 127.0.0.1:5000/team/app:2")
    df.add_argument("image_a", help="the image the node holds")
    df.add_argument("image_b", help="the image to roll out")
    df.add_argument("--node", action="append", default=[], metavar="IMAGE",
                    help="another image the node already holds, besides A (repeatable): a layer of B that any "
                         "of them has is shared, e.g. the CUDA layers of an image on another OS or Python")
    df.add_argument("--source", choices=("auto", "registry", "engine"), default="auto",
                    help="where to read the images: auto = the registry a reference names, else the engine")
    rate_options(df)
    df.add_argument("--no-uncompressed", action="store_true",
                    help="do not stream B's layers to count unpacked bytes (sizes shown as -)")
    engine_option(df)
    json_option(df)
    progress_option(df, "bytes of B's layers read")
    df.set_defaults(handler=cmd_diff)


def cmd_inspect(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py.analysis.inspect import InspectOptions, inspect_image, report_blocks
    from buildkit_py.recipe.model import parse_size

    threshold = parse_size(args.weight_threshold)
    if threshold is None:
        raise UsageError(f"--weight-threshold {args.weight_threshold!r} is not a size like 10MiB")
    out.info(f"reading {args.image} (one pass over its layers)")
    engine = reading_engine(args)
    with transfer_view(out.stderr, args.progress) as progress:
        report = inspect_image(engine, args.image, InspectOptions(
            bandwidth_mbps=args.bandwidth, weight_threshold=threshold, estimate_compressed=not args.no_compressed,
            unpack_mbps=args.unpack_rate, kernels=args.kernels), progress=progress)
    if args.json:
        out.data(report.to_json())
    else:
        out.blocks(report_blocks(report))
    return 0


def cmd_diff(args: argparse.Namespace, out: Out) -> int:
    from buildkit_py.analysis.diff import DiffOptions, diff_blocks, diff_images

    with transfer_view(out.stderr, args.progress) as progress:
        result = diff_images(args.image_a, args.image_b, DiffOptions(
            source=args.source, bandwidth_mbps=args.bandwidth, unpack_mbps=args.unpack_rate,
            uncompressed=not args.no_uncompressed), engine=reading_engine(args), progress=progress, node=args.node)
    if args.json:
        out.data(result.to_json())
    else:
        out.blocks(diff_blocks(result))
    return 0
